"""What the engine (server.py) and its HTTP workers (http_front.py) share: the messages on a worker's pipe, the
settings a worker starts with, and the admission counts. No Starlette or uvicorn here: the engine imports this, and
`transcribe serve --help` prints without the serve extra.

Messages on a worker's pipe are pickled tuples:
    worker -> engine   (UP,)   (SUBMIT, id, bytes, word_times, name, confidence, hotwords, beam) + the samples
                       (METRICS, id)
                       (LOG, path, status, seconds, audio seconds, access-log line)
                       (TURNS, [(OPEN | AUDIO | FINISH | DROP, turn, bytes), ...], bytes in all) + the AUDIO
                       operations' samples end to end, raw: the realtime turns' operations of one burst of the
                       worker's audio thread (one message for many sessions' appends)
    engine -> worker   (READY, health, max_queue, sample_rate, chunk samples of a live step)   (DONE, id, transcript, times)
                       (REFUSED, id)   (METRICS, id, text)   (SAID, [(turn, sessions.Said), ...]) a step's
A SUBMIT's samples follow it as a message of their own, raw float32 bytes, which the engine reads straight into an
array (`receive_samples`): pickled with it, they would be copied four times over in the engine, each copy holding
the GIL that its batching thread launches the GPU's work with (~0.7 ms a 7.5 s request on a 2-core machine against
~0.15 ms raw, most of it in the kernel; bench/2026-11-server/run15-run16).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import pickle
import socket
import struct
import tempfile
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection

import numpy as np

from graphscribe.io.config import MAX_AUDIO_SECONDS
from graphscribe.output.transcript import Transcript

SUBMIT, LOG, METRICS, UP, READY, DONE, REFUSED = "submit", "log", "metrics", "up", "ready", "done", "refused"
OPEN, AUDIO, FINISH, DROP, SAID, TURNS = "open", "audio", "finish", "drop", "said", "turns"
UPLOAD_STALL_SECONDS = 30.0  # an upload with no byte for this long is refused (408) and its place freed


class EngineLost(Exception):
    """The engine's end of the pipe closed: nothing more will be transcribed."""


@dataclass
class BadRequest(Transcript):
    """The engine's answer to a request refused for one of its fields (its `hotwords`): a 400 naming `param`, with
    `error` saying why; it goes back wherever a transcript goes."""

    param: str | None = None


@dataclass
class FrontSettings:
    """What every HTTP worker is told at its start."""

    model_name: str
    api_key: str | None
    max_upload: int  # bytes
    upload_stall: float = UPLOAD_STALL_SECONDS
    metrics_public: bool = False  # /metrics answers without the API key
    max_audio_seconds: float = MAX_AUDIO_SECONDS  # an upload of more audio is refused (400)
    max_sessions: int = 0  # realtime sessions open at once over every worker (0: none)
    session_idle: float = 0.0  # seconds a realtime session may send nothing before it is closed
    vad: bool = True  # server_vad available (Silero's model through onnxruntime)
    prompt_as_hotwords: bool = False  # a request's `prompt` (a session's transcription prompt) boosted as hotwords


class Admission:
    """Transcription requests the HTTP workers hold at once (uploading, decoding, waiting or running), at most the
    engine's max_queue over every worker.

    The engine owns the counts, one per worker slot, in a small file mapped into every worker's memory. A worker
    admits a request under an exclusive record lock on that file (`fcntl.lockf`): its count goes up while the sum of
    every slot's is under the limit, and down when the request is answered. The kernel releases a record lock when
    its holder dies, and the engine zeroes a dead worker's count before its replacement takes the slot: a worker
    killed with requests in flight, or in the middle of admitting one, leaves no place taken for good (one count
    shared by the workers, behind a semaphore, kept a killed worker's places for ever, issue 46).
    """

    _INT = 4  # bytes a count

    def __init__(self, slots: int, fd: int | None = None):
        if fd is None:
            with tempfile.TemporaryFile(prefix="graphscribe-admission-") as f:  # unlinked: nothing left on disk
                fd = os.dup(f.fileno())
            os.ftruncate(fd, slots * self._INT)
        self.slots, self.fd = slots, fd
        self._memory = mmap.mmap(fd, slots * self._INT)
        self.counts = memoryview(self._memory).cast("i")  # (slots,) requests each worker holds

    def __reduce__(self):  # to a spawned worker: its own descriptor of the same file
        return _attach, (self.slots, reduction.DupFd(self.fd))

    def admit(self, slot: int, limit: int) -> bool:
        """One more request for the worker in `slot`, if the workers hold fewer than `limit`."""
        fcntl.lockf(self.fd, fcntl.LOCK_EX)
        try:
            if sum(self.counts) >= limit:
                return False
            self.counts[slot] += 1
            return True
        finally:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)

    def release(self, slot: int) -> None:
        """A request of the worker in `slot` answered. No lock: only that worker writes its count while it lives,
        and an admission that reads the old count only refuses one request it could have taken."""
        self.counts[slot] -= 1

    def clear(self, slot: int) -> int:
        """The engine's, once the worker in `slot` is dead: the places it held freed; how many there were."""
        held, self.counts[slot] = self.counts[slot], 0
        return held

    @property
    def total(self) -> int:
        return sum(self.counts)


def _attach(slots: int, fd: reduction.DupFd) -> Admission:
    return Admission(slots, fd.detach())


def send(conn: Connection, message: tuple) -> None:
    """One message on a pipe; the caller makes sure one thread writes at a time."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive_samples(conn: Connection, nbytes: int, into: np.ndarray | None = None) -> np.ndarray:
    """The raw message of `nbytes` that follows a SUBMIT, as float32 samples: read from the pipe straight into
    `into` (float32, nbytes of it; None: a new array; the kernel copies, with the GIL released), in the framing
    `Connection.send_bytes` wrote it with."""
    fd = conn.fileno()
    (size,) = struct.unpack("!i", _read_exactly(fd, 4))
    if size == -1:  # past 2 GiB
        (size,) = struct.unpack("!Q", _read_exactly(fd, 8))
    if size != nbytes:  # a bug on one side of the pipe, never an upload's doing
        raise ValueError(f"the samples' message has {size} bytes, not the {nbytes} announced")
    samples = np.empty(nbytes // 4, dtype=np.float32) if into is None else into
    if samples.nbytes != nbytes:
        raise ValueError(f"the samples' message has {nbytes} bytes, not the {samples.nbytes} made room for")
    _read_exactly(fd, nbytes, memoryview(samples).cast("B"))
    return samples


def _read_exactly(fd: int, n: int, into: memoryview | None = None) -> memoryview:
    """n bytes from `fd`. From a socket (a duplex Connection's) in one call that waits for all of them: the engine's
    batching thread holds the GIL nearly all the time, and a reader that wakes for each part of a message waits for
    the GIL each time (up to the switch interval, 5 ms)."""
    into = memoryview(bytearray(n)) if into is None else into
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # a pipe
        sock = None
    got = 0
    try:
        while got < n:
            if sock is not None:
                k = sock.recv_into(into[got:n], n - got, socket.MSG_WAITALL)
            else:
                k = os.readv(fd, [into[got:n]])
            if k == 0:
                raise EOFError
            got += k
    finally:
        if sock is not None:
            sock.detach()  # the fd stays the Connection's
    return into
