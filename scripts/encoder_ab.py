#!/usr/bin/env python
"""The encoder's output from two versions of graphscribe, compared: bits in float32, distance in 16 bits.

    PYTHONPATH=old/src python scripts/encoder_ab.py save --model v3.nemo --out /tmp/old.pt
    PYTHONPATH=src python scripts/encoder_ab.py save --model v3.nemo --out /tmp/new.pt
    python scripts/encoder_ab.py compare /tmp/old.pt /tmp/new.pt

`save` encodes real speech (the shipped clips, joined and cut to 8 rows of different lengths) eagerly and with
the model's layer graphs, in float32 and bfloat16, and stores the outputs (valid frames only). `compare` says,
per dtype, whether the two versions' outputs are bit-equal, and how far each one's bfloat16 output is from its
own float32 output (relative Frobenius norm, valid frames).
"""

from __future__ import annotations

import argparse

import torch


def save(model_path: str, out: str) -> None:
    import graphscribe
    from graphscribe.bench import speech_path

    results = {}
    for dtype in ("float32", "bfloat16"):
        model = graphscribe.load_model(model_path, device="cuda", dtype=dtype)
        speech = torch.cat(
            [model.read(speech_path(n)) for n in ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac")]
        )
        rows = [speech[: int(speech.numel() * (1 - 0.11 * i))] for i in range(8)]
        features, frames = model.features(rows)
        with torch.inference_mode():
            eager, lengths = model.module.encoder(features.to(model.dtype), frames)
            graphed, _ = model.encoder_output(features, frames)
        for name, value in (("eager", eager), ("graphs", graphed)):
            results[f"{dtype}/{name}"] = [value[i, : int(n)].float().cpu() for i, n in enumerate(lengths)]
        del model
        torch.cuda.empty_cache()
    torch.save(results, out)


def compare(a_path: str, b_path: str) -> None:
    a, b = torch.load(a_path), torch.load(b_path)
    for key in a:
        same = all(torch.equal(x, y) for x, y in zip(a[key], b[key]))
        worst = max(((x - y).norm() / y.norm()).item() for x, y in zip(a[key], b[key]))
        print(f"{key:18s} bit-equal: {'yes' if same else 'no'}   largest relative distance a-b: {worst:.2e}")
    for name, run in (("a", a), ("b", b)):
        for mode in ("eager", "graphs"):
            err = max(
                ((x - y).norm() / y.norm()).item() for x, y in zip(run[f"bfloat16/{mode}"], run[f"float32/{mode}"])
            )
            print(f"{name}: bfloat16 {mode} against its float32: largest relative distance {err:.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("save")
    s.add_argument("--model", required=True)
    s.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    if args.command == "save":
        save(args.model, args.out)
    else:
        compare(args.a, args.b)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
