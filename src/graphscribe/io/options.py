"""How to run a model, apart from what the model is (io/config.py): device, dtype, batching, attention, limits.

The commands build one `RunOptions` from their flags and hand it down to `load_model`, the `--devices` workers, the
server's engines and the Ray actors."""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphscribe.io.config import ATTENTION_WINDOW, MAX_AUDIO_SECONDS


@dataclass(frozen=True)
class ConfidenceMethod:
    """NeMo's `ConfidenceMethodConfig` and word aggregation, with its defaults (tests/fixtures/nemo-confidence):
    how a token's step distribution becomes a confidence (`model.confidence.measure`), and its tokens' a word's."""

    name: str = "entropy"  # or "max_prob"
    entropy_type: str = "tsallis"  # gibbs, tsallis, renyi
    alpha: float = 0.33
    entropy_norm: str = "exp"  # lin, exp
    aggregation: str = "min"  # min, max, mean, prod


def aggregate(values: list[float], how: str = "min") -> float:
    """NeMo's aggregation of token confidences (a word's, `get_confidence_aggregation_bank`) over python floats."""
    if how == "min":
        return min(values)
    if how == "max":
        return max(values)
    if how == "mean":
        return sum(values) / len(values)
    if how == "prod":
        return math.prod(values)
    raise ValueError(f"confidence aggregation {how!r}: use min, max, mean or prod")


@dataclass(frozen=True)
class RunOptions:
    """How to run a model: changed with `dataclasses.replace`, never mutated. The commands build one from their
    flags and hand it down to `load_model`, the `--devices` workers and the Ray actors."""

    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    graphs: bool = True  # replay captured CUDA graphs for decoding (CUDA only)
    batch_size: int | None = None  # inputs per batch; None: the device's default
    batch_seconds: float | None = None  # padded audio seconds per batch at most; 0: no cap; None: the device's default
    attention: str = "auto"  # auto | full | local (see encoder.py and loaded.py `LoadedModel.attention_for`)
    attention_window: int = ATTENTION_WINDOW
    max_audio_seconds: float = MAX_AUDIO_SECONDS  # a file of more audio is refused (`audio.read_input`)
    lm: str | None = None  # a token-level LM fused into decoding: ARPA (`model/ngram.py`) or NeMo's .nemo (`ngpulm.py`)
    lm_weight: float = 0.5  # its weight (NeMo's ngram_lm_alpha)
    hotwords: tuple[str, ...] = ()  # phrases to boost, each with an optional ":score" (`model/boosting.py`)
    boost: float = 1.0  # the boosting tree's weight (NeMo's boosting_tree_alpha)
    beam_size: int = 1  # 1: greedy; more: NeMo's malsd_batch beam search (`model/beam.py`), files only (not streams)
    nbest: bool = False  # with a beam: each transcript's n-best list (`Transcript.alternatives`, JSON)
    # token and word confidence in the outputs that carry tokens and words (json, tsv, verbose_json): replayed after
    # decoding (`model.confidence.replay_batch`); off, nothing of it is computed
    confidence: bool = False
    confidence_method: ConfidenceMethod = ConfidenceMethod()
