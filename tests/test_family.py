"""The Parakeet family through scripts/make_checkpoint.py: every tiny preset loads and decodes, and the archives
look like NeMo's. The released models' own config fields are read in test_config.py (fixtures/configs)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import make_checkpoint as mk  # scripts/ (pytest's pythonpath)
import pytest
import sentencepiece as spm
import torch
import yaml

import graphscribe

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "nemo-tdt-tiny"
CLIPS = [
    FIXTURE / "clips" / name for name in ("short_2s.wav", "quarter_second.wav", "librispeech_2086-149220-0033.wav")
]


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:") as tar:  # plain tar, like NeMo's
        return {m.name: (tar.extractfile(m).read() if m.isfile() else b"") for m in tar.getmembers()}


def _layout(name: str) -> str:
    """A member name with its 32-hex prefix blanked out."""
    stem = name.removeprefix("./")
    if len(stem) > 33 and stem[32] == "_" and all(c in "0123456789abcdef" for c in stem[:32]):
        return "./<hex>_" + stem[33:]
    return name


def _keys(node, prefix=""):
    if isinstance(node, dict):
        out = set()
        for key, value in node.items():
            out.add(prefix + key)
            out |= _keys(value, prefix + key + ".")
        return out
    return set()


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("family")
    return {name: mk.make_checkpoint(name, folder / f"{name}.nemo", seed=0) for name in mk.TINY_PRESETS}


def test_tiny_presets_cover_every_switch():
    presets = [mk.PRESETS[name] for name in mk.TINY_PRESETS]
    assert {p.durations is None for p in presets} == {True, False}
    assert {p.n_mels for p in presets} == {80, 128}
    assert {p.xscaling for p in presets} == {True, False}
    assert {p.use_bias for p in presets} == {True, False}
    assert {p.pred_layers for p in presets} == {1, 2}
    assert len({p.durations for p in presets if p.durations}) >= 2
    assert len({p.max_symbols for p in presets}) >= 3


@pytest.mark.parametrize("name", mk.TINY_PRESETS)
def test_tiny_preset_loads_and_transcribes(name, tiny_checkpoints):
    preset = mk.PRESETS[name]
    model = graphscribe.load_model(tiny_checkpoints[name], device="cpu")
    cfg = model.cfg
    assert cfg.features.n_mels == cfg.encoder.n_mels == preset.n_mels
    assert (cfg.encoder.n_layers, cfg.encoder.d_model, cfg.encoder.n_heads) == (
        preset.n_layers,
        preset.d_model,
        preset.n_heads,
    )
    assert cfg.encoder.subsampling_channels == preset.subsampling_channels
    assert (cfg.encoder.xscaling, cfg.encoder.use_bias) == (preset.xscaling, preset.use_bias)
    assert (cfg.prediction.layers, cfg.prediction.hidden) == (preset.pred_layers, preset.pred_hidden)
    assert cfg.prediction.vocab_size == cfg.joint.vocab_size == model.tokenizer.vocab_size == preset.vocab_size
    assert cfg.decoding.durations == (preset.durations or ())
    assert cfg.decoding.is_tdt == (preset.durations is not None)
    assert cfg.joint.num_durations == len(preset.durations or ())
    assert cfg.decoding.max_symbols == preset.max_symbols

    results = model.transcribe([str(c) for c in CLIPS[:2]])
    for clip, result in zip(CLIPS, results):
        assert result.error is None
        audio = model.read(str(clip))
        _, lengths = model.encode([audio])
        frames = int(lengths[0])
        assert all(0 <= t < preset.vocab_size for t in result.token_ids)
        assert result.frames == sorted(result.frames)
        assert all(0 <= f < frames for f in result.frames)
        assert len(result.token_ids) <= frames * preset.max_symbols
        assert result.text == model.tokenizer.decode(result.token_ids)


def test_preprocessor_buffers_match_nemo():
    fixture = torch.load(_fixture_weights(), map_location="cpu", weights_only=True)
    fb = torch.from_numpy(mk.mel_filterbank(16000, 512, 128))[None]
    assert torch.allclose(fb, fixture["preprocessor.featurizer.fb"], atol=1e-6)
    window = torch.hann_window(400, periodic=False)
    assert torch.equal(window, fixture["preprocessor.featurizer.window"])


def _fixture_weights() -> io.BytesIO:
    data = _members(FIXTURE / "tdt-tiny.nemo")["./model_weights.ckpt"]
    return io.BytesIO(data)


def test_tiny_checkpoint_has_the_fixture_layout(tiny_checkpoints):
    ours, nemo = _members(tiny_checkpoints["tiny-tdt"]), _members(FIXTURE / "tdt-tiny.nemo")
    assert sorted(_layout(n) for n in ours) == sorted(_layout(n) for n in nemo)
    ours_cfg = yaml.safe_load(ours["./model_config.yaml"])
    nemo_cfg = yaml.safe_load(nemo["./model_config.yaml"])
    assert list(ours_cfg) == list(nemo_cfg)  # same sections, same order
    assert _keys(ours_cfg) == _keys(nemo_cfg)
    for section in ("preprocessor", "encoder", "decoder", "joint"):
        assert ours_cfg[section]["_target_"] == nemo_cfg[section]["_target_"]
    assert ours_cfg["target"] == nemo_cfg["target"]
    for key in ("model_path", "vocab_path", "spe_tokenizer_vocab"):  # every reference names a member
        assert "./" + ours_cfg["tokenizer"][key].removeprefix("nemo:") in ours
    assert ours_cfg["labels"] == ours_cfg["joint"]["vocabulary"]
    fixture_state = torch.load(_fixture_weights(), map_location="cpu", weights_only=True)
    our_state = torch.load(io.BytesIO(ours["./model_weights.ckpt"]), map_location="cpu", weights_only=True)
    assert {k: tuple(v.shape) for k, v in our_state.items()} == {k: tuple(v.shape) for k, v in fixture_state.items()}


@pytest.mark.parametrize("name", mk.TINY_PRESETS)
def test_tokenizer_has_the_preset_vocabulary(name):
    pieces = mk.make_pieces(mk.PRESETS[name].vocab_size)
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(mk.sentencepiece_model(pieces))
    assert sp.get_piece_size() == len(pieces) == mk.PRESETS[name].vocab_size
    assert [sp.id_to_piece(i) for i in range(len(pieces))] == pieces
    assert sp.unk_id() == 0 and sp.bos_id() == -1 and sp.eos_id() == -1
    assert sp.decode_ids(sp.encode_as_ids("the end")) == "the end"


def test_calibration_gives_a_plausible_token_rate(tmp_path):
    clip = FIXTURE / "clips" / "librispeech_2086-149220-0033.wav"
    path = mk.make_checkpoint(
        "tiny-tdt-80mel", tmp_path / "calibrated.nemo", calibrate_on=[str(clip)], log=lambda *a: None
    )
    (stats,) = mk.checkpoint_stats(path, [str(clip)])  # decoded again from the written file
    assert 0.2 <= stats["tokens_per_frame"] <= 0.5
    assert all(n > 0 for n in stats["token_durations"].values())
    assert stats["distinct_tokens"] >= 10


def test_cache_aware_preset_is_written_and_loads_as_cache_aware(tiny_checkpoints):
    preset = mk.PRESETS["tiny-cache-aware-rnnt"]
    model = graphscribe.load_model(tiny_checkpoints["tiny-cache-aware-rnnt"], device="cpu")
    assert model.cfg.encoder.cache_aware and not mk.PRESETS["tiny-rnnt"].cache_aware
    assert (
        model.cfg.encoder.streaming_contexts
        == preset.att_context_size
        == mk.PRESETS["nemotron-speech-streaming-en-0.6b"].att_context_size
    )
    assert model.cfg.encoder.conv_layer_norm and not model.cfg.features.normalize
    encoder = mk.preset_config("tiny-cache-aware-rnnt")["encoder"]
    assert encoder["causal_downsampling"] and encoder["conv_context_size"] == "causal"
    assert encoder["att_context_style"] == "chunked_limited"
