#!/usr/bin/env bash
# Issue 51, eighth session: the packed features replayed from graphs (`graphs.FeatureGraphs`) against computed
# eagerly, in one process each: one batch's stages alone (`stage_cost.py`), then one engine under 64 and 128 clients
# (`engine_timeline.py`), the two alternated level by level. One H200, `.whl-serve.tar.xz` carried:
#   bash bench/2026-11-serve-devices/features.sh
# SERVERS=OLD_SRC: then the servers, this tree's against OLD_SRC's (a source folder from before FeatureGraphs:
# `mkdir .old-src && git archive 4a5eb95 src | tar x -C .old-src`, its data files deleted, carried as `.old-src`),
# interleaved after, before, before, after under 128 clients twice (`ab_servers`, scripts/gpu_setup.sh);
# SKIP_ENGINE=1: the servers only; LOW=1: the servers under 32 and 64 clients instead (twice each, over the 4096
# files; JSON as serve-NAME-low.json).
source scripts/gpu_setup.sh
if [ -z "${SKIP_ENGINE:-}" ]; then
    step stage 150 python scripts/experiments/stage_cost.py -m $ckpt --dtype bfloat16 --folder /tmp/f4096 \
        --rows 16,32,63 --batches 10 --json $OUT/stage.json
    step timeline 240 python scripts/experiments/engine_timeline.py -m $ckpt --dtype bfloat16 --folder /tmp/f4096 \
        --clients ${CLIENTS:-64,128,64,128,64} --replay-features on,off --json $OUT/timeline.json
fi
if [ -n "${SERVERS:-}" ] && [ -z "${LOW:-}" ]; then ab_servers - "$SERVERS"; fi
if [ -n "${SERVERS:-}" ] && [ -n "${LOW:-}" ]; then
    for name in after-1 before-1 before-2 after-2; do
        if [ "${name%-*}" = before ]; then serve $name bfloat16 PYTHONPATH=/tmp/site:$SERVERS; else serve $name bfloat16; fi
        step "server $name 32 64" 60 python3 -m graphscribe.cli bench --serve http://127.0.0.1:8000 --folder /tmp/f4096 \
            --concurrency 32,64,32,64 --json "$OUT/serve-$name-low.json"
        stop $name
    done
fi
