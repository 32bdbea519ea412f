#!/usr/bin/env python
"""Our cache-aware streams against NeMo's `CacheAwareRNNTPipeline` on the same checkpoint and files: token ids per
file (NeMo's side: `scripts/nemo_cache_aware_bench.py`, which writes the transcripts.json read here).

Runs every file under FOLDER as a stream of `engine_for(model, chunk)` (N streams at a time, every chunk there at
once, the next file joining as one ends, as NeMo's pipeline runs them), writes OUT/transcripts.json and
OUT/compare.json, and prints one JSON line: the files whose stream token ids are NeMo's, and with `--offline`
the files whose `transcribe()` token ids are NeMo's offline ones (where NeMo's file has them).

    python scripts/compare_cache_aware.py CKPT FOLDER --chunk 0.08 --streams 64 --dtype float32 --out DIR \
        --nemo NEMO_DIR/transcripts.json [--offline] [--limit FILES]

`--pairs A/transcripts.json B/transcripts.json ...` compares runs already made instead (either side's, at any
number of streams): every pair's files with the same stream token ids, written to OUT (a .json file).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import graphscribe
from graphscribe.io.audio import find_audio_files, read_input
from graphscribe.runtime.cache_aware_streams import engine_for


def stream_ids(engine, paths: list[Path], streams: int) -> dict[str, list[int]]:
    """Every file's token ids as one stream of `engine`, `streams` at a time."""
    queue, running, ids = list(reversed(paths)), {}, {}
    while queue or running:
        while queue and len(running) < streams:
            path = queue.pop()
            stream = engine.open()
            stream.feed(read_input(path, engine.geometry.sample_rate))
            stream.finish()
            running[path] = stream
        engine.step()
        for path, stream in list(running.items()):
            for event in stream.take_events():
                if event.type == "done":
                    ids[path.name] = list(event.token_ids)
            if stream.closed:
                del running[path]
    return ids


def first_difference(ours: list[int], theirs: list[int]) -> dict:
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return {"at": at, "ours": len(ours), "nemo": len(theirs)}


def agreement(ours: dict[str, list[int]], theirs: dict[str, list[int]]) -> dict:
    shared = sorted(set(ours) & set(theirs))
    differ = {name: first_difference(ours[name], theirs[name]) for name in shared if ours[name] != theirs[name]}
    return {
        "files": len(shared),
        "same_token_ids": len(shared) - len(differ),
        "tokens": sum(len(theirs[name]) for name in shared),
        "empty_in_nemo": sum(not theirs[name] for name in shared),
        "differ": dict(list(differ.items())[:20]),
    }


def pairs(paths: list[Path]) -> dict:
    """Every pair of transcripts.json files, named by their folders ("A | B"): their files with the same stream
    token ids, and where they part (`first_difference`'s "ours" is A's, "nemo" B's)."""
    runs = {path.parent.name: {n: t["token_ids"] for n, t in json.loads(path.read_text()).items()} for path in paths}
    names = sorted(runs)
    return {f"{a} | {b}": agreement(runs[a], runs[b]) for i, a in enumerate(names) for b in names[i + 1 :]}


def main() -> int:
    if "--pairs" in sys.argv:
        p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--pairs", type=Path, nargs="+", required=True)
        p.add_argument("--out", type=Path, required=True)
        args = p.parse_args()
        report = pairs(args.pairs)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
        for pair, row in report.items():
            print(f"{pair}: {row['same_token_ids']} of {row['files']} files with the same ids", flush=True)
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt")
    p.add_argument("folder", type=Path)
    p.add_argument("--chunk", type=float, required=True, help="seconds per step: picks the attention context")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--offline", action="store_true", help="also transcribe() the files NeMo's offline pass has")
    p.add_argument("--nemo", type=Path, required=True, help="nemo_cache_aware_bench.py's transcripts.json")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    nemo = json.loads(args.nemo.read_text())
    model = graphscribe.load_model(args.ckpt, device=args.device, dtype=args.dtype)
    paths = find_audio_files(args.folder)[: args.limit]
    engine = engine_for(model, args.chunk)
    # NeMo steps (lookahead + 1) x 1280 samples; a step of another size gives other features (and token ids)
    step_samples, nemo_samples = engine.geometry.frame_samples, round(args.chunk * engine.geometry.sample_rate)
    if step_samples != nemo_samples:
        print(f"warning: the engine steps {step_samples} samples, NeMo's pipeline {nemo_samples}", file=sys.stderr)
    start = time.perf_counter()
    ours = stream_ids(engine, paths, args.streams)
    report = {
        "model": args.ckpt,
        "device": str(model.device),
        "dtype": args.dtype,
        "chunk": args.chunk,
        "streams": args.streams,
        "step_samples": {"ours": step_samples, "nemo": nemo_samples},
        "stream_seconds": round(time.perf_counter() - start, 2),
        "stream": agreement(ours, {name: t["token_ids"] for name, t in nemo.items()}),
    }
    transcripts = {name: {"token_ids": ids} for name, ids in ours.items()}
    if args.offline:
        offline_paths = [path for path in paths if "offline_token_ids" in nemo.get(path.name, {})]
        results = model.transcribe([str(path) for path in offline_paths])
        offline = {path.name: list(r.token_ids) for path, r in zip(offline_paths, results)}
        for name, ids in offline.items():
            transcripts[name]["offline_token_ids"] = ids
        theirs = {name: t["offline_token_ids"] for name, t in nemo.items() if "offline_token_ids" in t}
        report["offline"] = agreement(offline, theirs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transcripts.json").write_text(json.dumps(transcripts, indent=1) + "\n")
    (args.out / "compare.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
