"""`transcribe serve` from outside: the real server process on a free localhost port, called with the official
`openai` client and httpx, stopped with SIGTERM. Expected transcripts are the CLI's own output on the same files
with the same NeMo-made checkpoint; subtitles are read back with PyPI's `srt` and `webvtt-py`."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import srt
import torch
import webvtt
from conftest import CLIPS, FIXTURES, NEMO_PATH, SPEECH_CLIP

KEY = "sk-graphscribe-test"
STARTUP_SECONDS = 180  # loading and warming up the tiny model on a busy CPU
REQUEST_SECONDS = 300
UPLOAD_MB = 1  # the module server's --max-upload-mb: every clip fits, the 413 tests send more
STALL_SECONDS = 2.0  # the module server's --upload-timeout
HELDOUT = FIXTURES / "demo-heldout"
FILES = sorted(CLIPS.glob("*.wav")) + sorted(HELDOUT.glob("*.wav"))  # 14 clips, 0.25-7.4 s
# One thread each for the server and the CLI: the test machine's cores are shared by the server, the CLI and the
# clients, and OpenMP threads waiting on a busy core made the tiny model's LSTM steps 20x slower. The same
# setting for both keeps the server's sums in the CLI's order.
ENV = {k: v for k, v in os.environ.items() if k not in ("GRAPHSCRIBE_MODEL", "GRAPHSCRIBE_API_KEY")}
ENV["OMP_NUM_THREADS"] = "1"


@dataclass
class Served:
    process: subprocess.Popen
    url: str
    log: Path  # its stderr

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send `sig`, then the exit code (the process is killed after a minute)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(log: Path, *args: str, model: Path = NEMO_PATH, device: str | None = "cpu") -> Served:
    """`transcribe serve ARGS` on a free port with `model` (the tiny checkpoint) on `device` (None: ARGS say, as
    --devices does); returns once /health says 200."""
    port = free_port()
    command = [sys.executable, "-m", "graphscribe.cli", "serve", "--model", str(model)]
    command += ["--device", device] if device else []
    command += ["--port", str(port), "--api-key", KEY, *args]
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=ENV)
    served = Served(process, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{served.url}/health", timeout=2).status_code == 200:
                return served
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.2)
    served.stop()
    pytest.fail(f"the server was not ready in {STARTUP_SECONDS} s:\n{log.read_text()}")


def cli(*args) -> str:
    """What `transcribe ARGS --model NEMO --device cpu` prints, from `cli.main` in this process (a process of its
    own cost a Python and torch start each); on one intra-op thread, as the server runs (ENV)."""
    from graphscribe.cli import main

    out, threads = io.StringIO(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(out):
            main([*map(str, args), "--model", str(NEMO_PATH), "--device", "cpu"])
    except SystemExit as done:
        assert done.code in (0, None), done.code
    finally:
        torch.set_num_threads(threads)
    return out.getvalue()


def headers(key: str | None = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"} if key is not None else {}


def post(url: str, files=None, data=None, key: str | None = KEY, **kwargs) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/audio/transcriptions",
        files=files,
        data=data,
        headers=headers(key),
        timeout=REQUEST_SECONDS,
        **kwargs,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = start_server(
        tmp_path_factory.mktemp("server") / "stderr.txt",
        "--http-workers",
        "2",
        "--max-upload-mb",
        str(UPLOAD_MB),
        "--upload-timeout",
        str(STALL_SECONDS),
    )
    yield served
    assert served.stop() == 0, served.log.read_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_SECONDS)


@pytest.fixture(scope="module")
def expected() -> dict[str, dict]:
    """The CLI's JSON record of every clip, by file name."""
    records = [json.loads(line) for line in cli(*FILES, "--format", "json").splitlines()]
    return {Path(r["path"]).name: r for r in records}


def transcribe(client, path: Path, **options):
    with open(path, "rb") as f:
        return client.audio.transcriptions.create(file=f, model="tdt-tiny", **options)


# ============================================================================ the official client, every format


def test_health_and_models(server, client):
    health = httpx.get(f"{server.url}/health").json()
    assert health == {"status": "ok", "model": "tdt-tiny", "device": "cpu", "dtype": "float32", "max_batch": 8}
    assert [m.id for m in client.models.list()] == ["tdt-tiny"]


def test_json_is_the_cli_text(client, expected):
    assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]
    assert expected[SPEECH_CLIP.name]["text"]  # not trivially empty


def test_text(client, expected):
    assert transcribe(client, SPEECH_CLIP, response_format="text") == expected[SPEECH_CLIP.name]["text"] + "\n"


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitles_are_the_cli_files(client, fmt):
    answer = transcribe(client, SPEECH_CLIP, response_format=fmt)
    assert answer == cli(SPEECH_CLIP, "--format", fmt)
    if fmt == "srt":
        cues = [c.content for c in srt.parse(answer, ignore_errors=False)]
    else:
        cues = [c.text for c in webvtt.from_string(answer)]
    assert cues and all(cues)


def test_verbose_json_with_words(client, expected):
    record = expected[SPEECH_CLIP.name]
    answer = transcribe(
        client, SPEECH_CLIP, response_format="verbose_json", timestamp_granularities=["word", "segment"]
    )
    assert answer.text == record["text"]
    assert answer.duration == pytest.approx(record["audio_seconds"], abs=1e-3)
    assert answer.task == "transcribe" and answer.language
    words = [w for w in record["words"] if w["word"].strip()]
    assert [(w.word, w.start, w.end) for w in answer.words] == [(w["word"], w["start"], w["end"]) for w in words]
    assert [(s.id, s.text, s.start, s.end) for s in answer.segments] == [
        (i, s["text"], s["start"], s["end"]) for i, s in enumerate(record["segments"])
    ]
    tokens = [t for s in answer.segments for t in s.tokens]
    assert tokens == [t["id"] for t in record["tokens"]]
    assert all(s.compression_ratio > 0 and s.temperature == 0.0 for s in answer.segments)


def test_verbose_json_segments_only_by_default(client):
    answer = transcribe(client, SPEECH_CLIP, response_format="verbose_json")
    assert answer.segments and answer.words is None


def test_stream_sends_the_streaming_engines_deltas(client, model):
    """stream=true: the upload is transcribed by the live streams' engine, a step's chunk at a time, and each step's
    growth of the text is a delta sent as it is made; the text is the streaming engine's for that audio."""
    stream = model.stream(0.8, 9.6, 1.6)
    expected = (stream.feed(model.read(SPEECH_CLIP)) + stream.finish())[-1].text
    events = list(transcribe(client, SPEECH_CLIP, stream=True))
    *deltas, done = events
    assert [e.type for e in deltas] == ["transcript.text.delta"] * len(deltas)
    assert len(deltas) >= 2  # the text grows chunk by chunk, not in one piece at the end
    assert done.type == "transcript.text.done" and done.text == expected
    assert "".join(e.delta for e in deltas) == expected


# ============================================================================ unhappy paths, then the next request


def test_not_audio_names_the_problem_and_the_next_request_succeeds(server, client, expected):
    answer = post(server.url, files={"file": ("notes.txt", b"these are not samples\n" * 50)})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["message"] == "notes.txt: not a readable audio file (unknown format or corrupt data)"
    assert error["type"] == "invalid_request_error" and error["param"] == "file"
    assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]


def test_past_the_upload_limit(server, client, expected):
    big = b"\0" * (UPLOAD_MB * 2**20 + 1000)
    answer = post(server.url, files={"file": ("big.wav", big)})
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "file_too_large"
    # chunked, without a Content-Length: the limit holds while the body streams in
    boundary = "graphscribe-test"
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.wav"\r\n\r\n'.encode()
    chunks = iter([head, *[b"\0" * 2**16] * (2 * 16 * UPLOAD_MB), f"\r\n--{boundary}--\r\n".encode()])
    answer = httpx.post(
        f"{server.url}/v1/audio/transcriptions",
        content=chunks,
        headers={**headers(), "Content-Type": f"multipart/form-data; boundary={boundary}"},
        timeout=REQUEST_SECONDS,
    )
    assert answer.status_code == 413
    assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]


def test_wrong_or_missing_key(server):
    with open(SPEECH_CLIP, "rb") as f:
        data = f.read()
    for key in ("sk-wrong", None):
        answer = post(server.url, files={"file": ("a.wav", data)}, key=key)
        assert answer.status_code == 401
        assert answer.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        transcribe(wrong, SPEECH_CLIP)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_bad_fields(server):
    answer = post(server.url, data={"model": "tdt-tiny"}, files={"other": ("a.txt", b"x")})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "file"
    assert "'file'" in answer.json()["error"]["message"]
    with open(SPEECH_CLIP, "rb") as f:
        data = f.read()
    for field, value in [("response_format", "diarized_json"), ("stream", "maybe"), ("temperature", "warm")]:
        answer = post(server.url, files={"file": ("a.wav", data)}, data={field: value})
        assert answer.status_code == 400, field
        error = answer.json()["error"]
        assert error["param"] == field and repr(value) in error["message"]
    answer = httpx.post(f"{server.url}/v1/audio/transcriptions", json={"file": "/etc/passwd"}, headers=headers())
    assert answer.status_code == 400  # a path is no upload: only bytes sent as the file are read
    assert "multipart/form-data" in answer.json()["error"]["message"]


def _connect(url: str, timeout: float) -> socket.socket:
    return socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=timeout)


def _start_upload(url: str, timeout: float, sent: int = 100_000) -> socket.socket:
    """A raw connection that declares 500 000 bytes of multipart body and sends `sent` of them (the head included)."""
    boundary = "graphscribe-test"
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'.encode()
    s = _connect(url, timeout)
    s.sendall(
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\n"
        + f"Authorization: Bearer {KEY}\r\nContent-Type: multipart/form-data; boundary={boundary}\r\n".encode()
        + b"Content-Length: 500000\r\n\r\n"
        + (head + SPEECH_CLIP.read_bytes())[:sent]
    )
    return s


@contextlib.contextmanager
def _half_an_upload(server, timeout: float):
    """A raw connection that declares 500 000 bytes of multipart body and sends a fifth of them."""
    with _start_upload(server.url, timeout) as s:
        yield s


def _read_answer(s: socket.socket) -> tuple[int, dict, dict]:
    """A raw connection's answer: status, headers (lower-case names), JSON body; read until its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(fields["content-length"]):
        chunk = s.recv(65536)
        assert chunk, f"closed after {data + body!r}"
        body += chunk
    return int(status_line.split()[1]), fields, json.loads(body)


def _closed(s: socket.socket) -> bool:
    """Whether the server closed the connection (the socket's timeout: how long to wait for that)."""
    try:
        return s.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_client_gone_mid_upload(server, client, expected):
    with _half_an_upload(server, timeout=10):
        pass
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]


def test_a_stalled_upload_is_refused_and_frees_its_place(server, client, expected):
    """A client that stops sending half-way (its connection open) gets 408 after --upload-timeout, in OpenAI's
    error shape, and the server answers others meanwhile and after."""
    with _half_an_upload(server, timeout=30) as s:
        assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]  # while it stalls
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            data = s.recv(65536)
            if not data:
                break
            answer += data
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"408", answer[:200]
    body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "upload_timeout" and f"{STALL_SECONDS:g} s" in body["error"]["message"]
    assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]


def test_a_stalled_upload_gets_408_when_its_timeout_has_passed_once(server):
    """--upload-timeout is one clock: 408 comes that long after the last byte (not twice that: the refusal does not
    wait for the rest of the body all over again), and the connection is closed."""
    with _start_upload(server.url, timeout=30) as s:
        last_byte = time.monotonic()
        status, fields, body = _read_answer(s)
        waited = time.monotonic() - last_byte
        assert status == 408 and body["error"]["code"] == "upload_timeout", body
        assert STALL_SECONDS - 1 <= waited <= STALL_SECONDS + 1, waited
        assert fields["connection"] == "close" and _closed(s)


def test_a_connection_that_never_finishes_its_head_is_closed(server, client, expected):
    """A client that opens connections and sends part of a request head, or nothing, loses them HEADERS_SECONDS
    later; the server answers others meanwhile and after."""
    from graphscribe.serve.http_front import HEADERS_SECONDS

    opened = time.monotonic()
    with _connect(server.url, timeout=HEADERS_SECONDS + 10) as silent, _connect(server.url, HEADERS_SECONDS + 10) as s:
        s.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\nContent-Type: multip")
        assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]  # meanwhile
        assert _closed(s) and _closed(silent)
        assert HEADERS_SECONDS - 1 <= time.monotonic() - opened <= HEADERS_SECONDS + 5
    assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]


def test_errors_are_in_openais_shape(server, client):
    """Every error status the server sends has OpenAI's body, so the official client shows its message: a path that
    does not exist (404), a method a path does not take (405), a request uvicorn cannot parse (400)."""

    def error_of(answer: httpx.Response) -> dict:
        assert answer.headers["content-type"] == "application/json", answer.text
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        return error

    with pytest.raises(openai.NotFoundError) as raised:
        client.files.list()
    assert raised.value.code == "unknown_url"
    assert "Invalid URL (GET /v1/files)" in str(raised.value)
    assert error_of(httpx.get(f"{server.url}/v2/models", headers=headers()))["code"] == "unknown_url"
    for method, path in [("GET", "/v1/audio/transcriptions"), ("DELETE", "/v1/models")]:
        answer = httpx.request(method, f"{server.url}{path}", headers=headers())
        assert answer.status_code == 405
        assert error_of(answer)["code"] == "method_not_allowed" and answer.headers["allow"]
    with _connect(server.url, timeout=30) as s:
        s.sendall(b"NOT AN HTTP REQUEST\r\n\r\n")
        status, fields, body = _read_answer(s)
    assert status == 400 and body["error"]["code"] == "invalid_http", body


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_upload_far_past_the_limit_gets_413_not_a_reset(server, client, framing):
    """A client that sends its whole body before it reads (curl and most others without Expect: 100-continue) sends
    it all without a reset, then reads the 413 in OpenAI's shape, however far past the limit the body goes (the
    server used to close the connection on the body's unread part: the client's next write met a reset)."""
    size, piece = 32 * UPLOAD_MB * 2**20, b"\0" * 2**16  # past what the kernel buffers on both ends
    framed = f"Content-Length: {size}" if framing == "content-length" else "Transfer-Encoding: chunked"
    with _connect(server.url, timeout=30) as s:
        s.sendall(
            b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: localhost\r\n"
            + f"Authorization: Bearer {KEY}\r\nContent-Type: multipart/form-data; boundary=b\r\n{framed}\r\n\r\n".encode()
        )
        for _ in range(size // len(piece)):
            s.sendall(piece if framing == "content-length" else b"10000\r\n" + piece + b"\r\n")
        if framing == "chunked":
            s.sendall(b"0\r\n\r\n")
        status, _, body = _read_answer(s)
    assert status == 413 and body["error"]["code"] == "file_too_large", body
    with pytest.raises(openai.APIStatusError) as raised:  # the official client, for its message
        client.audio.transcriptions.create(file=("big.wav", b"\0" * size), model="tdt-tiny")
    assert raised.value.status_code == 413 and raised.value.code == "file_too_large"


# ============================================================================ many clients at once


def test_32_clients_get_their_own_transcripts(server, client, expected, tmp_path):
    """32 clients at once, each sending its own file (the 14 clips, then copies of the shorter ones under other
    names): each gets the CLI's text of that file."""
    shortest = sorted(FILES, key=lambda p: p.stat().st_size)
    copies = []
    for i in range(32 - len(FILES)):
        source = shortest[i % 8]
        copies.append(tmp_path / f"copy{i:02d}_{source.name}")
        shutil.copy(source, copies[-1])
    files = FILES + copies
    start = threading.Barrier(len(files))

    def one(path: Path) -> str:
        start.wait()
        return transcribe(client, path).text

    with ThreadPoolExecutor(len(files)) as pool:
        texts = list(pool.map(one, files))
    assert texts == [expected[p.name.split("_", 1)[1] if p.name.startswith("copy") else p.name]["text"] for p in files]
    rows = _metric_samples(server.url, "graphscribe_batch_rows_bucket")
    assert rows['{le="1"}'] < rows['{le="+Inf"}']  # some batches held several requests


def _metric_samples(url: str, name: str) -> dict[str, float]:
    """Samples of one metric: labels text -> value; every line of /metrics must be a comment or a sample."""
    answer = httpx.get(f"{url}/metrics", headers=headers(), timeout=REQUEST_SECONDS)
    assert answer.status_code == 200, answer.text
    text = answer.text
    sample = re.compile(r"^([a-z_]+)(\{[^}]*\})? (-?[0-9.e+]+|\+Inf)$")
    found = {}
    for line in text.splitlines():
        if line.startswith("# "):
            continue
        match = sample.match(line)
        assert match, line
        if match.group(1) == name:
            found[match.group(2) or ""] = float(match.group(3))
    return found


def test_metrics_count_requests(server, client, expected):
    label = '{path="/v1/audio/transcriptions",status="200"}'
    before = _metric_samples(server.url, "graphscribe_requests_total").get(label, 0)
    audio = _metric_samples(server.url, "graphscribe_audio_seconds_total")[""]
    transcribe(client, SPEECH_CLIP)
    assert _metric_samples(server.url, "graphscribe_requests_total")[label] == before + 1
    assert _metric_samples(server.url, "graphscribe_audio_seconds_total")[""] == pytest.approx(
        audio + expected[SPEECH_CLIP.name]["audio_seconds"], abs=1e-3
    )
    assert _metric_samples(server.url, "graphscribe_queue_depth") == {"": 0}
    assert _metric_samples(server.url, "graphscribe_request_seconds_count")[""] > before


def test_metrics_need_the_key(server):
    for key in ("sk-wrong", None):
        answer = httpx.get(f"{server.url}/metrics", headers=headers(key))
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server.url}/metrics", headers=headers()).status_code == 200


def test_warm_up_says_what_it_does_on_the_cpu(server):
    lines = server.log.read_text().splitlines()
    assert "warming up tdt-tiny on cpu float32: one 1 s clip through every stage" in lines


def test_access_log(server, client):
    transcribe(client, SPEECH_CLIP)
    lines = server.log.read_text().splitlines()
    assert any(re.fullmatch(r"serving tdt-tiny on http://127\.0\.0\.1:\d+ \(.*\)", line) for line in lines)
    logged = [line for line in lines if line.startswith("POST /v1/audio/transcriptions 200 ")]
    assert logged and re.fullmatch(
        r".* 200 audio 7\.4\d s, upload \d+ ms, decode \d+ ms, queue \d+ ms, batch \d+ ms, total \d+ ms", logged[-1]
    )


# ============================================================================ an HTTP worker dies


def _http_workers(pid: int) -> list[int]:
    """The server's HTTP worker processes (spawned children; multiprocessing's resource tracker is another child)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def _kill_and_wait_for_the_engine_to_reap(pid: int) -> None:
    """SIGKILL, then wait until the engine has reaped the worker: by then every thread of it has exited and its
    listening socket is closed (its main thread shows as a zombie earlier, while the others still hold the socket,
    and a connection queued on that socket meanwhile is reset when it closes)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_killed_http_worker_is_replaced(server, expected):
    workers = _http_workers(server.process.pid)
    assert len(workers) == 2
    _kill_and_wait_for_the_engine_to_reap(workers[0])
    # a new client: the connections the dead worker held are gone with it
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_SECONDS)
    for _ in range(4):  # whichever worker takes them, while the dead one is replaced
        assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]
    deadline = time.monotonic() + STARTUP_SECONDS
    while (len(now := _http_workers(server.process.pid)) < 2 or workers[0] in now) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(now) == 2 and workers[0] not in now
    assert "error: an HTTP worker was killed by signal 9; starting another" in server.log.read_text()


@pytest.fixture(scope="module")
def lone_server(tmp_path_factory):
    """One HTTP worker, five places, /metrics for anyone."""
    log = tmp_path_factory.mktemp("lone") / "stderr.txt"
    served = start_server(log, "--http-workers", "1", "--max-queue", "5", "--metrics-public")
    yield served
    assert served.stop() == 0, served.log.read_text()


def _queue_depth(url: str, wanted: int, seconds: float = STARTUP_SECONDS) -> float:
    """Polls /metrics until the queue depth is `wanted` or `seconds` pass (while no worker answers, it is retried);
    the last depth read."""
    deadline, depth = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        try:
            depth = _metric_samples(url, "graphscribe_queue_depth")[""]
        except httpx.TransportError:
            pass  # the worker is being replaced
        if depth == wanted:
            break
        time.sleep(0.1)
    return depth


def test_a_killed_workers_places_are_freed(lone_server, expected):
    """Five uploads in flight fill --max-queue 5; their worker killed, the engine frees their places (the clients'
    connections are closed with it), and the first request to reach its replacement, queued on its socket before it
    runs, is transcribed: before, the places stayed taken for good (503, queue full, for ever after), and a
    replacement could answer its first connections 503 "warming up" from a warm server."""
    served = lone_server
    uploads = [_start_upload(served.url, timeout=30, sent=1000) for _ in range(5)]
    try:
        assert _queue_depth(served.url, 5) == 5
        assert post(served.url, files={"file": ("a.wav", SPEECH_CLIP.read_bytes())}).status_code == 503  # full
        (worker,) = _http_workers(served.process.pid)
        _kill_and_wait_for_the_engine_to_reap(worker)
        assert all(map(_closed, uploads))
    finally:
        for s in uploads:
            s.close()
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:  # refused until the engine has made the replacement's socket
        try:
            _connect(served.url, timeout=5).close()
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0, timeout=REQUEST_SECONDS)
    assert transcribe(client, SPEECH_CLIP).text == expected[SPEECH_CLIP.name]["text"]
    assert _queue_depth(served.url, 0) == 0
    assert "was killed by signal 9; starting another (the 5 requests it held dropped)" in served.log.read_text()


def test_metrics_public(lone_server):
    assert httpx.get(f"{lone_server.url}/metrics").status_code == 200  # no key


def _running(pid: int) -> bool:
    """The process exists and has not exited (an exited one may linger as a zombie until something reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_the_http_workers_leave_with_the_engine(tmp_path):
    """The engine killed (SIGKILL: no chance to stop them): its HTTP workers see their pipes close and exit, and the
    port is free again, instead of orphans answering 503 for ever."""
    served = start_server(tmp_path / "stderr.txt", "--http-workers", "2")
    workers = _http_workers(served.process.pid)
    assert len(workers) == 2
    served.process.kill()
    served.process.wait(60)
    deadline = time.monotonic() + 60
    while any(map(_running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_running, workers))
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{served.url}/health", timeout=5)


# ============================================================================ stopping


def test_sigterm_answers_admitted_requests_then_exits_0(tmp_path):
    served = start_server(tmp_path / "stderr.txt", "--max-batch", "4")
    try:
        files = [HELDOUT / f"heldout_{i:02d}.wav" for i in range(8)]

        def send(path: Path):
            try:
                return post(served.url, files={"file": (path.name, path.read_bytes())}).status_code
            except httpx.TransportError as err:
                return type(err).__name__  # refused, or closed before an answer: never admitted

        with ThreadPoolExecutor(len(files)) as pool:
            early = [pool.submit(send, p) for p in files]
            deadline = time.monotonic() + REQUEST_SECONDS
            while _metric_samples(served.url, "graphscribe_queue_depth")[""] < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            admitted = _metric_samples(served.url, "graphscribe_queue_depth")[""]
            served.process.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            late = [send(p) for p in files[:3]]
            answers = [f.result() for f in early]
        assert served.process.wait(REQUEST_SECONDS) == 0
    finally:
        served.stop()
    assert admitted >= 1 and answers.count(200) >= admitted  # every admitted request answered
    assert set(answers) <= {200, 503, "ConnectError", "RemoteProtocolError", "ReadError"}
    assert set(late) <= {503, "ConnectError", "RemoteProtocolError", "ReadError"}
    log = served.log.read_text()
    assert "Traceback" not in log and "leaked" not in log
    assert log.count("POST /v1/audio/transcriptions 200 ") == answers.count(200)


def test_sigterm_with_a_stalled_upload_exits_in_seconds(tmp_path):
    """An admitted upload that sends nothing does not hold the stop for its --upload-timeout (30 s): once stopping,
    it is cut after a second with 503 in OpenAI's shape, and the server exits 0."""
    served = start_server(tmp_path / "stderr.txt")
    try:
        with _start_upload(served.url, timeout=30) as s:
            assert _queue_depth(served.url, 1) == 1
            served.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            status, _, body = _read_answer(s)
            assert served.process.wait(REQUEST_SECONDS) == 0
            stopped = time.monotonic() - signalled
    finally:
        served.stop()
    assert status == 503 and body["error"]["code"] == "shutting_down"
    assert stopped < 3, stopped


# ============================================================================ the load test, the command


@pytest.mark.parametrize("processes", [1, 3])
def test_load_test_reports_a_row_per_level(server, expected, tmp_path, processes):
    """Every level sends every file once, whichever client process has it (3 processes: one sits the 1-client
    level out; at 4 clients their files are every third); the server counts each request and its audio."""
    folder = tmp_path / "clips"
    folder.mkdir()
    chosen = sorted(FILES, key=lambda p: p.stat().st_size)[:4]
    for path in chosen:
        shutil.copy(path, folder / path.name)
    audio = sum(expected[p.name]["audio_seconds"] for p in chosen)
    label = '{path="/v1/audio/transcriptions",status="200"}'
    requests_before = _metric_samples(server.url, "graphscribe_requests_total").get(label, 0)
    audio_before = _metric_samples(server.url, "graphscribe_audio_seconds_total")[""]
    report_path = tmp_path / "load.json"
    command = ["bench", "--serve", server.url, "--folder", folder, "--concurrency", "1,4", "--json", report_path]
    command += ["--client-processes", processes]
    result = subprocess.run(
        [sys.executable, "-m", "graphscribe.cli", *map(str, command), "--api-key", KEY],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=REQUEST_SECONDS,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    assert report["server"]["model"] == "tdt-tiny" and report["files"] == 4
    assert report["client_processes"] == processes
    assert [r["concurrency"] for r in report["rows"]] == [1, 4]
    for row in report["rows"]:
        assert row["requests"] == 4 and row["failed"] == 0
        assert row["rtfx"] > 0 and row["audio_seconds"] == pytest.approx(audio, abs=1e-3)
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"]
    assert _metric_samples(server.url, "graphscribe_requests_total")[label] == requests_before + 8
    assert _metric_samples(server.url, "graphscribe_audio_seconds_total")[""] == pytest.approx(
        audio_before + 2 * audio, abs=1e-3
    )
    wrong = subprocess.run(
        [sys.executable, "-m", "graphscribe.cli", *map(str, command), "--api-key", "sk-wrong"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=REQUEST_SECONDS,
    )
    assert wrong.returncode == 0, wrong.stderr  # the server answered: the failures are in the report
    rows = json.loads(report_path.read_text())["rows"]
    assert [(r["failed"], r["failures"], r["p50_ms"]) for r in rows] == [(4, {"401": 4}, None)] * 2


def test_plain_cli_does_not_import_the_server():
    code = "import sys, graphscribe.cli; print(sorted(m for m in ('starlette', 'uvicorn') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert result.stdout == "[]\n", result.stderr


def test_serve_without_the_extra_says_how_to_install_it():
    code = "import sys; sys.modules['starlette'] = None; from graphscribe.cli import main; main(['serve'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert result.returncode == 2
    assert "pip install 'graphscribe[serve]'" in result.stderr


def test_serve_help_without_the_extra():
    code = "import sys; sys.modules['starlette'] = None; from graphscribe.cli import main; main(['serve', '--help'])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    assert result.returncode == 0, result.stderr
    words = " ".join(result.stdout.split())  # the help is wrapped to the terminal's width
    assert "--metrics-public" in words and "Needs the serve extra: pip install 'graphscribe[serve]'" in words


# ============================================================================ pieces, in process


def test_multipart_bodies_as_clients_send_them():
    from graphscribe.serve.openai_api import ApiError, header_params, parse_form

    request = httpx.Request(
        "POST",
        "http://localhost/",
        files={"file": ("a b; c.wav", b"RIFF\r\n--not-the-boundary\r\n")},
        data={"model": "m", "timestamp_granularities[]": ["word", "segment"]},
    )
    boundary = header_params(request.headers["content-type"])["boundary"].encode()
    form = parse_form(request.read(), boundary)
    assert (bytes(form.file), form.filename) == (b"RIFF\r\n--not-the-boundary\r\n", "a b; c.wav")
    assert form.fields == {"model": ["m"], "timestamp_granularities[]": ["word", "segment"]}
    assert header_params("form-data; name=file; filename*=UTF-8''%C3%A9t%C3%A9.wav")["filename*"] == "été.wav"
    for cut in (b"", request.read()[:-10]):
        with pytest.raises(ApiError, match="malformed multipart body"):
            parse_form(cut, boundary)


def test_a_worker_socket_that_cannot_be_made_stops_the_start_with_one_line(monkeypatch, capfd):
    """Out of file descriptors for the second worker's socket: the first worker is stopped, one line names the
    address and the reason, exit 1 (no traceback, no orphan)."""
    import errno
    import multiprocessing

    import graphscribe.serve.server as server_module
    from graphscribe.serve.command import serve_app

    made = []

    def worker_socket(held):
        if made:
            raise OSError(errno.EMFILE, "Too many open files")
        made.append(held)
        return real(held)

    real = server_module.worker_socket
    monkeypatch.setattr(server_module, "worker_socket", worker_socket)
    with pytest.raises(SystemExit) as exit_info:
        serve_app(["--port", "0", "--http-workers", "2"], prog_name="transcribe serve")
    assert exit_info.value.code == 1
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot start the HTTP workers on 127.0.0.1:0 (Too many open files)"), err
    assert not [c for c in multiprocessing.active_children() if c.name == "graphscribe-http"]


def test_only_loopback_counts_as_private():
    from graphscribe.serve.sockets import is_loopback

    assert all(map(is_loopback, ["127.0.0.1", "::1", "localhost", "127.0.0.2"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.10", "example.org"]))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_REUSEPORT spreads connections on Linux only")
def test_connections_spread_over_the_workers_sockets():
    """Each HTTP worker accepts on a socket of its own on the server's port: 64 connections land on all four (one
    shared socket gave a burst of them to whichever worker woke first); a second server cannot take the port; a
    worker's socket gone, its port still answers through the others."""
    from graphscribe.serve.sockets import listen, worker_socket

    held = listen("127.0.0.1", 0)
    port = held.getsockname()[1]
    sockets = [worker_socket(held) for _ in range(4)]
    with pytest.raises(OSError):
        listen("127.0.0.1", port)
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(64)]
    accepted = []
    for s in sockets:
        s.settimeout(0.2)
        taken = []
        with contextlib.suppress(TimeoutError):
            while True:
                taken.append(s.accept()[0])
        accepted.append(len(taken))
        for c in taken:
            c.close()
    assert sum(accepted) == 64 and min(accepted) > 0, accepted
    sockets[0].close()
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    for s in [held, *sockets[1:], *clients]:
        s.close()


@pytest.mark.parametrize("duplex", [True, False], ids=["socket", "pipe"])
def test_samples_cross_the_pipe_raw_and_in_order(duplex):
    """A SUBMIT's samples come as a raw message after it (http_front.Link.submit): the engine's reader gets the
    very floats sent, whatever their size (Connection frames up to 16 KiB with the header, larger ones apart; empty
    ones are a header alone; 480 KB outgrow a socket's buffer, read in one call that waits for all), and the next
    message on the pipe after them, on a duplex Connection (a socket pair, the server's) and a one-way one."""
    import multiprocessing
    import pickle

    import numpy as np

    from graphscribe.serve.http_front import Link
    from graphscribe.serve.ipc import SUBMIT, receive_samples

    ours, theirs = multiprocessing.Pipe(duplex)
    link = Link(theirs)
    rng = np.random.default_rng(0)
    sent = [rng.standard_normal(n).astype(np.float32) for n in (120_000, 7, 0, 4096, 4097)]
    sent.append(rng.standard_normal(300).astype(np.float64)[::2])  # not float32, not contiguous: made so
    writer = threading.Thread(target=lambda: [link.submit(k, a, k % 2 == 0, f"f{k}") for k, a in enumerate(sent)])
    writer.start()
    for k, a in enumerate(sent):
        kind, n, nbytes, word_times, name, confidence, hotwords, beam = pickle.loads(ours.recv_bytes())
        assert (kind, n, word_times, name, confidence, hotwords, beam) == (
            SUBMIT,
            k,
            k % 2 == 0,
            f"f{k}",
            False,
            (),
            None,
        )
        into = np.full(nbytes // 4, np.nan, dtype=np.float32) if k % 2 else None  # the engine's own buffer, or new
        got = receive_samples(ours, nbytes, into)
        assert got.dtype == np.float32 and np.array_equal(got, a.astype(np.float32))
        assert into is None or got is into
    writer.join()
    theirs.close()
    with pytest.raises(EOFError):
        ours.recv_bytes()
    ours, theirs = multiprocessing.Pipe(duplex)
    Link(theirs).send((SUBMIT, 99, 8, False, "f99"), np.zeros(3, dtype=np.float32))  # 12 bytes, 8 announced
    _, _, nbytes, _, _ = pickle.loads(ours.recv_bytes())
    with pytest.raises(ValueError, match="12 bytes, not the 8 announced"):  # the engine stops that worker
        receive_samples(ours, nbytes)
    ours, theirs = multiprocessing.Pipe(duplex)
    Link(theirs).send((SUBMIT, 100, 12, False, "f100"), np.zeros(3, dtype=np.float32))
    _, _, nbytes, _, _ = pickle.loads(ours.recv_bytes())
    with pytest.raises(ValueError, match="12 bytes, not the 8 made room for"):
        receive_samples(ours, nbytes, np.empty(2, dtype=np.float32))
