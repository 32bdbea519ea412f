"""Shared fixtures: the NeMo-made tiny TDT checkpoint, its clips and NeMo's own outputs.

Every expected number comes from `fixtures/nemo-tdt-tiny/reference.{json,npz}` (written by
NeMo 3.0.0), never from graphscribe itself.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

# One intra-op thread for torch here and (through the environment) in every process a test starts, unless the
# caller chose: the tiny models gain nothing from more, and on a 2-core machine that also runs the CLI, its workers
# and servers, OpenMP threads spinning for a busy core made tests 5-10x slower (test_streaming's chunked and
# resampled streams: 35 s -> 4 s on a shared 2-core machine). Set before torch is imported, which reads it.
_THREADS_CHOSEN = "OMP_NUM_THREADS" in os.environ
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402  (after OMP_NUM_THREADS)

if not _THREADS_CHOSEN:
    torch.set_num_threads(1)  # in case torch was imported (by a plugin) before the line above

if not torch.cuda.is_available():
    # the fused decode step's Triton kernels run on the CPU through Triton's interpreter (tests/test_fused_step.py);
    # it has to be chosen before Triton is first imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

from graphscribe.io.audio import speech_path  # noqa: E402  (after TRITON_INTERPRET)

FIXTURES = Path(__file__).parent / "fixtures"
NEMO_DIR = FIXTURES / "nemo-tdt-tiny"
NEMO_PATH = NEMO_DIR / "tdt-tiny.nemo"
CLIPS = NEMO_DIR / "clips"
SPEECH_CLIP = CLIPS / "librispeech_2086-149220-0033.wav"  # 7.4 s, 16 kHz mono PCM_16
JFK_FLAC = speech_path("jfk_44k1_stereo_24bit.flac")  # 11.0 s, 44.1 kHz stereo 24-bit (shipped in the package)

_REFERENCE = json.loads((NEMO_DIR / "reference.json").read_text())
CLIP_NAMES = [clip["file"] for clip in _REFERENCE["clips"]]  # clipN in reference.npz is CLIP_NAMES[N]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n 2` hands out whole files (unless --dist chose otherwise): xdist's default spreads a module's tests over
    both workers, and each then starts that module's fixtures (the server processes, a Ray cluster, the models)
    for itself."""
    if config.getoption("dist") == "load":
        from xdist.scheduler import LoadFileScheduling

        return LoadFileScheduling(config, log)
    return None


# The longest files (about a minute of CPU or more each on 2 cores), handed out first: with whole files to a worker,
# one of them left for last would run while the other worker has nothing more to take.
SLOW_FILES = (
    "test_fused_step.py",
    "test_server.py",
    "test_realtime.py",
    "test_devices.py",
    "test_beam.py",
    "test_outputs.py",
    "test_confidence_outputs.py",
    "test_hub.py",
    "test_streaming.py",
    "test_ray.py",
    "test_local_attention.py",
    "test_cache_aware.py",
    "test_writers.py",
    "test_ray_serve.py",
)


def pytest_collection_modifyitems(config, items):
    """SLOW_FILES first; tests marked `gpu` skip cleanly on machines without CUDA."""
    first = {name: rank for rank, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: first.get(item.path.name, len(SLOW_FILES)))  # stable: each file's order kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def reference_clip(name: str) -> dict:
    """NeMo's record for one clip: samples, feature_frames, encoder_frames, token_ids, timestamps, text."""
    return next(clip for clip in _REFERENCE["clips"] if clip["file"] == name)


@pytest.fixture(scope="session")
def reference() -> dict:
    return _REFERENCE


@pytest.fixture(scope="session")
def reference_arrays() -> dict[str, np.ndarray]:
    with np.load(NEMO_DIR / "reference.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="session")
def model():
    """The tiny NeMo checkpoint loaded once, on the CPU, decoding eagerly."""
    from graphscribe.api import load_model

    return load_model(NEMO_PATH, device="cpu", graphs=False)


@pytest.fixture(scope="session")
def speech_ids() -> list[int]:
    """NeMo's token ids for SPEECH_CLIP."""
    return reference_clip(SPEECH_CLIP.name)["token_ids"]


def chunked_tokens(decoder, encoded, lengths, size: int) -> list[list[int]]:
    """Each row's tokens from `decoder.decode_chunk` over `size` frames at a time, each chunk from the state the
    chunk before left (what a whole `decode` must equal)."""
    state, tokens = None, [[] for _ in range(encoded.shape[0])]
    for start in range(0, encoded.shape[1], size):
        part = (lengths - start).clamp(min=0, max=size)
        hyps, state = decoder.decode_chunk(encoded[:, start : start + size], part, state)
        for i, hyp in enumerate(hyps):
            tokens[i] += hyp.token_ids
    return tokens
