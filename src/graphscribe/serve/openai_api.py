"""OpenAI's transcription API on the wire: multipart uploads in (held in memory, size-capped), the request's fields
checked, errors and answers out in OpenAI's shapes (json, text, srt, vtt, verbose_json, server-sent events).

The answers are built from a Transcript with the CLI's own writers (writers.py), so the server's SRT and VTT are the
CLI's files byte for byte.
"""

from __future__ import annotations

import asyncio
import re
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable
from urllib.parse import unquote

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from graphscribe.io.hotwords import HotwordError, parse_request_hotwords
from graphscribe.output.transcript import Transcript
from graphscribe.output.writers import write_srt, write_txt, write_vtt

FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
GRANULARITIES = ("word", "segment")
RETRY_AFTER = "1"  # seconds, on 503
UPLOAD_NAME_CHARS = 100  # of the client's file name, in error messages
STOP_STALL_SECONDS = 1.0  # once the server is stopping, an upload with no byte for this long is cut (503)
CHECK_SECONDS = 0.5  # how often a body that sends nothing looks at its clock (a stop shortens it)
DRAIN_SECONDS = 10.0  # a refused request's body is read and dropped for at most this long before its answer
MAX_REQUEST_BEAM = 16  # a request's `beam` at most: each size is a beam search of its own, made at its first use


class ApiError(Exception):
    """An answer in OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self, headers: dict | None = None, **extra) -> JSONResponse:
        """The JSON answer; `extra` adds keys beside "error" (/health's "status")."""
        headers = {**({"Retry-After": RETRY_AFTER} if self.status == 503 else {}), **(headers or {})}
        return JSONResponse({**extra, **self.body()}, self.status, headers or None)


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", code="shutting_down")


# ------------------------------------------------------------------ uploads
@dataclass
class Form:
    """A multipart body's fields (name -> values, in order) and its file part."""

    fields: dict[str, list[str]] = field(default_factory=dict)
    file: memoryview | None = None
    filename: str = "file"

    def one(self, name: str, default: str | None = None) -> str | None:
        values = self.fields.get(name)
        return values[-1] if values else default


class UploadStalled(Exception):
    """No byte of the body came for the allowed time: a slow or stuck client must not hold its place for ever."""


class Upload:
    """A request's body as it arrives, on one clock for the whole upload, its drain after a refusal included: `stall`
    seconds without a byte end it (UploadStalled, for good), or STOP_STALL_SECONDS once `stopping()` (a stopping
    worker waits that long at most for a client that sends nothing).

    Read with `request.receive`, not Starlette's `request.stream()`: a wait for the next chunk is cut every
    CHECK_SECONDS to look at the clock, and uvicorn's receive can be cancelled and called again with nothing lost,
    where a cancelled stream is closed for good."""

    def __init__(self, request: Request, stall: float, stopping: Callable[[], bool] = lambda: False):
        self.request, self.stall, self.stopping = request, stall, stopping
        self.started = False  # a receive was made (uvicorn then sends 100 Continue to a client that waits for it)
        self.ended = False  # read to its end, or the client went
        self.stalled = False

    @property
    def limit(self) -> float:
        """Seconds without a byte allowed now."""
        return min(self.stall, STOP_STALL_SECONDS) if self.stopping() else self.stall

    async def chunks(self, until: float | None = None) -> AsyncIterator[bytes]:
        """The body's chunks as they come; UploadStalled when the clock runs out between two of them, or at `until`
        (the event loop's time); ClientDisconnect if the client goes."""
        if self.stalled:
            raise UploadStalled
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not self.ended:
            left = min(last + self.limit, until if until is not None else float("inf")) - loop.time()
            if left <= 0:
                self.stalled = True
                raise UploadStalled
            self.started = True
            try:
                message = await asyncio.wait_for(self.request.receive(), min(left, CHECK_SECONDS))
            except asyncio.TimeoutError:
                continue
            last = loop.time()
            if message["type"] == "http.disconnect":
                self.ended = True
                raise ClientDisconnect
            self.ended = not message.get("more_body", False)
            if message.get("body"):
                yield message["body"]


async def read_form(upload: Upload, limit: int) -> Form:
    """The request's multipart body, read as it arrives and kept in memory: ApiError 413 past `limit` bytes (never
    more than that is held), 408 when the upload stalls (503 when it stalls while the server stops), 400 if it is
    not multipart; ClientDisconnect if the client goes."""
    request = upload.request
    content_type = request.headers.get("content-type", "")
    boundary = header_params(content_type).get("boundary")
    if content_type.split(";", 1)[0].strip().lower() != "multipart/form-data" or not boundary:
        raise ApiError(400, "send multipart/form-data with the audio in the field 'file' (as OpenAI's API takes it)")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    try:
        async for chunk in upload.chunks():
            if len(body) + len(chunk) > limit:
                raise _too_large(limit)
            body += chunk
    except UploadStalled:
        if upload.stopping():
            raise shutting_down() from None
        raise ApiError(408, f"the upload stalled: no data for {upload.stall:g} s", code="upload_timeout") from None
    return parse_form(body, boundary.encode("latin-1"))


def parse_form(body: bytearray | bytes, boundary: bytes) -> Form:
    """A multipart/form-data body (RFC 7578) held in memory -> its Form; ApiError 400 if it is malformed. The file
    is a view of `body`. Split with bytes.find, in C: python-multipart's streaming parser held the event loop (and
    so the GIL) 0.3-0.5 ms per 400 kB upload even with callbacks that did nothing, this 0.1-0.2 ms, nearly all of
    it the one search over the file's bytes for the next boundary (on a busy 2-core machine)."""
    delimiter = b"--" + boundary
    start = body.find(delimiter)
    if start < 0:
        raise ApiError(400, "malformed multipart body (no boundary)")
    form, view, pos = Form(), memoryview(body), start + len(delimiter)
    while body[pos : pos + 2] != b"--":  # the closing delimiter ends the parts
        head_end = body.find(b"\r\n\r\n", pos)  # the delimiter line's CRLF, then the part's headers, if any
        end = body.find(b"\r\n" + delimiter, head_end + 4)
        if head_end < 0 or end < 0 or body[pos : pos + 2] != b"\r\n":
            raise ApiError(400, "malformed multipart body (a part or the closing boundary is missing)")
        headers = bytes(body[pos + 2 : head_end]).decode("utf-8", "replace").split("\r\n")
        disposition = next((h.split(":", 1)[1] for h in headers if h.lower().startswith("content-disposition:")), "")
        _add_part(form, disposition, view[head_end + 4 : end])
        pos = end + 2 + len(delimiter)
    return form


def _add_part(form: Form, disposition: str, content: memoryview) -> None:
    params = header_params(disposition)
    name = params.get("name", "")
    if name == "file":
        filename = params.get("filename*", params.get("filename")) or "file"
        form.file = content
        form.filename = filename.replace("\\", "/").rsplit("/", 1)[-1][:UPLOAD_NAME_CHARS] or "file"
        return
    try:
        form.fields.setdefault(name, []).append(str(content, "utf-8"))
    except UnicodeDecodeError:
        raise ApiError(400, f"field {name!r} is not UTF-8 text", param=name) from None


_PARAM = re.compile(r';\s*([A-Za-z0-9_.*-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;\s]*)')


def header_params(value: str) -> dict[str, str]:
    """The parameters of a header value such as `form-data; name="file"; filename="a.wav"`, unquoted; an RFC 5987
    `filename*=UTF-8''a%20b.wav` decoded. (email.message's parser took 0.1 ms a header on the event loop.)"""
    params = {}
    for key, raw in _PARAM.findall(value):
        if raw.startswith('"'):
            raw = re.sub(r"\\(.)", r"\1", raw[1:-1]) if "\\" in raw else raw[1:-1]
        elif key.endswith("*") and "''" in raw:
            raw = unquote(raw.split("''", 1)[1])
        params[key.lower()] = raw
    return params


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the upload is over the server's limit of {limit / 2**20:g} MB", "file", "file_too_large")


async def drain(upload: Upload) -> bool:
    """Read and drop what is left of the body, for up to DRAIN_SECONDS, before a refusal (401, 413, 503, a bad
    field) is sent: a client still sending then reads it (most clients read only once they have sent it all), where
    closing on unread data would reset the connection and lose the answer. False if some was left (the connection
    is then closed): a stalled upload, or one still sending after DRAIN_SECONDS; and a client that waits for 100
    Continue before it sends (Expect: 100-continue), which gets the refusal instead."""
    if upload.ended:
        return True
    if upload.stalled or (not upload.started and upload.request.headers.get("expect", "").lower() == "100-continue"):
        return False
    until = asyncio.get_running_loop().time() + DRAIN_SECONDS
    try:
        async for _ in upload.chunks(until):
            pass
    except UploadStalled:
        return False
    except ClientDisconnect:
        pass
    return True


# ------------------------------------------------------------------ requests
@dataclass
class Options:
    """The request's form fields, checked."""

    response_format: str = "json"
    stream: bool = False
    granularities: tuple[str, ...] = ()
    language: str | None = None
    confidence: bool = False  # include[]=confidence: verbose_json's words carry their confidence
    hotwords: tuple[tuple[str, float | None], ...] = ()  # phrases boosted in this request (`parse_request_hotwords`)
    beam: int | None = None  # this request's beam size (1: greedy); None: the server's --beam

    @property
    def word_times(self) -> bool:
        """Whether the answer needs token, word and segment times."""
        return self.response_format in ("srt", "vtt", "verbose_json")


def parse_options(form: Form, prompt_as_hotwords: bool = False) -> Options:
    """Options from the form; ApiError 400 naming the field and what it takes. language and temperature are
    accepted and unused (a temperature must still be a number), as is `include[]` but for `confidence`, and so is
    prompt unless `prompt_as_hotwords`: then its phrases are boosted after the `hotwords` field's. beam: 1 (greedy)
    to MAX_REQUEST_BEAM, for an upload without its own phrases, not streamed."""
    fmt = (form.one("response_format") or "json").strip()
    if fmt not in FORMATS:
        raise ApiError(400, f"response_format {fmt!r}: use {', '.join(FORMATS)}", "response_format")
    stream = (form.one("stream") or "false").strip().lower()
    if stream not in ("true", "false"):
        raise ApiError(400, f"stream {stream!r}: use true or false", "stream")
    granularities = [*form.fields.get("timestamp_granularities[]", []), *form.fields.get("timestamp_granularities", [])]
    for g in granularities:
        if g not in GRANULARITIES:
            raise ApiError(400, f"timestamp_granularities {g!r}: use word or segment", "timestamp_granularities")
    temperature = form.one("temperature")
    if temperature is not None:
        try:
            float(temperature)
        except ValueError:
            raise ApiError(400, f"temperature {temperature!r}: use a number", "temperature") from None
    include = [*form.fields.get("include[]", []), *form.fields.get("include", [])]  # OpenAI's logprobs: unused
    granularities = tuple(dict.fromkeys(granularities))
    hotwords = _hotwords(form, "hotwords")
    if prompt_as_hotwords:
        hotwords += _hotwords(form, "prompt")
    beam = _beam(form.one("beam"), stream == "true", bool(hotwords))
    return Options(fmt, stream == "true", granularities, form.one("language"), "confidence" in include, hotwords, beam)


def _beam(value: str | None, stream: bool, hotwords: bool) -> int | None:
    if value is None:
        return None
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_REQUEST_BEAM:
        raise ApiError(400, f"beam {value!r}: use a whole number from 1 (greedy) to {MAX_REQUEST_BEAM}", "beam")
    beam = int(text)
    if beam > 1 and stream:
        raise ApiError(400, f"beam {beam}: stream=true transcribes greedily (beam 1)", "beam")
    if beam > 1 and hotwords:
        raise ApiError(400, f"beam {beam}: a request's own phrases are boosted in greedy decoding (beam 1)", "beam")
    return beam


def _hotwords(form: Form, name: str) -> tuple[tuple[str, float | None], ...]:
    try:
        return parse_request_hotwords(form.one(name) or "", name)
    except HotwordError as err:
        raise ApiError(400, str(err), name) from None


# ------------------------------------------------------------------ answers in OpenAI's shapes
def answer(transcript: Transcript, options: Options) -> Response:
    """The response for a transcript: OpenAI's shape for the requested format (stream=true is the live streams'
    engine's, streamed.py)."""
    fmt = options.response_format
    if fmt == "json":
        return JSONResponse({"text": transcript.text, "usage": _usage(transcript)})
    if fmt == "verbose_json":
        return JSONResponse(verbose_json(transcript, options))
    if fmt == "vtt":
        return Response(write_vtt(transcript), media_type="text/vtt")
    return PlainTextResponse(write_srt(transcript) if fmt == "srt" else write_txt(transcript))


def _usage(transcript: Transcript) -> dict:
    return {"type": "duration", "seconds": round(transcript.audio_seconds, 3)}


def verbose_json(transcript: Transcript, options: Options) -> dict:
    """OpenAI's verbose_json: segments (NeMo's, sentences) unless only words are asked for, words when asked for.
    Greedy decoding computes no probabilities: avg_logprob and no_speech_prob are 0, temperature 0, seek 0."""
    body = {
        "task": "transcribe",
        "language": options.language or "unknown",  # not detected: the request's, if it named one
        "duration": round(transcript.audio_seconds, 3),
        "text": transcript.text,
    }
    if not options.granularities or "segment" in options.granularities:
        starts = [s.start_frame for s in transcript.segments]
        tokens: list[list[int]] = [[] for _ in transcript.segments]
        for token in transcript.tokens:  # a token belongs to the last segment starting at or before its frame
            if tokens:
                tokens[max(0, bisect_right(starts, token.frame) - 1)].append(token.id)
        body["segments"] = [
            {
                "id": i,
                "seek": 0,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "tokens": tokens[i],
                "temperature": 0.0,
                "avg_logprob": 0.0,
                "compression_ratio": _compression_ratio(s.text),
                "no_speech_prob": 0.0,
            }
            for i, s in enumerate(transcript.segments)
        ]
    if "word" in options.granularities:
        body["words"] = [
            {"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
            | ({} if w.confidence is None else {"confidence": w.confidence})  # include[]=confidence, serve --confidence
            for w in transcript.words
            if w.word.strip()
        ]
    body["usage"] = _usage(transcript)
    return body


def _compression_ratio(text: str) -> float:
    """whisper's: UTF-8 bytes over zlib-compressed bytes (repetitive text compresses well)."""
    data = text.encode("utf-8")
    return round(len(data) / len(zlib.compress(data)), 3) if data else 0.0
