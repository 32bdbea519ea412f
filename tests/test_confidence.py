"""Token and word confidence (model/confidence.py) against NeMo 3.0's own (fixtures/nemo-confidence, its README):
our greedy hypotheses, their steps' logits replayed after decoding, every exclude-blank setting NeMo offers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import FIXTURES

import graphscribe
from graphscribe.model.confidence import ConfidenceMethod, measure, measured, replay, word_confidences

FOLDER = FIXTURES / "nemo-confidence"
ROOT = FIXTURES.parent.parent
REFERENCE = json.loads((FOLDER / "reference.json").read_text())
# the settings that measure each token's own step (NeMo's default exclude_blank), durations left out
SETTINGS = [
    name
    for name, cfg in REFERENCE["settings"].items()
    if cfg.get("exclude_blank", True) and not cfg.get("tdt_include_duration", False)
]


def _method(name: str) -> ConfidenceMethod:
    cfg = REFERENCE["settings"][name]
    method = {**REFERENCE["nemo_defaults"]["method_cfg"], **cfg.get("method_cfg", {})}
    return ConfidenceMethod(
        name=method["name"],
        entropy_type=method.get("entropy_type", "tsallis"),
        alpha=float(method["alpha"]),
        entropy_norm=method.get("entropy_norm", "exp"),
        aggregation=cfg.get("aggregation", REFERENCE["nemo_defaults"]["aggregation"]),
    )


@pytest.fixture(scope="module")
def models():
    return {
        name: graphscribe.load_model(ROOT / spec["checkpoint"], device="cpu")
        for name, spec in REFERENCE["models"].items()
    }


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_measures_of_nemo_s_own_logits(setting):
    """Each recorded step's raw joint output (reference.npz) through `measure`: NeMo's token confidences."""
    arrays = np.load(FOLDER / "reference.npz")
    method = _method(setting)
    for name, spec in REFERENCE["models"].items():
        clip = REFERENCE["npz"][name]["clip"]
        raw = torch.from_numpy(arrays[f"{name}_raw"][:, : spec["num_classes_with_blank"]])
        labels = arrays[f"{name}_label"]
        emitted = labels != spec["blank_id"]
        got = measure(torch.log_softmax(raw, dim=-1), method)[torch.from_numpy(emitted)].tolist()
        want = spec["settings"][setting]["clips"][clip]["token_confidence"]
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-12)


@pytest.mark.parametrize("setting", ["default", "max_prob_mean", "gibbs_lin_a05_prod"])
def test_replayed_hypotheses_give_nemo_s_token_and_word_confidence(models, setting):
    """Our greedy decode of each clip, then `replay`: the same tokens as NeMo and its confidences, per token and per
    word, for the trained demo model and both random ones."""
    method = _method(setting)
    for name, spec in REFERENCE["models"].items():
        model = models[name]
        decoder = model.decoder
        vocabulary = spec["vocabulary"]
        for clip, path in spec["clips"].items():
            want = spec["settings"][setting]["clips"][clip]
            encoded, lengths = model.encode([model.read(ROOT / path)])
            hyp = model.decode(encoded, lengths)[0]
            assert hyp.token_ids == want["token_ids"] and hyp.frames == want["timestamps"], (name, clip)
            with torch.inference_mode():
                h, c, g = decoder.start_state(1, encoded.device, encoded.dtype)
                got = replay(
                    model.module.decoder,
                    model.module.joint,
                    (h, c, g),
                    encoded[0, : int(lengths[0])],
                    hyp.token_ids,
                    hyp.frames,
                    method,
                )
            np.testing.assert_allclose(got, want["token_confidence"], rtol=2e-5, atol=1e-12, err_msg=f"{name} {clip}")
            words = word_confidences(vocabulary["pieces"], vocabulary["texts"], hyp.token_ids, got, method.aggregation)
            np.testing.assert_allclose(words, want["word_confidence"], rtol=2e-5, atol=1e-12, err_msg=f"{name} {clip}")


@pytest.mark.parametrize("setting", ["default", "max_prob_mean"])
def test_kept_predictions_give_nemo_s_confidence_one_clip_and_batched(setting):
    """A decoder made for confidences keeps each token step's prediction output (`DecodeBuffers.keep_prediction`);
    `measured` on them gives NeMo's token confidences, each clip alone and the speech clips as one padded batch,
    without running the prediction net again."""
    method = _method(setting)
    for name, spec in REFERENCE["models"].items():
        model = graphscribe.load_model(ROOT / spec["checkpoint"], device="cpu", confidence=True)
        clips = {clip: model.read(ROOT / path) for clip, path in spec["clips"].items()}
        batches = [[clip] for clip in clips] + [[clip for clip in clips if clip != "silence_1s"]]
        for batch in batches:
            encoded, lengths = model.encode([clips[clip] for clip in batch])
            hyps = model.decode(encoded, lengths)
            assert all(h.predictions is not None and len(h.predictions) == len(h.token_ids) for h in hyps)
            with torch.inference_mode():
                got = measured(model.module.joint, encoded, [h.predictions for h in hyps], [h.frames for h in hyps],
                               method)  # fmt: skip
            for clip, hyp, values in zip(batch, hyps, got):
                want = spec["settings"][setting]["clips"][clip]
                assert hyp.token_ids == want["token_ids"], (name, clip)
                np.testing.assert_allclose(values, want["token_confidence"], rtol=2e-5, atol=1e-12, err_msg=name + clip)
