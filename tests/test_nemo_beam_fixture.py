"""The beam search and LM fusion oracle (fixtures/nemo-beam) is whole and self-consistent.

Every number in the fixture is NeMo 3.0.0's (scripts/fixtures/make_nemo_beam_fixtures.py; its README says what
NeMo computes). These tests need no NeMo: every model, strategy, beam, LM case and clip is there; the n-best lists
are ordered as NeMo orders them; beam 1 is greedy where it must be; the greedy runs agree with the other NeMo
fixtures; a tiny ARPA reader here reproduces NeMo's LM scores from lm.arpa; and the first recorded beam step is
recomputed from the joint's logits, so the README's formulas are checked against NeMo's own numbers.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import FIXTURES

FOLDER = FIXTURES / "nemo-beam"
ROOT = FIXTURES.parent.parent
REFERENCE = json.loads((FOLDER / "reference.json").read_text())
MODELS = list(REFERENCE["models"])
CLIPS = list(REFERENCE["clips"])
BEAMS = REFERENCE["beams"]
ALPHA = REFERENCE["lm_weight"]
OFFSET = REFERENCE["token_offset"]  # token id i is the ARPA word chr(i + 100)
LM_KEY = f"lm{ALPHA}-late-lm_weighted_full"
EPS = 1e-2  # NeMo's clamp of p(blank) in lm_weighted_full: log(1 - min(p_blank, 1 - EPS))


def _expected_runs(model_type: str) -> set[str]:
    runs = {f"malsd_batch/beam{b}/{lm}" for b in BEAMS for lm in ("nolm", LM_KEY)}
    runs.add(f"malsd_batch/beam4/lm{ALPHA}-early-no_score")
    if model_type == "rnnt":
        runs |= {f"maes_batch/beam{b}/nolm" for b in REFERENCE["maes_beams"]} | {f"maes_batch/beam4/{LM_KEY}"}
    return runs


RUNS = [(m, k) for m in MODELS for k in sorted(REFERENCE["models"][m]["runs"])]


def _normalised(h: dict) -> float:
    return h["score"] / (len(h["token_ids"]) + 1)  # NeMo's score_norm: sort by score / (non-blank tokens + 1)


def test_folder_is_small_and_whole():
    assert sum(p.stat().st_size for p in FOLDER.rglob("*") if p.is_file()) < 2_000_000
    assert set(MODELS) == {"tdt-tiny", "rnnt-tiny"}
    assert len(CLIPS) == 9 and len(REFERENCE["batch"]) == 8 and set(REFERENCE["batch"]) <= set(CLIPS)
    assert all((ROOT / c["file"]).is_file() for c in REFERENCE["clips"].values())
    for name, spec in REFERENCE["models"].items():
        assert (ROOT / spec["checkpoint"]).is_file()
        assert set(spec["runs"]) == _expected_runs(spec["model_type"]), name
        assert set(spec["greedy"]["single"]) == set(CLIPS) and set(spec["greedy"]["batch"]) == set(REFERENCE["batch"])
        for key, run in spec["runs"].items():
            assert set(run["single"]) == set(CLIPS), key
            assert set(run["batch_vs_single"]) == set(REFERENCE["batch"]), key


@pytest.mark.parametrize("name", MODELS)
def test_encoder_frames(name):
    spec = REFERENCE["models"][name]
    for clip, frames in spec["encoder_frames"].items():
        n = REFERENCE["clips"][clip]["samples"] // 160  # feature frames
        for _ in range(3):  # dw_striding x8: three stride-2 convs
            n = (n + 2 - 3) // 2 + 1
        assert frames == n, clip


@pytest.mark.parametrize("name,key", RUNS)
def test_nbest_lists(name, key):
    spec = REFERENCE["models"][name]
    run = spec["runs"][key]
    tdt = spec["model_type"] == "tdt"
    for clip, nbest in run["single"].items():
        frames = spec["encoder_frames"][clip]
        assert 1 <= len(nbest) <= run["beam"], clip
        # best first; the order is the normalised score's (the raw score is what NeMo reports)
        norm = [_normalised(h) for h in nbest]
        assert norm == sorted(norm, reverse=True), clip
        for h in nbest:
            ids, ts = h["token_ids"], h["timestamps"]
            assert math.isfinite(h["score"]) and h["score"] <= 0
            assert len(ts) == len(ids) and all(0 <= i < spec["blank_id"] for i in ids)
            assert ts == sorted(ts) and all(0 <= t < frames for t in ts), clip
            if tdt:
                assert len(h["durations"]) == len(ids) and all(d in spec["durations"] for d in h["durations"])
        # recombination keeps one copy of a label sequence in the n-best
        seqs = [tuple(h["token_ids"]) for h in nbest]
        if run["strategy"] == "malsd_batch" and not tdt:
            assert len(set(seqs)) == len(seqs), clip


@pytest.mark.parametrize("name,key", RUNS)
def test_batch_of_8_matches_one_at_a_time(name, key):
    run = REFERENCE["models"][name]["runs"][key]
    for clip, cmp in run["batch_vs_single"].items():
        assert cmp["best_ids"] and cmp["nbest_ids"], clip
        # the batch's encoder output differs from the one-clip pass by float32 rounding (~1e-6), the scores by < 5e-4
        assert cmp["max_score_gap"] < 5e-4, clip


@pytest.mark.parametrize("name", MODELS)
def test_greedy_agrees_with_the_other_nemo_fixtures(name):
    greedy = REFERENCE["models"][name]["greedy"]
    stream = json.loads((FIXTURES / "nemo-stream" / "reference.json").read_text())["models"][name]["offline"]
    for clip in CLIPS:
        assert greedy["single"][clip]["token_ids"] == stream[clip]["token_ids"], clip
        assert greedy["single"][clip]["timestamps"] == stream[clip]["timestamps"], clip
    for clip in REFERENCE["batch"]:
        assert greedy["batch"][clip]["token_ids"] == greedy["single"][clip]["token_ids"], clip


def _capped_frames(ids: list[int], ts: list[int], max_symbols: int) -> list[int]:
    return sorted({t for t in ts if ts.count(t) >= max_symbols})


@pytest.mark.parametrize("name", MODELS)
def test_beam_1_is_greedy(name):
    """RNN-T: always. TDT: up to the first frame where greedy hits max_symbols and malsd's forced blank then
    jumps by the top candidate's duration instead of greedy's one frame (see the README)."""
    spec = REFERENCE["models"][name]
    for key in ("malsd_batch/beam1/nolm",):
        for clip in CLIPS:
            g = spec["greedy"]["single"][clip]
            b = spec["runs"][key]["single"][clip][0]
            if spec["model_type"] == "rnnt" or b["token_ids"] == g["token_ids"]:
                assert (b["token_ids"], b["timestamps"]) == (g["token_ids"], g["timestamps"]), clip
                continue
            capped = _capped_frames(g["token_ids"], g["timestamps"], spec["max_symbols"])
            assert capped, clip
            upto = sum(1 for t in g["timestamps"] if t <= capped[0])
            assert b["token_ids"][:upto] == g["token_ids"][:upto] and b["timestamps"][:upto] == g["timestamps"][:upto]
    # and a wider beam or the LM does change the result somewhere: the fixture exercises both
    for key in ("malsd_batch/beam4/nolm", f"malsd_batch/beam4/{LM_KEY}"):
        runs = spec["runs"][key]["single"]
        assert any(runs[c][0]["token_ids"] != spec["greedy"]["single"][c]["token_ids"] for c in CLIPS), key


# ----------------------------------------------------------------------------- the ARPA file, read here


def read_arpa(path) -> dict[tuple[str, ...], tuple[float, float]]:
    """A tiny ARPA reader: {words: (log10 p, log10 back-off)}. Lines are split on '\\n' and fields on '\\t' and
    ' ' only: str.split() and splitlines() would cut the words chr(133) and chr(160) (tokens 33 and 60)."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    assert lines[0] == "\\data\\" and text.endswith("\\end\\\n")
    counts, i = {}, 1
    while lines[i].startswith("ngram "):
        order, n = lines[i][len("ngram ") :].split("=")
        counts[int(order)] = int(n)
        i += 1
    grams: dict[tuple[str, ...], tuple[float, float]] = {}
    order = 0
    for line in lines[i:]:
        if not line or line == "\\end\\":
            continue
        if line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1:-7])
            continue
        fields = line.split("\t")
        assert len(fields) in (2, 3), line
        words = tuple(fields[1].split(" "))
        assert len(words) == order and all(len(w) == 1 or w in ("<s>", "</s>", "<unk>") for w in words), line
        assert len(fields) == 2 or order < max(counts), line
        grams[words] = (float(fields[0]), float(fields[2]) if len(fields) == 3 else 0.0)
    for k, n in counts.items():
        assert sum(len(w) == k for w in grams) == n, k
    return grams


GRAMS = read_arpa(FOLDER / "lm.arpa")
LN10 = math.log(10)


def _lm_logp(grams, history: tuple[str, ...], word: str, n_unseen: int) -> float:
    """Natural-log back-off probability, as NeMo's NGPU-LM resolves it (normalize_unk on)."""
    if (*history, word) in grams:
        return grams[(*history, word)][0] * LN10
    if not history:
        return grams[("<unk>",)][0] * LN10 - (math.log(n_unseen) if n_unseen > 1 else 0.0)
    return grams.get(history, (0.0, 0.0))[1] * LN10 + _lm_logp(grams, history[1:], word, n_unseen)


def test_arpa_is_a_normalised_token_lm():
    order = max(len(w) for w in GRAMS)
    assert order == REFERENCE["models"][MODELS[0]]["lm"]["order"] == 3
    for words in GRAMS:  # NeMo's suffix tree needs every n-gram's prefix and suffix as n-grams of one order less
        if len(words) > 1:
            assert words[:-1] in GRAMS and words[1:] in GRAMS, words
        assert all(w in ("<s>", "</s>", "<unk>") or 0 <= ord(w) - OFFSET < 128 for w in words)
    unigrams = sum(10**lp for (w, *rest), (lp, _) in GRAMS.items() if not rest and w != "<s>")
    assert unigrams == pytest.approx(1.0, abs=1e-4)
    assert GRAMS[("<s>",)][0] == -99.0


@pytest.mark.parametrize("name", MODELS)
def test_nemo_lm_scores_follow_from_the_arpa(name):
    oracle = REFERENCE["models"][name]["lm"]["oracle"]
    vocab = oracle["vocab_size"]
    seen = {ord(w) - OFFSET for (w, *rest) in GRAMS if not rest and len(w) == 1}
    n_unseen = vocab - len(seen)
    assert 0 < n_unseen < vocab  # tokens outside the LM exercise NeMo's <unk> spreading
    history = ("<s>",)
    expected = [_lm_logp(GRAMS, history, chr(i + OFFSET), n_unseen) for i in range(vocab)]
    np.testing.assert_allclose(oracle["bos_advance_scores"], expected, rtol=0, atol=2e-5)
    for sentence in oracle["sentences"]:
        words = [chr(i + OFFSET) for i in sentence["token_ids"]] + ["</s>"]
        history, expected = ("<s>",), []
        for w in words:
            expected.append(_lm_logp(GRAMS, history, w, n_unseen))
            history = (*history, w)[-(3 - 1) :]
        np.testing.assert_allclose(sentence["scores"], expected, rtol=0, atol=2e-5, err_msg=sentence["text"])


# ----------------------------------------------------------------------------- the recorded steps


NPZ = np.load(FOLDER / "reference.npz")


def _step(name: str, lm: str, i: int) -> dict[str, np.ndarray]:
    prefix = f"{name}/{lm}/step{i}_"
    return {k[len(prefix) :]: NPZ[k] for k in NPZ.files if k.startswith(prefix)}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("lm", ["nolm", "lm"])
def test_first_step_follows_from_the_logits(name, lm):
    """Step 0: only beam 0 is live (score 0); its top `beam` (token[, duration]) candidates, scored as the README says."""
    spec = REFERENCE["models"][name]
    case = REFERENCE["npz_case"]
    beam, blank = case["beam"], spec["blank_id"]
    assert NPZ[f"{name}/encoder"].shape[0] == spec["encoder_frames"][case["clip"]]
    assert all(_step(name, lm, i) for i in range(case["steps"]))
    s = _step(name, lm, 0)
    assert s["logits"].shape[0] == beam and (s["parent"] == 0).all()
    logits = torch.from_numpy(s["logits"][0]).double()
    n_dur = len(spec["durations"]) if spec["durations"] else 0
    tok = torch.log_softmax(logits[: blank + 1], -1)
    if lm == "lm":  # pruning late, blank lm_weighted_full
        lm_scores = torch.from_numpy(s["lm_scores"][0]).double()
        non_blank = torch.log1p(-torch.clamp(tok[blank].exp(), max=1 - EPS))
        tok = torch.cat([tok[:blank] + ALPHA * non_blank + ALPHA * lm_scores, tok[blank:] * (1 + ALPHA)])
    if n_dur:
        total = (tok[:, None] + torch.log_softmax(logits[blank + 1 :], -1)[None, :]).reshape(-1)
        top = total.topk(beam)
        labels, durations = top.indices // n_dur, top.indices % n_dur
        durations = torch.where((labels == blank) & (durations == 0), 1, durations)
        assert s["duration_index"][0].tolist() == durations.tolist()
    else:
        top = tok.topk(beam)
        labels = top.indices
    assert s["label"][0].tolist() == labels.tolist()
    np.testing.assert_allclose(s["score_added"][0], top.values.numpy(), rtol=0, atol=1e-4)


def _topk_per_beam(logits: torch.Tensor, lm_scores: torch.Tensor | None, blank: int, n_dur: int, k: int):
    """Step 1 and the fusion for every beam: (values, labels, durations, lp) with `lp` as the forced blank sees it."""
    lp = torch.log_softmax(logits[:, : blank + 1], -1)
    if lm_scores is not None:  # late + lm_weighted_full modifies lp in place: the forced blank pays it too
        non_blank = torch.log1p(-torch.clamp(lp[:, blank].exp(), max=1 - EPS))
        lp = torch.cat([lp[:, :blank] + ALPHA * non_blank[:, None] + ALPHA * lm_scores, lp[:, blank:] * (1 + ALPHA)], 1)
    if not n_dur:
        top = lp.topk(k, -1)
        return top.values, top.indices, torch.zeros_like(top.indices), lp, None
    dlp = torch.log_softmax(logits[:, blank + 1 :], -1)
    top = (lp[:, :, None] + dlp[:, None, :]).reshape(len(lp), -1).topk(k, -1)
    labels, durations = top.indices // n_dur, top.indices % n_dur
    durations = torch.where((labels == blank) & (durations == 0), 1, durations)
    return top.values, labels, durations, lp, dlp


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("lm", ["nolm", "lm"])
def test_recorded_steps_replay(name, lm):
    """Every recorded step from its logits: candidates, finished hypotheses, max_symbols' forced blank, pruning,
    time and recombination, as the README describes them (scores to 1e-4; NeMo's own labels and parents are
    followed, so a tie broken differently cannot derail the replay)."""
    spec = REFERENCE["models"][name]
    case = REFERENCE["npz_case"]
    k, blank, max_symbols = case["beam"], spec["blank_id"], spec["max_symbols"]
    n_dur = len(spec["durations"]) if spec["durations"] else 0
    last = spec["encoder_frames"][case["clip"]] - 1
    scores = torch.tensor([0.0] + [-math.inf] * (k - 1), dtype=torch.float64)
    t, lasts, seqs = torch.zeros(k, dtype=torch.long), torch.zeros(k, dtype=torch.long), [()] * k
    forced_seen = 0
    for i in range(case["steps"]):
        s = _step(name, lm, i)
        lm_scores = torch.from_numpy(s["lm_scores"]).double() if lm == "lm" else None
        vals, labels, durs, lp, dlp = _topk_per_beam(torch.from_numpy(s["logits"]).double(), lm_scores, blank, n_dur, k)
        active = t <= last
        cand = torch.where(active[:, None], scores[:, None] + vals, -math.inf)
        cand[:, 0] = torch.where(active, cand[:, 0], scores)
        force = (lasts >= max_symbols) & active
        forced_blank = scores + lp[:, blank] + (dlp.max(-1).values if n_dur else 0.0)
        cand = torch.where(force[:, None], -math.inf, cand)
        cand[:, 0] = torch.where(force, forced_blank, cand[:, 0])
        forced_seen += int(force.sum())
        kept = cand.reshape(-1).topk(k).values
        np.testing.assert_allclose(s["score_added"][0], kept.numpy(), rtol=0, atol=1e-4, err_msg=f"step {i}")
        # follow NeMo's choice
        parent, label = torch.from_numpy(s["parent"][0]), torch.from_numpy(s["label"][0])
        dur = torch.from_numpy(s["duration_index"][0]) if n_dur else None
        for j in range(k):  # a forced blank's duration is its top-1 candidate's (0 -> 1)
            if force[parent[j]] and n_dur:
                assert label[j] == blank and dur[j] == max(int(durs[parent[j], 0]), 1), f"step {i}"
        is_label = (label >= 0) & (label != blank)
        if n_dur:
            dur = torch.where(label >= 0, dur, 0)
            t = t[parent] + dur
            lasts = torch.where((label >= 0) & (dur > 0), 0, lasts[parent] + is_label.long())
        else:
            t = t[parent] + (label == blank).long()
            lasts = torch.where(label == blank, 0, lasts[parent] + is_label.long())
        seqs = [seqs[p] + ((int(lab),) if ok else ()) for p, lab, ok in zip(parent.tolist(), label, is_label)]
        # recombination: same tokens (and, TDT, same next frame) -> the best keeps the logsumexp, the others -inf
        added = torch.from_numpy(s["score_added"][0]).double()
        keys = [(seq, int(t[j]) if n_dur else None) for j, seq in enumerate(seqs)]
        scores = torch.full((k,), -math.inf, dtype=torch.float64)
        for j in range(k):
            group = [c for c in range(k) if keys[c] == keys[j]]
            if j == max(group, key=lambda c: (added[c], -c)):
                scores[j] = torch.logsumexp(added[group], 0)
        np.testing.assert_allclose(s["score_recombined"][0], scores.numpy(), rtol=0, atol=1e-4, err_msg=f"step {i}")
        scores = torch.from_numpy(s["score_recombined"][0]).double()
    assert forced_seen or name == "rnnt-tiny" or lm == "lm"  # max_symbols' forced blank is exercised (TDT, no LM)
