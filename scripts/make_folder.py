#!/usr/bin/env python
"""Write the throughput benchmark's folder: FLAC files of real speech with LibriSpeech-like lengths.

    python scripts/make_folder.py /tmp/folder --files 512 --seed 0          # 1.5-30 s, ~3800 s in all
    python scripts/make_folder.py /tmp/short --files 10000 --short          # 1-3 s each: the host-memory test
    transcribe bench --folder /tmp/folder -m model.nemo --json bench.json   # then measure

The files are cut from the speech shipped in the package (graphscribe.bench.make_folder; `transcribe bench
--throughput` makes the same folder in a temporary directory); the same seed gives the same files.
"""

from __future__ import annotations

import argparse

from graphscribe.bench.folder import make_folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write (created if needed)")
    parser.add_argument("--files", type=int, default=512, help="how many files (default 512)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--short", action="store_true", help="1-3 s files instead of LibriSpeech-like lengths")
    args = parser.parse_args()
    if args.files < 1:
        parser.error("--files must be 1 or more")
    paths = make_folder(args.out_dir, args.files, args.seed, args.short)
    import soundfile as sf

    seconds = sum(sf.info(str(p)).duration for p in paths)
    print(
        f"wrote {len(paths)} files, {seconds:.1f} s of audio ({seconds / len(paths):.2f} s each on average) "
        f"to {args.out_dir}"
    )


if __name__ == "__main__":
    main()
