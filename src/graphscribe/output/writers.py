"""Output formats: one writer per format, each turning a Transcript into the text of one file.

txt: the transcript. json: one object (path, text, timings, tokens, words, segments) on one line.
srt, vtt, tsv: subtitle cues made from the word times, the same cues in all three. A cue holds
at most 2 lines of 42 characters and lasts at most 7 s; a cue also ends after a word that ends a
sentence (., ?, !) and before a pause of a second or more. Cue times are the first word's start
and the last word's end, in milliseconds, cut to the audio's length and to the next cue's start
(RNN-T words may overlap by a frame); a cue of no duration is shown for half a second if there is room.

`render` is the one place an output's text is taken: made in a worker process already, or by its writer here.
`write_file` is the one place output files are written: whole or not at all; `cannot_write` the one line that says
one could not be; `is_disk_full` whether no later one can be either.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from graphscribe.output.timestamps import SEGMENT_SEPARATORS, Word

if TYPE_CHECKING:  # no torch import for `transcribe --help`
    from graphscribe.output.transcript import Transcript

MAX_LINE_CHARS = 42  # characters per subtitle line (broadcast guidelines: 37-42)
MAX_LINES = 2  # lines per cue
MAX_CUE_SECONDS = 7.0  # a cue longer than this is split at a word boundary
PAUSE_SECONDS = 1.0  # silence between two words that ends a cue
EMPTY_CUE_SECONDS = 0.5  # a cue of no duration (words predicted to last 0 frames) is shown this long if there is room


@dataclass
class Cue:
    start: float  # seconds
    end: float  # seconds
    lines: list[str]
    confidence: float | None = None  # its least confident word's (with confidences on)

    @property
    def text(self) -> str:
        return " ".join(self.lines)


def cues(transcript: Transcript) -> list[Cue]:
    """Subtitle cues from a transcript's words: grouped, wrapped, and timed without overlaps."""
    groups: list[list[Word]] = []
    for word in (w for w in transcript.words if w.word.strip()):
        if not groups or _ends_cue(groups[-1], word):
            groups.append([])
        groups[-1].append(word)
    result = [
        Cue(g[0].start, g[-1].end, _wrap([w.word.strip() for w in g]) or [g[0].word.strip()], _least_confident(g))
        for g in groups
    ]
    limit = transcript.audio_seconds
    for i, cue in enumerate(result):
        following = result[i + 1].start if i + 1 < len(result) else limit
        cue.start = min(cue.start, limit)
        if cue.end <= cue.start:
            cue.end = cue.start + EMPTY_CUE_SECONDS
        cue.end = max(min(cue.end, following, limit), cue.start)
    return result


def _least_confident(words: list[Word]) -> float | None:
    values = [w.confidence for w in words if w.confidence is not None]
    return min(values) if values else None


def _ends_cue(group: list[Word], word: Word) -> bool:
    """Does `word` start a new cue after `group`?"""
    last = group[-1].word.strip()
    return (
        last[-1] in SEGMENT_SEPARATORS
        or word.start - group[-1].end >= PAUSE_SECONDS
        or word.end - group[0].start > MAX_CUE_SECONDS
        or _wrap([w.word.strip() for w in group] + [word.word.strip()]) is None
    )


def _wrap(words: list[str]) -> list[str] | None:
    """Words as at most MAX_LINES balanced lines of MAX_LINE_CHARS, or None if they do not fit."""
    one = " ".join(words)
    if len(one) <= MAX_LINE_CHARS:
        return [one]
    splits = [(" ".join(words[:k]), " ".join(words[k:])) for k in range(1, len(words))]
    fitting = [s for s in splits if max(map(len, s)) <= MAX_LINE_CHARS]
    if not fitting:
        return None
    top, bottom = min(fitting, key=lambda s: (max(map(len, s)), len(s[0])))  # even lines, the shorter on top
    return [top, bottom]


def _clock(seconds: float, decimal: str) -> str:
    """HH:MM:SS,mmm (SRT) or HH:MM:SS.mmm (WebVTT)."""
    ms = round(seconds * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{ms:03d}"


def write_txt(transcript: Transcript) -> str:
    return transcript.text + "\n"


def write_json(transcript: Transcript) -> str:
    return json.dumps(transcript.to_json(), ensure_ascii=False) + "\n"


def write_srt(transcript: Transcript) -> str:
    blocks = [
        f"{n}\n{_clock(c.start, ',')} --> {_clock(c.end, ',')}\n" + "\n".join(c.lines) + "\n"
        for n, c in enumerate(cues(transcript), 1)
    ]
    return "\n".join(blocks)


def write_vtt(transcript: Transcript) -> str:
    blocks = [
        f"{n}\n{_clock(c.start, '.')} --> {_clock(c.end, '.')}\n" + "\n".join(map(_vtt_escape, c.lines)) + "\n"
        for n, c in enumerate(cues(transcript), 1)
    ]
    return "\n".join(["WEBVTT\n", *blocks])


def _vtt_escape(line: str) -> str:
    return line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def write_tsv(transcript: Transcript) -> str:
    """whisper's tsv: a header, then start and end in whole milliseconds and the text, one cue a row; with
    confidences, a fourth column: the cue's least confident word's confidence (6 significant digits)."""
    made = cues(transcript)
    confident = any(c.confidence is not None for c in made)
    rows = ["start\tend\ttext" + ("\tconfidence" if confident else "")]
    for c in made:
        row = f"{round(1000 * c.start)}\t{round(1000 * c.end)}\t{c.text.replace(chr(9), ' ')}"
        rows.append(row + (f"\t{c.confidence:.6g}" if confident else ""))
    return "\n".join(rows) + "\n"


WRITERS: dict[str, Callable[["Transcript"], str]] = {
    "txt": write_txt,
    "json": write_json,
    "srt": write_srt,
    "vtt": write_vtt,
    "tsv": write_tsv,
}
FORMATS = tuple(WRITERS)
LINE_FORMATS = ("txt", "json")  # one line per input: several inputs can share stdout


def render(transcript: Transcript, fmt: str) -> str:
    """The text of `transcript`'s `fmt` output: as a worker process rendered it (`rendering.RenderPool`), else
    made here by the format's writer."""
    if fmt in transcript.rendered:
        return transcript.rendered[fmt]
    return WRITERS[fmt](transcript)


def stdout_text(transcript: Transcript, fmt: str, several: bool) -> str:
    """What `transcribe` prints for one input without --output-dir: txt of several inputs names each (`one_line`);
    json the error of one that failed too."""
    if fmt == "txt" and several:
        return f"{one_line(transcript.source)}: {transcript.text}\n"
    return render(transcript, fmt)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def one_line(text: str) -> str:
    """`text` as one line: where it holds control characters (a file name with a newline) they are escaped as
    Python writes them (\\n, \\x1b), and its backslashes doubled, so that a `PATH: text` or error line stays one line;
    other text is itself."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text.replace("\\", "\\\\"))


def write_file(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` whole or not at all: into `.NAME.XXXX.tmp` beside it, renamed over `path`
    when complete, so a reader, a full disk or a killed process sees the old file or the new one, never a
    fragment. Raises OSError after removing the temporary file; only SIGKILL (or a crash of the machine) can
    leave one behind.

    No fsync: os.replace after a flush is atomic against any process's death, which is what happens to a
    transcription (Ctrl-C, a job's time limit). Surviving power loss too would take an fsync of the file and
    of its folder per output, milliseconds each on a disk and more on network storage, for files a rerun
    makes again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as file:
            os.fchmod(file.fileno(), 0o666 & ~_umask())  # mkstemp's 0600 would hide the output from others
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass  # removed already, or the folder went away: nothing is left either way
        raise


def cannot_write(path: Path | str, err: OSError) -> str:
    """The error line of an output file that could not be written."""
    return f"{path}: cannot write output ({err.strerror or err})"


# Errors that every later output would meet too: the run stops writing at the first (`transcribe` says so once)
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(err: OSError) -> bool:
    return err.errno in DISK_FULL


@functools.cache
def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask sets it: set it back at once
    os.umask(mask)
    return mask
