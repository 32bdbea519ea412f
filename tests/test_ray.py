"""Ray Data: the pipeline and `transcribe ray` on a local two-CPU cluster (started once for the module) give the
CLI's text per file; a bad file is an error row; a rerun skips what is done."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import ray
from conftest import CLIPS, NEMO_PATH

from graphscribe.cli import main
from graphscribe.io.options import RunOptions
from graphscribe.ray_data import build_pipeline


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, object_store_memory=200 * 2**20, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Four clips and a non-audio .wav."""
    root = tmp_path_factory.mktemp("ray-in")
    for name in ("short_2s.wav", "espeak_fox.wav", "librispeech_2086-149220-0033.wav", "quarter_second.wav"):
        shutil.copy(CLIPS / name, root / name)
    (root / "letter.wav").write_text("Dear reader,\n" * 10)
    return root


@pytest.fixture(scope="module")
def cli_texts(inputs) -> dict[str, str]:
    """path -> text from one `transcribe` process on the same files."""
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    result = subprocess.run(
        [sys.executable, "-m", "graphscribe.cli", str(inputs), "--model", str(NEMO_PATH), "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 1  # the letter
    return dict(line.split(": ", 1) for line in result.stdout.splitlines())


def test_pipeline_rows_match_the_cli(inputs, cli_texts):
    paths = sorted(str(p) for p in inputs.iterdir())
    options = RunOptions(device="cpu", batch_size=2)
    rows = build_pipeline(paths, str(NEMO_PATH), 16000, options, actors=1, gpus_per_actor=0).take_all()
    by_path = {r["path"]: r for r in rows}
    assert sorted(by_path) == paths
    bad = by_path.pop(str(inputs / "letter.wav"))
    assert "not a readable audio file" in bad["error"] and bad["text"] == ""
    assert {p: r["text"] for p, r in by_path.items()} == cli_texts
    for row in by_path.values():
        assert row["error"] is None and row["audio_seconds"] > 0
        assert len(row["token_ids"]) > 0 or row["text"] == ""
        assert all(w["end"] >= w["start"] for w in row["words"])


def test_command_writes_parquet_and_a_rerun_skips_what_is_done(inputs, cli_texts, tmp_path, capsys):
    listing = tmp_path / "paths.txt"
    listing.write_text("".join(f"{p}\n" for p in sorted(inputs.iterdir())))
    out = tmp_path / "out"
    args = ["ray", str(listing), str(out), "--model", str(NEMO_PATH), "--device", "cpu", "--batch", "2"]
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code in (0, None)
    table = pq.read_table(out)
    assert set(table.column_names) >= {"path", "text", "token_ids", "words", "segments", "audio_seconds", "error"}
    rows = table.to_pylist()
    assert {r["path"]: r["text"] for r in rows if r["error"] is None} == cli_texts
    assert [r["path"] for r in rows if r["error"] is not None] == [str(inputs / "letter.wav")]
    parts = sorted(out.iterdir())
    capsys.readouterr()

    with pytest.raises(SystemExit):
        main(args)  # only the failed input is tried again
    assert "skipped 4 inputs" in capsys.readouterr().err
    new = [p for p in sorted(out.iterdir()) if p not in parts]
    assert [r["path"] for part in new for r in pq.read_table(part).to_pylist()] == [str(inputs / "letter.wav")]


def test_without_ray_one_line_and_exit_2(tmp_path):
    """A Python where `import ray` fails: the command says how to install it."""
    blocker = tmp_path / "ray.py"
    blocker.write_text("raise ImportError('no ray here')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-m", "graphscribe.cli", "ray", str(tmp_path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: transcribe ray needs Ray: pip install 'graphscribe[ray]'"]
