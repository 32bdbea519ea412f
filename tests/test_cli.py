"""End to end: the `transcribe` command on the NeMo fixture, in this process (`in_process`: what it prints and its
exit code) or, where the process itself is the subject (signals, the environment, stdout's behaviour, what native
libraries print on the stderr file), as a real one (`transcribe`).

Expected text, ids and frames are NeMo's (reference.json).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import CLIP_NAMES, CLIPS, NEMO_PATH, SPEECH_CLIP, reference_clip

FRAME_SECONDS = 0.08  # 10 ms hop x 8 subsampling


def transcribe(*args, model: str | None = str(NEMO_PATH), env: dict | None = None, cwd=None):
    """Run `python -m graphscribe.cli ARGS [--model MODEL]` with GRAPHSCRIBE_MODEL unset unless in `env`."""
    full_env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    full_env.update(env or {})
    command = [sys.executable, "-m", "graphscribe.cli", *map(str, args)]
    if model is not None:
        command += ["--model", model]
    return subprocess.run(command, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=120)


def in_process(capsys, *args, model: str | None = str(NEMO_PATH)) -> subprocess.CompletedProcess:
    """`graphscribe.cli.main(ARGS [--model MODEL])` in this process: what `transcribe` would print and its exit
    code, without a Python and torch start each (~3 s of CPU on a 2-core machine)."""
    from graphscribe.cli import main

    argv = [*map(str, args)] + (["--model", model] if model is not None else [])
    capsys.readouterr()
    try:
        main(argv)
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out.out, out.err)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_one_file_prints_nemo_text(capsys):
    result = in_process(capsys, SPEECH_CLIP)
    assert result.returncode == 0, result.stderr
    assert result.stdout == reference_clip(SPEECH_CLIP.name)["text"] + "\n"
    assert _error_lines(result.stderr) == []


def test_several_files_print_path_and_text_longest_first(capsys):
    """Lines come as batches are done, and batches run longest first."""
    names = [CLIP_NAMES[2], CLIP_NAMES[0], CLIP_NAMES[4]]
    result = in_process(capsys, *[CLIPS / n for n in names], "--batch", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    longest_first = sorted(names, key=lambda n: -reference_clip(n)["samples"])
    assert lines == [f"{CLIPS / n}: {reference_clip(n)['text']}" for n in longest_first]


@pytest.fixture
def clip_tree(tmp_path) -> Path:
    """in/<clip>, in/sub/<clip>, in/sub/deeper/<clip>: all six clips spread over subfolders, plus a non-audio file."""
    root = tmp_path / "in"
    places = ["", "", "sub", "sub", "sub/deeper", "sub/deeper"]
    for name, place in zip(CLIP_NAMES, places):
        (root / place).mkdir(parents=True, exist_ok=True)
        shutil.copy(CLIPS / name, root / place / name)
    (root / "sub" / "README.txt").write_text("not audio, and not picked up\n")
    return root


def test_folder_batch_json(clip_tree, capsys):
    result = in_process(capsys, clip_tree, "--batch", "4", "--format", "json")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted(Path(r["path"]).name for r in records) == sorted(CLIP_NAMES)  # found in every subfolder
    for record in records:
        clip = reference_clip(Path(record["path"]).name)
        assert set(record) == {"path", "text", "audio_seconds", "tokens", "words", "segments"}
        assert record["text"] == clip["text"]
        assert record["audio_seconds"] == pytest.approx(clip["samples"] / 16000, abs=1e-4)
        assert [t["id"] for t in record["tokens"]] == clip["token_ids"]
        assert [t["frame"] for t in record["tokens"]] == clip["timestamps"]
        for token in record["tokens"]:
            assert set(token) == {"id", "piece", "frame", "start", "end"}
            assert isinstance(token["piece"], str) and token["piece"]
            assert token["start"] == pytest.approx(token["frame"] * FRAME_SECONDS, abs=1e-3)
            assert token["end"] >= token["start"]


def test_output_dir_keeps_structure_and_survives_a_bad_file(clip_tree, tmp_path, capsys):
    bad = clip_tree / "sub" / "broken.wav"
    bad.write_text("not audio\n")
    single = tmp_path / "single_file.wav"  # a file given by name lands at the top of the output folder
    shutil.copy(SPEECH_CLIP, single)
    out = tmp_path / "out"
    result = in_process(capsys, clip_tree, single, "--output-dir", out, "--batch", "4")
    assert result.returncode == 1
    assert result.stdout == ""
    [error] = _error_lines(result.stderr)
    assert "broken.wav" in error
    places = ["", "", "sub/", "sub/", "sub/deeper/", "sub/deeper/"]
    expected = {
        f"{place}{Path(name).stem}.txt": reference_clip(name)["text"] for name, place in zip(CLIP_NAMES, places)
    }
    expected["single_file.txt"] = reference_clip(SPEECH_CLIP.name)["text"]
    written = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert written == {name: text + "\n" for name, text in expected.items()}


def test_output_dir_json_one_file_per_input(tmp_path, capsys):
    out = tmp_path / "out"
    result = in_process(capsys, CLIPS / CLIP_NAMES[0], CLIPS / CLIP_NAMES[2], "--output-dir", out, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        Path(n).stem + ".json" for n in (CLIP_NAMES[0], CLIP_NAMES[2])
    )
    for path in out.iterdir():
        record = json.loads(path.read_text())
        assert record["text"] == reference_clip(path.stem + ".wav")["text"]


def test_bad_inputs_exit_1_and_the_good_ones_still_print(tmp_path, capsys):
    empty_folder = tmp_path / "empty"
    empty_folder.mkdir()
    (empty_folder / "notes.txt").write_text("no audio here\n")
    text_wav = tmp_path / "letter.wav"
    text_wav.write_text("Dear reader,\n" * 10)
    nan_wav = tmp_path / "nan.wav"
    x = np.zeros(16000, np.float32)
    x[5] = np.nan
    sf.write(nan_wav, x, 16000, subtype="FLOAT")
    noise_mp3 = tmp_path / "noise.mp3"
    noise_mp3.write_bytes(np.random.default_rng(0).bytes(4096))
    good = [CLIPS / CLIP_NAMES[0], CLIPS / CLIP_NAMES[1]]
    bad = {
        tmp_path / "missing.wav": "no such file",
        text_wav: "not a readable audio file",
        empty_folder: "no audio",
        nan_wav: "NaN",
        noise_mp3: "noise.mp3: not a readable audio file (unknown format or corrupt data)",
    }
    result = in_process(capsys, good[0], *bad, good[1], "--batch", "3")
    assert result.returncode == 1
    assert sorted(result.stdout.splitlines()) == sorted(f"{p}: {reference_clip(p.name)['text']}" for p in good)
    errors = _error_lines(result.stderr)
    assert len(errors) == len(bad)
    for path, reason in bad.items():
        [line] = [e for e in errors if str(path) in e]
        assert reason in line
    assert "2 of" in result.stderr  # the summary counts what was done


def test_json_on_stdout_gives_a_failed_file_its_record(tmp_path, capsys):
    """-f json printed nothing for a file that failed (issue 46): its record holds the error line."""
    letter = tmp_path / "letter.wav"
    letter.write_text("Dear reader,\n" * 10)
    result = in_process(capsys, letter, SPEECH_CLIP, "-f", "json")
    assert result.returncode == 1, result.stderr
    records = {r["path"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert records[str(SPEECH_CLIP)]["text"] == reference_clip(SPEECH_CLIP.name)["text"]
    [error] = _error_lines(result.stderr)
    assert records[str(letter)] == {"path": str(letter), "error": error.removeprefix("error: ")}


def test_a_file_name_with_a_newline_keeps_each_line_one_line(tmp_path, capsys):
    """`PATH: text` and error lines name such a file with the newline escaped (issue 46)."""
    good, bad = tmp_path / "two\nlines.wav", tmp_path / "bad\nnews.wav"
    shutil.copy(SPEECH_CLIP, good)
    bad.write_text("not audio\n")
    result = in_process(capsys, good, bad, tmp_path / "back\\slash.wav")
    assert result.returncode == 1, result.stderr
    assert result.stdout == f"{tmp_path}/two\\nlines.wav: {reference_clip(SPEECH_CLIP.name)['text']}\n"
    errors = _error_lines(result.stderr)
    assert len(errors) == 2 and len(result.stderr.splitlines()) == 3  # and the summary
    assert any(e.startswith(f"error: {tmp_path}/bad\\nnews.wav: not a readable audio file") for e in errors)
    assert f"error: {tmp_path}/back\\slash.wav: no such file" in errors  # no newline: as it is


def test_a_folder_notes_a_named_pipe_and_names_a_broken_link(tmp_path, capsys):
    """Both were left out without a word (issue 46). A pipe is never opened (it would block): skipped, with a note;
    a broken link is an error, as a missing file given by name is."""
    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(SPEECH_CLIP, folder / "speech.wav")
    os.mkfifo(folder / "stream.wav")
    (folder / "gone.wav").symlink_to("moved-away.wav")
    result = in_process(capsys, folder)
    assert result.returncode == 1, result.stderr
    assert result.stdout == f"{folder / 'speech.wav'}: {reference_clip(SPEECH_CLIP.name)['text']}\n"
    assert _error_lines(result.stderr) == [
        f"error: {folder / 'gone.wav'}: a broken symbolic link (to moved-away.wav, which does not exist)"
    ]
    assert f"note: {folder / 'stream.wav'}: a named pipe, not a file: skipped" in result.stderr.splitlines()
    assert "transcribed 1 of 2 files (1 failed)" in result.stderr


def test_clips_shorter_than_a_frame_print_nemo_text(tmp_path, capsys):
    """NeMo transcribes any clip with samples: no encoder frame below 10 ms (empty text), one below 80 ms."""
    short = json.loads((Path(__file__).parent / "fixtures" / "nemo-short" / "reference.json").read_text())
    pcm, rate = sf.read(SPEECH_CLIP, dtype="int16")
    clips = {}
    for clip in short["clips"]:
        path = tmp_path / f"cut_{clip['samples']:04d}.wav"
        sf.write(path, pcm[short["offset"] : short["offset"] + clip["samples"]], rate, subtype="PCM_16")
        clips[path] = clip
    assert any(not c["token_ids"] for c in clips.values()) and any(c["token_ids"] for c in clips.values())
    result = in_process(capsys, *clips, SPEECH_CLIP, "--format", "json")
    assert result.returncode == 0, result.stderr
    assert _error_lines(result.stderr) == []
    records = {r["path"]: r for r in map(json.loads, result.stdout.splitlines())}
    for path, clip in clips.items():
        record = records[str(path)]
        assert [t["id"] for t in record["tokens"]] == clip["token_ids"] and record["text"] == clip["text"]
        assert record["audio_seconds"] == pytest.approx(clip["samples"] / rate, abs=1e-4)


def test_odd_mp3s_keep_stderr_to_our_own_lines(tmp_path):
    """libmpg123 prints its own notes on stderr about odd mp3s; transcribe's stderr has only its lines."""
    if "MPEG_LAYER_III" not in sf.available_subtypes("MP3"):
        pytest.skip("this libsndfile cannot write mp3")
    glitch = tmp_path / "glitch.mp3"  # 50 bytes of junk mid-stream: mpg123 resyncs (and says so), the rest decodes
    sf.write(glitch, sf.read(SPEECH_CLIP, dtype="float32")[0], 16000, format="MP3")
    data = glitch.read_bytes()
    glitch.write_bytes(data[: len(data) // 2] + np.random.default_rng(0).bytes(50) + data[len(data) // 2 :])
    noise = tmp_path / "noise.mp3"
    noise.write_bytes(np.random.default_rng(1).bytes(4096))
    for path in (glitch, noise):  # the libraries do chatter about these files: the test can fail
        plain = subprocess.run(
            [sys.executable, "-c", f"import soundfile as sf\ntry: sf.read({str(path)!r})\nexcept Exception: pass"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert plain.stderr.strip(), path.name  # such as "Note: Illegal Audio-MPEG-Header 0x... at offset ..."
    result = transcribe(glitch, noise, SPEECH_CLIP, "--batch", "2")
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"error: {noise}: not a readable audio file (unknown format or corrupt data)", lines[-1]]
    assert "transcribed 2 of 3 files (1 failed)" in lines[-1]
    printed = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert set(printed) == {str(glitch), str(SPEECH_CLIP)}
    assert printed[str(SPEECH_CLIP)] == reference_clip(SPEECH_CLIP.name)["text"]


def test_error_names_file_with_brackets(tmp_path, capsys):
    bad = tmp_path / "notes[bold].wav"
    bad.write_text("not audio\n")
    result = in_process(capsys, bad, SPEECH_CLIP)
    assert result.returncode == 1
    [error] = _error_lines(result.stderr)
    assert "notes[bold].wav" in error


def test_an_empty_output_dir_is_bad_usage(tmp_path):
    """-o "" (an unset shell variable) wrote into the current folder (issue 46)."""
    result = transcribe(SPEECH_CLIP, "-o", "", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "--output-dir" in result.stderr and "an empty folder name" in result.stderr
    assert list(tmp_path.iterdir()) == [] and result.stdout == ""


def test_only_an_empty_folder_exits_1(tmp_path, capsys):
    result = in_process(capsys, tmp_path)
    assert result.returncode == 1
    [error] = _error_lines(result.stderr)
    assert str(tmp_path) in error and "no audio" in error


def test_no_model_uses_the_demo_and_says_so(capsys, monkeypatch):
    monkeypatch.delenv("GRAPHSCRIBE_MODEL", raising=False)
    result = in_process(capsys, SPEECH_CLIP, model=None)
    assert result.returncode == 0, result.stderr
    [note] = [line for line in result.stderr.splitlines() if "demo" in line]
    assert "--model" in note and "parakeet" in note
    assert result.stdout.strip()


def test_the_demo_chosen_by_name_has_no_note():
    """The note is for those who did not choose a model (issue 46)."""
    result = transcribe(SPEECH_CLIP, model="demo")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout.strip()


def test_bad_dtype_is_bad_usage(capsys):
    result = in_process(capsys, SPEECH_CLIP, "--dtype", "int7")
    assert result.returncode == 2
    [error] = _error_lines(result.stderr)
    assert "int7" in error


def test_missing_model_file_is_bad_usage(tmp_path, capsys):
    result = in_process(capsys, SPEECH_CLIP, model=str(tmp_path / "nope.nemo"))
    assert result.returncode == 2
    [error] = _error_lines(result.stderr)
    assert "nope.nemo" in error and "Traceback" not in result.stderr


def test_model_from_environment():
    result = transcribe(SPEECH_CLIP, model=None, env={"GRAPHSCRIBE_MODEL": str(NEMO_PATH)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == reference_clip(SPEECH_CLIP.name)["text"] + "\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_graphs_on_cpu_notes_once_and_transcribes(capsys):
    result = in_process(capsys, SPEECH_CLIP, "--graphs", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    assert result.stdout == reference_clip(SPEECH_CLIP.name)["text"] + "\n"
    notes = [line for line in result.stderr.splitlines() if "graph" in line.lower()]
    assert len(notes) == 1 and notes[0].startswith("note:")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_asked_for_without_cuda_is_one_line_exit_2(device, capsys, monkeypatch):
    """It ran on the CPU, hundreds of times slower, after a warning (issue 46); `auto` is the way to fall back. The
    device is checked before the model loads: no demo-model note either."""
    monkeypatch.delenv("GRAPHSCRIBE_MODEL", raising=False)
    result = in_process(capsys, SPEECH_CLIP, "--device", device, model=None)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"error: --device {device}: CUDA is not available on this machine (--device cpu or auto)"
    ]
    assert result.stdout == ""


@pytest.mark.gpu
def test_cuda_with_graphs_gives_nemo_text():
    result = transcribe(SPEECH_CLIP, "--device", "cuda", "--dtype", "float32", "--graphs")
    assert result.returncode == 0, result.stderr
    assert result.stdout == reference_clip(SPEECH_CLIP.name)["text"] + "\n"


def test_bench_help(capsys):
    result = in_process(capsys, "bench", "--help", model=None)
    assert result.returncode == 0, result.stderr
    assert "Usage: transcribe bench" in result.stdout


def test_installed_script_runs():
    script = shutil.which("transcribe", path=sysconfig.get_path("scripts")) or shutil.which("transcribe")
    if script is None:
        pytest.skip("the transcribe script is not installed")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--model" in result.stdout and "--output-dir" in result.stdout


def test_two_inputs_for_one_output_file_are_bad_usage_before_loading(tmp_path, capsys):
    """a/x.wav and b/x.wav, both folder inputs, would both write out/x.txt: one line naming both, exit 2, before the
    model loads (the missing model is never looked at)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    shutil.copy(CLIPS / "short_2s.wav", a / "x.wav")
    shutil.copy(CLIPS / "espeak_fox.wav", b / "x.wav")
    out = tmp_path / "out"
    result = in_process(capsys, a, b, "--output-dir", out, model=str(tmp_path / "missing.nemo"))
    assert result.returncode == 2
    [error] = _error_lines(result.stderr)
    assert str(a / "x.wav") in error and str(b / "x.wav") in error and str(out / "x.txt") in error
    assert list(out.iterdir()) == []


def test_the_same_input_twice_writes_its_outputs_once(tmp_path, capsys):
    a = tmp_path / "a"
    a.mkdir()
    shutil.copy(CLIPS / "short_2s.wav", a / "x.wav")
    out = tmp_path / "out"
    result = in_process(capsys, a, a / "x.wav", "--output-dir", out)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in out.iterdir()] == ["x.txt"]
    assert (out / "x.txt").read_text() == reference_clip("short_2s.wav")["text"] + "\n"


def test_priming_starts_nothing_without_cuda():
    from graphscribe.runtime.priming import prime

    assert prime("cpu", "float32") is None
    if not torch.cuda.is_available():
        assert prime("auto", "bfloat16") is None
        assert prime("cuda:0", "float32") is None


def _recorded(init, started: list):
    def wrapped(self, *args, **kwargs):
        started.append(True)
        init(self, *args, **kwargs)

    return wrapped


def test_a_checkpoint_that_fails_to_load_stops_the_early_readers(tmp_path, clip_tree, monkeypatch, capsys):
    """Reading starts once the config is read (before the weights): a checkpoint whose weights do not fit its config
    (one encoder layer more in the config) exits 2 with one line, and the readers started for the folder are
    stopped (in-process: no thread left behind)."""
    import tarfile

    from graphscribe.cli import main
    from graphscribe.runtime.reading import ReadAhead

    broken = tmp_path / "broken.nemo"
    with tarfile.open(NEMO_PATH) as source, tarfile.open(broken, "w") as target:
        for member in source.getmembers():
            data = source.extractfile(member).read() if member.isfile() else None
            if member.name.endswith("model_config.yaml"):
                data = data.replace(b"\n  n_layers: 2\n", b"\n  n_layers: 3\n")
                member.size = len(data)
            target.addfile(member, io.BytesIO(data) if data is not None else None)
    started = []
    with monkeypatch.context() as patch:
        patch.setattr("graphscribe.runtime.reading.ReadAhead.__init__", _recorded(ReadAhead.__init__, started))
        with pytest.raises(SystemExit) as exited:
            main([str(clip_tree), "--model", str(broken), "--device", "cpu"])
    assert exited.value.code == 2 and started == [True]
    [error] = _error_lines(capsys.readouterr().err)
    assert "missing" in error and "layers.2" in error
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("graphscribe-")], names


def test_version_is_the_installed_distributions(capsys):
    from importlib.metadata import version

    result = in_process(capsys, "--version", model=None)
    assert result.returncode == 0 and result.stdout == f"graphscribe {version('graphscribe')}\n"


def test_help_names_the_other_commands(capsys):
    result = in_process(capsys, "--help", model=None)
    assert result.returncode == 0
    for command in ("transcribe serve", "transcribe ray", "transcribe bench", "graphscribe[serve]"):
        assert command in result.stdout


def test_every_command_shows_the_batch_defaults_the_runtime_uses():
    """--batch (transcribe, ray) and --max-batch (serve) show one text, made from the constants that
    `default_batching` takes its numbers from."""
    import inspect

    from graphscribe.cli import transcribe_command
    from graphscribe.console import BATCH_DEFAULT
    from graphscribe.io.config import BATCH_FILES, default_batch_files
    from graphscribe.ray_data import ray_command
    from graphscribe.serve.command import serve_command

    shown = [
        inspect.signature(transcribe_command).parameters["batch"].default.show_default,
        inspect.signature(ray_command).parameters["batch"].default.show_default,
        inspect.signature(serve_command).parameters["max_batch"].default.show_default,
    ]
    assert shown == [BATCH_DEFAULT] * 3
    assert default_batch_files("cuda", sixteen_bit=False) == BATCH_FILES["cuda-float32"]
    assert default_batch_files("cuda", sixteen_bit=True) == BATCH_FILES["cuda-16bit"]
    assert default_batch_files("cpu", sixteen_bit=True) == BATCH_FILES["cpu"]
    for files in BATCH_FILES.values():
        assert f"{files} " in BATCH_DEFAULT
