"""The confidence oracle (fixtures/nemo-confidence) is whole and follows the formulas of its README.

Every number in the fixture is NeMo 3.0.0's (scripts/fixtures/make_nemo_confidence_fixtures.py). These tests need no
NeMo: they check that every model, setting and clip is there, that the recorded per-token confidences recompute from
the recorded joint outputs with the README's formulas (numpy, float64), and that the per-word confidences aggregate
the per-token ones over NeMo's SentencePiece word split, so that the implementation of issue 50 can be written
against the README and tested against the JSON.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import FIXTURES

FOLDER = FIXTURES / "nemo-confidence"
ROOT = FIXTURES.parent.parent
REFERENCE = json.loads((FOLDER / "reference.json").read_text())
with np.load(FOLDER / "reference.npz") as _data:
    ARRAYS = {k: _data[k] for k in _data.files}
MODELS = list(REFERENCE["models"])
RUNS = [(m, s) for m in MODELS for s in REFERENCE["models"][m]["settings"]]
TDT_ONLY = {"default_tdt_include_duration"}
# NeMo computes in float32; the formulas here in float64: a relative tolerance a few float32 ulps wide
RTOL, ATOL = 2e-5, 1e-9


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def measure(x: np.ndarray, method: dict, v: int) -> np.ndarray:
    """NeMo's per-step confidence of log-probabilities x (..., n) over v classes (README "The measures")."""
    t, name = method["alpha"], method["name"]
    if name == "max_prob":
        top = x.max(-1)
        return (np.exp(top) * v - 1) / (v - 1) if t == 1 else (np.exp(top * t) * v**t - 1) / (v**t - 1)
    kind, norm = method["entropy_type"], method["entropy_norm"]
    if t == 1:  # every entropy type is Gibbs'
        neg_h = (np.exp(x) * x).sum(-1)
        return 1 + neg_h / math.log(v) if norm == "lin" else (np.exp(neg_h) * v - 1) / (v - 1)
    s = np.exp(x * t).sum(-1)  # sum p^t
    if kind == "gibbs":
        neg_h = (np.exp(x * t) * x).sum(-1)
        if norm == "lin":
            return 1 + neg_h / math.log(v) / v ** (1 - t)
        c = v ** (-t * v ** (1 - t))
        return (np.exp(neg_h * t) - c) / (1 - c)
    if kind == "tsallis":
        if norm == "lin":
            return 1 + (1 - s) / (v ** (1 - t) - 1)
        c = math.exp((1 - v ** (1 - t)) / (1 - t))
        return (np.exp((1 - s) / (1 - t)) - c) / (1 - c)
    if norm == "lin":  # renyi
        return 1 + np.log2(s) / (t - 1) / math.log2(v)
    return (s ** (1 / (t - 1)) * v - 1) / (v - 1)


AGGREGATE = {"min": min, "max": max, "mean": lambda x: sum(x) / len(x), "prod": math.prod}


def word_groups(token_ids: list[int], vocabulary: dict) -> list[tuple[int, int]]:
    """NeMo's _aggregate_token_confidence_subwords_sentencepiece: [start, end) token spans of the words."""
    pieces, texts = vocabulary["pieces"], vocabulary["texts"]
    spans, j, prev_unk, prev_underline = [], 0, False, False
    for i, tid in enumerate(token_ids):
        token, text = pieces[tid], texts[tid]
        if (token != text or prev_unk) and i > j:
            if not prev_underline:
                spans.append((j, i))
            j = i
        prev_unk, prev_underline = token == "<unk>", token == "▁"
    if token_ids and not prev_underline:
        spans.append((j, len(token_ids)))
    return spans


def _close(actual, expected) -> bool:
    return np.allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=RTOL, atol=ATOL)


def test_folder_is_small():
    assert sum(p.stat().st_size for p in FOLDER.rglob("*") if p.is_file()) < 1_000_000


def test_nemo_defaults():
    d = REFERENCE["nemo_defaults"]
    assert (d["exclude_blank"], d["aggregation"], d["tdt_include_duration"]) == (True, "min", False)
    method = d["method_cfg"]
    assert (method["name"], method["entropy_type"], method["alpha"], method["entropy_norm"]) == (
        "entropy",
        "tsallis",
        0.33,
        "exp",
    )
    assert REFERENCE["settings"]["default"] == {}


@pytest.mark.parametrize("name,setting", RUNS)
def test_every_clip_is_whole(name, setting):
    spec = REFERENCE["models"][name]
    run = spec["settings"][setting]
    asked = REFERENCE["settings"][setting]
    cfg = run["confidence_cfg"]
    assert cfg["preserve_frame_confidence"] and cfg["preserve_token_confidence"] and cfg["preserve_word_confidence"]
    for key, value in asked.items():
        assert cfg[key] == value if key != "method_cfg" else all(cfg[key][k] == v for k, v in value.items())
    assert set(run["clips"]) == set(run["batch_vs_single"]) == set(spec["clips"])
    assert all((ROOT / path).is_file() for path in spec["clips"].values())
    default = spec["settings"]["default"]["clips"]
    for clip, rec in run["clips"].items():
        n = len(rec["token_ids"])
        assert len(rec["timestamps"]) == len(rec["token_confidence"]) == n
        assert rec["words"] == rec["text"].split() and len(rec["word_confidence"]) == len(rec["words"])
        assert (rec["token_ids"], rec["timestamps"]) == (default[clip]["token_ids"], default[clip]["timestamps"])
        assert all(-1e-6 <= c <= 1 + 1e-6 for c in rec["token_confidence"] + rec["word_confidence"]), clip
        blanks = cfg["exclude_blank"] is False
        assert (rec["frame_confidence"] is None) != blanks
    if name == "tdt-tiny" or name == "demo":
        assert spec["model_type"] == "tdt"
    assert setting not in TDT_ONLY or spec["model_type"] == "tdt"


def test_speech_has_words():
    spec = REFERENCE["models"]["demo"]
    clips = spec["settings"]["default"]["clips"].values()
    spans = [b - a for r in clips for a, b in word_groups(r["token_ids"], spec["vocabulary"])]
    assert len(spans) >= 40 and sum(n > 1 for n in spans) >= 20  # words of several pieces
    confidences = [c for r in clips for c in r["token_confidence"]]
    assert min(confidences) < 0.2 and max(confidences) > 0.95  # a trained model: spread over [0, 1]


@pytest.mark.parametrize("name,setting", RUNS)
def test_word_confidence_aggregates_tokens(name, setting):
    spec = REFERENCE["models"][name]
    run = spec["settings"][setting]
    aggregate = AGGREGATE[run["confidence_cfg"]["aggregation"]]
    for clip, rec in run["clips"].items():
        spans = word_groups(rec["token_ids"], spec["vocabulary"])
        assert len(spans) == len(rec["words"]), clip
        tokens = rec["token_confidence"]
        expected = [aggregate(tokens[a:b]) for a, b in spans]
        assert _close(rec["word_confidence"], expected), clip


def _steps(name):
    meta = REFERENCE["npz"][name]
    steps = {k: ARRAYS[f"{name}_{k}"] for k in ("raw", "frame", "label")}
    return meta, steps


@pytest.mark.parametrize("name", MODELS)
def test_steps_replay_the_greedy_decode(name):
    spec = REFERENCE["models"][name]
    meta, steps = _steps(name)
    rec = spec["settings"]["default"]["clips"][meta["clip"]]
    blank, outputs = spec["blank_id"], spec["joint_outputs"]
    assert steps["raw"].shape == (len(steps["label"]), outputs) and steps["raw"].dtype == np.float32
    assert outputs == blank + 1 + len(spec["durations"] or [])
    assert np.array_equal(steps["label"], steps["raw"][:, : blank + 1].argmax(-1))
    tokens = steps["label"] != blank
    assert steps["label"][tokens].tolist() == rec["token_ids"]
    assert steps["frame"][tokens].tolist() == rec["timestamps"]
    assert meta["cpu_joint_out_vs_log_softmax_raw_max_abs_diff"] < 1e-5 and len(steps["label"]) == meta["steps"]
    # NEMO_NOTES "Greedy TDT": the next step reads frame t + d (a blank's d 0 made 1; RNN-T: d = 1 for blank, 0 for a
    # token), one more when a token left t unchanged and t already holds max_symbols tokens
    raw, frame, label = steps["raw"], steps["frame"], steps["label"]
    on_frame = 0
    for i in range(len(label) - 1):
        is_blank = label[i] == blank
        if spec["model_type"] == "tdt":
            d = spec["durations"][int(raw[i, blank + 1 :].argmax())]
            d = max(d, 1) if is_blank else d
        else:
            d = 1 if is_blank else 0
        on_frame += not is_blank
        forced = not is_blank and d == 0 and on_frame >= spec["max_symbols"]
        assert frame[i + 1] == frame[i] + d + forced, i
        on_frame = 0 if frame[i + 1] != frame[i] else on_frame


def _step_confidence(spec, steps, method) -> np.ndarray:
    classes = spec["blank_id"] + 1
    return measure(_log_softmax(steps["raw"][:, :classes]), method, classes)


@pytest.mark.parametrize("name,setting", RUNS)
def test_token_confidence_from_joint_outputs(name, setting):
    spec = REFERENCE["models"][name]
    run = spec["settings"][setting]
    cfg = run["confidence_cfg"]
    meta, steps = _steps(name)
    rec = run["clips"][meta["clip"]]
    blank, classes = spec["blank_id"], spec["blank_id"] + 1
    per_step = _step_confidence(spec, steps, cfg["method_cfg"])
    aggregate = AGGREGATE[cfg["aggregation"]]
    tokens = np.nonzero(steps["label"] != blank)[0]
    if cfg["tdt_include_duration"]:
        durations = measure(_log_softmax(steps["raw"][:, classes:]), cfg["method_cfg"], classes)  # v: tokens + blank
        expected = [aggregate([per_step[i], durations[i]]) for i in tokens]
    elif cfg["exclude_blank"]:
        expected = per_step[tokens]
    else:
        expected = _fold_blanks(spec["model_type"], steps, per_step, tokens, aggregate)
        # the hypothesis' frame_confidence: every step, grouped by the frame it read
        frames = [[] for _ in range(len(rec["frame_confidence"]))]
        groups = np.unique(steps["frame"], return_inverse=True)[1] if spec["model_type"] == "tdt" else steps["frame"]
        for g, c in zip(groups, per_step):
            frames[g].append(c)
        assert all(_close(a, b) for a, b in zip(rec["frame_confidence"], frames))
    assert len(expected) == len(rec["token_confidence"])
    assert _close(rec["token_confidence"], expected)


def _fold_blanks(model_type, steps, per_step, tokens, aggregate) -> list[float]:
    """exclude_blank false: README "Blank steps"."""
    frame = steps["frame"]
    if model_type == "tdt":  # every blank step after a token, up to the next token
        ends = list(tokens[1:]) + [len(per_step)]
        return [aggregate([per_step[i]] + list(per_step[i + 1 : e])) for i, e in zip(tokens, ends)]
    # RNN-T: the last token of a frame takes the first step of each later frame up to the next token's frame
    first_of_frame = {}
    for i, f in enumerate(frame):
        first_of_frame.setdefault(int(f), i)
    n_frames = int(frame.max()) + 1
    out = []
    for k, i in enumerate(tokens):
        ts = int(frame[i])
        te = int(frame[tokens[k + 1]]) if k + 1 < len(tokens) else n_frames
        if ts == te:
            out.append(per_step[i])
        else:
            out.append(aggregate([per_step[i]] + [per_step[first_of_frame[f]] for f in range(ts + 1, te)]))
    return out


@pytest.mark.parametrize("name,setting", RUNS)
def test_batch_changes_only_rounding(name, setting):
    run = REFERENCE["models"][name]["settings"][setting]
    for clip, check in run["batch_vs_single"].items():
        assert check["token_ids"] and check["timestamps"] and check["words"], clip
        # silence_1s: its padded-batch features differ (nemo-rnnt-tiny's batch_features_max_abs_dev_from_single)
        limit = 1e-2 if clip == "silence_1s" else 2e-6
        assert check["token_confidence_max_abs_diff"] <= limit and check["word_confidence_max_abs_diff"] <= limit
