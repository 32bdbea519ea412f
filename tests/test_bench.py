"""`transcribe bench` on the CPU: the eager rows, a note that graphs need CUDA, NeMo's tokens in the JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import CLIPS, NEMO_PATH, reference_clip


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU rows")
def test_bench_on_cpu(tmp_path):
    clips = ["short_2s.wav", "espeak_fox.wav"]
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    result = subprocess.run(
        [sys.executable, "-m", "graphscribe.cli", "bench", *(str(CLIPS / c) for c in clips), "--model", str(NEMO_PATH),
         "--reps", "1", "--batch-sizes", "1,3", "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "graphs need a CUDA device" in result.stderr
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


def test_bad_batch_sizes_are_bad_usage():
    result = subprocess.run([sys.executable, "-m", "graphscribe.cli", "bench", "--model", str(NEMO_PATH),
                             "--batch-sizes", "1,x"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--batch-sizes" in result.stderr
