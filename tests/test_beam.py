"""The batched beam search (model/beam.py) against NeMo 3.0's malsd_batch (fixtures/nemo-beam).

Every expected number is NeMo's: the best hypothesis (token ids, frames, durations) and its raw score, the whole
n-best list in NeMo's order, for TDT and RNN-T, beams 1, 2, 4 and 8, one clip at a time and the batch of 8, without
and with a token-level ARPA LM (weight 0.5) fused as NeMo fuses its NGPU-LM. The LM here is a test-only fusion
model over lm.arpa (host dicts, the fixture test's reader); the search sees only its `start` / `advance`.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from conftest import FIXTURES
from test_cli import in_process
from test_nemo_beam_fixture import GRAMS, _lm_logp

from graphscribe.api import load_model
from graphscribe.model.beam import BeamBuffers, BeamDecoder, Fusion, beam_step

FOLDER = FIXTURES / "nemo-beam"
ROOT = FIXTURES.parent.parent
REFERENCE = json.loads((FOLDER / "reference.json").read_text())
MODELS = list(REFERENCE["models"])
CLIPS = list(REFERENCE["clips"])
BATCH = REFERENCE["batch"]
ALPHA = REFERENCE["lm_weight"]
OFFSET = REFERENCE["token_offset"]
LM_CASES = {  # fixture key suffix -> (pruning, blank mode)
    f"lm{ALPHA}-late-lm_weighted_full": ("late", "lm_weighted_full"),
    f"lm{ALPHA}-early-no_score": ("early", "no_score"),
}
# (beam, LM case) of every malsd_batch run in the fixture (the same for both models)
RUNS = sorted(
    {
        (run["beam"], key.split("/")[2])
        for key, run in REFERENCE["models"][MODELS[0]]["runs"].items()
        if key.startswith("malsd_batch/")
    }
)
RTOL = 1e-5  # scores: float32 rounding of our encoder output against NeMo's (the batch's: ~1e-6)
ATOL = 5e-4  # the README's gap between NeMo's own batch and one-clip scores


class ArpaFusion:
    """lm.arpa as a fusion model, resolved as NeMo's NGPU-LM resolves it (the fixture test's `_lm_logp`).

    A state is the id of a history: the longest suffix of the tokens so far that is an n-gram of the file (the
    start: <s>; a token the LM does not know leads to the empty history). Host dicts: a test's stand-in for the
    GPU tables of model/ngram.py, with the same interface."""

    def __init__(self, grams: dict, vocab: int):
        self.grams, self.vocab = grams, vocab
        self.order = max(len(w) for w in grams)
        seen = {ord(w) - OFFSET for (w, *rest) in grams if not rest and len(w) == 1}
        self.unseen = vocab - len(seen)
        self.histories: list[tuple[str, ...]] = [("<s>",)]
        self.ids = {("<s>",): 0}
        self.rows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.calls = 0

    def _id(self, history: tuple[str, ...]) -> int:
        while history and history not in self.grams:
            history = history[1:]
        if history not in self.ids:
            self.ids[history] = len(self.histories)
            self.histories.append(history)
        return self.ids[history]

    def _row(self, state: int) -> tuple[torch.Tensor, torch.Tensor]:
        if state not in self.rows:
            history = self.histories[state]
            words = [chr(i + OFFSET) for i in range(self.vocab)]
            scores = [_lm_logp(self.grams, history, w, self.unseen) for w in words]
            after = [self._id((*history, w)[-(self.order - 1) :]) for w in words]
            self.rows[state] = (torch.tensor(scores, dtype=torch.float32), torch.tensor(after, dtype=torch.long))
        return self.rows[state]

    def start(self, batch_size: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch_size, dtype=torch.long, device=device)

    def advance(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        rows = [self._row(s) for s in states.tolist()]
        return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


@pytest.fixture(scope="module", params=MODELS)
def case(request):
    """(name, spec, model, encoder outputs: {clip: (encoded, lengths)} one at a time, and the batch's)."""
    name = request.param
    spec = REFERENCE["models"][name]
    model = load_model(ROOT / spec["checkpoint"], device="cpu", graphs=False)
    audios = {c: model.read(ROOT / REFERENCE["clips"][c]["file"]) for c in CLIPS}
    single = {c: model.encode([audios[c]]) for c in CLIPS}
    batch = model.encode([audios[c] for c in BATCH])
    for c in CLIPS:
        assert int(single[c][1][0]) == spec["encoder_frames"][c], c
    return name, spec, model, single, batch


def _decoder(model, beam: int, lm: str, nbest: bool = True) -> BeamDecoder:
    fusion = None
    if lm != "nolm":
        pruning, blank = LM_CASES[lm]
        fusion = Fusion([(ArpaFusion(GRAMS, model.cfg.blank_id), ALPHA)], pruning, blank)
    module = model.module
    return BeamDecoder(module.decoder, module.joint, model.cfg.decoding, beam, fusion, nbest)


def _check(hyp, nbest: list[dict], tdt: bool, what: str) -> None:
    """Our hypothesis and n-best list against NeMo's: ids, frames, durations equal, scores to float32 rounding."""
    best = nbest[0]
    assert hyp.token_ids == best["token_ids"], what
    assert hyp.frames == best["timestamps"], what
    if tdt:
        assert hyp.durations == best["durations"], what
    np.testing.assert_allclose(hyp.score, best["score"], rtol=RTOL, atol=ATOL, err_msg=what)
    assert [a.token_ids for a in hyp.alternatives] == [h["token_ids"] for h in nbest], what
    assert [a.frames for a in hyp.alternatives] == [h["timestamps"] for h in nbest], what
    ours, theirs = [a.score for a in hyp.alternatives], [h["score"] for h in nbest]
    np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.mark.parametrize("beam,lm", RUNS)
def test_one_clip_at_a_time_is_nemo(case, beam, lm):
    name, spec, model, single, _ = case
    key = f"malsd_batch/beam{beam}/{lm}"
    run = spec["runs"][key]
    decoder = _decoder(model, beam, lm)
    for clip in CLIPS:
        [hyp] = decoder.decode(*single[clip])
        _check(hyp, run["single"][clip], spec["model_type"] == "tdt", f"{name} {key} {clip}")


@pytest.mark.parametrize("beam,lm", RUNS)
def test_batch_of_8_is_nemo(case, beam, lm):
    name, spec, model, _, batch = case
    key = f"malsd_batch/beam{beam}/{lm}"
    run = spec["runs"][key]
    hyps = _decoder(model, beam, lm).decode(*batch)
    assert len(hyps) == len(BATCH)
    for clip, hyp in zip(BATCH, hyps):
        nbest = run.get("batch", {}).get(clip, run["single"][clip])
        _check(hyp, nbest, spec["model_type"] == "tdt", f"{name} {key} batch {clip}")


def test_best_alone_without_nbest(case):
    """nbest=False: the same best hypothesis, no list."""
    name, spec, model, _, batch = case
    run = spec["runs"]["malsd_batch/beam4/nolm"]
    for clip, hyp in zip(BATCH, _decoder(model, 4, "nolm", nbest=False).decode(*batch)):
        nbest = run.get("batch", {}).get(clip, run["single"][clip])
        assert hyp.token_ids == nbest[0]["token_ids"] and hyp.alternatives == [], clip
        np.testing.assert_allclose(hyp.score, nbest[0]["score"], rtol=RTOL, atol=ATOL)


def test_beam_1_is_greedy(case):
    """Beam 1 decodes as greedy does (the model's greedy decoder on the same encoder output), except where NeMo's
    malsd and greedy part at max_symbols on TDT (the README: a forced blank moves by its top candidate's duration);
    and a model loaded with beam_size 1 has no beam search: it decodes greedily."""
    name, spec, model, single, _ = case
    assert model.options.beam_size == 1 and model.beam is None
    decoder = _decoder(model, 1, "nolm")
    parted = []
    for clip in CLIPS:
        [beam] = decoder.decode(*single[clip])
        [greedy] = model.decode(*single[clip])
        assert greedy.token_ids == spec["greedy"]["single"][clip]["token_ids"], clip
        if (beam.token_ids, beam.frames) != (greedy.token_ids, greedy.frames):
            parted.append(clip)
        elif spec["model_type"] == "tdt":
            assert beam.durations == greedy.durations, clip
    assert parted == ([] if spec["model_type"] == "rnnt" else ["long_mix"])


def test_the_lm_is_asked_once_a_step(case):
    """The fusion model's advance: once at the start and once per step, on all N x K hypotheses at once."""
    name, spec, model, single, _ = case
    decoder = _decoder(model, 4, f"lm{ALPHA}-late-lm_weighted_full")
    fusion = decoder.fusion.models[0][0]
    decoder.decode(*single["noise_3s"])
    assert fusion.calls == decoder.steps + 1


def test_load_model_with_a_beam(case):
    """load_model(..., beam_size=4, nbest=True) transcribes with the beam: NeMo's best text and its n-best."""
    name, spec, _, _, _ = case
    model = load_model(ROOT / spec["checkpoint"], device="cpu", graphs=False, beam_size=4, nbest=True)
    clip = "espeak_fox"
    [transcript] = model.transcribe([ROOT / REFERENCE["clips"][clip]["file"]])
    nbest = spec["runs"]["malsd_batch/beam4/nolm"]["single"][clip]
    assert transcript.token_ids == nbest[0]["token_ids"]
    assert transcript.text == model.tokenizer.decode(nbest[0]["token_ids"])
    assert [a.token_ids for a in transcript.alternatives] == [h["token_ids"] for h in nbest]
    assert [round(a.score, 3) for a in transcript.alternatives] == pytest.approx([h["score"] for h in nbest], abs=1e-3)


def test_cli_beam_4_prints_nemo_best_text(capsys):
    spec = REFERENCE["models"]["tdt-tiny"]
    clip = ROOT / REFERENCE["clips"]["librispeech_2086-149220-0033"]["file"]
    nbest = spec["runs"]["malsd_batch/beam4/nolm"]["single"]["librispeech_2086-149220-0033"]
    model = load_model(ROOT / spec["checkpoint"], device="cpu", graphs=False)
    greedy = spec["greedy"]["single"]["librispeech_2086-149220-0033"]["token_ids"]
    assert nbest[0]["token_ids"] != greedy  # the beam changes this clip's text
    checkpoint = str(ROOT / spec["checkpoint"])
    result = in_process(capsys, clip, "--beam", "4", "--device", "cpu", model=checkpoint)
    assert result.returncode == 0, result.stderr
    assert result.stdout == model.tokenizer.decode(nbest[0]["token_ids"]) + "\n"
    result = in_process(capsys, clip, "--beam", "4", "--nbest", "-f", "json", "--device", "cpu", model=checkpoint)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert [t["id"] for t in record["tokens"]] == nbest[0]["token_ids"]
    assert [a["token_ids"] for a in record["alternatives"]] == [h["token_ids"] for h in nbest]
    assert [a["score"] for a in record["alternatives"]] == pytest.approx([h["score"] for h in nbest], abs=1e-3)
    assert record["alternatives"][0]["text"] == record["text"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--nbest", "-f", "json"], "--nbest lists a beam's hypotheses"),
        (["--beam", "4", "--nbest"], "--nbest lists the alternatives in JSON output"),
        (["--beam", "4", "--stream"], "--beam decodes files"),
    ],
)
def test_cli_beam_usage_errors(capsys, args, message):
    clip = ROOT / REFERENCE["clips"]["short_2s"]["file"]
    result = in_process(capsys, clip, *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_scores_are_finite_and_sorted_by_normalised_score(case):
    """Every n-best entry is live (no -inf slot) and the list is in NeMo's order: score / (tokens + 1)."""
    name, spec, model, _, batch = case
    for hyp in _decoder(model, 8, "nolm").decode(*batch):
        norm = [a.score / (len(a.token_ids) + 1) for a in hyp.alternatives]
        assert all(math.isfinite(a.score) for a in hyp.alternatives)
        assert norm == sorted(norm, reverse=True)


def test_render_workers_keep_the_alternatives(case):
    """The n-best crosses to the render worker processes as plain values: their JSON is the in-process JSON."""
    from graphscribe.output.rendering import RenderPool
    from graphscribe.output.writers import WRITERS

    name, spec, model, single, _ = case
    [hyp] = _decoder(model, 4, "nolm").decode(*single["short_2s"])
    expected = WRITERS["json"](model.make_transcript("x.wav", 32000, hyp, 0.0))
    assert len(json.loads(expected)["alternatives"]) == len(
        spec["runs"]["malsd_batch/beam4/nolm"]["single"]["short_2s"]
    )
    pool = RenderPool(model.transcript_maker, ("json",))
    try:
        [light] = pool.transcripts(["x.wav"], [32000], [hyp])
    finally:
        pool.close()
    assert light.rendered["json"] == expected


class TableFusion:
    """A fusion model all on the device: (S, V) tables of scores and next states, indexed by state."""

    def __init__(self, scores: torch.Tensor, after: torch.Tensor):
        self.scores, self.after = scores, after

    def start(self, batch_size: int, device: torch.device) -> torch.Tensor:
        return torch.zeros(batch_size, dtype=torch.long, device=device)

    def advance(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.scores[states], self.after[states]


def _tensors(buf) -> dict[str, int]:
    """Where each of the buffers' tensors lives."""
    found = {}
    for key, value in vars(buf).items():
        for i, t in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(t, torch.Tensor):
                found[f"{key}{i}"] = t.data_ptr()
    return found


@pytest.mark.parametrize("name", MODELS)
def test_step_reads_nothing_back_and_writes_in_place(name):
    """What a CUDA graph capture of `beam_step` needs: on the meta device (no values: any host read fails) the step
    runs, with a fusion model; on the CPU its buffers are the same tensors after steps as before."""
    spec = REFERENCE["models"][name]
    model = load_model(ROOT / spec["checkpoint"], device="cpu", graphs=False)
    durations, vocab = model.cfg.decoding.durations, model.cfg.blank_id
    for device in (torch.device("meta"), torch.device("cpu")):
        prediction = copy.deepcopy(model.module.decoder).to(device)
        joint = copy.deepcopy(model.module.joint).to(device)
        scores = -torch.rand(3, vocab, generator=torch.Generator().manual_seed(0)).to(device)
        after = torch.randint(0, 3, (3, vocab), generator=torch.Generator().manual_seed(1)).to(device)
        fusion = Fusion([(TableFusion(scores, after), ALPHA)])
        buf = BeamBuffers(2, 4, 16, 32, joint, prediction, durations, fusion, device, torch.float32)
        rows, layers, hidden = 8, prediction.cfg.layers, prediction.cfg.hidden
        zeros = torch.zeros(layers, rows, hidden, device=device)
        buf.load(torch.randn(2, 16, joint.cfg.hidden).to(device), torch.tensor([16, 9]).to(device))
        buf.restart(zeros, zeros, torch.zeros(rows, joint.cfg.hidden, device=device))
        before = _tensors(buf)
        with torch.inference_mode():
            for _ in range(5):
                beam_step(buf, prediction, joint, vocab, model.cfg.decoding.max_symbols)
        if device.type == "cpu":
            assert _tensors(buf) == before
            assert torch.isfinite(buf.scores[:, 0]).all() and (buf.pos == 5).all()


def test_history_grows_between_rounds(case):
    """Buffers with room for 8 steps of history: grown as the steps come, the same hypotheses."""
    name, spec, model, single, _ = case
    clip = "long_mix"
    decoder = _decoder(model, 4, "nolm")
    encoded, lengths = single[clip]
    module = model.module
    decoder._buffers[1] = BeamBuffers(
        1,
        4,
        encoded.shape[1],
        8,
        module.joint,
        module.decoder,
        model.cfg.decoding.durations,
        None,
        "cpu",
        torch.float32,
    )
    [hyp] = decoder.decode(encoded, lengths)
    assert decoder._buffers[1].capacity >= decoder.steps > 8
    _check(hyp, spec["runs"]["malsd_batch/beam4/nolm"]["single"][clip], spec["model_type"] == "tdt", clip)


def test_load_model_with_a_beam_and_the_ngram_lm(case):
    """`--beam 4 --lm lm.arpa --lm-weight 0.5` through the options: the n-gram model of `model/ngram.py` (the GPU
    tables, not this file's host reader) fused into the beam gives NeMo's malsd_batch + NGPU-LM best hypotheses,
    the batch of 8 at once."""
    name, spec, _, _, _ = case
    lm = FOLDER / "lm.arpa"
    model = load_model(ROOT / spec["checkpoint"], device="cpu", graphs=False, beam_size=4, lm=str(lm), lm_weight=ALPHA)
    got = model.transcribe([ROOT / REFERENCE["clips"][c]["file"] for c in BATCH], batch_size=len(BATCH))
    run = spec["runs"]["malsd_batch/beam4/lm0.5-late-lm_weighted_full"]["single"]
    assert [t.token_ids for t in got] == [run[c][0]["token_ids"] for c in BATCH]


def test_rows_of_a_batch_each_decoded_with_their_own_beam(case):
    """`LoadedModel.decode(beams=...)` (a server's batch of requests with their own beam sizes): the batch of 8 is
    encoded once, each row decoded greedily or by the beam search of its size, in the batch's order: NeMo's best
    hypothesis of that row with that beam (its greedy tokens for 1). A size's search is made once and kept."""
    name, spec, model, _, batch = case
    beams = [4, 1, 2, 8, 1, 4, 2, 1]
    hyps = model.decode(*batch, beams=beams)
    for clip, beam, hyp in zip(BATCH, beams, hyps):
        if beam == 1:
            assert hyp.token_ids == spec["greedy"]["single"][clip]["token_ids"], clip
        else:
            run = spec["runs"][f"malsd_batch/beam{beam}/nolm"]
            assert hyp.token_ids == run.get("batch", {}).get(clip, run["single"][clip])[0]["token_ids"], (clip, beam)
    assert model.beam_decoder(4) is model.beam_decoder(4) and model.beam is None
