"""Phrase boosting per row: each row of a batch boosted by its own phrases (a request's), in one decode, inside the
captured graphs, as one more token model fused into greedy decoding (`fusion.Fusion`).

The rows' boosting trees (`boosting.boosting_tables`, NeMo's GPU-PB tree each) are laid end to end in one set of
tables: tree k's states are its own plus its base, so its arcs' keys (from * V + token) stay sorted after the trees
before it and one `searchsorted` finds any row's arcs. Each row starts at its own tree's root, and the back-off
lookups of a row stop at that root. A root's arcs to itself (the tokens that start no phrase, NeMo's unk_score 0) are
left out: a token found nowhere scores the back-offs on the way to the root and goes to the root, what those arcs
give. A row without phrases sits in NO_TREE, a state without arcs that backs off to itself: every token scores 0
and it stays there, so adding its scores changes nothing. Rows that share a tree (a server's batch of requests with
the same phrases) share one copy.

The tables are static buffers of a capacity (arcs, states, rows, lookups), refilled in place between batches (`load`)
so the decode graphs captured on them replay with other phrases; past the capacity they are made anew, twice as
large, and the graphs must be captured again.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from graphscribe.model.boosting import MAX_PHRASE_TOKENS
from graphscribe.model.ngram import Tables

NO_TREE = 0  # the state of a row without phrases
_PAD_KEY = np.iinfo(np.int64).max  # the keys past the used arcs: still sorted, and no query equals them
_MAX_ORDER = MAX_PHRASE_TOKENS + 1  # lookups a tree of the longest phrases needs


class RowTrees:
    """Each row's boosting tree in one set of tables on one device: `load` the rows' trees, then `advance` as a
    `ngram.TokenModel` does (with each row's own root). Written in place only: a captured graph replays it."""

    def __init__(self, vocab_size: int, device: torch.device | str, arcs: int = 1024, states: int = 256, rows: int = 8):
        self.vocab_size = vocab_size
        self.start_state = NO_TREE  # a row's state before `load` gives it a tree
        self.tokens = torch.arange(vocab_size, device=device)  # (V,)
        self._allocate(arcs, states, rows, 4)

    def _allocate(self, arcs: int, states: int, rows: int, order: int) -> None:
        device = self.tokens.device
        self.key = torch.full((arcs,), _PAD_KEY, dtype=torch.long, device=device)  # (A,) sorted
        self.target = torch.zeros(arcs, dtype=torch.long, device=device)  # (A,)
        self.weight = torch.zeros(arcs, dtype=torch.float32, device=device)  # (A,)
        self.backoff_to = torch.zeros(states, dtype=torch.long, device=device)  # (S,)
        self.backoff_weight = torch.zeros(states, dtype=torch.float32, device=device)  # (S,)
        self.roots = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) each row's root, NO_TREE without
        self.bases = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) each row's tree's first state
        self.order = order  # lookups a step makes: the deepest tree loaded so far, plus one
        # beside a GPU, the tables' host copies in pinned memory: `load` copies them without a host wait (a decode's
        # last host read finishes its copies before the next `load` writes them again)
        pin = device.type == "cuda"
        self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in self._tables()]

    def _tables(self) -> list[torch.Tensor]:
        return [self.key, self.target, self.weight, self.backoff_to, self.backoff_weight, self.roots, self.bases]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def to_device(self, device: torch.device | str) -> "RowTrees":
        if self.device != torch.device(device):
            raise ValueError(f"per-row boosting tables on {self.device}, asked for on {device}")
        return self

    def load(self, trees: Sequence[Tables | None], rows: int) -> bool:
        """The first len(trees) of `rows` rows boosted by their trees (None: no phrases), the other rows by none.
        True when the tables had to grow: graphs captured on the old ones must be captured again."""
        key, target, weight, backoff_to, backoff_weight, roots, bases, order = _layout(trees, self.vocab_size)
        need = (len(key), len(backoff_to), rows, order)
        have = (self.key.numel(), self.backoff_to.numel(), self.roots.numel(), self.order)
        grown = any(n > h for n, h in zip(need, have))
        if grown:
            sizes = [max(n, 2 * h) if n > h else h for n, h in zip(need[:3], have[:3])]
            self._allocate(*sizes, min(max(order, 2 * self.order), _MAX_ORDER) if order > self.order else self.order)
        values = (key, target, weight, backoff_to, backoff_weight, roots, bases)
        fills = (_PAD_KEY, 0, 0, NO_TREE, 0, NO_TREE, 0)
        for table, host, value, fill in zip(self._tables(), self._host, values, fills):
            array = host.numpy()
            array[: len(value)] = value
            array[len(value) :] = fill
            table.copy_(host, non_blocking=True)
        return grown

    def carried_in(self, local: torch.Tensor) -> torch.Tensor:
        """(B,) states relative to each row's tree (a stream's, from the chunk before) -> states in these tables."""
        return local + self.bases[: local.shape[0]]

    def carried_out(self, states: torch.Tensor) -> torch.Tensor:
        """(B,) states in these tables -> relative to each row's tree: the next chunk's tables lay it elsewhere."""
        return states - self.bases[: states.shape[0]]

    def fill_start(self, states: torch.Tensor) -> None:
        """states (N,) <- each row's root (`Fusion.reset`)."""
        states.copy_(self.roots[: states.shape[0]])

    def advance(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """states (N,) int64 -> scores (N, V) float32 natural log, next states (N, V) int64, for every non-blank
        token: `TokenModel.advance`, each row's back-offs stopping at its own root. No host read."""
        b, v = states.shape[0], self.vocab_size
        roots = self.roots[:b]  # (N,)
        scores = torch.zeros(b, v, device=states.device, dtype=torch.float32)
        nxt = torch.zeros(b, v, device=states.device, dtype=torch.long)
        found = torch.zeros(b, v, device=states.device, dtype=torch.bool)
        current = states.to(torch.long)
        backoff = torch.zeros(b, device=states.device, dtype=torch.float32)  # (N,) back-off weights on the way
        last = self.key.numel() - 1
        for _ in range(self.order):
            query = current[:, None] * v + self.tokens  # (N, V)
            arc = torch.searchsorted(self.key, query).clamp_(max=last)
            hit = (self.key[arc] == query) & ~found
            torch.where(hit, backoff[:, None] + self.weight[arc], scores, out=scores)
            torch.where(hit, self.target[arc], nxt, out=nxt)
            found |= hit
            on = current != roots  # a root: nothing below it
            backoff = backoff + self.backoff_weight[current] * on
            current = torch.where(on, self.backoff_to[current], current)
        # found nowhere: the root's left-out arc to itself (weight 0) after the back-offs
        torch.where(found, scores, backoff[:, None], out=scores)
        torch.where(found, nxt, roots[:, None], out=nxt)
        return scores, nxt


def _layout(trees: Sequence[Tables | None], v: int):
    """The trees end to end (NO_TREE first): arcs (key, target, weight), states (back-off state and weight), each
    row's root and its tree's first state, and the lookups the deepest tree needs."""
    keys, targets, weights = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    backoff_to, backoff_weight = [np.array([NO_TREE], np.int64)], [np.zeros(1, np.float32)]
    base_of: dict[int, int] = {}
    roots, bases, order, states = [], [], 1, 1
    for tree in trees:
        if tree is None:
            roots.append(NO_TREE)
            bases.append(0)
            continue
        if id(tree) not in base_of:
            base_of[id(tree)] = base = states
            source, token = np.divmod(tree.key, v)
            keep = ~((source == tree.start) & (tree.target == tree.start))  # the root's arcs to itself
            keys.append((source[keep] + base) * v + token[keep])
            targets.append(tree.target[keep] + base)
            weights.append(tree.weight[keep])
            backoff_to.append(tree.backoff_to + base)
            backoff_weight.append(tree.backoff_weight)
            states += len(tree.backoff_to)
            order = max(order, tree.order)
        roots.append(base_of[id(tree)] + tree.start)
        bases.append(base_of[id(tree)])
    return (
        np.concatenate(keys),
        np.concatenate(targets),
        np.concatenate(weights).astype(np.float32),
        np.concatenate(backoff_to),
        np.concatenate(backoff_weight).astype(np.float32),
        np.array(roots, dtype=np.int64),
        np.array(bases, dtype=np.int64),
        order,
    )
