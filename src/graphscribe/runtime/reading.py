"""Reading ahead of the GPU: input files decoded by threads a few batches ahead (ReadAhead), laid out in pinned host
buffers and collated into padded batches (Batch), in the order a batch plan gives."""

from __future__ import annotations

import functools
import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from graphscribe.io.audio import AudioError, audio_seconds, read_input
from graphscribe.runtime.clock import StageClock
from graphscribe.runtime.defaults import default_batching, default_workers, pad_samples
from graphscribe.runtime.scheduler import plan_batches

READ_AHEAD = 2  # batches read ahead of the one being transcribed


@dataclass
class Batch:
    """Read audio of one batch, ready for the model; inputs that could not be read are in `failed`."""

    indices: list[int]  # positions in the inputs, one per row
    sources: list[str]  # one per row
    audio: torch.Tensor  # (B, L) float32, zero-padded; pinned when the model is on CUDA, or on it already (`gather`)
    lengths: torch.Tensor  # (B,) int64 samples
    failed: list[tuple[int, str]] = field(default_factory=list)  # (index, error) of unreadable inputs
    storage: torch.Tensor | None = None  # the (pinned) host buffer `audio` is a view of (`ReadAhead.recycle`)
    word_times: bool = True  # False: this batch's transcripts leave out the times even when the stream keeps them
    confidence: bool = False  # True: its tokens' confidences too, whatever the model's options (a server's request)
    trees: list | None = None  # each row's own boosting tree (`LoadedModel.row_tree`; None: none), or None
    beams: list[int] | None = None  # each row's own beam size (a server's requests; `LoadedModel.decode`), or None

    def row(self, r: int) -> "Batch":
        n = int(self.lengths[r])
        return Batch(
            [self.indices[r]],
            [self.sources[r]],
            self.audio[r : r + 1, :n],
            self.lengths[r : r + 1],
            word_times=self.word_times,
            confidence=self.confidence,
            trees=self.trees[r : r + 1] if self.trees is not None else None,
            beams=self.beams[r : r + 1] if self.beams is not None else None,
        )


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
                    break  # the end marker still goes in: a consumer iterating after `close` ends, not waits
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
                if self._closed.is_set():  # closed: what was queued before is not read (its reads were cancelled)
                    break
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
                ok.append((i, input_name(self.items[i]), audio))
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
    batching thread then only launches copies: copying every row into one pinned buffer would take a fifth of its
    time, while the GPU waits."""
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
    pinning new memory (cudaHostAlloc) takes 5-30 ms a batch on an H100 and holds up the main thread's CUDA calls
    meanwhile, and PyTorch's pinned-memory cache keeps blocks by power-of-two size, so batches shrinking
    longest-first would ask it for new ones. At most `keep` free buffers are kept (the largest)."""

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


def _estimated_seconds(item, sample_rate: int) -> float:
    """Length used to order batches; 0 for what cannot be inspected (it fails properly when read)."""
    if isinstance(item, (str, os.PathLike)):
        return audio_seconds(item) or 0.0
    try:
        return max(np.shape(item), default=0) / sample_rate  # (L,), (L, C) or (C, L): the samples are the longest
    except (TypeError, ValueError):
        return 0.0


def input_name(item) -> str:
    return str(item) if isinstance(item, (str, os.PathLike)) else "<array>"
