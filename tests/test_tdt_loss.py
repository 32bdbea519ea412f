"""The training script's TDT loss: brute force over all alignments, RNN-T against torchaudio, gradients."""

import math
import random

import pytest
import tdt_loss as tdt  # scripts/ (pytest's pythonpath)
import torch


def brute_force_tdt(token_lp, dur_lp, target, frames, durations, blank):
    """log-sum over every path from (0, 0) to (T, U): blanks move d >= 1, labels d >= 0 and stay inside T."""
    u_len = len(target)

    def paths(t, u):
        if t == frames:
            return [0.0] if u == u_len else []
        out = []
        for k, d in enumerate(durations):
            if d > 0 and t + d <= frames:  # blank
                if t + d < frames or u == u_len:
                    out += [token_lp[t, u, blank] + dur_lp[t, u, k] + rest for rest in paths(t + d, u)]
            if u < u_len and t + d < frames:  # label u + 1
                out += [token_lp[t, u, target[u]] + dur_lp[t, u, k] + rest for rest in paths(t + d, u + 1)]
        return out

    found = paths(0, 0)
    return torch.logsumexp(torch.stack(found), 0) if found else torch.tensor(-math.inf, dtype=torch.float64)


def _random_case(b, t, u, v, d, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, t, u + 1, v + 1 + d, generator=gen, dtype=torch.float64) * 2
    targets = torch.randint(0, v, (b, u), generator=gen)
    return logits, targets


@pytest.mark.parametrize("durations", [(0, 1, 2, 3, 4), (0, 1, 2), (1, 2), (0, 2, 3)])
@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_tdt_matches_brute_force(durations, sigma):
    v, d = 4, len(durations)
    logits, targets = _random_case(3, 5, 3, v, d, seed=len(durations) + int(sigma * 100))
    frames = torch.tensor([5, 4, 2])
    lengths = torch.tensor([3, 2, 1])
    got = -tdt.tdt_loss(logits, targets, frames, lengths, durations, blank=v, sigma=sigma)
    token_lp = torch.log_softmax(logits[..., : v + 1], -1) - sigma
    dur_lp = torch.log_softmax(logits[..., v + 1 :], -1)
    for i in range(3):
        want = brute_force_tdt(token_lp[i], dur_lp[i], targets[i, : lengths[i]].tolist(), int(frames[i]), durations, v)
        if math.isinf(want.item()):  # no path (e.g. durations without 1 on odd lengths): both say "impossible"
            assert got[i] < -1e20
        else:
            assert torch.allclose(got[i], want, atol=1e-9), (i, got[i].item(), want.item())


def brute_force_rnnt(token_lp, target, frames, blank):
    def paths(t, u):
        if t == frames - 1 and u == len(target):
            return [token_lp[t, u, blank]]
        out = []
        if t < frames - 1:
            out += [token_lp[t, u, blank] + rest for rest in paths(t + 1, u)]
        if u < len(target):
            out += [token_lp[t, u, target[u]] + rest for rest in paths(t, u + 1)]
        return out

    return torch.logsumexp(torch.stack(paths(0, 0)), 0)


def test_rnnt_matches_brute_force():
    v = 5
    logits, targets = _random_case(2, 4, 3, v, 0, seed=7)
    frames, lengths = torch.tensor([4, 3]), torch.tensor([3, 2])
    got = tdt.rnnt_log_likelihood(logits, targets, frames, lengths, blank=v)
    token_lp = torch.log_softmax(logits, -1)
    for i in range(2):
        want = brute_force_rnnt(token_lp[i], targets[i, : lengths[i]].tolist(), int(frames[i]), v)
        assert torch.allclose(got[i], want, atol=1e-9)


def test_rnnt_special_case_matches_torchaudio():
    functional = pytest.importorskip("torchaudio.functional")
    v, b, t, u = 11, 4, 17, 6
    logits, targets = _random_case(b, t, u, v, 0, seed=3)
    logits = logits.float()
    frames = torch.tensor([17, 12, 9, 17])
    lengths = torch.tensor([6, 4, 1, 0])
    want = functional.rnnt_loss(logits, targets.int(), frames.int(), lengths.int(), blank=v, reduction="none")
    got = -tdt.rnnt_log_likelihood(logits, targets, frames, lengths, blank=v)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-4), (got, want)
    # omega = 1: the TDT loss falls back to exactly this RNN-T loss on the token logits
    with_durations = torch.cat([logits, torch.randn(b, t, u + 1, 3)], dim=-1)
    fallback = tdt.tdt_loss(with_durations, targets, frames, lengths, (0, 1, 2), blank=v, omega=1.0)
    assert torch.allclose(fallback, want, rtol=1e-5, atol=1e-4)


def test_rnnt_gradients_match_torchaudio():
    functional = pytest.importorskip("torchaudio.functional")
    v = 7
    logits, targets = _random_case(3, 9, 4, v, 0, seed=11)
    logits = logits.float()
    frames, lengths = torch.tensor([9, 6, 3]), torch.tensor([4, 2, 3])
    ours = logits.clone().requires_grad_(True)
    (-tdt.rnnt_log_likelihood(ours, targets, frames, lengths, blank=v)).sum().backward()
    theirs = logits.clone().requires_grad_(True)
    functional.rnnt_loss(theirs, targets.int(), frames.int(), lengths.int(), blank=v, reduction="sum").backward()
    valid = torch.zeros_like(logits, dtype=torch.bool)
    for i in range(3):
        valid[i, : frames[i], : lengths[i] + 1] = True  # torchaudio leaves garbage outside the lattice
    assert torch.allclose(ours.grad[valid], theirs.grad[valid], atol=1e-5)
    assert torch.all(ours.grad[~valid] == 0)


def test_tdt_gradient_finite_differences():
    durations = (0, 1, 2)
    v = 3
    logits, targets = _random_case(2, 4, 2, v, len(durations), seed=5)
    frames, lengths = torch.tensor([4, 3]), torch.tensor([2, 1])
    logits.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: tdt.tdt_loss(x, targets, frames, lengths, durations, blank=v, sigma=0.05), (logits,)
    )


def test_tdt_batch_rows_are_independent():
    """Padding (frames, labels) past a row's lengths does not change its loss."""
    durations, v = (0, 1, 2, 3, 4), 6
    logits, targets = _random_case(2, 10, 5, v, 5, seed=9)
    frames, lengths = torch.tensor([10, 6]), torch.tensor([5, 3])
    both = tdt.tdt_loss(logits, targets, frames, lengths, durations, blank=v)
    alone = tdt.tdt_loss(logits[1:, :6, :4], targets[1:, :3], frames[1:], lengths[1:], durations, blank=v)
    assert torch.allclose(both[1], alone[0], atol=1e-9)


def test_omega_uses_the_given_rng():
    durations, v = (0, 1, 2), 4
    logits, targets = _random_case(1, 4, 2, v, 3, seed=1)
    frames, lengths = torch.tensor([4]), torch.tensor([2])
    tdt_value = tdt.tdt_loss(logits, targets, frames, lengths, durations, blank=v)
    rnnt_value = -tdt.rnnt_log_likelihood(logits[..., : v + 1], targets, frames, lengths, blank=v)
    seen = {
        round(
            tdt.tdt_loss(logits, targets, frames, lengths, durations, blank=v, omega=0.5, rng=random.Random(s)).item(),
            9,
        )
        for s in range(20)
    }
    assert seen == {round(tdt_value.item(), 9), round(rnnt_value.item(), 9)}
