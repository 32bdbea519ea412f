"""The cache-aware streaming oracle (fixtures/nemo-cache-aware) is whole and self-consistent.

Every number in the fixture is NeMo 3.0.0's (scripts/fixtures/make_nemo_cache_aware_fixtures.py, its
README says what each field is). These tests need no NeMo: they check that the checkpoints are the
cache-aware kind, that every model, lookahead and clip is there, and that the per-step records add up,
so that a partial or broken regeneration fails here and not in the streaming tests built on it.
"""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
import yaml
from conftest import FIXTURES

FOLDER = FIXTURES / "nemo-cache-aware"
ROOT = FIXTURES.parent.parent
REFERENCE = json.loads((FOLDER / "reference.json").read_text())
MODELS = list(REFERENCE["models"])
LOOKAHEADS = [(name, key) for name in MODELS for key in REFERENCE["models"][name]["lookaheads"]]
SPEECH = ["librispeech_2086-149220-0033", "espeak_fox", "long_libri_libri_fox", "long_jfk_silence_libri", "long_mix"]
SUBSAMPLING = 8  # feature frames (10 ms) per encoder frame
PRE_ENCODE_CACHE = SUBSAMPLING + 1  # feature frames put before every chunk after the first
DROP_EXTRA = 2  # encoder frames made from the pre-encode cache and dropped


def _read_nemo(path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Config and state dict of a .nemo, read directly: graphscribe's loader turns cache-aware models away."""
    with tarfile.open(path) as tar:
        files = {m.name.split("/")[-1]: m for m in tar.getmembers() if m.isfile()}
        config = yaml.safe_load(tar.extractfile(files["model_config.yaml"]))
        weights = torch.load(io.BytesIO(tar.extractfile(files["model_weights.ckpt"]).read()), weights_only=True)
    return config, weights


def test_folder_is_small():
    assert sum(p.stat().st_size for p in FOLDER.rglob("*") if p.is_file()) < 3_000_000


@pytest.mark.parametrize("name", MODELS)
def test_checkpoint_is_cache_aware(name):
    spec = REFERENCE["models"][name]
    config, weights = _read_nemo(ROOT / spec["checkpoint"])
    enc, pre = config["encoder"], config["preprocessor"]
    assert enc == spec["config"]["encoder"]
    assert enc["att_context_size"] == REFERENCE["att_context_sizes"]
    assert all(left % (right + 1) == 0 for left, right in enc["att_context_size"])
    assert (enc["att_context_style"], enc["conv_context_size"], enc["causal_downsampling"]) == (
        "chunked_limited",
        "causal",
        True,
    )
    assert (enc["subsampling"], enc["subsampling_factor"], pre["normalize"]) == ("dw_striding", SUBSAMPLING, "NA")
    # the causal subsampling pads the mel axis too (left 2, right 1): n -> n // 2 + 1, three times
    mels = pre["features"]
    for _ in range(3):
        mels = mels // 2 + 1
    out = weights["encoder.pre_encode.out.weight"]
    assert tuple(out.shape) == (enc["d_model"], enc["subsampling_conv_channels"] * mels)


@pytest.mark.parametrize("name,key", LOOKAHEADS)
def test_every_clip_and_geometry(name, key):
    spec = REFERENCE["models"][name]
    run = spec["lookaheads"][key]
    enc = spec["config"]["encoder"]
    left, lookahead = run["att_context_size"]
    clips = set(REFERENCE["clips"])
    assert all((ROOT / c["file"]).is_file() for c in REFERENCE["clips"].values())
    assert set(run["offline"]) == set(run["offline_model"]) == set(run["example"]) == set(run["pipeline"]) == clips
    geometry = run["example_geometry"]
    cfg = geometry["streaming_cfg"]
    assert cfg["chunk_size"] == cfg["shift_size"] == [1 + SUBSAMPLING * lookahead, SUBSAMPLING * (1 + lookahead)]
    assert cfg["pre_encode_cache_size"] == [0, PRE_ENCODE_CACHE]
    assert (cfg["drop_extra_pre_encoded"], cfg["valid_out_len"], cfg["last_channel_cache_size"]) == (
        DROP_EXTRA,
        lookahead + 1,
        left,
    )
    assert geometry["initial_cache_shapes"] == {
        "cache_last_channel": [enc["n_layers"], 1, left, enc["d_model"]],
        "cache_last_time": [enc["n_layers"], 1, enc["d_model"], enc["conv_kernel_size"] - 1],
        "cache_last_channel_len": [1],
    }
    pipe = run["pipeline_geometry"]
    chunk_frames = SUBSAMPLING * (1 + lookahead)
    assert (pipe["encoder_frames_per_chunk"], pipe["feature_chunk_frames"]) == (lookahead + 1, chunk_frames)
    # NeMo's int(seconds / 0.01) of a float sum: 9 + chunk frames, or one less where the sum rounds down
    assert pipe["feature_buffer_frames"] == int((PRE_ENCODE_CACHE * 0.01 + chunk_frames * 0.01) / 0.01)
    assert set(run["pipeline_multi_stream"]["same_as_single"]) == clips


@pytest.mark.parametrize("name,key", LOOKAHEADS)
def test_steps_add_up(name, key):
    run = REFERENCE["models"][name]["lookaheads"][key]
    left, lookahead = run["att_context_size"]
    first, later = run["example_geometry"]["streaming_cfg"]["chunk_size"]
    for clip in REFERENCE["clips"]:
        offline, example, pipeline = run["offline"][clip], run["example"][clip], run["pipeline"][clip]
        steps = example["steps"]  # [feature frames in, valid, drop, encoder frames out, cache fill, ids]
        assert [i for s in steps for i in s[5]] == example["token_ids"]
        assert sum(s[3] for s in steps) == example["encoder_frames"]
        assert steps[0][0] == min(first, example["feature_frames"]) and steps[0][2] == 0
        assert all(s[0] == PRE_ENCODE_CACHE + later and s[2] == DROP_EXTRA for s in steps[1:-1])
        fill = 0
        for s in steps:
            fill = min(left, fill + s[3])
            assert s[4] == fill
        # the example's buffer counts the STFT's last, zeroed frame: one feature frame more than the model's pass
        samples = REFERENCE["clips"][clip]["samples"]
        assert offline["feature_frames"] == run["offline_model"][clip]["feature_frames"] + 1 == samples // 160 + 1
        # a last chunk of fewer than 8 feature frames is never fed: at most one encoder frame short of offline
        assert offline["encoder_frames"] - example["encoder_frames"] in (0, 1)
        assert example["same_as_offline"] == (example["token_ids"] == offline["token_ids"])
        assert example["concat_decode_agrees"] and pipeline["concat_decode_agrees"]
        assert [i for s in pipeline["steps"] for i in s[1]] == pipeline["token_ids"]
        assert sum(s[0] for s in pipeline["steps"]) == pipeline["encoder_frames"]
        assert all(s[0] <= lookahead + 1 for s in pipeline["steps"])
        assert pipeline["same_as_example"] == (pipeline["token_ids"] == example["token_ids"])


@pytest.mark.parametrize("name,key", LOOKAHEADS)
def test_speech_emits_tokens(name, key):
    run = REFERENCE["models"][name]["lookaheads"][key]
    for clip in SPEECH:
        assert run["offline"][clip]["token_ids"] and run["example"][clip]["token_ids"], clip
    assert sum(len(run["example"][clip]["token_ids"]) for clip in SPEECH) >= 100


def test_npz_matches_the_steps():
    with np.load(FOLDER / "reference.npz") as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays.pop("meta")))
    spec = REFERENCE["models"][meta["variant"]]
    run = spec["lookaheads"]["_".join(map(str, meta["att_context_size"]))]
    steps = run["example"][meta["clip"]]["steps"]
    shapes = run["example_geometry"]["initial_cache_shapes"]
    n = len({k.split("_")[0] for k in arrays})
    assert n == 3 and (FOLDER / "reference.npz").stat().st_size < 300 * 2**10
    for i in range(n):
        s = steps[i]
        assert arrays[f"step{i}_features"].shape == (spec["config"]["preprocessor"]["features"], s[0])
        assert int(arrays[f"step{i}_feature_length"]) == s[1]
        assert int(arrays[f"step{i}_drop_extra_pre_encoded"]) == s[2]
        assert arrays[f"step{i}_encoder"].shape == (spec["config"]["encoder"]["d_model"], s[3])
        assert int(arrays[f"step{i}_cache_last_channel_len_out"]) == s[4]
        for cache in ("cache_last_channel", "cache_last_time"):
            expected = tuple(shapes[cache][:1] + shapes[cache][2:])
            assert arrays[f"step{i}_{cache}_in"].shape == arrays[f"step{i}_{cache}_out"].shape == expected
        if i:
            assert np.array_equal(
                arrays[f"step{i}_cache_last_channel_in"], arrays[f"step{i - 1}_cache_last_channel_out"]
            )


def test_the_gpu_comparison_counts_files_with_the_same_ids(tmp_path):
    """`scripts/compare_cache_aware.py --pairs` (bench/2026-11-cache-aware/run.sh ids): every pair of runs, the
    files whose stream token ids are equal, and where the first difference of the others lies."""
    from compare_cache_aware import pairs

    runs = {"nemo-64": {"a": [1, 2, 3], "b": [4]}, "ours-64": {"a": [1, 2, 3], "b": [4, 5]}, "ours-256": {"a": [1, 9]}}
    paths = []
    for name, ids in runs.items():
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / "transcripts.json")
        paths[-1].write_text(json.dumps({file: {"token_ids": t} for file, t in ids.items()}))
    report = pairs(paths)
    assert sorted(report) == ["nemo-64 | ours-256", "nemo-64 | ours-64", "ours-256 | ours-64"]
    assert report["nemo-64 | ours-64"]["same_token_ids"] == 1 and report["nemo-64 | ours-64"]["files"] == 2
    assert report["nemo-64 | ours-64"]["differ"] == {"b": {"at": 1, "ours": 1, "nemo": 2}}
    assert report["nemo-64 | ours-256"]["files"] == 1 and report["nemo-64 | ours-256"]["same_token_ids"] == 0
