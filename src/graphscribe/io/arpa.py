"""A token-level ARPA LM from tokenised sentences, by our own counting (KenLM's lmplz is not installable from a
package registry): what `scripts/build_lm.py` writes for `--lm`, and the nemo-beam fixture's lm.arpa.

Tokens are the one-character words chr(id + 100), as NeMo's NGPU-LM reads them (`model/ngram.py`).
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from pathlib import Path

TOKEN_OFFSET = 100  # NeMo's DEFAULT_TOKEN_OFFSET
ORDER = 3
DISCOUNT = 0.5


def write_arpa(
    sentences: list[list[int]], path: str | os.PathLike, order: int = ORDER, discount: float = DISCOUNT
) -> dict:
    """A back-off ARPA over token ids (words chr(id + 100)): absolute discounting with Katz back-off weights.

    Unigrams: (c(w) - D) / N plus the freed mass spread evenly over the seen words, </s> and <unk>; <s> is -99 with
    a back-off. Order k > 1: p(w | h) = (c(h w) - D) / c(h .) for seen h w; alpha(h) makes P(. | h) sum to one
    over the seen words and the back-off to h[1:]. Log10 in the file, as ARPA wants; tab-separated, as NeMo reads.
    """
    bos, eos, unk = "<s>", "</s>", "<unk>"
    counts = [Counter() for _ in range(order + 1)]  # counts[k][tuple of k words]
    for ids in sentences:
        words = [bos] + [chr(i + TOKEN_OFFSET) for i in ids] + [eos]
        for k in range(1, order + 1):
            for j in range(len(words) - k + 1):
                gram = tuple(words[j : j + k])
                if k == 1 and gram == (bos,):
                    continue
                if k > 1 and bos in gram[1:]:
                    continue
                counts[k][gram] += 1
    n_tokens = sum(counts[1].values())
    vocab = sorted(w for (w,) in counts[1])
    floor = discount * len(vocab) / n_tokens / (len(vocab) + 1)  # the freed mass, spread over vocab + <unk>
    prob: dict[tuple, float] = {(w,): (counts[1][(w,)] - discount) / n_tokens + floor for w in vocab}
    prob[(unk,)] = floor
    followers: dict[tuple, dict] = defaultdict(dict)  # context -> {word: count}
    for k in range(2, order + 1):
        for gram, c in counts[k].items():
            followers[gram[:-1]][gram[-1]] = c

    def p_full(w: str, h: tuple) -> float:  # the back-off model's P(w | h)
        if not h:
            return prob.get((w,), floor)
        if (*h, w) in prob:
            return prob[(*h, w)]
        return backoff.get(h, 1.0) * p_full(w, h[1:])

    backoff: dict[tuple, float] = {}
    for k in range(2, order + 1):
        for h, fw in sorted(followers.items(), key=lambda kv: kv[0]):
            if len(h) != k - 1:
                continue
            total = sum(fw.values())
            for w, c in fw.items():
                prob[(*h, w)] = (c - discount) / total
            seen = sum((c - discount) / total for c in fw.values())
            lower = sum(p_full(w, h[1:]) for w in fw)
            backoff[h] = (1.0 - seen) / (1.0 - lower)
    backoff[(bos,)] = backoff.get((bos,), 1.0)

    by_order = defaultdict(list)
    for gram, p in prob.items():
        by_order[len(gram)].append((gram, math.log10(p)))
    by_order[1].append(((bos,), -99.0))
    lines = ["\\data\\"] + [f"ngram {k}={len(by_order[k])}" for k in range(1, order + 1)] + [""]
    for k in range(1, order + 1):
        lines.append(f"\\{k}-grams:")
        for gram, lp in sorted(by_order[k]):
            row = f"{lp:.6f}\t{' '.join(gram)}"
            if k < order and gram in backoff:
                row += f"\t{math.log10(backoff[gram]):.6f}"
            lines.append(row)
        lines.append("")
    lines.append("\\end\\")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"order": order, "discount": discount, "ngrams": {k: len(by_order[k]) for k in range(1, order + 1)}}
