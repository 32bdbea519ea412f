"""Phrases to boost as users write them (`--hotwords 'Parakeet, graphscribe:2.0'`, a file of one a line, a
request's `hotwords` field): parsed and bounded here, where the commands and the HTTP side read them without the
model; their trees are built in `model/boosting.py`."""

from __future__ import annotations

import math

# a request's or a session's own phrases (untrusted input): at most this many, each at most this many characters
# (and MAX_PHRASE_TOKENS tokens)
MAX_REQUEST_PHRASES = 1000
MAX_REQUEST_PHRASE_CHARS = 512


class HotwordError(ValueError):
    """A phrase that cannot be boosted, or a malformed list: one line naming it."""


def parse_hotwords(text: str, source: str = "--hotwords") -> list[tuple[str, float | None]]:
    """'Parakeet, graphscribe:2.0' -> [('Parakeet', None), ('graphscribe', 2.0)]: comma-separated phrases, each with
    an optional context score after its last ':' (only if that part is a number)."""
    return [parse_phrase(item, source) for item in text.split(",")] if text.strip() else []


def read_hotwords_file(path: str) -> list[tuple[str, float | None]]:
    """One phrase a line (optional ':score'); blank lines are skipped."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read(1 << 22).split("\n")
    except (OSError, UnicodeDecodeError) as err:
        raise HotwordError(f"{path}: cannot read the hotwords ({getattr(err, 'strerror', None) or err})") from None
    return [parse_phrase(line, f"{path}:{i + 1}") for i, line in enumerate(lines) if line.strip()]


def parse_phrase(item: str, source: str = "--hotwords") -> tuple[str, float | None]:
    """'graphscribe:2.0' -> ('graphscribe', 2.0); 'graphscribe' -> ('graphscribe', None)."""
    phrase, colon, score = item.strip().rpartition(":")
    if colon:
        try:
            value = float(score)
        except ValueError:
            return item.strip(), None
        if not math.isfinite(value) or value <= 0:
            raise HotwordError(f"{source}: phrase {phrase.strip()!r}: its score {score.strip()} must be above 0")
        return phrase.strip(), value
    return item.strip(), None


def parse_request_hotwords(text: str, source: str = "hotwords") -> tuple[tuple[str, float | None], ...]:
    """A request's or a session's phrases ('A, B:2.0', as --hotwords takes them), bounded for untrusted input:
    HotwordError past MAX_REQUEST_PHRASES phrases or MAX_REQUEST_PHRASE_CHARS characters in one, or for an empty
    one. Their tokens are checked when their tree is built (`boosting_tables`)."""
    items = text.split(",") if text.strip() else []
    if len(items) > MAX_REQUEST_PHRASES:
        raise HotwordError(f"{source}: {len(items)} phrases, more than the {MAX_REQUEST_PHRASES} a request may boost")
    phrases = []
    for item in items:
        if len(item) > MAX_REQUEST_PHRASE_CHARS:
            raise HotwordError(
                f"{source}: phrase {item.strip()[:40]!r}... is over {MAX_REQUEST_PHRASE_CHARS} characters"
            )
        if not item.strip():
            raise HotwordError(f"{source}: an empty phrase (two commas in a row, or one at an end)")
        phrases.append(parse_phrase(item, source))
    return tuple(phrases)
