"""Token and word confidence as NeMo computes it (tests/fixtures/nemo-confidence/README.md says what and where).

NeMo measures the distribution of the decode step that emitted a token: the softmax over vocabulary and blank (a
TDT model's duration logits left out), through one of its measures (the default: Tsallis entropy, alpha 0.33,
exponential norm), and a word takes the minimum of its tokens'. Nothing of it is needed while decoding: a
hypothesis says which token came at which encoder frame, and each token's step read that frame and the
prediction net's output after the tokens before it. A greedy decoder made for confidences keeps that output
beside each token (`DecodeBuffers.keep_prediction`, one copy a step), and `measured` runs the joint on those pairs
afterwards; `replay_batch` recomputes the outputs too (the prediction net over each row's tokens), for hypotheses
decoded without them (a request that asks on its own, the beam search). Greedy decoding's choices stay as they
are. With an LM or hotwords fused into the decoding, NeMo measures the joint's own logits before the fused scores
(`unbiased_logits`): ours too.
"""

from __future__ import annotations

import math

import torch

from graphscribe.io.options import ConfidenceMethod, aggregate
from graphscribe.model.heads import Joint, PredictionNet

__all__ = ["ConfidenceMethod", "check_method", "measure", "measured", "replay", "replay_batch", "word_confidences"]


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


def check_method(method: ConfidenceMethod) -> None:
    """ValueError naming what is wrong with `method` (its measure and aggregation tried on a uniform distribution)."""
    measure(torch.zeros(2), method)
    aggregate([1.0], method.aggregation)


@torch.inference_mode()
def replay_batch(
    prediction: PredictionNet,
    joint: Joint,
    start: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    encoded: torch.Tensor,
    tokens: list[list[int]],
    frames: list[list[int]],
    method: ConfidenceMethod = ConfidenceMethod(),
) -> list[list[float]]:
    """A batch's token confidences, one list a row: `encoded` (B, T, D) its encoder output, `start` the prediction
    state and projected output after the start symbol for B rows (`GreedyDecoder.start_state`), each row's tokens
    and the encoder frame of each. The prediction net runs once over all rows' tokens (teacher forcing, padded),
    the encoder projection over the N frames the tokens came at only, the joint once over the N (frame,
    prediction) pairs: a handful of batched calls, whatever the number of tokens."""
    counts = [len(t) for t in tokens]
    if not any(counts):
        return [[] for _ in tokens]
    device = encoded.device
    live = [b for b, n in enumerate(counts) if n]  # rows with tokens
    rows = torch.tensor([k for k, b in enumerate(live) for _ in range(counts[b])], device=device)  # (N,)
    steps = torch.tensor([i for b in live for i in range(counts[b])], device=device)  # (N,) token index in its row
    at = torch.tensor([f for b in live for f in frames[b]], device=device)  # (N,) encoder frames
    f = joint.project_encoder(encoded[torch.tensor(live, device=device)[rows], at])  # (N, J)
    h, c, g0 = start
    g = g0[live][:, None]  # (R, 1, J): before each row's first token
    longest = max(counts)
    if longest > 1:
        ids = torch.zeros(len(live), longest - 1, dtype=torch.long)  # (R, M - 1): each row's tokens but its last
        for k, b in enumerate(live):
            ids[k, : counts[b] - 1] = torch.tensor(tokens[b][:-1])
        embedded = prediction.prediction.embed(ids.to(device).T)  # (M - 1, R, H): time first, as the LSTM takes it
        out, _ = prediction.prediction.dec_rnn.lstm(embedded, (h[:, live], c[:, live]))
        g = torch.cat([g, joint.project_prediction(out.to(g0.dtype)).transpose(0, 1)], dim=1)  # (R, M, J)
    return _split(joint, f, g[rows, steps], counts, method)


def measured(
    joint: Joint,
    encoded: torch.Tensor,
    predictions: list[torch.Tensor],
    frames: list[list[int]],
    method: ConfidenceMethod = ConfidenceMethod(),
) -> list[list[float]]:
    """A batch's token confidences from what its decode kept (`DecodeBuffers.keep_prediction`): each row's
    prediction output at each token's step (tokens, J) and the token's encoder frame; `replay_batch`'s joint
    without its prediction net, whose host time (cuDNN's LSTM step by step over the longest row's tokens) is as
    long as the decode's."""
    counts = [len(f) for f in frames]
    if not any(counts):
        return [[] for _ in frames]
    device = encoded.device
    rows = torch.tensor([b for b, n in enumerate(counts) for _ in range(n)], device=device)  # (N,)
    at = torch.tensor([f for row in frames for f in row], device=device)  # (N,)
    g = torch.cat([p for p, n in zip(predictions, counts) if n])  # (N, J)
    return _split(joint, joint.project_encoder(encoded[rows, at]), g, counts, method)


def _split(joint: Joint, f: torch.Tensor, g: torch.Tensor, counts: list[int], method) -> list[list[float]]:
    """The joint on N (frame, prediction) pairs, measured -> the values, one list a row of `counts` tokens."""
    logits = joint.logits(f, g)[:, : joint.num_token_logits].float()  # (N, v)
    values = measure(torch.log_softmax(logits, dim=-1), method).tolist()
    result, taken = [], 0
    for n in counts:
        result.append(values[taken : taken + n])
        taken += n
    return result


def replay(
    prediction: PredictionNet,
    joint: Joint,
    start: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    encoded: torch.Tensor,
    tokens: list[int],
    frames: list[int],
    method: ConfidenceMethod = ConfidenceMethod(),
) -> list[float]:
    """One hypothesis's token confidences: `encoded` (T, D) its encoder output, `start` for one row, its tokens and
    their frames (`replay_batch` of one row)."""
    return replay_batch(prediction, joint, start, encoded[None], [tokens], [frames], method)[0]


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
