#!/usr/bin/env python
"""The server's text for every file against the CLI's: same checkpoint, same dtype, one running server.

    transcribe FOLDER -m M --dtype float32 -f json -o CLI_OUT
    transcribe serve -m M --dtype float32 --port 8000 &
    python scripts/compare_server.py --url http://127.0.0.1:8000 --folder FOLDER --cli-out CLI_OUT --clients 16

Each file is posted once (`response_format=json`), `--clients` at a time so that requests share batches; the CLI's
text is read from its JSON file (the output named after the input, under CLI_OUT). Prints the number of files whose
texts are equal and lists the first that differ; exit 1 if any differs or fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--cli-out", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    expected = {}
    for out in args.cli_out.rglob("*.json"):
        record = json.loads(out.read_text())
        expected[Path(record["path"]).name] = record.get("text")
    files = sorted(p for p in args.folder.rglob("*") if p.is_file() and p.name in expected)
    client = httpx.Client(timeout=600)

    def post(path: Path) -> tuple[str, str | None]:
        answer = client.post(
            f"{args.url}/v1/audio/transcriptions",
            files={"file": (path.name, path.read_bytes())},
            data={"model": "x", "response_format": "json"},
        )
        return path.name, answer.json().get("text") if answer.status_code == 200 else None

    with ThreadPoolExecutor(args.clients) as pool:
        got = dict(pool.map(post, files))
    differ = [name for name in got if got[name] != expected[name]]
    print(f"server text equals the CLI's on {len(got) - len(differ)} of {len(got)} files")
    for name in differ[:5]:
        print(f"  {name}: CLI {expected[name]!r}\n  {' ' * len(name)}  server {got[name]!r}")
    return 1 if differ or not got else 0


if __name__ == "__main__":
    sys.exit(main())
