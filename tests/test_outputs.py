"""Nothing lost, nothing clobbered, nothing hidden: output files written whole on a full disk, a read-only or
unusable --output-dir refused before the model loads, names that depend on their input alone, --skip-existing,
and SIGINT / SIGTERM at chosen moments of a real `transcribe` process, each signalled once the test sees it come.

Full disks and read-only folders are real: a small tmpfs and a read-only bind mount (root only; skipped
elsewhere, since chmod does not stop root).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CLIPS, NEMO_PATH, reference_clip
from test_cli import _error_lines, transcribe
from test_devices import workers_of

from graphscribe.cli import RENDER_POOL_MIN_FILES
from graphscribe.output.writers import write_file
from graphscribe.targets import output_paths

SUFFIXES = (".txt", ".json", ".srt")  # the full-disk runs' outputs
INTERRUPTED = re.compile(r"^interrupted: (\d+) of (\d+) files done", re.M)


@contextlib.contextmanager
def _mounted(target: Path, *commands: list[str]):
    """Run mount `commands` on `target` (made if missing), unmounted afterwards; skip where mounting is not allowed."""
    target.mkdir(parents=True, exist_ok=True)
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", str(target)], capture_output=True)
            pytest.skip(f"cannot mount here ({done.stderr.strip()})")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True)


def _tmpfs(target: Path, size: str):
    return _mounted(target, ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)])


def _read_only(target: Path):
    return _mounted(
        target,
        ["mount", "--bind", str(target), str(target)],
        ["mount", "-o", "remount,ro,bind", str(target)],
    )


def _copies(folder: Path, clip: str, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{clip[:-4]}_{k:03d}.wav" for k in range(n)]
    for path in paths:
        shutil.copy(CLIPS / clip, path)
    return paths


def _complete_outputs(folder: Path, inputs: list[Path], text: str, suffixes=(".txt", ".json")) -> int:
    """Inputs with all their outputs of `suffixes` in `folder`; every file there holds `text` whole (never a
    fragment)."""
    complete = 0
    for source in inputs:
        txt, record, cues = (folder / (source.stem + suffix) for suffix in (".txt", ".json", ".srt"))
        if txt.exists():
            assert txt.read_text() == text + "\n"
        if record.exists():
            assert json.loads(record.read_text())["text"] == text
        if cues.exists():
            assert cues.read_text().startswith("1\n00:00:00,") and cues.read_text().endswith(f"{text}\n")
        complete += all((folder / (source.stem + suffix)).exists() for suffix in suffixes)
    return complete


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


# ============================================================================ write_file


def test_write_file_replaces_whole_and_keeps_the_umask_mode(tmp_path):
    target = tmp_path / "a.txt"
    target.write_text("old\n")
    write_file(target, "new ünïcode\n")
    assert target.read_bytes() == "new ünïcode\n".encode()
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    assert _leftovers(tmp_path) == []


def test_write_file_on_a_full_disk_keeps_the_old_file_and_no_temporary(tmp_path):
    with _tmpfs(tmp_path / "small", "16k") as disk:
        target = disk / "a.json"
        target.write_text("old\n")
        with pytest.raises(OSError) as raised:
            write_file(target, "x" * 64 * 1024)
        assert "No space left" in str(raised.value)
        assert target.read_text() == "old\n"
        assert sorted(p.name for p in disk.iterdir()) == ["a.json"]


# ============================================================================ the output folder, before loading


def test_output_dir_onto_a_file_is_bad_usage_before_loading(tmp_path):
    """The model named does not exist: the output folder is checked first, so the error is about it."""
    existing = tmp_path / "notes.txt"
    existing.write_text("mine\n")
    start = time.monotonic()
    result = transcribe(CLIPS / "short_2s.wav", "-o", existing, model=str(tmp_path / "missing.nemo"))
    assert result.returncode == 2
    [error] = _error_lines(result.stderr)
    assert str(existing) in error and "not a folder" in error and "missing.nemo" not in error
    assert "loaded" not in result.stderr and result.stdout == ""
    assert existing.read_text() == "mine\n"
    assert time.monotonic() - start < 60  # no model, no audio: Python, typer and torch's import only


def test_read_only_output_dir_is_bad_usage_before_loading(tmp_path):
    with _read_only(tmp_path / "ro") as folder:
        for out in (folder, folder / "new"):  # an existing folder, and one that cannot be made
            result = transcribe(CLIPS / "short_2s.wav", "-o", out, model=str(tmp_path / "missing.nemo"))
            assert result.returncode == 2, result.stderr
            [error] = _error_lines(result.stderr)
            assert str(out) in error and "Read-only file system" in error
            assert "loaded" not in result.stderr
        assert list(folder.iterdir()) == []


@pytest.mark.parametrize("copies, batch", [(12, 4), (RENDER_POOL_MIN_FILES, 64)], ids=["here", "render-workers"])
def test_a_full_disk_stops_the_run_in_one_line_and_skip_existing_finishes_it(tmp_path, copies, batch):
    """A tmpfs that holds a few outputs: at the first file that does not fit the run stops writing, with one line
    and exit 1; every file there is complete (no empty one: no transcript is empty) and no temporary file is left;
    also where the render worker processes write the files (RENDER_POOL_MIN_FILES inputs or more). Once there is
    room, a rerun with --skip-existing writes the rest, and only the rest."""
    inputs = _copies(tmp_path / "in", "short_2s.wav", copies)
    text = reference_clip("short_2s.wav")["text"]
    assert text
    args = (tmp_path / "in", "-f", "txt,json,srt", "--batch", str(batch))
    with _tmpfs(tmp_path / "disk", "64k") as disk:  # issue 46's
        result = transcribe(*args, "-o", disk)
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        [error] = _error_lines(result.stderr)
        assert [line for line in result.stderr.splitlines() if line.strip()] == [error]
        done = _complete_outputs(disk, inputs, text, SUFFIXES)
        assert 0 < done < len(inputs)
        assert error.endswith(
            f": cannot write output (No space left on device); stopped with {done} of {len(inputs)} files done: "
            "make room, then rerun with --skip-existing"
        ), error
        assert _leftovers(disk) == []
        before = {p: p.stat().st_mtime_ns for p in disk.iterdir()}
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        again = transcribe(*args, "-o", disk, "--skip-existing")
        assert again.returncode == 0, again.stderr
        assert _complete_outputs(disk, inputs, text, SUFFIXES) == len(inputs)
        kept = [p for p, mtime in before.items() if p.suffix == ".srt" and p.stat().st_mtime_ns == mtime]
        assert len(kept) == done  # the inputs done the first time were skipped, not written again
        assert f"({done} skipped)" in again.stderr


# ============================================================================ names and --skip-existing


def test_same_stem_inputs_carry_their_extension_and_keep_their_names(tmp_path):
    """a.wav and a.flac in one folder: a.wav.txt and a.flac.txt; b.wav alone: b.txt. Adding a-2.wav, or an a.mp3
    in another folder, or leaving inputs out, moves no name; only a new a.* beside an input renames it."""
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("a.wav", "a.flac", "b.wav", "notes.txt", "b.txt"):
        (folder / name).write_bytes(b"")

    def names(*inputs: str, roots=(folder,)) -> list[str]:
        files = [folder / n for n in inputs]
        return [
            str(p.relative_to(tmp_path / "out")) for p in output_paths(tmp_path / "out", files, list(roots), ".txt")
        ]

    assert names("a.wav", "a.flac", "b.wav") == ["a.wav.txt", "a.flac.txt", "b.txt"]
    (folder / "a-2.wav").write_bytes(b"")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.mp3").write_bytes(b"")
    assert names("a-2.wav", "a.wav", "a.flac", "b.wav") == ["a-2.txt", "a.wav.txt", "a.flac.txt", "b.txt"]
    assert names("a.flac", roots=()) == ["a.flac.txt"]  # given alone, as a file: the same name
    (folder / "b.mp3").write_bytes(b"")
    assert names("b.wav") == ["b.wav.txt"]


def test_skip_existing_rerun_reads_nothing_and_changes_nothing(tmp_path):
    _copies(tmp_path / "in", "short_2s.wav", 3)
    out = tmp_path / "out"
    first = transcribe(tmp_path / "in", "-o", out, "-f", "txt,json")
    assert first.returncode == 0, first.stderr
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*")}
    assert len(before) == 6
    # the inputs made unreadable: a read would fail; and no model: a load would fail
    for path in (tmp_path / "in").iterdir():
        path.write_text("not audio\n")
    again = transcribe(tmp_path / "in", "-o", out, "-f", "txt,json", "--skip-existing", model=str(tmp_path / "no.nemo"))
    assert again.returncode == 0, again.stderr
    assert "transcribed 0 of 3 files (3 skipped)" in again.stderr
    assert _error_lines(again.stderr) == []
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*")} == before


def test_skip_existing_without_output_dir_is_bad_usage():
    result = transcribe(CLIPS / "short_2s.wav", "--skip-existing")
    assert result.returncode == 2
    [error] = _error_lines(result.stderr)
    assert "--output-dir" in error


# ============================================================================ signals


def _start(*args, importtime: bool = False) -> subprocess.Popen:
    """The command on the fixture model; importtime: Python's -X importtime lines on its stderr (`_importing_torch`)."""
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    python = [sys.executable, "-X", "importtime"] if importtime else [sys.executable]
    command = [*python, "-m", "graphscribe.cli", *map(str, args), "--model", str(NEMO_PATH)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


TORCH_MODULE = re.compile(rb"^import time: .*\| +torch\.")  # a module of torch's imported: torch is loading


def _importing_torch(process: subprocess.Popen) -> bytes:
    """Read the stderr of a process started with importtime until torch is being imported: its first module's line
    comes within the first tenth of torch's import (seconds on a busy CPU, over a second on an idle one). -> What
    was read (everything, if the process ended first: the caller's checks then fail)."""
    read = b""
    for line in process.stderr:
        read += line
        if TORCH_MODULE.match(line):
            break
    return read


def _without_importtime(stderr: bytes) -> bytes:
    return b"".join(line for line in stderr.splitlines(keepends=True) if not line.startswith(b"import time:"))


def _wait_for(condition, seconds: float = 120) -> None:
    """Poll `condition` until it holds; fail after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {seconds} s for {condition.__doc__ or condition}")
        time.sleep(0.01)


def _outputs_there(folder: Path, n: int):
    def there() -> bool:
        """output files"""
        return folder.exists() and sum(1 for _ in folder.glob("*.json")) >= n

    return there


def _check_stopped(process: subprocess.Popen, signum: int, stdout: bytes, stderr: bytes, total: int) -> int:
    """A run sent `signum`: finished (0) or stopped (128 + signum) with one line; -> files it says it did."""
    err = stderr.decode()
    assert "Traceback" not in err, err
    assert process.returncode in (0, 128 + signum), (process.returncode, err)
    assert stdout == b"" or stdout.endswith(b"\n")  # complete lines only
    if process.returncode == 0:
        return total
    [line] = [m for m in err.splitlines() if m.startswith("interrupted")]
    if line == "interrupted":  # before the inputs were counted (torch loads while folders are searched)
        return 0
    match = INTERRUPTED.match(line)
    assert match and int(match[2]) == total, line
    return int(match[1])


MOMENTS = ("torch-loading", "first-output", "half-written")  # when the signal comes, each seen happen


# SIGTERM at every moment; SIGINT (the same handler, as Ctrl-C sends it) where the most is in flight
@pytest.mark.parametrize(
    "signum, moment", [*((signal.SIGTERM, m) for m in MOMENTS), (signal.SIGINT, "half-written")], ids=str
)
def test_a_signal_at_each_stage_leaves_whole_files(tmp_path, signum, moment):
    """A folder run stopped while torch loads, once its first output is written, or with half of them written: every
    output present is complete, none is a temporary file, and the files done are the inputs with all their outputs.
    Each moment is an event the test sees (torch's first module imported, output files there), not a guessed
    delay: a run that had already finished would test nothing (it may, at the last moment: 0 and all done)."""
    inputs = _copies(tmp_path / "in", "short_2s.wav", 24)
    text = reference_clip("short_2s.wav")["text"]
    out = tmp_path / "out"
    process = _start(tmp_path / "in", "-o", out, "-f", "txt,json", "--batch", "1", importtime=moment == MOMENTS[0])
    read = b""
    if moment == "torch-loading":
        read = _importing_torch(process)
    else:
        _wait_for(_outputs_there(out, 1 if moment == "first-output" else len(inputs) // 2))
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    stderr = _without_importtime(read + stderr)
    done = _check_stopped(process, signum, stdout, stderr, len(inputs))
    if moment == "torch-loading":
        assert process.returncode == 128 + signum and done == 0, stderr.decode()
    assert _complete_outputs(out, inputs, text) == done, stderr.decode()
    assert _leftovers(out) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_render_workers_write_leaves_whole_files_and_counts_them(tmp_path, signum):
    """RENDER_POOL_MIN_FILES inputs: the render worker processes write the files. A signal once the first files are
    there: every output present is complete, none is a temporary file, and the files said to be done are the
    inputs with all their outputs (the batch the workers were writing included)."""
    inputs = _copies(tmp_path / "in", "short_2s.wav", RENDER_POOL_MIN_FILES)
    text = reference_clip("short_2s.wav")["text"]
    out = tmp_path / "out"
    process = _start(tmp_path / "in", "-o", out, "-f", "txt,json", "--batch", "8")
    _wait_for(_outputs_there(out, 1))
    workers = workers_of(process.pid)  # the render workers: they write the files
    assert workers
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    done = _check_stopped(process, signum, stdout, stderr, len(inputs))
    assert process.returncode == 128 + signum, stderr.decode()  # 32 batches on the CPU take longer than a signal

    def ended() -> bool:
        """the render workers' end (what one still wrote would show below)"""
        return all(_ended(pid) for pid in workers)

    _wait_for(ended, 30)
    complete = _complete_outputs(out, inputs, text)
    assert 0 < complete == done, stderr.decode()
    assert _leftovers(out) == []


def _ended(pid: int) -> bool:
    """Whether process `pid` has exited (gone, or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_sigint_while_torch_loads_is_one_line():
    """Sent once torch's first module is imported (seen on stderr with -X importtime), not after a guessed delay, which
    came after the whole run on an idle machine (issue 46)."""
    process = _start(CLIPS / "short_2s.wav", importtime=True)
    read = _importing_torch(process)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    stderr = _without_importtime(read + stderr)
    _check_stopped(process, signal.SIGINT, stdout, stderr, 1)
    assert process.returncode == 130 and stdout == b""
    assert stderr.decode().splitlines() == ["interrupted: 0 of 1 files done"]


def test_ctrl_c_after_the_first_results_keeps_every_finished_line(tmp_path):
    """One file a batch, each line printed as its batch is done: Ctrl-C once the first one is out; every line
    printed is whole, and their number is the one the interrupted line gives."""
    inputs = _copies(tmp_path / "in", "short_2s.wav", 40)
    text = reference_clip("short_2s.wav")["text"]
    process = _start(tmp_path / "in", "--batch", "1")
    first = process.stdout.readline()
    process.send_signal(signal.SIGINT)
    rest, stderr = process.communicate(timeout=120)
    lines = (first + rest).decode().splitlines(keepends=True)
    done = _check_stopped(process, signal.SIGINT, first + rest, stderr, len(inputs))
    assert process.returncode == 130, stderr.decode()  # 40 batches on the CPU take longer than a signal
    assert len(lines) == done >= 1
    printed = {str(p): text for p in inputs}
    for line in lines:
        path, said = line.rstrip("\n").split(": ", 1)
        assert printed.pop(path) == said


def test_one_file_on_a_terminal_shows_its_stage(tmp_path):
    """stderr on a terminal (a pty): a status line naming the file, its length and the stage it is in."""
    import pty

    main, side = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"} | {"TERM": "xterm", "COLUMNS": "200"}
    command = [sys.executable, "-m", "graphscribe.cli", str(CLIPS / "short_2s.wav"), "--model", str(NEMO_PATH)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=side, env=env)
    os.close(side)
    shown = b""
    with contextlib.suppress(OSError):  # EIO once the process has closed the terminal
        while chunk := os.read(main, 4096):
            shown += chunk
    os.close(main)
    stdout, _ = process.communicate(timeout=120)
    assert process.returncode == 0 and stdout.decode() == reference_clip("short_2s.wav")["text"] + "\n"
    text = shown.decode(errors="replace")
    assert "transcribing short_2s.wav (2 s of audio): encoder…" in text, text
    assert "transcribing short_2s.wav (2 s of audio): decoding…" in text, text


def test_standard_inputs_output_is_named_stdin(tmp_path):
    assert output_paths(tmp_path, [Path("-")], [Path("-")], ".srt") == [tmp_path / "stdin.srt"]


def test_a_signal_where_python_would_drop_the_exception_comes_again(monkeypatch):
    """A signal handled inside importlib's module-lock callback (a weakref callback: Python prints and drops what
    it raises) is sent again a moment later instead of being lost; elsewhere it stops the run at once."""
    import types

    from graphscribe import signals as signals_module

    sent = []
    monkeypatch.setattr(signals_module.os, "kill", lambda pid, signum: sent.append(signum))
    signals = signals_module._Signals()
    in_callback = types.SimpleNamespace(f_code=compile("pass", "<frozen importlib._bootstrap>", "exec"))
    signals._handle(signal.SIGINT, in_callback)  # no exception here

    def redelivered() -> bool:
        """the signal sent again (a timer's thread sends it)"""
        return bool(sent)

    _wait_for(redelivered, 30)
    assert sent == [signal.SIGINT] and not signals.stopping
    with pytest.raises(signals_module.Interrupted):
        signals._handle(signal.SIGINT, types.SimpleNamespace(f_code=compile("pass", "main.py", "exec")))
