"""The lookup of a token model's scores (an n-gram LM, a boosting tree: `ngram.TokenModel`, `row_boosting.RowTrees`)
along each state's back-off chain, precomputed.

A state's scores for the V tokens: a token's arc from the state itself, else from its back-off state (plus the
back-off weight), and so on down to the root. Looking every token up in every state of the chain in turn costs
chain-length x V lookups a row; but a state's chain is fixed, and the states on it other than the root have few
arcs (a tree's nodes: their children; an LM's contexts: the tokens seen after them). So the chain of each state is
laid out once on the host (`Chains`: its states deepest first, the back-off weights summed before each), and a
step reads each row's chain, scatters the few arcs of each state on it into the row's V scores (the first found
wins: the deepest), then fills what is left from the root's scores, all with fixed shapes: no host read, one
captured graph. A boosting tree of 100 phrases whose deepest phrase is 16 tokens: 17 lookups of V tokens before,
2 states of at most 32 arcs now.

The sums of back-off weights are float32 additions in the order the chain is walked: the scores are bit for bit
those of walking it.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from graphscribe.model import import_kernels

log = logging.getLogger(__name__)


@dataclass
class Chains:
    """Host arrays: each state's chain and its arcs' places."""

    states: np.ndarray  # (S, L) int64: the states whose own arcs a lookup from s reads, deepest first; `pad` after
    backoff: np.ndarray  # (S, L) float32: the back-off weights summed before reaching each
    total: np.ndarray  # (S,) float32: summed before reaching the root
    first: np.ndarray  # (S,) int64: a state's first arc (the arcs sorted by from * V + token)
    count: np.ndarray  # (S,) int64: its arcs read on the chain (a root whose scores come dense: 0)
    width: int  # the most arcs a state on a chain has (at least 1)


def chains_of(
    key: np.ndarray,
    backoff_to: np.ndarray,
    backoff_weight: np.ndarray,
    vocab_size: int,
    is_root: np.ndarray,
    root_on_chain: bool,
    pad: int,
) -> Chains:
    """The chains of every state of a model whose arcs are `key` (from * V + token, sorted) and whose back-offs
    lead to a root (`is_root`, (S,) bool). root_on_chain: the root's own arcs are read on the chain (a row's tree
    whose root has only its phrases' first tokens); else they come dense (an LM's start state has every token) and
    its count is 0. pad: a state without arcs to fill the short chains with."""
    s = len(backoff_to)
    bounds = np.searchsorted(key, np.arange(s + 1, dtype=np.int64) * vocab_size)
    first, count = bounds[:-1], np.diff(bounds)
    if not root_on_chain:
        count = np.where(is_root, 0, count)
    states, backoffs = [], []
    current, summed = np.arange(s, dtype=np.int64), np.zeros(s, dtype=np.float32)
    done = np.zeros(s, dtype=bool)
    for _ in range(s + 1):
        at_root = is_root[current]
        read = ~done & (root_on_chain | ~at_root)
        if read.any():
            states.append(np.where(read, current, pad))
            backoffs.append(np.where(read, summed, np.float32(0)))
        done |= at_root
        if done.all():
            break
        summed = np.where(done, summed, summed + backoff_weight[current]).astype(np.float32)
        current = np.where(done, current, backoff_to[current])
    else:
        raise ValueError("a back-off chain that reaches no root")
    if not states:  # every state a root read dense: one column of pads
        states, backoffs = [np.full(s, pad, dtype=np.int64)], [np.zeros(s, dtype=np.float32)]
    width = int(count.max(initial=0))
    return Chains(np.stack(states, 1), np.stack(backoffs, 1), summed, first, count, max(width, 1))


class ChainTables:
    """`Chains` and the arcs on one device, as static buffers of a capacity (states, chain length, width, arcs):
    `fill` writes them in place (a captured graph replays `walk` with new contents); `fits` says whether they
    hold a model."""

    def __init__(self, vocab_size: int, device, states: int, length: int, width: int, arcs: int, pin: bool = False):
        self.vocab_size = vocab_size
        self.states = torch.zeros(states, length, dtype=torch.long, device=device)  # (S, L)
        self.backoff = torch.zeros(states, length, dtype=torch.float32, device=device)  # (S, L)
        self.total = torch.zeros(states, dtype=torch.float32, device=device)  # (S,)
        self.first = torch.zeros(states, dtype=torch.long, device=device)  # (S,)
        self.count = torch.zeros(states, dtype=torch.long, device=device)  # (S,)
        self.token = torch.zeros(arcs, dtype=torch.long, device=device)  # (A,)
        self.target = torch.zeros(arcs, dtype=torch.long, device=device)  # (A,)
        self.weight = torch.zeros(arcs, dtype=torch.float32, device=device)  # (A,)
        self.spread = torch.arange(width, device=device)  # (M,)
        self._pin = pin
        self._host: list[torch.Tensor] | None = None  # the tables' host copies, made by the first `fill`

    @classmethod
    def of(cls, chains: Chains, key, target, weight, vocab_size: int, device, pad: int) -> "ChainTables":
        """Tables just the size of one model (arcs key, target, weight as `chains_of` took them), filled."""
        s, length = chains.states.shape
        tables = cls(vocab_size, device, s, length, chains.width, max(len(key), 1))
        tables.fill(chains, key, target, weight, pad)
        tables._host = None  # filled once (pageable copies, done): no second copy of a large LM kept
        return tables

    def _tables(self) -> list[torch.Tensor]:
        return [self.states, self.backoff, self.total, self.first, self.count, self.token, self.target, self.weight]

    def fits(self, chains: Chains, arcs: int) -> bool:
        s, length = chains.states.shape
        return (
            s <= self.total.numel()
            and length <= self.states.shape[1]
            and chains.width <= self.spread.numel()
            and arcs <= self.token.numel()
        )

    def fill(self, chains: Chains, key: np.ndarray, target: np.ndarray, weight: np.ndarray, pad: int) -> None:
        """Write a model that `fits` in place (past it: chains of `pad`, states and arcs of nothing), each table
        through its host copy (pinned beside a GPU: no host wait)."""
        length = chains.states.shape[1]
        values = (
            chains.states,
            chains.backoff,
            chains.total,
            chains.first,
            chains.count,
            key % self.vocab_size,
            target,
            weight,
        )
        fills = (pad, 0, 0, 0, 0, 0, 0, 0)
        if self._host is None:
            self._host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=self._pin) for t in self._tables()]
        for table, host, value, fill in zip(self._tables(), self._host, values, fills):
            array = host.numpy()
            array[...] = fill
            if array.ndim == 2:
                array[: len(value), :length] = value
            else:
                array[: len(value)] = value
            table.copy_(host, non_blocking=True)

    def _arcs(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """state (B,) -> (B, M) its arcs' places (0 past its own) and whether each is its own."""
        mine = self.spread < self.count[state][:, None]
        return torch.where(mine, self.first[state][:, None] + self.spread, 0), mine

    def scores_over(self, states: torch.Tensor, below: torch.Tensor) -> torch.Tensor:
        """states (B,) -> (B, V) float32: `below` (B, V) or (B, 1), what a token on no arc of the chain scores, with
        the arcs on each row's chain laid over it, the deepest last: `walk`'s scores where it found the token (the
        deepest state that has it wins there too), without its next states' and found tokens' (B, V) passes."""
        b, v = states.shape[0], self.vocab_size
        scores = torch.empty(b, v + 1, device=states.device, dtype=torch.float32)
        scores[:, :v] = below
        chain, summed = self.states[states], self.backoff[states]  # (B, L)
        for k in range(chain.shape[1] - 1, -1, -1):
            arc, mine = self._arcs(chain[:, k])
            token = torch.where(mine, self.token[arc], v)  # (B, M), distinct where mine; the rest to a spare column
            scores.scatter_(1, token, summed[:, k : k + 1] + self.weight[arc])
        return scores[:, :v]

    def weighted_scores(self, states: torch.Tensor, root, weight: float, out: torch.Tensor | None) -> torch.Tensor:
        """states (B,) int64 -> (B, V) float32 `scores_over` times `weight` (into `out` if given), below the chains
        root = (has, score) (V,) each, the dense root's scores after the back-offs where it has the token (else 0),
        or None for the back-offs alone. On CUDA one kernel (`chain_kernels.scores`), the same bits."""
        kernels = _chain_kernels() if states.is_cuda else None
        if kernels is not None:
            out = torch.empty(states.shape[0], self.vocab_size, device=states.device) if out is None else out
            return kernels.scores(self, states, root, weight, out)
        total = self.total[states][:, None]
        below = total if root is None else torch.where(root[0], total + root[1], 0.0)
        scores = self.scores_over(states, below)
        return scores * weight if out is None else torch.mul(scores, weight, out=out)

    def move(self, states: torch.Tensor, tokens: torch.Tensor, emit: torch.Tensor, root=None, roots=None) -> None:
        """states (B,) int64 <- each emitting row's (`emit` (B,) bool) next state of its token (`next_over`), in
        place; a token on no arc of the chain goes to root = (has, next) (V,) each, the dense root's arc (else
        state 0), or to the row's own root (`roots` (B,)). On CUDA one kernel (`chain_kernels.move`)."""
        kernels = _chain_kernels() if states.is_cuda else None
        if kernels is not None:
            kernels.move(self, states, tokens, emit, root, roots)
            return
        tokens = tokens.clamp(max=self.vocab_size - 1)  # blank rows do not emit
        otherwise = roots[: states.shape[0]] if root is None else torch.where(root[0][tokens], root[1][tokens], 0)
        torch.where(emit, self.next_over(states, tokens, otherwise), states, out=states)

    def next_over(self, states: torch.Tensor, tokens: torch.Tensor, otherwise: torch.Tensor) -> torch.Tensor:
        """states (B,), tokens (B,) -> (B,) the state each row's token leads to from the deepest state on its chain
        with an arc for it (`walk`'s next state of that token), else `otherwise` (B,)."""
        out = otherwise
        chain = self.states[states]
        for k in range(chain.shape[1] - 1, -1, -1):
            arc, mine = self._arcs(chain[:, k])
            hit = mine & (self.token[arc] == tokens[:, None])  # at most one arc of a state has the token
            out = torch.where(hit.any(dim=1), (self.target[arc] * hit).sum(dim=1), out)
        return out

    def walk(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """states (B,) -> scores (B, V) float32, next states (B, V) int64 and found (B, V) bool from the arcs on
        each row's chain (0 where none), and (B,) the back-off weights summed on the way to its root."""
        b, v = states.shape[0], self.vocab_size
        spare = v  # a column that the places past a state's arcs write to, dropped at the end
        scores = torch.zeros(b, v + 1, device=states.device, dtype=torch.float32)
        nxt = torch.zeros(b, v + 1, device=states.device, dtype=torch.long)
        found = torch.zeros(b, v + 1, device=states.device, dtype=torch.bool)
        chain, summed = self.states[states], self.backoff[states]  # (B, L)
        for k in range(chain.shape[1]):
            arc, mine = self._arcs(chain[:, k])  # (B, M)
            token = torch.where(mine, self.token[arc], spare)  # (B, M), distinct where mine
            new = mine & ~found.gather(1, token)
            scores.scatter_(
                1, token, torch.where(new, summed[:, k : k + 1] + self.weight[arc], scores.gather(1, token))
            )
            nxt.scatter_(1, token, torch.where(new, self.target[arc], nxt.gather(1, token)))
            found.scatter_(1, token, found.gather(1, token) | new)
        return scores[:, :v], nxt[:, :v], found[:, :v], self.total[states]


@functools.cache
def _chain_kernels():
    try:
        chain_kernels = import_kernels("chain_kernels")
    except ImportError as err:
        log.warning("greedy fusion's lookup kernels are unavailable (%s); using PyTorch's operations", err)
        return None
    return chain_kernels
