"""The beam search's fused Triton kernel for 16-bit logits on CUDA: each hypothesis' candidates in one pass.

`candidates` computes what `beam._candidates` computes with PyTorch before the K x D combination: the token
log-softmax in float32, its K best tokens (blank among them), blank's log-probability and the durations'
log-softmax. PyTorch needed a log-softmax over every row of (V + 1) logits written out in float32, then a radix
top-K over it: at beam 4 and 128 inputs (512 rows of 8193) about 110 of a step's 530 us on an H200
(`scripts/experiments/beam_profile.py`), where one program a row reads its 16-bit logits once. The float32 path
keeps PyTorch's operations (its best hypotheses are NeMo's); here the sums' order differs by float32 rounding, and
of exactly equal logits the lower token comes first.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _candidates_kernel(
    logits_ptr,
    top_ptr,
    token_ptr,
    blank_ptr,
    dur_ptr,
    stride,
    V1,
    D,
    K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0)
    base = logits_ptr + row.to(tl.int64) * stride
    v = tl.arange(0, BLOCK_V)
    x = tl.load(base + v, mask=v < V1, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    log_sum = tl.log(tl.sum(tl.exp(x - m), axis=0))
    # blank is the last of the V + 1
    tl.store(blank_ptr + row, (tl.sum(tl.where(v == V1 - 1, x, 0.0), axis=0) - m) - log_sum)
    for j in tl.static_range(K):  # the K best, each the first index of the largest left
        best = tl.max(x, axis=0)
        at = tl.min(tl.where(x == best, v, BLOCK_V), axis=0)
        tl.store(top_ptr + row * K + j, (best - m) - log_sum)
        tl.store(token_ptr + row * K + j, at.to(tl.int64))
        x = tl.where(v == at, -float("inf"), x)
    if BLOCK_D > 0:
        d = tl.arange(0, BLOCK_D)
        y = tl.load(base + V1 + d, mask=d < D, other=-float("inf")).to(tl.float32)
        dm = tl.max(y, axis=0)
        d_log_sum = tl.log(tl.sum(tl.exp(y - dm), axis=0))
        tl.store(dur_ptr + row * D + d, (y - dm) - d_log_sum, mask=d < D)


def candidates(logits: torch.Tensor, vocab: int, k: int) -> tuple[torch.Tensor, ...]:
    """logits (R, V + 1 + D) of one step, vocab V + 1 (blank last) -> the K best tokens' log-probabilities (R, K)
    float32 and ids (R, K) int64, best first; blank's log-probability (R,); the durations' log-softmax (R, D)
    ((R, 0) without durations)."""
    r, width = logits.shape
    d = width - vocab
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    top = logits.new_empty(r, k, dtype=torch.float32)
    tokens = logits.new_empty(r, k, dtype=torch.long)
    blank = logits.new_empty(r, dtype=torch.float32)
    durations = logits.new_empty(r, d, dtype=torch.float32)
    _candidates_kernel[(r,)](
        logits,
        top,
        tokens,
        blank,
        durations,
        logits.stride(0),
        vocab,
        d,
        K=k,
        BLOCK_V=triton.next_power_of_2(vocab),
        BLOCK_D=triton.next_power_of_2(d) if d else 0,
        num_warps=8 if vocab > 4096 else 4,
    )
    return top, tokens, blank, durations
