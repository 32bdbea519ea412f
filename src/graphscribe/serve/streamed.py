"""`POST /v1/audio/transcriptions` with `stream=true`: the upload transcribed by the live streams' engine, a chunk
at a time, each step's growth of the text sent as it is made (the realtime sessions' turn plumbing, realtime.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TYPE_CHECKING

import numpy as np

from graphscribe.serve.ipc import AUDIO, DROP, FINISH, OPEN
from graphscribe.serve.realtime import Turn
from graphscribe.serve.realtime_api import RATE

if TYPE_CHECKING:
    from graphscribe.serve.realtime import Realtime


class UploadStream:
    """`POST /v1/audio/transcriptions` with `stream=true`: the decoded upload as one turn of the live engine, its
    text's growth sent as `transcript.text.delta` server-sent events while it is transcribed (a step's chunk at a
    time), then `transcript.text.done`. An upload that goes away mid-stream has its turn dropped."""

    def __init__(self, hub: Realtime, hotwords: tuple = ()):
        self.hub, self.hotwords = hub, hotwords  # the request's own phrases
        self.turns: dict[int, Turn] = {}
        self.answers: asyncio.Queue = asyncio.Queue()
        self.turn = Turn(next(hub.numbers), "", 0)
        self.finished = False

    def start(self, samples: np.ndarray) -> None:
        """On an upload thread: the samples (at the model's rate) to the engine as one turn."""
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        number = self.turn.number
        self.hub.remember(self, self.turn)
        self.hub.turn_op(OPEN, number, self.hotwords or None)
        self.hub.turn_op(AUDIO, number, samples)
        self.hub.turn_op(FINISH, number)
        self.hub.send_turn_ops()

    def said(self, turn: Turn, said) -> None:
        self.answers.put_nowait(said)

    def failed(self, turn: Turn, message: str) -> None:
        self.answers.put_nowait(message)

    async def events(self, on_end):
        """The server-sent events, until the turn's last; `on_end()` after them (or when the client goes)."""
        shown = ""
        try:
            while True:
                said = await self.answers.get()
                if isinstance(said, str):
                    error = {"type": "server_error", "code": "transcription_failed", "message": said}
                    yield _sse({"type": "error", "error": error})
                    return
                text = said.done if said.done is not None else said.text
                if text.startswith(shown) and len(text) > len(shown):
                    yield _sse({"type": "transcript.text.delta", "delta": text[len(shown) :]})
                    shown = text
                if said.done is not None:
                    self.finished = True
                    usage = {"type": "duration", "seconds": round(said.audio_samples / RATE, 3)}
                    yield _sse({"type": "transcript.text.done", "text": said.done, "usage": usage})
                    return
        finally:
            if not self.finished:
                self.hub.forget(self.turn)
                self.hub.turn_op(DROP, self.turn.number)
                with contextlib.suppress(Exception):
                    self.hub.send_turn_ops()
            on_end()


def _sse(event: dict) -> str:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
