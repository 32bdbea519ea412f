"""Every input a user has, through the real `transcribe` command: bad --device strings, FFmpeg formats, stdin, URLs.

Containers are written by PyAV from a held-out clip the demo model transcribes well; each must give the words the
WAV gives, and the sentence that was spoken.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import NEMO_PATH, SPEECH_CLIP


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


# rich reads ":x:" and ":-1:" as emoji codes ("cuda❌", "cuda👎"): the CLI's err_console needs emoji=False
EMOJI_BUG = pytest.mark.xfail(strict=True, reason="rich renders :x: and :-1: in an error line as emoji")
BAD_DEVICES = [
    "gpu",
    "foo",
    pytest.param("cuda:x", marks=EMOJI_BUG),
    pytest.param("cuda:-1", marks=EMOJI_BUG),
    "cuda:",
    "CPU",
]


# ids spell "device=...": a bare "gpu" id would be read as the gpu marker (conftest skips those without CUDA)
@pytest.mark.parametrize("device", BAD_DEVICES, ids=lambda d: f"device={d}")
def test_a_bad_device_is_one_line(device):
    result = transcribe(SPEECH_CLIP, "--device", device, model=str(NEMO_PATH))
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [f"error: --device {device}: use auto, cpu, cuda or cuda:N"]
    assert result.stdout == ""


def test_a_device_index_past_the_last_gpu():
    result = transcribe(SPEECH_CLIP, "--device", "cuda:99", model=str(NEMO_PATH))
    if torch.cuda.is_available():
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"error: --device cuda:99: this machine has {torch.cuda.device_count()} CUDA device(s)"
        ]
    else:  # as for --device cuda: the CPU, with one warning
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines() == ["warning: CUDA is not available on this machine; running on the CPU"]
        assert result.stdout.strip()
