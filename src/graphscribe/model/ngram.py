"""Token-level n-gram models on the GPU, as NeMo's NGPU-LM holds them (`ngram_lm_batched.py`): an ARPA language
model, or a phrase-boosting tree (`boosting.py`), as one table of states and arcs that a batch of states advances
through in one vectorised lookup, inside a captured CUDA graph.

A state is a context (an n-gram of the LM, a node of the tree). An arc (from, token) -> (to, weight) exists where the
context followed by the token is an n-gram; otherwise the lookup backs off: it adds the state's back-off weight and
tries again from its back-off state, down to the start state, which has an arc for every token. The arcs are sorted
by the key from * V + token; each state's chain of back-offs is laid out once (`chains.py`), so a step reads the
few arcs of the states on each row's chain and then the start state's, without a host read.

ARPA files for token LMs are NeMo's: each token id `i` is the one-character word chr(i + 100) (KenLM's recipe in
NeMo, `DEFAULT_TOKEN_OFFSET`), fields tab-separated, weights log10 (natural log here). Lines are split on '\\n' and
fields on '\\t' and ' ' only: tokens 33 and 60 are chr(133) (NEL) and chr(160) (NBSP), which str.split() and
str.splitlines() would cut. States are numbered as NeMo numbers them, so its `advance` and ours can be compared
state for state.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from graphscribe.model.chains import ChainTables, chains_of

TOKEN_OFFSET = 100  # NeMo's DEFAULT_TOKEN_OFFSET: token i is the word chr(i + 100)
NEG_INF = -10000.0  # NeMo's "no final weight" (nemo.collections.common.parts.NEG_INF)
START, BOS = 0, 1  # the empty context, and <s>'s
MAX_ORDER = 10  # n-gram orders read at most
MAX_NGRAMS = 100_000_000  # n-grams read at most (about 2 GB of tables)
MAX_LINE = 4096  # bytes in one line of an ARPA file at most (a token n-gram line is tens)
_BOS_ID, _EOS_ID, _UNK_ID = -1, -2, -3  # NeMo's ids of the special words, sorted before the tokens as NeMo sorts them
_SPECIAL = {"<s>": _BOS_ID, "</s>": _EOS_ID, "<unk>": _UNK_ID}
_LOG10_E = float(np.log10(np.e))  # NeMo's _log_10_to_e divides by this


class ArpaError(ValueError):
    """A malformed ARPA file: one line naming the file, the line and the problem."""


@dataclass
class Tables:
    """A model as NumPy arrays (host), before it goes to a device. Arcs: key (from * V + token, sorted), to, weight;
    states: back-off state, back-off weight, final weight (back-offs resolved)."""

    vocab_size: int
    order: int  # lookups that resolve every token: the longest back-off chain plus one
    key: np.ndarray  # (A,) int64
    target: np.ndarray  # (A,) int64 the state an arc leads to
    weight: np.ndarray  # (A,) float32
    backoff_to: np.ndarray  # (S,) int64
    backoff_weight: np.ndarray  # (S,) float32
    final: np.ndarray  # (S,) float32
    start: int  # the state a hypothesis starts in


class TokenModel:
    """A token-level n-gram model (LM or boosting tree) on one device: `start`, `advance`, `final`.

    `advance(states)` gives, for each row's state, the natural-log score of each of the V non-blank tokens and the
    state that token leads to; a decoder adds `weight * scores` to its token scores and moves a row's state along the
    token it emits (blank never moves it), as NeMo's decoders use `fusion_models`.
    """

    def __init__(self, tables: Tables, device: torch.device | str = "cpu"):
        self.vocab_size, self.order, self.start_state = tables.vocab_size, tables.order, tables.start
        self.num_states, self.num_arcs = len(tables.backoff_to), len(tables.key)
        v = self.vocab_size
        is_root = np.arange(self.num_states) == START
        chains = chains_of(tables.key, tables.backoff_to, tables.backoff_weight, v, is_root, False, pad=START)
        self._chains = ChainTables.of(chains, tables.key, tables.target, tables.weight, v, device, pad=START)
        # the start state's scores, dense: it has an arc for every token the unigrams hold
        lo, hi = np.searchsorted(tables.key, [START * v, (START + 1) * v])
        tokens = tables.key[lo:hi] % v
        root_score, root_next = np.zeros(v, np.float32), np.zeros(v, np.int64)
        root_has = np.zeros(v, bool)
        root_score[tokens], root_next[tokens], root_has[tokens] = tables.weight[lo:hi], tables.target[lo:hi], True
        self.root_score, self.root_next = (
            torch.from_numpy(root_score).to(device),
            torch.from_numpy(root_next).to(device),
        )
        self.root_has = torch.from_numpy(root_has).to(device)
        self.final_weight = torch.from_numpy(tables.final).to(device)
        self._tables = tables

    @property
    def device(self) -> torch.device:
        return self.final_weight.device

    def to_device(self, device: torch.device | str) -> "TokenModel":
        """The same model on `device` (itself if it is there)."""
        return self if self.device == torch.device(device) else TokenModel(self._tables, device)

    def start(self, batch_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        """(B,) int64: every row in the start state (an LM's <s>, a tree's root)."""
        return torch.full((batch_size,), self.start_state, dtype=torch.long, device=device or self.device)

    def carried_in(self, states: torch.Tensor) -> torch.Tensor:
        """(B,) states carried from a chunk before -> states in these tables: the same (`row_boosting` shifts)."""
        return states

    def carried_out(self, states: torch.Tensor) -> torch.Tensor:
        """(B,) states -> what a chunk after takes (`carried_in`): the same."""
        return states

    def fill_start(self, states: torch.Tensor) -> None:
        """states (B,) <- the start state, in place (`fusion.Fusion.reset`)."""
        states.fill_(self.start_state)

    def advance(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """states (B,) int64 -> scores (B, V) float32 natural log, next states (B, V) int64, for every non-blank
        token: the arcs on each row's back-off chain (`chains.py`), then the start state's. No host read."""
        scores, nxt, found, total = self._chains.walk(states.to(torch.long))
        rest = ~found & self.root_has
        scores = torch.where(rest, total[:, None] + self.root_score, scores)
        return scores, torch.where(rest, self.root_next, nxt)

    def scores(self, states: torch.Tensor, weight: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor:
        """states (B,) -> `advance`'s scores (B, V) alone, times `weight` (into `out` if given): greedy fusion moves
        a state along one token (`move`)."""
        return self._chains.weighted_scores(states.to(torch.long), (self.root_has, self.root_score), weight, out)

    def move(self, states: torch.Tensor, tokens: torch.Tensor, emit: torch.Tensor) -> None:
        """states (B,) int64 <- `advance`'s next state of each row's token where `emit`, in place (blank rows
        stay)."""
        self._chains.move(states, tokens, emit, root=(self.root_has, self.root_next))

    def final(self, states: torch.Tensor) -> torch.Tensor:
        """(B,) the end-of-sentence weight of each state (an LM's </s>, back-offs resolved; a tree's phrase-end
        bonus). NeMo's transducer decoders (greedy, malsd, maes) never add it; its CTC and AED decoders may."""
        return self.final_weight[states]


# ----------------------------------------------------------------------------- tables from n-grams


class TableBuilder:
    """States and arcs as NeMo's SuffixTreeStorage adds them, in its order (so that its state ids are ours)."""

    def __init__(self, vocab_size: int):
        self.v = vocab_size
        self.arcs: list[tuple[int, int, int, float]] = []  # (from, token, to, weight)
        self.backoff_to: list[int] = []
        self.backoff_weight: list[float] = []
        self.final: list[float] = []

    def state(self, backoff_to: int, backoff_weight: float, final: float = NEG_INF) -> int:
        self.backoff_to.append(backoff_to)
        self.backoff_weight.append(backoff_weight)
        self.final.append(final)
        return len(self.backoff_to) - 1

    def tables(self, order: int, start: int, resolve_final: bool) -> Tables:
        arcs = np.array(self.arcs, dtype=[("from", np.int64), ("token", np.int64), ("to", np.int64), ("w", np.float32)])
        key = arcs["from"] * self.v + arcs["token"]
        sort = np.argsort(key, kind="stable")
        backoff_to = np.array(self.backoff_to, dtype=np.int64)
        backoff_weight = np.array(self.backoff_weight, dtype=np.float32)
        final = np.array(self.final, dtype=np.float32)
        if resolve_final:
            final = resolve_finals(final, backoff_to, backoff_weight)
        return Tables(
            self.v, order, key[sort], arcs["to"][sort], arcs["w"][sort], backoff_to, backoff_weight, final, start
        )


def resolve_finals(final: np.ndarray, backoff_to: np.ndarray, backoff_weight: np.ndarray) -> np.ndarray:
    """NeMo's `_get_final_pytorch`: a state without a </s> weight takes its back-off's, plus the back-off weights."""
    out, current = final.copy(), np.arange(len(final))
    acc = np.zeros_like(final)
    while (out <= NEG_INF).any() and (current != START).any():
        acc += backoff_weight[current]
        current = backoff_to[current]
        below = final[current]
        out = np.where((out > NEG_INF) | (below <= NEG_INF), out, acc + below).astype(np.float32)
    return out


# ----------------------------------------------------------------------------- ARPA


def read_arpa(path: str | os.PathLike, vocab_size: int, max_ngrams: int = MAX_NGRAMS) -> Tables:
    """The tables of an ARPA file, built as NeMo's `NGramGPULanguageModel.from_arpa` builds them."""
    reader = _ArpaReader(str(path), vocab_size, max_ngrams)
    try:
        with open(path, "rb") as f:
            return reader.read(f)
    except OSError as err:
        raise ArpaError(f"{path}: cannot read the LM ({err.strerror or err})") from None


class _ArpaReader:
    def __init__(self, path: str, vocab_size: int, max_ngrams: int):
        self.path, self.v, self.max_ngrams = path, vocab_size, max_ngrams
        self.line_no = 0

    def fail(self, problem: str) -> ArpaError:
        where = f"{self.path}:{self.line_no}" if self.line_no else self.path
        return ArpaError(f"{where}: {problem}")

    def _lines(self, f):
        while raw := f.readline(MAX_LINE + 1):  # binary lines end at b"\n" only
            self.line_no += 1
            if len(raw) > MAX_LINE:
                raise self.fail(f"a line of over {MAX_LINE} bytes (not an ARPA LM over tokens)")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise self.fail("not UTF-8 text (an ARPA LM is a text file)") from None
            yield line.rstrip("\n").removesuffix("\r")

    def read(self, f) -> Tables:
        lines = self._lines(f)
        counts = self._header(lines)
        grams: dict[int, list] = {}
        order, expected = 0, 0
        for line in lines:
            if line == "\\end\\":
                break
            if not line:
                continue
            if line.startswith("\\"):
                if order and len(grams[order]) != counts[order]:
                    raise self.fail(f"{len(grams[order])} {order}-grams, the header says {counts[order]}")
                order = self._section(line, counts, order)
                grams[order], expected = [], counts[order]
                continue
            if not order:
                raise self.fail("an n-gram before the first \\1-grams: section")
            if len(grams[order]) >= expected:
                raise self.fail(f"more {order}-grams than the header's {expected}")
            grams[order].append(self._ngram(line, order, order == max(counts)))
        else:
            raise self.fail("no \\end\\ line (the file is cut short?)")
        if order and len(grams[order]) != counts[order]:
            raise self.fail(f"{len(grams[order])} {order}-grams, the header says {counts[order]}")
        missing = [k for k in counts if k not in grams]
        if missing:
            raise self.fail(f"no \\{missing[0]}-grams: section, the header lists {counts[missing[0]]}")
        return self._tables(grams, max(counts))

    def _header(self, lines) -> dict[int, int]:
        for line in lines:
            if line.strip():
                if line.strip() != "\\data\\":
                    raise self.fail("not an ARPA file: the first line is not '\\data\\'")
                break
        else:
            raise self.fail("empty file, not an ARPA LM")
        counts: dict[int, int] = {}
        for line in lines:
            if not line.strip():
                if counts:
                    break
                continue
            name, eq, n = line.partition("=")
            field = name.split(" ")
            if not eq or len(field) != 2 or field[0] != "ngram" or not field[1].isdigit() or not n.strip().isdigit():
                raise self.fail(f"expected 'ngram N=COUNT' in the header, found {line[:40]!r}")
            k, n = int(field[1]), int(n)
            if not 1 <= k <= MAX_ORDER or k != len(counts) + 1:
                raise self.fail(f"n-gram orders must run 1, 2, ... up to {MAX_ORDER}; found order {k}")
            counts[k] = n
        if not counts:
            raise self.fail("no 'ngram N=COUNT' lines in the header")
        if sum(counts.values()) > self.max_ngrams:
            raise self.fail(f"{sum(counts.values())} n-grams, more than the {self.max_ngrams} read at most")
        return counts

    def _section(self, line: str, counts: dict[int, int], order: int) -> int:
        head = line[1:].removesuffix("-grams:")
        if not line.endswith("-grams:") or not head.isdigit() or int(head) != order + 1 or int(head) not in counts:
            raise self.fail(f"expected \\{order + 1}-grams:, found {line[:40]!r}")
        return int(head)

    def _ngram(self, line: str, order: int, last: bool) -> tuple[tuple[int, ...], float, float]:
        fields = line.split("\t")
        if len(fields) not in (2, 3) or (last and len(fields) == 3):
            raise self.fail(f"expected 'log10p<TAB>words[<TAB>backoff]', found {line[:60]!r}")
        weight = self._number(fields[0])
        backoff = self._number(fields[2]) if len(fields) == 3 else 0.0
        words = fields[1].split(" ")
        if len(words) != order:
            raise self.fail(f"{len(words)} words in a {order}-gram (token words are one character each)")
        return tuple(self._word(w) for w in words), weight, backoff

    def _number(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise self.fail(f"{text[:20]!r} is not a number") from None
        if not math.isfinite(value):
            raise self.fail(f"{text[:20]!r} is not a finite number")
        return value / _LOG10_E

    def _word(self, word: str) -> int:
        if word in _SPECIAL:
            return _SPECIAL[word]
        if len(word) != 1 or not 0 <= ord(word) - TOKEN_OFFSET < self.v:
            raise self.fail(
                f"word {word[:20]!r} is not a token of this model (token i is chr(i + {TOKEN_OFFSET}), "
                f"{self.v} tokens): the LM is made for another vocabulary (scripts/build_lm.py makes one)"
            )
        return ord(word) - TOKEN_OFFSET

    def _tables(self, grams: dict[int, list], max_order: int) -> Tables:
        """NeMo's SuffixTreeStorage: unigrams, then each order sorted by its words, the top order's arcs last."""
        self.line_no = 0  # problems from here on are about n-grams, named by their words
        b = TableBuilder(self.v)
        b.state(START, 0.0)
        b.state(START, 0.0)  # <s>: its back-off weight is set below
        unigram_to = self._unigrams(b, sorted(grams[1], key=lambda g: g[0]))
        cache: dict[tuple[int, ...], int] = {}

        def find(words: tuple[int, ...]) -> int:
            if len(words) > 1:
                if words not in cache:
                    raise self.fail(f"n-gram {_show(words)} is missing (each n-gram's prefix and suffix must be one)")
                return cache[words]
            if words[0] == _BOS_ID:
                return BOS
            if words[0] >= 0:
                return unigram_to[words[0]]
            raise self.fail(f"{_show(words)} inside an n-gram (<unk> and </s> can only end one)")

        for k in range(2, max_order + 1):
            new_cache: dict[tuple[int, ...], int] = {}
            seen: set[tuple[int, ...]] = set()
            for words, weight, backoff in sorted(grams[k], key=lambda g: g[0]):
                if words in seen:
                    raise self.fail(f"n-gram {_show(words)} listed twice")
                seen.add(words)
                origin = find(words[:-1])
                if words[-1] == _EOS_ID:
                    b.final[origin] = np.float32(weight)
                    continue
                if words[-1] < 0:
                    raise self.fail(f"{_show(words)}: only a token or </s> can end an n-gram of order 2 and up")
                suffix = find(words[1:])
                if k < max_order:
                    target = b.state(suffix, backoff)
                    new_cache[words] = target
                else:
                    target = suffix
                b.arcs.append((origin, words[-1], target, weight))
            cache = new_cache
        # back-off chains: a state of order k (NeMo's: <s> and the unigrams 2) backs off k - 1 times to the start
        return b.tables(max(max_order, 2), BOS, resolve_final=True)

    def _unigrams(self, b: TableBuilder, unigrams: list) -> list[int]:
        unk, bos, seen = None, None, {}
        for words, weight, backoff in unigrams:
            label = words[0]
            if label in seen:
                raise self.fail(f"unigram {_show(words)} listed twice")
            seen[label] = True
            if label == _UNK_ID:
                unk = np.float32(weight)
            elif label == _BOS_ID:
                bos = backoff
            elif label == _EOS_ID:
                b.final[START] = np.float32(weight)
            else:
                b.arcs.append((START, label, b.state(START, backoff), weight))
        if bos is None:
            raise self.fail("no <s> unigram (NeMo's NGPU-LM needs one)")
        b.backoff_weight[BOS] = bos
        to = [START] * self.v
        for _, label, target, _ in b.arcs:
            to[label] = target
        absent = [label for label in range(self.v) if label not in seen]
        if absent and unk is None:
            raise self.fail(f"{len(absent)} tokens are not in the unigrams and there is no <unk> unigram for them")
        if absent:
            # NeMo's normalize_unk: <unk>'s probability shared by the absent tokens (float32 minus a float64 log)
            unk = np.float32(np.float64(unk) - (np.log(len(absent)) if len(absent) > 1 else 0.0))
            b.arcs.extend((START, label, START, float(unk)) for label in absent)
        return to


def _show(words: tuple[int, ...]) -> str:
    names = {v: k for k, v in _SPECIAL.items()}
    return "'" + " ".join(names.get(w, chr(w + TOKEN_OFFSET)) for w in words) + "'"
