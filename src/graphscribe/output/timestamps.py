"""Words and segments from timed tokens, as NeMo's `transcribe(..., timestamps=True)` builds them.

A token spans encoder frames [start, end): TDT, its frame plus its predicted duration; RNN-T,
its frame plus one (NeMo 3.0's `_compute_offsets` / `_compute_offsets_tdt`). For TDT a
punctuation token is moved to the end of the token before it (`_refine_timestamps_tdt`).
Words join SentencePiece pieces (a piece whose text loses a `▁` starts a word; punctuation
sticks to the word before it), segments join words up to one ending in `.`, `?` or `!`
(`get_words_offsets`, `get_segment_offsets`). Seconds are frames x window stride x
subsampling factor, computed in that order as NeMo does, and not rounded here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from graphscribe.io.options import aggregate

SEGMENT_SEPARATORS = (".", "?", "!")  # NeMo's default segment_seperators
_STRIPPED_SEPARATORS = (" ", "_", "▁")  # a built word's last piece NeMo drops before punctuation


@dataclass
class Word:
    word: str  # may be empty: a lone `▁` piece is a word of no text in NeMo
    start: float  # seconds
    end: float  # seconds
    start_frame: int  # encoder frame (NeMo's start_offset)
    end_frame: int  # encoder frame (NeMo's end_offset)
    confidence: float | None = None  # its tokens' confidences aggregated, when asked for (RunOptions.confidence)


@dataclass
class Segment:
    text: str
    start: float  # seconds
    end: float  # seconds
    start_frame: int
    end_frame: int


@dataclass(frozen=True)
class WordRules:
    """What NeMo takes from the tokenizer and the decoding config to make words and segments."""

    punctuation: frozenset[str]  # marks the vocabulary emits on their own (NeMo's supported_punctuation)
    wordpiece: bool = False  # vocabulary with `##` continuation pieces (NeMo's "wpe" tokenizer type)
    word_separator: str = " "
    segment_separators: tuple[str, ...] = SEGMENT_SEPARATORS
    segment_gap: int | None = None  # frames between words that also end a segment (None: off)


@dataclass
class _Piece:
    piece: str  # as in the vocabulary, e.g. "▁the"
    text: str  # decoded on its own, e.g. "the"
    start: int  # encoder frames
    end: int


def token_spans(frames: Sequence[int], durations: Sequence[int], tdt: bool) -> list[tuple[int, int]]:
    """(start, end) encoder frames of each token: TDT frame + duration, RNN-T frame + 1."""
    return [(f, f + (d if tdt else 1)) for f, d in zip(frames, durations)]


def words_and_segments(
    pieces: Sequence[str],
    spans: Sequence[tuple[int, int]],
    decode: Callable[[list[str]], str],
    rules: WordRules,
    tdt: bool,
    frame_seconds: Callable[[int], float],
    confidences: Sequence[float] | None = None,
    aggregation: str = "min",
) -> tuple[list[Word], list[Segment]]:
    """Tokens (vocabulary pieces and their frame spans) -> NeMo's words and segments.

    `decode` turns a list of pieces into text (SentencePiece's decode_pieces); `frame_seconds`
    turns a frame offset into seconds. With the tokens' `confidences`, a word's confidence is the `aggregation`
    of its tokens' (`_words`' token range): NeMo's word confidence, whose word list is the text's words
    (`text.split()`). Our words also hold a lone `▁` that NeMo's leave out (a word of no text, followed by a
    word's start or the end): it gets its own token's confidence. A `▁`-led mark that our words join to the word
    before it (NeMo's: a word of its own) makes one word of the two: the aggregation over both.
    """
    items = [_Piece(p, decode([p]), s, e) for p, (s, e) in zip(pieces, spans)]
    if tdt:
        _punctuation_to_previous_end(items, rules.punctuation)
    words = [
        Word(text, frame_seconds(s), frame_seconds(e), s, e, _confidence(confidences, first, last, aggregation))
        for text, s, e, first, last in _words(items, decode, rules)
    ]
    segments = [Segment(text, frame_seconds(s), frame_seconds(e), s, e) for text, s, e in _segments(words, rules)]
    return words, segments


def _confidence(confidences: Sequence[float] | None, first: int, last: int, how: str) -> float | None:
    return None if confidences is None else aggregate(list(confidences[first : last + 1]), how)


def _punctuation_to_previous_end(items: list[_Piece], punctuation: frozenset[str]) -> None:
    """TDT: a punctuation mark often comes frames after its word (after a pause); NeMo pins it to the word."""
    for i in range(1, len(items)):
        if items[i].text in punctuation:
            items[i].start = items[i].end = items[i - 1].end


def _starts_word(items: list[_Piece], i: int, rules: WordRules) -> bool:
    item = items[i]
    if rules.word_separator != " ":
        return item.text == rules.word_separator
    if rules.wordpiece:
        return bool(item.text) and not item.text.startswith("##") or _lone_separator(items, i, rules)
    return item.piece != item.text or _lone_separator(items, i, rules)  # the piece lost its `▁` when decoded alone


def _lone_separator(items: list[_Piece], i: int, rules: WordRules) -> bool:
    """A separator token starts a word unless the next token of text (not empty, not a separator) is a mark."""
    if items[i].text != rules.word_separator:
        return False
    following = next((it.text for it in items[i + 1 :] if it.text and it.text != rules.word_separator), None)
    return following not in rules.punctuation


def _words(
    items: list[_Piece], decode: Callable[[list[str]], str], rules: WordRules
) -> list[tuple[str, int, int, int, int]]:
    """NeMo's get_words_offsets: (text, start frame, end frame, first token, last token) per word."""
    words: list[list] = []  # [text, start, end, first token, last token]
    built: list[str] = []  # pieces of the word being built
    first = 0  # index of its first token
    for i, item in enumerate(items):
        is_mark = item.text in rules.punctuation and item.text != rules.word_separator
        if not is_mark and _starts_word(items, i, rules):
            if built:
                words.append([decode(built), items[first].start, items[i - 1].end, first, i - 1])
            built = []
            if item.text != rules.word_separator:
                built, first = [item.piece], i
        elif is_mark and not built and words:
            last = words[-1]  # a mark after a finished word ends that word
            last[2], last[4] = item.end, i
            last[0] = (last[0][:-1] if last[0].endswith(" ") else last[0]) + item.text
        elif is_mark and built:
            if built[-1] in _STRIPPED_SEPARATORS:
                built = built[:-1]
            built.append(item.piece)
        else:
            if not built:
                first = i
            built.append(item.piece)
    if not words:
        if built:
            words.append([decode(built), items[0].start, items[-1].end, first, len(items) - 1])
        return [tuple(w) for w in words]
    words[0][1] = items[0].start  # NeMo dates the first word from the first token, whatever it is
    if built:
        words.append([decode(built), items[first].start, items[-1].end, first, len(items) - 1])
    return [tuple(w) for w in words]


def _segments(words: list[Word], rules: WordRules) -> list[tuple[str, int, int]]:
    """NeMo's get_segment_offsets: (text, start frame, end frame) per segment.

    As in NeMo, with a gap threshold set, a separator ends a segment only when it is its first word.
    """
    segments = []
    texts: list[str] = []
    first = 0
    for i, word in enumerate(words):
        text = word.word
        if rules.segment_gap and texts:
            if word.start_frame - words[i - 1].end_frame >= rules.segment_gap:
                segments.append((" ".join(texts), words[first].start_frame, words[i - 1].end_frame))
                texts, first = [text], i
                continue
        elif text and (text[-1] in rules.segment_separators or text in rules.segment_separators):
            texts.append(text)
            segments.append((" ".join(texts), words[first].start_frame, word.end_frame))
            texts, first = [], i + 1
            continue
        texts.append(text)
    if texts:
        segments.append((" ".join(texts), words[first].start_frame, words[-1].end_frame))
    return segments
