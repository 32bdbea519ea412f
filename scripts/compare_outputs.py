"""Compare the text of `transcribe -f json -o DIR` outputs across folders: the files whose text differs from the
first folder's, and how many agree.

    python scripts/compare_outputs.py OUT_A OUT_B [OUT_C ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def texts(folder: Path) -> dict[str, str]:
    return {p.name: json.loads(p.read_text())["text"] for p in sorted(folder.glob("*.json"))}


def main(folders: list[str]) -> int:
    first, *others = [Path(f) for f in folders]
    base = texts(first)
    differing = 0
    for folder in others:
        other = texts(folder)
        diff = sorted(name for name in base if other.get(name) != base[name])
        differing += len(diff)
        print(f"{folder} against {first}: text equal on {len(base) - len(diff)} of {len(base)} files; differ: {diff}")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
