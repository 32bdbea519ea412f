"""OpenAI's Realtime API in transcription mode, as it is written on the wire: the session's settings from
`session.update` (and the older `transcription_session.update`), the session object the server describes it with,
the audio of `input_audio_buffer.append`, and the shapes of ids and `error` events. The sessions themselves are
realtime.py's.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass, field

import numpy as np

from graphscribe.io.hotwords import HotwordError, parse_request_hotwords

RATE = 16000  # the rate turns reach the engine at (the VAD's too)
RATES = (24000, 16000)  # audio/pcm rates accepted (OpenAI's is 24 kHz)
VAD_DEFAULTS = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}
SUBPROTOCOL_KEY = "openai-insecure-api-key."


class EventError(Exception):
    """A client event that cannot be taken: answered with an `error` event, the session goes on."""

    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None):
        super().__init__(message)
        self.code, self.param = code, param


@dataclass
class Settings:
    """A session's configuration (`session.update`)."""

    rate: int = 24000
    vad: dict | None = field(default_factory=lambda: dict(VAD_DEFAULTS))
    transcription: dict = field(default_factory=lambda: {"model": "", "language": None, "prompt": ""})
    hotwords: tuple = ()  # phrases boosted in the session's turns: its `hotwords` (and prompt, if the server says so)


def session_object(shape: str, sid: str, settings: Settings, model: str) -> dict:
    """The session as `session.created`/`.updated` (or the older `transcription_session.*`) describe it."""
    transcription = {**settings.transcription, "model": settings.transcription.get("model") or model}
    if shape == "transcription_session":
        return {
            "id": sid,
            "object": "realtime.transcription_session",
            "input_audio_format": "pcm16",
            "input_audio_transcription": transcription,
            "turn_detection": settings.vad,
            "modalities": ["text"],
        }
    audio_format = {"type": "audio/pcm", "rate": settings.rate}
    return {
        "id": sid,
        "object": "realtime.transcription_session",
        "type": "transcription",
        "audio": {"input": {"format": audio_format, "transcription": transcription, "turn_detection": settings.vad}},
    }


def parse_update(
    event: dict, settings: Settings, vad_available: bool, prompt_as_hotwords: bool = False
) -> tuple[str, Settings]:
    """A `session.update` or `transcription_session.update` -> (shape, the new settings); EventError if invalid.
    The transcription's `hotwords` (an extension: 'A, B:2.0') and, with `prompt_as_hotwords`, its prompt are the
    phrases boosted in the session's turns."""
    shape = "transcription_session" if event["type"].startswith("transcription_session") else "session"
    body = event.get("session")
    if not isinstance(body, dict):
        raise EventError("session.update needs a 'session' object", param="session")
    new = Settings(settings.rate, settings.vad, dict(settings.transcription), settings.hotwords)
    if shape == "session":
        kind = body.get("type", "transcription")
        if kind != "transcription":
            raise EventError(f"session.type {kind!r}: this server transcribes only ('transcription')", param="type")
        audio = body.get("audio", {}).get("input", {}) if isinstance(body.get("audio"), dict) else {}
        fmt, transcription, turn = audio.get("format"), audio.get("transcription"), audio.get("turn_detection", ...)
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") != "audio/pcm":
                raise EventError("audio.input.format: only audio/pcm (16-bit mono)", param="audio.input.format")
            rate = fmt.get("rate", 24000)
            if rate not in RATES:
                raise EventError(f"audio.input.format.rate {rate}: use 24000 or 16000", param="audio.input.format")
            new.rate = rate
    else:
        fmt, transcription = body.get("input_audio_format"), body.get("input_audio_transcription")
        turn = body.get("turn_detection", ...)
        if fmt is not None and fmt != "pcm16":
            raise EventError(f"input_audio_format {fmt!r}: only pcm16", param="input_audio_format")
    if isinstance(transcription, dict):
        keys = ("model", "language", "prompt", "hotwords")
        new.transcription.update({k: transcription[k] for k in keys if k in transcription})
        new.hotwords = _hotwords(new.transcription, prompt_as_hotwords)
    if turn is not ...:
        new.vad = _turn_detection(turn, settings.vad, vad_available)
    return shape, new


def _hotwords(transcription: dict, prompt_as_hotwords: bool) -> tuple:
    phrases = []
    for name in ("hotwords", "prompt") if prompt_as_hotwords else ("hotwords",):
        text = transcription.get(name) or ""
        if not isinstance(text, str):
            raise EventError(f"transcription.{name}: give a string ('A, B:2.0')", param=name)
        try:
            phrases += parse_request_hotwords(text, name)
        except HotwordError as err:
            raise EventError(str(err), param=name) from None
    return tuple(phrases)


def _turn_detection(turn, before: dict | None, vad_available: bool) -> dict | None:
    if turn is None:
        return None
    if not isinstance(turn, dict) or turn.get("type", "server_vad") != "server_vad":
        kind = turn.get("type") if isinstance(turn, dict) else turn
        raise EventError(f"turn_detection {kind!r}: use server_vad or null", param="turn_detection")
    if not vad_available:
        raise EventError("server_vad is not available here (silero-vad, onnxruntime): use null", param="turn_detection")
    vad = {**(before or VAD_DEFAULTS), **{k: v for k, v in turn.items() if k in VAD_DEFAULTS}}
    checks = (("threshold", 0.0, 1.0), ("prefix_padding_ms", 0, 10000), ("silence_duration_ms", 32, 10000))
    for name, low, high in checks:
        value = vad[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise EventError(f"turn_detection.{name} {value!r}: give a number from {low} to {high}", param=name)
    vad["type"] = "server_vad"
    return vad


def decode_audio(data) -> np.ndarray:
    """`input_audio_buffer.append`'s base64 PCM16 -> int16 samples; EventError if it is not that."""
    if not isinstance(data, str):
        raise EventError("input_audio_buffer.append needs 'audio': base64 PCM16", param="audio")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise EventError("'audio' is not base64", code="invalid_audio", param="audio") from None
    if len(raw) % 2:
        raise EventError("'audio' is not 16-bit PCM (an odd number of bytes)", code="invalid_audio", param="audio")
    return np.frombuffer(raw, dtype="<i2")


def event_id() -> str:
    return "event_" + uuid.uuid4().hex[:20]


def item_id() -> str:
    return "item_" + uuid.uuid4().hex[:20]


def error_event(message: str, code: str, param: str | None = None, client_event: str | None = None) -> dict:
    error = {"type": "invalid_request_error", "code": code, "message": message, "param": param}
    return {"type": "error", "event_id": event_id(), "error": {**error, "event_id": client_event}}
