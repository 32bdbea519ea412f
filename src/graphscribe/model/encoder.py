"""FastConformer encoder (NeMo's ConformerEncoder with dw_striding subsampling, rel_pos or local attention).

Parameter names follow NeMo's state dict (`encoder.pre_encode.conv.0.weight`, ...), so a
checkpoint loads with a strict `load_state_dict`. Padded frames are masked at every stage,
so a clip's output depends on its batch only through the rounding of products over the padded length.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from graphscribe.io.config import EncoderConfig, ModelConfig
from graphscribe.model.features import CHUNK_SAMPLES as _FEATURE_CHUNK_SAMPLES
from graphscribe.model.packing import PackedFront, Packing
from graphscribe.model.subsampling import (
    CONV_BYTES,
    MIN_CHUNK,
    Subsampling,
    conv_bytes_per_frame,
    kernels_for,
    subsampled_lengths,
)

log = logging.getLogger(__name__)

_MASKED_SCORE = -10000.0  # NeMo's fill value for masked attention scores
_GROUP_BYTES = 256 * 2**20  # attention: query rows are grouped so that one group's bias stays near this per batch row
_EXACT_TEMPORARIES = (
    8  # float32 attention: (B, H, n, T)-sized tensors alive at once (position term and its shift, scores, ...)
)


def sinusoids(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """NeMo's position table for relative positions (P,) -> (P, D) float32: sin on even, cos on odd channels."""
    positions = positions.to(torch.float32)[:, None]
    div = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device) * -(math.log(10000.0) / d_model)
    )
    pe = torch.zeros(positions.shape[0], d_model, device=positions.device)
    pe[:, 0::2] = torch.sin(positions * div)
    pe[:, 1::2] = torch.cos(positions * div)
    return pe


def relative_positions(length: int, d_model: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Full attention: sinusoids for relative positions (length - 1) ... -(length - 1): (2 * length - 1, D)."""
    return sinusoids(torch.arange(length - 1, -length, -1, device=device), d_model).to(dtype)


def window_positions(window: tuple[int, int], d_model: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Local attention (NeMo's LocalAttRelPositionalEncoding): positions left ... -right: (left + right + 1, D)."""
    left, right = window
    return sinusoids(torch.arange(left, -right - 1, -1, device=device), d_model).to(dtype)


@dataclass
class Padding:
    """Which frames of a padded batch are real, and the masks the layers make of it: made once a forward, not
    once a layer (each mask is a few kernel launches, and a small batch's encoder waits on its host).

    A row holds one clip, or several laid end to end (`Packing`): attention then sees only the keys of its own
    clip (`segments`)."""

    valid: torch.Tensor  # (B, T) True = frame, False = padding
    dtype: torch.dtype  # the activations'

    @classmethod
    def of_segments(cls, segments: torch.Tensor, dtype: torch.dtype) -> "Padding":
        """Packed rows: (B, T) the clip of each frame, -1 for padding."""
        padding = cls(segments >= 0, dtype)
        padding.__dict__["segments"] = segments
        return padding

    @cached_property
    def segments(self) -> torch.Tensor:  # (B, T) int64 a frame's clip, -1 padding; unpacked: 0 on every frame
        return self.valid.long() - 1

    @cached_property
    def keep(self) -> torch.Tensor:  # (B, 1, T, 1) 1.0 for a frame's query row, 0.0 for padding
        return self.valid[:, None, :, None].to(self.dtype)

    @cached_property
    def pad(self) -> torch.Tensor:  # (B, 1, T) True = padding, for (B, D, T) activations
        return ~self.valid[:, None, :]

    @cached_property
    def pairs(self) -> torch.Tensor:  # (B, 1, T, T) True = query or key is padding, or they are of two clips
        return _other_clip(self.segments[:, None, :, None], self.segments[:, None, None, :])


class FeedForward(nn.Module):
    def __init__(self, d_model: int, expansion: int, bias: bool):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_model * expansion, bias=bias)
        self.linear2 = nn.Linear(d_model * expansion, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(F.silu(self.linear1(x)))


class RelPositionAttention(nn.Module):
    """Multi-head attention with Transformer-XL relative positions and untied biases u, v.

    Two kinds, one set of weights: full attention (NeMo's rel_pos: every frame sees every frame)
    and local attention (NeMo's rel_pos_local_attn, `window` = (left, right) frames). A group of query
    rows at a time, so no (B, H, T, T) tensor is made whole for a long input: through
    `scaled_dot_product_attention` with the positional term as an additive bias, except full attention
    in float32, which keeps NeMo's own products (see `full_attention`).
    """

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

    def forward(
        self, x: torch.Tensor, pos_emb: torch.Tensor, padding: Padding, window: tuple[int, int] | None
    ) -> torch.Tensor:
        """x (B, T, D), pos_emb (P, D) from `relative_positions` or `window_positions`, padding of the batch."""
        b, t, _ = x.shape
        h, d_k = self.n_heads, self.d_k
        q = self.linear_q(x).view(b, t, h, d_k).transpose(1, 2)  # (B, H, T, d_k)
        k = self.linear_k(x).view(b, t, h, d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t, h, d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(-1, h, d_k).transpose(0, 1)  # (H, P, d_k)
        q_u = q + self.pos_bias_u[:, None]  # content term's query
        q_v = q + self.pos_bias_v[:, None]  # position term's query
        if window is None:
            out = full_attention(q_u, q_v, k, v, p, padding)
        else:
            out = local_attention(q_u, q_v, k, v, p, padding.valid, window)
        out = out * padding.keep  # NeMo zeroes the probabilities of padded queries
        return self.linear_out(out.transpose(1, 2).reshape(b, t, h * d_k))


def full_attention(q_u, q_v, k, v, p, padding: Padding) -> torch.Tensor:
    """NeMo's rel_pos: softmax((q_u k^T + rel_shift(q_v p^T)) / sqrt(d_k)), padded keys (and those of another clip
    of a packed row) at -10000.

    q_u, q_v, k, v: (B, H, T, d_k); p: (H, 2T - 1, d_k) for positions T-1 ... -(T-1); padding: the batch's.
    16-bit: `scaled_dot_product_attention` with the position term as an additive bias. float32: NeMo's own
    products and masked softmax, so that float32 output is NeMo's arithmetic, not another float32 rounding
    of it (SDPA's fused kernel sums in its own order). Either way a group of query rows at a time, the groups sized
    per row of the batch (a clip's rounding must not depend on its batch). -> (B, H, T, d_k)
    """
    b, h, t, d_k = q_u.shape
    scale = 1.0 / math.sqrt(d_k)
    exact = q_u.dtype == torch.float32
    width = _aligned(t)
    per_row = h * (_EXACT_TEMPORARIES * t if exact else width) * q_u.element_size()  # bytes a query row needs
    rows = max(1, min(t, _GROUP_BYTES // per_row))
    if exact and rows >= t:
        return _full_attention_nemo(q_u, q_v, k, v, p, padding)  # NeMo's very shapes
    segments = padding.segments
    out = torch.empty_like(q_u)
    for start in range(0, t, rows):
        end = min(t, start + rows)
        # query i, key j has position i - j, row (t - 1) - (i - j) of p: this group needs rows t - end ... 2t - 2 - start
        p_rows = p[:, t - end : 2 * t - 1 - start]  # (H, t + n - 1, d_k)
        if exact:
            raw = torch.matmul(q_v[:, :, start:end], p_rows.transpose(-2, -1))  # (B, H, n, t + n - 1)
            scores = (torch.matmul(q_u[:, :, start:end], k.transpose(-2, -1)) + shifted_rows(raw, t)) / math.sqrt(d_k)
            masked = _other_clip(segments[:, None, start:end, None], segments[:, None, None, :])  # (B, 1, n, T)
            attn = torch.softmax(scores.masked_fill(masked, _MASKED_SCORE), dim=-1).masked_fill(masked, 0.0)
            out[:, :, start:end] = torch.matmul(attn, v)
            continue
        bias = _position_bias(q_v[:, :, start:end], p_rows, segments, start, scale, width)
        out[:, :, start:end] = _attend(q_u[:, :, start:end], k, v, bias, scale)
    return out


def shifted_rows(raw: torch.Tensor, t: int) -> torch.Tensor:
    """(B, H, n, t + n - 1) contiguous position term of n query rows -> (B, H, n, t) view, row r's key j at
    column j + n - 1 - r."""
    b, h, n, cols = raw.shape
    return raw.as_strided((b, h, n, t), (h * n * cols, n * cols, cols - 1, 1), raw.storage_offset() + n - 1)


def _position_bias(
    q_v: torch.Tensor, p_rows: torch.Tensor, segments: torch.Tensor, start: int, scale: float, width: int
) -> torch.Tensor:
    """16-bit full attention's additive bias for query rows start ... start + n - 1: the shifted position term
    times `scale`, at -10000 where `_other_clip` masks. q_v (B, H, n, d_k), p_rows (H, t + n - 1, d_k), segments
    (B, t) (`Padding.segments`) -> (B, H, n, t), a view of rows `width` long (aligned for the fused attention
    kernels)."""
    b, h, n, d_k = q_v.shape
    t = segments.shape[1]
    kernels = kernels_for(q_v)
    if kernels is not None:  # one product per head (no broadcast copy of the positions), then one fused pass
        raw = torch.bmm(q_v.transpose(0, 1).reshape(h, b * n, d_k), p_rows.transpose(-2, -1))  # (H, B n, t + n - 1)
        return kernels.position_bias(raw.view(h, b, n, t + n - 1), segments, start, scale, width, _MASKED_SCORE)
    raw = torch.matmul(q_v, p_rows.transpose(-2, -1))  # (B, H, n, t + n - 1)
    bias = q_v.new_empty(b, h, n, width)[..., :t]
    torch.mul(shifted_rows(raw, t), scale, out=bias)
    return bias.masked_fill_(
        _other_clip(segments[:, None, start : start + n, None], segments[:, None, None, :]), _MASKED_SCORE
    )


def _other_clip(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """True where a query may not see a key: either is padding, or they are frames of two clips of a packed row
    (segment ids, broadcast against each other). A padded query sees no key: its row is zeroed after."""
    return (query != key) | (query < 0)


def local_attention(q_u, q_v, k, v, p, valid, window: tuple[int, int]) -> torch.Tensor:
    """NeMo's rel_pos_local_attn (RelPositionMultiHeadAttentionLongformer, no global tokens).

    Query i sees keys i - left ... i + right. NeMo lays the scores out as 2w + 1 diagonals
    (w = max(left, right), key offset c - w in column c) and adds the position term
    q_v p_c^T of LocalAttRelPositionalEncoding's rows (positions left ... -right) to columns
    0 ... left - 1 and 2w - right ... 2w: the right positions when left == right, shifted ones
    otherwise; we add the same rows to the same columns. Columns outside w - left ... w + right
    and padded keys get no probability (NeMo: -10000 / -inf, i.e. zero after softmax).

    q_u, q_v, k, v: (B, H, T, d_k); p: (H, left + right + 1, d_k); valid: (B, T). -> (B, H, T, d_k)
    Blocks of m queries attend to their m + 2w keys in one fused call per group of blocks:
    time and memory linear in T.
    """
    left, right = window
    b, h, t, d_k = q_u.shape
    w = max(left, right)
    scale = 1.0 / math.sqrt(d_k)
    device = q_u.device
    # the position row NeMo adds to each diagonal column (left + right + 1: none)
    column_row = torch.full((2 * w + 1,), left + right + 1, dtype=torch.long, device=device)
    column_row[:left] = torch.arange(left, device=device)
    column_row[2 * w - right :] = torch.arange(left, left + right + 1, device=device)
    p_columns = torch.cat([p, p.new_zeros(h, 1, d_k)], dim=1)[:, column_row]  # (H, 2w + 1, d_k)
    offsets = torch.arange(-w, w + 1, device=device)
    column_seen = (offsets >= -left) & (offsets <= right)  # (2w + 1,)

    m = min(t, max(16, 2 * w))  # queries per block
    blocks = -(-t // m)
    n = m + 2 * w  # keys per block
    width = _aligned(n)
    padded = blocks * m
    q_u = F.pad(q_u, (0, 0, 0, padded - t))
    q_v = F.pad(q_v, (0, 0, 0, padded - t))
    k = F.pad(k, (0, 0, w, padded - t + w))  # key j at row j + w
    v = F.pad(v, (0, 0, w, padded - t + w))
    lengths = valid.sum(dim=1)  # (B,)
    per_block = h * m * (width + 3 * w + 2 * d_k) * q_u.element_size()  # per row of the batch, as above
    group = max(1, min(blocks, _GROUP_BYTES // per_block))
    out = q_u.new_empty(b, h, padded, d_k)
    for first in range(0, blocks, group):
        g = min(group, blocks - first)
        start, end = first * m, (first + g) * m
        diagonals = torch.matmul(q_v[:, :, start:end], p_columns.transpose(-2, -1)) * scale  # (B, H, g m, 2w + 1)
        keys = torch.arange(start - w, end - w, device=device)[:, None] + torch.arange(2 * w + 1, device=device)
        seen = column_seen & (keys >= 0) & (keys < lengths[:, None, None])  # (B, g m, 2w + 1)
        diagonals.masked_fill_(~seen[:, None], _MASKED_SCORE)
        bias = diagonals.new_full((b, h, g, m, width), _MASKED_SCORE)
        # diagonal column c of query row r is key r + c of the block's n keys
        bias.as_strided(
            (b, h, g, m, 2 * w + 1), (h * g * m * width, g * m * width, m * width, width + 1, 1), bias.storage_offset()
        ).copy_(diagonals.view(b, h, g, m, 2 * w + 1))
        del diagonals
        key_blocks = k[:, :, start : end + 2 * w].unfold(2, n, m).transpose(-2, -1).reshape(b, h * g, n, d_k)
        value_blocks = v[:, :, start : end + 2 * w].unfold(2, n, m).transpose(-2, -1).reshape(b, h * g, n, d_k)
        queries = q_u[:, :, start:end].reshape(b, h * g, m, d_k)
        mask = bias.view(b, h * g, m, width)[..., :n]
        out[:, :, start:end] = _attend(queries, key_blocks, value_blocks, mask, scale).reshape(b, h, g * m, d_k)
    return out[:, :, :t]


# scaled_dot_product_attention's kernels with an additive bias on CUDA, cuDNN's left out: it builds a graph for
# every new shape (about 70 ms of host time each on the H100), and a folder gives the encoder
# a new shape almost every batch. The memory-efficient kernel takes any shape as it comes.
_CUDA_BIAS_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T scale + bias) v: (..., n, d_k) queries, (..., m, d_k) keys and values, (..., n, m) bias."""
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    with sdpa_kernel(_CUDA_BIAS_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def _aligned(n: int) -> int:
    """Row length for an attention bias: a multiple of 16 elements, as the fused SDPA kernels want."""
    return -(-n // 16) * 16


def _full_attention_nemo(q_u, q_v, k, v, p, padding: Padding) -> torch.Tensor:
    """NeMo's own formulation, all query rows at once (several (B, H, T, T) tensors): float32 inputs that fit."""
    t = q_u.shape[2]
    scores = torch.matmul(q_u, k.transpose(-2, -1)) + _rel_shift(torch.matmul(q_v, p.transpose(-2, -1)))[..., :t]
    mask = padding.pairs  # (B, 1, T, T) True = masked
    attn = torch.softmax((scores / math.sqrt(q_u.shape[-1])).masked_fill(mask, _MASKED_SCORE), dim=-1)
    return torch.matmul(attn.masked_fill(mask, 0.0), v)


def _rel_shift(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, 2T-1) scores over relative positions -> aligned so column j is key j."""
    b, h, t, p = x.shape
    x = F.pad(x, (1, 0)).view(b, h, p + 1, t)
    return x[:, :, 1:].reshape(b, h, t, p)


class ConvModule(nn.Module):
    """NeMo's ConformerConvolution. A cache-aware streaming model's (`causal`) depthwise convolution sees only the
    past (K - 1 frames) and its norm is a LayerNorm over channels, under NeMo's name `batch_norm`; that model runs
    through `model.cache_aware`, which uses these weights."""

    def __init__(self, d_model: int, kernel: int, bias: bool, causal: bool = False, layer_norm: bool = False):
        super().__init__()
        self.pointwise_conv1 = nn.Conv1d(d_model, 2 * d_model, 1, bias=bias)
        padding = 0 if causal else (kernel - 1) // 2
        self.depthwise_conv = nn.Conv1d(d_model, d_model, kernel, padding=padding, groups=d_model, bias=bias)
        self.batch_norm = nn.LayerNorm(d_model) if layer_norm else nn.BatchNorm1d(d_model)
        self.pointwise_conv2 = nn.Conv1d(d_model, d_model, 1, bias=bias)

    def forward(self, x: torch.Tensor, padding: Padding) -> torch.Tensor:
        kernels = kernels_for(x)
        if kernels is not None:  # (B, T, D) throughout: the pointwise convolutions as linear layers, no transposes
            x = F.linear(x, self.pointwise_conv1.weight[..., 0], self.pointwise_conv1.bias)  # (B, T, 2D)
            x = kernels.glu_depthwise(x, padding.valid, self.depthwise_conv, self.batch_norm)
            return F.linear(x, self.pointwise_conv2.weight[..., 0], self.pointwise_conv2.bias)
        x = F.glu(self.pointwise_conv1(x.transpose(1, 2)), dim=1)  # (B, D, T)
        x = x.masked_fill(padding.pad, 0.0)
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
        self.conv = ConvModule(d, cfg.conv_kernel, bias, causal=cfg.cache_aware, layer_norm=cfg.conv_layer_norm)
        self.norm_feed_forward2 = nn.LayerNorm(d)
        self.feed_forward2 = FeedForward(d, cfg.ff_expansion, bias)
        self.norm_out = nn.LayerNorm(d)

    def forward(self, x, pos_emb, padding: Padding, window):
        # x + 0.5 * y as one add: halving is exact, so the sum rounds as NeMo's does
        x = torch.add(x, self.feed_forward1(self.norm_feed_forward1(x)), alpha=0.5)
        x = x + self.self_attn(self.norm_self_att(x), pos_emb, padding, window)
        x = x + self.conv(self.norm_conv(x), padding)
        x = torch.add(x, self.feed_forward2(self.norm_feed_forward2(x)), alpha=0.5)
        return self.norm_out(x)


class FastConformer(nn.Module):
    """(B, n_mels, T) features -> (B, T', D) encoder output and (B,) lengths, T' ~ T / factor.

    `window`: None for full attention, (left, right) frames for NeMo's local attention; the
    caller chooses (`Model.attention_for`), the weights are the same.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.pre_encode = Subsampling(cfg)
        self.layers = nn.ModuleList(ConformerLayer(cfg) for _ in range(cfg.n_layers))
        self.gap = (cfg.conv_kernel - 1) // 2  # frames between packed clips: the conv module's reach

    def forward(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor,
        window: tuple[int, int] | None = None,
        layers=None,
        frames: list[int] | None = None,
        front: PackedFront | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`layers`: runs the layer stack in place of `run_layers` (`graphs.LayerGraphs`: replayed graphs).
        `frames`: the clips' lengths in encoder frames, known on the host (`encoder_frames`): with full attention
        the layers then run on packed rows (`Packing`) when that saves enough of the padding. `front`: the
        features are packed rows already (`PackedFront`; `lengths` the clips' feature frames), and so is
        everything after them."""
        valid = None if front is None else front.valid
        x, lengths = self.pre_encode(features.transpose(1, 2), lengths, valid=valid)  # (B or R, T', D)
        if self.cfg.xscaling:
            x = x * math.sqrt(self.cfg.d_model)
        packing = None if front is None else front.packing
        if front is None and frames is not None and window is None:
            packing = Packing.plan(frames, x.shape[1], self.gap, x.device)
        if front is not None:
            x = x[:, : packing.length]  # the frames after the last clip's
            padding = Padding.of_segments(packing.segments, x.dtype)
        elif packing is not None:
            x = packing.pack(x)  # (R, L, D)
            padding = Padding.of_segments(packing.segments, x.dtype)
        else:
            padding = Padding(torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None], x.dtype)
        t = x.shape[1]
        if window is None:
            pos_emb = relative_positions(t, self.cfg.d_model, x.device, x.dtype)
        else:
            pos_emb = window_positions(window, self.cfg.d_model, x.device, x.dtype)
        if layers is None:
            x = run_layers(self.layers, x, pos_emb, padding, window)
        else:
            x = layers(x, pos_emb, padding, window)
        return (x if packing is None else packing.unpack(x)), lengths


def encoder_frames(samples: list[int], hop_length: int, factor: int) -> list[int]:
    """Encoder frames of clips of `samples` samples each, on the host: feature frames (`features.feature_lengths`),
    then subsampled."""
    return [subsampled_lengths(n // hop_length, factor) for n in samples]


def run_layers(
    layers, x: torch.Tensor, pos_emb: torch.Tensor, padding: Padding, window: tuple[int, int] | None
) -> torch.Tensor:
    """The conformer layers, one after another, eagerly: (B, T', D) -> (B, T', D)."""
    for layer in layers:
        x = layer(x, pos_emb, padding, window)
    return x


def memory_estimate(cfg: ModelConfig, batch: int, samples: int, itemsize: int, window: tuple[int, int] | None) -> int:
    """Peak bytes to turn a padded batch of `batch` x `samples` audio into encoder output and decoder inputs.

    An upper bound for this implementation (checked against measured peaks in the tests): the
    audio and the features (float32, plus their copy in the model dtype), the bounded
    temporaries of the chunked features and subsampling, the largest layer's activations
    (T' x D each: FF hidden, q, k, v, ...), the attention group in flight, and the joint's
    projection of the output. `itemsize`: bytes per element of the model dtype.
    """
    enc = cfg.encoder
    frames = samples // cfg.features.hop_length + 1
    t = subsampled_lengths(frames, enc.subsampling_factor)  # ints: no tensor ops on the host per batch
    activations = batch * t * enc.d_model * itemsize
    if window is None:  # per row of the batch, as the groups are sized
        per_row = (
            _EXACT_TEMPORARIES * t if itemsize == 4 else _aligned(t)
        )  # float32: NeMo's products, see full_attention
        need = enc.n_heads * t * per_row * itemsize  # every query row in one group
        least = enc.n_heads * per_row * itemsize  # one query row a group
    else:
        w = max(window)
        m = min(t, max(16, 2 * w))
        per_block = enc.n_heads * m * (_aligned(m + 2 * w) + 3 * w + 2 * enc.d_k) * itemsize
        need, least = per_block * -(-t // m), per_block
    temporaries = 1 if window is None and itemsize == 4 else 3  # SDPA: position term, bias, scores (its math path)
    attention = temporaries * batch * min(need, max(least, _GROUP_BYTES))
    features = batch * frames * cfg.features.n_mels * (4 + itemsize) + 16 * 4 * batch * min(
        samples, _FEATURE_CHUNK_SAMPLES
    )
    audio = batch * samples * 4
    per_frame = conv_bytes_per_frame(1, enc.subsampling_channels, enc.subsampling_factor, enc.n_mels, itemsize)
    convolutions = 3 * batch * per_frame * min(t, max(MIN_CHUNK, CONV_BYTES // per_frame))  # output, ReLU, mask
    layers = (16 + 2 * enc.ff_expansion + (2 if window else 0)) * activations  # local: padded keys and values
    return int(audio + features + convolutions + layers + attention + batch * t * cfg.joint.hidden * itemsize)
