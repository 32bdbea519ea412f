"""Shallow fusion of token models into greedy decoding, as NeMo's label-looping greedy decoders do it with
`fusion_models` and `fusion_models_alpha` (`tdt_label_looping.py`, `rnnt_label_looping.py`): the joint alone decides
blank or not (argmax over tokens and blank); where it picks a token, the token is the argmax over the V non-blank
tokens of the joint's logits plus, model by model, weight x score; each model's state follows the emitted token, and
blank never moves it. NeMo's CPU joint returns log-softmaxed logits and its CUDA joint raw ones: a row's constant
shift, the same argmax. Durations (TDT) stay the joint's. The sum is float32 whatever the joint's dtype (NeMo rounds
the weighted scores to the logits' dtype: in 16 bits a near tie may break the other way).
"""

from __future__ import annotations

import math

import torch

from graphscribe.model.ngram import TokenModel


class Fusion:
    """Token models fused into greedy decoding (NeMo's `fusion_models` with their `fusion_models_alpha`), and each
    row's state in each: static, written in place by `decode_step` (a captured graph replays it)."""

    def __init__(self, models: list[tuple[TokenModel, float]], n: int, device: torch.device):
        self.models = [(model.to_device(device), float(weight)) for model, weight in models]
        self.states = torch.zeros(len(models), n, dtype=torch.long, device=device)  # (K, N)
        self.reset()

    def reset(self) -> None:
        for state, (model, _) in zip(self.states, self.models):
            model.fill_start(state)

    def carry_in(self, carried: torch.Tensor) -> None:
        """carried (B, K): each model's state of the first B rows at the end of their chunk before (a stream's)."""
        for k, (model, _) in enumerate(self.models):
            self.states[k, : carried.shape[0]].copy_(model.carried_in(carried[:, k]))

    def carry_out(self, b: int) -> torch.Tensor:
        """(b, K): each model's state of the first b rows, to go on from at the next chunk (`carry_in`)."""
        out = self.states[:, :b].T.clone()
        for k, (model, _) in enumerate(self.models):  # `row_boosting.RowTrees`: relative to the row's own tree
            out[:, k] = model.carried_out(out[:, k])
        return out

    def choose(self, logits: torch.Tensor, at: torch.Tensor, token: torch.Tensor, blank_id: int) -> torch.Tensor:
        """logits (N, W, V + 1 + D), at (N, 1) the landing position, token (N,) the joint's choice there -> the
        fused token (blank stays blank)."""
        row = logits.gather(1, at[:, :, None].expand(-1, 1, logits.shape[-1]))[:, 0, :blank_id].float()  # (N, V)
        for scores in self.scores():
            row = row + scores  # NeMo: scores *= alpha, then logits += scores, model by model
        # where a row emits, its landing position holds a token (the blank chain ends there); blank elsewhere keeps
        # the unused record slot of a row that does not emit as it was
        return torch.where(token == blank_id, token, row.argmax(dim=-1))

    def scores(self, out: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each model's scores from each row's state times its weight (N, V), written into `out[k]` (K, N, V) if
        given."""
        return [
            model.scores(state, weight, None if out is None else out[k])
            for k, (state, (model, weight)) in enumerate(zip(self.states, self.models))
        ]

    def move(self, token: torch.Tensor, emit: torch.Tensor) -> None:
        """Each row that emits `token` moves to that token's next state; the others stay. Only the emitted token's
        next state is looked up: a step writes no (N, V) table of them."""
        for state, (model, _) in zip(self.states, self.models):
            model.move(state, token, emit)


def fusion_models(
    lm: str | None,
    lm_weight: float,
    hotwords: tuple[str, ...],
    boost: float,
    tokenizer,
    vocab_size: int,
    device: torch.device,
) -> list[tuple[TokenModel, float]]:
    """The models `RunOptions` asks for, in NeMo's order (the LM, then the boosting tree), with their weights:
    `lm` an ARPA file or NeMo's saved NGPU-LM (`.nemo`) (ArpaError), `hotwords` one phrase each, with an optional
    ':score' (HotwordError)."""
    from graphscribe.io.hotwords import parse_hotwords, parse_phrase
    from graphscribe.model.boosting import boosting_model
    from graphscribe.model.ngpulm import load_lm

    for name, weight in (("--lm-weight", lm_weight), ("--boost", boost)):
        if not math.isfinite(weight):
            raise ValueError(f"{name} {weight}: a finite number")
    models = []
    if lm is not None:
        models.append((load_lm(lm, vocab_size, device), lm_weight))
    # a str is a comma-separated list (as --hotwords takes it), not a sequence of one-letter phrases
    phrases = parse_hotwords(hotwords) if isinstance(hotwords, str) else [parse_phrase(item) for item in hotwords]
    if phrases:
        models.append((boosting_model(phrases, tokenizer, vocab_size, device), boost))
    return models
