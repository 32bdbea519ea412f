#!/usr/bin/env python
"""graphscribe against NeMo's own greedy decoder, same checkpoint, same clips, one command.

Writes the bench tiers (7.4 s, 23 s, 77 s of real speech) as 16 kHz float WAVs, runs
`scripts/nemo_peer.py` (NeMo 3.0 label-looping decoder, with and without its full-loop
CUDA graph) in a subprocess, runs graphscribe's bench on the same WAVs in this process,
and prints both side by side with whether the token ids agree.

On the lent GPU, with NeMo's wheels installed into NEMO_SITE (see scripts/nemo_peer.py):

    python scripts/compare_nemo.py --model v3.nemo --nemo-path /tmp/nemo-site \
        --dtype float32 --batch-sizes 1,8 --reps 5 --out $OUT/compare-fp32
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import soundfile as sf

import graphscribe as gs
from graphscribe.bench.decode import run_bench, tier_clips
from graphscribe.model import decoding


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nemo-path", default="", help="folder with NeMo and its dependencies, put on PYTHONPATH for NeMo")
    ap.add_argument("--nemo-python", default=sys.executable, help="the Python that runs NeMo")
    ap.add_argument("--device", default="cuda", help="cuda (both decoders with and without graphs) or cpu (eager only)")
    ap.add_argument(
        "--nemo-tf32",
        action="store_true",
        help="NeMo with PyTorch's default TF32 convolutions (faster, other float32 encoder output)",
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for the tier WAVs, JSON and the Markdown table")
    ap.add_argument(
        "--round-shares",
        default="",
        help="comma list: our decoder with each decoding.ROUND_SHARE in "
        "turn, in two rounds (default: as shipped, once)",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)

    model = gs.load_model(args.model, device=args.device, dtype=args.dtype, graphs=True)
    wavs = []
    for tier in tier_clips(model):
        path = args.out / f"tier-{tier.name.replace(' ', '')}.wav"
        sf.write(path, tier.audio.numpy(), model.sample_rate, subtype="FLOAT")
        wavs.append(path)

    nemo_json = args.out / "nemo.json"
    env = dict(os.environ, PYTHONPATH=args.nemo_path)  # NeMo's own packages only: ours may not suit its pins
    subprocess.run(
        [
            args.nemo_python,
            str(Path(__file__).with_name("nemo_peer.py")),
            "--model",
            args.model,
            "--clips",
            *map(str, wavs),
            "--batch-sizes",
            *map(str, sizes),
            "--reps",
            str(args.reps),
            "--device",
            args.device,
            "--dtype",
            args.dtype,
            "--json",
            str(nemo_json),
        ]
        + (["--tf32"] if args.nemo_tf32 else []),
        check=True,
        env=env,
    )
    nemo = json.loads(nemo_json.read_text())

    tiers = tier_clips(model, wavs)  # the very samples NeMo read
    modes = [False, True] if model.device.type == "cuda" else [False]
    shares = [float(x) for x in args.round_shares.split(",")] * 2 if args.round_shares else [None]
    tables, reports = [], []
    for share in shares:
        if share is not None:
            decoding.ROUND_SHARE = share
        ours = run_bench(model, tiers, sizes, args.reps, modes)
        ours["nemo"] = {k: v for k, v in nemo.items() if k != "results"}
        ours["round_share"] = decoding.ROUND_SHARE
        reports.append(ours)
        tables.append((f"ROUND_SHARE {share}:\n\n" if share is not None else "") + side_by_side(ours, nemo))
    (args.out / "graphscribe.json").write_text(
        json.dumps(reports[0] if len(reports) == 1 else reports, indent=1) + "\n"
    )
    table = "\n\n".join(tables)
    (args.out / "compare.md").write_text(table + "\n")
    print(table)


def side_by_side(ours: dict, nemo: dict) -> str:
    by_key = {(Path(r["clip"]).name, r["batch"], r["mode"]): r for r in nemo["results"]}
    lines = [
        f"{ours['device']}, {ours['dtype']}{', ' + ours['step'] + ' step' if ours.get('step') else ''}, "
        f"torch {ours['torch']}, NeMo {nemo['nemo_version']}{' with TF32' if nemo.get('tf32') else ''}; "
        f"decode only (encoder output given), median of {ours['reps']} in ms",
        "",
        "| clip | B | NeMo full graph | NeMo no graphs | graphscribe graphs | graphscribe eager "
        "| graphscribe vs NeMo graph | same tokens as NeMo |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for tier in ours["tiers"]:
        decode = {(r["batch"], r["graphs"]): r for r in tier["rows"] if r["what"] == "decode"}
        for batch in sorted({b for b, _ in decode}):
            graphed, eager = decode.get((batch, True)), decode.get((batch, False))
            nemo_graph = by_key.get((tier["tier"], batch, "cudagraph"), {})
            nemo_eager = by_key.get((tier["tier"], batch, "nograph"), {})
            nemo_ms = nemo_graph.get("decode_ms", {}).get("median")
            ratio = f"{nemo_ms / graphed['median_ms']:.2f}x faster" if nemo_ms and graphed else "-"
            nemo_ids = (nemo_graph or nemo_eager).get("token_ids")
            same = "-" if nemo_ids is None else "yes" if nemo_ids == tier["token_ids"] else "NO"
            lines.append(
                f"| {tier['tier']} ({tier['frames']} frames, {len(tier['token_ids'])} tokens) | {batch} "
                f"| {_fmt(nemo_ms)} | {_fmt(nemo_eager.get('decode_ms', {}).get('median'))} "
                f"| {_fmt(graphed and graphed['median_ms'])} | {_fmt(eager and eager['median_ms'])} "
                f"| {ratio} | {same} |"
            )
    return "\n".join(lines)


def _fmt(ms) -> str:
    return f"{ms:.1f}" if ms else "-"


if __name__ == "__main__":
    main()
