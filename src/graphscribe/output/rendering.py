"""Hypotheses -> transcripts, and their output files' text rendered in a small pool of worker processes.

    token ids, frames, durations -> text, token times, NeMo's words and segments   [`TranscriptMaker.make`]
    -> a writer's text per output format                                              [`writers.WRITERS`]

`Model.make_transcript` runs `TranscriptMaker.make` in its own process; `RenderPool` runs it and the writers in
worker processes, for the pipeline of a run that writes json, srt, vtt or tsv: the token, word and segment times and
their formatting cost about a millisecond of Python a file, and in the process that feeds the GPU every such
millisecond holds the GIL that launches its work (a thread does not help). The pool's workers get plain
hypotheses and send back light Transcripts (text, token ids, the rendered outputs), never the token, word and
segment objects, whose pickling would cost as much as making them. Given the output files' paths, the workers
write the files too (`writers.write_file`, whole or not at all) and send back no text: in the thread that feeds
the GPU, writing them takes 0.2 ms a file or more (mkdir, mkstemp, fchmod, write, rename), enough to hold json
output to about 0.83x txt's throughput on an H100.

This module and what it imports (tokenizer, timestamps, transcript, writers) import no torch: a worker process
starts in a fraction of a second and holds no CUDA state.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Sequence

from graphscribe.io.tokenizer import Tokenizer
from graphscribe.output.timestamps import WordRules, token_spans, words_and_segments
from graphscribe.output.transcript import Alternative, Token, Transcript
from graphscribe.output.writers import WRITERS, cannot_write, is_disk_full, write_file

if TYPE_CHECKING:
    from graphscribe.model.decoding import Hypothesis

# Worker processes of a RenderPool. A 0.6b model's bfloat16 batch of 64 LibriSpeech-like files takes ~70 ms on an
# H100; its transcripts and json ~50 ms of one core of that host: two workers, each given half a batch, keep up.
RENDER_WORKERS = 2


class PlainAlternative(NamedTuple):
    """An n-best entry as it crosses to a worker (`beam.ScoredPath`'s token ids and score)."""

    token_ids: list[int]
    score: float


class PlainHypothesis(NamedTuple):
    """A hypothesis as it crosses to a worker: `decoding.Hypothesis`'s fields, without importing decoding (torch)."""

    token_ids: list[int]
    frames: list[int]  # encoder frame of each token
    durations: list[int]  # encoder frames (RNN-T: 0)
    alternatives: tuple[PlainAlternative, ...] = ()  # a beam's n-best list (`beam.BeamHypothesis`)
    confidences: list[float] | None = None  # each token's, when asked for


@dataclass(frozen=True)
class TranscriptMaker:
    """What makes a hypothesis a Transcript besides the hypothesis: picklable, so a worker process can hold it."""

    tokenizer_model: bytes  # the checkpoint's SentencePiece model proto
    rules: WordRules
    tdt: bool  # TDT (a token lasts its predicted duration) or RNN-T (one frame)
    window_stride: float  # seconds per feature frame
    subsampling: int  # feature frames per encoder frame
    sample_rate: int  # Hz
    aggregation: str = "min"  # a word's confidence from its tokens' (`options.aggregate`)

    def frame_seconds(self, frame: int) -> float:
        """Seconds at an encoder frame, computed as NeMo does (frame x window stride x subsampling factor)."""
        return frame * self.window_stride * self.subsampling

    def make(
        self,
        tokenizer: Tokenizer,
        source: str,
        samples: int,
        hyp: Hypothesis | PlainHypothesis,
        seconds: float,
        word_times: bool,
    ) -> Transcript:
        """A hypothesis of `samples` samples of audio as a Transcript; `word_times=False`: text and token ids only
        (no tokens, words, segments). `tokenizer` is the one built from `tokenizer_model`."""
        common = dict(
            source=source,
            text=tokenizer.decode(hyp.token_ids),
            token_ids=list(hyp.token_ids),
            audio_seconds=samples / self.sample_rate,
            seconds=seconds,
            alternatives=[
                Alternative(tokenizer.decode(a.token_ids), list(a.token_ids), a.score)
                for a in getattr(hyp, "alternatives", ())
            ],
        )
        if not word_times:
            return Transcript(**common)
        pieces = [tokenizer.piece(i) for i in hyp.token_ids]
        spans = token_spans(hyp.frames, hyp.durations, self.tdt)
        confidences = hyp.confidences if hyp.confidences is not None else [None] * len(pieces)
        tokens = [
            Token(i, p, s, self.frame_seconds(s), self.frame_seconds(e), e, q)
            for i, p, (s, e), q in zip(hyp.token_ids, pieces, spans, confidences)
        ]
        words, segments = words_and_segments(
            pieces,
            spans,
            tokenizer.decode_pieces,
            self.rules,
            self.tdt,
            self.frame_seconds,
            hyp.confidences,
            self.aggregation,
        )
        return Transcript(**common, tokens=tokens, words=words, segments=segments)


class RenderPool:
    """Worker processes that make hypotheses into light Transcripts whose `rendered` holds each of `formats`'
    writer's text (`writers.render` uses it), byte for byte what the writers make of `TranscriptMaker.make`'s.
    With `outputs` (per input, one path per format, in `formats`' order) the workers write those files instead,
    in that order, and send no text back: a file that cannot be written is the Transcript's `write_error` line,
    and the input's later files are not written (as the CLI does); after a full disk's error (`disk_full`) no later
    input of the share is written either; `written` counts the inputs written whole.

    Spawned (the parent may hold CUDA, which a forked child cannot use) when made, so they start while the first
    batches are read and encoded; each builds its tokenizer once. As with any spawned process, a worker imports
    the caller's `__main__` module first (`transcribe`'s imports no torch). Each worker has a pipe of its own and
    no other channel: no semaphores for the resource tracker to find left over when `transcribe` ends with
    os._exit, and a worker sees its parent's end, however it comes, as the end of its pipe. `close` ends them."""

    def __init__(
        self,
        maker: TranscriptMaker,
        formats: Sequence[str],
        workers: int = RENDER_WORKERS,
        outputs: Sequence[Sequence[str]] | None = None,
    ):
        self.formats = tuple(formats)
        self.outputs = outputs
        self.written = 0  # inputs whose `outputs` the workers have written (counted as their shares come back)
        # One batch out with the workers at a time; `_out`: the workers whose share has not come back yet. A signal
        # may stop the thread that sent them anywhere, even where it cannot tell (inside ThreadPoolExecutor.submit,
        # whose thread then runs on unjoined), while the workers write their shares whole: `settle` counts them.
        self._lock = threading.Lock()
        self._out: list[Connection] = []
        context = multiprocessing.get_context("spawn")
        pipes = [context.Pipe() for _ in range(workers)]
        self._conns: list[Connection] = [conn for conn, _ in pipes]
        self._children = [
            (context.Process(target=_serve, args=(child, maker), name="graphscribe-render", daemon=True), child)
            for _, child in pipes
        ]
        # Starting a worker writes the tokenizer's model (~250 KB) into its pipe, which blocks until that worker's
        # Python has started and reads it (0.4 s for two on a busy 2-core host): on a thread of its own, that waits
        # without holding the GIL.
        self._starter = threading.Thread(target=self._start, name="graphscribe-render-start", daemon=True)
        self._starter.start()

    def _start(self) -> None:
        for process, child in self._children:
            process.start()
            child.close()  # the worker's end lives in the worker only: the parent's end is its pipe's only writer

    def transcripts(
        self, sources: list[str], samples: list[int], hyps: Sequence[Hypothesis], indices: Sequence[int] = ()
    ) -> list[Transcript]:
        """One batch's light Transcripts, in order (`seconds` 0): a share to each worker, waited for. `indices`:
        the inputs' places in `outputs` (needed with outputs)."""
        self._starter.join()
        paths = [self.outputs[i] for i in indices] if self.outputs is not None else [None] * len(sources)
        rows = [(s, n, _plain(h), p) for s, n, h, p in zip(sources, samples, hyps, paths)]
        size = -(-len(rows) // len(self._conns))  # a share each: a batch's wait is its slowest share
        shares = [rows[k : k + size] for k in range(0, len(rows), size)]
        with self._lock:
            self._drain()  # what an interrupted caller left out
            for conn, share in zip(self._conns, shares):
                conn.send((share, self.formats))
                self._out.append(conn)
            return [t for conn in list(self._out) for t in self._take(conn)]

    def settle(self) -> int:
        """`written` once every share sent has come back: a stopped run's count includes the batch the workers were
        writing (they write it whole, whatever stops this process), whichever thread was waiting for it."""
        with self._lock:
            try:
                self._drain()
            except RuntimeError:  # a worker that died: what it wrote is not known
                self._out.clear()
        return self.written

    def _drain(self) -> None:
        while self._out:
            self._take(self._out[0])

    def _take(self, conn: Connection) -> list[Transcript]:
        """A worker's share back, counted."""
        light = _received(conn)
        self._out.remove(conn)
        if self.outputs is not None:
            self.written += sum(t.write_error is None for t in light)
        return light

    def close(self) -> None:
        """End the workers: the end of their pipes tells them (waiting for them would take 80 ms a run)."""
        self._starter.join()
        for conn in self._conns:
            conn.close()


def _plain(hyp: Hypothesis) -> PlainHypothesis:
    alternatives = tuple(PlainAlternative(a.token_ids, a.score) for a in getattr(hyp, "alternatives", ()))
    return PlainHypothesis(hyp.token_ids, hyp.frames, hyp.durations, alternatives, hyp.confidences)


def _received(conn: Connection) -> list[Transcript]:
    try:
        return conn.recv()
    except EOFError:
        raise RuntimeError("a render worker process ended unexpectedly") from None


def _serve(conn: Connection, maker: TranscriptMaker) -> None:
    """A worker's main: its tokenizer, once; then (rows, formats) in, light Transcripts out, till the pipe ends."""
    # Ctrl-C reaches the whole process group, and a job's end often sends SIGTERM to all of it: the parent decides,
    # and waits for a share being written (a worker killed mid-file would leave its temporary file behind)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)
    tokenizer = Tokenizer(maker.tokenizer_model)
    while True:
        try:
            rows, formats = conn.recv()
        except EOFError:
            return
        light = _render(maker, tokenizer, rows, formats)
        try:
            conn.send(light)
        except (BrokenPipeError, ConnectionResetError):  # the parent is gone (os._exit after a second signal)
            return


def _render(
    maker: TranscriptMaker,
    tokenizer: Tokenizer,
    rows: list[tuple[str, int, PlainHypothesis, Sequence[str] | None]],
    formats: tuple[str, ...],
) -> list[Transcript]:
    light: list[Transcript] = []
    full_disk: Transcript | None = None  # the row whose file found the disk full: the later ones are not written
    for source, samples, hyp, paths in rows:
        full = maker.make(tokenizer, source, samples, hyp, 0.0, word_times=True)
        texts = [WRITERS[fmt](full) for fmt in formats]
        done = replace(full, tokens=[], words=[], segments=[])
        if paths is None:
            done.rendered = dict(zip(formats, texts))
        elif full_disk is not None:
            done.write_error, done.disk_full = full_disk.write_error, True
        else:
            done.write_error, done.disk_full = _write_all(paths, texts)
            full_disk = done if done.disk_full else None
        light.append(done)
    return light


def _write_all(paths: Sequence[str], texts: list[str]) -> tuple[str | None, bool]:
    """Each text to its path, in order, stopping at the first that cannot be written: (its error line, whether the
    disk is full), or (None, False)."""
    for path, text in zip(paths, texts):
        try:
            write_file(Path(path), text)
        except OSError as err:
            return cannot_write(path, err), is_disk_full(err)
    return None, False
