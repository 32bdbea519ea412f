"""Phrase boosting per row: each row of a batch boosted by its own phrases (a request's), in one decode, inside the
captured graphs, as one more token model fused into greedy decoding (`fusion.Fusion`).

The rows' boosting trees (`boosting.boosting_tables`, NeMo's GPU-PB tree each) are laid end to end in one set of
tables: tree k's states are its own plus its base, so its arcs' keys (from * V + token) stay sorted after the trees
before it. Each row starts at its own tree's root, and a row's back-off chain (`chains.py`) ends at that root. A root's arcs to itself (the tokens that start no phrase, NeMo's unk_score 0) are
left out: a token found nowhere scores the back-offs on the way to the root and goes to the root, what those arcs
give. A row without phrases sits in NO_TREE, a state without arcs that backs off to itself: every token scores 0
and it stays there, so adding its scores changes nothing. Rows that share a tree (a server's batch of requests with
the same phrases) share one copy.

The tables are static buffers of a capacity (arcs, states, rows, chain length and width), refilled in place between batches (`load`)
so the decode graphs captured on them replay with other phrases; past the capacity they are made anew, twice as
large, and the graphs must be captured again.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from graphscribe.model.chains import ChainTables, chains_of
from graphscribe.model.ngram import Tables

NO_TREE = 0  # the state of a row without phrases


class RowTrees:
    """Each row's boosting tree in one set of tables on one device: `load` the rows' trees, then `advance` as a
    `ngram.TokenModel` does (with each row's own root). Written in place only: a captured graph replays it."""

    def __init__(self, vocab_size: int, device: torch.device | str, arcs: int = 1024, states: int = 256, rows: int = 8):
        self.vocab_size = vocab_size
        self.start_state = NO_TREE  # a row's state before `load` gives it a tree
        self._allocate(torch.device(device), arcs, states, rows, length=2, width=8)

    def _allocate(self, device: torch.device, arcs: int, states: int, rows: int, length: int, width: int) -> None:
        # beside a GPU, the tables' host copies in pinned memory: `load` copies them without a host wait (a decode's
        # last host read finishes its copies before the next `load` writes them again)
        pin = device.type == "cuda"
        self.chains = ChainTables(self.vocab_size, device, states, length, width, arcs, pin)
        self.roots = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) each row's root, NO_TREE without
        self.bases = torch.zeros(rows, dtype=torch.long, device=device)  # (R,) each row's tree's first state
        self._host = [torch.empty(rows, dtype=torch.long, pin_memory=pin) for _ in range(2)]

    @property
    def device(self) -> torch.device:
        return self.roots.device

    def to_device(self, device: torch.device | str) -> "RowTrees":
        if self.device != torch.device(device):
            raise ValueError(f"per-row boosting tables on {self.device}, asked for on {device}")
        return self

    def load(self, trees: Sequence[Tables | None], rows: int) -> bool:
        """The first len(trees) of `rows` rows boosted by their trees (None: no phrases), the other rows by none.
        True when the tables had to grow: graphs captured on the old ones must be captured again."""
        if len(trees) > rows:
            raise ValueError(f"per-row boosting: {len(trees)} trees for {rows} rows")
        key, target, weight, backoff_to, backoff_weight, roots, bases = _layout(trees, self.vocab_size)
        is_root = backoff_to == np.arange(len(backoff_to))  # NO_TREE and each tree's root back off to themselves
        chains = chains_of(key, backoff_to, backoff_weight, self.vocab_size, is_root, True, pad=NO_TREE)
        grown = not self.chains.fits(chains, len(key)) or rows > self.roots.numel()
        if grown:
            have = self.chains
            need = (len(key), len(backoff_to), rows, chains.states.shape[1], chains.width)
            now = (
                have.token.numel(),
                have.total.numel(),
                self.roots.numel(),
                have.states.shape[1],
                have.spread.numel(),
            )
            sizes = [max(n, 2 * h) if n > h else h for n, h in zip(need, now)]
            self._allocate(self.device, *sizes)
        self.chains.fill(chains, key, target, weight, pad=NO_TREE)
        for table, host, value in zip((self.roots, self.bases), self._host, (roots, bases)):
            array = host.numpy()
            array[: len(value)] = value
            array[len(value) :] = NO_TREE if table is self.roots else 0
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
        token: `TokenModel.advance`, each row's chain ending at its own root. No host read."""
        scores, nxt, found, total = self.chains.walk(states.to(torch.long))
        # found nowhere: the root's left-out arc to itself (weight 0) after the back-offs
        scores = torch.where(found, scores, total[:, None])
        return scores, torch.where(found, nxt, self.roots[: states.shape[0], None])

    def scores(self, states: torch.Tensor, weight: float = 1.0, out: torch.Tensor | None = None) -> torch.Tensor:
        """states (N,) -> `advance`'s scores (N, V) alone, times `weight` (into `out` if given): greedy fusion
        moves a state along one token (`move`)."""
        return self.chains.weighted_scores(states.to(torch.long), None, weight, out)

    def move(self, states: torch.Tensor, tokens: torch.Tensor, emit: torch.Tensor) -> None:
        """states (N,) int64 <- `advance`'s next state of each row's token where `emit`, in place (blank rows
        stay)."""
        self.chains.move(states, tokens, emit, roots=self.roots)


def _layout(trees: Sequence[Tables | None], v: int):
    """The trees end to end (NO_TREE first): arcs (key, target, weight), states (back-off state and weight), each
    row's root and its tree's first state."""
    keys, targets, weights = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    backoff_to, backoff_weight = [np.array([NO_TREE], np.int64)], [np.zeros(1, np.float32)]
    base_of: dict[int, int] = {}
    roots, bases, states = [], [], 1
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
    )
