"""`/v1/realtime?intent=transcription`: the real server process on a localhost port, driven by the official `openai`
package's realtime client and, for the unhappy paths, a raw `websockets` client."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import torch
import torchaudio.functional as AF
from conftest import CLIPS, SPEECH_CLIP
from test_server import ENV, KEY, cli, start_server
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from graphscribe.io.resample import StreamResampler

PIECE = 960  # samples an append: 40 ms at 24 kHz
WAIT = 120  # seconds any one event may take on a busy CPU
MAX_SESSIONS = 20
MANUAL = {"type": "transcription", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                                                       "turn_detection": None}}}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = start_server(tmp_path_factory.mktemp("realtime") / "stderr.txt", "--max-sessions", str(MAX_SESSIONS))
    yield served
    assert served.stop() == 0, served.log.read_text()


def pcm24(path, seconds: float | None = None) -> np.ndarray:
    """A clip as 24 kHz PCM16, as a browser or a telephony bridge sends it."""
    import soundfile

    audio, rate = soundfile.read(path, dtype="float32")
    if seconds is not None:
        audio = audio[: int(seconds * rate)]
    resampled = AF.resample(torch.from_numpy(audio), rate, 24000).numpy()
    return (resampled * 32768).round().clip(-32768, 32767).astype("<i2")


def appends(pcm: np.ndarray) -> list[str]:
    return [base64.b64encode(pcm[i : i + PIECE].tobytes()).decode() for i in range(0, len(pcm), PIECE)]


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"


def raw_session(server, **kwargs):
    kwargs.setdefault("additional_headers", {"Authorization": f"Bearer {KEY}"})
    return connect(ws_url(server), open_timeout=WAIT, **kwargs)


def receive(ws, until: str) -> list[dict]:
    """A raw client's events up to and including the first of type `until`."""
    events = []
    while True:
        events.append(json.loads(ws.recv(timeout=WAIT)))
        if events[-1]["type"] == until:
            return events


def transcribe_manually(conn, pcm: np.ndarray, wait_for_delta: bool = True) -> list:
    """Append a clip in 40 ms pieces; with `wait_for_delta`, commit only once a delta has come; the events to the
    turn's `completed`."""
    for piece in appends(pcm):
        conn.input_audio_buffer.append(audio=piece)
    events = []
    if wait_for_delta:
        while not events or events[-1].type != "conversation.item.input_audio_transcription.delta":
            events.append(conn.recv())
    conn.input_audio_buffer.commit()
    while events[-1:] == [] or events[-1].type != "conversation.item.input_audio_transcription.completed":
        events.append(conn.recv())
        assert events[-1].type != "error", events[-1]
    return events


def streamed_text(model, pcm: np.ndarray) -> str:
    """What the streaming engine says of 24 kHz PCM resampled as it arrives (the streaming command's path)."""
    resampler = StreamResampler(24000, model.sample_rate)
    stream = model.stream(0.8, 9.6, 1.6)
    samples = pcm.astype(np.float32) / 32768.0
    for i in range(0, len(samples), PIECE):
        stream.feed(resampler.push(samples[i : i + PIECE]))
    stream.feed(resampler.flush())
    return stream.finish()[-1].text


def test_a_clip_gives_deltas_before_the_commit_and_the_streaming_commands_text(server, tmp_path):
    pcm = pcm24(SPEECH_CLIP)
    client = openai.OpenAI(api_key=KEY, base_url=server.url + "/v1")
    with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session=MANUAL)
        updated = conn.recv()
        assert updated.type == "session.updated" and updated.session.audio.input.turn_detection is None
        events = transcribe_manually(conn, pcm)
    kinds = [e.type for e in events]
    committed = kinds.index("input_audio_buffer.committed")
    assert kinds[0] == "conversation.item.input_audio_transcription.delta" and committed > 0
    assert kinds[committed + 1] == "conversation.item.created"
    item = events[committed].item_id
    assert all(e.item_id == item for e in events if "transcription" in e.type)
    completed = events[-1]
    deltas = "".join(e.delta for e in events if e.type.endswith(".delta"))
    assert completed.transcript and deltas == completed.transcript
    # the streaming command, given the same 24 kHz PCM, says the same
    raw = tmp_path / "clip.pcm"
    raw.write_bytes(pcm.tobytes())
    streamed = cli(raw, "--stream", "-f", "jsonl", "--raw-rate", "24000")
    assert completed.transcript == json.loads(streamed.splitlines()[-1])["text"]


def test_the_older_transcription_session_shape(server):
    with raw_session(server) as ws:
        assert receive(ws, "session.created")
        update = {"input_audio_format": "pcm16", "turn_detection": None, "input_audio_transcription": {"model": "x"}}
        ws.send(json.dumps({"type": "transcription_session.update", "session": update}))
        session = receive(ws, "transcription_session.updated")[-1]["session"]
        assert session["turn_detection"] is None and session["input_audio_format"] == "pcm16"
        for piece in appends(pcm24(SPEECH_CLIP, 2.0)):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        events = receive(ws, "conversation.item.input_audio_transcription.completed")
    assert [e for e in events if e["type"] == "input_audio_buffer.committed"]


def test_sixteen_sessions_at_once_each_get_their_own_text(server, model):
    clips = sorted(CLIPS.glob("*.wav"))
    pcms = [pcm24(clips[i % len(clips)], 1.0 + 0.4 * i) for i in range(16)]
    client = openai.OpenAI(api_key=KEY, base_url=server.url + "/v1")
    started = threading.Barrier(16, timeout=WAIT)

    def one(pcm):
        with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            conn.recv()
            conn.session.update(session=MANUAL)
            conn.recv()
            started.wait()  # every session open before any sends audio
            return transcribe_manually(conn, pcm, wait_for_delta=False)[-1].transcript

    with ThreadPoolExecutor(16) as pool:
        said = list(pool.map(one, pcms))
    assert said == [streamed_text(model, pcm) for pcm in pcms]
    assert len(set(said)) > 8  # different audio, different text: nobody got another's


def silero_turns(pcm: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) ms of each turn as Silero's own `VADIterator` finds them in 24 kHz PCM resampled as it comes, with
    the server's defaults (threshold 0.5, 500 ms of silence); the end is where the silence has lasted that long."""
    from silero_vad import VADIterator, load_silero_vad

    resampler = StreamResampler(24000, 16000)
    samples = pcm.astype(np.float32) / 32768.0
    audio = np.concatenate([resampler.push(samples), resampler.flush()])
    iterator = VADIterator(load_silero_vad(onnx=True), 0.5, 16000, min_silence_duration_ms=500, speech_pad_ms=0)
    turns, start = [], None
    for i in range(0, len(audio) - 511, 512):
        said = iterator(torch.from_numpy(audio[i : i + 512]))
        if said and "start" in said:
            start = said["start"]
        elif said:
            turns.append((start // 16, (i + 512) // 16))
    return turns


def test_server_vad_turns_are_silero_vads(server):
    silence = np.zeros(24000, dtype="<i2")
    pcm = np.concatenate([silence, pcm24(SPEECH_CLIP), silence, silence])
    expected = silero_turns(pcm)
    assert len(expected) >= 2
    with raw_session(server) as ws:
        receive(ws, "session.created")
        for piece in appends(pcm):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        events = []
        for _ in expected:
            events += receive(ws, "conversation.item.input_audio_transcription.completed")
    starts = [e for e in events if e["type"] == "input_audio_buffer.speech_started"]
    stops = [e for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
    assert [(a["audio_start_ms"], b["audio_end_ms"]) for a, b in zip(starts, stops)] == expected
    for turn in starts:  # each turn: its deltas add up to its transcript, committed before it completes
        mine = [e for e in events if e.get("item_id") == turn["item_id"]]
        kinds = [e["type"] for e in mine]
        assert kinds.index("input_audio_buffer.committed") < kinds.index(
            "conversation.item.input_audio_transcription.completed"
        )
        deltas = "".join(e["delta"] for e in mine if e["type"].endswith(".delta"))
        assert deltas == mine[-1]["transcript"]


def test_a_wrong_key_is_refused_before_the_upgrade(server):
    with pytest.raises(InvalidStatus) as refused:
        raw_session(server, additional_headers={"Authorization": "Bearer wrong"})
    assert refused.value.response.status_code == 401
    assert b"invalid_api_key" in refused.value.response.body
    # the browsers' way: the key as a subprotocol
    with raw_session(server, additional_headers={}, subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]) as ws:
        assert ws.subprotocol == "realtime"
        assert receive(ws, "session.created")


def test_bad_events_get_an_error_and_the_session_goes_on(server):
    with raw_session(server) as ws:
        receive(ws, "session.created")
        ws.send("{not json")
        assert receive(ws, "error")[-1]["error"]["code"] == "invalid_json"
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "%%% not base64 %%%", "event_id": "e1"}))
        error = receive(ws, "error")[-1]["error"]
        assert error["code"] == "invalid_audio" and error["event_id"] == "e1"
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()}))
        assert receive(ws, "error")[-1]["error"]["code"] == "invalid_audio"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
        assert receive(ws, "error")[-1]["error"]["param"] == "type"
        ws.send(json.dumps({"type": "response.create"}))
        assert receive(ws, "error")[-1]["error"]["code"] == "invalid_event"
        ws.send(json.dumps({"type": "session.update", "session": MANUAL}))
        receive(ws, "session.updated")
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        assert receive(ws, "error")[-1]["error"]["code"] == "input_audio_buffer_commit_empty"
        for piece in appends(pcm24(SPEECH_CLIP, 1.5)):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        assert receive(ws, "conversation.item.input_audio_transcription.completed")[-1]["transcript"] is not None


def test_a_client_that_vanishes_mid_turn_frees_its_place(tmp_path):
    served = start_server(tmp_path / "stderr.txt", "--max-sessions", "1")
    try:
        gone = raw_session(served)
        receive(gone, "session.created")
        gone.send(json.dumps({"type": "session.update", "session": MANUAL}))
        for piece in appends(pcm24(SPEECH_CLIP, 3.0)):
            gone.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
        with pytest.raises(InvalidStatus) as full:
            raw_session(served)
        assert full.value.response.status_code == 503
        gone.socket.close()  # no close frame: the client is simply gone
        # its place comes back once the worker sees it gone: the next session is admitted
        for _ in range(600):
            try:
                ws = raw_session(served)
                break
            except InvalidStatus as err:
                assert err.response.status_code == 503
                threading.Event().wait(0.1)
        with ws:
            receive(ws, "session.created")
            ws.send(json.dumps({"type": "session.update", "session": MANUAL}))
            events = transcribe_raw(ws, pcm24(SPEECH_CLIP, 2.0))
            assert events[-1]["transcript"] is not None
    finally:
        assert served.stop() == 0, served.log.read_text()


def transcribe_raw(ws, pcm) -> list[dict]:
    for piece in appends(pcm):
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
    ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    return receive(ws, "conversation.item.input_audio_transcription.completed")


def test_sigterm_answers_every_open_turn_and_exits_0(tmp_path):
    served = start_server(tmp_path / "stderr.txt", "--max-sessions", "4")
    sockets = []
    try:
        for _ in range(3):
            ws = raw_session(served)
            receive(ws, "session.created")
            ws.send(json.dumps({"type": "session.update", "session": MANUAL}))
            receive(ws, "session.updated")
            for piece in appends(pcm24(SPEECH_CLIP, 2.5)):
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
            sockets.append(ws)
        # every session's audio is in the server once each has said something of it
        for ws in sockets:
            receive(ws, "conversation.item.input_audio_transcription.delta")
        served.process.send_signal(signal.SIGTERM)
        for ws in sockets:
            events = []
            with pytest.raises(ConnectionClosed):
                while True:
                    events.append(json.loads(ws.recv(timeout=WAIT)))
            kinds = [e["type"] for e in events]
            assert "conversation.item.input_audio_transcription.completed" in kinds or "error" in kinds, kinds
        assert served.process.wait(WAIT) == 0, served.log.read_text()
    finally:
        for ws in sockets:
            ws.close()
        served.stop()


def test_past_max_sessions_the_upgrade_is_refused(server):
    sessions = [raw_session(server) for _ in range(MAX_SESSIONS)]
    try:
        with pytest.raises(InvalidStatus) as full:
            raw_session(server)
        assert full.value.response.status_code == 503
        assert json.loads(full.value.response.body)["error"]["code"] == "sessions_full"
    finally:
        for ws in sessions:
            ws.close()


def test_the_load_test_times_real_time_sessions(server, tmp_path):
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "espeak_fox.wav").write_bytes((CLIPS / "espeak_fox.wav").read_bytes())  # 4.6 s of speech, sent twice
    report_path = tmp_path / "report.json"
    command = [sys.executable, "-m", "graphscribe.cli", "bench", "--realtime", server.url.replace("http", "ws")]
    command += ["--folder", str(folder), "--sessions", "2", "--api-key", KEY, "--json", str(report_path)]
    run = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
    assert run.returncode == 0, run.stderr
    (row,) = json.loads(report_path.read_text())["rows"]
    assert row["sessions"] == 2 and row["failed_sessions"] == 0 and row["client_processes"] == 1, row
    assert row["turns"] >= 2 and row["deltas"] > 0 and row["delta_ms"]["p50"] is not None
    # the sessions' count and the level's verdict (all its deltas' p95, as the in-process bench judges its streams)
    assert row["kept_up"] in (0, 1, 2) and isinstance(row["level_kept_up"], bool), row
    assert len(row["behind"]) == 2 - row["kept_up"] - row["failed_sessions"], row  # each session behind, listed
    # one turn a session, committed after its audio: VAD off, so exactly one turn, answered
    run = subprocess.run(command + ["--turns", "commit"], capture_output=True, text=True, env=ENV, timeout=600)
    assert run.returncode == 0, run.stderr
    report = json.loads(report_path.read_text())
    (row,) = report["rows"]
    assert report["turns"] == "commit" and row["failed_sessions"] == 0, row
    assert row["turns"] == 2 and row["deltas"] > 0 and row["final_ms"]["p50"] is not None, row


def test_the_load_test_spreads_its_sessions_over_client_processes(monkeypatch):
    """One Python process times about 144 sessions (1152 over 4 processes measured their own lag): the default
    spreads a level over more, up to half the cores, which the server may share."""
    from graphscribe.serve import realtime_load

    monkeypatch.setattr(realtime_load.os, "cpu_count", lambda: 16)
    assert [realtime_load.client_processes(n) for n in (1, 144, 145, 1152, 4096)] == [1, 1, 2, 8, 8]
    monkeypatch.setattr(realtime_load.os, "cpu_count", lambda: 2)
    assert realtime_load.client_processes(1152) == 1


def test_an_idle_session_is_ended_with_its_turn_answered(tmp_path):
    served = start_server(tmp_path / "stderr.txt", "--session-idle", "1")
    try:
        with raw_session(served) as ws:
            receive(ws, "session.created")
            ws.send(json.dumps({"type": "session.update", "session": MANUAL}))
            for piece in appends(pcm24(SPEECH_CLIP, 1.5)):
                ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
            # then nothing: the session ends, its open turn committed and answered first
            events = []
            with pytest.raises(ConnectionClosed):
                while True:
                    events.append(json.loads(ws.recv(timeout=WAIT)))
        kinds = [e["type"] for e in events]
        assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["session_idle_timeout"]
        assert kinds.index("input_audio_buffer.committed") < kinds.index(
            "conversation.item.input_audio_transcription.completed"
        )
    finally:
        assert served.stop() == 0, served.log.read_text()
