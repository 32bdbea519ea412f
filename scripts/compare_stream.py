#!/usr/bin/env python
"""Our streams against NeMo's `BufferedRNNTPipeline` on the same checkpoint and files: token ids per file.

Runs every file under FOLDER as a stream of one `StreamEngine` (N streams at a time, as fast as it goes), writes
OUT/transcripts.json in the shape `../shared/nemo-gpu/nemo_stream.py` writes its own, and, given NeMo's
transcripts.json, counts the files whose final token ids are NeMo's.

    python scripts/compare_stream.py CKPT FOLDER --streams 64 --dtype float32 --out DIR [--nemo NEMO_DIR/transcripts.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import graphscribe
from graphscribe.io.audio import find_audio_files, read_input
from graphscribe.runtime.streaming import StreamEngine


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt")
    p.add_argument("folder", type=Path)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--chunk", type=float, default=0.8)
    p.add_argument("--left", type=float, default=9.6)
    p.add_argument("--right", type=float, default=1.6)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--nemo", type=Path, default=None, help="NeMo's transcripts.json on the same files")
    args = p.parse_args()
    model = graphscribe.load_model(args.ckpt, device=args.device, dtype=args.dtype)
    paths = find_audio_files(args.folder)[: args.limit]
    engine = StreamEngine(model, args.chunk, args.left, args.right)
    queue, running, results = list(reversed(paths)), {}, {}
    while queue or running:
        while queue and len(running) < args.streams:
            path = queue.pop()
            stream = engine.open()
            stream.feed(read_input(path, model.sample_rate))
            stream.finish()
            running[path] = stream
        engine.step()
        for path, stream in list(running.items()):
            for event in stream.take_events():
                if event.type == "done":
                    results[path.name] = {"text": event.text, "token_ids": event.token_ids}
            if stream.closed:
                del running[path]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transcripts.json").write_text(json.dumps(results, ensure_ascii=False, indent=1))
    if args.nemo is None:
        return 0
    nemo = json.loads(args.nemo.read_text())
    shared = [k for k in results if k in nemo]
    same = [k for k in shared if results[k]["token_ids"] == nemo[k]["token_ids"]]
    report = {"files": len(shared), "same_token_ids": len(same), "differ": sorted(set(shared) - set(same))[:20]}
    print(json.dumps(report))
    return 0 if len(same) == len(shared) and shared else 1


if __name__ == "__main__":
    sys.exit(main())
