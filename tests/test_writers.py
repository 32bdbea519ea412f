"""Output formats: subtitle cues by hand-made word times, then the real CLI's files read back with
PyPI's parsers (`srt`, `webvtt-py`), never with our own code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import soundfile as sf
import srt
import webvtt
from conftest import CLIPS, JFK_FLAC
from test_cli import transcribe
from test_timestamps import DEMO_PATH, STAMPS

from graphscribe.api import load_model
from graphscribe.output.timestamps import Word
from graphscribe.output.transcript import Transcript
from graphscribe.output.writers import (
    MAX_CUE_SECONDS,
    MAX_LINE_CHARS,
    WRITERS,
    cues,
    write_json,
    write_srt,
    write_tsv,
    write_txt,
    write_vtt,
)

FRAME = 0.08  # seconds


def _transcript(words: list[tuple[str, float, float]], audio_seconds: float = 60.0) -> Transcript:
    timed = [Word(w, s, e, round(s / FRAME), round(e / FRAME)) for w, s, e in words]
    return Transcript(source="x.wav", text=" ".join(w for w, _, _ in words), words=timed, audio_seconds=audio_seconds)


def _even(n: int, text: str = "word", step: float = 0.4) -> list[tuple[str, float, float]]:
    return [(f"{text}{i}", i * step, i * step + step / 2) for i in range(n)]


# ============================================================================ cues by hand


def test_short_sentence_is_one_cue_timed_by_its_words():
    [cue] = cues(_transcript([("hello", 0.24, 0.56), ("world.", 0.64, 1.04)]))
    assert (cue.start, cue.end, cue.lines) == (0.24, 1.04, ["hello world."])


def test_cue_ends_after_a_sentence_and_before_a_pause():
    words = [("yes.", 0.0, 0.3), ("it", 0.4, 0.5), ("is", 0.6, 0.7), ("later", 1.7, 2.0)]  # 1.0 s pause before "later"
    assert [c.lines for c in cues(_transcript(words))] == [["yes."], ["it is"], ["later"]]


def test_long_text_wraps_into_two_even_lines_then_a_new_cue():
    words = [
        (w, i * 0.3, i * 0.3 + 0.2)
        for i, w in enumerate(
            "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
        )
    ]
    result = cues(_transcript(words))
    # 80 characters: 39 + 40 is the only split into lines of at most 42; "fifteen" would make 88
    assert result[0].lines == ["one two three four five six seven eight", "nine ten eleven twelve thirteen fourteen"]
    assert result[1].lines == ["fifteen"]
    assert all(len(line) <= MAX_LINE_CHARS for c in result for line in c.lines)


def test_cue_lasts_at_most_seven_seconds():
    result = cues(_transcript([("a", i * 1.0, i * 1.0 + 0.5) for i in range(12)]))  # 0.5 s pauses, short words
    assert [len(c.lines[0].split()) for c in result] == [7, 5]  # "a" x 7 ends at 6.5 s; an 8th would end at 7.5
    assert all(c.end - c.start <= MAX_CUE_SECONDS for c in result)


def test_overlapping_words_never_overlap_cues_and_stay_in_the_audio():
    # RNN-T: a word ends one frame after its last token, which may be after the next word's start;
    # and a last word may end after the audio (its frames round up).
    words = [("one.", 0.0, 0.48), ("two.", 0.4, 0.8), ("three.", 0.8, 1.28)]
    result = cues(_transcript(words, audio_seconds=1.2))
    assert [(c.start, c.end) for c in result] == [(0.0, 0.4), (0.4, 0.8), (0.8, 1.2)]


def test_a_cue_of_no_duration_is_shown_half_a_second_if_there_is_room():
    result = cues(_transcript([("now.", 1.0, 1.0), ("then.", 1.2, 1.2), ("end.", 3.0, 3.0)], audio_seconds=3.2))
    assert [(c.start, c.end) for c in result] == [(1.0, 1.2), (1.2, 1.7), (3.0, 3.2)]


def test_a_word_longer_than_a_line_has_a_cue_of_its_own():
    long = "x" * 50
    result = cues(_transcript([("a", 0.0, 0.1), (long, 0.2, 0.3), ("b", 0.4, 0.5)]))
    assert [c.lines for c in result] == [["a"], [long], ["b"]]


def test_empty_words_are_not_shown_and_no_words_no_cues():
    assert [c.lines for c in cues(_transcript([("", 0.0, 0.1), ("hi", 0.1, 0.2), ("", 0.3, 0.4)]))] == [["hi"]]
    empty = _transcript([])
    assert list(srt.parse(write_srt(empty))) == []
    assert list(webvtt.from_string(write_vtt(empty))) == []
    assert write_tsv(empty) == "start\tend\ttext\n"
    assert write_txt(empty) == "\n"


def test_srt_vtt_and_tsv_text():
    t = _transcript([("fish", 3722.5, 3722.9), ("&", 3723.0, 3723.1), ("<chips>.", 3723.2, 3723.4567)], 4000)
    assert write_srt(t) == "1\n01:02:02,500 --> 01:02:03,457\nfish & <chips>.\n"
    assert write_vtt(t) == "WEBVTT\n\n1\n01:02:02.500 --> 01:02:03.457\nfish &amp; &lt;chips&gt;.\n"
    assert write_tsv(t) == "start\tend\ttext\n3722500\t3723457\tfish & <chips>.\n"
    [cue] = webvtt.from_string(write_vtt(t))
    assert cue.text == "fish &amp; &lt;chips&gt;."  # escaped as WebVTT requires (the parser leaves entities alone)


def test_json_holds_no_processing_time():
    """The same audio gives the same bytes, however long its batch took."""
    fast, slow = _transcript(_even(3)), _transcript(_even(3))
    fast.seconds, slow.seconds = 0.01, 9.5
    assert write_json(fast) == write_json(slow)
    assert "seconds" not in json.loads(write_json(fast))  # audio_seconds stays


# ============================================================================ the real CLI, read back by parsers


@pytest.fixture(scope="module")
def speech_tree(tmp_path_factory) -> Path:
    """Real words from the demo model: its 62 s mix and four espeak sentences, the 44.1 kHz stereo JFK
    recording (resampled), in a folder and a subfolder."""
    root = tmp_path_factory.mktemp("speech")
    (root / "more").mkdir()
    shutil.copy(STAMPS / "clips" / "long_mix_62s.flac", root / "long_mix_62s.flac")
    shutil.copy(JFK_FLAC, root / "more" / JFK_FLAC.name)
    for n in range(4):
        shutil.copy(STAMPS / "clips" / f"demo{n}.flac", root / "more" / f"demo{n}.flac")
    return root


@pytest.fixture(scope="module")
def written_run(speech_tree, tmp_path_factory) -> tuple[Path, str]:
    """The CLI on the folder, every format with times: the output folder and the command's stdout."""
    out = tmp_path_factory.mktemp("out")
    result = transcribe(speech_tree, "--format", "srt,vtt,tsv,json", "-o", out, "--batch", "3", model=str(DEMO_PATH))
    assert result.returncode == 0, result.stderr
    return out, result.stdout


@pytest.fixture(scope="module")
def written(written_run) -> Path:
    return written_run[0]


def _stems(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree).with_suffix("")) for p in tree.rglob("*.flac"))


def test_every_format_for_every_input_of_a_folder(speech_tree, written_run):
    out, stdout = written_run
    assert stdout == ""
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    formats = ("json", "srt", "tsv", "vtt")
    assert written == sorted(f"{stem}.{ext}" for stem in _stems(speech_tree) for ext in formats)


def test_written_files_are_the_in_process_writers_bytes(speech_tree, written):
    """The CLI's files are what the writers make here of `Model.make_transcript`'s Transcripts (the reference path),
    byte for byte, with the same batching."""
    files = sorted(speech_tree.rglob("*.flac"))
    model = load_model(DEMO_PATH, device="cpu")
    for path, transcript in zip(files, model.transcribe([str(p) for p in files], batch_size=3)):
        assert transcript.words
        stem = path.relative_to(speech_tree).with_suffix("")
        for fmt in ("srt", "vtt", "tsv", "json"):
            assert (written / f"{stem}.{fmt}").read_bytes() == WRITERS[fmt](transcript).encode(), (stem, fmt)


def _words_of(record: dict) -> list[str]:
    return [w["word"] for w in record["words"] if w["word"].strip()]


def test_subtitles_parse_and_follow_the_conventions(speech_tree, written):
    for stem in _stems(speech_tree):
        record = json.loads((written / f"{stem}.json").read_text())
        duration = sf.info(str(speech_tree / f"{stem}.flac")).duration
        subtitles = list(srt.parse((written / f"{stem}.srt").read_text(), ignore_errors=False))
        captions = list(webvtt.read(str(written / f"{stem}.vtt")))
        rows = [line.split("\t") for line in (written / f"{stem}.tsv").read_text().splitlines()]

        assert subtitles, stem
        assert [s.index for s in subtitles] == list(range(1, len(subtitles) + 1))
        times = [(s.start.total_seconds(), s.end.total_seconds()) for s in subtitles]
        assert times == [(c.start_time.in_milliseconds() / 1000, c.end_time.in_milliseconds() / 1000) for c in captions]
        assert rows[0] == ["start", "end", "text"]
        assert [(int(a) / 1000, int(b) / 1000) for a, b, _ in rows[1:]] == times
        for (start, end), (next_start, _) in zip(times, times[1:] + [(duration, None)]):
            assert 0 <= start < end <= next_start <= duration
            assert end - start <= MAX_CUE_SECONDS
        for s in subtitles:
            lines = s.content.split("\n")
            assert 1 <= len(lines) <= 2
            assert all(len(line) <= MAX_LINE_CHARS or " " not in line for line in lines)
        # the cues' words are the transcript's words, in order, in all three files
        assert " ".join(s.content for s in subtitles).split() == _words_of(record)
        assert " ".join(c.text for c in captions).split() == _words_of(record)
        assert " ".join(text for _, _, text in rows[1:]).split() == _words_of(record)


def test_cue_times_are_the_word_times(speech_tree, written):
    record = json.loads((written / "long_mix_62s.json").read_text())
    subtitles = list(srt.parse((written / "long_mix_62s.srt").read_text()))
    words = [w for w in record["words"] if w["word"].strip()]
    at = 0
    for s in subtitles:
        n = len(s.content.split())
        assert s.start.total_seconds() == words[at]["start"]
        assert s.end.total_seconds() == words[at + n - 1]["end"]
        at += n
    assert len(subtitles) > 5  # 62 s of speech in cues of at most 7 s


def test_resampled_recording_keeps_its_times(speech_tree, written):
    """44.1 kHz stereo in: times are 80 ms encoder frames of the 16 kHz signal, inside the 11 s."""
    record = json.loads((written / "more" / "jfk_44k1_stereo_24bit.json").read_text())
    assert record["audio_seconds"] == pytest.approx(11.0, abs=0.01)
    frames = [t["frame"] for t in record["tokens"]]
    assert [t["start"] for t in record["tokens"]] == [round(f * FRAME, 3) for f in frames]
    assert 0 < record["words"][-1]["end"] <= record["audio_seconds"]
    assert record["words"][-1]["end"] == record["tokens"][-1]["end"]
    last = list(srt.parse((written / "more" / "jfk_44k1_stereo_24bit.srt").read_text()))[-1]
    assert last.end.total_seconds() == record["words"][-1]["end"]


def test_one_file_prints_its_subtitles():
    result = transcribe(STAMPS / "clips" / "demo2.flac", "-f", "vtt", model=str(DEMO_PATH))
    assert result.returncode == 0, result.stderr
    captions = list(webvtt.from_string(result.stdout))
    expected = "the museum opens at nine it closes late on fridays and saturdays"
    assert " ".join(c.text for c in captions).split() == expected.split()


@pytest.mark.parametrize(
    "args,says",
    [
        (["-f", "srt,json"], "--output-dir"),
        (["-f", "srt"], "--output-dir"),
        (["-f", "doc"], "txt, json, srt, vtt, tsv"),
    ],
)
def test_formats_stdout_cannot_hold_are_usage_errors(args, says):
    result = transcribe(CLIPS / "short_2s.wav", CLIPS / "espeak_fox.wav", *args)
    assert result.returncode == 2
    assert result.stdout == ""
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert says in line


def test_help_lists_choices_defaults_and_examples():
    env = {"COLUMNS": "200"}
    page = transcribe("--help", model=None, env=env).stdout
    for text in (
        "auto|cpu|cuda|cuda:N",
        "auto|float32|bfloat16|float16",
        "txt|json|srt|vtt|tsv",
        "on with CUDA",
        "$GRAPHSCRIBE_MODEL, else demo",
        "[default: auto]",
        "Examples:",
        "-f srt,json -o",
        "--batch-seconds",
        "32 on CUDA in float32, 64 in 16 bits, 8 on the CPU",
        "per GiB of GPU memory",
    ):
        assert text in page, text
    assert "<str>" not in page
    bench = transcribe("bench", "--help", model=None, env=env).stdout
    for text in (
        "auto|cpu|cuda|cuda:N",
        "both rows with CUDA",
        "$GRAPHSCRIBE_MODEL, else demo",
        "1,8; 1 on the CPU; 8,32,128 for throughput",
        "--folder",
        "--throughput",
    ):
        assert text in bench, text
    assert "<str>" not in bench


def test_a_large_folder_is_rendered_by_worker_processes_to_the_same_bytes(tmp_path):
    """From RENDER_POOL_MIN_FILES files on, the CLI's outputs with times come from worker processes
    (`rendering.RenderPool`): each file the bytes the writers make here of `Model.make_transcript`'s Transcript."""
    from graphscribe.cli import RENDER_POOL_MIN_FILES

    # demo0's first 0.8 s, two words ("seven bray"): the CLI's decodes of the copies are most of the test's time (all 4.4 s: 32 s)
    audio, rate = sf.read(STAMPS / "clips" / "demo0.flac", dtype="int16")
    clip = tmp_path / "demo0_start.flac"
    sf.write(clip, audio[: int(0.8 * rate)], rate, subtype="PCM_16")
    folder = tmp_path / "copies"
    folder.mkdir()
    for k in range(RENDER_POOL_MIN_FILES):
        shutil.copy(clip, folder / f"c{k:03d}.flac")
    out = tmp_path / "out"
    result = transcribe(folder, "-f", "json,srt", "-o", out, "--batch", "32", model=str(DEMO_PATH))
    assert result.returncode == 0, result.stderr
    [expected] = load_model(DEMO_PATH, device="cpu").transcribe([str(clip)])
    assert len(expected.words) == 2 and len(expected.segments) == 1  # word times to render
    for k in range(RENDER_POOL_MIN_FILES):
        expected.source = str(folder / f"c{k:03d}.flac")
        assert (out / f"c{k:03d}.srt").read_bytes() == WRITERS["srt"](expected).encode()
        assert (out / f"c{k:03d}.json").read_bytes() == WRITERS["json"](expected).encode()
