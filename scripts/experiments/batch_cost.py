"""What one batch costs on the GPU by its rows and padded length: the cost model behind the server's choice of batch.

Per (rows, seconds) of the grid, batches of that shape (the shipped LibriSpeech clip tiled to length) run through
`transcribe_stream` back to back, as a folder job or the server runs them (the next batch's encoder queued while
this one decodes): milliseconds a batch in steady state, after one pass that captures the shape's graphs. Then a
least-squares fit of ms = a + c * seconds + b * rows * seconds (a: fixed per batch; c: per second of the longest
row, whatever the rows; b: per padded second), printed with the fit's error per shape.

    python scripts/experiments/batch_cost.py -m v3.nemo --dtype bfloat16 --json cost-bf16.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from graphscribe import load_model
from graphscribe.io.audio import read_input, speech_path
from graphscribe.runtime.defaults import default_batching, pad_samples
from graphscribe.runtime.pipeline import WARM_UP_CLIP, transcribe_stream
from graphscribe.runtime.reading import HostBuffers, collate


class Repeat:
    """transcribe_stream's source: one batch, `times` times."""

    def __init__(self, batch, times: int):
        self.batch, self.times, self.items = batch, times, {}

    def __iter__(self):
        for _ in range(self.times):
            yield self.batch

    def recycle(self, batch) -> None:
        pass

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", default="1,2,4,8,16,32,64")
    parser.add_argument("--seconds", default="2,4,8,12,16,24,32")
    parser.add_argument("--times", type=int, default=8)
    parser.add_argument("--json")
    args = parser.parse_args()
    model = load_model(args.model, dtype=args.dtype)
    rate = model.sample_rate
    clip = read_input(speech_path(WARM_UP_CLIP), rate)
    _, cap = default_batching(model.device, model.dtype)
    pad_to = pad_samples(model.device, model.dtype, rate)
    cuda = model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows_out = []
    for seconds in (float(s) for s in args.seconds.split(",")):
        audio = clip.repeat(int(seconds * rate) // clip.numel() + 1)[: int(seconds * rate)]
        for rows in (int(r) for r in args.rows.split(",")):
            if rows * seconds > cap:
                continue
            batch = collate([(r, "<grid>", audio) for r in range(rows)], HostBuffers(keep=0, pin=cuda), pad_to, cuda)
            for _ in transcribe_stream(model, Repeat(batch, 2), word_times=False):  # captures this shape's graphs
                pass
            sync()
            start = time.perf_counter()
            for _ in transcribe_stream(model, Repeat(batch, args.times), word_times=False):
                pass
            sync()
            ms = (time.perf_counter() - start) / args.times * 1e3
            row = {"rows": rows, "seconds": seconds, "padded_s": rows * seconds, "ms": round(ms, 3)}
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    x = torch.tensor([[1.0, r["seconds"], r["padded_s"]] for r in rows_out], dtype=torch.float64)
    y = torch.tensor([r["ms"] for r in rows_out], dtype=torch.float64)
    a, c, b = torch.linalg.lstsq(x, y.unsqueeze(1)).solution.squeeze(1).tolist()
    fit = {"a_ms": round(a, 4), "c_ms_per_s": round(c, 4), "b_ms_per_padded_s": round(b, 5)}
    fit["fixed_padded_s"], fit["extra_rows"] = round(a / b, 1), round(c / b, 2)
    print(json.dumps({"fit": fit}))
    for r in rows_out:
        r["fit_ms"] = round(a + c * r["seconds"] + b * r["padded_s"], 3)
        print(f"{r['rows']:3d} x {r['seconds']:5.1f} s: {r['ms']:8.2f} ms, fit {r['fit_ms']:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dtype": args.dtype, "fit": fit, "grid": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
