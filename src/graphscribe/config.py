"""Model configuration as data, built from a checkpoint's own `model_config.yaml`.

One frozen dataclass per component, nested in `ModelConfig`. `model_config_from_nemo`
reads NeMo's config dict, checks that every switch is one we implement, and fails with
one line naming the switch otherwise. Runtime choices (device, dtype, graphs, batch
size) live apart, in `RunOptions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


class UnsupportedModelError(ValueError):
    """The checkpoint asks for a component or a switch that graphscribe does not implement."""


@dataclass(frozen=True)
class FeatureConfig:
    sample_rate: int = 16000  # Hz
    n_mels: int = 128
    n_fft: int = 512  # samples
    win_length: int = 400  # samples, 25 ms
    hop_length: int = 160  # samples, 10 ms
    preemph: float = 0.97  # 0: none
    mag_power: float = 2.0  # |STFT| ** mag_power
    log_zero_guard: float = 2**-24
    std_guard: float = 1e-5  # added to the per-feature std


@dataclass(frozen=True)
class EncoderConfig:
    n_mels: int = 128
    d_model: int = 1024
    n_layers: int = 24
    n_heads: int = 8
    ff_expansion: int = 4
    conv_kernel: int = 9
    subsampling_factor: int = 8
    subsampling_channels: int = 256
    xscaling: bool = False
    use_bias: bool = False
    # NeMo's rel_pos_local_attn: (left, right) frames each query sees; None: full attention (rel_pos)
    local_context: tuple[int, int] | None = None

    @property
    def d_k(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class PredictionConfig:
    vocab_size: int = 8192  # without blank; blank id == vocab_size
    hidden: int = 640
    layers: int = 2


@dataclass(frozen=True)
class JointConfig:
    encoder_hidden: int = 1024
    pred_hidden: int = 640
    hidden: int = 640
    vocab_size: int = 8192  # without blank
    num_durations: int = 5  # extra outputs after the token logits (0 for RNN-T)


@dataclass(frozen=True)
class DecodingConfig:
    durations: tuple[int, ...] = (0, 1, 2, 3, 4)  # empty for plain RNN-T
    max_symbols: int = 10  # tokens on one frame before the frame is forced on
    # word and segment timestamps (NeMo's decoding word_seperator, segment_seperators, segment_gap_threshold)
    word_separator: str = " "
    segment_separators: tuple[str, ...] = (".", "?", "!")
    segment_gap: int | None = None  # encoder frames; None: segments end only at separators

    @property
    def is_tdt(self) -> bool:
        return len(self.durations) > 0


@dataclass(frozen=True)
class ModelConfig:
    features: FeatureConfig = field(default_factory=FeatureConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    prediction: PredictionConfig = field(default_factory=PredictionConfig)
    joint: JointConfig = field(default_factory=JointConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)

    @property
    def blank_id(self) -> int:
        return self.prediction.vocab_size

    @property
    def frame_seconds(self) -> float:
        """Duration of one encoder frame (hop times subsampling)."""
        return self.features.hop_length * self.encoder.subsampling_factor / self.features.sample_rate


@dataclass(frozen=True)
class RunOptions:
    """How to run a model: changed with `dataclasses.replace`, never mutated."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    graphs: bool = True  # replay captured CUDA graphs for decoding (CUDA only)
    batch_size: int | None = None  # inputs per batch; None: the device's default
    batch_seconds: float | None = None  # padded audio seconds per batch at most; 0: no cap; None: the device's default
    attention: str = "auto"  # auto | full | local (see encoder.py and model.py `Model.attention_for`)
    attention_window: int = 256  # encoder frames on each side when a full-attention checkpoint runs local


# ---------------------------------------------------------------------------- reading NeMo's config

_INTERPOLATION = re.compile(r"^\$\{([^${}]+)\}$")


def resolve_interpolations(node: Any, root: dict) -> Any:
    """Resolve OmegaConf-style `${a.b}` references against `root`; unresolvable ones stay as text."""
    if isinstance(node, dict):
        return {k: resolve_interpolations(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve_interpolations(v, root) for v in node]
    if isinstance(node, str):
        match = _INTERPOLATION.match(node.strip())
        if match:
            path = match.group(1).strip()
            for candidate in (path, path.removeprefix("model.")):
                found = _lookup(root, candidate)
                if found is not None:
                    return resolve_interpolations(found, root)
    return node


def _lookup(root: dict, dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _short_target(section: dict) -> str:
    return str(section.get("_target_", "")).rsplit(".", 1)[-1]


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise UnsupportedModelError(what)


def _int(section: dict, key: str, default: Any = None, where: str = "") -> int:
    value = section.get(key, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UnsupportedModelError(f"config {where}.{key} should be a number, got {value!r}") from None


def _float(section: dict, key: str, default: float, where: str) -> float:
    """A float switch; null (as NeMo writes "off") reads as 0."""
    value = section.get(key, default)
    try:
        return 0.0 if value is None else float(value)
    except (TypeError, ValueError):
        raise UnsupportedModelError(f"config {where}.{key} should be a number, got {value!r}") from None


def _log_zero_guard(value) -> float:
    """NeMo's log_zero_guard_value: a number, or 'tiny' / 'eps' of float32."""
    named = {"tiny": 1.1754943508222875e-38, "eps": 1.1920928955078125e-07}
    if isinstance(value, str) and value in named:
        return named[value]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UnsupportedModelError(f"config preprocessor.log_zero_guard_value={value!r} is not a number") from None


def model_config_from_nemo(raw: dict) -> ModelConfig:
    """Build a `ModelConfig` from NeMo's `model_config.yaml` (already parsed)."""
    cfg = resolve_interpolations(raw, raw)
    for key in ("preprocessor", "encoder", "decoder", "joint"):
        _require(isinstance(cfg.get(key), dict), f"config has no '{key}' section: not a NeMo transducer checkpoint")
    pre, enc, dec, joint = cfg["preprocessor"], cfg["encoder"], cfg["decoder"], cfg["joint"]
    decoding = cfg.get("decoding") or {}

    _require(
        _short_target(pre) in ("AudioToMelSpectrogramPreprocessor", ""),
        f"preprocessor {_short_target(pre)} is not supported (only AudioToMelSpectrogramPreprocessor)",
    )
    _require(
        pre.get("normalize", "per_feature") == "per_feature",
        f"preprocessor normalize={pre.get('normalize')!r} is not supported (only per_feature)",
    )
    _require(int(pre.get("frame_splicing", 1) or 1) == 1, "preprocessor frame_splicing > 1 is not supported")
    _require(pre.get("log", True) is True, "preprocessor log=false is not supported")
    _require(
        pre.get("log_zero_guard_type", "add") == "add",
        f"preprocessor log_zero_guard_type={pre.get('log_zero_guard_type')!r} is not supported (only add)",
    )
    _require(not pre.get("exact_pad", False), "preprocessor exact_pad=true is not supported")
    sample_rate = _int(pre, "sample_rate", cfg.get("sample_rate", 16000), "preprocessor")
    features = FeatureConfig(
        sample_rate=sample_rate,
        n_mels=_int(pre, "features", 128, "preprocessor"),
        n_fft=_int(pre, "n_fft", 512, "preprocessor"),
        win_length=round(float(pre.get("window_size", 0.025)) * sample_rate),
        hop_length=round(float(pre.get("window_stride", 0.01)) * sample_rate),
        preemph=_float(pre, "preemph", 0.97, "preprocessor"),
        mag_power=_float(pre, "mag_power", 2.0, "preprocessor"),
        log_zero_guard=_log_zero_guard(pre.get("log_zero_guard_value", 2**-24)),
    )

    _require(
        _short_target(enc) == "ConformerEncoder",
        f"encoder {_short_target(enc) or '?'} is not supported (only ConformerEncoder)",
    )
    _require(
        enc.get("subsampling", "dw_striding") == "dw_striding",
        f"encoder subsampling={enc.get('subsampling')!r} is not supported (only dw_striding)",
    )
    local_context = _local_context(enc)
    _require(
        enc.get("conv_norm_type", "batch_norm") == "batch_norm",
        f"encoder conv_norm_type={enc.get('conv_norm_type')!r} is not supported (only batch_norm)",
    )
    _require(enc.get("untie_biases", True) is True, "encoder untie_biases=false is not supported")
    _require(not enc.get("causal_downsampling", False), "encoder causal_downsampling is not supported")
    _require(int(enc.get("feat_out", -1) or -1) == -1, "encoder feat_out (an output projection) is not supported")
    _require(enc.get("reduction") in (None, "null"), f"encoder reduction={enc.get('reduction')!r} is not supported")
    _require(not enc.get("global_tokens", 0), "encoder global_tokens (Longformer's global attention) is not supported")
    _require(
        not enc.get("global_attn_separate", False),
        "encoder global_attn_separate=true (Longformer's global attention) is not supported",
    )
    _require(
        enc.get("conv_context_size") in (None, "null")
        or list(enc["conv_context_size"]) == [(int(enc.get("conv_kernel_size", 31)) - 1) // 2] * 2,
        f"encoder conv_context_size={enc.get('conv_context_size')!r} is not supported (only symmetric)",
    )
    d_model = _int(enc, "d_model", where="encoder")
    channels = _int(enc, "subsampling_conv_channels", -1, "encoder")
    encoder = EncoderConfig(
        n_mels=_int(enc, "feat_in", features.n_mels, "encoder"),
        d_model=d_model,
        n_layers=_int(enc, "n_layers", where="encoder"),
        n_heads=_int(enc, "n_heads", 4, "encoder"),
        ff_expansion=_int(enc, "ff_expansion_factor", 4, "encoder"),
        conv_kernel=_int(enc, "conv_kernel_size", 31, "encoder"),
        subsampling_factor=_int(enc, "subsampling_factor", 4, "encoder"),
        subsampling_channels=d_model if channels == -1 else channels,
        xscaling=bool(enc.get("xscaling", True)),
        use_bias=bool(enc.get("use_bias", True)),
        local_context=local_context,
    )
    _require(
        encoder.n_mels == features.n_mels,
        f"encoder feat_in={encoder.n_mels} does not match preprocessor features={features.n_mels}",
    )
    factor = encoder.subsampling_factor
    _require(factor >= 2 and factor & (factor - 1) == 0, f"encoder subsampling_factor={factor} is not a power of 2")
    _require(d_model % encoder.n_heads == 0, f"encoder d_model={d_model} is not divisible by n_heads={encoder.n_heads}")

    _require(
        _short_target(dec) == "RNNTDecoder", f"decoder {_short_target(dec) or '?'} is not supported (only RNNTDecoder)"
    )
    _require(dec.get("blank_as_pad", True) is True, "decoder blank_as_pad=false is not supported")
    _require(dec.get("normalization_mode") in (None, "null"), "decoder normalization_mode is not supported")
    prednet = dec.get("prednet") or {}
    _require(
        prednet.get("rnn_hidden_size", -1) in (None, -1, prednet.get("pred_hidden")),
        f"decoder.prednet rnn_hidden_size={prednet.get('rnn_hidden_size')} (a projected LSTM) is not supported",
    )
    prediction = PredictionConfig(
        vocab_size=_int(dec, "vocab_size", where="decoder"),
        hidden=_int(prednet, "pred_hidden", where="decoder.prednet"),
        layers=_int(prednet, "pred_rnn_layers", 1, "decoder.prednet"),
    )

    _require(
        _short_target(joint) == "RNNTJoint", f"joint {_short_target(joint) or '?'} is not supported (only RNNTJoint)"
    )
    jointnet = joint.get("jointnet") or {}
    _require(
        jointnet.get("activation", "relu") == "relu",
        f"joint activation={jointnet.get('activation')!r} is not supported (only relu)",
    )
    num_extra = _int(joint, "num_extra_outputs", 0, "joint")
    listed = (
        decoding.get("durations")
        or (cfg.get("model_defaults") or {}).get("tdt_durations")
        or ((cfg.get("loss") or {}).get("tdt_kwargs") or {}).get("durations")
        or []
    )
    model_type = str(decoding.get("model_type") or ("tdt" if num_extra and listed else "rnnt"))
    try:
        durations = tuple(int(d) for d in listed) if model_type == "tdt" else ()
    except (TypeError, ValueError):
        raise UnsupportedModelError(f"TDT durations {listed!r} are not a list of whole numbers") from None
    _require(
        num_extra == len(durations),
        f"joint has {num_extra} extra outputs but decoding lists {len(durations)} TDT durations",
    )
    _require(model_type in ("tdt", "rnnt"), f"decoding model_type={model_type!r} is not supported (tdt or rnnt)")
    if durations:
        _require(min(durations) >= 0, f"TDT durations {list(durations)} must not be negative")
        _require(max(durations) >= 1, f"TDT durations {list(durations)} must include one of 1 or more")
    joint_cfg = JointConfig(
        encoder_hidden=_int(jointnet, "encoder_hidden", d_model, "joint.jointnet"),
        pred_hidden=_int(jointnet, "pred_hidden", prediction.hidden, "joint.jointnet"),
        hidden=_int(jointnet, "joint_hidden", where="joint.jointnet"),
        vocab_size=_int(joint, "num_classes", prediction.vocab_size, "joint"),
        num_durations=len(durations),
    )
    _require(
        joint_cfg.vocab_size == prediction.vocab_size,
        f"joint num_classes={joint_cfg.vocab_size} does not match decoder vocab_size={prediction.vocab_size}",
    )
    tokenizer_type = (cfg.get("tokenizer") or {}).get("type", "bpe")
    _require(tokenizer_type == "bpe", f"tokenizer type {tokenizer_type!r} is not supported (only SentencePiece bpe)")
    greedy = decoding.get("greedy") or {}
    max_symbols = greedy.get("max_symbols", greedy.get("max_symbols_per_step", 10))
    return ModelConfig(
        features=features,
        encoder=encoder,
        prediction=prediction,
        joint=joint_cfg,
        decoding=DecodingConfig(
            durations=durations, max_symbols=int(max_symbols) if max_symbols else 10, **_timestamp_options(decoding)
        ),
    )


def _local_context(enc: dict) -> tuple[int, int] | None:
    """The encoder's attention: None for full-context rel_pos, (left, right) frames for rel_pos_local_attn."""
    kind = enc.get("self_attention_model", "rel_pos")
    context = enc.get("att_context_size") or [-1, -1]
    if context and isinstance(context[0], (list, tuple)):
        context = context[0]  # several context sizes (multi-lookahead training): inference uses the first
    try:
        left, right = (int(c) for c in context)
    except (TypeError, ValueError):
        raise UnsupportedModelError(
            f"encoder att_context_size={enc.get('att_context_size')} is not [left, right]"
        ) from None
    if kind == "rel_pos":
        _require(
            (left, right) == (-1, -1),
            f"encoder att_context_size={[left, right]} with rel_pos is not supported (only full context [-1, -1])",
        )
        return None
    _require(
        kind == "rel_pos_local_attn",
        f"encoder self_attention_model={kind!r} is not supported (only rel_pos and rel_pos_local_attn)",
    )
    _require(max(left, right) > 0, f"encoder att_context_size={[left, right]}: local attention needs a context above 0")
    _require(
        min(left, right) >= 0,
        f"encoder att_context_size={[left, right]} with rel_pos_local_attn is not supported (no unlimited side)",
    )
    return left, right


def _timestamp_options(decoding: dict) -> dict:
    """The decoding config's word/segment settings that NeMo's timestamps honour, where the checkpoint sets them."""
    options = {}
    if isinstance(decoding.get("word_seperator"), str) and decoding["word_seperator"]:
        options["word_separator"] = decoding["word_seperator"]
    if decoding.get("segment_seperators") is not None:
        options["segment_separators"] = tuple(str(s) for s in decoding["segment_seperators"])
    if decoding.get("segment_gap_threshold") is not None:
        options["segment_gap"] = _int(decoding, "segment_gap_threshold", where="decoding")
    return options
