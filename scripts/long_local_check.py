#!/usr/bin/env python
"""Where a long recording's local-attention transcript goes wrong, if it does (GPU diagnostic).

    python scripts/long_local_check.py --model v3.nemo --dtype bfloat16 --minutes 180

Encodes the shipped speech tiled to --minutes with local attention, and to 60 minutes; prints the largest
difference of the two encoder outputs over the first 50 minutes, the encoder output's norm per 15-minute
stretch, and the tokens decoded per 15-minute stretch (greedy, graphs on), for local and full attention.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from long_audio_bench import recording, speech  # noqa: E402

import graphscribe as gs  # noqa: E402

STRETCH = 15 * 60 * 100 // 8  # encoder frames in 15 minutes


def decoders(model, encoded, lengths):
    """Decode one encoder output with the fused step (graphs, eager) and the PyTorch step (graphs), logging the
    host loop's reads (frames still to go, tokens recorded) and the token slots."""
    import graphscribe.decoding as decoding
    from graphscribe.decoding import GreedyDecoder

    reads = []
    original = vars(decoding.Progress)["read"]  # the classmethod

    def logged(buf, b):
        value = original.__func__(decoding.Progress, buf, b)
        reads.append((value.remaining, value.emitted, buf.max_tokens))
        return value

    decoding.Progress.read = staticmethod(logged)
    try:
        from graphscribe.fused_step import FusedStep

        for name, graphs, fused in (
            ("fused, graphs", True, True),
            ("fused, float32 weights", True, True),
            ("pytorch, graphs", True, False),
        ):
            reads.clear()
            decoder = GreedyDecoder(
                model.module.decoder, model.module.joint, model.cfg.decoding, graphs=graphs, fused=fused
            )
            if "float32" in name:  # the LSTM's (and the joint's) weights in float32, as the PyTorch step has them
                decoder._fused_step = FusedStep(
                    decoder.prediction, decoder.joint, torch.float32, model.cfg.decoding.durations
                )
            hyp = decoder.decode(encoded, lengths)[0]
            counts = torch.bincount(torch.tensor(hyp.frames) // STRETCH, minlength=-(-int(lengths[0]) // STRETCH))
            print(f"  {name}: tokens {len(hyp.token_ids)}, steps {hyp.steps}, per 15 min {counts.tolist()}", flush=True)
            print(
                f"    reads (frames to go, tokens, slots): {reads[:6]} ... {reads[-4:]} ({len(reads)} reads)",
                flush=True,
            )
    finally:
        decoding.Progress.read = original


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--minutes", type=float, default=180)
    args = ap.parse_args()
    model = gs.load_model(args.model, device="cuda", dtype=args.dtype)
    source = speech(model.sample_rate)
    long = recording(source, args.minutes * 60, model.sample_rate)
    short = recording(source, 60 * 60, model.sample_rate)
    with torch.inference_mode():
        outputs = {}
        for name, audio, window in (("long local", long, (256, 256)),):
            features, frames = model.features([audio])
            encoded, lengths = model.encoder_output(features, frames, window)
            outputs[name] = (encoded, lengths)
            norms = encoded[0].float().norm(dim=1)
            print(
                name,
                "frames",
                int(lengths[0]),
                "nan",
                bool(torch.isnan(encoded).any()),
                "norm per 15 min:",
                [round(float(norms[s : s + STRETCH].mean()), 1) for s in range(0, norms.numel(), STRETCH)],
                flush=True,
            )
            if name == "long local":
                decoders(model, encoded, lengths)
            else:
                hyp = model.decode(encoded, lengths)[0]
                counts = torch.bincount(torch.tensor(hyp.frames) // STRETCH, minlength=-(-int(lengths[0]) // STRETCH))
                print(name, "tokens", len(hyp.token_ids), "per 15 min:", counts.tolist(), flush=True)
            del features
        if "60 min local" not in outputs:
            return
        a, b = outputs["long local"][0][0], outputs["60 min local"][0][0]
        n = 50 * 60 * 100 // 8
        print(
            "long local vs 60 min local, first 50 min: max abs diff",
            float((a[:n] - b[:n]).abs().max()),
            "per 15 min:",
            [float((a[s : s + STRETCH] - b[s : s + STRETCH]).abs().max()) for s in range(0, n, STRETCH)],
        )


if __name__ == "__main__":
    main()
