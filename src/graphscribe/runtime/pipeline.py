"""The host side of transcribing many inputs: reading runs ahead in threads while the GPU works.

    inputs -> lengths (file headers) -> batches, longest first (at most N files, S seconds of padded audio)
    -> a pool of reader threads: decode, mix down, resample (libsndfile and torch release the GIL)
    -> one zero-padded (B, L) buffer a batch (pinned on CUDA, so the copy to the GPU is asynchronous)
       [`ReadAhead`: all of the above, from the moment it is made; the CLI makes it while the model loads]
    -> features, encoder (queued on the GPU) -> decoding (its own CUDA stream) -> transcripts
       [`transcribe_stream`]

The main thread keeps the GPU fed: it queues batch k's first round of decode steps on a stream of its own, then
batch k+1's copy, features and encoder, which run beside those steps, then waits for batch k's decode (which
reads a few numbers back to the host as it goes: on one stream the GPU would wait for the host's launches of
every next batch), then makes batch k's transcripts (and the caller writes them); the readers stay READ_AHEAD
batches ahead, so host memory is bounded by the batch size, not by the number of inputs.
Results come in batch order, each batch's unreadable inputs first; a batch that runs out of memory is
retried one input at a time, and an input that alone does not fit gets an error.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import queue
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import torch

from graphscribe.io.audio import AudioError, audio_seconds, read_input
from graphscribe.output.finishing import RenderPool
from graphscribe.output.transcript import Transcript
from graphscribe.runtime.scheduler import plan_batches

if TYPE_CHECKING:
    from graphscribe.model.decoding import Hypothesis
    from graphscribe.runtime.loaded import LoadedModel

READ_AHEAD = 2  # batches read ahead of the one being transcribed
# Reader threads at most: FLAC decodes at thousands of times real time per thread, and every reader's Python takes
# the GIL from the main thread, which launches the GPU's work: 4 readers transcribed the 512-file folder in 2.24-2.59 s
# against 2.76-2.84 s with 8 on an H100 (bfloat16, batch 128, alternating CLI runs; 16 were slower than 8 again).
MAX_READERS = 4
# Default files per batch: on CUDA by the model's dtype, measured with the plain command (a 0.6b model on an H100,
# LibriSpeech-like files, bench/2026-11-defaults): float32 32 rows (64: 4% slower), 16 bits 64 rows (128 and 256
# no faster, and a new size class's first uses cost more).
BATCH_FILES = {"cuda-float32": 32, "cuda-16bit": 64, "cpu": 8}
# Torch's intra-op threads in a process whose model is on a GPU: the host side only copies and resamples, and
# one thread per core spins against the readers and the thread that feeds the GPU (a float32 folder ran 3x slower
# with two such processes on one host; bfloat16 on 4096 files 6761 -> 7535 RTFx with 4, loading 2.2 -> 1.1 s).
GPU_HOST_THREADS = 4
# Default caps on padded audio per batch. A 0.6b model's features and encoder take about 7 MB per padded second in
# float32 (measured on the CPU; the first subsampling convolution's output is the largest tensor), so 40 s per GiB
# of GPU memory uses about a quarter of it (3200 s, ~22 GB, on an 80 GB H100).
SECONDS_PER_GIB = 40.0
# On CUDA, in 16 bits, a batch's padded length is rounded up to a multiple of PAD_SECONDS (1.28 s is 16 encoder
# frames), so batches of nearby lengths share one shape (cuDNN makes a plan, the encoder's layer graphs a capture,
# per new shape), and one clip at a time in a long-lived process reuses shapes too. Padded frames are masked, so
# they change a result only through rounding: not in float32, whose results are NeMo's own products on NeMo's
# shapes (the GPU tests' tiny model then gave other tokens than NeMo). The CLI in bfloat16 at batch 128 went from
# 5.73-5.94 to 5.42-5.58 s on 4096 files on an H100.
PAD_SECONDS = 1.28
CPU_BATCH_SECONDS = 120.0  # ~0.8 GB
WARM_UP_CLIP = "librispeech_2086-149220-0033.wav"  # `warm_up`'s real speech, shipped in the package


def default_batching(device: torch.device, dtype: torch.dtype | None = None) -> tuple[int, float]:
    """Files and padded seconds per batch when not given: wide on CUDA (capped by its memory; fewer files in
    float32, dtype None), small on the CPU."""
    if device.type == "cuda":
        gib = torch.cuda.get_device_properties(device).total_memory / 2**30
        wide = dtype is not None and dtype.itemsize == 2
        return BATCH_FILES["cuda-16bit" if wide else "cuda-float32"], round(SECONDS_PER_GIB * gib)
    return BATCH_FILES["cpu"], CPU_BATCH_SECONDS


def limit_host_threads(device: str, share: int | None = None) -> None:
    """torch's CPU threads in a process of ours, unless the user chose a number (OMP_NUM_THREADS, which torch
    follows): at most `share` (a device worker's part of the host's cores; None: torch's own count), and where the
    model goes to a GPU (`device` auto or cuda, with CUDA present) at most GPU_HOST_THREADS. The CLI's process and
    every `--devices` worker call it, before loading (placing the weights uses them too)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    threads = torch.get_num_threads() if share is None else share
    if device != "cpu" and torch.cuda.is_available():
        threads = min(GPU_HOST_THREADS, threads)
    torch.set_num_threads(max(1, threads))


def warm_up_run(model: LoadedModel, inputs: int, batch_size: int | None, batch_seconds: float | None) -> float:
    """On CUDA, `warm_up` on a batch as wide as a run of `inputs` inputs starts with (its batch size and padded-seconds
    cap, or the device's) -> seconds taken; 0 on the CPU, which has no first uses worth moving off the clock. The
    CLI's process and every `--devices` worker call it after loading."""
    if model.device.type != "cuda":
        return 0.0
    rows, seconds = default_batching(model.device, model.dtype)
    return warm_up(model, min(batch_size or rows, inputs), seconds if batch_seconds is None else batch_seconds)


def warm_up(model: LoadedModel, rows: int, batch_seconds: float | None = None) -> float:
    """Run one batch of `rows` copies of the shipped LibriSpeech clip (7.4 s, cut to batch_seconds / rows) through
    `model` as `transcribe_stream` runs a batch, and wait for it -> seconds taken. Nothing it makes is kept but
    what later batches reuse: loaded kernels, Triton's launchers, cuBLAS's and cuDNN's handles, pinned memory,
    captured decode graphs (whose buffers grow for longer inputs, as they would anyway).

    A process's first batch on CUDA pays ~0.85 s of such first uses in bfloat16 on an H100, most of it in that
    batch (bench/2026-11-first-uses): the CLI pays it here, before the transcription's clock starts, on one device
    and in every `--devices` worker alike, and the summary line gives it as part of the loading time."""
    start = time.perf_counter()
    rows = max(1, rows)
    clip = read_input(str(resources.files("graphscribe") / "data" / WARM_UP_CLIP), model.sample_rate)  # (L,)
    if batch_seconds:
        clip = clip[: max(1, int(batch_seconds / rows * model.sample_rate))]
    pin = model.device.type == "cuda"
    pad_to = pad_samples(model.device, model.dtype, model.sample_rate)
    batch = collate([(r, "<warm-up>", clip) for r in range(rows)], HostBuffers(keep=0, pin=pin), pad_to, pin)
    clock = StageClock(model.device, enabled=False)
    streams = _Streams(model.device)
    for _ in _finish(model, _decode(model, _start(model, batch, clock), clock, streams), clock, streams, False):
        pass
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return time.perf_counter() - start


def warm_up_encoder(model: LoadedModel, batches: Iterable[Batch]) -> None:
    """Queue each batch's features and encoder as `transcribe_stream` does, and nothing after (no decode), for what
    that leaves behind: its shape's layer graph and the first uses of its products; then wait for them. Stops at
    the first that runs out of memory (its shape is then made when a batch of it comes)."""
    clock = StageClock(model.device, enabled=False)
    for batch in batches:
        if _start(model, batch, clock).out_of_memory:
            break
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


@dataclass
class Batch:
    """Read audio of one batch, ready for the model; inputs that could not be read are in `failed`."""

    indices: list[int]  # positions in the inputs, one per row
    sources: list[str]  # one per row
    audio: torch.Tensor  # (B, L) float32, zero-padded; pinned when the model is on CUDA, or on it already (`gather`)
    lengths: torch.Tensor  # (B,) int64 samples
    failed: list[tuple[int, str]] = field(default_factory=list)  # (index, error) of unreadable inputs
    storage: torch.Tensor | None = None  # the (pinned) host buffer `audio` is a view of (`ReadAhead.recycle`)
    timings: bool = True  # False: this batch's transcripts leave out the times even when the stream keeps them

    def row(self, r: int) -> "Batch":
        n = int(self.lengths[r])
        return Batch(
            [self.indices[r]],
            [self.sources[r]],
            self.audio[r : r + 1, :n],
            self.lengths[r : r + 1],
            timings=self.timings,
        )


class StageClock:
    """Seconds spent per stage of the pipeline.

    GPU stages (features, encoder, decode) are timed with CUDA events recorded around them: no
    synchronisation while running; they are read in `seconds()`. Host stages (read: summed over the reader
    threads; wait: the main thread waiting for a batch to be read; text; write) with perf_counter. On the
    CPU everything runs synchronously, so perf_counter times every stage. A disabled clock does nothing.
    """

    def __init__(self, device: torch.device, enabled: bool = True):
        self.enabled = enabled
        self.cuda = enabled and device.type == "cuda"
        self._seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextlib.contextmanager
    def gpu(self, stage: str):
        if not self.cuda:
            with self.host(stage):
                yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._events.append((stage, start, end))

    @contextlib.contextmanager
    def host(self, stage: str):
        start = time.perf_counter()
        yield
        self.add(stage, time.perf_counter() - start)

    def add(self, stage: str, seconds: float) -> None:
        if self.enabled:
            self._seconds[stage] += seconds

    def seconds(self) -> dict[str, float]:
        """Stage -> seconds so far (waits for the GPU once)."""
        totals = dict(self._seconds)
        if self._events:
            torch.cuda.synchronize()
            for stage, start, end in self._events:
                totals[stage] = totals.get(stage, 0.0) + start.elapsed_time(end) / 1e3
        return totals


class ReadAhead:
    """Batches of read audio, in plan order, read by a pool of threads at most `read_ahead` batches ahead of the
    batch being transcribed. Reading starts when it is made: the CLI makes one as soon as the checkpoint's config
    is read (`load_model`'s on_config), so the first batches are read while the weights go to the GPU.

    A feeding thread reads the inputs' lengths (file headers), plans the batches (`plan_batches`; or takes them
    from `batches`, index lists handed out elsewhere, such as a device worker's share of one plan), and hands each
    batch's inputs to the reader threads (`read`: an input -> (L,) float32 samples at the model's rate, raising
    AudioError) and the batch to one collating thread, which copies its reads into a padded (pinned) buffer; the
    main thread only takes finished batches. Iterate once; `close` stops the threads (iterating to the end, or
    stopping early, closes it too).
    """

    def __init__(
        self,
        items: list,
        read: Callable[[object], torch.Tensor],
        sample_rate: int,
        batch_size: int,
        batch_seconds: float | None,
        pin: bool,
        workers: int,
        clock: StageClock | None = None,
        read_ahead: int = READ_AHEAD,
        pad_to: int = 0,
        batches: Iterable[list[int]] | None = None,
    ):
        self.items, self.read, self.sample_rate, self.pin, self.pad_to = items, read, sample_rate, pin, pad_to
        self.clock = clock or StageClock(torch.device("cpu"), enabled=False)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="graphscribe-read")
        self._collator = ThreadPoolExecutor(1, thread_name_prefix="graphscribe-collate")
        self._batches: queue.SimpleQueue = queue.SimpleQueue()  # futures of collated batches; then None or an error
        self._room = threading.Semaphore(read_ahead + 1)  # batches handed out but not yet taken, at most
        self._buffers = HostBuffers(keep=read_ahead + 3, pin=pin)
        self._given = batches
        self._closed = threading.Event()
        self._feeder = threading.Thread(
            target=self._feed, args=(max(1, batch_size), batch_seconds), name="graphscribe-feed", daemon=True
        )
        self._feeder.start()

    def _feed(self, batch_size: int, batch_seconds: float | None) -> None:
        try:
            planned = self._given
            if planned is None:
                seconds = list(self._pool.map(lambda item: _estimated_seconds(item, self.sample_rate), self.items))
                planned = plan_batches(seconds, batch_size, batch_seconds)
            batches = iter(planned)
            while True:
                self._room.acquire()  # before asking for a batch: batches handed out elsewhere wait there till then
                if self._closed.is_set():
                    return
                indices = next(batches, None)
                if indices is None:
                    break
                reads = [self._pool.submit(self._read, i) for i in indices]
                self._batches.put(self._collator.submit(self._collate, indices, reads))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, which raises it
            self._batches.put(None if self._closed.is_set() else err)
            return
        self._batches.put(None)

    def __iter__(self) -> Iterator[Batch]:
        try:
            while (item := self._batches.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                with self.clock.host("wait"):
                    batch = item.result()
                yield batch
                self._room.release()  # the consumer wants the next batch: one more may be read
        finally:
            self.close()

    def recycle(self, batch: Batch) -> None:
        """`batch` is done with (its copy to the GPU too): its buffer holds a later batch."""
        if batch.storage is not None:
            self._buffers.give(batch.storage)
            batch.storage = None

    def close(self) -> None:
        """Stop reading: reads not started are dropped; returns when the threads have ended."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._room.release()  # a feeder waiting for room wakes up and stops
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._collator.shutdown(wait=True, cancel_futures=True)
        self._feeder.join()

    def _read(self, i: int) -> tuple[torch.Tensor | AudioError, float]:
        start = time.perf_counter()
        try:
            audio = self.read(self.items[i])
        except AudioError as err:
            return err, time.perf_counter() - start
        return audio, time.perf_counter() - start

    def _collate(self, indices: list[int], reads: list[Future]) -> Batch:
        ok, failed = [], []
        for i, read in zip(indices, reads):
            audio, seconds = read.result()
            self.clock.add("read", seconds)
            if isinstance(audio, AudioError):
                failed.append((i, str(audio)))
            else:
                ok.append((i, _name(self.items[i]), audio))
        return collate(ok, self._buffers, self.pad_to, self.pin, failed)


def collate(
    rows: list[tuple[int, str, torch.Tensor]],
    buffers: HostBuffers,
    pad_to: int = 0,
    pin: bool = False,
    failed: list[tuple[int, str]] | None = None,
) -> Batch:
    """(index, source, (L,) samples) rows -> one Batch: the samples zero-padded into a (B, L) buffer from
    `buffers`, L rounded up to a multiple of `pad_to` samples (0: the longest row's length)."""
    lengths = torch.tensor([a.numel() for _, _, a in rows], dtype=torch.long)  # (B,)
    width = max((a.numel() for _, _, a in rows), default=0)
    if pad_to:
        width = -(-width // pad_to) * pad_to
    storage = buffers.take(len(rows) * width)
    padded = storage[: len(rows) * width].view(len(rows), width)
    for row, (_, _, audio) in enumerate(rows):  # (B, L)
        padded[row, : audio.numel()].copy_(audio)
        padded[row, audio.numel() :].zero_()
    return Batch(
        [i for i, _, _ in rows],
        [source for _, source, _ in rows],
        padded,
        lengths.pin_memory() if pin else lengths,
        list(failed or []),
        storage,
    )


def gather(
    rows: list[tuple[int, str, torch.Tensor]], device: torch.device, stream: torch.cuda.Stream, pad_to: int = 0
) -> Batch:
    """`collate` for a CUDA device, with no copy on the host: each row's samples, in pinned memory where they were
    received (`Service.samples_buffer`), copied straight into a zeroed (B, L) tensor on `device`, on `stream` (the
    GPU runs the copies beside the work queued before them); the current stream waits for them. The server's
    batching thread then only launches copies: copying every row into one pinned buffer takes a fifth of its time,
    while the GPU waits (bench/2026-11-server/run34, run38, run39)."""
    lengths = torch.tensor([a.numel() for _, _, a in rows], dtype=torch.long)  # (B,)
    width = max((a.numel() for _, _, a in rows), default=0)
    if pad_to:
        width = -(-width // pad_to) * pad_to
    current = torch.cuda.current_stream(device)
    with torch.cuda.stream(stream):
        padded = torch.zeros(len(rows), width, device=device)  # (B, L)
        for row, (_, _, audio) in enumerate(rows):
            padded[row, : audio.numel()].copy_(audio, non_blocking=True)
    current.wait_stream(stream)
    padded.record_stream(current)  # made on the copy stream, used and freed on the current one
    return Batch([i for i, _, _ in rows], [source for _, source, _ in rows], padded, lengths.pin_memory())


class HostBuffers:
    """Host buffers for the batches' audio, reused batch after batch (pinned ones when the model is on CUDA):
    pinning new memory (cudaHostAlloc) took 5-30 ms a batch and holds up the main thread's CUDA calls meanwhile
    on an H100, and PyTorch's pinned-memory cache keeps blocks by power-of-two size, so batches
    shrinking longest-first asked it for new ones. At most `keep` free buffers are kept (the largest)."""

    def __init__(self, keep: int, pin: bool):
        self.keep, self.pin = keep, pin
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> torch.Tensor:
        """A flat float32 buffer of at least n elements: the smallest free one that fits, or a new one."""
        with self._lock:
            fits = [k for k, b in enumerate(self._free) if b.numel() >= n]  # largest first: the last one is smallest
            if fits:
                return self._free.pop(fits[-1])
        return torch.empty(max(n, 1), pin_memory=self.pin)

    def give(self, buffer: torch.Tensor) -> None:
        with self._lock:
            self._free.append(buffer)
            self._free.sort(key=torch.Tensor.numel, reverse=True)
            del self._free[self.keep :]


@dataclass
class _Job:
    """A batch on its way through the model."""

    batch: Batch
    encoded: torch.Tensor | None = None  # (B, T', D)
    frames: torch.Tensor | None = None  # (B,) encoder frames
    ready: torch.cuda.Event | None = None  # CUDA: recorded after the encoder, on its stream
    hyps: list[Hypothesis] | None = None
    out_of_memory: bool = False
    seconds: float = 0.0  # host time spent on it


def read_ahead(
    items: list,
    sample_rate: int,
    device: torch.device,
    batch_size: int | None = None,
    batch_seconds: float | None = None,
    clock: StageClock | None = None,
    read: Callable[[object], torch.Tensor] | None = None,
    dtype: torch.dtype | None = None,
    batches: Iterable[list[int]] | None = None,
    ahead: int = READ_AHEAD,
) -> ReadAhead:
    """A `ReadAhead` of `items` (paths or arrays) for a model at `sample_rate` on `device` in `dtype`, reading from
    now on. batch_size, batch_seconds None: the device's (`default_batching`); read: `audio.read_input` at the
    rate; batch shapes rounded up to PAD_SECONDS on CUDA in 16 bits (dtype None: float32). batches: index lists
    handed out elsewhere instead of its own plan (a device worker's); ahead: batches read ahead."""
    files, seconds = default_batching(device, dtype)
    return ReadAhead(
        items,
        read or functools.partial(read_input, sample_rate=sample_rate),
        sample_rate,
        batch_size or files,
        seconds if batch_seconds is None else batch_seconds,
        pin=device.type == "cuda",
        workers=default_workers(device),
        clock=clock,
        read_ahead=ahead,
        pad_to=pad_samples(device, dtype, sample_rate),
        batches=batches,
    )


def pad_samples(device: torch.device, dtype: torch.dtype | None, sample_rate: int) -> int:
    """`collate`'s pad_to for a model on `device` in `dtype` (None: float32): PAD_SECONDS on CUDA in 16 bits, else 0."""
    pad = device.type == "cuda" and dtype is not None and dtype.itemsize == 2
    return round(PAD_SECONDS * sample_rate) if pad else 0


def transcribe_stream(
    model: LoadedModel,
    reads: ReadAhead,
    clock: StageClock | None = None,
    timings: bool = True,
    render: Sequence[str] = (),
    renderer: RenderPool | None = None,
) -> Iterator[tuple[int, Transcript]]:
    """Yield (index, Transcript) for every input of `reads`, a batch at a time, longest first; `timings=False`
    leaves out the token, word and segment times (text and token ids only: less host work a file), as does a
    batch's own `timings=False`.

    reads: a ReadAhead, or any source of Batches with `items`, `recycle` and `close` (the server's). The next
    batch is taken, and queued up to its encoder, while one decodes (on CUDA once its first steps are queued);
    an empty Batch (no rows) has the one before it finished at once, so a source that is about to wait for
    inputs yields one first.

    With timings, a batch's transcripts are made on a thread of their own (`_Finisher`) while this one queues and
    decodes the next batches: this thread spends most of a batch waiting for the GPU. `render`, output formats
    (`writers.WRITERS`' names): with timings, transcripts are made and rendered by worker processes instead
    (`finishing.RenderPool`), and come light: text, token ids and `rendered`, no token, word or segment objects.
    Their millisecond of Python a file would otherwise hold the GIL that this thread launches the GPU's work with.
    `renderer`: the caller's pool instead of one made for `render` (the CLI's writes the output files too), to
    use with timings; the caller closes it."""
    clock = clock or StageClock(model.device, enabled=False)
    items = reads.items
    streams = _Streams(model.device)
    own = renderer is None and bool(render) and timings  # what it makes, it closes
    renderer = RenderPool(model.finishing, render) if own else renderer
    finisher = _Finisher(model, clock, timings, renderer) if timings else None
    source = iter(reads)

    def queue_next() -> _Job | None:  # the next batch, queued up to its encoder; None at the end
        batch = next(source, None)
        return None if batch is None else _start(model, batch, clock)

    def failed(job: _Job) -> list[tuple[int, Transcript]]:
        return [(i, Transcript(source=_name(items[i]), error=error)) for i, error in job.batch.failed]

    try:
        encoded = queue_next()  # queued up to its encoder, not decoded yet
        if encoded is not None:
            yield from failed(encoded)
        while encoded is not None:
            # the next batch is queued while this one decodes: on CUDA once the decode's first steps are on the GPU
            # (its encoder runs beside them), so this one's answer waits for no launch of the next one's
            upcoming: list[_Job | None] = []
            decoded = _decode(model, encoded, clock, streams, then=lambda: upcoming.append(queue_next()))
            if not upcoming:  # not called: nothing decoded on a GPU (no rows, out of memory, the CPU)
                upcoming.append(queue_next())
            following = upcoming[0]
            last = following is None
            # here, in order: one at a time runs the GPU; a batch without times is text only (tens of microseconds
            # a row), answered now rather than a batch later
            if finisher is None or decoded.out_of_memory or not decoded.batch.timings:
                yield from finisher.drain() if finisher else ()
                yield from _finish(model, decoded, clock, streams, timings, renderer)
            else:
                finisher.submit(decoded)
                # the end, or an empty batch (the source is about to wait): everything answered now
                yield from finisher.drain() if last or not following.batch.indices else finisher.ready()
            if not last:
                reads.recycle(encoded.batch)  # decoded, so copied to the GPU long ago
                if finisher is None:
                    yield from failed(following)
                else:
                    finisher.add(failed(following))
            encoded = following
        yield from finisher.drain() if finisher else ()
    finally:  # also when the caller stops early: reads not started are dropped
        if finisher is not None:
            finisher.close()
        if own:
            renderer.close()
        reads.close()


class _Finisher:
    """Decoded batches made into transcripts on one thread (or by `renderer`'s processes, which that thread waits
    for), handed back in the order they were given."""

    def __init__(self, model: LoadedModel, clock: StageClock, timings: bool, renderer: RenderPool | None = None):
        self.model, self.clock, self.timings, self.renderer = model, clock, timings, renderer
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="graphscribe-finish")
        self._queue: collections.deque[Future] = collections.deque()

    def submit(self, job: _Job) -> None:
        self._queue.append(
            self._pool.submit(lambda: list(_finish(self.model, job, self.clock, None, self.timings, self.renderer)))
        )

    def add(self, results: list[tuple[int, Transcript]]) -> None:
        if not results:
            return
        done: Future = Future()
        done.set_result(results)
        self._queue.append(done)

    def ready(self) -> Iterator[tuple[int, Transcript]]:
        """What is done already, in order; waits only to keep at most two batches unfinished."""
        while self._queue and (self._queue[0].done() or len(self._queue) > 2):
            yield from self._queue.popleft().result()

    def drain(self) -> Iterator[tuple[int, Transcript]]:
        while self._queue:
            yield from self._queue.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class _Streams:
    """Where decoding runs: on CUDA a stream of its own (high priority: its small step kernels then start as soon
    as the encoder's leave an SM free), waiting for its batch's encoder; elsewhere the current one."""

    def __init__(self, device: torch.device):
        self.decode = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        self.encode: torch.cuda.Stream | None = None  # while decoding: the stream the caller was on

    @contextlib.contextmanager
    def decoding(self, job: _Job):
        if self.decode is None:
            yield
            return
        self.decode.wait_event(job.ready)
        job.encoded.record_stream(self.decode)  # made on the encoder's stream: not reused before decoding is done
        job.frames.record_stream(self.decode)
        self.encode = torch.cuda.current_stream(self.decode.device)
        try:
            with torch.cuda.stream(self.decode):
                yield
        finally:
            self.encode = None

    def outside(self):
        """Back on the caller's stream while decoding (the next batch's features and encoder)."""
        return torch.cuda.stream(self.encode) if self.encode is not None else contextlib.nullcontext()


def default_workers(device: torch.device) -> int:
    """Reader threads: up to MAX_READERS beside a GPU; 2 on the CPU, where the model wants the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_READERS, cores)) if device.type == "cuda" else 2


def _start(model: LoadedModel, batch: Batch, clock: StageClock) -> _Job:
    """Queue the copy to the device, features and encoder; out of memory marks the job for one-at-a-time."""
    job = _Job(batch)
    if not batch.indices:
        return job
    start = time.perf_counter()
    samples = batch.lengths.tolist()
    window = model.attention_for(samples, batch.sources)  # full, or local for hours of audio
    try:
        front = model.front_packing(samples, batch.audio.shape[1], window)  # the clips end to end, or None
        with clock.gpu("features"):
            features, feature_frames = model.batch_features(batch.audio, batch.lengths, front)
        with clock.gpu("encoder"):
            job.encoded, job.frames = model.encoder_output(features, feature_frames, window, samples, front)
        if model.device.type == "cuda":
            job.ready = torch.cuda.Event()
            job.ready.record()
    except (torch.OutOfMemoryError, RuntimeError) as err:
        _out_of_memory_or_raise(model, err)
        job.out_of_memory = True
    job.seconds += time.perf_counter() - start
    return job


def _decode(
    model: LoadedModel, job: _Job, clock: StageClock, streams: _Streams, then: Callable[[], None] | None = None
) -> _Job:
    """Decode a job queued up to its encoder. then: on CUDA, called once the decode's first round of steps is
    queued, before the host waits for it, on the stream the encoder runs on: the caller's next batch is launched
    while this one decodes."""
    if job.encoded is None:
        return job
    start = time.perf_counter()
    aside = 0.0  # host time in `then`, its own job's
    raised: list[BaseException] = []  # by `then`: raised once this job is decoded, not taken for its failure

    def meanwhile() -> None:
        nonlocal aside
        began = time.perf_counter()
        try:
            with streams.outside():
                then()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            raised.append(err)
        aside += time.perf_counter() - began

    try:
        with streams.decoding(job), clock.gpu("decode"):
            job.hyps = model.decode(job.encoded, job.frames, meanwhile if then and streams.decode else None)
    except (torch.OutOfMemoryError, RuntimeError) as err:
        _out_of_memory_or_raise(model, err)
        job.out_of_memory = True
    job.encoded = job.frames = None  # the encoder output's memory is reused once decoding is done (record_stream)
    job.seconds += time.perf_counter() - start - aside
    if raised:
        raise raised[0]
    return job


def _finish(
    model: LoadedModel,
    job: _Job,
    clock: StageClock,
    streams: _Streams,
    timings: bool,
    renderer: RenderPool | None = None,
) -> Iterator[tuple[int, Transcript]]:
    """A decoded job's transcripts (light and rendered by `renderer` when given); one that ran out of memory is
    redone one input at a time."""
    batch = job.batch
    if job.out_of_memory:
        yield from (_alone(model, batch.row(r), clock, streams, timings, renderer) for r in range(len(batch.indices)))
        return
    if job.hyps is None:
        return
    start = time.perf_counter()
    with clock.host("text"):
        if renderer is not None:
            transcripts = renderer.transcripts(batch.sources, batch.lengths.tolist(), job.hyps, batch.indices)
        else:
            transcripts = [
                model.finish(source, int(n), hyp, 0.0, timings and batch.timings)
                for n, source, hyp in zip(batch.lengths.tolist(), batch.sources, job.hyps)
            ]
    seconds = (job.seconds + time.perf_counter() - start) / len(transcripts)  # its batch's host time, shared
    for transcript in transcripts:
        transcript.seconds = seconds
    yield from zip(batch.indices, transcripts)


def _alone(
    model: LoadedModel, batch: Batch, clock: StageClock, streams: _Streams, timings: bool, renderer: RenderPool | None
) -> tuple[int, Transcript]:
    """One input, start to end; an error if it does not fit in memory either."""
    job = _decode(model, _start(model, batch, clock), clock, streams)
    if not job.out_of_memory:
        [result] = _finish(model, job, clock, streams, timings, renderer)
        return result
    minutes = int(batch.lengths[0]) / model.sample_rate / 60
    source = batch.sources[0]
    return batch.indices[0], Transcript(
        source=source,
        error=(
            f"{source}: out of {model.device.type.upper()} memory for {minutes:.1f} min of audio; "
            "try --attention local, a smaller --attention-window, or split the file"
        ),
    )


def _out_of_memory_or_raise(model: LoadedModel, err: Exception) -> None:
    text = str(err)
    if not (isinstance(err, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text):
        raise err
    if model.device.type == "cuda":
        model.release_graphs()
        torch.cuda.empty_cache()


def _estimated_seconds(item, sample_rate: int) -> float:
    """Length used to order batches; 0 for what cannot be inspected (it fails properly when read)."""
    if isinstance(item, (str, os.PathLike)):
        return audio_seconds(item) or 0.0
    try:
        return len(item) / sample_rate
    except TypeError:
        return 0.0


def _name(item) -> str:
    return str(item) if isinstance(item, (str, os.PathLike)) else "<array>"
