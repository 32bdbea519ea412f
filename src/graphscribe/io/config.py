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
    normalize: bool = True  # per_feature; False: NeMo's "NA" (raw log-mel, padding frames 0.0), as streaming models


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
    # cache-aware streaming (NeMo's conf/fastconformer/cache_aware_streaming): the (left, lookahead) attention
    # contexts the model was trained with, the first the default (`att_context_style: chunked_limited`); empty for
    # a full-context model. Such an encoder has causal subsampling and causal depthwise convolutions.
    streaming_contexts: tuple[tuple[int, int], ...] = ()
    conv_layer_norm: bool = False  # conv_norm_type: layer_norm (streaming models) instead of batch_norm

    @property
    def cache_aware(self) -> bool:
        return bool(self.streaming_contexts)

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
    dropout_layer: bool = True  # NeMo trained it with jointnet.dropout > 0: the output layer is joint_net.2, else .1


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


# Default files per batch: on CUDA by the model's dtype, the fastest with the plain command (a 0.6b model on an
# H100, LibriSpeech-like files; see bench/README.md): in float32 32 rows (64 are 4% slower), in 16 bits 64 rows
# (128 and 256 are no faster, and a new size class's first uses cost more).
BATCH_FILES = {"cuda-float32": 32, "cuda-16bit": 64, "cpu": 8}

# Default caps on padded audio per batch. A 0.6b model's features and encoder take about 7 MB per padded second in
# float32 (measured on the CPU; the first subsampling convolution's output is the largest tensor), so 40 s per GiB
# of GPU memory uses about a quarter of it (3200 s, ~22 GB, on an 80 GB H100).
SECONDS_PER_GIB = 40.0
CPU_BATCH_SECONDS = 120.0  # ~0.8 GB
ATTENTION_WINDOW = 256  # encoder frames on each side when a full-attention checkpoint runs local attention


def default_batch_files(device_type: str, sixteen_bit: bool) -> int:
    """Files per batch when not given (BATCH_FILES) for a model on `device_type` ("cuda" or "cpu") in 16 bits or
    float32."""
    if device_type == "cuda":
        return BATCH_FILES["cuda-16bit" if sixteen_bit else "cuda-float32"]
    return BATCH_FILES["cpu"]


# NVIDIA's streaming config for parakeet-tdt-0.6b-v3 (NeMo's examples/asr/conf/asr_streaming_inference)
CHUNK_SECONDS = 0.8
LEFT_SECONDS = 9.6
RIGHT_SECONDS = 1.6
STOP_HISTORY_MS = 800  # silence that ends an utterance (NeMo's endpointing.stop_history_eou)
RESIDUE_TOKENS = 2  # frames at a step's end not counted as silence yet (endpointing.residue_tokens_at_end)

# What one file may decode to, by default (`--max-audio-hours`): its size says little (an hour of Opus fits in 3 MB,
# 7 h of silent FLAC in 1.3 MB). Twice the longest the model cards claim (3 h, local attention); 6 h of 48 kHz mono
# float32 is 4 GB. io/audio.py refuses more from the header where it gives the length, else once decoding passes it.
MAX_AUDIO_SECONDS = 6 * 3600


# ---------------------------------------------------------------------------- reading NeMo's config

_INTERPOLATION = re.compile(r"^\$\{([^${}]+)\}$")
MAX_CONFIG_NODES = 1_000_000  # values in the config once references are expanded; NeMo's configs have a few thousand
MAX_REFERENCE_CHAIN = 32  # `${a}` -> `${b}` -> ...; NeMo's configs chain two or three
MAX_CONFIG_DEPTH = 64  # nested sections and lists; NeMo's configs nest about 6 deep
# Bounds on sizes: far above any released model (d_model 1024, 42 layers, 8192 pieces), low enough that a hostile
# config cannot ask for unbounded memory or time before its weights are compared with it.
MAX_WIDTH = 1 << 16  # d_model, hidden sizes, channels, mels, n_fft
MAX_LAYERS = 512
MAX_VOCAB = 1 << 20


def resolve_interpolations(node: Any, root: dict) -> Any:
    """Resolve OmegaConf-style `${a.b}` references against `root`; unresolvable ones stay as text.

    A reference that leads back to itself, a chain longer than MAX_REFERENCE_CHAIN, nesting deeper
    than MAX_CONFIG_DEPTH or a result of more than MAX_CONFIG_NODES values (references and YAML
    aliases expand: a "billion laughs" config) is refused with one line naming the key.
    """
    return _Resolver(root).resolve(node, (), ())


class _Resolver:
    def __init__(self, root: dict):
        self.root = root
        self.nodes = 0

    def resolve(self, node: Any, key: tuple[str, ...], chain: tuple[str, ...]) -> Any:
        self.nodes += 1
        if self.nodes > MAX_CONFIG_NODES:
            raise UnsupportedModelError(
                f"config {_dotted(key)}: the config expands to more than {MAX_CONFIG_NODES} values (an alias bomb?)"
            )
        if len(key) > MAX_CONFIG_DEPTH:
            raise UnsupportedModelError(f"config {_dotted(key[:3])}...: nested more than {MAX_CONFIG_DEPTH} deep")
        if isinstance(node, dict):
            return {k: self.resolve(v, (*key, str(k)), chain) for k, v in node.items()}
        if isinstance(node, list):
            return [self.resolve(v, (*key, str(i)), chain) for i, v in enumerate(node)]
        if isinstance(node, str):
            match = _INTERPOLATION.match(node.strip())
            if match:
                path = match.group(1).strip()
                for candidate in (path, path.removeprefix("model.")):
                    found = _lookup(self.root, candidate)
                    if found is None:
                        continue
                    if candidate in chain or candidate == _dotted(key):
                        raise UnsupportedModelError(f"config {_dotted(key)}: ${{{path}}} refers back to itself")
                    if len(chain) >= MAX_REFERENCE_CHAIN:
                        raise UnsupportedModelError(
                            f"config {_dotted(key)}: references chained more than {MAX_REFERENCE_CHAIN} deep"
                        )
                    return self.resolve(found, key, (*chain, candidate, _dotted(key)))
        return node


def _dotted(key: tuple[str, ...]) -> str:
    return ".".join(key) or "(top level)"


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


def _int(
    section: dict, key: str, default: Any = None, where: str = "", low: int | None = None, high: int | None = None
) -> int:
    """A whole number; with `low`/`high`, one in that range (sizes: checked before anything is built from them)."""
    value = section.get(key, default)
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        raise UnsupportedModelError(f"config {where}.{key} should be a number, got {value!r}") from None
    if (low is not None and number < low) or (high is not None and number > high):
        raise UnsupportedModelError(f"config {where}.{key}={number} is out of range ({low}..{high})")
    return number


def _size(section: dict, key: str, default: Any, where: str, high: int = MAX_WIDTH) -> int:
    return _int(section, key, default, where, low=1, high=high)


def _section(parent: dict, key: str, where: str = "") -> dict:
    """A sub-section of the config: a mapping, or empty where it is missing or null."""
    value = parent.get(key)
    if value is None:
        return {}
    _require(isinstance(value, dict), f"config {where}{key} should be a section, got {type(value).__name__}")
    return value


def _float(section: dict, key: str, default: float, where: str) -> float:
    """A float switch; null (as NeMo writes "off") reads as 0."""
    value = section.get(key, default)
    try:
        return 0.0 if value is None else float(value)
    except (TypeError, ValueError, OverflowError):
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


# the small model shipped in the package (graphscribe/data/demo.nemo); named here, as checkpoint.py imports torch
DEMO_NAME = "demo"
SUPPORTED_MODELS = (
    "graphscribe runs Parakeet transducers (TDT, RNN-T, hybrid TDT/RNN-T + CTC), full-context or cache-aware "
    "streaming, only"
)


def model_kind_problem(cfg: dict) -> str | None:
    """Why the model a NeMo config describes is not one graphscribe runs (Canary, CTC), or None.

    Read from the model class NeMo saves as `target` (a hybrid `EncDecHybridRNNTCTC*` model is a
    transducer with an extra CTC head, which is ignored).
    """
    target = str(cfg.get("target") or cfg.get("_target_") or "").rsplit(".", 1)[-1]
    sections = {key for key, value in cfg.items() if isinstance(value, dict)}
    decoder = _short_target(cfg["decoder"]) if "decoder" in sections else ""
    if "MultiTask" in target or "transf_decoder" in sections:
        return f"a Canary (attention encoder-decoder) model ({target or 'transf_decoder'}); {SUPPORTED_MODELS}"
    if ("CTC" in target and "RNNT" not in target) or (not target and decoder == "ConvASRDecoder"):
        return f"a CTC model ({target or decoder}); {SUPPORTED_MODELS}"
    if target and "RNNT" not in target:
        return f"a {target} model, not a transducer; {SUPPORTED_MODELS}"
    return None


def model_config_from_nemo(raw: dict) -> ModelConfig:
    """Build a `ModelConfig` from NeMo's `model_config.yaml` (already parsed)."""
    cfg = resolve_interpolations(raw, raw)
    problem = model_kind_problem(cfg)
    _require(problem is None, problem or "")
    for key in ("preprocessor", "encoder", "decoder", "joint"):
        _require(isinstance(cfg.get(key), dict), f"config has no '{key}' section: not a NeMo transducer checkpoint")
    pre, enc, dec, joint = cfg["preprocessor"], cfg["encoder"], cfg["decoder"], cfg["joint"]
    decoding = _section(cfg, "decoding")

    _require(
        _short_target(pre) in ("AudioToMelSpectrogramPreprocessor", ""),
        f"preprocessor {_short_target(pre)} is not supported (only AudioToMelSpectrogramPreprocessor)",
    )
    _require(
        pre.get("normalize", "per_feature") in ("per_feature", "NA"),
        f"preprocessor normalize={pre.get('normalize')!r} is not supported (only per_feature and NA)",
    )
    _require(
        _int(pre, "frame_splicing", 1, "preprocessor") in (0, 1), "preprocessor frame_splicing > 1 is not supported"
    )
    _require(pre.get("log", True) is True, "preprocessor log=false is not supported")
    _require(
        pre.get("log_zero_guard_type", "add") == "add",
        f"preprocessor log_zero_guard_type={pre.get('log_zero_guard_type')!r} is not supported (only add)",
    )
    _require(not pre.get("exact_pad", False), "preprocessor exact_pad=true is not supported")
    sample_rate = _int(pre, "sample_rate", cfg.get("sample_rate", 16000), "preprocessor", low=1000, high=192_000)
    win_length = round(_float(pre, "window_size", 0.025, "preprocessor") * sample_rate)
    hop_length = round(_float(pre, "window_stride", 0.01, "preprocessor") * sample_rate)
    n_fft = _size(pre, "n_fft", 512, "preprocessor")
    _require(
        1 <= hop_length and 1 <= win_length <= n_fft,
        f"config preprocessor window_size/window_stride give a window of {win_length} and a hop of {hop_length} "
        f"samples: the window must be 1..n_fft={n_fft} and the hop at least 1",
    )
    features = FeatureConfig(
        sample_rate=sample_rate,
        n_mels=_size(pre, "features", 128, "preprocessor"),
        n_fft=n_fft,
        win_length=win_length,
        hop_length=hop_length,
        preemph=_float(pre, "preemph", 0.97, "preprocessor"),
        mag_power=_float(pre, "mag_power", 2.0, "preprocessor"),
        log_zero_guard=_log_zero_guard(pre.get("log_zero_guard_value", 2**-24)),
        normalize=pre.get("normalize", "per_feature") == "per_feature",
    )

    _require(
        _short_target(enc) == "ConformerEncoder",
        f"encoder {_short_target(enc) or '?'} is not supported (only ConformerEncoder)",
    )
    _require(
        enc.get("subsampling", "dw_striding") == "dw_striding",
        f"encoder subsampling={enc.get('subsampling')!r} is not supported (only dw_striding)",
    )
    streaming_contexts = _streaming_contexts(enc)
    local_context = None if streaming_contexts else _local_context(enc)
    _require(
        enc.get("conv_norm_type", "batch_norm") in ("batch_norm", "layer_norm"),
        f"encoder conv_norm_type={enc.get('conv_norm_type')!r} is not supported (only batch_norm and layer_norm)",
    )
    _require(enc.get("untie_biases", True) is True, "encoder untie_biases=false is not supported")
    _require(
        _int(enc, "feat_out", -1, "encoder") in (0, -1), "encoder feat_out (an output projection) is not supported"
    )
    _require(enc.get("reduction") in (None, "null"), f"encoder reduction={enc.get('reduction')!r} is not supported")
    _require(not enc.get("global_tokens", 0), "encoder global_tokens (Longformer's global attention) is not supported")
    _require(
        not enc.get("global_attn_separate", False),
        "encoder global_attn_separate=true (Longformer's global attention) is not supported",
    )
    _require(
        streaming_contexts
        or enc.get("conv_context_size") in (None, "null")
        or list(enc["conv_context_size"]) == [(int(enc.get("conv_kernel_size", 31)) - 1) // 2] * 2,
        f"encoder conv_context_size={enc.get('conv_context_size')!r} is not supported (only symmetric, or causal "
        "in a cache-aware streaming model)",
    )
    d_model = _size(enc, "d_model", None, "encoder")
    channels = _int(enc, "subsampling_conv_channels", -1, "encoder", low=-1, high=MAX_WIDTH)
    _require(channels != 0, "config encoder.subsampling_conv_channels=0 is out of range")
    encoder = EncoderConfig(
        n_mels=_size(enc, "feat_in", features.n_mels, "encoder"),
        d_model=d_model,
        n_layers=_size(enc, "n_layers", None, "encoder", MAX_LAYERS),
        n_heads=_size(enc, "n_heads", 4, "encoder", d_model),
        ff_expansion=_size(enc, "ff_expansion_factor", 4, "encoder", 64),
        conv_kernel=_size(enc, "conv_kernel_size", 31, "encoder", 1023),
        subsampling_factor=_size(enc, "subsampling_factor", 4, "encoder", 64),
        subsampling_channels=d_model if channels == -1 else channels,
        xscaling=bool(enc.get("xscaling", True)),
        use_bias=bool(enc.get("use_bias", True)),
        local_context=local_context,
        streaming_contexts=streaming_contexts,
        conv_layer_norm=enc.get("conv_norm_type") == "layer_norm",
    )
    _require(
        encoder.n_mels == features.n_mels,
        f"encoder feat_in={encoder.n_mels} does not match preprocessor features={features.n_mels}",
    )
    _require(encoder.conv_kernel % 2 == 1, f"encoder conv_kernel_size={encoder.conv_kernel} is not odd")
    factor = encoder.subsampling_factor
    _require(factor >= 2 and factor & (factor - 1) == 0, f"encoder subsampling_factor={factor} is not a power of 2")
    _require(d_model % encoder.n_heads == 0, f"encoder d_model={d_model} is not divisible by n_heads={encoder.n_heads}")

    _require(
        _short_target(dec) == "RNNTDecoder", f"decoder {_short_target(dec) or '?'} is not supported (only RNNTDecoder)"
    )
    _require(dec.get("blank_as_pad", True) is True, "decoder blank_as_pad=false is not supported")
    _require(dec.get("normalization_mode") in (None, "null"), "decoder normalization_mode is not supported")
    prednet = _section(dec, "prednet", "decoder.")
    _require(
        prednet.get("rnn_hidden_size", -1) in (None, -1, prednet.get("pred_hidden")),
        f"decoder.prednet rnn_hidden_size={prednet.get('rnn_hidden_size')} (a projected LSTM) is not supported",
    )
    prediction = PredictionConfig(
        vocab_size=_size(dec, "vocab_size", None, "decoder", MAX_VOCAB),
        hidden=_size(prednet, "pred_hidden", None, "decoder.prednet"),
        layers=_size(prednet, "pred_rnn_layers", 1, "decoder.prednet", 64),
    )

    _require(
        _short_target(joint) == "RNNTJoint", f"joint {_short_target(joint) or '?'} is not supported (only RNNTJoint)"
    )
    jointnet = _section(joint, "jointnet", "joint.")
    _require(
        jointnet.get("activation", "relu") == "relu",
        f"joint activation={jointnet.get('activation')!r} is not supported (only relu)",
    )
    num_extra = _int(joint, "num_extra_outputs", 0, "joint", low=0, high=1024)
    listed = (
        decoding.get("durations")
        or _section(cfg, "model_defaults").get("tdt_durations")
        or _section(_section(cfg, "loss"), "tdt_kwargs", "loss.").get("durations")
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
        encoder_hidden=_size(jointnet, "encoder_hidden", d_model, "joint.jointnet"),
        pred_hidden=_size(jointnet, "pred_hidden", prediction.hidden, "joint.jointnet"),
        hidden=_size(jointnet, "joint_hidden", None, "joint.jointnet"),
        vocab_size=_size(joint, "num_classes", prediction.vocab_size, "joint", MAX_VOCAB),
        num_durations=len(durations),
        dropout_layer=bool(_float(jointnet, "dropout", 0.0, "joint.jointnet")),
    )
    _require(
        joint_cfg.vocab_size == prediction.vocab_size,
        f"joint num_classes={joint_cfg.vocab_size} does not match decoder vocab_size={prediction.vocab_size}",
    )
    tokenizer_type = _section(cfg, "tokenizer").get("type", "bpe")
    _require(tokenizer_type == "bpe", f"tokenizer type {tokenizer_type!r} is not supported (only SentencePiece bpe)")
    greedy = _section(decoding, "greedy", "decoding.")
    max_symbols = greedy.get("max_symbols", greedy.get("max_symbols_per_step", 10))
    max_symbols = _int({"max_symbols": max_symbols or 10}, "max_symbols", where="decoding.greedy", low=1, high=1000)
    return ModelConfig(
        features=features,
        encoder=encoder,
        prediction=prediction,
        joint=joint_cfg,
        decoding=DecodingConfig(durations=durations, max_symbols=max_symbols, **_timestamp_options(decoding)),
    )


def _streaming_contexts(enc: dict) -> tuple[tuple[int, int], ...]:
    """A cache-aware streaming encoder's (left, lookahead) attention contexts, the default first; () for any other.

    NeMo's cache_aware_streaming configs set three switches together: chunked_limited attention, causal depthwise
    convolutions and causal subsampling. A config with some of them is not a model NeMo streams: refused."""
    switches = {
        "att_context_style=chunked_limited": enc.get("att_context_style") == "chunked_limited",
        "conv_context_size=causal": enc.get("conv_context_size") == "causal"
        or _is_list(enc.get("conv_context_size"), [int(enc.get("conv_kernel_size", 31)) - 1, 0]),
        "causal_downsampling=true": enc.get("causal_downsampling") is True,
    }
    if not any(switches.values()):
        _require(
            enc.get("att_context_style", "regular") == "regular",
            f"encoder att_context_style={enc.get('att_context_style')!r} is not supported",
        )
        return ()
    _require(
        all(switches.values()),
        "encoder: a cache-aware streaming model needs all of "
        + ", ".join(switches)
        + f"; this one has only {', '.join(k for k, on in switches.items() if on)}",
    )
    _require(
        enc.get("self_attention_model", "rel_pos") == "rel_pos",
        f"encoder self_attention_model={enc.get('self_attention_model')!r} in a streaming model is not supported "
        "(only rel_pos)",
    )
    _require(
        enc.get("subsampling", "dw_striding") == "dw_striding",
        f"encoder subsampling={enc.get('subsampling')!r} is not supported (only dw_striding)",
    )
    raw = enc.get("att_context_size")
    pairs = raw if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], (list, tuple)) else [raw]
    contexts = []
    for pair in pairs:
        try:
            left, right = (int(c) for c in pair)
        except (TypeError, ValueError):
            raise UnsupportedModelError(f"encoder att_context_size={raw!r} is not [left, lookahead] pairs") from None
        _require(
            left > 0 and 0 <= right <= 1024 and left <= 100_000 and left % (right + 1) == 0,
            f"encoder att_context_size {[left, right]}: a streaming context needs left > 0 divisible by "
            "lookahead + 1, lookahead >= 0",
        )
        contexts.append((left, right))
    return tuple(contexts)


def _is_list(value, expected: list[int]) -> bool:
    try:
        return [int(v) for v in value] == expected
    except (TypeError, ValueError):
        return False


def _local_context(enc: dict) -> tuple[int, int] | None:
    """The encoder's attention: None for full-context rel_pos, (left, right) frames for rel_pos_local_attn."""
    kind = enc.get("self_attention_model", "rel_pos")
    context = enc.get("att_context_size") or [-1, -1]
    _require(
        isinstance(context, (list, tuple)) and len(context) > 0,
        f"encoder att_context_size={context!r} is not [left, right]",
    )
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
