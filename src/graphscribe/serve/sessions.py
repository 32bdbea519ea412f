"""Live sessions in the server's engine: the realtime WebSocket's turns as streams of one `StreamEngine`, stepped by
the service's batching thread between its batches of uploads.

    HTTP worker (realtime.py): a turn's audio, resampled to the model's rate -> OPEN, AUDIO..., FINISH (or DROP),
    each burst of its audio thread's operations in one message
    intake thread: `apply` queues the operations and nudges the batching thread
    batching thread (service._Batches): while the GPU has no upload batch in flight, `run`: the operations applied,
    then every stream with a chunk ready stepped as one batch -> `emit([(key, said), ...])`, what each stream that
    said something said (one message a worker, sent on by its writer thread)

One thread runs the model: the decode steps' buffers and captured graphs are the uploads' too, so the streams are
stepped where the uploads' batches are made, once the batch before is answered (service.py). A stream is stepped
as soon as a chunk is ready on an idle GPU; while a step runs, more become ready, so a loaded server's steps fill by
themselves, as its upload batches do.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable

from graphscribe.io.hotwords import HotwordError
from graphscribe.runtime.cache_aware_streams import engine_for
from graphscribe.runtime.streaming import Stream, StreamEngine, StreamEvent
from graphscribe.serve.ipc import AUDIO, DROP, OPEN

GATHER_SECONDS = 0.02  # a step waits this long at most after its first stream was ready (`step_in`)

if TYPE_CHECKING:
    from graphscribe.api import Model


@dataclass
class Said:
    """What a turn's stream said in one step: the turn's text so far (its finals, then the open utterance's text),
    how many samples of its audio that step needed, and, after its last step, the whole text."""

    text: str
    needed: int  # samples from the turn's start the step's chunk and right context took
    done: str | None = None
    audio_samples: int = 0  # the turn's samples, with `done`
    error: str | None = None  # the turn could not be transcribed (its engine died): it failed, nothing more comes


class LiveSessions:
    """Turns of the realtime sessions, each a stream of one engine (module docstring). `emit([(key, said), ...])` is
    called on the batching thread after each step."""

    def __init__(
        self,
        model: Model,
        emit: Callable[[list[tuple[Hashable, Said]]], None],
        nudge: Callable[[], None],
        on_step: Callable[[int, float], None] | None = None,
    ):
        self.model, self.emit, self.nudge, self.on_step = model, emit, nudge, on_step
        self.engine: StreamEngine | None = None  # made on the batching thread (its first use warms it up)
        self.boosted: StreamEngine | None = None  # the turns with phrases of their own: made at the first
        self._ops: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._streams: dict[Hashable, Stream] = {}  # batching thread only
        self._ready: dict[Hashable, Stream] = {}  # streams with a chunk ready, for the next step
        self._ready_since: float | None = None  # when the first of them became ready

    # ------------------------------------------------------------------ any thread (the intake threads)
    def apply(self, ops: list[tuple]) -> None:
        """Operations (OPEN | AUDIO | FINISH | DROP, key, samples or None; an OPEN's: its turn's own phrases or
        None), queued in order; the batching thread applies them at its next step. An OPEN's phrases become their
        tree here, on the caller's thread; a phrase that cannot be boosted fails its turn (`Said.error`), whose
        other operations then find no stream and are dropped."""
        failed = []
        for i, (op, key, value) in enumerate(ops):
            if op == OPEN and value:
                try:
                    ops[i] = (op, key, self.model.row_tree(value))
                except HotwordError as err:
                    ops[i] = (DROP, key, None)
                    failed.append((key, Said("", 0, error=str(err))))
        with self._lock:
            self._ops.extend(ops)
        if failed:
            self.emit(failed)
        self.nudge()

    def drop_all(self, owner: Callable[[Hashable], bool]) -> None:
        """Every turn whose key `owner` claims dropped (a worker that died: its clients are gone)."""
        self.apply([(DROP, owner, None)])

    # ------------------------------------------------------------------ the batching thread
    def step_in(self) -> float | None:
        """Seconds until the next step is due: 0 now, None while no stream has a chunk ready. A step waits up to
        GATHER_SECONDS after the first stream became ready, for others to become ready too: a step costs the GPU
        about the same for one stream as for dozens, so a step for each stream as it becomes ready would spend
        the GPU's time on one-row steps (bench/README.md has the measurement)."""
        if self._ready_since is None:
            return None
        if len(self._ready) >= self.engine.max_rows:
            return 0.0
        return max(0.0, self._ready_since + GATHER_SECONDS - time.monotonic())

    def warm_up(self, most: int) -> None:
        """The engine made and warmed up for up to `most` streams at once (`StreamEngine.warm_up`)."""
        self._engine().warm_up(most)

    def apply_ops(self) -> None:
        """The operations waiting, applied: any time on the batching thread (no decode buffer is touched). Only the
        streams an operation touches are looked at: with a thousand turns open, operations come thousands of
        times a second."""
        if not self._ops:
            return
        engine = self._engine()
        with self._lock:
            ops, self._ops = self._ops, collections.deque()
        finished: dict[Hashable, Stream] = {}  # finished with no audio: `done` at once, no step
        for op, key, samples in ops:
            if op == OPEN:
                if key in self._streams:  # a worker's bug: the old turn is dropped
                    self._forget(key)
                self._streams[key] = engine.open() if samples is None else self._boosted().open(samples)
            elif op == DROP:
                for k in [k for k in self._streams if key(k)] if callable(key) else [key]:
                    self._forget(k)
                    finished.pop(k, None)
            elif (stream := self._streams.get(key)) is not None:
                if op == AUDIO:
                    stream.feed(samples)
                elif not stream.finished:
                    stream.finish()
                    if stream.closed:
                        finished[key] = stream
                if stream.ready and key not in self._ready:
                    self._ready[key] = stream
                    if self._ready_since is None:
                        self._ready_since = time.monotonic()
        if finished:
            self.emit([(key, self._said(stream, stream.take_events())) for key, stream in finished.items()])
            for key in finished:
                self._forget(key)

    def step(self) -> int:
        """Step every stream with a chunk ready, once, as one batch (the batching thread, with no upload batch in
        flight); the streams stepped."""
        start = time.perf_counter()
        stepped, self._ready, self._ready_since = self._ready, {}, None
        streams = [s for s in stepped.values() if s.ready]
        for engine in (self.engine, self.boosted):
            if engine is not None and (mine := [s for s in streams if s.engine is engine]):
                engine.step(mine)
        said = []
        for key, stream in stepped.items():
            if stream.events:
                said.append((key, self._said(stream, stream.take_events())))
            if stream.closed:
                self._forget(key)
            elif stream.ready:  # another chunk already here: in the next step
                self._ready[key] = stream
        if self._ready:  # streams behind by a chunk more: they gather company from now, as a new one would
            self._ready_since = time.monotonic()
        if said:
            self.emit(said)
        if self.on_step is not None:
            self.on_step(len(streams), time.perf_counter() - start)
        return len(streams)

    def _forget(self, key: Hashable) -> None:
        stream = self._streams.pop(key, None)
        self._ready.pop(key, None)
        if not self._ready:
            self._ready_since = None
        if stream is not None and not stream.closed:
            stream.engine.close(stream)

    @property
    def chunk_samples(self) -> int:
        """Samples a step takes of a stream: a turn's audio needs to reach the engine only as it passes each
        multiple of this (the HTTP workers hold it until then)."""
        return self._engine().geometry.frame_samples

    def _engine(self) -> StreamEngine:
        if self.engine is None:
            self.engine = engine_for(self.model)
        return self.engine

    def _boosted(self) -> StreamEngine:
        """The engine of the turns boosted by their own phrases: greedy with each row's tree, stepped apart from
        the others (whose steps keep the model's own decoder)."""
        if self.boosted is None:
            self.boosted = engine_for(self.model, boosted=True)
        return self.boosted

    def _said(self, stream: Stream, events: list[StreamEvent]) -> Said:
        done = next((e for e in events if e.type == "done"), None)
        if done is not None:
            return Said(done.text, stream.fed, done.text, stream.fed)
        # the finals so far, then the open utterance as its final would say it now: the text then grows as the
        # turn's whole text will read, not as the partial's pieces do
        text = stream.final_text
        open_text, spaced = stream.text.open_text()
        if open_text:
            text = text + (" " if spaced and text else "") + open_text if text else open_text
        return Said(text, min(stream.fed, stream.steps * self.engine.geometry.frame_samples + 1))
