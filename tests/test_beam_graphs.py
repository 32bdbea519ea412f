"""The beam search's steps replayed from captured graphs (model/beam.py `BeamDecoder` with graphs) on the CPU: a
stand-in for the CUDA graph re-runs what the capture recorded, so the bookkeeping around it is what is tested here
(buffers of the batch's size class with spare rows, warm-up steps undone before the capture, one graph per class,
a recapture when the history grows). Every result must be the eager search's, bit for bit, and NeMo's best
hypotheses (fixtures/nemo-beam). The real captures are tested on the GPU (test_gpu.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from test_beam import ALPHA, BATCH, CLIPS, LM_CASES, MODELS, REFERENCE, ROOT, _check, _decoder

import graphscribe.model.graphs as graphs
from graphscribe.api import load_model
from graphscribe.model.beam import STEPS_PER_CHECK, BeamBuffers, BeamDecoder
from graphscribe.model.decoding import size_class

LM = f"lm{ALPHA}-late-lm_weighted_full"
assert LM in LM_CASES


class _Replayed:
    """Stands in for torch.cuda.CUDAGraph: replay() runs again what the capture recorded."""

    def __init__(self):
        self.record = None
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.record()

    def pool(self):
        return None


class _Stream:
    def wait_stream(self, other):
        pass


def _replay_on_the_cpu(monkeypatch) -> None:
    """`CapturedSteps` on the CPU (its warm-up, its capture recorded by `_Replayed`) for a decoder with graphs."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Replayed)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *args: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    monkeypatch.setattr(graphs, "capture", lambda graph, record, pool: setattr(graph, "record", record))
    monkeypatch.setattr(BeamDecoder, "_replayed", lambda self, device: self.graphs)


@pytest.fixture(scope="module", params=MODELS)
def case(request):
    """(name, spec, model, {clip: (B=1 encoder output, lengths)}): the model's encoder, one clip at a time."""
    name = request.param
    spec = REFERENCE["models"][name]
    model = load_model(ROOT / spec["checkpoint"], device="cpu", graphs=False)
    encoded = {c: model.encode([model.read(ROOT / REFERENCE["clips"][c]["file"])]) for c in CLIPS}
    return name, spec, model, encoded


def _batch(encoded: dict, clips: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The clips' encoder outputs padded into one batch: (B, T, D), (B,)."""
    frames = max(encoded[c][0].shape[1] for c in clips)
    out = torch.zeros(len(clips), frames, encoded[clips[0]][0].shape[2])
    for i, c in enumerate(clips):
        out[i, : encoded[c][0].shape[1]] = encoded[c][0][0]
    return out, torch.cat([encoded[c][1] for c in clips])


def _captured(model, lm: str) -> BeamDecoder:
    decoder = _decoder(model, 4, lm)
    decoder.graphs = True
    return decoder


# the fixture's 8 fill class 8; then its 5 short clips leave 3 spare rows there (which held long clips), and 3
# clips one in class 4
BATCHES = [BATCH, [c for c in BATCH if not c.startswith("long")], BATCH[:3]]


@pytest.mark.parametrize("lm", ["nolm", LM])
def test_replayed_steps_give_the_eager_bits_and_nemos_best(case, monkeypatch, lm):
    name, spec, model, encoded = case
    _replay_on_the_cpu(monkeypatch)
    eager, captured = _decoder(model, 4, lm), _captured(model, lm)
    run = spec["runs"][f"malsd_batch/beam4/{lm}"]["single"]
    for clips in BATCHES:
        batch = _batch(encoded, clips)
        expected = eager.decode(*batch)
        got = captured.decode(*batch)
        assert got == expected, (name, lm, clips)  # ids, frames, durations, scores, the n-best: every bit
        assert captured.steps == eager.steps  # the spare rows finished from the start
        graph = captured._captured[size_class(len(clips))].graph
        assert graph.replays == captured.steps // STEPS_PER_CHECK > 0  # every round replayed
        graph.replays = 0
        for clip, hyp in zip(clips, got):
            _check(hyp, run[clip], spec["model_type"] == "tdt", f"{name} {lm} {clip}")
    assert sorted(captured._captured) == [4, 8]  # one graph a class, kept across batches
    assert sorted(captured._buffers) == [4, 8] and sorted(eager._buffers) == [3, 5, 8]


def test_history_regrown_mid_decode_is_captured_again(case, monkeypatch):
    """Buffers with room for one round of history: each growth captures the steps again, on the new tensors."""
    name, spec, model, encoded = case
    _replay_on_the_cpu(monkeypatch)
    clips = BATCH[:3]
    batch = _batch(encoded, clips)
    expected = _decoder(model, 4, "nolm").decode(*batch)
    decoder = _captured(model, "nolm")
    module = model.module
    durations = model.cfg.decoding.durations
    buf = BeamBuffers(
        4, 4, batch[0].shape[1], STEPS_PER_CHECK, module.joint, module.decoder, durations, None, "cpu", torch.float32
    )
    decoder._buffers[4] = buf
    assert decoder.decode(*batch) == expected
    assert buf.capacity >= decoder.steps > 2 * STEPS_PER_CHECK
    graph = decoder._captured[4].graph
    assert 0 < graph.replays < decoder.steps // STEPS_PER_CHECK  # the last capture replayed only the last rounds


def test_capture_failure_decodes_eagerly(case, monkeypatch, caplog):
    """A capture that fails leaves the search eager, with a warning, and the same result."""
    name, spec, model, encoded = case
    _replay_on_the_cpu(monkeypatch)

    def refused(graph, record, pool):
        raise RuntimeError("capture refused for the test")

    monkeypatch.setattr(graphs, "capture", refused)
    batch = _batch(encoded, BATCH[:3])
    expected = _decoder(model, 4, "nolm").decode(*batch)
    decoder = _captured(model, "nolm")
    with caplog.at_level("WARNING", logger="graphscribe"):
        assert decoder.decode(*batch) == expected
    assert decoder.graphs is False and not decoder._captured
    assert sum("capture failed" in r.message for r in caplog.records) == 1


def test_load_model_passes_graphs_to_the_beam():
    """The options' graphs reach the beam search (CUDA only: off on the CPU), and `use_graphs` makes a fresh one
    (fresh captures) with the same beam and fusion."""
    spec = REFERENCE["models"]["tdt-tiny"]
    model = load_model(ROOT / spec["checkpoint"], device="cpu", beam_size=4)
    before = model.beam
    assert before is not None and before.graphs is False
    model.use_graphs(True)
    assert model.beam is not before and model.beam.graphs is False  # the CPU: off still
    assert (model.beam.beam_size, model.beam.fusion) == (4, before.fusion)


def test_rounds_queue_the_steps_no_hypothesis_can_skip(case):
    """A round queues as many steps as the furthest-behind input's frames to go allow at the least (a step moves a
    hypothesis at most the longest duration on), so a long clip takes a few host reads, not one per 8 steps; the
    pipeline's `queued` is called once, after the first round."""
    name, spec, model, encoded = case
    calls = []
    decoder = _decoder(model, 4, "nolm")
    [hyp] = decoder.decode(*encoded["long_mix"], queued=lambda: calls.append(decoder.host_reads))
    assert calls == [0]
    assert decoder.host_reads < decoder.steps // STEPS_PER_CHECK / 4
    _check(hyp, spec["runs"]["malsd_batch/beam4/nolm"]["single"]["long_mix"], spec["model_type"] == "tdt", name)
