"""`transcribe serve --devices cpu,cpu` from outside: the real server process with two engine processes, called with
the official `openai` client. Each request gets the CLI's text of its file; both engines answer (their /metrics);
an engine killed with SIGKILL under load leaves no request hanging (each gets its text or an error naming the
engine), is started again, and takes requests after."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from conftest import CLIPS, SPEECH_CLIP
from test_realtime import MANUAL, WAIT, pcm24, streamed_text, transcribe_manually
from test_server import ENV, FILES, KEY, STARTUP_SECONDS, Served, _metric_samples, cli, start_server, transcribe

CLIENT_SECONDS = 60  # a request that hangs fails the test: on the tiny model every answer comes in seconds
ENGINE_PID = re.compile(r"the engine on (\S+) is warm \(pid (\d+)")


def start(log: Path, *args: str) -> Served:
    """`transcribe serve --devices cpu,cpu` with the tiny checkpoint on a free port; returns once /health says 200."""
    return start_server(log, "--devices", "cpu,cpu", "--http-workers", "1", *args, device=None)


def wait_for(condition, message: str, seconds: float = STARTUP_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(message)
        time.sleep(0.05)


def device_metric(served: Served, name: str) -> dict[str, float]:
    """graphscribe_device_NAME by device."""
    samples = _metric_samples(served.url, f"graphscribe_device_{name}")
    return {labels.split('"')[1]: value for labels, value in samples.items()}


def engine_pids(served: Served) -> dict[str, int]:
    """The engines now warm, by device (the server's log names each one's pid as it comes warm)."""
    return {device: int(pid) for device, pid in ENGINE_PID.findall(served.log.read_text())}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = start(tmp_path_factory.mktemp("devices") / "stderr.txt")
    yield served
    assert served.stop() == 0, served.log.read_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=CLIENT_SECONDS)


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    """The CLI's text of every clip, by file name."""
    return {Path(line.split(": ", 1)[0]).name: line.split(": ", 1)[1] for line in cli(*FILES).splitlines()}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    """32 files: the 14 clips, then copies of the shorter ones under other names (copyNN_NAME)."""
    folder = tmp_path_factory.mktemp("copies")
    shortest = sorted(FILES, key=lambda p: p.stat().st_size)
    copies = []
    for i in range(32 - len(FILES)):
        copies.append(folder / f"copy{i:02d}_{shortest[i % 8].name}")
        shutil.copy(shortest[i % 8], copies[-1])
    return FILES + copies


def original(path: Path) -> str:
    return path.name.split("_", 1)[1] if path.name.startswith("copy") else path.name


def at_once(client, files: list[Path]) -> list[str | Exception]:
    """Every file sent at the same moment, one client thread each: its text, or the error it got."""
    start = threading.Barrier(len(files))

    def one(path: Path) -> str | Exception:
        start.wait()
        try:
            return transcribe(client, path).text
        except openai.APIError as err:
            return err

    with ThreadPoolExecutor(len(files)) as pool:
        return list(pool.map(one, files))


def test_health_names_both_devices(server):
    health = httpx.get(f"{server.url}/health").json()
    assert health["device"] == "cpu:0,cpu:1" and health["status"] == "ok"
    assert sorted(engine_pids(server)) == ["cpu:0", "cpu:1"]


def test_32_clients_get_the_cli_text_from_both_engines(server, client, expected, files):
    before = device_metric(server, "requests_total")
    texts = at_once(client, files)
    assert texts == [expected[original(p)] for p in files]
    after = device_metric(server, "requests_total")
    answered = {device: after[device] - before[device] for device in after}
    assert sum(answered.values()) == len(files)
    assert answered["cpu:0"] > 0 and answered["cpu:1"] > 0, answered  # least queued audio: both engines busy


def test_confidence_asked_for_crosses_to_the_engines(client):
    """`include[]=confidence` reaches the engine processes: verbose_json's words carry the CLI's `--confidence`
    word confidences; without it, none."""
    import json

    record = json.loads(cli(SPEECH_CLIP, "-f", "json", "--confidence"))
    want = [w["confidence"] for w in record["words"] if w["word"].strip()]
    for asked in (True, False):
        with open(SPEECH_CLIP, "rb") as f:
            answer = client.audio.transcriptions.create(
                file=f,
                model="tdt-tiny",
                response_format="verbose_json",
                timestamp_granularities=["word"],
                **({"include": ["confidence"]} if asked else {}),
            )
        got = [w.model_dump().get("confidence") for w in answer.words]
        assert got == (pytest.approx(want, rel=1e-3) if asked else [None] * len(want))


def test_a_requests_beam_crosses_to_the_engines(client, model):
    """A request's `beam` reaches the engine processes: NeMo's beam-4 best text from a greedy server."""
    from test_server_hotwords import BEAM4, CLIP

    assert transcribe(client, CLIP, extra_body={"beam": "4"}).text == model.tokenizer.decode(BEAM4)


def test_a_killed_engine_is_restarted_and_no_request_hangs(server, client, expected, files):
    victim = engine_pids(server)["cpu:0"]
    results: list = []
    sender = threading.Thread(target=lambda: results.extend(at_once(client, files)))
    sender.start()
    wait_for(lambda: device_metric(server, "in_flight")["cpu:0"] > 0, "no request reached the engine on cpu:0", 60)
    os.kill(victim, signal.SIGKILL)
    sender.join(2 * CLIENT_SECONDS)
    assert not sender.is_alive(), "a request hangs"
    for path, result in zip(files, results):
        if isinstance(result, Exception):  # it was on the killed engine: a clear error, not a hang
            assert isinstance(result, openai.InternalServerError), result
            assert "the engine on cpu:0 was killed by signal 9" in str(result), result
        else:
            assert result == expected[original(path)]
    # another engine on cpu:0, warm, taking requests
    wait_for(lambda: device_metric(server, "up")["cpu:0"] == 1, f"no engine came back:\n{server.log.read_text()}")
    assert device_metric(server, "restarts_total") == {"cpu:0": 1, "cpu:1": 0}
    assert engine_pids(server)["cpu:0"] != victim
    before = device_metric(server, "requests_total")["cpu:0"]
    # a new client: the old one's idle keep-alive connections may be closed by the server as they are reused
    fresh = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=CLIENT_SECONDS)
    assert at_once(fresh, files[:8]) == [expected[original(p)] for p in files[:8]]
    assert device_metric(server, "requests_total")["cpu:0"] > before
    assert "error: the engine on cpu:0 was killed by signal 9" in server.log.read_text()


def test_realtime_sessions_go_to_both_engines(server, model):
    clips = sorted(CLIPS.glob("*.wav"))
    pcms = [pcm24(clips[i % len(clips)], 1.0 + 0.5 * i) for i in range(4)]
    client = openai.OpenAI(api_key=KEY, base_url=server.url + "/v1")
    before = device_metric(server, "realtime_turns_total")
    started = threading.Barrier(len(pcms), timeout=WAIT)

    def one(pcm):
        with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            conn.recv()
            conn.session.update(session=MANUAL)
            conn.recv()
            started.wait()  # every session open before any sends audio
            return transcribe_manually(conn, pcm, wait_for_delta=False)[-1].transcript

    with ThreadPoolExecutor(len(pcms)) as pool:
        said = list(pool.map(one, pcms))
    assert said == [streamed_text(model, pcm) for pcm in pcms]
    turns = device_metric(server, "realtime_turns_total")
    assert turns["cpu:0"] > before["cpu:0"] and turns["cpu:1"] > before["cpu:1"], turns


def test_devices_with_device_is_bad_usage():
    command = [sys.executable, "-m", "graphscribe.cli", "serve", "--device", "cpu", "--devices", "cpu,cpu"]
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=120)
    assert result.returncode == 2
    assert "--device cpu --devices cpu,cpu: give one of them" in result.stderr


@pytest.mark.parametrize("cores,gpus,workers", [(32, 1, 4), (32, 2, 8), (64, 8, 16), (6, 2, 1), (16, 0, 4)])
def test_http_workers_by_default_grow_with_the_gpus(monkeypatch, cores, gpus, workers):
    """Beside GPUs one HTTP worker per 4 cores, up to 4 a GPU: two GPUs answer twice the requests a second, and the
    workers decode their uploads."""
    import torch

    from graphscribe.serve.command import default_http_workers

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(cores)), raising=False)
    assert default_http_workers("cuda", gpus) == workers
    assert default_http_workers("cpu", gpus) == 1
