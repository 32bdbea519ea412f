"""Which engine takes a request on a server of several devices (`serve --devices ... --route`).

    least    the warm engine with the least audio queued (then the fewest requests and turns)
    length   each warm engine a band of request lengths, shortest band first, the bands cut so that each holds an
             equal share of the recent requests' audio; the least-queued engine instead while the band's has fallen
             behind it by more than SLACK_SECONDS of audio (and before MIN_SEEN requests, and for realtime turns,
             whose length is not known)

Why bands: a batch's decode runs as many steps as its longest row whatever its rows, and its rows pad to the
longest. With two GPUs under 128 clients each engine forms batches of about 18 rows of every length (2026-11-28,
bench/README.md): a long row sets the pace of every short one beside it, and each GPU spends 1.25x one GPU's busy
time per request. Rows of like lengths share a batch when each engine takes one band.
"""

from __future__ import annotations

import bisect
import collections
import itertools

ROUTES = ("least", "length")
RECENT = 1024  # requests whose lengths cut the bands
REFRESH = 64  # requests between two cuts
MIN_SEEN = 64  # requests seen before the bands are used
SLACK_SECONDS = 30.0


class LengthBands:
    """The bands of `length` routing, from the lengths of the recent requests (not thread-safe: the caller's lock)."""

    def __init__(self):
        self._recent: collections.deque[int] = collections.deque(maxlen=RECENT)
        self._sorted: list[int] = []
        self._audio_to: list[int] = []  # the audio of the sorted lengths up to each, cumulated
        self._since = 0

    def band(self, samples: int, bands: int) -> int | None:
        """Count a request of `samples` and return its band, 0 (shortest) to bands - 1; None while too few were seen."""
        self._recent.append(samples)
        self._since += 1
        if not self._sorted or self._since >= REFRESH:
            if len(self._recent) < MIN_SEEN:
                return None
            self._sorted = sorted(self._recent)
            self._audio_to = list(itertools.accumulate(self._sorted))
            self._since = 0
        # the share of the recent audio in requests shorter than this one, and half of that in ones as long
        below = bisect.bisect_left(self._sorted, samples)
        same = bisect.bisect_right(self._sorted, samples) - below
        before = self._audio_to[below - 1] if below else 0
        share = (before + same * samples / 2) / self._audio_to[-1]
        return min(bands - 1, int(share * bands))


def pick(engines: list, samples: int | None, bands: LengthBands | None, rate: int):
    """Of `engines` (warm, in device order; each with `queued` samples, `requests` and `turns`), the one to take a
    request of `samples` (None: a realtime turn); `bands` None: least-queued routing."""
    if not engines:
        return None
    least = min(engines, key=lambda e: (e.queued, len(e.requests) + len(e.turns)))
    if bands is None or samples is None or len(engines) < 2:
        return least
    band = bands.band(samples, len(engines))
    if band is None:
        return least
    chosen = engines[band]
    return chosen if chosen.queued - least.queued <= SLACK_SECONDS * rate else least
