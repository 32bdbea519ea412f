"""Quick GPU check: graphs == eager on the NeMo fixture, and decode-step timings with 0.6b-v3 shapes.

python scripts/gpu_smoke.py   # on the lent GPU
"""

import json
import time
from pathlib import Path

import torch

import graphscribe as gs
from graphscribe.config import ModelConfig
from graphscribe.decoding import GreedyDecoder
from graphscribe.model import Transducer

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nemo-tdt-tiny"


def fixture_check() -> None:
    ref = json.loads((FIXTURE / "reference.json").read_text())
    paths = [FIXTURE / "clips" / c["file"] for c in ref["clips"]]
    for dtype in ("float32", "bfloat16"):
        for graphs in (False, True):
            model = gs.load_model(FIXTURE / "tdt-tiny.nemo", device="cuda", dtype=dtype, graphs=graphs)
            for bs in (1, 6):
                res = model.transcribe(paths, batch_size=bs)
                same = [
                    r.token_ids == c["token_ids"] and r.frames == c["timestamps"] for r, c in zip(res, ref["clips"])
                ]
                print(
                    f"fixture {dtype} graphs={graphs} batch={bs}: matches NeMo {same} capture={model.decoder.capture_seconds:.3f}s"
                )


def timing(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    module = Transducer(ModelConfig()).to_inference(torch.device("cuda"), dtype)
    frames = 256  # random weights emit at random: keep the eager runs short
    for n in (1, 8, 32):
        enc = torch.randn(n, frames, 1024, device="cuda", dtype=dtype)
        lengths = torch.full((n,), frames, device="cuda")
        out = {}
        for graphs in (False, True):
            dec = GreedyDecoder(module.decoder, module.joint, module.cfg.decoding, graphs=graphs)
            hyps = dec.decode(enc, lengths)
            torch.cuda.synchronize()
            times = []
            for _ in range(5):
                t = time.perf_counter()
                hyps = dec.decode(enc, lengths)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            med = sorted(times)[2]
            out[graphs] = [(h.token_ids, h.frames) for h in hyps]
            print(
                f"{dtype} N={n} graphs={graphs}: {med * 1e3:.2f} ms, steps {hyps[0].steps}, "
                f"{med * 1e6 / max(hyps[0].steps, 1):.1f} us/step, tokens {len(hyps[0].token_ids)}, capture {dec.capture_seconds * 1e3:.0f} ms"
            )
        print("  identical:", out[False] == out[True])


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name())
    fixture_check()
    for dt in (torch.float32, torch.bfloat16):
        timing(dt)
