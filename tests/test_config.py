"""Reading NeMo's model_config.yaml: the switches that real checkpoints of the family write differently."""

from __future__ import annotations

import copy
import tarfile

import pytest
import torch
import yaml
from conftest import FIXTURES, NEMO_PATH

from graphscribe.io.config import (
    DecodingConfig,
    EncoderConfig,
    FeatureConfig,
    JointConfig,
    ModelConfig,
    PredictionConfig,
    UnsupportedModelError,
    model_config_from_nemo,
)
from graphscribe.model.features import LogMel
from graphscribe.model.transducer import Transducer, load_state

CONFIGS = FIXTURES / "configs"  # released checkpoints' config fields (README.md there names the sources)


@pytest.fixture(scope="module")
def nemo_config() -> dict:
    with tarfile.open(NEMO_PATH) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model_config.yaml"))
        return yaml.safe_load(tar.extractfile(member).read())


def changed(config: dict, **sections) -> dict:
    out = copy.deepcopy(config)
    for section, values in sections.items():
        for key, value in values.items():
            if value is None and key.startswith("-"):
                out[section].pop(key[1:], None)
            else:
                out[section][key] = value
    return out


def test_durations_from_model_defaults_interpolation(nemo_config):
    config = changed(nemo_config, decoding={"durations": "${model.model_defaults.tdt_durations}"})
    assert model_config_from_nemo(config).decoding.durations == (0, 1, 2, 3, 4)


def test_tdt_without_model_type_or_durations_in_decoding(nemo_config):
    config = changed(nemo_config, decoding={"-model_type": None, "-durations": None})
    cfg = model_config_from_nemo(config)  # durations from model_defaults / loss, 5 extra joint outputs
    assert cfg.decoding.durations == (0, 1, 2, 3, 4)


def test_rnnt_when_the_joint_has_no_extra_outputs(nemo_config):
    config = changed(nemo_config, decoding={"-model_type": None, "-durations": None}, joint={"num_extra_outputs": 0})
    config.pop("model_defaults")
    config.pop("loss")
    assert model_config_from_nemo(config).decoding.durations == ()


def test_null_max_symbols_falls_back_to_ten(nemo_config):
    config = changed(nemo_config, decoding={"greedy": {"max_symbols": None}})
    assert model_config_from_nemo(config).decoding.max_symbols == 10


def test_preprocessor_switches_are_honoured(nemo_config):
    cfg = model_config_from_nemo(
        changed(nemo_config, preprocessor={"preemph": None, "mag_power": 1.0, "log_zero_guard_value": "tiny"})
    )
    assert cfg.features.preemph == 0 and cfg.features.mag_power == 1.0 and cfg.features.log_zero_guard < 1e-37
    default = model_config_from_nemo(nemo_config).features
    audio = torch.randn(1, 16000)
    lengths = torch.tensor([16000])
    a, _ = LogMel(default)(audio, lengths)
    b, _ = LogMel(cfg.features)(audio, lengths)
    assert not torch.allclose(a, b)


@pytest.mark.parametrize(
    "section,key,value,named",
    [
        ("encoder", "reduction", "pooling", "reduction"),
        ("encoder", "global_tokens", 4, "global_tokens"),
        ("encoder", "conv_context_size", "causal", "conv_context_size"),
        ("preprocessor", "exact_pad", True, "exact_pad"),
        ("preprocessor", "log_zero_guard_type", "clamp", "log_zero_guard_type"),
        ("tokenizer", "type", "wpe", "tokenizer"),
        ("decoding", "durations", ["a", "b"], "durations"),
        ("decoder", "prednet", {"pred_hidden": 48, "pred_rnn_layers": 2, "rnn_hidden_size": 96}, "rnn_hidden_size"),
    ],
)
def test_unsupported_switches_are_named(nemo_config, section, key, value, named):
    with pytest.raises(UnsupportedModelError, match=named):
        model_config_from_nemo(changed(nemo_config, **{section: {key: value}}))


def test_symmetric_conv_context_is_accepted(nemo_config):
    model_config_from_nemo(changed(nemo_config, encoder={"conv_context_size": [4, 4]}))


def test_saved_positional_buffer_is_ignored(nemo_config):
    module = Transducer(model_config_from_nemo(nemo_config))
    state = dict(module.state_dict())
    state["encoder.pos_enc.pe"] = torch.zeros(1, 9999, 64)  # older NeMo versions saved it
    load_state(module, state, "old.nemo")


# ---------------------------------------------------------------------------- models that are not Parakeet transducers

# Minimal configs with the switches NeMo's own configs set: Canary (examples/asr/conf/speech_multitask/
# fast-conformer_aed.yaml: EncDecMultiTaskModel, a transf_decoder section, an aggregate tokenizer without
# model_path), CTC (EncDecCTCModelBPE, decoder ConvASRDecoder, no joint), cache-aware streaming
# (conf/fastconformer/cache_aware_streaming/*: att_context_style chunked_limited, conv_context_size causal,
# causal_downsampling true, normalize "NA"). Several att_context_size lists alone are multi-lookahead training,
# not streaming: inference uses the first (tests/test_local_attention.py).
CANARY = {
    "target": "nemo.collections.asr.models.aed_multitask_models.EncDecMultiTaskModel",
    "tokenizer": {"type": "agg", "langs": {"en": {"type": "bpe", "dir": "/x"}}},
    "preprocessor": {"_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor"},
    "encoder": {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "d_model": 1024},
    "transf_decoder": {"_target_": "nemo.collections.asr.modules.transformer.get_nemo_transformer"},
}
CTC = {
    "target": "nemo.collections.asr.models.ctc_bpe_models.EncDecCTCModelBPE",
    "tokenizer": {"type": "bpe", "model_path": "nemo:abc_tokenizer.model"},
    "encoder": {"_target_": "nemo.collections.asr.modules.ConformerEncoder", "d_model": 1024},
    "decoder": {"_target_": "nemo.collections.asr.modules.ConvASRDecoder", "feat_in": 1024, "num_classes": 1024},
}


@pytest.mark.parametrize(
    "config,named",
    [
        (CANARY, "a Canary (attention encoder-decoder) model (EncDecMultiTaskModel)"),
        ({k: v for k, v in CANARY.items() if k != "target"}, "a Canary (attention encoder-decoder) model"),
        (CTC, "a CTC model (EncDecCTCModelBPE)"),
        ({k: v for k, v in CTC.items() if k != "target"}, "a CTC model (ConvASRDecoder)"),
        (
            {**CTC, "target": "nemo.collections.asr.models.EncDecSpeakerLabelModel"},
            "EncDecSpeakerLabelModel model, not a",
        ),
    ],
    ids=["canary", "canary_untargeted", "ctc", "ctc_untargeted", "speaker"],
)
def test_other_model_kinds_are_named(config, named):
    with pytest.raises(UnsupportedModelError) as err:
        model_config_from_nemo(config)
    assert named in str(err.value)
    assert "Parakeet transducers (TDT, RNN-T" in str(err.value)


@pytest.mark.parametrize(
    "encoder,named",
    [
        ({"att_context_size": [70, 13], "att_context_style": "chunked_limited"}, "att_context_style=chunked_limited"),
        ({"conv_context_size": "causal"}, "conv_context_size=causal"),
        ({"causal_downsampling": True}, "causal_downsampling=true"),
    ],
)
def test_part_of_cache_aware_streaming_is_named(nemo_config, encoder, named):
    """A cache-aware model sets the three switches together (tests/test_cache_aware.py loads one): one alone is
    no model NeMo streams."""
    config = changed(nemo_config, encoder=encoder, preprocessor={"normalize": "NA"})
    with pytest.raises(UnsupportedModelError) as err:
        model_config_from_nemo(config)
    assert str(err.value).startswith("encoder: a cache-aware streaming model needs all of ")
    assert str(err.value).endswith(f"this one has only {named}")


def test_cache_aware_streaming_is_read(nemo_config):
    config = changed(
        nemo_config,
        encoder={
            "att_context_size": [[70, 13], [70, 6], [70, 1], [70, 0]],
            "att_context_style": "chunked_limited",
            "conv_context_size": "causal",
            "causal_downsampling": True,
            "conv_norm_type": "layer_norm",
        },
        preprocessor={"normalize": "NA"},
    )
    cfg = model_config_from_nemo(config)
    assert cfg.encoder.streaming_contexts == ((70, 13), (70, 6), (70, 1), (70, 0))
    assert cfg.encoder.cache_aware and cfg.encoder.conv_layer_norm and not cfg.features.normalize
    assert cfg.encoder.local_context is None


def test_hybrid_tdt_ctc_is_a_transducer(nemo_config):
    config = copy.deepcopy(nemo_config)
    config["target"] = "nemo.collections.asr.models.hybrid_rnnt_ctc_bpe_models.EncDecHybridRNNTCTCBPEModel"
    config["aux_ctc"] = {"decoder": {"_target_": "nemo.collections.asr.modules.ConvASRDecoder"}}
    assert model_config_from_nemo(config) == model_config_from_nemo(nemo_config)


def _released(mels: int, layers: int, xscaling: bool, use_bias: bool, vocab: int, durations: tuple[int, ...]):
    """A released checkpoint's ModelConfig: what they share written out once, what differs as arguments."""
    return ModelConfig(
        features=FeatureConfig(
            sample_rate=16000, n_mels=mels, n_fft=512, win_length=400, hop_length=160, preemph=0.97, mag_power=2.0
        ),
        encoder=EncoderConfig(
            n_mels=mels,
            d_model=1024,
            n_layers=layers,
            n_heads=8,
            ff_expansion=4,
            conv_kernel=9,
            subsampling_factor=8,
            subsampling_channels=256,
            xscaling=xscaling,
            use_bias=use_bias,
            local_context=None,
        ),
        prediction=PredictionConfig(vocab_size=vocab, hidden=640, layers=2),
        joint=JointConfig(
            encoder_hidden=1024,
            pred_hidden=640,
            hidden=640,
            vocab_size=vocab,
            num_durations=len(durations),
            dropout_layer=True,
        ),
        decoding=DecodingConfig(durations=durations, max_symbols=10),
    )


RELEASED = {  # fixtures/configs/README.md names the source of every field
    "parakeet-tdt-0.6b-v2": _released(128, 24, False, False, 1024, (0, 1, 2, 3, 4)),
    "parakeet-tdt-0.6b-v3": _released(128, 24, False, False, 8192, (0, 1, 2, 3, 4)),
    "parakeet-rnnt-0.6b": _released(80, 24, True, True, 1024, ()),
    "parakeet-tdt-1.1b": _released(80, 42, False, True, 1024, (0, 1, 2, 3, 4)),
}


@pytest.mark.parametrize("name", list(RELEASED))
def test_released_configs_read_into_their_dataclasses(name):
    """NVIDIA's released checkpoints' config fields (transcribed in fixtures/configs) give their known shapes."""
    raw = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
    cfg = model_config_from_nemo(raw)
    assert cfg == RELEASED[name]
    assert cfg.blank_id == RELEASED[name].prediction.vocab_size
    assert cfg.decoding.is_tdt == (name != "parakeet-rnnt-0.6b")
