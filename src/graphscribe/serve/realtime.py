"""`/v1/realtime?intent=transcription`: OpenAI's Realtime API in transcription mode, over a WebSocket of an HTTP
worker; every session's turns are streams of the engine's live sessions (sessions.py), batched on the GPU.

    client -> [HTTP worker: key checked and a place among --max-sessions taken before the upgrade (401, 503)
               -> events read on the event loop (`Session.receive`): session.update, input_audio_buffer.append
               (base64 PCM16), .commit, .clear; a malformed one gets an `error` event and the session goes on]
           -> [the worker's audio thread (`AudioThread`), every session's audio in order: decoded, resampled to
               16 kHz, voice activity judged for every session at once (vad.py); a turn's audio goes to the engine
               as it comes: (OPEN, turn), (AUDIO, turn), ..., (FINISH, turn) at its end (server_vad: the silence
               after speech; null: the client's commit)]
           -> [engine: the batching thread steps the turns' streams (sessions.py) -> (SAID, turn, text so far)]
           -> [HTTP worker, event loop: the text's growth as `...input_audio_transcription.delta`, the whole as
               `...completed` after the turn's last step]

A turn is a stream of its own from its first sample (with server_vad, `prefix_padding_ms` before the speech), so
its text is the streaming command's for that audio. Between turns nothing reaches the GPU: a silent client costs
its VAD windows and a buffer of `prefix_padding_ms`. A session's audio not yet stepped is bounded (AHEAD_SECONDS):
past it the session's socket is not read until the engine catches up, which slows a client that sends faster than
real time instead of holding its audio. A session that sends nothing for --session-idle seconds is ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import threading
import uuid
from dataclasses import dataclass, field

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from graphscribe.io.resample import StreamResampler
from graphscribe.serve.ipc import AUDIO, DROP, FINISH, OPEN, TURNS, EngineLost
from graphscribe.serve.realtime_api import (
    RATE,
    VAD_DEFAULTS,
    EventError,
    Settings,
    decode_audio,
    error_event,
    event_id,
    item_id,
    parse_update,
    session_object,
)
from graphscribe.serve.vad import WINDOW, Detector, Silero, judge_all

AHEAD_SECONDS = 30.0  # a session's audio sent and not yet stepped, at most: past it its socket waits
END_SECONDS = 30.0  # at shutdown, how long the open turns have to be answered


@dataclass(eq=False)
class Turn:
    """A turn (an item) of a session: a stream in the engine from `start` (samples at 16 kHz since the session's
    first audio). `shown` is the text sent as deltas so far."""

    number: int  # the turn's id on the worker's pipe
    item: str
    start: int
    sent: int = 0  # samples heard (sent to the engine, or held until they pass the next chunk's end)
    flushed: int = 0  # samples sent to the engine
    held: list = field(default_factory=list)
    needed: int = 0  # samples the engine's last step took
    shown: str = ""


class Session:
    """One WebSocket's session. The event loop reads its events (`receive`) and writes its server events; the audio
    thread keeps its audio, voice activity and turns (the attributes it alone touches are marked)."""

    def __init__(self, hub: Realtime, ws: WebSocket):
        self.hub, self.ws = hub, ws
        self.id = "sess_" + uuid.uuid4().hex[:20]
        self.settings = Settings(vad=dict(VAD_DEFAULTS) if hub.vad_available else None)
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.ended = asyncio.Event()  # its last event is queued: the socket may close
        self.room = asyncio.Event()  # its audio ahead of the engine is under AHEAD_SECONDS
        self.room.set()
        self.queued = 0  # bytes of audio handed to the audio thread and not yet taken (event loop)
        self.turns: dict[int, Turn] = {}  # its turns the engine has not finished (event loop)
        self.ending = False
        # the audio thread's
        self.resampler = StreamResampler(self.settings.rate, RATE)
        self.detector = None
        self.samples = 0  # 16 kHz samples heard since the session's first audio
        self.tail = np.zeros(0, dtype=np.float32)  # the last samples heard outside a turn (prefix padding)
        self.turn: Turn | None = None
        self.previous_item: str | None = None

    # ------------------------------------------------------------------ the event loop
    def send(self, event: dict) -> None:
        """Queue a server event (event loop only)."""
        event.setdefault("event_id", event_id())
        self.outbox.put_nowait(event)

    def post(self, event: dict) -> None:
        """Queue a server event from the audio thread."""
        self.hub.loop.call_soon_threadsafe(self.send, event)

    def handle(self, event) -> None:
        """One client event (parsed JSON)."""
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise EventError("an event is a JSON object with a 'type'", code="invalid_event")
        kind, client = event["type"], event.get("event_id")
        if kind in ("session.update", "transcription_session.update"):
            shape, self.settings = parse_update(event, self.settings, self.hub.vad_available, self.hub.prompt_hotwords)
            self.hub.audio.put(self, "settings", self.settings)
            self.send(
                {
                    "type": f"{shape}.updated",
                    "session": session_object(shape, self.id, self.settings, self.hub.model_name),
                }
            )
        elif kind == "input_audio_buffer.append":
            samples = decode_audio(event.get("audio"))
            self.queued += samples.nbytes
            self.hub.audio.put(self, "append", samples)
        elif kind == "input_audio_buffer.commit":
            self.hub.audio.put(self, "commit", client)
        elif kind == "input_audio_buffer.clear":
            self.hub.audio.put(self, "clear", client)
        else:
            raise EventError(f"unknown or unsupported event type {kind!r}", code="invalid_event", param="type")
        self._check_room()

    def taken(self, nbytes: int) -> None:
        self.queued -= nbytes
        self._check_room()

    def said(self, turn: Turn, said) -> None:
        """What the engine said of one of this session's turns: its text's growth as a delta; after its last step
        the rest and `completed`."""
        turn.needed = said.needed
        text = said.done if said.done is not None else said.text
        if text.startswith(turn.shown) and len(text) > len(turn.shown):
            delta = {
                "type": "conversation.item.input_audio_transcription.delta",
                "item_id": turn.item,
                "content_index": 0,
                "delta": text[len(turn.shown) :],
                "audio_end_ms": (turn.start + said.needed) * 1000 // RATE,
            }
            self.send(delta)
            turn.shown = text
        if said.done is not None:
            self.turns.pop(turn.number, None)
            self.send(
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": turn.item,
                    "content_index": 0,
                    "transcript": said.done,
                    "usage": {"type": "duration", "seconds": round(said.audio_samples / RATE, 3)},
                }
            )
        self._check_room()
        self._check_end()

    def failed(self, turn: Turn, message: str) -> None:
        self.turns.pop(turn.number, None)
        error = {"type": "server_error", "code": "transcription_failed", "message": message}
        self.send({"type": "conversation.item.input_audio_transcription.failed", "item_id": turn.item,
                   "content_index": 0, "error": error})  # fmt: skip
        self._check_end()

    def _check_room(self) -> None:
        ahead = sum(t.sent - t.needed for t in self.turns.values()) / RATE + self.queued / 2 / self.settings.rate
        if ahead > AHEAD_SECONDS:
            self.room.clear()
        else:
            self.room.set()

    def end(self) -> None:
        """No more client events: the open turn is finished (answered), then the socket closes."""
        if not self.ending:
            self.ending = True
            self.hub.audio.put(self, "end", None)

    def _check_end(self) -> None:
        if self.ending and self.hub.audio.drained(self) and not self.turns:
            self.ended.set()


class AudioThread:
    """A worker's one thread for every session's audio, in order (module docstring): decoding, resampling, voice
    activity (each burst's windows of every session in one batch), turns, and the turns' audio to the engine."""

    def __init__(self, hub: Realtime):
        self.hub = hub
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._pending: dict[Session, int] = {}  # operations queued per session (any thread, under the lock)
        self._lock = threading.Lock()
        self._vad = None
        threading.Thread(target=self._run, name="graphscribe-audio", daemon=True).start()

    def put(self, session: Session, op: str, value) -> None:
        with self._lock:
            self._pending[session] = self._pending.get(session, 0) + 1
        self._queue.put((session, op, value))

    def drained(self, session: Session) -> bool:
        with self._lock:
            return session not in self._pending

    def _run(self) -> None:
        while True:
            burst = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while len(burst) < 4096:
                    burst.append(self._queue.get_nowait())
            heard: list[Session] = []
            for session, op, value in burst:
                try:
                    if op == "append":
                        self._append(session, value)
                        if session.detector is not None and session not in heard:
                            heard.append(session)
                    else:
                        self._judge([session])
                        getattr(self, "_" + op)(session, value)
                except Exception as err:  # noqa: BLE001 - one session's trouble ends that session, not the worker
                    session.post(error_event(f"internal error: {type(err).__name__}: {err}", "server_error"))
                finally:
                    with self._lock:
                        left = self._pending[session] - 1
                        if left:
                            self._pending[session] = left
                        else:
                            del self._pending[session]
            try:
                self._judge(heard)
            except Exception as err:  # noqa: BLE001 - the VAD failed: the sessions hear of it, the thread goes on
                for session in heard:
                    session.post(error_event(f"internal error: {type(err).__name__}: {err}", "server_error"))
            try:
                self.hub.send_turn_ops()
            except EngineLost:  # the worker is stopping: its sessions hear of it from `Realtime.lost`
                pass
            for session in {s for s, _, _ in burst}:
                self.hub.loop.call_soon_threadsafe(session._check_end)

    # ------------------------------------------------------------------ operations
    def _settings(self, session: Session, settings: Settings) -> None:
        if settings.rate != session.resampler.source:
            self._flush(session)
            session.resampler = StreamResampler(settings.rate, RATE)
        vad = settings.vad
        if vad is None:
            session.detector = None
        else:
            before = session.detector
            session.detector = Detector(vad["threshold"], int(vad["silence_duration_ms"]))
            if before is not None:  # the model's state and the speech so far carry over
                session.detector.state, session.detector.context = before.state, before.context
                session.detector.speaking, session.detector.judged = before.speaking, before.judged
                session.detector.pending = before.pending
            else:
                session.detector.judged = session.samples
        session.settings = settings

    def _append(self, session: Session, pcm: np.ndarray) -> None:
        self.hub.loop.call_soon_threadsafe(session.taken, pcm.nbytes)
        audio = session.resampler.push(pcm.astype(np.float32) / 32768.0)
        self._heard(session, audio)

    def _heard(self, session: Session, audio: np.ndarray) -> None:
        if not audio.size:
            return
        session.samples += audio.size
        if session.detector is None:  # turns by commit: the audio is the open turn's, one opened if none is
            if session.turn is None:
                self._open(session, session.samples - audio.size)
            self._send(session, audio)
            return
        detector = session.detector
        detector.push(audio)
        if session.turn is not None:
            self._send(session, audio)
        # what a turn starting in the windows not judged yet takes: its prefix padding and those windows
        keep = int(session.settings.vad["prefix_padding_ms"]) * RATE // 1000 + detector.pending.size + WINDOW
        session.tail = np.concatenate([session.tail, audio])[-keep:]

    def _commit(self, session: Session, client_event) -> None:
        self._flush(session)  # the turn's audio to its last sample, as a stream of its own would end
        turn = session.turn
        if turn is None or turn.sent == 0:
            session.post(error_event("the input audio buffer is empty", "input_audio_buffer_commit_empty",
                                     client_event=client_event))  # fmt: skip
            return
        self._close(session)

    def _clear(self, session: Session, client_event) -> None:
        turn = session.turn
        if turn is not None:
            session.turn = None
            self.hub.forget(turn)
            self.hub.turn_op(DROP, turn.number)
        session.tail = np.zeros(0, dtype=np.float32)
        if session.detector is not None:
            session.detector.speaking, session.detector.quiet_since = False, None
        session.post({"type": "input_audio_buffer.cleared"})

    def _end(self, session: Session, _) -> None:
        """The client is done (closed, went idle, or the server stops): the open turn is finished and answered."""
        self._flush(session)
        if session.turn is not None and session.turn.sent:
            self._close(session)
        elif session.turn is not None:
            self._clear(session, None)

    def _dropped(self, session: Session, _) -> None:
        """The client vanished: its open turn is dropped, nobody reads its answer."""
        if session.turn is not None:
            self.hub.forget(session.turn)
            self.hub.turn_op(DROP, session.turn.number)
            session.turn = None

    # ------------------------------------------------------------------ turns
    def _judge(self, sessions: list[Session]) -> None:
        detectors = {s.detector: s for s in sessions if s.detector is not None and s.detector.has_window}
        if not detectors:
            return
        if self._vad is None:
            self._vad = Silero()
        for detector, (change, at) in judge_all(self._vad, list(detectors)):
            session = detectors[detector]
            if change == "start" and session.turn is None:
                pad = int(session.settings.vad["prefix_padding_ms"]) * RATE // 1000
                first = max(at - pad, session.samples - session.tail.size)
                self._open(session, first)
                session.post(
                    {
                        "type": "input_audio_buffer.speech_started",
                        "audio_start_ms": at * 1000 // RATE,
                        "item_id": session.turn.item,
                    }  # fmt: skip
                )
                self._send(session, session.tail[session.tail.size - (session.samples - first) :])
            elif change == "stop" and session.turn is not None:
                session.post(
                    {
                        "type": "input_audio_buffer.speech_stopped",
                        "audio_end_ms": at * 1000 // RATE,
                        "item_id": session.turn.item,
                    }  # fmt: skip
                )
                self._close(session)

    def _open(self, session: Session, start: int) -> None:
        turn = Turn(next(self.hub.numbers), item_id(), start)
        session.turn = turn
        self.hub.remember(session, turn)
        self.hub.turn_op(OPEN, turn.number, session.settings.hotwords or None)

    def _send(self, session: Session, audio: np.ndarray) -> None:
        """A turn's audio, held until it passes the next multiple of a step's chunk: the engine can step the
        turn's stream only then, and one message a chunk instead of one an append keeps its intake and its
        batching thread's operations ten times fewer."""
        if not audio.size:
            return
        turn = session.turn
        turn.sent += audio.size
        turn.held.append(audio)
        chunk = self.hub.link.chunk_samples
        if not chunk or turn.sent > -(-turn.flushed // chunk) * chunk:  # past the end of the chunk the engine waits on
            self._release(turn)

    def _release(self, turn: Turn) -> None:
        """The audio a turn holds, to the engine."""
        if turn.held:
            audio = np.concatenate(turn.held) if len(turn.held) > 1 else turn.held[0]
            turn.held = []
            turn.flushed += audio.size
            self.hub.turn_op(AUDIO, turn.number, audio)

    def _close(self, session: Session) -> None:
        """The open turn committed: its item announced, its stream finished."""
        turn, session.turn = session.turn, None
        self._release(turn)
        previous, session.previous_item = session.previous_item, turn.item
        session.post({"type": "input_audio_buffer.committed", "item_id": turn.item, "previous_item_id": previous})
        item = {"id": turn.item, "type": "message", "role": "user", "status": "completed",
                "content": [{"type": "input_audio", "transcript": None}]}  # fmt: skip
        session.post({"type": "conversation.item.created", "previous_item_id": previous, "item": item})
        self.hub.turn_op(FINISH, turn.number)

    def _flush(self, session: Session) -> None:
        """The resampler's last samples (its context's worth), heard before the format changes or the turn ends."""
        tail = session.resampler.flush()
        session.resampler = StreamResampler(session.resampler.source, RATE)
        if tail.size and (session.turn is not None or session.detector is None):
            self._heard(session, tail)


class Realtime:
    """A worker's realtime sessions: the WebSocket endpoint, the audio thread, the turns by number."""

    def __init__(self, front, vad_available: bool):
        self.front, self.link = front, front.link
        self.model_name = front.settings.model_name
        self.vad_available = vad_available
        self.prompt_hotwords = front.settings.prompt_as_hotwords  # a session's prompt boosted as hotwords
        self.loop: asyncio.AbstractEventLoop | None = None
        self.audio: AudioThread | None = None
        self.sessions: set[Session] = set()
        # by number, what each turn's answers go to: a Session, or a streamed upload (streamed.UploadStream)
        self._turns: dict[int, tuple[Session, Turn]] = {}
        self.numbers = itertools.count(1)  # turn numbers on the worker's pipe
        self._ops: list[tuple[str, int, np.ndarray | None]] = []  # turn operations not sent yet
        self._ops_lock = threading.Lock()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.audio = AudioThread(self)

    def turn_op(self, kind: str, number: int, samples: np.ndarray | None = None) -> None:
        """An operation on a turn, sent with the others of its burst (`send_turn_ops`)."""
        with self._ops_lock:
            self._ops.append((kind, number, samples))

    def send_turn_ops(self) -> None:
        """The operations so far, as one message: the engine's intake reads one message for a burst of many
        sessions' appends (one message an append, thousands a second, each waited on the GIL of a busy engine)."""
        with self._ops_lock:
            ops, self._ops = self._ops, []
            if not ops:
                return
            parts = [np.ascontiguousarray(s, dtype=np.float32) for kind, _, s in ops if kind == AUDIO]
            samples = np.concatenate(parts) if parts else None
            # an OPEN carries its turn's own phrases, if any, after its size
            header = [
                (kind, n, s.size * 4) if kind == AUDIO else (kind, n, 0, *([s] if s else [])) for kind, n, s in ops
            ]
            self.link.send((TURNS, header, 0 if samples is None else samples.nbytes), samples)

    def remember(self, session: Session, turn: Turn) -> None:
        self._turns[turn.number] = (session, turn)
        self.loop.call_soon_threadsafe(session.turns.__setitem__, turn.number, turn)

    def forget(self, turn: Turn) -> None:
        found = self._turns.pop(turn.number, None)
        if found is not None:
            self.loop.call_soon_threadsafe(found[0].turns.pop, turn.number, None)

    def said(self, number: int, said) -> None:
        """On the event loop: the engine's SAID for turn `number`."""
        found = self._turns.get(number)
        if found is None:  # dropped, or its client went away
            return
        session, turn = found
        if said.error is not None:
            del self._turns[number]
            session.failed(turn, said.error)
            return
        if said.done is not None:
            del self._turns[number]
        session.turns.setdefault(turn.number, turn)
        session.said(turn, said)

    def lost(self) -> None:
        """The engine is gone: every open turn fails."""
        for session, turn in list(self._turns.values()):
            session.failed(turn, "the server is shutting down")
        self._turns.clear()

    async def wind_down(self) -> None:
        """At shutdown: every session's open turn finished and answered (at most END_SECONDS), then closed."""
        for session in list(self.sessions):
            session.end()
        ended = [asyncio.ensure_future(s.ended.wait()) for s in self.sessions]
        if ended:
            await asyncio.wait(ended, timeout=END_SECONDS)

    async def endpoint(self, ws: WebSocket) -> None:
        front = self.front
        refusal = front.admit_session(ws)
        if refusal is not None:
            await ws.send_denial_response(refusal.response())
            return
        session = Session(self, ws)
        self.sessions.add(session)
        try:
            await ws.accept(subprotocol="realtime" if "realtime" in ws.scope.get("subprotocols", ()) else None)
            await self._serve(session)
        finally:
            self.sessions.discard(session)
            front.sessions.release(front.slot)

    async def _serve(self, session: Session) -> None:
        session.send({"type": "session.created", "session": session_object("session", session.id, session.settings,
                                                                            self.model_name)})  # fmt: skip
        self.audio.put(session, "settings", session.settings)
        writer = asyncio.ensure_future(self._write(session))
        reader = asyncio.ensure_future(self._read(session))
        ended = asyncio.ensure_future(session.ended.wait())
        try:
            await asyncio.wait([writer, reader, ended], return_when=asyncio.FIRST_COMPLETED)
            closed = reader.done() and (reader.exception() is not None or not reader.result())
            if not ended.done() and (writer.done() or closed):  # the client went away: nobody reads the rest
                self.audio.put(session, "dropped", None)
                return
            await ended
            session.outbox.put_nowait(None)
            await writer
            with contextlib.suppress(Exception):
                await session.ws.close(1000)
        finally:
            for task in (reader, writer, ended):
                task.cancel()

    async def _read(self, session: Session) -> bool:
        """The client's events until it closes (False) or goes idle, or the server stops (True: end the session)."""
        idle = self.front.settings.session_idle or None
        while not session.ending:
            await session.room.wait()
            try:
                message = await asyncio.wait_for(session.ws.receive(), idle)
            except asyncio.TimeoutError:
                session.send(error_event(f"no event for {idle:g} s: the session is closed", "session_idle_timeout"))
                session.end()
                return True
            if message["type"] == "websocket.disconnect":
                return False
            text = message.get("text")
            if text is None:
                session.send(error_event("events are JSON text messages", "invalid_event"))
                continue
            try:
                session.handle(json.loads(text))
            except json.JSONDecodeError as err:
                session.send(error_event(f"the event is not JSON ({err.msg})", "invalid_json"))
            except EventError as err:
                client = None
                with contextlib.suppress(Exception):
                    client = json.loads(text).get("event_id")
                session.send(error_event(str(err), err.code, err.param, client))
        return True

    async def _write(self, session: Session) -> None:
        while (event := await session.outbox.get()) is not None:
            try:
                await session.ws.send_text(json.dumps(event, ensure_ascii=False))
            except (WebSocketDisconnect, RuntimeError, OSError):
                return
