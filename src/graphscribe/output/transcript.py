"""One input's result: its text, token ids, and token, word and segment times."""

from __future__ import annotations

from dataclasses import dataclass, field

from graphscribe.output.timestamps import Segment, Word


@dataclass
class Token:
    id: int
    piece: str
    frame: int  # encoder frame
    start: float  # seconds
    end: float  # seconds
    end_frame: int  # encoder frame: TDT frame + predicted duration, RNN-T frame + 1 (NeMo's end offset)
    confidence: float | None = None  # NeMo's token confidence, when asked for (RunOptions.confidence)


@dataclass
class Alternative:
    """One hypothesis of a beam search's n-best list: its text, token ids and NeMo's raw score (natural log)."""

    text: str
    token_ids: list[int]
    score: float


@dataclass
class Transcript:
    """One input's result; `error` is set (and the rest empty) when the input could not be transcribed."""

    source: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    tokens: list[Token] = field(default_factory=list)
    words: list[Word] = field(default_factory=list)  # NeMo's word timestamps
    segments: list[Segment] = field(default_factory=list)  # NeMo's segment timestamps (sentences)
    audio_seconds: float = 0.0
    seconds: float = 0.0  # processing time: its batch's time divided by the batch size
    error: str | None = None
    alternatives: list[Alternative] = field(default_factory=list)  # a beam's n-best, best first (--nbest)
    # format -> its writer's text, made in a worker process (`rendering.RenderPool`), which leaves tokens, words and
    # segments empty; `writers.render` takes it from here
    rendered: dict[str, str] = field(default_factory=dict)
    # the line naming an output file that a worker process could not write (`rendering.RenderPool` given the paths)
    write_error: str | None = None
    disk_full: bool = False  # write_error is a full disk's (`writers.is_disk_full`): nothing more is written

    @property
    def frames(self) -> list[int]:
        return [t.frame for t in self.tokens]

    def to_json(self) -> dict:
        """The JSON record of `transcribe -f json`: what the audio says, never how long it took (the same input
        gives the same bytes; times are in the CLI's summary line)."""
        if self.error is not None:
            return {"path": self.source, "error": self.error}
        return {
            "path": self.source,
            "text": self.text,
            "audio_seconds": round(self.audio_seconds, 4),
            "tokens": [
                _confident(
                    {
                        "id": t.id,
                        "piece": t.piece,
                        "frame": t.frame,
                        "start": round(t.start, 3),
                        "end": round(t.end, 3),
                    },
                    t.confidence,
                )
                for t in self.tokens
            ],
            "words": [
                _confident({"word": w.word, "start": round(w.start, 3), "end": round(w.end, 3)}, w.confidence)
                for w in self.words
            ],
            "segments": [{"text": s.text, "start": round(s.start, 3), "end": round(s.end, 3)} for s in self.segments],
        } | self._alternatives_json()

    def _alternatives_json(self) -> dict:
        if not self.alternatives:
            return {}
        return {
            "alternatives": [
                {"text": a.text, "token_ids": a.token_ids, "score": round(a.score, 4)} for a in self.alternatives
            ]
        }


def _confident(record: dict, confidence: float | None) -> dict:
    """A token's or word's record, with its confidence when there is one (unrounded: NeMo's float32 value)."""
    if confidence is not None:
        record["confidence"] = confidence
    return record
