"""The Python API: `load_model(source).transcribe(inputs)`.

Pipeline: audio -> LogMel (float32) -> FastConformer (model dtype; eager, or a small batch's layers
replayed from a CUDA graph) -> greedy decoding (GreedyDecoder, eager or CUDA graphs; or BeamDecoder's beam search) -> text and token
timestamps. The stages are `runtime/loaded.py`'s; reading and batching many inputs is `runtime/pipeline.py`'s.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import fields, replace
from typing import Callable, Iterable, Iterator, Sequence

import torch

from graphscribe.io.checkpoint import CheckpointError, read_checkpoint
from graphscribe.io.config import (
    CHUNK_SECONDS,
    LEFT_SECONDS,
    RIGHT_SECONDS,
    ModelConfig,
    model_config_from_nemo,
)
from graphscribe.io.hotwords import parse_request_hotwords
from graphscribe.io.options import RunOptions
from graphscribe.io.tokenizer import Tokenizer
from graphscribe.model.transducer import DTYPE_NAMES, empty_transducer, load_state, resolve_device, resolve_dtype
from graphscribe.output.transcript import Transcript
from graphscribe.runtime.cache_aware_streams import engine_for
from graphscribe.runtime.clock import StageClock
from graphscribe.runtime.loaded import Input, LoadedModel
from graphscribe.runtime.pipeline import transcribe_stream
from graphscribe.runtime.reading import read_ahead
from graphscribe.runtime.streaming import Stream


class Model(LoadedModel):
    """A loaded transducer on one device and dtype, ready to transcribe."""

    def transcribe_iter(
        self,
        inputs: Iterable[Input],
        batch_size: int | None = None,
        batch_seconds: float | None = None,
        clock: StageClock | None = None,
        word_times: bool = True,
        render: tuple[str, ...] = (),
        *,
        timings: bool | None = None,
    ) -> Iterator[tuple[int, Transcript]]:
        """Yield (index, Transcript) for paths or sample arrays, a batch at a time, longest first.

        Batches hold at most `batch_size` inputs and `batch_seconds` of padded audio (inputs x the longest
        one's length; 0: no cap); None takes the model's options, whose None is the device's default
        (`pipeline.default_batching`). Files are read by threads a few batches ahead (pipeline.py). A bad
        input yields a Transcript with `error` set and the rest goes on. Padded frames are masked, so the
        batching changes a result only through rounding. `clock` collects seconds per stage (the benchmark's).
        `word_times=False` leaves out the token, word and segment times (text and token ids only: less host work).
        `render`: output formats made by worker processes instead, in light Transcripts (`transcribe_stream`).
        `timings`: word_times' former name, still accepted.
        """
        word_times = _word_times(word_times, timings)
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
        yield from transcribe_stream(self, reads, clock, word_times, render)

    def stream(
        self,
        chunk_seconds: float = CHUNK_SECONDS,
        left_seconds: float = LEFT_SECONDS,
        right_seconds: float = RIGHT_SECONDS,
        hotwords: str = "",
    ) -> Stream:
        """A live stream of audio at the model's rate, transcribed as NeMo's buffered streaming does (defaults:
        NVIDIA's streaming config for parakeet-tdt-0.6b-v3). `stream.feed(samples)` returns the events that audio
        made ready (`partial`, `final`), `stream.finish()` the rest and `done`. Many streams batched together:
        `runtime.streaming.StreamEngine`. `hotwords`: phrases boosted in this stream ("A, B:2.0", as --hotwords
        takes them), with the model's own; HotwordError for one that cannot be boosted."""
        tree = self.row_tree(parse_request_hotwords(hotwords)) if hotwords.strip() else None
        engine = engine_for(
            self, chunk_seconds, left_seconds, right_seconds, max_rows=1, steps_on_feed=True, boosted=tree is not None
        )
        return engine.open(tree)

    def transcribe(
        self,
        inputs: Input | Sequence[Input],
        batch_size: int | None = None,
        batch_seconds: float | None = None,
        word_times: bool = True,
        *,
        timings: bool | None = None,
    ) -> list[Transcript]:
        """Paths or sample arrays (at the model's rate) -> one Transcript each, in input order (`word_times`,
        `timings`: as `transcribe_iter`)."""
        word_times = _word_times(word_times, timings)
        items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        results: list[Transcript | None] = [None] * len(items)
        for i, transcript in self.transcribe_iter(items, batch_size, batch_seconds, word_times=word_times):
            results[i] = transcript
        return results  # type: ignore[return-value]


def _word_times(word_times: bool, timings: bool | None) -> bool:
    """`word_times`, or `timings` where given: its former name, documented by earlier READMEs."""
    if timings is None:
        return word_times
    warnings.warn("transcribe(timings=...) is now word_times=...", DeprecationWarning, stacklevel=3)
    return timings


def load_model(
    source: str | os.PathLike,
    options: RunOptions | None = None,
    *,
    on_config: Callable[[ModelConfig, torch.device, torch.dtype], None] | None = None,
    **overrides,
) -> Model:
    """Load a `.nemo` file, an extracted checkpoint folder or a Hugging Face repo id.

    options: how to run it (`RunOptions`: device, dtype, graphs, batch_size, batch_seconds, attention,
    attention_window; None: the defaults), and keywords of the same names over it:
    `load_model(path, device="cpu")` is `load_model(path, RunOptions(device="cpu"))`.
    batch_size, batch_seconds: `transcribe`'s defaults (None: the device's, see `Model.transcribe_iter`).
    attention: auto | full | local, and attention_window (frames each side): see `Model.attention_for`.
    beam_size: 1 greedy, more a beam search (`model/beam.py`); nbest: each transcript's `alternatives`.
    The weights go from the (memory-mapped) file straight to the device in their inference
    dtype, into a module built on the meta device: nothing is initialised and nothing is
    copied twice. On the CPU in float32 they stay memory-mapped (the file must not change
    while the model is in use). `model.load_seconds`: seconds per phase.
    on_config(cfg, device, dtype): called once the config is read, before the weights are placed (the CLI
    starts reading audio there).
    """
    if options is not None and not isinstance(options, RunOptions):
        raise TypeError(
            f"load_model: options must be a RunOptions, not {type(options).__name__} (device=...: a keyword)"
        )
    unknown = sorted(set(overrides) - {f.name for f in fields(RunOptions)})
    if unknown:
        raise TypeError(f"load_model() got an unexpected keyword argument {unknown[0]!r}")
    options = replace(options or RunOptions(), **overrides)
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
        target = resolve_device(options.device)
        target_dtype = resolve_dtype(options.dtype, target)
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
        resolved = replace(options, device=str(target), dtype=DTYPE_NAMES[target_dtype])
        model = Model(module, tokenizer, resolved, checkpoint.source)
    phases = clock.seconds()
    weights = checkpoint.seconds["weights"]
    model.load_seconds = {
        "config_tokenizer": phases.pop("read") - weights,
        "weights": weights,
        **phases,
        "total": time.perf_counter() - start,
    }
    return model
