"""SIGINT and SIGTERM for the commands: installed before torch is imported, so a Ctrl-C at any moment ends in one line; held around writes that must not be left half-done."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import TYPE_CHECKING, Iterator, Optional

if TYPE_CHECKING:
    pass


class Interrupted(BaseException):
    """SIGINT or SIGTERM, raised in the main thread by `_Signals`; a BaseException, so that no `except Exception`
    on its way out swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


class _Signals:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread wherever it is (importing torch, loading the
    model, waiting for a batch), except inside `held()`, which writes one result's files and stdout line: the
    signal is raised when it ends, so a result is written whole or not at all. A second signal while the first
    one is being handled ends the process at once: every output is complete by then and stdout flushed."""

    def __init__(self):
        self.holding = False
        self.pending: Optional[int] = None
        self.stopping = False

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame) -> None:
        if self.stopping:
            os._exit(128 + signum)
        if self.holding:
            self.pending = signum
            return
        if _drops_exceptions(frame):  # raised here, it would be printed and dropped: the signal comes again soon
            threading.Timer(REDELIVER_SECONDS, os.kill, (os.getpid(), signum)).start()
            return
        self.stopping = True
        raise Interrupted(signum)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending is not None:
            self.stopping = True
            raise Interrupted(self.pending)


REDELIVER_SECONDS = 0.01


def _drops_exceptions(frame) -> bool:
    """Whether Python drops (and prints) an exception raised in `frame`: finalisers and weakref callbacks run
    there, importlib's module-lock callbacks among them."""
    code = frame.f_code if frame is not None else None
    return code is not None and (code.co_filename.startswith("<frozen importlib") or code.co_name == "__del__")


SIGNALS = _Signals()  # installed by `entry` only: in-process callers of `main` keep their own handlers
