"""The beam search's fused Triton kernels for 16-bit logits on CUDA: a step's choice in two passes.

`beam.beam_step` without them ran about 150 kernels a step; at beam 4 and 128 inputs (512 rows of 8193 tokens) a
step took 530 us on an H200 (`scripts/experiments/beam_profile.py`): 110 us for a float32 log-softmax over every row
and a radix top-K over it, most of the rest small element-wise kernels over (N, K, K) candidates.

  `candidates` one program a hypothesis row: the token log-softmax in float32 from the 16-bit logits read once, its
               K best tokens, blank's log-probability and the durations' log-softmax.
  `select`     one program an input: the K x K (x D) candidates' scores, finished and forced-blank hypotheses,
               the K best, the history's column, the counters and hashes, the merge of equal hypotheses and the
               frames (steps 1-4 and 6 of `beam.py`'s docstring); the prediction net (step 5) stays PyTorch's.

The float32 path keeps PyTorch's operations (its best hypotheses are NeMo's). Here the sums' order differs by
float32 rounding, and of exact ties (frequent among 16-bit logits) the first in index order wins. Tested through
Triton's interpreter against NeMo's n-best lists, compiled for sm_90, and on a GPU against NeMo's best.
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


@triton.jit
def _select_kernel(
    top_ptr,  # (N*K, K) float32: each hypothesis' K best tokens' log-probabilities
    token_ptr,  # (N*K, K) int64
    blank_ptr,  # (N*K,) float32
    dur_ptr,  # (N*K, D) float32 (TDT)
    durations_ptr,  # (D,) int64 frames of each duration index (TDT)
    scores_ptr,  # (N, K) float32, then the rest of the beam's state, all (N, K)
    t_ptr,
    active_ptr,
    lasts_ptr,
    count_ptr,
    hash_ptr,
    last_label_ptr,
    last_ptr,  # (N,) each input's last frame
    pos_ptr,  # (1,) the history's column
    labels_ptr,  # (N, K, S) int32 history
    parents_ptr,
    frames_ptr,
    spans_ptr,
    source_ptr,  # out (N*K,) int64 the parent's row
    step_label_ptr,  # out (N*K,) int64 the symbol the prediction net takes (blank: keeps the parent's state)
    S,
    D,
    BLANK,
    MAX_SYMBOLS,
    MULT: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    CP: tl.constexpr,
    TDT: tl.constexpr,
):
    n = tl.program_id(0)
    base = n * K
    # the candidates, flat: c = (hypothesis i * K + token rank j) * D + duration d
    c = tl.arange(0, CP)
    ok = c < K * K * D  # D is 1 without durations
    i = c // (K * D)
    j = (c // D) % K
    d = c % D
    score_i = tl.load(scores_ptr + base + i, mask=ok, other=-float("inf"))
    act = tl.load(active_ptr + base + i, mask=ok, other=0) != 0
    forced = act & (tl.load(lasts_ptr + base + i, mask=ok, other=0) >= MAX_SYMBOLS)
    first = (j == 0) & (d == 0)
    top = tl.load(top_ptr + (base + i) * K + j, mask=ok, other=0.0)
    label = tl.load(token_ptr + (base + i) * K + j, mask=ok, other=0)
    blank = tl.load(blank_ptr + base + i, mask=ok, other=0.0)
    if TDT:
        lp_d = tl.load(dur_ptr + (base + i) * D + d, mask=ok, other=0.0)
        frame = tl.load(durations_ptr + d, mask=ok, other=0)
        # the forced blank: the hypothesis' best pair's duration (its best token's: the durations' best)
        best_d = tl.zeros([CP], tl.float32) - float("inf")
        best_frame = tl.zeros([CP], tl.int64)
        for e in range(0, D):
            lp_e = tl.load(dur_ptr + (base + i) * D + e, mask=ok, other=0.0)
            better = lp_e > best_d
            best_frame = tl.where(better, tl.load(durations_ptr + e), best_frame)
            best_d = tl.where(better, lp_e, best_d)
        value = score_i + (top + lp_d)
        forced_value = score_i + (blank + best_d)
        frame = tl.where(forced, best_frame, frame)
    else:
        value = score_i + top
        forced_value = score_i + blank
        frame = tl.zeros([CP], tl.int64)
    value = tl.where(forced, tl.where(first, forced_value, -float("inf")), value)
    label = tl.where(forced, BLANK, label)
    value = tl.where(act, value, tl.where(first, score_i, -float("inf")))  # a finished one kept in its first place
    label = tl.where(act, label, -1)
    frame = tl.where((label == BLANK) & (frame == 0), 1, frame)  # a blank moves on
    value = tl.where(ok, value, -float("inf"))

    # the K best candidates, the first on ties; a vector of K (padded to KP)
    kk = tl.arange(0, KP)
    taken = c >= K * K * D
    pick = tl.zeros([KP], tl.int32)
    new_score = tl.zeros([KP], tl.float32) - float("inf")
    for m in tl.static_range(K):
        best = tl.max(tl.where(taken, -float("inf"), value), axis=0)
        at = tl.min(tl.where((~taken) & (value == best), c, CP), axis=0)
        taken = taken | (c == at)
        pick = tl.where(kk == m, at, pick)
        new_score = tl.where(kk == m, best, new_score)
    k_ok = kk < K
    pick = tl.where(k_ok, pick, 0)
    sel = c[None, :] == pick[:, None]  # (KP, CP): the chosen candidate of each new slot
    parent = pick // (K * D)
    lab = tl.sum(tl.where(sel, label, 0), axis=1)
    fr = tl.sum(tl.where(sel, frame, 0), axis=1)
    extended = lab >= 0
    is_blank = lab == BLANK
    is_token = extended & ~is_blank
    # the parents' state, read before any slot of this input is written
    t_par = tl.load(t_ptr + base + parent, mask=k_ok, other=0)
    lasts_par = tl.load(lasts_ptr + base + parent, mask=k_ok, other=0)
    count_par = tl.load(count_ptr + base + parent, mask=k_ok, other=0)
    hash_par = tl.load(hash_ptr + base + parent, mask=k_ok, other=0)
    last_label_par = tl.load(last_label_ptr + base + parent, mask=k_ok, other=0)
    tl.debug_barrier()
    if TDT:
        moved = tl.where(extended, fr, 0)
        reset = moved > 0
    else:
        moved = is_blank.to(tl.int64)
        reset = is_blank
    pos = tl.load(pos_ptr)
    at_history = (base + kk).to(tl.int64) * S + pos
    tl.store(labels_ptr + at_history, lab.to(tl.int32), mask=k_ok)
    tl.store(parents_ptr + at_history, parent.to(tl.int32), mask=k_ok)
    tl.store(frames_ptr + at_history, t_par.to(tl.int32), mask=k_ok)
    tl.store(spans_ptr + at_history, moved.to(tl.int32), mask=k_ok)
    lasts = tl.where(reset, 0, lasts_par + is_token.to(tl.int64))
    count = count_par + is_token.to(tl.int64)
    hashed = tl.where(is_token, hash_par * MULT + 1 + lab, hash_par)
    last_label = tl.where(is_token, lab, last_label_par)
    t = t_par + moved
    # equal hypotheses merge: the best of a group (the first on ties) gets the logsumexp of its scores
    if K > 1:
        same = (hashed[:, None] == hashed[None, :]) & (last_label[:, None] == last_label[None, :])
        same = same & (count[:, None] == count[None, :]) & k_ok[None, :]
        if TDT:
            same = same & (t[:, None] == t[None, :])
        group = tl.where(same, new_score[None, :], -float("inf"))  # (KP, KP)
        top_g = tl.max(group, axis=1)
        first_best = tl.min(tl.where(group == top_g[:, None], kk[None, :], KP), axis=1)
        safe = tl.where(top_g == -float("inf"), 0.0, top_g)
        lse = safe + tl.log(tl.sum(tl.exp(group - safe[:, None]), axis=1))
        lse = tl.where(top_g == -float("inf"), -float("inf"), lse)
        new_score = tl.where(first_best == kk, lse, -float("inf"))
    tl.store(scores_ptr + base + kk, new_score, mask=k_ok)
    tl.store(t_ptr + base + kk, t, mask=k_ok)
    tl.store(lasts_ptr + base + kk, lasts, mask=k_ok)
    tl.store(count_ptr + base + kk, count, mask=k_ok)
    tl.store(hash_ptr + base + kk, hashed, mask=k_ok)
    tl.store(last_label_ptr + base + kk, last_label, mask=k_ok)
    tl.store(active_ptr + base + kk, (t <= tl.load(last_ptr + n)).to(tl.int1), mask=k_ok)
    tl.store(source_ptr + base + kk, (base + parent).to(tl.int64), mask=k_ok)
    tl.store(step_label_ptr + base + kk, tl.where(extended, lab, BLANK).to(tl.int64), mask=k_ok)


def select(
    logits: torch.Tensor,
    vocab: int,
    durations: torch.Tensor | None,
    state: dict[str, torch.Tensor],
    max_symbols: int,
    multiplier: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One beam step's choice, in place, for N inputs x K hypotheses (`beam.beam_step`'s 1-4 and 6): logits
    (N*K, V + 1 + D) of every hypothesis; durations (D,) frames of each duration index (None: RNN-T); state the
    buffers `scores, t, active, lasts, count, hash, last_label` (N, K), `last` (N, 1), `pos` (1,) and the history
    `labels, parents, frames, spans` (N, K, S). -> each new hypothesis' parent row (N*K,) and the symbol the
    prediction net takes for it (blank: it keeps its parent's state). The history's column is not advanced."""
    n, k = state["scores"].shape
    top, tokens, blank, dur = candidates(logits, vocab, k)
    source = torch.empty(n * k, dtype=torch.long, device=logits.device)
    step_label = torch.empty(n * k, dtype=torch.long, device=logits.device)
    tdt = durations is not None
    d = dur.shape[1] if tdt else 1
    _select_kernel[(n,)](
        top,
        tokens,
        blank,
        dur,
        durations if tdt else tokens,
        *(state[name] for name in ("scores", "t", "active", "lasts", "count", "hash", "last_label", "last", "pos")),
        *(state[name] for name in ("labels", "parents", "frames", "spans")),
        source,
        step_label,
        state["labels"].shape[2],
        d,
        vocab - 1,
        max_symbols,
        MULT=multiplier,  # below 2**63: an int64 constant
        K=k,
        KP=max(2, triton.next_power_of_2(k)),
        CP=max(16, triton.next_power_of_2(k * k * d)),
        TDT=tdt,
        num_warps=1,
    )
    return source, step_label
