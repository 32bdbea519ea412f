"""Transducer heads: the prediction network (embedding + LSTM) and the joint network.

Names follow NeMo's state dict: `decoder.prediction.embed`, `decoder.prediction.dec_rnn.lstm`,
`joint.enc`, `joint.pred`, `joint.joint_net.2` (`joint_net.1` where the model was trained
without joint dropout: NeMo adds the Dropout layer only for `jointnet.dropout` > 0).
"""

from __future__ import annotations

import torch
from torch import nn

from graphscribe.io.config import JointConfig, PredictionConfig


class _LSTMWrapper(nn.Module):
    def __init__(self, cfg: PredictionConfig):
        super().__init__()
        self.lstm = nn.LSTM(cfg.hidden, cfg.hidden, num_layers=cfg.layers)


class _Prediction(nn.Module):
    def __init__(self, cfg: PredictionConfig):
        super().__init__()
        # blank_as_pad: the blank id is the padding row, so the start input embeds to zeros.
        self.embed = nn.Embedding(cfg.vocab_size + 1, cfg.hidden, padding_idx=cfg.vocab_size)
        self.dec_rnn = _LSTMWrapper(cfg)


class PredictionNet(nn.Module):
    """Label history -> prediction output. One step: (N,) tokens, state -> (N, H) output, new state."""

    def __init__(self, cfg: PredictionConfig):
        super().__init__()
        self.cfg = cfg
        self.prediction = _Prediction(cfg)

    def initial_state(self, n: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (self.cfg.layers, n, self.cfg.hidden)  # (L, N, H)
        return torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype)

    def step(self, tokens: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        """tokens (N,), h and c (L, N, H) -> output (N, H), h' (L, N, H), c' (L, N, H)."""
        x = self.prediction.embed(tokens)[None]  # (1, N, H)
        out, (h, c) = self.prediction.dec_rnn.lstm(x, (h, c))
        return out[0], h, c


class Joint(nn.Module):
    """logits = out(relu(enc(f) + pred(g))): token logits (blank last), then TDT duration logits."""

    def __init__(self, cfg: JointConfig):
        super().__init__()
        self.cfg = cfg
        self.enc = nn.Linear(cfg.encoder_hidden, cfg.hidden)
        self.pred = nn.Linear(cfg.pred_hidden, cfg.hidden)
        out = nn.Linear(cfg.hidden, cfg.vocab_size + 1 + cfg.num_durations)
        # NeMo's RNNTJoint._joint_net_modules: [activation] + ([Dropout] if dropout else []) + [Linear]
        self.joint_net = (
            nn.Sequential(nn.ReLU(), nn.Identity(), out) if cfg.dropout_layer else nn.Sequential(nn.ReLU(), out)
        )

    @property
    def num_token_logits(self) -> int:
        return self.cfg.vocab_size + 1

    def project_encoder(self, encoded: torch.Tensor) -> torch.Tensor:
        return self.enc(encoded)

    def project_prediction(self, predicted: torch.Tensor) -> torch.Tensor:
        return self.pred(predicted)

    def logits(self, f: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Projected encoder frames f (..., J) and projected prediction g (..., J) -> (..., V + 1 + D)."""
        return self.joint_net(f + g)
