#!/usr/bin/env python
"""A token-level ARPA n-gram LM for `transcribe --lm`, from a text file, over a model's own SentencePiece pieces.

    python scripts/build_lm.py corpus.txt lm.arpa -m nvidia/parakeet-tdt-0.6b-v3 [--order 3]

One sentence a line, written as the model writes text (capitalisation and punctuation too); blank lines are skipped.
Each sentence is tokenised with the model's tokenizer and counted (`graphscribe.io.arpa.write_arpa`: absolute
discounting with Katz back-off weights; KenLM's lmplz is not installable from a package registry). The file is
what NeMo's NGPU-LM reads: token i is the word chr(i + 100). `--order` 3 to 6 suits most corpora.
"""

from __future__ import annotations

import argparse
import sys

from graphscribe.io.arpa import DISCOUNT, ORDER, write_arpa
from graphscribe.io.checkpoint import CheckpointError, read_checkpoint
from graphscribe.io.tokenizer import Tokenizer

MAX_TEXT_BYTES = 1 << 30  # a corpus of more is refused: its counts live in memory


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("text", help="UTF-8 text, one sentence a line")
    ap.add_argument("out", help="the ARPA file to write")
    ap.add_argument("-m", "--model", required=True, help="the .nemo file, folder or Hugging Face id whose tokenizer")
    ap.add_argument("--order", type=int, default=ORDER, help=f"n-gram order (default {ORDER})")
    ap.add_argument("--discount", type=float, default=DISCOUNT, help=f"absolute discount (default {DISCOUNT})")
    args = ap.parse_args(argv)
    if not 2 <= args.order <= 10 or not 0 < args.discount < 1:
        ap.error("--order is 2 to 10, --discount between 0 and 1")
    try:
        checkpoint = read_checkpoint(args.model)
        with open(args.text, "rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
        if len(data) > MAX_TEXT_BYTES:
            raise ValueError(f"{args.text}: over {MAX_TEXT_BYTES >> 20} MiB of text")
        text = data.decode("utf-8")
    except (CheckpointError, OSError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        print(f"error: {err}", file=sys.stderr)
        return 2
    tokenizer = Tokenizer(checkpoint.tokenizer_model, checkpoint.source)
    sentences = [tokenizer.encode(line.strip()) for line in text.split("\n") if line.strip()]
    if not sentences:
        print(f"error: {args.text}: no sentences", file=sys.stderr)
        return 2
    info = write_arpa(sentences, args.out, args.order, args.discount)
    print(f"{args.out}: order {info['order']}, {sum(info['ngrams'].values())} n-grams from {len(sentences)} sentences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
