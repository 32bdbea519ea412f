"""Greedy fusion's token-model lookups as two Triton kernels (CUDA): `chains.ChainTables`' math, one launch each.

`ChainTables.scores_over` and `next_over` walk a row's back-off chain level by level in PyTorch: some ten small
kernels a level, for each of a boosting tree's dozen levels, twice a step. Inside the decode graphs a step of 100
phrases boosted spent more on them than on the joint (v3 shape, bfloat16, 4096 files: decode 2.32 s against 0.90 s
greedy on an H200).

  `scores` one program a row: what a token on no arc of the row's chain scores (the dense root's score after the
           back-offs, or the back-offs alone), then the arcs of each state on the chain from the shallowest to the
           deepest, so the deepest state that has a token writes it last; times the model's weight. A barrier
           between levels orders one level's stores after the one before (a level's own tokens are distinct).
  `move`   one program a row: where the row emitted, its token's arc from the deepest state on the chain that has
           one, else the token's arc from the root (or the row's root), written over the row's state in place.

The same float32 operations in the same order as the PyTorch walk, so the same bits: tested against it through
Triton's interpreter, and compiled for sm_90.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _scores_kernel(
    states_ptr,
    chain_ptr,
    backoff_ptr,
    total_ptr,
    first_ptr,
    count_ptr,
    token_ptr,
    weight_ptr,
    root_has_ptr,
    root_score_ptr,
    out_ptr,
    alpha,
    V,
    out_stride,
    L,
    chain_stride,
    DENSE_ROOT: tl.constexpr,
    W: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    s = tl.load(states_ptr + row)
    out = out_ptr + row.to(tl.int64) * out_stride
    total = tl.load(total_ptr + s)
    for start in range(0, V, BLOCK_V):
        v = start + tl.arange(0, BLOCK_V)
        inside = v < V
        if DENSE_ROOT:  # an LM's start state, and a tree's root: an arc for every token they hold
            has = tl.load(root_has_ptr + v, mask=inside, other=0) != 0
            below = tl.where(has, total + tl.load(root_score_ptr + v, mask=inside, other=0.0), 0.0)
        else:  # a row's own tree: a token found nowhere scores the back-offs to its root
            below = tl.zeros([BLOCK_V], dtype=tl.float32) + total
        tl.store(out + v, below * alpha, mask=inside)
    m = tl.arange(0, W)
    for level in range(L):
        k = L - 1 - level  # the chain is deepest first: the shallowest state's arcs are laid first
        tl.debug_barrier()
        state = tl.load(chain_ptr + s * chain_stride + k)
        summed = tl.load(backoff_ptr + s * chain_stride + k)
        mine = m < tl.load(count_ptr + state)
        arc = tl.load(first_ptr + state) + m
        token = tl.load(token_ptr + arc, mask=mine, other=0)
        weight = tl.load(weight_ptr + arc, mask=mine, other=0.0)
        tl.store(out + token, (summed + weight) * alpha, mask=mine)


@triton.jit
def _move_kernel(
    states_ptr,
    tokens_ptr,
    emit_ptr,
    chain_ptr,
    first_ptr,
    count_ptr,
    token_ptr,
    target_ptr,
    root_has_ptr,
    root_next_ptr,
    roots_ptr,
    V,
    L,
    chain_stride,
    DENSE_ROOT: tl.constexpr,
    W: tl.constexpr,
):
    row = tl.program_id(0)
    if tl.load(emit_ptr + row) != 0:
        s = tl.load(states_ptr + row)
        t = tl.minimum(tl.load(tokens_ptr + row), V - 1)
        if DENSE_ROOT:
            has = tl.load(root_has_ptr + t) != 0
            nxt = tl.where(has, tl.load(root_next_ptr + t), 0)
        else:
            nxt = tl.load(roots_ptr + row)
        found = False
        m = tl.arange(0, W)
        for k in range(L):  # deepest first: the first state on the chain with an arc for the token
            state = tl.load(chain_ptr + s * chain_stride + k)
            mine = m < tl.load(count_ptr + state)
            arc = tl.load(first_ptr + state) + m
            hit = mine & (tl.load(token_ptr + arc, mask=mine, other=-1) == t)
            target = tl.sum(tl.where(hit, tl.load(target_ptr + arc, mask=hit, other=0), 0), axis=0)
            here = tl.max(hit.to(tl.int32), axis=0) > 0
            nxt = tl.where(here & ~found, target, nxt)
            found = found | here
        tl.store(states_ptr + row, nxt)


def scores(tables, states: torch.Tensor, root, weight: float, out: torch.Tensor) -> torch.Tensor:
    """`ChainTables.scores_over` times `weight`, written into `out` (B, V) float32: tables a `ChainTables`, states
    (B,) int64, root (has (V,) bool, score (V,) float32) dense, or None for the back-offs alone."""
    b, v = states.shape[0], tables.vocab_size
    has, score = root if root is not None else (tables.total, tables.total)
    _scores_kernel[(b,)](
        states,
        tables.states,
        tables.backoff,
        tables.total,
        tables.first,
        tables.count,
        tables.token,
        tables.weight,
        has,
        score,
        out,
        float(weight),
        v,
        out.stride(0),
        tables.states.shape[1],
        tables.states.stride(0),
        DENSE_ROOT=root is not None,
        W=triton.next_power_of_2(tables.spread.numel()),
        BLOCK_V=min(4096, triton.next_power_of_2(v)),
    )
    return out


def move(tables, states: torch.Tensor, tokens: torch.Tensor, emit: torch.Tensor, root=None, roots=None) -> None:
    """`states` (B,) int64 <- `ChainTables.next_over`'s next state of each row's token where `emit` (B,) bool,
    in place: root (has (V,) bool, next (V,) int64) dense, or `roots` (B,) each row's own root."""
    has, nxt = root if root is not None else (roots, roots)
    _move_kernel[(states.shape[0],)](
        states,
        tokens,
        emit,
        tables.states,
        tables.first,
        tables.count,
        tables.token,
        tables.target,
        has,
        nxt,
        roots if roots is not None else nxt,
        tables.vocab_size,
        tables.states.shape[1],
        tables.states.stride(0),
        DENSE_ROOT=root is not None,
        W=triton.next_power_of_2(tables.spread.numel()),
    )
