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
from conftest import CLIPS, FIXTURES, NEMO_PATH, SPEECH_CLIP

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
        state, tokens = None, [[], []]
        for start in range(0, encoded.shape[1], size):
            part = (lengths - start).clamp(min=0, max=size)
            hyps, state = model.decoder.decode_chunk(encoded[:, start : start + size], part, state)
            for i, hyp in enumerate(hyps):
                tokens[i] += hyp.token_ids
        assert tokens == [h.token_ids for h in whole], size


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


def test_streams_batched_with_staggered_starts_equal_each_alone(model):
    """Eight streams of one engine, opened at different steps, stepped together: each gets what it gets alone."""
    clips = sorted(CLIPS.glob("*.wav"))
    audios = [model.read(c) for c in clips][:6]
    audios += [audios[0][8000:], audios[2][: audios[2].numel() // 2]]
    alone = [_whole(model.stream(*SMALL), a)[-1].token_ids for a in audios]
    engine = StreamEngine(model, *SMALL)
    streams, fed = [], []
    for step in range(200):
        if step < len(audios):  # one more stream joins at every step
            streams.append(engine.open())
            fed.append(0)
        for i, s in enumerate(streams):  # 0.3 s more of each open stream's audio per step
            if not s.finished:
                end = min(audios[i].numel(), fed[i] + 4800)
                s.feed(audios[i][fed[i] : end])
                fed[i] = end
                if end == audios[i].numel():
                    s.finish()
        engine.step()
        if len(streams) == len(audios) and all(s.closed for s in streams):
            break
    done = [next(e for e in s.take_events() if e.type == "done") for s in streams]
    assert [d.token_ids for d in done] == alone


def test_the_cli_streams_jsonl_events_in_order(model, tmp_path):
    audio = model.read(SPEECH_CLIP)
    expected = _whole(model.stream(0.8, 9.6, 1.6), audio)[-1]
    command = [sys.executable, "-m", "graphscribe.cli", str(SPEECH_CLIP), "--stream", "-f", "jsonl"]
    run = subprocess.run([*command, "-m", str(NEMO_PATH), "--device", "cpu"], capture_output=True, text=True)
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


def test_bad_stream_input_is_one_line(tmp_path):
    base = [sys.executable, "-m", "graphscribe.cli", "-", "--stream", "-m", str(NEMO_PATH), "--device", "cpu"]
    run = subprocess.run(base, input=b"this is not audio at all" * 100, capture_output=True, timeout=600)
    assert run.returncode == 1
    lines = run.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "standard input" in lines[0], lines
    run = subprocess.run([*base, "--raw-rate", "12"], input=b"\0\0" * 100, capture_output=True, timeout=600)
    assert run.returncode == 2 and "--raw-rate 12" in run.stderr.decode()
    run = subprocess.run([*base[:3], str(CLIPS), "--stream"], capture_output=True, timeout=600)
    assert run.returncode == 2 and "one file" in run.stderr.decode()


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


def _oracle() -> dict:
    path = STREAM_FIXTURES / "reference.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _checkpoint(name: str) -> Path:
    return NEMO_PATH if name.startswith("tdt") else RNNT_PATH


def test_the_oracle_is_there():
    assert _oracle(), f"{STREAM_FIXTURES}/reference.json: run scripts/fixtures/make_nemo_stream_fixtures.py"


def _cases():
    oracle = _oracle()
    return [(run["model"], run["settings"], run["clips"]) for run in oracle.get("runs", [])]


@pytest.mark.parametrize("name,settings,clips", _cases())
def test_one_stream_gives_nemos_token_ids(name, settings, clips):
    model = gs.load_model(_checkpoint(name), device="cpu", dtype="float32")
    for clip in clips:
        audio = model.read(STREAM_FIXTURES / clip["path"]) if (STREAM_FIXTURES / clip["path"]).exists() else None
        audio = model.read(Path(clip["path"])) if audio is None else audio
        done = _whole(model.stream(*settings), audio)[-1]
        assert done.token_ids == clip["token_ids"], clip["path"]
