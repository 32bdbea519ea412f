#!/usr/bin/env python
"""The encoder's fused 16-bit kernels (`encoder_kernels`) alone, by tile configuration, on the shapes of a batch.

    python scripts/encoder_kernels_bench.py --batch 128 --seconds 10 --json $OUT/encoder-kernels.json

Random inputs in bfloat16 with the shapes of a parakeet-tdt-0.6b-v3 batch (`--batch` rows of `--seconds`, every
row full): the subsampling's first convolution (features (B, 1, T, 128) as the encoder gets them, a transposed view), the conv
module's GLU-depthwise-norm-SiLU on (B, T', 2 x 1024), the position bias of 8 heads. Milliseconds (CUDA events,
median of 20 after a warm-up) per configuration; every configuration's output must equal the first one's bits.
"""

from __future__ import annotations

import argparse
import json

import torch
from encoder_profile import time_ms  # scripts/ is on the path when run as a script

from graphscribe import encoder_kernels as ek
from graphscribe.encoder import _MASKED_SCORE, _aligned, _halved


def sweep(name: str, call, configs: list[dict]) -> list[dict]:
    rows, first = [], call(**configs[0])
    for config in configs:
        same = torch.equal(call(**config), first)
        row = {"kernel": name, **config, "ms": time_ms(lambda: call(**config)), "same_bits": same}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    b, frames, mels, channels, d, heads = args.batch, int(args.seconds * 100) + 1, 128, 256, 1024, 8
    x = torch.randn(b, mels, frames, device=dev, dtype=dt).transpose(1, 2)[:, None]  # (B, 1, T, F), time contiguous
    lengths = torch.full((b,), frames, device=dev)
    first = torch.nn.Conv2d(1, channels, 3, 2, 1).to(dev, dt)
    t = int(_halved(_halved(_halved(torch.tensor(frames)))))
    h = torch.randn(b, t, 2 * d, device=dev, dtype=dt)
    valid = torch.ones(b, t, dtype=torch.bool, device=dev)
    conv = torch.nn.Conv1d(d, d, 9, padding=4, groups=d).to(dev, dt)
    norm = torch.nn.BatchNorm1d(d).to(dev, dt).eval()
    raw = torch.randn(heads, b, t, 2 * t - 1, device=dev, dtype=dt)
    with torch.inference_mode():
        rows = sweep(
            "first_conv",
            lambda **c: ek.first_conv(x, lengths, _halved(lengths), first, **c),
            [
                dict(block_p=bp, block_c=bc, warps=w)
                for bp, bc, w in ((64, 64, 4), (128, 32, 4), (32, 128, 4), (64, 128, 8), (128, 64, 8), (32, 256, 8))
            ],
        )
        rows += sweep(
            "glu_depthwise",
            lambda **c: ek.glu_depthwise(h, valid, conv, norm, **c),
            [
                dict(block_t=bt, block_c=bc, warps=w)
                for bt, bc, w in ((16, 128, 4), (32, 128, 4), (64, 64, 4), (32, 64, 4), (8, 256, 4), (64, 128, 8))
            ],
        )
        rows += sweep(
            "position_bias",
            lambda **c: ek.position_bias(raw, valid, 0.088, _aligned(t), _MASKED_SCORE, **c),
            [
                dict(block_i=bi, block_j=bj, warps=w)
                for bi, bj, w in ((16, 128, 4), (8, 128, 4), (32, 128, 8), (16, 256, 4), (4, 256, 4))
            ],
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "batch": b, "seconds": args.seconds, "rows": rows}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
