"""Every input a user has, through the real `transcribe` command: bad --device strings, FFmpeg formats, stdin, URLs.

Containers are written by PyAV from a held-out clip the demo model transcribes well; each must give the words the
WAV gives, and the sentence that was spoken.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from av_media import write_media
from conftest import SPEECH_CLIP
from test_cli import in_process


def transcribe(*args, model: str | None = None, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """`python -m graphscribe.cli ARGS [--model MODEL]`, GRAPHSCRIBE_MODEL unset (no --model: the demo model)."""
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    command = [sys.executable, "-m", "graphscribe.cli", *map(str, args)]
    if model is not None:
        command += ["--model", model]
    result = subprocess.run(
        command, input=stdin if stdin is not None else b"", capture_output=True, env=env, timeout=300
    )
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    return result


# ---------------------------------------------------------------------------- --device


# "cuda:x" and "cuda:-1" also check that rich prints ":x:" and ":-1:" as they are, not as emoji codes
BAD_DEVICES = [
    "gpu",
    "foo",
    "cuda:x",
    "cuda:-1",
    "cuda:",
    "CPU",
]


# ids spell "device=...": a bare "gpu" id would be read as the gpu marker (conftest skips those without CUDA)
@pytest.mark.parametrize("device", BAD_DEVICES, ids=lambda d: f"device={d}")
def test_a_bad_device_is_one_line(capsys, device):
    result = in_process(capsys, SPEECH_CLIP, "--device", device)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"error: --device {device}: use auto, cpu, cuda or cuda:N"]
    assert result.stdout == ""


def test_a_device_index_past_the_last_gpu(capsys):
    result = in_process(capsys, SPEECH_CLIP, "--device", "cuda:99")
    if torch.cuda.is_available():
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"error: --device cuda:99: this machine has {torch.cuda.device_count()} CUDA device(s)"
        ]
    else:  # as for --device cuda: one line
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            "error: --device cuda:99: CUDA is not available on this machine (--device cpu or auto)"
        ]
        assert result.stdout == ""


# ---------------------------------------------------------------------------- FFmpeg formats, stdin, URLs

HELDOUT = Path(__file__).parent / "fixtures" / "demo-heldout"
CLIP = HELDOUT / "heldout_01.wav"  # 5.4 s of held-out synthetic speech, which the demo model gets right
SPOKEN = next(
    c["text"] for c in json.loads((HELDOUT / "transcripts.json").read_text())["clips"] if c["file"] == CLIP.name
)
MEDIA = {  # file name: codec, codec rate, layout, video codec
    "talk.m4a": ("aac", 44100, "mono", None),
    "talk.mp4": ("aac", 48000, "stereo", "libx264"),
    "talk.webm": ("libopus", 48000, "mono", None),
    "talk.mkv": ("libmp3lame", 22050, "stereo", "mpeg4"),
}


def word_edits(a: str, b: str) -> int:
    """Word-level Levenshtein distance."""
    x, y = a.split(), b.split()
    row = list(range(len(y) + 1))
    for i, xw in enumerate(x, 1):
        prev, row[0] = row[0], i
        for j, yw in enumerate(y, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (xw != yw))
    return row[len(y)]


def test_word_edits_counts():
    assert word_edits("a b c d", "a x c") == 2


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> dict[str, Path]:
    """The held-out clip in each container, plus a video without sound and a corrupt mp4."""
    folder = tmp_path_factory.mktemp("media")
    samples, rate = sf.read(CLIP, dtype="float32")
    paths = {name: write_media(folder / name, samples, rate, *spec) for name, spec in MEDIA.items()}
    paths["silent.mp4"] = write_media(folder / "silent.mp4", None, rate, None, video="libx264", seconds=1.0)
    data = bytearray(paths["talk.mp4"].read_bytes())
    start = data.index(b"mdat") + 64
    data[start : start + 8000] = np.random.default_rng(0).bytes(8000)
    (folder / "corrupt.mp4").write_bytes(bytes(data))
    paths["corrupt.mp4"] = folder / "corrupt.mp4"
    return paths


@pytest.fixture(scope="module")
def transcribed(media) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
    """One run of the CLI (demo model) over the WAV, every container and the two bad files: result, path -> text."""
    result = transcribe(CLIP, *(media[name] for name in MEDIA), media["silent.mp4"], media["corrupt.mp4"])
    texts = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    return result, texts


def test_wav_gives_the_spoken_words(transcribed):
    _, texts = transcribed
    assert word_edits(texts[str(CLIP)], SPOKEN) <= 1


@pytest.mark.parametrize("name", list(MEDIA))
def test_container_gives_the_words_of_the_wav(transcribed, media, name):
    _, texts = transcribed
    text = texts[str(media[name])]
    assert word_edits(text, texts[str(CLIP)]) <= 2, text
    assert word_edits(text, SPOKEN) <= 2, text


def test_bad_media_fail_alone_with_one_line_each(transcribed, media):
    result, texts = transcribed
    assert result.returncode == 1
    assert sorted(_errors(result.stderr)) == [  # in the order results come
        f"error: {media['corrupt.mp4']}: not a readable audio file (corrupt data: "
        "Invalid data found when processing input)",
        f"error: {media['silent.mp4']}: no audio track",
    ]
    assert "Traceback" not in result.stderr
    assert len(texts) == 1 + len(MEDIA)


def test_a_folder_of_m4a_and_webm(media, tmp_path):
    for name in ("talk.m4a", "talk.webm"):
        shutil.copy(media[name], tmp_path / name)
    result = transcribe(tmp_path)
    assert result.returncode == 0, result.stderr
    texts = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert sorted(texts) == [str(tmp_path / "talk.m4a"), str(tmp_path / "talk.webm")]
    assert all(word_edits(text, SPOKEN) <= 2 for text in texts.values()), texts


def test_stdin_m4a(media):
    result = transcribe("-", stdin=media["talk.m4a"].read_bytes())
    assert result.returncode == 0, result.stderr
    assert word_edits(result.stdout.strip(), SPOKEN) <= 2, result.stdout


def test_stdin_wav_beside_a_file_a_url_and_a_second_dash(media):
    """Standard input's transcript is named `-`; a URL and a second `-` get one line each, the rest goes on."""
    result = transcribe(media["talk.webm"], "-", "https://example.com/talk.m4a", "-", stdin=CLIP.read_bytes())
    assert result.returncode == 1
    assert sorted(_errors(result.stderr)) == [
        "error: -: standard input is given twice; it is read once",
        "error: https://example.com/talk.m4a: URLs are not read; download the file first "
        "(or: curl -sL URL | transcribe -)",
    ]
    texts = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert sorted(texts) == sorted([str(media["talk.webm"]), "-"])
    assert word_edits(texts["-"], SPOKEN) <= 2, texts


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_dash_from_a_terminal_is_refused(monkeypatch):
    """Reading a terminal would wait for typing: one line instead."""
    from graphscribe.cli import expand_inputs

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Terminal())
    assert expand_inputs([Path("-")]) == (
        [],
        ["-: standard input is a terminal; pipe a file in (cat talk.m4a | transcribe -)"],
    )
