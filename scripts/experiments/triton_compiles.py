"""Which Triton kernels compile after a server's warm-up: every compilation is logged (kernel, the arguments'
specialisation, seconds) while a `Service` warms up as `transcribe serve` does and then serves a folder to N
client threads in a closed loop (service_policy.py's pass). Run it on a machine whose Triton cache is empty
(~/.triton/cache), as a first deployment is: what compiles after "warmed up" is what a first request waits for.

    python scripts/experiments/triton_compiles.py -m v3.nemo --folder /tmp/f4096 --clients 128
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from service_policy import one_pass  # the sibling script's closed loop of clients
from triton.runtime.jit import JITFunction

from graphscribe import load_model
from graphscribe.io.audio import find_audio_files
from graphscribe.serve.service import Service

PHASE = ["loading"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--clients", type=int, default=128)
    args = parser.parse_args()
    compile_ = JITFunction._do_compile

    def logged(self, *a, **k):
        start = time.perf_counter()
        try:
            return compile_(self, *a, **k)
        finally:
            spec = " ".join(repr(x)[:80] for x in a[:3])
            print(
                f"[{PHASE[0]}] compiled {self.fn.__name__} in {time.perf_counter() - start:.2f} s: {spec}",
                file=sys.stderr,
            )

    JITFunction._do_compile = logged
    model = load_model(args.model, dtype=args.dtype)
    paths = find_audio_files(args.folder)
    with ThreadPoolExecutor(8) as pool:
        audios = list(pool.map(model.read, paths))
    PHASE[0] = "warm-up"
    service = Service(model)
    service.start()
    service.wait_ready()
    for k in range(2):
        PHASE[0] = f"pass {k}"
        wall = one_pass(service, audios, args.clients)
        print(f"pass {k}: {sum(a.numel() for a in audios) / model.sample_rate / wall:.0f} RTFx", file=sys.stderr)
    service.close()


if __name__ == "__main__":
    main()
