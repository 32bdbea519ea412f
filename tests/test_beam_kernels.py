"""The beam search's fused candidates kernel (model/beam_kernels.py) through Triton's interpreter (conftest sets
TRITON_INTERPRET): PyTorch's log-softmax and top-K of the same logits, and inside the search NeMo's n-best lists
(fixtures/nemo-beam). On CUDA it runs compiled for 16-bit logits (tests/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from test_beam import CLIPS, MODELS, REFERENCE, ROOT, _check, _decoder

import graphscribe.model.beam as beam
from graphscribe.api import load_model

kernels = pytest.importorskip("graphscribe.model.beam_kernels")


@pytest.mark.parametrize("durations", [5, 0])
def test_candidates_are_pytorchs_log_softmax_and_top_k(durations):
    """Distinct logits (so that the top K has one order) in bfloat16, with and without durations."""
    vocab, rows, k = 37, 6, 4
    gen = torch.Generator().manual_seed(0)
    logits = (
        torch.stack([torch.randperm(vocab + durations, generator=gen) for _ in range(rows)]) / 8
    )  # exact in 16 bits
    logits = logits.to(torch.bfloat16)
    top, tokens, blank, dur = kernels.candidates(logits, vocab, k)
    lp = torch.log_softmax(logits[:, :vocab], dim=-1, dtype=torch.float32)
    values, ids = lp.topk(k, dim=-1)
    assert torch.equal(tokens, ids)
    torch.testing.assert_close(top, values, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(blank, lp[:, -1], rtol=1e-6, atol=1e-6)
    assert dur.shape == (rows, durations)
    if durations:
        torch.testing.assert_close(dur, torch.log_softmax(logits[:, vocab:].float(), dim=-1), rtol=1e-6, atol=1e-6)


def test_equal_logits_put_the_lower_token_first():
    logits = torch.zeros(2, 9, dtype=torch.bfloat16)
    logits[:, [6, 3]] = 1.0
    assert kernels.candidates(logits, 9, 3)[1].tolist() == [[3, 6, 0]] * 2


@pytest.mark.parametrize("name", MODELS)
def test_the_search_with_the_kernel_gives_nemos_n_best(monkeypatch, name):
    """Beam 4 on one clip with the kernel in every step (float32 here, the compiled kernel's 16 bits on CUDA): NeMo's
    best hypothesis and n-best list. Fails when the kernel's values or tokens are not the candidates'."""
    spec = REFERENCE["models"][name]
    model = load_model(ROOT / spec["checkpoint"], device="cpu", graphs=False)
    used = []
    monkeypatch.setattr(beam, "_kernels_for", lambda logits: used.append(1) or kernels)
    clip = "short_2s"
    assert clip in CLIPS
    encoded, lengths = model.encode([model.read(ROOT / REFERENCE["clips"][clip]["file"])])
    [hyp] = _decoder(model, 4, "nolm").decode(encoded, lengths)
    assert used
    nbest = spec["runs"]["malsd_batch/beam4/nolm"]["single"][clip]
    _check(hyp, nbest, spec["model_type"] == "tdt", f"{name} {clip}")
