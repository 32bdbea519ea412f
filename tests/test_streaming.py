"""Live streams: NeMo's buffered streaming (`BufferedRNNTPipeline`) token for token, one stream and many batched.

The oracle is NeMo's own pipeline on our tiny checkpoints (`tests/fixtures/nemo-stream`, written by
`scripts/fixtures/make_nemo_stream_fixtures.py`), never graphscribe's output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchaudio.functional as AF
from conftest import CLIPS, FIXTURES, NEMO_PATH, SPEECH_CLIP, chunked_tokens
from test_cli import in_process

import graphscribe as gs
from graphscribe.io.resample import StreamResampler
from graphscribe.runtime.streaming import StreamEngine

STREAM_FIXTURES = FIXTURES / "nemo-stream"
RNNT_PATH = FIXTURES / "nemo-rnnt-tiny" / "rnnt-tiny.nemo"
SMALL = (0.48, 1.6, 0.32)  # chunk, left, right: a quick config for the tests that need no oracle


@pytest.fixture(scope="module")
def model():
    return gs.load_model(NEMO_PATH, device="cpu", dtype="float32")


def _whole(stream, audio) -> list:
    return stream.feed(audio) + stream.finish()


def test_a_chunked_decode_carries_the_state_across_chunks(model):
    """decode_chunk from the state the chunk before left gives the whole decode's tokens, for any chunk size:
    the prediction state, its output and a TDT jump past the chunk's end carry over."""
    audios = [model.read(CLIPS / name) for name in ("librispeech_2086-149220-0033.wav", "espeak_fox.wav")]
    encoded, lengths = model.encode(audios)
    whole = model.decoder.decode(encoded, lengths)
    for size in (1, 3, 10):
        assert chunked_tokens(model.decoder, encoded, lengths, size) == [h.token_ids for h in whole], size


def test_a_stream_fed_a_sample_at_a_time_equals_one_fed_whole(model):
    audio = model.read(SPEECH_CLIP)[:40000]  # 2.5 s: several chunks of the small config
    whole = _whole(model.stream(*SMALL), audio)
    stream = model.stream(*SMALL)
    pieces = []
    for i in range(audio.numel()):
        pieces += stream.feed(audio[i : i + 1])
    pieces += stream.finish()
    assert [(e.type, e.text, e.token_ids) for e in pieces] == [(e.type, e.text, e.token_ids) for e in whole]
    assert whole[-1].type == "done" and whole[-1].token_ids


def _staggered(engine: StreamEngine, audios: list, piece: int = 4800, trees: list | None = None) -> list[list]:
    """Each audio a stream of `engine` (opened with its tree of `trees`, if given), one more joining at every step,
    each fed `piece` more samples a step (0.3 s at 16 kHz) until its end -> each stream's events."""
    streams, fed, events = [], [], []
    while len(streams) < len(audios) or not all(s.closed for s in streams):
        if len(streams) < len(audios):
            streams.append(engine.open(trees[len(streams)]) if trees else engine.open())
            fed.append(0)
            events.append([])
        for i, s in enumerate(streams):
            if not s.finished:
                end = min(audios[i].numel(), fed[i] + piece)
                s.feed(audios[i][fed[i] : end])
                fed[i] = end
                if end == audios[i].numel():
                    s.finish()
        engine.step()
        for i, s in enumerate(streams):
            events[i].extend(s.take_events())
    return events


def test_streams_batched_with_staggered_starts_equal_each_alone(model):
    """Eight streams of one engine, opened at different steps, stepped together: each gets what it gets alone."""
    clips = sorted(CLIPS.glob("*.wav"))
    audios = [model.read(c) for c in clips][:6]
    audios += [audios[0][8000:], audios[2][: audios[2].numel() // 2]]
    alone = [_whole(model.stream(*SMALL), a)[-1].token_ids for a in audios]
    events = _staggered(StreamEngine(model, *SMALL), audios)
    done = [next(e for e in stream if e.type == "done") for stream in events]
    assert [d.token_ids for d in done] == alone


def test_the_cli_streams_jsonl_events_in_order(model, capsys):
    audio = model.read(SPEECH_CLIP)
    expected = _whole(model.stream(0.8, 9.6, 1.6), audio)[-1]
    run = in_process(capsys, SPEECH_CLIP, "--stream", "-f", "jsonl", "--device", "cpu")
    assert run.returncode == 0, run.stderr
    events = [json.loads(line) for line in run.stdout.splitlines()]
    assert (
        events[-1]["type"] == "done"
        and [e["type"] for e in events[:-1]]
        and "done" not in [e["type"] for e in events[:-1]]
    )
    assert events[-1]["token_ids"] == expected.token_ids and events[-1]["text"] == expected.text
    finals = [e for e in events if e["type"] == "final"]
    assert [t for e in finals for t in e["token_ids"]] == expected.token_ids  # the finals hold every token once
    assert all(a["start"] <= b["start"] for a, b in zip(finals, finals[1:]))


def test_raw_pcm_on_stdin_streams_like_the_file(model):
    audio = model.read(SPEECH_CLIP)
    expected = _whole(model.stream(0.8, 9.6, 1.6), audio)[-1].token_ids
    pcm = (audio.numpy() * 32768).round().clip(-32768, 32767).astype("<i2").tobytes()
    command = [sys.executable, "-m", "graphscribe.cli", "-", "--stream", "-f", "jsonl", "--raw-rate", "16000"]
    run = subprocess.run(
        [*command, "-m", str(NEMO_PATH), "--device", "cpu"], input=pcm, capture_output=True, timeout=600
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1])["token_ids"] == expected


def test_bad_stream_input_is_one_line(capsys):
    base = [sys.executable, "-m", "graphscribe.cli", "-", "--stream", "-m", str(NEMO_PATH), "--device", "cpu"]
    run = subprocess.run(base, input=b"this is not audio at all" * 100, capture_output=True, timeout=600)
    assert run.returncode == 1
    lines = run.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "standard input" in lines[0], lines
    # usage errors, refused before any input is read: cli.main in this process
    run = in_process(capsys, "-", "--stream", "--device", "cpu", "--raw-rate", "12")
    assert run.returncode == 2 and "--raw-rate 12" in run.stderr
    run = in_process(capsys, CLIPS, "--stream", model=None)
    assert run.returncode == 2 and "one file" in run.stderr


@pytest.mark.parametrize("source", [24000, 44100, 8000])
def test_a_resampled_stream_equals_the_whole_signal_resampled(source):
    rng = np.random.default_rng(source)
    x = (rng.standard_normal(source * 2 + 77) * 0.1).astype(np.float32)
    whole = AF.resample(torch.from_numpy(x), source, 16000).numpy()
    resampler, out, i = StreamResampler(source, 16000), [], 0
    while i < len(x):
        n = int(rng.integers(1, 3000))
        out.append(resampler.push(x[i : i + n]))
        i += n
    got = np.concatenate([*out, resampler.flush()])
    assert got.shape == whole.shape
    assert np.abs(got - whole).max() < 1e-6


def test_stream_settings_out_of_range_are_refused(model):
    for bad in ((0, 1.6, 0.32), (0.48, -1, 0.32), (0.48, 1.6, float("nan"))):
        with pytest.raises(ValueError):
            model.stream(*bad)


ORACLE = json.loads((STREAM_FIXTURES / "reference.json").read_text())
CHECKPOINTS = {"tdt-tiny": NEMO_PATH, "rnnt-tiny": RNNT_PATH}
ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def models() -> dict:
    return {name: gs.load_model(path, device="cpu", dtype="float32") for name, path in CHECKPOINTS.items()}


def _settings(geometry: dict) -> tuple[float, float, float]:
    return geometry["chunk_s"], geometry["left_s"], geometry["right_s"]


def _audio(model, clip: str) -> torch.Tensor:
    return model.read(ROOT / ORACLE["clips"][clip]["file"])


def _said(events: list) -> dict:
    """What a stream said, in the oracle's terms: its tokens, text, finals and the partial after each step."""
    done = events[-1]
    finals = [(e.token_ids, e.text, round(e.start, 6), round(e.end, 6)) for e in events if e.type == "final"]
    return {"token_ids": done.token_ids, "text": done.text, "finals": finals}


def _nemo_said(stream: dict) -> dict:
    finals = [(f["token_ids"], f["text"].strip(), round(f["start"], 6), round(f["end"], 6)) for f in stream["finals"]]
    return {"token_ids": stream["token_ids"], "text": stream["text"], "finals": finals}


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
@pytest.mark.parametrize("setting", ["v3", "small"])
def test_one_stream_says_what_nemos_pipeline_says(models, name, setting):
    """Every clip alone: NeMo's token ids, text, finals (tokens, text, times) and the partial after every step."""
    model, runs = models[name], ORACLE["models"][name]["settings"][setting]
    for clip, nemo in runs["streams"].items():
        stream = model.stream(*_settings(runs["geometry"]))
        audio, step = _audio(model, clip), stream.engine.geometry.frame_samples
        events, partials = [], []
        for start in range(0, audio.numel(), step):  # a chunk at a time, to see the partial after each step
            events += stream.feed(audio[start : start + step])
            partials.append(stream.text.partial())
        events += stream.finish()
        partials = partials[1:] + [stream.text.partial()]  # a chunk is stepped when audio past it comes
        assert _said(events) == _nemo_said(nemo), clip
        assert partials == [s[2] for s in nemo["steps"]], clip


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_streams_batched_with_staggered_starts_say_what_nemo_says(models, name):
    """All nine clips as streams of one engine, joining a step apart and fed 0.3 s a step: NeMo's results."""
    model, runs = models[name], ORACLE["models"][name]["settings"]["v3"]
    clips = sorted(runs["streams"])
    audios = [_audio(model, c) for c in clips]
    events = _staggered(StreamEngine(model, *_settings(runs["geometry"])), audios)
    for i, clip in enumerate(clips):
        assert _said(events[i]) == _nemo_said(runs["streams"][clip]), clip


def test_the_streams_bench_judges_the_level_and_each_stream(capsys, tmp_path):
    """`transcribe bench --streams N --pace realtime`: the level's verdict (the p95 of all its chunks' latencies)
    and each stream's own (its p95), the count the realtime load test gives for its sessions; `--pace max` an
    RTFx."""
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / SPEECH_CLIP.name).write_bytes(SPEECH_CLIP.read_bytes())
    report_path = tmp_path / "report.json"
    args = ["bench", "--streams", "2", "--folder", folder, "--device", "cpu", "--json", report_path]
    result = in_process(capsys, *args)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(report_path.read_text())["levels"]
    assert row["streams"] == 2 and row["pace"] == "realtime" and isinstance(row["kept_up"], bool), row
    assert row["streams_kept_up"] in (0, 1, 2) and row["chunk_latency_ms"]["p95"] is not None, row
    assert len(row["behind"]) == 2 - row["streams_kept_up"], row  # each stream behind, with its figures
    assert all(b["p95_ms"] > 800 and b["max_ms"] >= b["p95_ms"] and b["chunks"] > 0 for b in row["behind"]), row
    assert "kept up (streams)" in result.stdout
    result = in_process(capsys, *args, "--pace", "max")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(report_path.read_text())["levels"]
    assert row["pace"] == "max" and row["rtfx"] > 0, row


def test_both_live_benches_judge_a_stream_by_its_own_p95():
    """`runtime.latency`: the streams (or sessions) whose p95 passes the bound, the furthest first, with where their
    slowest came; the nearest-rank p95 is a latency that was measured."""
    from graphscribe.runtime.latency import behind, lateness, percentile

    on_time, late, later = [0.1] * 20, [0.1] * 18 + [1.5, 2.0], [3.0, 0.1]
    assert percentile(late, 95) == 1.5 and percentile([], 95) is None
    assert behind([on_time, late, later], 1.0) == [2, 1]
    assert lateness(later) == {"p95_ms": 3000.0, "max_ms": 3000.0, "slowest_at": 0}
