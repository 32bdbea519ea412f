"""FastConformer encoder (NeMo's ConformerEncoder with dw_striding subsampling, rel_pos attention).

Parameter names follow NeMo's state dict (`encoder.pre_encode.conv.0.weight`, ...), so a
checkpoint loads with a strict `load_state_dict`. Padded frames are masked at every stage,
so a clip's output does not depend on what it is batched with.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import EncoderConfig

_KERNEL, _STRIDE, _PAD = 3, 2, 1  # subsampling convolutions
_MASKED_SCORE = -10000.0  # NeMo's fill value for masked attention scores


def subsampled_lengths(lengths: torch.Tensor, factor: int) -> torch.Tensor:
    """Frames after `log2(factor)` stride-2 convolutions: floor((L + 2 - 3) / 2 + 1) each."""
    for _ in range(int(math.log2(factor))):
        lengths = torch.div(lengths + 2 * _PAD - _KERNEL, _STRIDE, rounding_mode="floor") + 1
    return lengths


class Subsampling(nn.Module):
    """dw_striding: Conv2d(1, C, 3, s2) + ReLU, then [depthwise s2, pointwise, ReLU] x (log2(factor) - 1)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        channels = cfg.subsampling_channels
        layers: list[nn.Module] = [nn.Conv2d(1, channels, _KERNEL, _STRIDE, _PAD), nn.ReLU()]
        for _ in range(int(math.log2(cfg.subsampling_factor)) - 1):
            layers += [
                nn.Conv2d(channels, channels, _KERNEL, _STRIDE, _PAD, groups=channels),
                nn.Conv2d(channels, channels, 1),
                nn.ReLU(),
            ]
        self.conv = nn.Sequential(*layers)
        freq = subsampled_lengths(torch.tensor(cfg.n_mels), cfg.subsampling_factor).item()
        self.out = nn.Linear(channels * freq, cfg.d_model)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = x.unsqueeze(1)  # (B, 1, T, F)
        for layer in self.conv:
            x = _mask_time(x, lengths)
            x = layer(x)
            if isinstance(layer, nn.Conv2d) and layer.stride != (1, 1):
                lengths = torch.div(lengths + 2 * _PAD - _KERNEL, _STRIDE, rounding_mode="floor") + 1
        x = _mask_time(x, lengths)  # (B, C, T', F')
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f)), lengths  # (B, T', D)


def _mask_time(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    valid = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]  # (B, T)
    return x * valid[:, None, :, None].to(x.dtype)


def relative_positions(length: int, d_model: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Sinusoids for relative positions (length - 1) ... -(length - 1): (1, 2 * length - 1, D)."""
    positions = torch.arange(length - 1, -length, -1, dtype=torch.float32, device=device)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=device) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(positions.shape[0], d_model, device=device)
    pe[:, 0::2] = torch.sin(positions * div)
    pe[:, 1::2] = torch.cos(positions * div)
    return pe[None].to(dtype)


class FeedForward(nn.Module):
    def __init__(self, d_model: int, expansion: int, bias: bool):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_model * expansion, bias=bias)
        self.linear2 = nn.Linear(d_model * expansion, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(F.silu(self.linear1(x)))


class RelPositionAttention(nn.Module):
    """Multi-head attention with Transformer-XL relative positions and untied biases u, v."""

    def __init__(self, d_model: int, n_heads: int, bias: bool):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.linear_q = nn.Linear(d_model, d_model, bias=bias)
        self.linear_k = nn.Linear(d_model, d_model, bias=bias)
        self.linear_v = nn.Linear(d_model, d_model, bias=bias)
        self.linear_out = nn.Linear(d_model, d_model, bias=bias)
        self.linear_pos = nn.Linear(d_model, d_model, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(n_heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(n_heads, self.d_k))

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor, att_mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h, d_k = self.n_heads, self.d_k
        q = self.linear_q(x).view(b, t, h, d_k)  # (B, T, H, d_k)
        k = self.linear_k(x).view(b, t, h, d_k).transpose(1, 2)  # (B, H, T, d_k)
        v = self.linear_v(x).view(b, t, h, d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(1, -1, h, d_k).transpose(1, 2)  # (1, H, 2T-1, d_k)
        q_u = (q + self.pos_bias_u).transpose(1, 2)  # (B, H, T, d_k)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        scores_bd = _rel_shift(torch.matmul(q_v, p.transpose(-2, -1)))[..., :t]  # (B, H, T, T)
        scores_ac = torch.matmul(q_u, k.transpose(-2, -1))
        scores = (scores_ac + scores_bd) / math.sqrt(d_k)
        mask = att_mask[:, None]  # (B, 1, T, T), True = masked
        attn = torch.softmax(scores.masked_fill(mask, _MASKED_SCORE), dim=-1).masked_fill(mask, 0.0)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, h * d_k)
        return self.linear_out(out)


def _rel_shift(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, 2T-1) scores over relative positions -> aligned so column j is key j."""
    b, h, t, p = x.shape
    x = F.pad(x, (1, 0)).view(b, h, p + 1, t)
    return x[:, :, 1:].reshape(b, h, t, p)


class ConvModule(nn.Module):
    def __init__(self, d_model: int, kernel: int, bias: bool):
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(d_model, 2 * d_model, 1, bias=bias)
        self.depthwise_conv = nn.Conv1d(d_model, d_model, kernel, padding=(kernel - 1) // 2, groups=d_model, bias=bias)
        self.batch_norm = nn.BatchNorm1d(d_model)
        self.pointwise_conv2 = nn.Conv1d(d_model, d_model, 1, bias=bias)

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        x = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)  # (B, D, T)
        x = x.masked_fill(pad_mask[:, None, :], 0.0)
        x = F.silu(self.batch_norm(self.depthwise_conv(x)))
        return self.pointwise_conv2(x).transpose(1, 2)  # (B, T, D)


class ConformerLayer(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        d, bias = cfg.d_model, cfg.use_bias
        self.norm_feed_forward1 = nn.LayerNorm(d)
        self.feed_forward1 = FeedForward(d, cfg.ff_expansion, bias)
        self.norm_self_att = nn.LayerNorm(d)
        self.self_attn = RelPositionAttention(d, cfg.n_heads, bias)
        self.norm_conv = nn.LayerNorm(d)
        self.conv = ConvModule(d, cfg.conv_kernel, bias)
        self.norm_feed_forward2 = nn.LayerNorm(d)
        self.feed_forward2 = FeedForward(d, cfg.ff_expansion, bias)
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x, pos_emb, att_mask, pad_mask):
        x = x + 0.5 * self.feed_forward1(self.norm_feed_forward1(x))
        x = x + self.self_attn(self.norm_self_att(x), pos_emb, att_mask)
        x = x + self.conv(self.norm_conv(x), pad_mask)
        x = x + 0.5 * self.feed_forward2(self.norm_feed_forward2(x))
        return self.norm_out(x)


class FastConformer(nn.Module):
    """(B, n_mels, T) features -> (B, T', D) encoder output and (B,) lengths, T' ~ T / factor."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.pre_encode = Subsampling(cfg)
        self.layers = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.n_layers))

    def forward(self, features: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, lengths = self.pre_encode(features.transpose(1, 2), lengths)  # (B, T', D)
        if self.cfg.xscaling:
            x = x * math.sqrt(self.cfg.d_model)
        t = x.shape[1]
        pos_emb = relative_positions(t, self.cfg.d_model, x.device, x.dtype)
        pad_mask = torch.arange(t, device=x.device)[None, :] >= lengths[:, None]  # (B, T') True = padding
        att_mask = pad_mask[:, None, :] | pad_mask[:, :, None]  # (B, T', T')
        for layer in self.layers:
            x = layer(x, pos_emb, att_mask, pad_mask)
        return x, lengths
