"""How to run a model, apart from what the model is (io/config.py): device, dtype, batching, attention, limits.

The commands build one `RunOptions` from their flags and hand it down to `load_model`, the `--devices` workers, the
server's engines and the Ray actors."""

from __future__ import annotations

from dataclasses import dataclass

from graphscribe.io.config import ATTENTION_WINDOW, MAX_AUDIO_SECONDS


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
    lm: str | None = None  # a token-level ARPA LM fused into decoding (`model/ngram.py`; scripts/build_lm.py)
    lm_weight: float = 0.5  # its weight (NeMo's ngram_lm_alpha)
    hotwords: tuple[str, ...] = ()  # phrases to boost, each with an optional ":score" (`model/boosting.py`)
    boost: float = 1.0  # the boosting tree's weight (NeMo's boosting_tree_alpha)
    beam_size: int = 1  # 1: greedy; more: NeMo's malsd_batch beam search (`model/beam.py`), files only (not streams)
    nbest: bool = False  # with a beam: each transcript's n-best list (`Transcript.alternatives`, JSON)
