"""The transducer model and its Python API: `load_model(source).transcribe(inputs)`.

Pipeline: audio -> LogMel (float32) -> FastConformer (model dtype; eager, or a small batch's layers
replayed from a CUDA graph) -> greedy decoding (GreedyDecoder, eager or CUDA graphs) -> text and token
timestamps. Reading and batching many inputs is pipeline.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import replace
from typing import Callable, Iterable, Iterator, Sequence, Union

import numpy as np
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .audio import read_input
from .checkpoint import CheckpointError, read_checkpoint
from .config import ModelConfig, RunOptions, model_config_from_nemo
from .decoding import GreedyDecoder, Hypothesis
from .encoder import FastConformer, encoder_frames, memory_estimate, subsampled_lengths
from .features import LogMel, PackedClips
from .finishing import Finishing
from .graphs import LayerGraphs
from .heads import Joint, PredictionNet
from .packing import PackedFront, Packing
from .pipeline import StageClock, read_ahead, transcribe_stream
from .timestamps import WordRules
from .tokenizer import Tokenizer
from .transcript import Transcript

log = logging.getLogger(__name__)

# What transcribe takes: a path (any format audio.py reads; "-" for standard input), or (L,) samples at the model's
# rate (a tensor or a NumPy array)
Input = Union[str, os.PathLike, torch.Tensor, np.ndarray]

_MODULES = ("preprocessor", "encoder", "decoder", "joint")  # state-dict prefixes we load; others are ignored
_DERIVED = ("encoder.pos_enc.pe",)  # buffers older NeMo versions saved; recomputed here
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_ATTENTION = ("auto", "full", "local")
# --attention auto: longest input run with full attention. NVIDIA's model cards give 24 minutes as the longest
# single pass with full attention (parakeet-tdt-0.6b-v2/v3, the length its memory allows on an 80 GB card);
# past it NeMo's users switch to local attention, and so does auto.
FULL_ATTENTION_MAX_SECONDS = 24 * 60
# The longest clip a batch's features and subsampling run packed with (`Model.front_packing`): a packed row is as
# long as it, in one pass of the subsampling (whose first output, 256 channels at half the frame rate, then holds
# about 130 kB an encoder frame in 16 bits: 200 MB a row of 2 minutes).
PACKED_FRONT_MAX_SECONDS = 120
_MEMORY_HEADROOM = 0.8  # auto: full attention only while its estimate is below this share of the free memory


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


class _EmptyOnMeta(TorchFunctionMode):
    """Tensors made from nothing (empty, zeros, ones, full) land on the meta device; their initialisation is skipped.

    A module built inside gets its parameters' shapes and dtypes without memory or random
    initialisation (600 M parameters take seconds to initialise). Anything else stays real:
    tensors made from data (`torch.tensor`), for code that reads them while building, and small
    ones (the window). Initialisers run on meta tensors would be no-ops, but some (normal_, on a
    window) go through torch._refs, whose first use imports torch._dynamo: 1.5 s.
    """

    _FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.full})
    _INITIALISERS = frozenset({torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.fill_, torch.Tensor.zero_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._FACTORIES and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        elif func in self._INITIALISERS or getattr(func, "__module__", None) == "torch.nn.init":
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def empty_transducer(cfg: ModelConfig, dtype: torch.dtype) -> Transducer:
    """A Transducer on the meta device whose tensors have their inference dtypes (see `to_inference`)."""
    with _EmptyOnMeta():
        module = Transducer(cfg)
    return module.to_inference(torch.device("meta"), dtype)


def load_state(
    module: Transducer, state_dict: dict[str, torch.Tensor], source: str, device: torch.device | None = None
) -> None:
    """Strict loading of our modules' weights, with one line naming what is missing or misshapen.

    With `device`, the module is an `empty_transducer`: it takes the given tensors themselves, each
    moved to `device` in the dtype of the module's tensor (no copy where it is there already).
    Without, the weights are copied into the module's own tensors.
    """
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
                f"{source}: weight {key} has shape {tuple(tensor.shape)}, the config implies {tuple(wanted[key].shape)}"
            )
    if device is None:
        module.load_state_dict(given, strict=True)
        return
    placed = {key: tensor.to(device=device, dtype=wanted[key].dtype) for key, tensor in given.items()}
    module.load_state_dict(placed, strict=True, assign=True)
    unset = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if unset:  # a tensor that is not in the state dict must be made from data, not from nothing
        raise RuntimeError(f"{', '.join(unset)}: not in the state dict, left on the meta device")


def resolve_device(requested: str) -> torch.device:
    """auto: CUDA when present, else CPU. A CUDA request without CUDA degrades to CPU with one warning."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, colon, index = requested.partition(":")
    # checked here: torch.device's own complaint about "gpu" or "cuda:x" is a RuntimeError listing 20 device types
    if kind not in ("cpu", "cuda") or (colon and not (index.isascii() and index.isdigit())):
        raise ValueError(f"--device {requested}: use auto, cpu, cuda or cuda:N")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        log.warning("CUDA is not available on this machine; running on the CPU")
        return torch.device("cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {requested}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA GPUs that support it, float32 elsewhere. float32 gives NeMo's exact token ids; the
    bundled demo model's word error rate is the same in both (5.26% and 5.28% on 400 held-out utterances,
    bench/2026-11-defaults), and bfloat16 transcribes folders about twice as fast. float16 on the CPU degrades to
    float32."""
    if requested == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
            return torch.bfloat16
        return torch.float32
    if requested not in _DTYPES:
        raise ValueError(f"--dtype {requested}: use auto, float32, bfloat16 or float16")
    if requested == "float16" and device.type == "cpu":
        log.warning("float16 is not supported on the CPU; using float32")
        return torch.float32
    return _DTYPES[requested]


class Model:
    """A loaded transducer on one device and dtype, ready to transcribe."""

    load_seconds: dict[str, float]  # set by load_model: seconds per loading phase and "total"

    def __init__(self, module: Transducer, tokenizer: Tokenizer, options: RunOptions, source: str):
        self.cfg = module.cfg
        if options.attention not in _ATTENTION:
            raise ValueError(f"--attention {options.attention}: use auto, full or local")
        if options.attention_window < 1:
            raise ValueError(f"--attention-window {options.attention_window}: use 1 or more frames")
        if options.attention == "full" and self.cfg.encoder.local_context is not None:
            log.warning(
                f"{source}: trained with local attention {list(self.cfg.encoder.local_context)}; "
                "--attention full runs it with full attention, which is not what NeMo computes for it"
            )
        self.source = source
        self.device = resolve_device(options.device)
        self.dtype = resolve_dtype(options.dtype, self.device)
        if self.device.type != "cuda":
            options = replace(options, graphs=False)  # CUDA only; the CLI says so when asked
        self.options = options
        self.module = module.to_inference(self.device, self.dtype)
        self.tokenizer = tokenizer
        self.decoder = self._new_decoder()
        self._layer_graphs: LayerGraphs | None = None  # made at the first batch that uses them
        self._copy_stream: torch.cuda.Stream | None = None  # host-to-device copies of batches (`_copied`)
        decoding = self.cfg.decoding
        self.word_rules = WordRules(
            tokenizer.punctuation,
            tokenizer.wordpiece,
            decoding.word_separator,
            decoding.segment_separators,
            decoding.segment_gap,
        )
        self.finishing = Finishing(
            tokenizer.model_proto,
            self.word_rules,
            decoding.is_tdt,
            window_stride=self.cfg.features.hop_length / self.cfg.features.sample_rate,
            subsampling=self.cfg.encoder.subsampling_factor,
            sample_rate=self.cfg.features.sample_rate,
        )

    def use_graphs(self, enabled: bool) -> None:
        """Decode and encode with (CUDA only) or without captured graphs from now on: a fresh decoder (fresh
        captures); the encoder's captured layers are kept for whenever graphs are on."""
        self.options = replace(self.options, graphs=enabled and self.device.type == "cuda")
        self.decoder = self._new_decoder()

    @property
    def capture_seconds(self) -> float:
        """Seconds spent capturing CUDA graphs so far: the decoder's and the encoder layers' (the server's /metrics)."""
        layers = self._layer_graphs.capture_seconds if self._layer_graphs is not None else 0.0
        return self.decoder.capture_seconds + layers

    def release_graphs(self) -> None:
        """Free the encoder's captured layers (their memory pool), e.g. after running out of memory."""
        if self._layer_graphs is not None:
            self._layer_graphs.release()

    def _new_decoder(self) -> GreedyDecoder:
        return GreedyDecoder(self.module.decoder, self.module.joint, self.cfg.decoding, graphs=self.options.graphs)

    @property
    def sample_rate(self) -> int:
        return self.cfg.features.sample_rate

    # ------------------------------------------------------------------ stages
    def read(self, item) -> torch.Tensor:
        """A path, or samples at the model's rate -> (L,) float32 mono; raises AudioError (`audio.read_input`)."""
        return read_input(item, self.sample_rate)

    @torch.inference_mode()
    def features(self, audios: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded batch of audio -> (B, n_mels, T) float32 features and (B,) lengths."""
        lengths = torch.tensor([a.numel() for a in audios])
        if len(audios) == 1:  # no padded copy of a long recording
            return self.batch_features(audios[0][None], lengths)
        batch = torch.zeros(len(audios), int(lengths.max()))
        for i, a in enumerate(audios):
            batch[i, : a.numel()] = a
        return self.batch_features(batch, lengths)

    @torch.inference_mode()
    def batch_features(
        self, audio: torch.Tensor, lengths: torch.Tensor, front: PackedFront | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) zero-padded audio and (B,) sample counts, anywhere (pinned: copied without waiting) ->
        (B, n_mels, T) float32 features and (B,) feature frames on the model's device. With `front`
        (`front_packing`): (R, n_mels, T) features of the clips laid end to end, its masks set."""
        audio = self._copied(audio)
        lengths = lengths.to(self.device, non_blocking=True)
        if front is None:
            return self.module.preprocessor.featurizer(audio, lengths)
        packed = front.packing.pack_samples(audio, front)
        clips = PackedClips(front.sample_ids > 0, front.frame_ids, front.spans)
        rows = torch.full((front.packing.rows,), packed.shape[1], device=self.device)
        features, _ = self.module.preprocessor.featurizer(packed, rows, packed=clips)
        return features, torch.div(lengths, self.cfg.features.hop_length, rounding_mode="floor")

    def front_packing(self, samples: list[int], padded: int, window: tuple[int, int] | None) -> PackedFront | None:
        """Whether a batch of clips of `samples` samples each (rows `padded` samples wide) runs its features and
        subsampling on packed rows, as its layers would (`packs_rows`, full attention, `Packing.plan`), and in
        one pass of the subsampling (no time chunks: a row of minutes goes the padded way)."""
        if not self.packs_rows or window is not None or len(samples) < 2:
            return None
        if max(samples) > PACKED_FRONT_MAX_SECONDS * self.sample_rate:
            return None
        hop, factor = self.cfg.features.hop_length, self.cfg.encoder.subsampling_factor
        frames = encoder_frames(samples, hop, factor)
        plan = Packing.plan(frames, subsampled_lengths(padded // hop + 1, factor), self.module.encoder.gap, self.device)
        return None if plan is None else plan.front(samples, hop, factor, self.device)

    def _copied(self, host: torch.Tensor) -> torch.Tensor:
        """A pinned host tensor on the device, copied on a stream of its own: the copy runs while the GPU works on
        what was queued before it (the batch before: its copy waited behind that batch's encoder, ~1 ms of a
        server's 25 ms batch, bench/2026-11-server/run26), and the current stream waits only for the copy."""
        if self.device.type != "cuda" or not host.is_pinned():
            return host.to(self.device, non_blocking=True)
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.copy_stream):
            device = host.to(self.device, non_blocking=True)
        current.wait_stream(self.copy_stream)
        device.record_stream(current)  # made on the copy stream, used and freed on this one
        return device

    @property
    def copy_stream(self) -> torch.cuda.Stream:
        """The CUDA stream that batches' samples go to the device on (`_copied`, `pipeline.gather`)."""
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        return self._copy_stream

    @property
    def packs_rows(self) -> bool:
        """Whether a batch of clips of many lengths runs its layers on packed rows (`encoder_output`): in 16 bits."""
        return self.dtype.itemsize == 2

    @torch.inference_mode()
    def encoder_output(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor,
        window: tuple[int, int] | None = None,
        samples: list[int] | None = None,
        front: PackedFront | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, n_mels, T) features and (B,) frames -> (B, T', D) encoder output in the model dtype and (B,) lengths.

        window: None for full attention, (left, right) frames for local attention (`attention_for` chooses).
        With graphs, a small batch's layers replay one captured layer (`graphs.LayerGraphs`): the same numbers.
        samples: the clips' sample counts, known on the host: in 16 bits a batch of clips of many lengths runs its
        layers on packed rows (`packing.Packing`). float32 keeps a row a clip: its numbers are then NeMo's for that
        batch, which a request's text against the CLI's depends on."""
        layers = None
        if self.options.graphs:
            if self._layer_graphs is None:  # packs the layers' weights at its first small batch (see LayerGraphs)
                self._layer_graphs = LayerGraphs(self.module.encoder.layers)
            layers = self._layer_graphs
        frames = None
        if samples is not None and self.packs_rows:
            frames = encoder_frames(samples, self.cfg.features.hop_length, self.cfg.encoder.subsampling_factor)
        with self._float32_math():
            return self.module.encoder(features.to(self.dtype), lengths, window, layers, frames, front)

    @torch.inference_mode()
    def encode(self, audios: list[torch.Tensor], sources: list[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded batch of audio -> (B, T', D) encoder output in the model dtype and (B,) lengths."""
        samples = [a.numel() for a in audios]
        return self.encoder_output(*self.features(audios), self.attention_for(samples, sources), samples)

    def attention_for(self, samples: list[int], sources: list[str] | None = None) -> tuple[int, int] | None:
        """The encoder's attention for a batch of inputs of `samples` samples each: None (full) or a (left, right)
        window of local attention.

        full: always full. A checkpoint trained with local attention otherwise runs with its own window.
        local: (W, W) with W = attention_window. auto: full attention (NeMo's default output) unless
        the longest input is over FULL_ATTENTION_MAX_SECONDS or `memory_estimate` says full attention
        would not fit in the free memory; then local, with one note on stderr naming the inputs.
        """
        own = self.cfg.encoder.local_context
        if self.options.attention == "full":
            return None
        if own is not None:
            return own
        window = (self.options.attention_window, self.options.attention_window)
        if self.options.attention == "local":
            return window
        longest = max(samples, default=0)
        if longest / self.sample_rate > FULL_ATTENTION_MAX_SECONDS:
            reason = f"longer than {FULL_ATTENTION_MAX_SECONDS // 60} min"
        else:
            need = memory_estimate(self.cfg, len(samples), longest, self.dtype.itemsize, None)
            free = available_memory(self.device)
            if need <= _MEMORY_HEADROOM * free:
                return None
            reason = f"full attention would need about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        names = sources or ["<array>"] * len(samples)
        listed = ", ".join(f"{n} ({k / self.sample_rate / 60:.1f} min)" for n, k in zip(names[:3], samples))
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        log.warning(
            f"{listed}{more}: {reason}: local attention, {window[0]} frames each side "
            "(NeMo's rel_pos_local_attn; --attention full to keep full attention)"
        )
        return window

    def decode(
        self, encoded: torch.Tensor, lengths: torch.Tensor, queued: Callable[[], None] | None = None
    ) -> list[Hypothesis]:
        """queued: called once the first round of steps is queued on the device (`Decoder.decode`)."""
        with self._float32_math():
            return self.decoder.decode(encoded, lengths, queued)

    def _float32_math(self):
        """float32 means float32 on CUDA: cuDNN would otherwise run the encoder's convolutions (and the prediction
        net's LSTM) in TF32, which moves the features enough to flip near-tied tokens against NeMo's float32
        result. Only around our own calls (graph captures included): the process's setting is left as it was."""
        if self.device.type == "cuda" and self.dtype == torch.float32:
            return _cudnn_without_tf32()
        return contextlib.nullcontext()

    def frame_seconds(self, frame: int) -> float:
        """Seconds at an encoder frame, computed as NeMo does (frame x window stride x subsampling factor)."""
        return self.finishing.frame_seconds(frame)

    def finish(self, source: str, samples: int, hyp: Hypothesis, seconds: float, timings: bool = True) -> Transcript:
        """A hypothesis of `samples` samples of audio as a Transcript; `timings=False`: text and token ids only
        (no tokens, words, segments)."""
        return self.finishing.transcript(self.tokenizer, source, samples, hyp, seconds, timings)

    # ------------------------------------------------------------------ API
    def transcribe_audio(self, sources: list[str], audios: list[torch.Tensor]) -> list[Transcript]:
        """One padded batch of checked audio -> transcripts (same order)."""
        start = time.perf_counter()
        encoded, lengths = self.encode(audios, sources)
        hyps = self.decode(encoded, lengths)
        seconds = (time.perf_counter() - start) / len(audios)
        return [self.finish(s, a.numel(), h, seconds) for s, a, h in zip(sources, audios, hyps)]

    def transcribe_iter(
        self,
        inputs: Iterable[Input],
        batch_size: int | None = None,
        batch_seconds: float | None = None,
        clock: StageClock | None = None,
        timings: bool = True,
        render: tuple[str, ...] = (),
    ) -> Iterator[tuple[int, Transcript]]:
        """Yield (index, Transcript) for paths or sample arrays, a batch at a time, longest first.

        Batches hold at most `batch_size` inputs and `batch_seconds` of padded audio (inputs x the longest
        one's length; 0: no cap); None takes the model's options, whose None is the device's default
        (`pipeline.default_batching`). Files are read by threads a few batches ahead (pipeline.py). A bad
        input yields a Transcript with `error` set and the rest goes on. Padded frames are masked, so the
        batching changes a result only through rounding. `clock` collects seconds per stage (the benchmark's).
        `timings=False` leaves out the token, word and segment times (text and token ids only: less host work).
        `render`: output formats made by worker processes instead, in light Transcripts (`transcribe_stream`).
        """
        if batch_seconds is None:
            batch_seconds = self.options.batch_seconds
        reads = read_ahead(
            list(inputs),
            self.sample_rate,
            self.device,
            batch_size or self.options.batch_size,
            batch_seconds,
            clock,
            read=self.read,
            dtype=self.dtype,
        )
        yield from transcribe_stream(self, reads, clock, timings, render)

    def transcribe(
        self,
        inputs: Input | Sequence[Input],
        batch_size: int | None = None,
        batch_seconds: float | None = None,
        timings: bool = True,
    ) -> list[Transcript]:
        """Paths or sample arrays (at the model's rate) -> one Transcript each, in input order (`timings`: as
        `transcribe_iter`)."""
        items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        results: list[Transcript | None] = [None] * len(items)
        for i, transcript in self.transcribe_iter(items, batch_size, batch_seconds, timings=timings):
            results[i] = transcript
        return results  # type: ignore[return-value]


@contextlib.contextmanager
def _cudnn_without_tf32():
    cudnn = torch.backends.cudnn
    before = cudnn.allow_tf32
    cudnn.allow_tf32 = False
    try:
        yield
    finally:
        cudnn.allow_tf32 = before


def available_memory(device: torch.device) -> int:
    """Bytes free for new tensors: CUDA's free memory plus PyTorch's unused cache, or the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def load_model(
    source: str | os.PathLike,
    device: str = "auto",
    dtype: str = "auto",
    graphs: bool = True,
    batch_size: int | None = None,
    batch_seconds: float | None = None,
    attention: str = "auto",
    attention_window: int = 256,
    on_config: Callable[[ModelConfig, torch.device, torch.dtype], None] | None = None,
) -> Model:
    """Load a `.nemo` file, an extracted checkpoint folder or a Hugging Face repo id.

    batch_size, batch_seconds: `transcribe`'s defaults (None: the device's, see `Model.transcribe_iter`).
    attention: auto | full | local, and attention_window (frames each side): see `Model.attention_for`.
    The weights go from the (memory-mapped) file straight to the device in their inference
    dtype, into a module built on the meta device: nothing is initialised and nothing is
    copied twice. On the CPU in float32 they stay memory-mapped (the file must not change
    while the model is in use). `model.load_seconds`: seconds per phase.
    on_config(cfg, device, dtype): called once the config is read, before the weights are placed (the CLI
    starts reading audio there).
    """
    clock = StageClock(torch.device("cpu"))  # seconds per loading phase, on the host
    start = time.perf_counter()
    with clock.host("read"):
        checkpoint = read_checkpoint(source)
        cfg = model_config_from_nemo(checkpoint.config)
        tokenizer = Tokenizer(checkpoint.tokenizer_model, checkpoint.source)
        if tokenizer.vocab_size != cfg.prediction.vocab_size:
            raise CheckpointError(
                f"{checkpoint.source}: the tokenizer has {tokenizer.vocab_size} pieces, "
                f"the decoder expects {cfg.prediction.vocab_size}"
            )
    with clock.host("device_init"):
        target = resolve_device(device)
        target_dtype = resolve_dtype(dtype, target)
        if on_config is not None:
            on_config(cfg, target, target_dtype)
        if target.type == "cuda":
            torch.empty(0, device=target)  # the CUDA context, timed on its own
    with clock.host("build"):
        module = empty_transducer(cfg, target_dtype)
    with clock.host("place"):
        load_state(module, checkpoint.state_dict, checkpoint.source, device=target)
        if target.type == "cuda":
            torch.cuda.synchronize(target)
    with clock.host("model"):
        options = RunOptions(
            device=str(target),
            dtype=_DTYPE_NAMES[target_dtype],
            graphs=graphs,
            batch_size=batch_size,
            batch_seconds=batch_seconds,
            attention=attention,
            attention_window=attention_window,
        )
        model = Model(module, tokenizer, options, checkpoint.source)
    phases = clock.seconds()
    weights = checkpoint.seconds["weights"]
    model.load_seconds = {
        "config_tokenizer": phases.pop("read") - weights,
        "weights": weights,
        **phases,
        "total": time.perf_counter() - start,
    }
    return model
