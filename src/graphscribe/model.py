"""The transducer model and its Python API: `load_model(source).transcribe(inputs)`.

Pipeline: audio -> LogMel (float32) -> FastConformer (eager, model dtype) -> greedy
decoding (GreedyDecoder, eager or CUDA graphs) -> text and token timestamps. Reading and
batching many inputs is pipeline.py's.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .audio import load_audio, prepare_audio
from .checkpoint import CheckpointError, read_checkpoint
from .config import ModelConfig, RunOptions, model_config_from_nemo
from .decoding import GreedyDecoder, Hypothesis
from .encoder import FastConformer
from .features import LogMel
from .heads import Joint, PredictionNet
from .pipeline import StageClock, default_batching, transcribe_stream
from .timestamps import Segment, Word, WordRules, token_spans, words_and_segments
from .tokenizer import Tokenizer

log = logging.getLogger(__name__)

_MODULES = ("preprocessor", "encoder", "decoder", "joint")  # state-dict prefixes we load; others are ignored
_DERIVED = ("encoder.pos_enc.pe",)  # buffers older NeMo versions saved; recomputed here
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Preprocessor(nn.Module):
    def __init__(self, model_cfg: ModelConfig):
        super().__init__()
        self.featurizer = LogMel(model_cfg.features)


class Transducer(nn.Module):
    """NeMo's EncDecRNNTBPEModel layout: preprocessor, encoder, decoder (prediction net), joint."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.preprocessor = _Preprocessor(cfg)
        self.encoder = FastConformer(cfg.encoder)
        self.decoder = PredictionNet(cfg.prediction)
        self.joint = Joint(cfg.joint)

    def to_inference(self, device: torch.device, dtype: torch.dtype) -> "Transducer":
        """Eval mode on `device`: encoder and joint in `dtype`; features and the prediction net stay float32.

        The prediction net is tiny, and cuDNN takes no bfloat16 LSTM weights in one chunk: it would copy
        them at every step (slower, and impossible inside graph capture).
        """
        self.eval().to(device)
        self.encoder.to(dtype)
        self.joint.to(dtype)
        return self


def load_state(module: Transducer, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Strict loading of our modules' weights, with one line naming what is missing or misshapen."""
    wanted = module.state_dict()
    given = {k: v for k, v in state_dict.items() if k.split(".", 1)[0] in _MODULES and k not in _DERIVED}
    missing = [k for k in wanted if k not in given]
    unexpected = [k for k in given if k not in wanted]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} weights, e.g. {', '.join(missing[:3])}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} weights, e.g. {', '.join(unexpected[:3])}")
        raise CheckpointError(f"{source}: weights do not match the config: {'; '.join(parts)}")
    for key, tensor in given.items():
        if tuple(tensor.shape) != tuple(wanted[key].shape):
            raise CheckpointError(
                f"{source}: weight {key} has shape {tuple(tensor.shape)}, the config implies {tuple(wanted[key].shape)}")
    module.load_state_dict(given, strict=True)


def resolve_device(requested: str) -> torch.device:
    """auto: CUDA when present, else CPU. A CUDA request without CUDA degrades to CPU with one warning."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        log.warning("CUDA is not available on this machine; running on the CPU")
        return torch.device("cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {requested}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {requested}: use auto, cpu, cuda or cuda:N")
    return device


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """auto is float32 (NeMo's own inference precision). float16 on the CPU degrades to float32."""
    if requested == "auto":
        return torch.float32
    if requested not in _DTYPES:
        raise ValueError(f"--dtype {requested}: use auto, float32, bfloat16 or float16")
    if requested == "float16" and device.type == "cpu":
        log.warning("float16 is not supported on the CPU; using float32")
        return torch.float32
    return _DTYPES[requested]


@dataclass
class Token:
    id: int
    piece: str
    frame: int  # encoder frame
    start: float  # seconds
    end: float  # seconds
    end_frame: int  # encoder frame: TDT frame + predicted duration, RNN-T frame + 1 (NeMo's end offset)


@dataclass
class Transcript:
    """One input's result; `error` is set (and the rest empty) when the input could not be transcribed."""

    source: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    tokens: list[Token] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)  # NeMo's word timestamps
    segments: list[Segment] = field(default_factory=list)  # NeMo's segment timestamps (sentences)
    audio_seconds: float = 0.0
    seconds: float = 0.0  # processing time: its batch's time divided by the batch size
    error: str | None = None

    @property
    def frames(self) -> list[int]:
        return [t.frame for t in self.tokens]

    def to_json(self) -> dict:
        if self.error is not None:
            return {"path": self.source, "error": self.error}
        return {
            "path": self.source,
            "text": self.text,
            "audio_seconds": round(self.audio_seconds, 4),
            "seconds": round(self.seconds, 4),
            "tokens": [{"id": t.id, "piece": t.piece, "frame": t.frame, "start": round(t.start, 3), "end": round(t.end, 3)}
                       for t in self.tokens],
            "words": [{"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)} for w in self.words],
            "segments": [{"text": s.text, "start": round(s.start, 3), "end": round(s.end, 3)} for s in self.segments],
        }


class Model:
    """A loaded transducer on one device and dtype, ready to transcribe."""

    def __init__(self, module: Transducer, tokenizer: Tokenizer, options: RunOptions, source: str):
        self.cfg = module.cfg
        self.source = source
        self.device = resolve_device(options.device)
        self.dtype = resolve_dtype(options.dtype, self.device)
        if self.device.type != "cuda":
            options = replace(options, graphs=False)  # CUDA only; the CLI says so when asked
        self.options = options
        if self.device.type == "cuda" and self.dtype == torch.float32:
            # float32 means float32: cuDNN would otherwise run the encoder's convolutions in TF32,
            # which moves the features enough to flip near-tied tokens against NeMo's float32 result.
            torch.backends.cudnn.allow_tf32 = False
        self.module = module.to_inference(self.device, self.dtype)
        self.tokenizer = tokenizer
        self.decoder = self._new_decoder()
        decoding = self.cfg.decoding
        self.word_rules = WordRules(tokenizer.punctuation, tokenizer.wordpiece, decoding.word_separator,
                                    decoding.segment_separators, decoding.segment_gap)

    def use_graphs(self, enabled: bool) -> None:
        """Decode with (CUDA only) or without captured graphs from now on: a fresh decoder, fresh captures."""
        self.options = replace(self.options, graphs=enabled and self.device.type == "cuda")
        self.decoder = self._new_decoder()

    def _new_decoder(self) -> GreedyDecoder:
        return GreedyDecoder(self.module.decoder, self.module.joint, self.cfg.decoding, graphs=self.options.graphs)

    @property
    def sample_rate(self) -> int:
        return self.cfg.features.sample_rate

    # ------------------------------------------------------------------ stages
    def read(self, item) -> torch.Tensor:
        """A path, or samples at the model's rate -> (L,) float32 mono; raises AudioError for bad input.

        Any length from one sample on: as in NeMo, a clip shorter than one feature frame (10 ms) has no
        encoder frames and an empty transcript, one shorter than 80 ms has one encoder frame."""
        if isinstance(item, (str, os.PathLike)):
            return load_audio(item, self.sample_rate)
        return prepare_audio(item.cpu().numpy() if isinstance(item, torch.Tensor) else item,
                             self.sample_rate, self.sample_rate)

    @torch.inference_mode()
    def features(self, audios: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded batch of audio -> (B, n_mels, T) float32 features and (B,) lengths."""
        lengths = torch.tensor([a.numel() for a in audios])
        batch = torch.zeros(len(audios), int(lengths.max()))
        for i, a in enumerate(audios):
            batch[i, : a.numel()] = a
        return self.padded_features(batch, lengths)

    @torch.inference_mode()
    def padded_features(self, audio: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) zero-padded audio and (B,) sample counts, anywhere (pinned: copied without waiting) ->
        (B, n_mels, T) float32 features and (B,) feature frames on the model's device."""
        audio = audio.to(self.device, non_blocking=True)
        lengths = lengths.to(self.device, non_blocking=True)
        return self.module.preprocessor.featurizer(audio, lengths)

    @torch.inference_mode()
    def encoder_output(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, n_mels, T) features and (B,) frames -> (B, T', D) encoder output in the model dtype and (B,) lengths."""
        return self.module.encoder(features.to(self.dtype), lengths)

    @torch.inference_mode()
    def encode(self, audios: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded batch of audio -> (B, T', D) encoder output in the model dtype and (B,) lengths."""
        return self.encoder_output(*self.features(audios))

    def decode(self, encoded: torch.Tensor, lengths: torch.Tensor) -> list[Hypothesis]:
        return self.decoder.decode(encoded, lengths)

    def frame_seconds(self, frame: int) -> float:
        """Seconds at an encoder frame, computed as NeMo does (frame x window stride x subsampling factor)."""
        return frame * (self.cfg.features.hop_length / self.sample_rate) * self.cfg.encoder.subsampling_factor

    def finish(self, source: str, audio: torch.Tensor, hyp: Hypothesis, seconds: float) -> Transcript:
        tdt = self.cfg.decoding.is_tdt
        pieces = [self.tokenizer.piece(i) for i in hyp.token_ids]
        spans = token_spans(hyp.frames, hyp.durations, tdt)
        tokens = [Token(i, p, s, self.frame_seconds(s), self.frame_seconds(e), e)
                  for i, p, (s, e) in zip(hyp.token_ids, pieces, spans)]
        words, segments = words_and_segments(pieces, spans, self.tokenizer.decode_pieces, self.word_rules, tdt,
                                             self.frame_seconds)
        return Transcript(source=source, text=self.tokenizer.decode(hyp.token_ids), token_ids=list(hyp.token_ids),
                          tokens=tokens, words=words, segments=segments,
                          audio_seconds=audio.numel() / self.sample_rate, seconds=seconds)

    # ------------------------------------------------------------------ API
    def transcribe_audio(self, sources: list[str], audios: list[torch.Tensor]) -> list[Transcript]:
        """One padded batch of checked audio -> transcripts (same order)."""
        start = time.perf_counter()
        encoded, lengths = self.encode(audios)
        hyps = self.decode(encoded, lengths)
        seconds = (time.perf_counter() - start) / len(audios)
        return [self.finish(s, a, h, seconds) for s, a, h in zip(sources, audios, hyps)]

    def transcribe_iter(self, inputs, batch_size: int | None = None, batch_seconds: float | None = None,
                        clock: StageClock | None = None):
        """Yield (index, Transcript) for paths or sample arrays, a batch at a time, longest first.

        Batches hold at most `batch_size` inputs and `batch_seconds` of padded audio (inputs x the longest
        one's length; 0: no cap); None takes the model's options, whose None is the device's default
        (`pipeline.default_batching`). Files are read by threads a few batches ahead (pipeline.py). A bad
        input yields a Transcript with `error` set and the rest goes on. Results do not depend on the
        batching (padding-invariant). `clock` collects seconds per stage (the benchmark's).
        """
        files, seconds = default_batching(self.device)
        batch_size = batch_size or self.options.batch_size or files
        if batch_seconds is None:
            batch_seconds = self.options.batch_seconds if self.options.batch_seconds is not None else seconds
        yield from transcribe_stream(self, list(inputs), batch_size, batch_seconds, clock)

    def transcribe(self, inputs, batch_size: int | None = None, batch_seconds: float | None = None) -> list[Transcript]:
        """Paths or sample arrays (at the model's rate) -> one Transcript each, in input order."""
        items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        results: list[Transcript | None] = [None] * len(items)
        for i, transcript in self.transcribe_iter(items, batch_size, batch_seconds):
            results[i] = transcript
        return results  # type: ignore[return-value]


def load_model(source: str | os.PathLike, device: str = "auto", dtype: str = "auto", graphs: bool = True,
               batch_size: int | None = None, batch_seconds: float | None = None) -> Model:
    """Load a `.nemo` file, an extracted checkpoint folder or a Hugging Face repo id.

    batch_size, batch_seconds: `transcribe`'s defaults (None: the device's, see `Model.transcribe_iter`)."""
    checkpoint = read_checkpoint(source)
    cfg = model_config_from_nemo(checkpoint.config)
    tokenizer = Tokenizer(checkpoint.tokenizer_model, checkpoint.source)
    if tokenizer.vocab_size != cfg.prediction.vocab_size:
        raise CheckpointError(f"{checkpoint.source}: the tokenizer has {tokenizer.vocab_size} pieces, "
                              f"the decoder expects {cfg.prediction.vocab_size}")
    module = Transducer(cfg)
    load_state(module, checkpoint.state_dict, checkpoint.source)
    options = RunOptions(device=device, dtype=dtype, graphs=graphs, batch_size=batch_size, batch_seconds=batch_seconds)
    return Model(module, tokenizer, options, checkpoint.source)
