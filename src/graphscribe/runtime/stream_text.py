"""What a buffered stream says after each step: NeMo's clipping, end-of-utterance and segment text, per stream.

NeMo's `BufferedRNNTPipeline` (stateful, feature-buffer requests) decodes each step's chunk and then, from the
state after it, the right context; the tokens of both go through `ClippedRNNTGreedyDecoder` (which keep),
`RNNTGreedyEndpointing` (whether the utterance ended: a run of frames without tokens longer than
`stop_history_eou`), `StreamingState.update_state` (tokens repeated across the seam dropped) and the BPE decoder
(the final's text and times). This module is that host-side logic for one stream, step by step; the GPU side,
batched over streams, is `streaming.py`'s. Frames are encoder frames (80 ms for Parakeet); "global" frames count
from the stream's start less NeMo's initial delay (the right context).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

SPM_UNDERSCORE = "\u2581"
OVERLAP_SEARCH = 3  # tokens at the seam compared for a repeat (NeMo's OVERLAP_SEARCH_TH)
CLOSE_IN_TIME = 2.0  # frames apart at most for a repeat to be dropped (NeMo's CLOSE_IN_TIME_TH)


@dataclass(frozen=True)
class StreamGeometry:
    """The sizes of NeMo's stateful buffered streaming, from chunk, left and right context in seconds: each
    rounded up to whole encoder frames (NeMo's own rounding, `init_parameters`)."""

    sample_rate: int
    hop_length: int  # samples per feature frame
    subsampling: int  # feature frames per encoder frame
    chunk: int  # encoder frames decoded per step (C)
    left: int  # encoder frames of left context (L)
    right: int  # encoder frames of right context (R)
    chunk_frames_float: float  # C as NeMo advances its timestamp offset (C unless the sizes were rounded)
    initial_delay: float  # frames, from the requested right context before rounding
    frame_samples: int  # samples a step consumes (the chunk)
    buffer_samples: int  # samples the encoder sees per step (left + chunk + right)
    feature_frames: int  # feature frames kept of the buffer (NeMo's expected_feature_buffer_len)

    @classmethod
    def of(cls, chunk_s: float, left_s: float, right_s: float, sample_rate: int, hop_length: int, subsampling: int):
        stride = hop_length * subsampling / sample_rate  # seconds an encoder frame
        exact = (chunk_s / stride, left_s / stride, right_s / stride)
        c, left, r = (math.ceil(x) for x in exact)
        chunk_float = exact[0]
        buffer_s = chunk_s + left_s + right_s
        if any(abs(x - n) > 1e-5 for x, n in zip(exact, (c, left, r))):
            chunk_float = c
            chunk_s, buffer_s = c * stride, (c + left + r) * stride
        window = hop_length / sample_rate
        return cls(
            sample_rate,
            hop_length,
            subsampling,
            c,
            left,
            r,
            chunk_float,
            right_s / stride,
            int(chunk_s * sample_rate),
            int(buffer_s * sample_rate),
            int(buffer_s / window),
        )

    @property
    def stride_seconds(self) -> float:
        return self.hop_length * self.subsampling / self.sample_rate

    @property
    def alignment(self) -> int:
        """Frames a step's hypotheses span: the chunk and the right context."""
        return self.chunk + self.right


@dataclass(frozen=True)
class Vocabulary:
    """What the endpointing and the text need of the tokenizer."""

    pieces: tuple[str, ...]
    punctuation: frozenset[str]  # marks the vocabulary emits on their own, less the apostrophe
    punctuation_ids: frozenset[int]
    underscore_id: int | None  # the lone "▁" piece
    moved_ids: frozenset[int]  # punctuation and language tags: their times move to the token before

    @classmethod
    def of(cls, pieces: list[str], punctuation: frozenset[str], unk_id: int) -> Vocabulary:
        """As NeMo's inference wrapper makes them: a mark or tag looked up as a piece, and a mark that is no piece
        of its own (it only occurs inside others) taken as the unknown piece's id, as SentencePiece answers."""
        marks = frozenset(punctuation) - {"'"}
        index = {p: i for i, p in enumerate(pieces)}
        punct_ids = frozenset(index.get(p, unk_id) for p in marks)
        tags = frozenset(i for i, p in enumerate(pieces) if p.startswith("<") and p.endswith(">") and p != "<unk>")
        return cls(tuple(pieces), marks, punct_ids, index.get(SPM_UNDERSCORE, unk_id), punct_ids | tags)

    def starts_word(self, token: int) -> bool:
        return self.pieces[token].startswith(SPM_UNDERSCORE)

    def is_mark(self, token: int) -> bool:
        """The piece is a punctuation mark (by its text, as NeMo's BPE decoder checks it)."""
        return self.pieces[token] in self.punctuation

    def is_blank_like(self, token: int) -> bool:
        """The piece is a punctuation mark or the lone "▁": a segment's times skip them."""
        return self.pieces[token] in self.punctuation or self.pieces[token] == SPM_UNDERSCORE


@dataclass
class Final:
    """A finished utterance: its tokens, the encoder frame of each (global), its text, and whether NeMo joins it
    to the text before with a space."""

    token_ids: list[int]
    frames: list[int]
    text: str
    start: int  # frames
    end: int
    spaced: bool


@dataclass
class StepText:
    """What one step said: the tokens it committed, the final it closed (if any), the open utterance's text."""

    new_tokens: list[int]
    final: Final | None
    partial: str


@dataclass
class StreamText:
    """One stream's text state across steps (NeMo's `RNNTStreamingState` and the clipping decoder's indices)."""

    geometry: StreamGeometry
    vocab: Vocabulary
    decode: object  # token ids -> text, SentencePiece's own decode (no clean-up)
    stop_history_ms: int = 800
    residue_tokens: int = 2
    tokens: list[int] = field(default_factory=list)  # the open utterance's
    frames: list[int] = field(default_factory=list)
    eou_before: bool = False
    clip_start: int = 0
    clip_end: int = 0
    offset: float = 0.0  # frames: NeMo's timestamp_offset
    steps: int = 0

    def __post_init__(self):
        ms = self.geometry.stride_seconds * 1000
        self.stop_frames = int((self.stop_history_ms + ms - 1) // ms) if self.stop_history_ms > 0 else -1
        marks = sorted(self.vocab.punctuation)
        alternatives = "|".join(re.escape(p) for p in marks)
        self._space_before = re.compile(r"\s+(" + alternatives + ")") if marks else None
        self._repeated = re.compile(r"([" + "".join(re.escape(p) for p in marks) + r"]){2,}") if marks else None

    def step(self, tokens: list[int], frames: list[int], last: bool) -> StepText:
        """A step's hypothesis: the tokens of its chunk then of its right context, each at its global frame (since
        the stream's first decoded frame)."""
        g = self.geometry
        first = self.steps == 0
        frames = self._moved_times(tokens, frames) if tokens else []
        local = [f - self.offset for f in frames] if self.offset else list(frames)
        is_eou, eou_at = last, g.alignment
        start, end = self.clip_start, self.clip_end
        if end > 0:
            end -= g.chunk
            start = end
        if first:
            start, end = 0, 0
        elif end <= 0:
            start, end = 0, g.chunk
        if not tokens:
            is_eou, kept, kept_frames = True, [], []
        else:
            if not is_eou:
                is_eou, eou_at = self._end_of_utterance([f for f in local if f >= start])
            if is_eou and eou_at > end:
                end = min(eou_at, g.alignment)
            if 0 <= end < g.chunk:
                end, is_eou = g.chunk, False
            chosen = [j for j, f in enumerate(local) if start <= f < end]
            kept = [tokens[j] for j in chosen]
            kept_frames = [frames[j] for j in chosen]
        new = self._update(kept, kept_frames, is_eou)
        self.clip_start, self.clip_end = start, end
        final = None
        if is_eou:
            if self.tokens:
                final = self._final(first)
            self.tokens, self.frames = [], []
        self.offset += g.chunk_frames_float
        self.steps += 1
        return StepText(new, final, self.partial())

    def partial(self) -> str:
        """The open utterance's text, as NeMo's partial transcript has it."""
        text = "".join(
            p.replace(SPM_UNDERSCORE, " ") if p.startswith(SPM_UNDERSCORE) else p
            for p in (self.vocab.pieces[t] for t in self.tokens)
        )
        return self._space_before.sub(r"\1", text) if self.tokens and self._space_before else text

    def _end_of_utterance(self, frames: list[float]) -> tuple[bool, int]:
        """`detect_eou_given_timestamps`: frames without tokens after the last one, or between two, longer than
        the stop history."""
        stop = self.stop_frames
        if not frames or stop < 0:
            return False, -1
        if stop == 0:
            return True, self.geometry.alignment
        length = max(0, self.geometry.alignment - self.residue_tokens)  # the last frames may still change
        last = frames[-1]
        if max(0, length - last - 1) > stop:
            return True, int(last + 1 + stop // 2)
        gaps = [j for j in range(len(frames) - 1) if frames[j + 1] - frames[j] - 1 > stop]
        if gaps:
            return True, int(frames[gaps[-1]] + 1 + stop // 2)
        return False, -1

    def _moved_times(self, tokens: list[int], frames: list[int]) -> list[int]:
        """`update_punctuation_and_language_tokens_timestamps`: a punctuation mark or language tag takes the
        time of the token before it, a run of them (with lone "▁" pieces) all of it."""
        moved, special = self.vocab.moved_ids, self.vocab.moved_ids | {self.vocab.underscore_id}
        if all(t in special for t in tokens):
            return list(frames)
        out, i, n = list(frames), 0, len(tokens)
        while i < n:
            if tokens[i] not in special:
                i += 1
                continue
            s = e = i
            j = i + 1
            while j < n and tokens[j] in special:
                if tokens[j] != self.vocab.underscore_id:
                    e = j
                j += 1
            before = int(frames[s - 1]) if s > 0 else 0
            if s == e:
                if tokens[s] in moved:
                    out[s] = before
            else:
                out[s : e + 1] = [before] * (e + 1 - s)
            i = j
        return out

    def _update(self, kept: list[int], kept_frames: list[int], is_eou: bool) -> list[int]:
        """`StreamingState.update_state`: the kept tokens less a repeat of the open utterance's last ones."""
        if not kept:
            return []
        shifted = [f - self.geometry.initial_delay for f in kept_frames]
        overlap = 0
        if not self.eou_before and self.tokens:
            for k in range(1, min(len(self.tokens), len(kept), OVERLAP_SEARCH) + 1):
                if self.tokens[-k:] == kept[:k]:
                    overlap = k
            if overlap > 0 and not (shifted[overlap - 1] - self.frames[-overlap] <= CLOSE_IN_TIME):
                overlap = 0
        # (NeMo also drops a first token equal to the last one after an end of utterance, but only the stateless
        # pipeline records that last token: in this, the stateful one, the check never fires)
        new, new_frames = kept[overlap:], shifted[overlap:]
        self.tokens.extend(new)
        self.frames = merge_frames(self.frames, new_frames)
        self.eou_before = is_eou
        return new

    def open_text(self) -> tuple[str, bool]:
        """The open utterance's text as its final would have it if it ended now, and whether that final would be
        joined to the text before with a space."""
        if not self.tokens:
            return "", False
        return self._text(), self.vocab.starts_word(self.tokens[0])

    def _text(self) -> str:
        text = self.decode(self.tokens).strip()
        if self._space_before is not None:
            text = self._repeated.sub(r"\1", self._space_before.sub(r"\1", text))
        return text

    def _final(self, first: bool) -> Final:
        text = self._text()
        start, end = self.frames[0], self.frames[-1]
        if self.vocab.is_blank_like(self.tokens[0]):
            start = next((f for f, t in zip(self.frames, self.tokens) if not self.vocab.is_blank_like(t)), start)
        if self.vocab.is_mark(self.tokens[-1]):
            end = next(
                (self.frames[i] for i in reversed(range(len(self.tokens))) if not self.vocab.is_mark(self.tokens[i])),
                end,
            )
        end += 1 if start == end else 0
        spaced = not (first or not self.vocab.starts_word(self.tokens[0]))
        return Final(list(self.tokens), list(self.frames), text, start, end, spaced)


def merge_frames(before: list[float], after: list[float]) -> list[float]:
    """NeMo's timestamp merge: each list moved to start at 0 if it starts below it; the second moved past the first
    where they overlap."""
    if before and before[0] < 0:
        before = [t - before[0] for t in before]
    if after and after[0] < 0:
        after = [t - after[0] for t in after]
    if not before or not after:
        return before or after
    gap = after[0] - before[-1]
    if gap <= 0:
        return before + [t + abs(gap) + 1 for t in after]
    return before + after
