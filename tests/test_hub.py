"""Hugging Face references: from the local cache without network, fast one-line failures, `@revision`, `:file.nemo`.

Every case runs in a fresh interpreter whose Hugging Face cache is a folder made here (the layout
huggingface_hub writes: `models--org--name/refs/main` and `snapshots/<commit>/<file>`) and whose hub
endpoint is a closed local port: a request that should not be made fails, and a slow failure shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import CLIPS, NEMO_PATH

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens, connections are refused at once
HANG_GUARD = 10  # seconds: failing fast means well under this (huggingface_hub's own retries take ~25 s)


def _cache(tmp_path, files: dict[str, str] = None, repo: str = "acme/parakeet-x") -> str:
    """A Hugging Face hub cache holding `repo` at COMMIT (refs/main) with the fixture under each given name."""
    root = tmp_path / "hub"
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    for name in files or {"parakeet-x.nemo": ""}:
        shutil.copy(NEMO_PATH, snapshot / name)
    return str(root)


def _env(cache: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "GRAPHSCRIBE_MODEL"}
    env.update(HF_HUB_CACHE=cache or "/nonexistent/hf-cache", HF_ENDPOINT=CLOSED_PORT, HF_HUB_DISABLE_TELEMETRY="1")
    env.update(extra)
    return env


def _resolve(source: str, env: dict, cwd=None) -> tuple[str, float]:
    """resolve_model_path(source) in a fresh interpreter: the path, or 'CheckpointError: ...'; and the seconds taken."""
    code = (
        "import sys\n"
        "from graphscribe.io.checkpoint import CheckpointError, resolve_model_path\n"
        "try:\n    print(resolve_model_path(sys.argv[1]))\n"
        "except CheckpointError as err:\n    print('CheckpointError:', err)\n"
    )
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code, source], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr  # no retry chatter, no warnings
    return result.stdout.strip(), seconds


def _snapshot(cache: str, name: str, repo: str = "acme/parakeet-x") -> str:
    return os.path.join(cache, f"models--{repo.replace('/', '--')}", "snapshots", COMMIT, name)


# ---------------------------------------------------------------------------- from the cache, no network


@pytest.mark.parametrize(
    "source",
    ["acme/parakeet-x", f"acme/parakeet-x@{COMMIT}", "acme/parakeet-x@main", "acme/parakeet-x:parakeet-x.nemo"],
    ids=["id", "commit", "branch", "file"],
)
def test_cached_repo_resolves_without_network(tmp_path, source):
    cache = _cache(tmp_path)
    found, seconds = _resolve(source, _env(cache))
    assert found == _snapshot(cache, "parakeet-x.nemo")
    assert seconds < HANG_GUARD


def test_cached_repo_resolves_with_hf_hub_offline(tmp_path):
    cache = _cache(tmp_path)
    found, _ = _resolve("acme/parakeet-x", _env(cache, HF_HUB_OFFLINE="1"))
    assert found == _snapshot(cache, "parakeet-x.nemo")


def test_cached_repo_loads_and_transcribes_through_the_cli(tmp_path):
    env = _env(_cache(tmp_path))
    command = [sys.executable, "-m", "graphscribe.cli", "--device", "cpu", "--model", "acme/parakeet-x"]
    result = subprocess.run(
        [*command, str(CLIPS / "short_2s.wav")], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------- which .nemo file


def test_repo_file_named_after_the_repo_is_preferred(tmp_path):
    cache = _cache(tmp_path, {"parakeet-x.nemo": "", "parakeet-x-old.nemo": ""})
    found, _ = _resolve("acme/parakeet-x", _env(cache))
    assert found == _snapshot(cache, "parakeet-x.nemo")


def test_repo_with_several_nemo_files_is_refused_with_the_list(tmp_path):
    cache = _cache(tmp_path, {"a.nemo": "", "b.nemo": ""})
    message, _ = _resolve("acme/parakeet-x", _env(cache))
    assert message == (
        "CheckpointError: acme/parakeet-x: holds 2 .nemo files (a.nemo, b.nemo): name one, e.g. acme/parakeet-x:a.nemo"
    )
    found, _ = _resolve("acme/parakeet-x:b.nemo", _env(cache))
    assert found == _snapshot(cache, "b.nemo")


def test_folder_with_several_nemo_files(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("a.nemo", "b.nemo"):
        shutil.copy(NEMO_PATH, folder / name)
    message, _ = _resolve(str(folder), _env(None))
    assert message.startswith(f"CheckpointError: {folder}: holds 2 .nemo files (a.nemo, b.nemo): name one, e.g. ")
    shutil.copy(NEMO_PATH, folder / "models.nemo")
    found, _ = _resolve(str(folder), _env(None))
    assert found == str(folder / "models.nemo")


# ---------------------------------------------------------------------------- failing fast, in one line


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "unreachable"])
def test_unknown_repo_fails_fast_in_one_line(tmp_path, offline):
    env = _env(_cache(tmp_path), **({"HF_HUB_OFFLINE": "1"} if offline else {}))
    message, seconds = _resolve("acme/unknown@v2", env)
    assert seconds < HANG_GUARD
    assert message.startswith("CheckpointError: acme/unknown@v2: no such file or folder, and ")
    assert ("HF_HUB_OFFLINE" in message) == offline
    assert "--model" in message and "\n" not in message


def test_unknown_repo_through_the_cli_is_one_line_and_exit_2(tmp_path):
    command = [sys.executable, "-m", "graphscribe.cli", "--device", "cpu", "--model", "acme/unknown"]
    start = time.perf_counter()
    result = subprocess.run(
        [*command, str(CLIPS / "short_2s.wav")], env=_env(None), capture_output=True, text=True, timeout=60
    )
    assert time.perf_counter() - start < HANG_GUARD + 10  # the interpreter and torch's import on top
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "acme/unknown" in lines[0], result.stderr


@pytest.mark.parametrize("source", ["./x.nemo", "../x", "/abs/path/model", "~/nope", "x.nemo", "models/parakeet"])
def test_missing_path_is_not_asked_of_the_hub(tmp_path, source):
    (tmp_path / "models").mkdir()  # `models/parakeet`: its first folder exists here, so it is a path
    message, seconds = _resolve(source, _env(None), cwd=tmp_path)
    assert message == f"CheckpointError: {source}: no such file or folder"
    assert seconds < HANG_GUARD
