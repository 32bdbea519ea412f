"""Hugging Face references: from the local cache without network, fast one-line failures, `@revision`, `:file.nemo`.

Every case runs in a fresh interpreter whose Hugging Face cache is a folder made here (the layout
huggingface_hub writes: `models--org--name/refs/main` and `snapshots/<commit>/<file>`) and whose hub
endpoint is a closed local port: a request that should not be made fails, and a slow failure shows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

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


def _resolve_all(sources: list[str], env: dict, cwd=None) -> list[tuple[str, float]]:
    """resolve_model_path(source) for each source, in one fresh interpreter: the path, or 'CheckpointError: ...';
    and the seconds each call took (timed there: the interpreter's start and imports are not the hub's doing)."""
    code = (
        "import json, sys, time\n"
        "from graphscribe.io.checkpoint import CheckpointError, resolve_model_path\n"
        "for source in sys.argv[1:]:\n"
        "    start = time.perf_counter()\n"
        "    try:\n        found = str(resolve_model_path(source))\n"
        "    except CheckpointError as err:\n        found = f'CheckpointError: {err}'\n"
        "    print(json.dumps([found, time.perf_counter() - start]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *sources], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr  # no retry chatter, no warnings
    return [tuple(json.loads(line)) for line in result.stdout.splitlines()]


def _resolve(source: str, env: dict, cwd=None) -> tuple[str, float]:
    (found,) = _resolve_all([source], env, cwd)
    return found


def _snapshot(cache: str, name: str, repo: str = "acme/parakeet-x") -> str:
    return os.path.join(cache, f"models--{repo.replace('/', '--')}", "snapshots", COMMIT, name)


# ---------------------------------------------------------------------------- from the cache, no network


def test_cached_repos_resolve_without_network(tmp_path):
    """In one interpreter: a cached repo's id, a commit, a branch and a file; of two .nemo files, the one named after
    the repo; of two others, none (refused with the list) unless one is named; an unknown repo fails fast, in one
    line, the closed endpoint unreachable."""
    cache = _cache(tmp_path)
    _cache(tmp_path, {"parakeet-y.nemo": "", "parakeet-y-old.nemo": ""}, repo="acme/parakeet-y")
    _cache(tmp_path, {"a.nemo": "", "b.nemo": ""}, repo="acme/several")
    cached = [
        "acme/parakeet-x",
        f"acme/parakeet-x@{COMMIT}",
        "acme/parakeet-x@main",
        "acme/parakeet-x:parakeet-x.nemo",
    ]
    others = ["acme/parakeet-y", "acme/several", "acme/several:b.nemo", "acme/unknown@v2"]
    found = _resolve_all(cached + others, _env(cache))
    for source, (path, seconds) in zip(cached, found, strict=False):
        assert path == _snapshot(cache, "parakeet-x.nemo"), source
        assert seconds < HANG_GUARD, source
    (named, _), (refused, _), (chosen, _), unknown = found[len(cached) :]
    assert named == _snapshot(cache, "parakeet-y.nemo", repo="acme/parakeet-y")
    assert refused == (
        "CheckpointError: acme/several: holds 2 .nemo files (a.nemo, b.nemo): name one, e.g. acme/several:a.nemo"
    )
    assert chosen == _snapshot(cache, "b.nemo", repo="acme/several")
    _assert_fails_fast(unknown, offline=False)


def test_cached_repo_resolves_with_hf_hub_offline(tmp_path):
    """HF_HUB_OFFLINE: the cached repo from the cache; an unknown one fails fast in one line that names the setting."""
    cache = _cache(tmp_path)
    (found, _), unknown = _resolve_all(["acme/parakeet-x", "acme/unknown@v2"], _env(cache, HF_HUB_OFFLINE="1"))
    assert found == _snapshot(cache, "parakeet-x.nemo")
    _assert_fails_fast(unknown, offline=True)


def _assert_fails_fast(result: tuple[str, float], offline: bool) -> None:
    message, seconds = result
    assert seconds < HANG_GUARD
    assert message.startswith("CheckpointError: acme/unknown@v2: no such file or folder, and ")
    assert ("HF_HUB_OFFLINE" in message) == offline
    assert "--model" in message and "\n" not in message


def test_cached_repo_loads_and_transcribes_through_the_cli(tmp_path):
    env = _env(_cache(tmp_path))
    command = [sys.executable, "-m", "graphscribe.cli", "--device", "cpu", "--model", "acme/parakeet-x"]
    result = subprocess.run(
        [*command, str(CLIPS / "short_2s.wav")], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------- which .nemo file


def test_folder_with_several_nemo_files(tmp_path):
    """Two .nemo files: refused with the list; one of them named after the folder: that one (one interpreter)."""
    several, named = tmp_path / "several" / "models", tmp_path / "named" / "models"
    for folder, names in ((several, ("a.nemo", "b.nemo")), (named, ("a.nemo", "b.nemo", "models.nemo"))):
        folder.mkdir(parents=True)
        for name in names:
            shutil.copy(NEMO_PATH, folder / name)
    (message, _), (found, _) = _resolve_all([str(several), str(named)], _env(None))
    assert message.startswith(f"CheckpointError: {several}: holds 2 .nemo files (a.nemo, b.nemo): name one, e.g. ")
    assert found == str(named / "models.nemo")


# ---------------------------------------------------------------------------- failing fast, in one line


def test_unknown_repo_through_the_cli_is_one_line_and_exit_2(tmp_path):
    command = [sys.executable, "-m", "graphscribe.cli", "--device", "cpu", "--model", "acme/unknown"]
    result = subprocess.run(
        [*command, str(CLIPS / "short_2s.wav")], env=_env(None), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "acme/unknown" in lines[0], result.stderr


def test_missing_path_is_not_asked_of_the_hub(tmp_path):
    (tmp_path / "models").mkdir()  # `models/parakeet`: its first folder exists here, so it is a path
    sources = ["./x.nemo", "../x", "/abs/path/model", "~/nope", "x.nemo", "models/parakeet"]
    for source, (message, seconds) in zip(sources, _resolve_all(sources, _env(None), cwd=tmp_path), strict=True):
        assert message == f"CheckpointError: {source}: no such file or folder"
        assert seconds < HANG_GUARD, source
