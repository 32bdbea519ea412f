#!/usr/bin/env bash
# run48.sh on the front end's first version (run47/front.diff): its layout went to the GPU in several copies from
# pageable memory, each of which waits for the stream's queued work. One lent H100, from the repo root with .whl
# carried:  bash bench/2026-11-server/run47.sh
FRONT=run47 exec bash bench/2026-11-server/run48.sh
