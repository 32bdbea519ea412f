"""`transcribe --devices`: worker processes (two CPU workers here) give what one process gives, and survive a killed
worker. Expected outputs come from a one-process run of the same files; crashes are real SIGKILLs."""

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
import torch
from conftest import CLIPS, NEMO_PATH, reference_clip

from graphscribe.runtime import device_names
from graphscribe.runtime.device_names import parse_devices


def start(*args) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    command = [sys.executable, "-m", "graphscribe.cli", *map(str, args), "--model", str(NEMO_PATH)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def transcribe(*args) -> subprocess.CompletedProcess:
    return finish(start(*args))


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def side_by_side(one: list, two: list) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """Two commands run at once (one process, and the same with --devices cpu,cpu): most of each run is starting
    Python and torch and loading the model, which the two overlap."""
    started = start(*one), start(*two)
    return finish(started[0]), finish(started[1])


def children_of(pid: int) -> list[tuple[int, bytes]]:
    """(pid, command line) of each child of process `pid`."""
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):  # gone meanwhile
                children.append((int(child), Path(f"/proc/{child}/cmdline").read_bytes()))
    return children


def workers_of(pid: int) -> list[int]:
    """The CLI's worker processes: the children of its fork server (Linux), else its children started by
    multiprocessing's spawn (not its resource tracker)."""
    children = children_of(pid)
    servers = [child for child, line in children if b"forkserver" in line]
    if servers:
        return [worker for server in servers for worker, _ in children_of(server)]
    return [child for child, line in children if b"spawn_main" in line]


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user and system), from /proc; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def outputs(folder: Path) -> dict[str, bytes]:
    """Every output file's bytes; JSON's "seconds" (wall time spent on the file) left out, as it differs run to run."""
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".json":
            record = json.loads(data)
            record.pop("seconds", None)
            data = json.dumps(record).encode()
        found[str(path.relative_to(folder))] = data
    return found


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """The six clips, in two folders, with a non-audio .wav and an empty file."""
    root = tmp_path_factory.mktemp("mixed")
    for k, clip in enumerate(sorted(CLIPS.iterdir())):
        (root / f"part{k % 2}").mkdir(exist_ok=True)
        shutil.copy(clip, root / f"part{k % 2}" / clip.name)
    (root / "part0" / "letter.wav").write_text("Dear reader,\n" * 10)
    (root / "part1" / "empty.wav").write_bytes(b"")
    return root


def test_two_cpu_workers_print_what_one_process_prints(mixed):
    one, two = side_by_side([mixed, "--batch", "2"], [mixed, "--batch", "2", "--devices", "cpu,cpu"])
    assert one.returncode == two.returncode == 1  # the two bad files
    assert len(one.stdout.splitlines()) == 6
    assert two.stdout == one.stdout
    errors = [line for line in two.stderr.splitlines() if line.startswith("error:")]
    assert errors == [line for line in one.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and "letter.wav" in errors[0] + errors[1]
    # under the summary, a line per device whose shares add up to the six clips and their audio
    shares = [
        re.match(
            r"  cpu: (\d+) files, ([\d.]+) s of audio, busy ([\d.]+) s, ready at ([\d.]+) s(?:, done at ([\d.]+) s)?$",
            line,
        )
        for line in two.stderr.splitlines()
        if line.startswith("  cpu: ")
    ]
    assert len(shares) == 2 and all(shares), two.stderr
    audio = float(re.search(r"([\d.]+) s of audio in", two.stderr).group(1))
    assert sum(int(m.group(1)) for m in shares) == 6
    assert abs(sum(float(m.group(2)) for m in shares) - audio) < 0.2
    # a worker ready after the other took every batch has none, and no "done at"
    assert all(float(m.group(4)) < float(m.group(5)) for m in shares if m.group(5)), two.stderr
    assert "  cpu: " not in one.stderr


def test_two_cpu_workers_write_what_one_process_writes(mixed, tmp_path):
    args = [mixed, "--batch", "3", "-f", "txt,json", "-o"]
    one, two = side_by_side([*args, tmp_path / "one"], [*args, tmp_path / "two", "--devices", "cpu,cpu"])
    assert one.returncode == two.returncode == 1
    written = outputs(tmp_path / "one")
    assert len(written) == 12  # six clips, two formats
    assert outputs(tmp_path / "two") == written


def test_killed_workers_lose_only_what_no_worker_is_left_for(tmp_path):
    """Two SIGKILLs: the first worker's batches are redone by the second; the second's death leaves the rest lost,
    each file named on one line; everything transcribed before is written."""
    clip = CLIPS / "short_2s.wav"
    folder = tmp_path / "copies"
    folder.mkdir()
    for k in range(160):
        shutil.copy(clip, folder / f"copy_{k:03d}.wav")
    out = tmp_path / "out"
    process = start(folder, "--batch", "1", "-o", out, "--devices", "cpu,cpu")
    deadline = time.monotonic() + 240
    workers: list[int] = []
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = workers_of(process.pid)
        time.sleep(0.05)
    seen = ""  # stderr up to the parent's warning about the first death
    for kills, first_files in enumerate((1, 8)):  # kill after the first result, then a few more
        while (not out.exists() or len(list(out.iterdir())) < first_files) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(workers[kills], signal.SIGKILL)
        if kills == 0:  # the second death comes after the parent has seen the first, not after a guessed delay
            for line in process.stderr:
                seen += line
                if line.startswith("warning: the worker on cpu died"):
                    break
    _, stderr = process.communicate(timeout=240)
    stderr = seen + stderr
    text = reference_clip(clip.name)["text"] + "\n"
    done = {p.stem for p in out.iterdir()}
    assert all(p.read_text() == text for p in out.iterdir())
    lost = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert all(line.endswith(": lost: the worker on cpu died (signal 9)") for line in lost), lost
    lost_names = {Path(line.removeprefix("error: ").split(": lost:")[0]).stem for line in lost}
    assert done | lost_names == {f"copy_{k:03d}" for k in range(160)} and not done & lost_names
    assert len(done) >= 8 and lost  # the second kill came before the end
    assert process.returncode == 1
    assert "warning: the worker on cpu died (signal 9); " in stderr
    assert "no worker is left" in stderr


def test_one_killed_worker_loses_nothing(tmp_path):
    clip = CLIPS / "quarter_second.wav"
    folder = tmp_path / "copies"
    folder.mkdir()
    for k in range(FILES := 200):
        shutil.copy(clip, folder / f"copy_{k:03d}.wav")
    out = tmp_path / "out"
    process = start(folder, "--batch", "1", "-o", out, "--devices", "cpu,cpu")
    deadline = time.monotonic() + 240
    # the first result, not the folder: the folder is made (and checked) before the workers start
    while not (out.exists() and any(out.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.02)
    while len(workers := workers_of(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # /proc lists a process's children as its threads see them: look again
    # a quarter of the results in: the worker that has run the most is then loaded and holds batches (at the first
    # result, on a busy machine, the other could still be starting, with more CPU time and nothing to hand on)
    while len(list(out.iterdir())) < FILES // 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(max(workers, key=cpu_seconds), signal.SIGKILL)
    _, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, stderr
    assert sorted(p.stem for p in out.iterdir()) == [f"copy_{k:03d}" for k in range(FILES)]
    assert {p.read_text() for p in out.iterdir()} == {reference_clip(clip.name)["text"] + "\n"}
    assert "go to another worker" in stderr and "error:" not in stderr


@pytest.mark.parametrize(
    ("value", "count", "message"),
    [
        ("cuda:0,cuda:0", 2, "cuda:0 is listed twice"),
        ("cuda,cuda:0", 2, "cuda:0 is listed twice"),
        ("cuda:7", 2, "this machine has 2 CUDA device(s)"),
        ("cuda:0", 0, "CUDA is not available"),
        ("all", 0, "no CUDA device"),
        ("gpu0", 2, "gpu0: use all, or a comma list"),
        ("cpu,", 2, "an empty name"),
    ],
)
def test_bad_devices_say_why(monkeypatch, value, count, message):
    monkeypatch.setattr(device_names, "cuda_device_count", lambda: count)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_devices(value)


def test_devices_lists(monkeypatch):
    monkeypatch.setattr(device_names, "cuda_device_count", lambda: 2)
    assert parse_devices("all") == ["cuda:0", "cuda:1"]
    assert parse_devices(" cuda:1, cuda ") == ["cuda:1", "cuda:0"]
    assert parse_devices("cpu,cpu") == ["cpu", "cpu"]


def test_the_driver_counts_what_torch_counts():
    assert device_names.cuda_device_count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_the_parent_starts_the_workers_import_before_its_own(mixed):
    """Everything the CLI's process does up to starting the workers' import of torch is torch-free: that import
    (~2 s) then runs beside the parent's, not after it. On Linux the fork server, started first, imports torch for
    every worker, which are forked from it; elsewhere each worker is spawned before the parent imports torch."""
    script = f"""
import sys
import multiprocessing.forkserver as fs
import multiprocessing.process as mp
from graphscribe import cli

order = []
start = mp.BaseProcess.start
mp.BaseProcess.start = lambda self: (order.append("worker"), start(self))[1]
ensure = fs.ensure_running
fs.ensure_running = lambda: (order.append("forkserver"), ensure())[1]
sys.addaudithook(lambda event, args: order.append("torch") if event == "import" and args[0] == "torch" else None)
try:
    cli.main([{str(mixed)!r}, "--devices", "cpu,cpu", "--batch", "2", "-m", {str(NEMO_PATH)!r}])
except SystemExit:
    pass
print("order", *dict.fromkeys(order))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    order = next(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("order"))
    assert order == (["forkserver", "torch", "worker"] if sys.platform.startswith("linux") else ["worker", "torch"])


def test_bad_devices_exit_2_before_loading(capsys):
    """A usage error, before anything loads: through cli.main in this process (no Python and torch start)."""
    from graphscribe.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main([str(CLIPS / "short_2s.wav"), "--devices", "cpu,tpu", "--model", str(NEMO_PATH)])
    out = capsys.readouterr()
    assert done.value.code == 2 and out.out == ""
    assert out.err.strip().splitlines() == ["error: --devices cpu,tpu: tpu: use all, or a comma list of cpu, cuda:N"]


def test_a_model_no_worker_can_load_exits_2(tmp_path):
    env_model = tmp_path / "missing.nemo"
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphscribe.cli",
            str(CLIPS / "short_2s.wav"),
            "--devices",
            "cpu,cpu",
            "-m",
            str(env_model),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 2, process.stderr
    [line] = process.stderr.strip().splitlines()
    assert line.startswith("error: ") and "missing.nemo" in line


def test_bench_reports_each_device_count(mixed, tmp_path):
    report_path = tmp_path / "bench.json"
    process = subprocess.run(
        [sys.executable, "-m", "graphscribe.cli", "bench", "--folder", str(mixed), "--devices", "cpu,cpu"]
        + ["--batch-sizes", "2", "--reps", "1", "--json", str(report_path), "-m", str(NEMO_PATH)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    report = json.loads(report_path.read_text())
    assert [row["devices"] for row in report["scaling"]] == [1, 2]
    for row in report["scaling"]:
        assert row["identical"] and row["failed"] == 2 and row["rtfx"] > 0
        assert sum(d["files"] for d in row["per_device"]) == 6
        assert len(row["per_device"]) == row["devices"]


def test_results_come_in_one_process_order(mixed, model):
    """The iterator itself (the CLI prints and writes as it yields): the same (index, text, error) sequence as one
    process's `transcribe_iter`, which yields batch by batch, longest first."""
    from graphscribe.devices import transcribe_on_devices
    from graphscribe.io.options import RunOptions

    files = sorted(p for p in mixed.rglob("*.wav"))
    one = [(i, t.text, t.error) for i, t in model.transcribe_iter(files, batch_size=2, word_times=False)]
    run = transcribe_on_devices(files, ["cpu", "cpu"], str(NEMO_PATH), RunOptions(graphs=False, batch_size=2), False)
    assert [(i, t.text, t.error) for i, t in run] == one
    assert one != sorted(one)  # longest first: not input order
    assert sum(s.files for s in run.device_stats) == 6  # each file on one device
