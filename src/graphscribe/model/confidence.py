"""Token and word confidence as NeMo computes it (tests/fixtures/nemo-confidence/README.md says what and where).

NeMo measures the distribution of the decode step that emitted a token: the softmax over vocabulary and blank (a
TDT model's duration logits left out), through one of its measures (the default: Tsallis entropy, alpha 0.33,
exponential norm), and a word takes the minimum of its tokens'. Nothing of it is needed while decoding: a
hypothesis says which token came at which encoder frame, and each token's step read that frame and the
prediction net's output after the tokens before it. So `replay` recomputes those steps' logits afterwards, for the
hypotheses whose confidence is asked for, and greedy decoding stays as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from graphscribe.model.heads import Joint, PredictionNet


@dataclass(frozen=True)
class ConfidenceMethod:
    """NeMo's `ConfidenceMethodConfig` and the word aggregation (its defaults)."""

    name: str = "entropy"  # or "max_prob"
    entropy_type: str = "tsallis"  # gibbs, tsallis, renyi
    alpha: float = 0.33
    entropy_norm: str = "exp"  # lin, exp
    aggregation: str = "min"  # min, max, mean, prod


def measure(logprobs: torch.Tensor, method: ConfidenceMethod = ConfidenceMethod()) -> torch.Tensor:
    """(..., v) log-probabilities over vocabulary and blank -> (...) confidences in [0, 1] (NeMo's measure bank,
    `get_confidence_measure_bank`), in float32 as NeMo evaluates them."""
    x = torch.nan_to_num(logprobs.float())
    v, t = x.shape[-1], method.alpha
    if method.name == "max_prob":
        top = x.max(dim=-1).values
        if t == 1.0:
            return (torch.exp(top) * v - 1) / (v - 1)
        return (torch.exp(t * top) * v**t - 1) / (v**t - 1)
    if method.name != "entropy":
        raise ValueError(f"confidence method {method.name!r}: use entropy or max_prob")
    kind = f"{method.entropy_type}_{method.entropy_norm}"
    if t == 1.0:  # every entropy is Gibbs' then
        gibbs = (torch.exp(x) * x).sum(dim=-1)
        if method.entropy_norm == "lin":
            return 1 + gibbs / math.log(v)
        return (torch.exp(gibbs) * v - 1) / (v - 1)
    powered = torch.exp(t * x).sum(dim=-1)  # sum of p^t
    if kind == "gibbs_lin":
        return 1 + (torch.exp(t * x) * x).sum(dim=-1) / math.log(v) / v ** (1 - t)
    if kind == "gibbs_exp":
        c = v ** (-t * v ** (1 - t))
        return (torch.exp(t * (torch.exp(t * x) * x).sum(dim=-1)) - c) / (1 - c)
    if kind == "tsallis_lin":
        return 1 + (1 - powered) / (v ** (1 - t) - 1)
    if kind == "tsallis_exp":
        c = math.exp((1 - v ** (1 - t)) / (1 - t))
        return (torch.exp((1 - powered) / (1 - t)) - c) / (1 - c)
    if kind == "renyi_lin":
        return 1 + torch.log2(powered) / (t - 1) / math.log2(v)
    if kind == "renyi_exp":
        return (powered ** (1 / (t - 1)) * v - 1) / (v - 1)
    raise ValueError(f"confidence entropy {kind!r}: use gibbs, tsallis or renyi with lin or exp")


def aggregate(values: list[float], how: str = "min") -> float:
    """NeMo's word aggregation over python floats."""
    if how == "min":
        return min(values)
    if how == "max":
        return max(values)
    if how == "mean":
        return sum(values) / len(values)
    if how == "prod":
        return math.prod(values)
    raise ValueError(f"confidence aggregation {how!r}: use min, max, mean or prod")


@torch.inference_mode()
def replay(
    prediction: PredictionNet,
    joint: Joint,
    start: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    projected: torch.Tensor,
    tokens: list[int],
    frames: list[int],
    method: ConfidenceMethod = ConfidenceMethod(),
) -> list[float]:
    """One hypothesis's token confidences: `projected` (T, J) its encoder output through the joint's encoder
    projection, `start` the prediction state and projected output after the start symbol (`start_state` for one
    row), `tokens` and the encoder frame of each. The prediction net runs over the tokens once (teacher forcing),
    the joint once over the (frame, prediction) pairs the greedy steps met."""
    if not tokens:
        return []
    h, c, g0 = start
    ids = torch.tensor(tokens[:-1], device=projected.device, dtype=torch.long)
    outputs = [g0[0]]
    if len(tokens) > 1:
        embedded = prediction.prediction.embed(ids)[:, None]  # (N - 1, 1, H): one row, N - 1 steps
        out, _ = prediction.prediction.dec_rnn.lstm(embedded, (h, c))
        outputs.append(joint.project_prediction(out[:, 0].to(g0.dtype)))
    g = torch.cat([o.reshape(-1, g0.shape[-1]) for o in outputs])  # (N, J): the output before each token
    f = projected[torch.tensor(frames, device=projected.device, dtype=torch.long)]  # (N, J)
    logits = joint.logits(f, g)[:, : joint.num_token_logits].float()
    return measure(torch.log_softmax(logits, dim=-1), method).tolist()


def word_confidences(pieces: list[str], texts: list[str], tokens: list[int], confidences: list[float], how: str):
    """NeMo's SentencePiece word split of token confidences (`_aggregate_token_confidence_subwords_sentencepiece`):
    a word starts at a piece whose text differs from the piece (a `▁` piece, or `<unk>`) or after `<unk>`; a lone
    `▁` before a word's start loses its confidence. -> one confidence a word."""
    words, start, previous = [], 0, None
    for i, token in enumerate(tokens):
        piece, text = pieces[token], texts[token]
        if (piece != text or previous == "<unk>") and i > start:
            if pieces[tokens[i - 1]] != "\u2581":
                words.append(aggregate(confidences[start:i], how))
            start = i
        previous = piece
    if tokens and pieces[tokens[-1]] != "\u2581":
        words.append(aggregate(confidences[start:], how))
    return words
