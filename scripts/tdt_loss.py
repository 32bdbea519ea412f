"""TDT and RNN-T losses in plain PyTorch: the forward algorithm over the time-by-label lattice.

A lattice node (t, u) means "u labels emitted, at frame t". From a node a transition either
emits blank and moves on d >= 1 frames, or emits label u + 1 and moves on d >= 0 frames
(TDT: every d in `durations`, each with the joint's duration probability; RNN-T: blank
d = 1, labels d = 0). The utterance ends when a blank lands exactly on frame T with all U
labels emitted (NeMo's convention: a label never ends it).

    alpha[t, u] = logsumexp over transitions (t - d, u - s) -> (t, u) of alpha[t - d, u - s] + w

The loop runs over t only, vectorised over the batch and the label axis. Transitions from
earlier frames are gathered at once; labels with d = 0 chain along u inside one frame,
`alpha[t, u] = logaddexp(a[u], alpha[t, u - 1] + c[u])`, which is a linear recurrence in the
log semiring, solved in one pass: `alpha[t] = C + logcumsumexp(a - C)` with `C = cumsum(c)`.
Autograd gives the gradients. Everything runs in float32 (or float64 for tests).

NeMo's options: `sigma` (logit under-normalisation: token log-probs minus sigma) and `omega`
(the probability of using the plain RNN-T loss for a batch instead).
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

NEG = -1e30  # log(0) stand-in: finite, so that logcumsumexp's gradient stays finite on unreachable nodes


def lattice_log_likelihood(
    blank_w: torch.Tensor,
    label_w: torch.Tensor,
    frames: torch.Tensor,
    target_lengths: torch.Tensor,
    blank_durations: tuple[int, ...],
    label_durations: tuple[int, ...],
) -> torch.Tensor:
    """log P(labels | audio) for each row.

    blank_w (B, T, U+1, Kb): log-weight of a blank from node (t, u) moving on blank_durations[k] frames.
    label_w (B, T, U, Kl): log-weight of emitting label u+1 at node (t, u), moving on label_durations[k].
    frames (B,) valid frames, target_lengths (B,) labels. -> (B,)
    """
    b, t_max, u1, _ = blank_w.shape
    if any(d < 1 for d in blank_durations):
        raise ValueError(f"blank durations must be >= 1 (NeMo turns a blank's 0 into 1), got {blank_durations}")
    # Entering transitions j: from (t - d_j, u - s_j) with weight enter[:, t, j, u].
    sources: list[tuple[int, int]] = []
    enter: list[torch.Tensor] = []
    for k, d in enumerate(blank_durations):
        sources.append((d, 0))
        enter.append(F.pad(blank_w[..., k], (0, 0, d, 0), value=NEG)[:, :t_max])  # (B, T, U+1)
    zero_k = None
    for k, d in enumerate(label_durations):
        if d == 0:
            zero_k = k
            continue
        sources.append((d, 1))
        enter.append(F.pad(label_w[..., k], (1, 0, d, 0), value=NEG)[:, :t_max])  # (B, T, U+1): into u from u-1
    enter_t = torch.stack(enter, dim=2)  # (B, T, J, U+1)
    start = torch.full((b, u1), NEG, dtype=blank_w.dtype, device=blank_w.device)
    start[:, 0] = 0.0
    unreachable = torch.full_like(start, NEG)
    alphas: list[torch.Tensor] = []  # alpha[t] (B, U+1)
    shifted: list[torch.Tensor] = []  # alpha[t] moved one label on: shifted[t][u] = alpha[t][u - 1]
    for t in range(t_max):
        history = [(alphas if s == 0 else shifted)[t - d] if t >= d else unreachable for d, s in sources]
        a = torch.logsumexp(torch.stack(history, dim=1) + enter_t[:, t], dim=1)  # (B, U+1)
        if t == 0:
            a = start
        if zero_k is not None:  # labels with d = 0 chain along u within this frame
            c = F.pad(label_w[:, t, :, zero_k], (1, 0), value=0.0)  # (B, U+1), c[u] enters u from u-1
            cum = torch.cumsum(c, dim=1)
            a = cum + torch.logcumsumexp(a - cum, dim=1)
        alphas.append(a)
        shifted.append(F.pad(a[:, :-1], (1, 0), value=NEG))
    alpha = torch.stack(alphas, dim=1)  # (B, T, U+1)
    rows = torch.arange(b, device=blank_w.device)
    finals = []
    for k, d in enumerate(blank_durations):  # end: a blank lands exactly on frame T from (T - d, U)
        t_from = frames - d
        ok = t_from >= 0
        t_from = t_from.clamp(min=0)
        finals.append(
            torch.where(ok, alpha[rows, t_from, target_lengths] + blank_w[rows, t_from, target_lengths, k], NEG)
        )
    return torch.logsumexp(torch.stack(finals, dim=1), dim=1)


def _token_log_probs(token_logits: torch.Tensor, targets: torch.Tensor, blank: int):
    """token_logits (B, T, U+1, V+1) -> blank log-probs (B, T, U+1), target label log-probs (B, T, U), float32+."""
    logits = token_logits if token_logits.dtype == torch.float64 else token_logits.float()
    lse = torch.logsumexp(logits, dim=-1)  # (B, T, U+1)
    blank_lp = logits[..., blank] - lse
    u = targets.shape[1]
    index = targets[:, None, :, None].expand(-1, logits.shape[1], -1, 1)  # (B, T, U, 1)
    label_lp = logits[:, :, :u].gather(-1, index)[..., 0] - lse[:, :, :u]
    return blank_lp, label_lp


def rnnt_log_likelihood(token_logits, targets, frames, target_lengths, blank):
    """Plain RNN-T: log P(targets | audio) per row. Shapes as in `tdt_loss`."""
    blank_lp, label_lp = _token_log_probs(token_logits, targets, blank)
    return lattice_log_likelihood(blank_lp[..., None], label_lp[..., None], frames, target_lengths, (1,), (0,))


def tdt_log_likelihood(
    token_logits, duration_logits, targets, frames, target_lengths, durations, blank, sigma: float = 0.0
):
    """TDT: log P(targets | audio) per row (NeMo's TDT loss is its negative)."""
    blank_lp, label_lp = _token_log_probs(token_logits, targets, blank)
    blank_lp, label_lp = blank_lp - sigma, label_lp - sigma
    dur = duration_logits if duration_logits.dtype == torch.float64 else duration_logits.float()
    dur_lp = torch.log_softmax(dur, dim=-1)  # (B, T, U+1, D)
    moving = [k for k, d in enumerate(durations) if d > 0]
    blank_w = blank_lp[..., None] + dur_lp[..., moving]  # (B, T, U+1, Kb)
    label_w = label_lp[..., None] + dur_lp[:, :, : targets.shape[1]]  # (B, T, U, D)
    return lattice_log_likelihood(
        blank_w, label_w, frames, target_lengths, tuple(durations[k] for k in moving), tuple(durations)
    )


def tdt_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    frames: torch.Tensor,
    target_lengths: torch.Tensor,
    durations: tuple[int, ...],
    blank: int,
    sigma: float = 0.0,
    omega: float = 0.0,
    rng: random.Random | None = None,
) -> torch.Tensor:
    """Per-row negative log-likelihood (B,) of the joint's output.

    logits (B, T, U+1, V+1+D): token logits (blank = V, last of them) then D duration logits;
    targets (B, U) label ids (padding anything < V); frames (B,) and target_lengths (B,) valid lengths.
    With probability `omega` (NeMo's) the batch is scored by plain RNN-T on the token logits instead.
    """
    vocab = logits.shape[-1] - len(durations)
    token_logits, duration_logits = logits[..., :vocab], logits[..., vocab:]
    if omega > 0.0 and (rng or random).random() < omega:
        return -rnnt_log_likelihood(token_logits, targets, frames, target_lengths, blank)
    return -tdt_log_likelihood(token_logits, duration_logits, targets, frames, target_lengths, durations, blank, sigma)
