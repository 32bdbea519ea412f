#!/usr/bin/env python
"""Write a NeMo-format `.nemo` checkpoint with random weights for a named Parakeet preset.

    python scripts/make_checkpoint.py PRESET OUT.nemo [--seed N] [--calibrate AUDIO ...] [--check AUDIO ...]
    python scripts/make_checkpoint.py --list

The archive is laid out as NeMo's `save_to()` writes it (see tests/fixtures/nemo-tdt-tiny):
a plain tar with `./model_config.yaml`, `./model_weights.ckpt` (a `torch.save`d state dict
with NeMo's names) and the tokenizer files `./<32 hex>_tokenizer.model`, `_tokenizer.vocab`,
`_vocab.txt`, referenced from the config as `nemo:<32 hex>_<name>`. The preprocessor
buffers are NeMo's: a symmetric Hann window and a librosa (slaney) mel filterbank. The
tokenizer is a SentencePiece BPE model with exactly the preset's vocabulary, built directly
as a ModelProto (no training, no protobuf package needed).

`--calibrate AUDIO` adjusts the random weights so that greedy decoding of real speech looks
like a trained model's (for benchmarks): a token rate of 0.2-0.5 per encoder frame, every
TDT duration in use, many different tokens. The encoder runs once per clip; only the joint
and its biases are tuned, re-decoding the cached encoder output.

Tests import `make_checkpoint`, `preset_config` and `PRESETS` from this file with importlib.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import struct
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

from graphscribe.api import Model, load_model
from graphscribe.io.config import model_config_from_nemo
from graphscribe.io.options import RunOptions
from graphscribe.io.tokenizer import Tokenizer
from graphscribe.model.transducer import Transducer

SAMPLE_RATE = 16000  # Hz
N_FFT = 512  # samples
WINDOW_SECONDS = 0.025  # 400 samples
STRIDE_SECONDS = 0.01  # 160 samples
TDT_DURATIONS = (0, 1, 2, 3, 4)
LOGIT_STD = 4.0  # spread of each joint output after calibration


@dataclass(frozen=True)
class Preset:
    n_mels: int
    n_layers: int
    d_model: int
    n_heads: int
    subsampling_channels: int
    xscaling: bool
    use_bias: bool
    vocab_size: int  # without blank
    pred_hidden: int
    pred_layers: int
    joint_hidden: int
    durations: tuple[int, ...] | None  # None: plain RNN-T
    max_symbols: int = 10
    ff_expansion: int = 4
    conv_kernel: int = 9
    # Cache-aware streaming (NeMo's conf/fastconformer/cache_aware_streaming): the (left, lookahead) attention
    # contexts in encoder frames, the default first; None: a full-context offline encoder.
    att_context_size: tuple[tuple[int, int], ...] | None = None

    @property
    def cache_aware(self) -> bool:
        return self.att_context_size is not None


PRESETS_FILE = Path(__file__).resolve().parents[1] / "configs" / "presets.yaml"


def _load_presets(path: Path) -> dict[str, Preset]:
    presets = {}
    for name, values in yaml.safe_load(path.read_text()).items():
        durations = values.pop("durations")
        contexts = values.pop("att_context_size", None)
        presets[name] = Preset(
            **values,
            durations=tuple(durations) if durations else None,
            att_context_size=tuple(tuple(pair) for pair in contexts) if contexts else None,
        )
    return presets


PRESETS: dict[str, Preset] = _load_presets(PRESETS_FILE)
TINY_PRESETS = [name for name in PRESETS if name.startswith("tiny-")]


# ---------------------------------------------------------------------------- config


def _hex_name(preset_name: str, seed: int, filename: str) -> str:
    """`<32 hex>_<filename>` as NeMo names artifacts; derived from the preset and seed so output is reproducible."""
    return hashlib.md5(f"{preset_name}/{seed}/{filename}".encode()).hexdigest() + "_" + filename


def tokenizer_names(preset_name: str, seed: int = 0) -> dict[str, str]:
    return {key: _hex_name(preset_name, seed, key) for key in ("tokenizer.model", "vocab.txt", "tokenizer.vocab")}


def preset_config(preset_name: str, seed: int = 0) -> dict:
    """NeMo's `model_config.yaml` for a preset, as a dict (no weights are built)."""
    p = PRESETS[preset_name]
    pieces = make_pieces(p.vocab_size, seed)
    names = tokenizer_names(preset_name, seed)
    tdt = p.durations is not None
    data = {"manifest_filepath": None, "sample_rate": SAMPLE_RATE, "batch_size": 16}
    defaults = {"enc_hidden": p.d_model, "pred_hidden": p.pred_hidden, "joint_hidden": p.joint_hidden}
    if tdt:
        defaults.update(tdt_durations=list(p.durations), num_tdt_durations=len(p.durations))
    cfg = {
        "sample_rate": SAMPLE_RATE,
        "model_defaults": defaults,
        "tokenizer": {
            "dir": f"/data/tokenizers/{preset_name}",
            "type": "bpe",
            "model_path": "nemo:" + names["tokenizer.model"],
            "vocab_path": "nemo:" + names["vocab.txt"],
            "spe_tokenizer_vocab": "nemo:" + names["tokenizer.vocab"],
        },
        "train_ds": {**data, "shuffle": True},
        "validation_ds": {**data, "shuffle": False},
        "test_ds": {**data, "shuffle": False},
        "preprocessor": {
            "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
            "sample_rate": SAMPLE_RATE,
            "normalize": "per_feature",
            "window_size": WINDOW_SECONDS,
            "window_stride": STRIDE_SECONDS,
            "window": "hann",
            "features": p.n_mels,
            "n_fft": N_FFT,
            "log": True,
            "frame_splicing": 1,
            "dither": 1.0e-05,
            "pad_to": 0,
            "pad_value": 0.0,
        },
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": p.n_mels,
            "feat_out": -1,
            "n_layers": p.n_layers,
            "d_model": p.d_model,
            "subsampling": "dw_striding",
            "subsampling_factor": 8,
            "subsampling_conv_channels": p.subsampling_channels,
            "causal_downsampling": False,
            "ff_expansion_factor": p.ff_expansion,
            "self_attention_model": "rel_pos",
            "n_heads": p.n_heads,
            "att_context_size": [-1, -1],
            "att_context_style": "regular",
            "xscaling": p.xscaling,
            "untie_biases": True,
            "pos_emb_max_len": 5000,
            "conv_kernel_size": p.conv_kernel,
            "conv_norm_type": "batch_norm",
            "use_bias": p.use_bias,
            "dropout": 0.1,
            "dropout_pre_encoder": 0.1,
            "dropout_emb": 0.0,
            "dropout_att": 0.1,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.RNNTDecoder",
            "normalization_mode": None,
            "random_state_sampling": False,
            "blank_as_pad": True,
            "prednet": {"pred_hidden": p.pred_hidden, "pred_rnn_layers": p.pred_layers, "t_max": None, "dropout": 0.2},
            "vocab_size": p.vocab_size,
        },
        "joint": {
            "_target_": "nemo.collections.asr.modules.RNNTJoint",
            "log_softmax": None,
            "preserve_memory": False,
            "fuse_loss_wer": True,
            "fused_batch_size": 4,
            "jointnet": {
                "joint_hidden": p.joint_hidden,
                "activation": "relu",
                "dropout": 0.2,
                "encoder_hidden": p.d_model,
                "pred_hidden": p.pred_hidden,
            },
            "num_extra_outputs": len(p.durations) if tdt else 0,
            "num_classes": p.vocab_size,
            "vocabulary": list(pieces),
        },
        "decoding": {"strategy": "greedy_batch", "greedy": {"max_symbols": p.max_symbols}},
        "loss": {"loss_name": "default", "warprnnt_numba_kwargs": {"fastemit_lambda": 0.0, "clamp": -1.0}},
        "optim": {"name": "adamw", "lr": 0.001},
        "labels": list(pieces),
        "target": "nemo.collections.asr.models.rnnt_bpe_models.EncDecRNNTBPEModel",
        "nemo_version": "3.0.0",
    }
    if p.cache_aware:
        _make_cache_aware(cfg, p)
    if tdt:
        cfg["decoding"].update(model_type="tdt", durations=list(p.durations))
        cfg["loss"] = {
            "loss_name": "tdt",
            "tdt_kwargs": {
                "fastemit_lambda": 0.0,
                "clamp": -1.0,
                "durations": list(p.durations),
                "sigma": 0.05,
                "omega": 0.1,
            },
        }
    return cfg


def _make_cache_aware(cfg: dict, p: Preset) -> None:
    """The switches NeMo's cache_aware_streaming FastConformer configs set together (nemotron-speech-streaming's)."""
    cfg["preprocessor"]["normalize"] = "NA"  # no per-utterance statistics to wait for
    cfg["encoder"].update(
        causal_downsampling=True,
        att_context_size=[list(pair) for pair in p.att_context_size],
        att_context_style="chunked_limited",
        att_context_probs=None,
        conv_context_size="causal",
        conv_norm_type="layer_norm",
    )


# ---------------------------------------------------------------------------- tokenizer

_ONSETS = [
    "",
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "y",
    "th",
    "st",
    "ch",
    "sh",
    "tr",
    "pl",
    "gr",
    "br",
    "wh",
]
_VOWELS = ["a", "e", "i", "o", "u", "ou", "ea", "ee", "ai", "y"]
_CODAS = ["", "", "n", "r", "s", "t", "l", "d", "nd", "ng", "st", "ck", "m", "ll"]


def make_pieces(vocab_size: int, seed: int = 0) -> list[str]:
    """`<unk>`, made-up word pieces (half with the word-start mark '▁'), then single characters."""
    chars = ["▁"] + list("etaoinshrdlucmwfgypbvkjxqz'")
    if vocab_size >= 128:
        chars += list('.,-?!"') + list("ITASWMYHBCLDEPRGFNOJKVUQZX") + list("0123456789")
    if vocab_size < len(chars) + 2:
        raise ValueError(f"vocab_size {vocab_size} is too small: need at least {len(chars) + 2}")
    rng = random.Random(seed)
    merges: list[str] = []
    seen = set(chars) | {"<unk>"}
    while len(merges) < vocab_size - 1 - len(chars):
        piece = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(rng.choice((1, 1, 1, 2, 2, 3)))
        )
        piece = ("▁" if rng.random() < 0.5 else "") + piece
        if len(piece) >= 2 and piece not in seen:
            seen.add(piece)
            merges.append(piece)
    return ["<unk>"] + merges + chars


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32s are written as 10-byte two's complement, as protobuf does
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, value) -> bytes:
    if isinstance(value, float):  # protobuf `float` (wire type 5)
        return _varint(number << 3 | 5) + struct.pack("<f", value)
    if isinstance(value, int):  # varint (wire type 0)
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value  # length-delimited (wire type 2)
    return _varint(number << 3 | 2) + _varint(len(data)) + data


_UNKNOWN = 2  # SentencePiece.Type; NORMAL (1) is the default and not written


def piece_scores(pieces: list[str]) -> list[float]:
    return [0.0] + [-float(i) for i in range(len(pieces) - 1)]  # merges first, as sentencepiece ranks them


def sentencepiece_model(pieces: list[str]) -> bytes:
    """A serialized sentencepiece ModelProto: BPE, `<unk>` = 0, no BOS/EOS, identity normalisation."""
    proto = bytearray()
    for i, (piece, score) in enumerate(zip(pieces, piece_scores(pieces))):
        body = _field(1, piece) + _field(2, score) + (_field(3, _UNKNOWN) if i == 0 else b"")
        proto += _field(1, body)
    trainer = (
        _field(1, "corpus.txt")
        + _field(2, "tokenizer")
        + _field(3, 2)  # model_type BPE
        + _field(4, len(pieces))
        + _field(10, 1.0)
        + _field(40, 0)
        + _field(41, -1)
        + _field(42, -1)
    )
    proto += _field(2, trainer)
    proto += _field(3, _field(1, "identity"))
    return bytes(proto)


def tokenizer_files(pieces: list[str]) -> dict[str, bytes]:
    scores = piece_scores(pieces)
    return {
        "tokenizer.model": sentencepiece_model(pieces),
        "tokenizer.vocab": "".join(f"{p}\t{s:g}\n" for p, s in zip(pieces, scores)).encode(),
        "vocab.txt": "".join(f"{p}\n" for p in pieces).encode(),
    }


# ---------------------------------------------------------------------------- preprocessor buffers


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (librosa htk=False): linear below 1 kHz, logarithmic above."""
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    logstep = np.log(6.4) / 27.0
    hz = np.asarray(hz, dtype=np.float64)
    return np.where(
        hz >= min_log_hz, min_log_hz / f_sp + np.log(np.maximum(hz, 1e-10) / min_log_hz) / logstep, hz / f_sp
    )


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(mel >= min_log_mel, min_log_hz * np.exp(logstep * (mel - min_log_mel)), f_sp * mel)


def mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """librosa.filters.mel(htk=False, norm='slaney') as float32: (n_mels, n_fft // 2 + 1)."""
    fmax = sample_rate / 2 if fmax is None else fmax
    fft_hz = np.linspace(0, sample_rate / 2, n_fft // 2 + 1)
    mel_hz = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    width = np.diff(mel_hz)
    ramps = mel_hz[:, None] - fft_hz[None, :]
    weights = np.zeros((n_mels, n_fft // 2 + 1), dtype=np.float32)  # librosa fills a float32 array
    for i in range(n_mels):
        lower = -ramps[i] / width[i]
        upper = ramps[i + 2] / width[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_hz[2 : n_mels + 2] - mel_hz[:n_mels]))[:, None]  # slaney norm: equal area
    return weights


# ---------------------------------------------------------------------------- weights


@torch.no_grad()
def random_module(config: dict, seed: int) -> Transducer:
    """The graphscribe Transducer (NeMo's state-dict names) with random weights and NeMo's preprocessor buffers."""
    cfg = model_config_from_nemo(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = Transducer(cfg)  # PyTorch default init: Linear/Conv kaiming-uniform, LSTM uniform, Embedding N(0, 1)
    gen = torch.Generator().manual_seed(seed + 1)
    # Norms and rel-pos biases slightly off their defaults, so that a reader that drops one is noticed.
    for mod in module.modules():
        if isinstance(mod, torch.nn.LayerNorm):
            mod.weight.copy_(1 + 0.05 * torch.randn(mod.weight.shape, generator=gen))
            mod.bias.copy_(0.05 * torch.randn(mod.bias.shape, generator=gen))
        elif isinstance(mod, torch.nn.BatchNorm1d):
            mod.running_mean.copy_(0.1 * torch.randn(mod.num_features, generator=gen))
            mod.running_var.copy_(1 + 0.1 * torch.rand(mod.num_features, generator=gen))
    for name, param in module.named_parameters():
        if name.endswith(("pos_bias_u", "pos_bias_v")):
            param.copy_(0.05 * torch.randn(param.shape, generator=gen))
    feats = cfg.features
    featurizer = module.preprocessor.featurizer
    featurizer.window.copy_(torch.hann_window(feats.win_length, periodic=False))
    fb = mel_filterbank(feats.sample_rate, feats.n_fft, feats.n_mels, 0.0, feats.sample_rate / 2)
    featurizer.fb.copy_(torch.from_numpy(fb)[None])
    return module


# ---------------------------------------------------------------------------- archive


def write_nemo(
    out_path: Path, config: dict, state_dict: dict, tokenizer: dict[str, bytes], names: dict[str, str]
) -> None:
    """A plain tar as NeMo writes it: './' then './<member>' entries."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
        folder = Path(tmp)
        for key, data in tokenizer.items():
            (folder / names[key]).write_bytes(data)
        text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True, default_flow_style=False)
        (folder / "model_config.yaml").write_text(text, encoding="utf-8")
        torch.save(state_dict, folder / "model_weights.ckpt")
        partial = out_path.with_name(out_path.name + ".partial")
        with tarfile.open(partial, "w") as tar:
            tar.add(folder, arcname=".", recursive=False)
            for key in tokenizer:
                tar.add(folder / names[key], arcname="./" + names[key])
            tar.add(folder / "model_config.yaml", arcname="./model_config.yaml")
            tar.add(folder / "model_weights.ckpt", arcname="./model_weights.ckpt")
        partial.replace(out_path)


# ---------------------------------------------------------------------------- calibration


def emission_stats(hyps, frames: int, durations: tuple[int, ...] | None) -> dict:
    """What greedy decoding did: token rate, duration histogram, token variety."""
    ids = [t for h in hyps for t in h.token_ids]
    counts = Counter(ids)
    per_frame = Counter((i, f) for i, h in enumerate(hyps) for f in h.frames)
    stats = {
        "tokens": len(ids),
        "frames": frames,
        "tokens_per_frame": round(len(ids) / max(frames, 1), 3),
        "distinct_tokens": len(counts),
        "top_token_share": round(counts.most_common(1)[0][1] / len(ids), 3) if ids else 0.0,
        "max_tokens_on_a_frame": max(per_frame.values(), default=0),
    }
    if durations is not None:
        hist = Counter(d for h in hyps for d in h.durations)
        stats["token_durations"] = {d: hist.get(d, 0) for d in durations}
    return stats


def stats_ok(stats: dict, durations: tuple[int, ...] | None) -> bool:
    return (
        0.2 <= stats["tokens_per_frame"] <= 0.5
        and stats["distinct_tokens"] >= min(10, stats["tokens"] // 2)
        and stats["top_token_share"] <= 0.3
        and (durations is None or all(n > 0 for n in stats["token_durations"].values()))
    )


def frame_diversity(encoded: torch.Tensor) -> float:
    """How much the encoder frames differ: std over time / overall std (0 = all frames alike)."""
    x = encoded.reshape(-1, encoded.shape[-1]).float()
    return float(x.std(dim=0).mean() / x.std().clamp(min=1e-12))


@torch.no_grad()
def _prediction_samples(model: Model, n: int, steps: int, gen: torch.Generator) -> torch.Tensor:
    """Prediction-net outputs (n * steps, H) after random label histories."""
    pred = model.module.decoder
    vocab = pred.cfg.vocab_size
    h, c = pred.initial_state(n, torch.device("cpu"), torch.float32)
    tokens = torch.full((n,), vocab, dtype=torch.long)  # start: blank
    outs = []
    for _ in range(steps):
        out, h, c = pred.step(tokens, h, c)
        outs.append(out)
        tokens = torch.randint(0, vocab, (n,), generator=gen)
    return torch.cat(outs)


def _whiten(linear: torch.nn.Linear, inputs: torch.Tensor) -> None:
    """Rescale a Linear so its outputs over `inputs` have zero mean and unit std per unit."""
    y = linear(inputs)
    mean, std = y.mean(0), y.std(0).clamp(min=1e-6)
    linear.weight.div_(std[:, None])
    linear.bias.copy_((linear.bias - mean) / std)


def _pre_encode_inputs(pre_encode, features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """What the subsampling's output Linear sees on the valid frames: (T', C * F')."""
    seen = []
    hook = pre_encode.out.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
    try:
        _, sub_lengths = pre_encode(features.transpose(1, 2), lengths)
    finally:
        hook.remove()
    return seen[0][0, : int(sub_lengths[0])]


def _fit_duration_bias(logits: torch.Tensor, target: torch.Tensor, rounds: int = 200) -> torch.Tensor:
    """A bias for duration logits (N, D) so that their argmax is spread like `target` (D,)."""
    bias = torch.zeros(logits.shape[1])
    scale = float(logits.std())
    for step in range(rounds):  # noqa: B007 - the rounds it took are returned
        picks = torch.bincount((logits + bias).argmax(1), minlength=logits.shape[1]).float()
        freq = (picks + 1) / (picks.sum() + logits.shape[1])
        bias += 0.2 * scale * (target.log() - freq.log())
    return bias


@torch.no_grad()
def calibrate(
    module: Transducer, tokenizer: Tokenizer, clips: list[str], seed: int, target_rate: float = 0.33, log=print
) -> dict:
    """Tune `module`'s joint (in place) so greedy decoding of `clips` behaves like a trained model's."""
    model = Model(module, tokenizer, RunOptions(device="cpu", dtype="float32", graphs=False), "calibration")
    gen = torch.Generator().manual_seed(seed + 2)
    for mod in module.encoder.modules():  # trained models have far-from-default BatchNorm statistics
        if isinstance(mod, torch.nn.BatchNorm1d):
            mod.running_mean.copy_(0.5 * torch.randn(mod.num_features, generator=gen))
            mod.running_var.copy_(0.5 + 1.5 * torch.rand(mod.num_features, generator=gen))
    audios = [model.read(path) for path in clips]
    # A random subsampling stack puts out nearly the same vector on every frame (ReLU means dominate),
    # and the random layers above keep it so: whiten its output projection over the clips' frames.
    pre_encode = module.encoder.pre_encode
    inputs = []
    for audio in audios:
        features, lengths = model.features([audio])
        inputs.append(_pre_encode_inputs(pre_encode, features, lengths))
    _whiten(pre_encode.out, torch.cat(inputs))
    start = time.perf_counter()
    encoded = [model.encode([audio]) for audio in audios]  # (1, T, D), (1,) per clip
    log(f"encoded {len(clips)} clip(s) in {time.perf_counter() - start:.1f} s")
    frames = torch.cat([e[0, : int(n)] for e, n in encoded])  # (sum T, D)
    diversity = frame_diversity(frames)
    log(f"encoder frame diversity {diversity:.3f} (std over time / overall std; 0 = frames all alike)")
    if diversity < 0.1:
        raise SystemExit(f"encoder output is degenerate (frame diversity {diversity:.3g}): frames are all alike")

    joint, durations = module.joint, model.cfg.decoding.durations or None
    n_frames = sum(int(n) for _, n in encoded)
    _whiten(joint.enc, frames)  # every joint unit varies over the frames...
    _whiten(joint.pred, _prediction_samples(model, 64, 8, gen))  # ...and with the label history
    # A quarter of the hidden units follow the label history, the rest the audio. Tokens are chosen
    # mostly by the audio; blank-or-not by both, in a share picked below: after an emission the
    # history has changed, so a trained model's "emit again on this frame" is rare.
    hidden = joint.cfg.hidden
    perm = torch.randperm(hidden, generator=gen)
    history_units, audio_units = perm[: hidden // 4], perm[hidden // 4 :]
    joint.enc.weight[history_units] *= 0.2
    joint.enc.bias[history_units] *= 0.2
    joint.pred.weight[audio_units] *= 0.5
    joint.pred.bias[audio_units] *= 0.5
    out = joint.joint_net[-1]
    f = joint.enc(frames)  # (F, J)
    g = joint.pred(_prediction_samples(model, 64, 4, gen))  # (G, J)
    acts = torch.relu(f[:, None] + g[None]).reshape(-1, hidden)  # (F * G, J) samples of the joint's hidden layer
    blank = joint.num_token_logits - 1
    # Tokens read the history units as "not the token just emitted": a trained model does not say the
    # same piece over and over on one frame. The pattern of token k is the history units' activity
    # right after k was emitted.
    pred = module.decoder
    h, c = pred.initial_state(blank, torch.device("cpu"), torch.float32)
    after, _, _ = pred.step(torch.arange(blank), h, c)
    pattern = torch.relu(joint.pred(after)[:, history_units])  # (V, H)
    pattern = pattern - pattern.mean(0)
    out.weight[:blank, history_units] = -pattern / pattern.norm(dim=1, keepdim=True).clamp(min=1e-6)
    weight0 = out.weight.clone()
    best = None
    for history_share in (0.5, 0.3, 0.7, 0.9):
        out.weight.copy_(weight0)
        _mix(out.weight, acts, range(blank), audio_units, history_units, 0.4)
        _mix(out.weight, acts, [blank], audio_units, history_units, history_share)
        _standardise(out, acts)
        if durations is not None:  # real TDT models mostly skip 1-2 frames, sometimes 0 or 3-4
            target = torch.tensor([0.5 if d == 0 else 3.0 if d in (1, 2) else 1.5 for d in durations])
            out.bias[blank + 1 :] += _fit_duration_bias(out(acts)[:, blank + 1 :], target / target.sum())
        logits = out(acts)
        margin = logits[:, :blank].max(1).values - logits[:, blank]  # how far a token beats blank
        bias, stats, decodes = _tune_blank_bias(model, encoded, n_frames, out, blank, margin, target_rate)
        log(f"history share {history_share}: blank bias {bias:+.3f} after {decodes} decodes: {stats}")
        score = (
            stats_ok(stats, durations) and stats["max_tokens_on_a_frame"] < model.cfg.decoding.max_symbols,
            -abs(stats["tokens_per_frame"] - target_rate),
        )
        if best is None or score > best[0]:
            best = (score, out.weight.clone(), out.bias.clone(), history_share, stats)
        if score[0]:
            break
    _, weight, bias_vec, history_share, stats = best
    out.weight.copy_(weight)
    out.bias.copy_(bias_vec)
    log(f"calibration stats (history share {history_share}): {stats}")
    if not stats_ok(stats, durations):
        log("warning: calibration did not reach every target (0.2-0.5 tokens/frame, all durations, varied tokens)")
    return {"history_share": history_share, "frame_diversity": diversity, "stats": stats}


def _mix(weight: torch.Tensor, acts: torch.Tensor, rows, audio_units, history_units, history_share: float) -> None:
    """Set output `rows` to read the history units with `history_share` of their spread, the audio with the rest."""
    rows = torch.as_tensor(list(rows))
    for units, share in ((audio_units, 1 - history_share), (history_units, history_share)):
        part = acts[:, units] @ weight[rows][:, units].T  # (N, R)
        weight[rows[:, None], units[None, :]] *= (share / part.std(0).clamp(min=1e-6))[:, None]


def _standardise(out: torch.nn.Linear, acts: torch.Tensor) -> None:
    """Every output: mean 0, std LOGIT_STD over the samples; no token wins everywhere, margins are clear in bf16."""
    logits = out(acts)
    mean, std = logits.mean(0), logits.std(0).clamp(min=1e-6)
    scale = LOGIT_STD / std
    out.weight.mul_(scale[:, None])
    out.bias.copy_((out.bias - mean) * scale)


def _tune_blank_bias(
    model: Model,
    encoded,
    n_frames: int,
    out: torch.nn.Linear,
    blank: int,
    margin: torch.Tensor,
    target_rate: float,
    tolerance: float = 0.05,
    rounds: int = 16,
):
    """Bisect the blank logit's bias until greedy decoding emits about `target_rate` tokens per frame."""
    durations = model.cfg.decoding.durations or None
    base = float(out.bias[blank])

    def decode_all(bias: float) -> dict:
        out.bias[blank] = base + bias
        hyps = [model.decode(e, n)[0] for e, n in encoded]
        return emission_stats(hyps, n_frames, durations)

    lo, hi = float(margin.quantile(0.05)), float(margin.quantile(0.999))  # low bias: many tokens
    best = None
    for step in range(rounds):  # noqa: B007 - the rounds it took are returned
        bias = (lo + hi) / 2
        stats = decode_all(bias)
        error = abs(stats["tokens_per_frame"] - target_rate)
        if best is None or error < best[0]:
            best = (error, bias, stats)
        if error < tolerance:
            break
        lo, hi = (bias, hi) if stats["tokens_per_frame"] > target_rate else (lo, bias)
    _, bias, stats = best
    out.bias[blank] = base + bias
    return bias, stats, step + 1


def checkpoint_stats(path: Path, clips: list[str]) -> list[dict]:
    """Emission stats per clip of a written checkpoint, decoded by graphscribe's own loader and decoder."""
    model = load_model(path, device="cpu", graphs=False)
    durations = model.cfg.decoding.durations or None
    results = []
    for clip in clips:
        encoded, lengths = model.encode([model.read(clip)])
        results.append(emission_stats(model.decode(encoded, lengths), int(lengths[0]), durations))
    return results


# ---------------------------------------------------------------------------- entry points


def make_checkpoint(
    preset_name: str, out_path, seed: int = 0, calibrate_on: list[str] | None = None, log=print
) -> Path:
    """Write `out_path` (.nemo) for `preset_name` with random weights; calibrate on clips if given."""
    if preset_name not in PRESETS:
        raise KeyError(f"unknown preset {preset_name!r}; known: {', '.join(PRESETS)}")
    out_path = Path(out_path)
    config = preset_config(preset_name, seed)
    pieces = config["labels"]
    files = tokenizer_files(pieces)
    module = random_module(config, seed)
    if calibrate_on:
        calibrate(module, Tokenizer(files["tokenizer.model"], preset_name), list(calibrate_on), seed, log=log)
    state = {
        k: v.detach().to("cpu", torch.float32) if v.is_floating_point() else v.detach().cpu()
        for k, v in module.state_dict().items()
    }
    write_nemo(out_path, config, state, files, tokenizer_names(preset_name, seed))
    return out_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", nargs="?", help="one of: " + ", ".join(PRESETS))
    parser.add_argument("out", nargs="?", type=Path, help="the .nemo file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibrate", nargs="+", metavar="AUDIO", help="clip(s) of real speech to calibrate on")
    parser.add_argument(
        "--check", nargs="+", default=[], metavar="AUDIO", help="more clips to report emission stats on (after writing)"
    )
    parser.add_argument("--list", action="store_true", help="list the presets and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, p in PRESETS.items():
            print(f"{name}: {p}")
        return 0
    if not args.preset or not args.out:
        parser.error("PRESET and OUT are required")
    if args.preset not in PRESETS:
        parser.error(f"unknown preset {args.preset!r}; known: {', '.join(PRESETS)}")
    start = time.perf_counter()
    make_checkpoint(args.preset, args.out, args.seed, args.calibrate)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size / 2**20:.1f} MiB) in {time.perf_counter() - start:.1f} s")
    clips = (args.calibrate or []) + args.check
    if clips:
        start = time.perf_counter()
        for clip, stats in zip(clips, checkpoint_stats(args.out, clips)):
            print(f"{Path(clip).name}: {stats}")
        print(f"checked the written checkpoint in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
