"""`transcribe bench` on the CPU: the eager rows, a note that graphs need CUDA, NeMo's tokens in the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import soundfile as sf
import torch
from conftest import CLIPS, NEMO_PATH, reference_clip

from graphscribe.bench.folder import make_folder


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU rows")
def test_bench_on_cpu(tmp_path):
    clips = ["short_2s.wav", "espeak_fox.wav"]
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphscribe.cli",
            "bench",
            *(str(CLIPS / c) for c in clips),
            "--model",
            str(NEMO_PATH),
            "--reps",
            "1",
            "--batch-sizes",
            "1,3",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "graphs need a CUDA device" in result.stderr
    running = [line for line in result.stderr.splitlines() if line.startswith("running: ")]
    assert running == [
        f"running: {clip}: {what}, batch {n}, eager, 1 reps"
        for clip in clips
        for what, n in (("decode", 1), ("decode", 3), ("end to end", 1))
    ]  # one line per row, as it starts
    report = json.loads(out.read_text())
    assert report["device"] and report["dtype"] == "float32" and report["reps"] == 1
    for tier, clip in zip(report["tiers"], clips):
        ref = reference_clip(clip)
        assert tier["tier"] == clip and tier["frames"] == ref["encoder_frames"]
        assert tier["token_ids"] == ref["token_ids"]  # NeMo's tokens
        assert tier["identical"] is True
        kinds = {(row["what"], row["batch"], row["graphs"]) for row in tier["rows"]}
        assert kinds == {("decode", 1, False), ("decode", 3, False), ("end-to-end", 1, False)}
        for row in tier["rows"]:
            assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
        assert tier["emission"]["tokens"] == len(ref["token_ids"])
    assert "decode" in result.stdout and "steps" in result.stdout  # the table


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU's defaults")
def test_bench_on_cpu_says_what_it_runs_and_sizes_its_defaults_for_the_cpu(tmp_path):
    """The GPU's defaults (three clips up to 77 s, batches 1 and 8, 5 reps) ran 13 minutes on 2 cores without a word
    (issue 46): on the CPU the decode rows default to the 7.4 s clip at batch 1, and one line first says what runs."""
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    command = [sys.executable, "-m", "graphscribe.cli", "bench", "--device", "cpu", "--model", str(NEMO_PATH)]
    result = subprocess.run([*command, "--reps", "1", "--json", out], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    [plan] = [line for line in result.stderr.splitlines() if "timed run" in line]
    assert plan.startswith("note: 1 clip(s) (7.4 s) x batch 1, decode and end to end, 1 timed run a row")
    assert "the CPU's defaults" in plan and "--batch-sizes" in plan and "--reps" in plan
    report = json.loads(out.read_text())
    assert [tier["tier"] for tier in report["tiers"]] == ["7.4 s"]
    assert {row["batch"] for row in report["tiers"][0]["rows"]} == {1}


def _bench_in_process(capsys, *args) -> tuple[int, str]:
    """`transcribe bench ARGS` through cli.main in this process, for usage errors (they end before a model loads):
    its exit code and stderr."""
    from graphscribe.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["bench", *map(str, args)])
    return done.value.code, capsys.readouterr().err


def test_bad_batch_sizes_are_bad_usage(capsys):
    code, stderr = _bench_in_process(capsys, "--model", NEMO_PATH, "--batch-sizes", "1,x")
    assert code == 2
    assert "--batch-sizes" in stderr


def _bench(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    return subprocess.run(
        [sys.executable, "-m", "graphscribe.cli", "bench", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def _timed_bench(*args) -> tuple[subprocess.CompletedProcess, float]:
    """The bench process and its wall-clock seconds, which every timed pass inside it is shorter than."""
    start = time.perf_counter()
    result = _bench(*args)
    return result, time.perf_counter() - start


def _assert_rtfx(row: dict, audio_seconds: float, wall_seconds: float) -> None:
    """RTFx is the input's audio seconds over a pass's seconds, and a pass fits in the process's wall time."""
    assert 0 < row["seconds"] < wall_seconds and 0 < row["in_memory_seconds"] < wall_seconds
    assert row["rtfx"] == pytest.approx(audio_seconds / row["seconds"])
    assert row["in_memory_rtfx"] == pytest.approx(audio_seconds / row["in_memory_seconds"])
    assert row["rtfx_min"] <= row["rtfx"] <= row["rtfx_max"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU rows")
def test_throughput_on_generated_speech_with_the_demo_model(tmp_path):
    out = tmp_path / "throughput.json"
    # the bench's folder is make_folder's default draw (seed 0): the same files, measured here by their headers.
    # Two files (15 s; three: 22 s), a padded batch in each row: each row is three passes over them (warm-up, timed,
    # from memory), most of the test's time
    audio_seconds = sum(sf.info(str(p)).duration for p in make_folder(tmp_path / "same", files=2))
    result, wall = _timed_bench(
        "--throughput", "--files", 2, "--batch-sizes", "2,4", "--reps", 1, "--model", "demo", "--json", out
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["files"] == 2 and report["dtype"] == "float32" and report["reps"] == 1
    assert report["audio_seconds"] == pytest.approx(audio_seconds)
    rows = report["throughput"]
    assert [(r["batch"], r["graphs"]) for r in rows] == [(2, False), (4, False)]
    for row in rows:
        _assert_rtfx(row, audio_seconds, wall)
        assert set(row["stages"]) == {"read", "wait", "features", "encoder", "decode", "text", "write"}
        for stage in ("read", "features", "encoder", "decode", "write"):
            assert row["stages"][stage] > 0, stage
        assert sum(row["stages"].values()) < 2 * row["seconds"]  # stages are parts of the pass (reads overlap)
        assert row["peak_rss_mb"] > 0 and row["peak_gpu_mb"] is None
        assert row["failed"] == 0 and row["identical"] is True
    assert "RTFx" in result.stdout and "from memory" in result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU rows")
def test_throughput_on_a_folder_counts_a_bad_file(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("short_2s.wav", "espeak_fox.wav", "quarter_second.wav"):
        (folder / name).write_bytes((CLIPS / name).read_bytes())
    (folder / "broken.flac").write_bytes(b"\0" * 1000)
    out = tmp_path / "folder.json"
    result, wall = _timed_bench(
        "--folder", folder, "--batch-sizes", "2", "--reps", 1, "--model", NEMO_PATH, "--json", out
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["files"] == 4 and report["folder"] == str(folder)
    # NeMo's sample counts of the three good files at 16 kHz; the broken one adds nothing
    audio_seconds = sum(reference_clip(n)["samples"] for n in ("short_2s.wav", "espeak_fox.wav", "quarter_second.wav"))
    audio_seconds /= 16000
    assert report["audio_seconds"] == pytest.approx(audio_seconds)
    [row] = report["throughput"]
    assert row["failed"] == 1 and row["identical"] is True
    _assert_rtfx(row, audio_seconds, wall)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU rows")
def test_throughput_with_a_beam(tmp_path):
    """`bench --folder --beam 4`: the rows decode with the beam search (the options' beam_size), said so in the
    JSON and the table's title."""
    folder = tmp_path / "in"
    folder.mkdir()
    for name in ("short_2s.wav", "espeak_fox.wav"):
        (folder / name).write_bytes((CLIPS / name).read_bytes())
    out = tmp_path / "beam.json"
    result, wall = _timed_bench(
        "--folder", folder, "--beam", 4, "--batch-sizes", "2", "--reps", 1, "--model", NEMO_PATH, "--json", out
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["beam"] == 4 and "beam 4" in result.stdout
    [row] = report["throughput"]
    assert row["failed"] == 0 and row["identical"] is True and row["rtfx"] > 0


def test_throughput_with_phrases_boosted(tmp_path):
    """`bench --folder --hotwords-file F --boost W`: the rows decode with the phrases boosted (the options'), said so
    in the JSON; a file that cannot be read is one line and exit 2."""
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("the quick brown fox\njumps over:2.0\n", encoding="utf-8")
    out = tmp_path / "boost.json"
    flags = ["--folder", CLIPS, "--batch-sizes", "4", "--reps", 1, "--model", NEMO_PATH, "--json", out]
    result, _ = _timed_bench(*flags, "--hotwords-file", phrases, "--boost", 2.5)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert (report["hotwords"], report["boost"], report["lm"], report["confidence"]) == (2, 2.5, None, False)
    [row] = report["throughput"]
    assert row["failed"] == 0 and row["identical"] is True
    result, _ = _timed_bench(*flags, "--hotwords-file", tmp_path / "missing.txt")
    assert result.returncode == 2 and "missing.txt: cannot read the hotwords" in result.stderr


def test_bench_folder_usage_errors(tmp_path, capsys):
    code, stderr = _bench_in_process(capsys, CLIPS / "short_2s.wav", "--folder", CLIPS, "--model", NEMO_PATH)
    assert code == 2 and "not both" in stderr
    code, stderr = _bench_in_process(capsys, CLIPS / "short_2s.wav", "--beam", 4, "--model", NEMO_PATH)
    assert code == 2 and "bench --beam, --lm, --hotwords: with --folder or --throughput" in stderr
    code, stderr = _bench_in_process(capsys, CLIPS / "short_2s.wav", "--hotwords", "fox", "--model", NEMO_PATH)
    assert code == 2 and "bench --beam, --lm, --hotwords: with --folder or --throughput" in stderr
    code, stderr = _bench_in_process(capsys, "--folder", tmp_path, "--model", NEMO_PATH)
    assert code == 2 and "no audio files" in stderr


@pytest.mark.gpu
def test_throughput_on_cuda_has_both_modes_and_gpu_stages(tmp_path):
    out = tmp_path / "throughput.json"
    result = _bench(
        "--throughput", "--files", 8, "--batch-sizes", "4", "--reps", 1, "--model", NEMO_PATH, "--json", out
    )
    assert result.returncode == 0, result.stderr
    rows = json.loads(out.read_text())["throughput"]
    assert [(r["batch"], r["graphs"]) for r in rows] == [(4, False), (4, True)]
    for row in rows:
        assert row["identical"] is True and row["failed"] == 0
        assert row["peak_gpu_mb"] > 0 and 0 < row["gpu_busy_seconds"] <= row["seconds"]
        for stage in ("read", "features", "encoder", "decode", "write"):
            assert row["stages"][stage] > 0, stage
