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

from graphscribe.runtime.streaming import Stream, StreamEngine, StreamEvent
from graphscribe.serve.ipc import AUDIO, DROP, OPEN

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
        self._ops: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._streams: dict[Hashable, Stream] = {}  # batching thread only
        self._maybe_ready: dict[Hashable, Stream] = {}  # fed, finished or stepped since the last step
        self.open_count = 0  # turns open (metrics)

    # ------------------------------------------------------------------ any thread (the intake threads)
    def apply(self, ops: list[tuple]) -> None:
        """Operations (OPEN | AUDIO | FINISH | DROP, key, samples or None), queued in order; the batching thread
        applies them at its next step."""
        with self._lock:
            self._ops.extend(ops)
        self.nudge()

    def drop_all(self, owner: Callable[[Hashable], bool]) -> None:
        """Every turn whose key `owner` claims dropped (a worker that died: its clients are gone)."""
        self.apply([(DROP, owner, None)])

    # ------------------------------------------------------------------ the batching thread
    @property
    def due(self) -> bool:
        """Work waits: operations to apply, or a stream with a chunk ready."""
        return bool(self._ops) or any(s.ready for s in self._maybe_ready.values())

    def warm_up(self, rows: list[int]) -> None:
        """Step batches of `rows` streams of silence and speech once each (graphs captured, kernels loaded)."""
        from graphscribe.io.audio import read_input, speech_path
        from graphscribe.runtime.pipeline import WARM_UP_CLIP

        engine = self._engine()
        clip = read_input(speech_path(WARM_UP_CLIP), self.model.sample_rate).numpy()
        for n in rows:
            streams = [engine.open() for _ in range(n)]
            for s in streams:
                s.feed(clip[: 2 * engine.geometry.frame_samples + 1])
            engine.step(streams)
            for s in streams:
                engine.close(s)

    def run(self) -> int:
        """Apply the operations waiting, then step every stream with a chunk ready, once; the streams stepped.
        Only the streams an operation or the last step touched are looked at: with a thousand turns open, the
        operations come thousands of times a second."""
        start = time.perf_counter()
        engine = self._engine()
        with self._lock:
            ops, self._ops = self._ops, collections.deque()
        finished: dict[Hashable, Stream] = {}  # finished with no audio: `done` at once, no step
        for op, key, samples in ops:
            if op == OPEN:
                if key in self._streams:  # a worker's bug: the old turn is dropped
                    self._forget(key)
                self._streams[key] = engine.open()
            elif op == DROP:
                for k in [k for k in self._streams if key(k)] if callable(key) else [key]:
                    self._forget(k)
                    finished.pop(k, None)
            elif (stream := self._streams.get(key)) is not None:
                self._maybe_ready[key] = stream
                if op == AUDIO:
                    stream.feed(samples)
                elif not stream.finished:
                    stream.finish()
                    if stream.closed:
                        finished[key] = stream
        ready = {k: s for k, s in self._maybe_ready.items() if s.ready}
        if ready:
            engine.step(list(ready.values()))
        self._maybe_ready = ready  # stepped: each may have another chunk ready
        said = []
        for key, stream in [*ready.items(), *finished.items()]:
            if stream.events or key in finished:
                said.append((key, self._said(stream, stream.take_events())))
            if stream.closed:
                self._forget(key)
        if said:
            self.emit(said)
        self.open_count = len(self._streams)
        if self.on_step is not None:
            self.on_step(len(ready), time.perf_counter() - start)
        return len(ready)

    def _forget(self, key: Hashable) -> None:
        stream = self._streams.pop(key, None)
        self._maybe_ready.pop(key, None)
        if stream is not None and not stream.closed:
            self.engine.close(stream)

    def _engine(self) -> StreamEngine:
        if self.engine is None:
            self.engine = StreamEngine(self.model)
        return self.engine

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
