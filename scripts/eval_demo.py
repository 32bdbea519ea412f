#!/usr/bin/env python
"""Word error rate of a model on freshly synthesised held-out speech (espeak-ng, held-out voices).

    python scripts/eval_demo.py MODEL.nemo [--n 200] [--seed 1] [--device auto]
    python scripts/eval_demo.py MODEL.nemo --n 8 --write-wavs tests/fixtures/demo-heldout

Sentences come from .textdata/heldout.txt (never in training, nor in the tokenizer's text),
spoken by the held-out voice variants at random rates and pitches; a new `--seed` gives new
pairings. `--write-wavs` also saves the clips (16 kHz, 16-bit WAV) with a `transcripts.json`,
for tests that run without espeak-ng. Needs `python scripts/demo_speech.py prepare` first.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import demo_speech as speech  # scripts/, beside this one

import graphscribe as gs


def heldout_set(n: int, seed: int, voices: str = "heldout"):
    """n (sentence, voice) pairs: held-out sentences, held-out (or training) voice variants."""
    root = speech.install_espeak()
    text = speech.load_text()
    train_pool, held_pool = speech.voice_pools(root)
    rng = random.Random(f"eval/{seed}")
    sentences = rng.sample(text.heldout, min(n, len(text.heldout)))
    pool = held_pool if voices == "heldout" else train_pool
    return root, sentences, [speech.random_voice(rng, pool) for _ in sentences]


def write_wavs(folder: Path, seed: int, sentences, voices, clips) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (sentence, voice, clip) in enumerate(zip(sentences, voices, clips)):
        name = f"heldout_{i:02d}.wav"
        speech.write_wav(folder / name, clip)
        rows.append(
            {
                "file": name,
                "text": speech.normalize(sentence),
                "spoken": sentence,
                "voice": voice.name,
                "rate": voice.rate,
                "pitch": voice.pitch,
                "gap": voice.gap,
            }
        )
    (folder / "transcripts.json").write_text(json.dumps({"seed": seed, "clips": rows}, indent=1) + "\n")
    print(f"wrote {len(rows)} WAVs and transcripts.json to {folder}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help=".nemo file (or anything load_model takes); none: only --write-wavs")
    parser.add_argument("--n", type=int, default=200, help="utterances")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--voices", choices=["heldout", "train"], default="heldout")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtypes", default="auto", help="comma-separated: each is evaluated on the same clips")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--write-wavs", type=Path, metavar="DIR", help="also save the clips and transcripts.json here")
    parser.add_argument("--json", type=Path, help="write the full report here")
    args = parser.parse_args(argv)

    root, sentences, voices = heldout_set(args.n, args.seed, args.voices)
    start = time.perf_counter()
    raw = speech.synthesize_many(root, sentences, voices, args.workers)
    clips = [c.numpy() for c in speech.to_model_rate(raw, "cpu")]
    synth_seconds = time.perf_counter() - start
    if args.model is None:
        if not args.write_wavs:
            parser.error("give a MODEL, or --write-wavs DIR to only synthesise")
        write_wavs(args.write_wavs, args.seed, sentences, voices, clips)
        return 0
    by_dtype = {}
    for dtype in args.dtypes.split(","):
        model = gs.load_model(args.model, device=args.device, dtype=dtype, batch_size=args.batch_size)
        model.transcribe(clips[: args.batch_size])  # first uses (kernels, graphs) outside the timed pass
        start = time.perf_counter()
        results = model.transcribe(clips)
        by_dtype[dtype] = (model, [r.text for r in results], time.perf_counter() - start)
        del model
    first = next(iter(by_dtype))
    model, hyps, decode_seconds = by_dtype[first]
    wer = speech.word_error_rate(sentences, hyps)
    per_dtype = {
        dtype: {
            "wer": speech.word_error_rate(sentences, texts),
            "errors": sum(speech.word_errors(s, h)[0] for s, h in zip(sentences, texts)),
            "texts_unlike_" + first: sum(a != b for a, b in zip(texts, hyps)),
            "decode_seconds": seconds,
        }
        for dtype, (_, texts, seconds) in by_dtype.items()
    }
    rows = []
    for i, (sentence, voice, hyp) in enumerate(zip(sentences, voices, hyps)):
        errors, words = speech.word_errors(sentence, hyp)
        rows.append(
            {
                "index": i,
                "text": speech.normalize(sentence),
                "spoken": sentence,
                "voice": voice.name,
                "rate": voice.rate,
                "pitch": voice.pitch,
                "gap": voice.gap,
                "hyp": hyp,
                "hyps": {dtype: texts[i] for dtype, (_, texts, _) in by_dtype.items()},
                "errors": errors,
                "words": words,
            }
        )
    audio_seconds = sum(len(c) for c in clips) / speech.SAMPLE_RATE
    report = {
        "model": str(args.model),
        "wer": wer,
        "utterances": len(rows),
        "audio_seconds": audio_seconds,
        "synth_seconds": synth_seconds,
        "decode_seconds": decode_seconds,
        "device": str(model.device),
        "dtypes": per_dtype,
        "seed": args.seed,
        "voices": args.voices,
        "rows": rows,
    }
    for row in sorted(rows, key=lambda r: -r["errors"])[:5]:
        print(f"  {row['errors']} errors  ref: {row['text']}\n{'':11}hyp: {row['hyp']}")
    print(
        f"WER {wer:.2%} on {len(rows)} held-out utterances ({audio_seconds:.0f} s of audio, {args.voices} voices), "
        f"decoded in {decode_seconds:.1f} s on {model.device}"
    )
    for dtype, row in per_dtype.items():
        print(
            f"  {dtype}: WER {row['wer']:.2%} ({row['errors']} word errors), "
            f"{row['texts_unlike_' + first]} texts unlike {first}'s, {row['decode_seconds']:.2f} s"
        )
    if args.write_wavs:
        write_wavs(args.write_wavs, args.seed, sentences, voices, clips)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
