"""Cache-aware streaming FastConformer: NeMo's `cache_aware_stream_step` for a batch of streams, and the same
encoder over a whole clip (NeMo's offline pass of these models).

Such an encoder (NeMo's conf/fastconformer/cache_aware_streaming) attends to `left` frames of the past and the
rest of its own chunk of `lookahead + 1` frames (`att_context_style: chunked_limited`), its depthwise
convolutions see only the past, and its subsampling pads only the past. So a chunk of audio needs, from the
chunks before it, only these caches per stream:

- `key`, `value`: per layer the keys and values of the last `left` frames. NeMo caches the normalised layer
  input instead and projects all `left` of them again at every step; a projection of a frame is the same
  whenever it is made (to the rounding of the product), and projecting only the new frames takes 1 / (left + 1)
  of the work at an 80 ms chunk, where those projections are most of a step's arithmetic. Each slot's frames
  lie in a ring of `left` + the step's frames, per head (`Caches`): a step writes its new frames in place and
  reads the window in time order with one gather, where shifting a window of 70 frames through a cat and a
  copy back took three times the memory traffic, most of a step's at 80 ms;
- `time`: per layer the last K - 1 GLU outputs, the depthwise convolution's past;
- `length`: how many of the `key` and `value` slots hold frames yet (the first steps' keys are fewer).

The subsampling's own past is the 9 feature frames in front of each chunk (`ChunkGeometry.pre_encode`), whose 2
encoder frames are dropped after it. Every function takes the `FastConformer` module and uses its weights: one
set of weights for the offline and the streaming encoder.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from graphscribe.io.config import EncoderConfig, FeatureConfig
from graphscribe.model.decoding import size_class
from graphscribe.model.encoder import (
    ConformerLayer,
    FastConformer,
    RelPositionAttention,
    relative_positions,
    shifted_rows,
    sinusoids,
)
from graphscribe.model.graphs import capture
from graphscribe.model.subsampling import kernels_for

_MASKED_SCORE = -10000.0  # NeMo's fill value for masked attention scores
# Offline, a clip of more encoder frames than this attends a block of this many queries at a time, each block to the
# keys its chunks see: memory linear in the clip's length (NeMo's one (T, T) mask and scores would take 64 GB for an
# hour). Shorter clips take NeMo's own products in one block.
OFFLINE_BLOCK = 1024


@dataclass
class Caches:
    """Streams' encoder caches (module docstring) in slots: slot s's in row s. A step reads and writes the slots of
    its streams in place (`encode`'s `index`): the caches of a 0.6b model are some 14 MB a stream in float32, and
    a copy of a batch's rows in and out per step would be most of a step's memory traffic.

    `key` and `value` are rings of `ring` = `left` + a step's frames per slot and head: the newest frame sits just
    before `end`, the `left` before it are the cache, and the ring is long enough for a step to write its own
    frames first and then read the whole window (cache and chunk) in time order (`_Window`)."""

    key: torch.Tensor  # (layers, S, H, ring, d_k)
    value: torch.Tensor  # (layers, S, H, ring, d_k)
    time: torch.Tensor  # (layers, S, D, K - 1)
    length: torch.Tensor  # (S,) int64: valid cached frames, at most `left`
    end: torch.Tensor  # (S,) int64: the ring position after the newest frame
    left: int

    @classmethod
    def zeros(cls, cfg: EncoderConfig, context: tuple[int, int], batch: int, device, dtype: torch.dtype) -> "Caches":
        """NeMo's `get_initial_cache_state`: zeros, no valid attention slot; rings for steps of `lookahead + 1`
        frames (a chunk's encoder frames)."""
        left, lookahead = context
        heads = cfg.n_heads
        ring = (cfg.n_layers, batch, heads, left + lookahead + 1, cfg.d_model // heads)
        return cls(
            torch.zeros(ring, device=device, dtype=dtype),
            torch.zeros(ring, device=device, dtype=dtype),
            torch.zeros(cfg.n_layers, batch, cfg.d_model, cfg.conv_kernel - 1, device=device, dtype=dtype),
            torch.zeros(batch, dtype=torch.long, device=device),
            torch.zeros(batch, dtype=torch.long, device=device),
            left,
        )

    @classmethod
    def of_history(cls, key, value, time, length, heads: int, frames: int) -> "Caches":
        """Caches from time-ordered (layers, S, left, D) keys and values (oldest first), for steps of `frames`."""
        layers, slots, left, d_model = key.shape

        def ring(history: torch.Tensor) -> torch.Tensor:
            out = history.new_zeros(layers, slots, heads, left + frames, d_model // heads)
            out[:, :, :, :left] = history.view(layers, slots, left, heads, -1).transpose(2, 3)
            return out

        end = torch.full((slots,), left, dtype=torch.long, device=key.device)
        return cls(ring(key), ring(value), time, length, end, left)

    def history(self, which: str) -> torch.Tensor:
        """Time-ordered (layers, S, left, D) keys or values (oldest first), as NeMo would hold them projected."""
        ring = getattr(self, which)
        layers, slots, heads, size, d_k = ring.shape
        order = torch.remainder(self.end[:, None] - self.left + torch.arange(self.left, device=ring.device), size)
        index = order[None, :, None, :, None].expand(layers, slots, heads, self.left, d_k)
        return ring.gather(3, index).permute(0, 1, 3, 2, 4).reshape(layers, slots, self.left, heads * d_k)

    def copy_slots(self, other: "Caches", slots: int) -> None:
        """The first `slots` slots of `other` (a smaller set of the same streams) into this one's."""
        for mine, theirs in ((self.key, other.key), (self.value, other.value), (self.time, other.time)):
            mine[:, :slots] = theirs[:, :slots]
        self.length[:slots] = other.length[:slots]
        self.end[:slots] = other.end[:slots]

    def reset(self, index: torch.Tensor) -> None:
        self.key.index_fill_(1, index, 0.0)
        self.value.index_fill_(1, index, 0.0)
        self.time.index_fill_(1, index, 0.0)
        self.length.index_fill_(0, index, 0)
        self.end.index_fill_(0, index, 0)


class _Window:
    """Where a step of `t` frames writes and reads its rows' rings (`Caches`), worked out once for every layer: the
    new frames go to the `t` ring positions from `end` on; the window is the `left + t` positions up to the newest,
    in time order. Both as flat row numbers of a layer's (S * H * ring, d_k) view, for one `index_copy_` and one
    `index_select` per layer and ring."""

    def __init__(self, caches: Caches, index: torch.Tensor, t: int):
        _, slots, heads, size, self.d_k = caches.key.shape
        if caches.left + t > size:
            raise ValueError(f"a step of {t} frames does not fit rings of {size} with {caches.left} cached")
        device = index.device
        self.end = caches.end.index_select(0, index)  # (B,)
        ahead = torch.arange(t, device=device)
        back = torch.arange(caches.left + t, device=device) - caches.left
        rows = (index[:, None] * heads + torch.arange(heads, device=device)[None, :]) * size  # (B, H)
        self.write_rows = (rows[:, :, None] + torch.remainder(self.end[:, None, None] + ahead, size)).reshape(-1)
        self.read_rows = (rows[:, :, None] + torch.remainder(self.end[:, None, None] + back, size)).reshape(-1)
        self.shape = (index.shape[0], heads, caches.left + t, self.d_k)
        self.t, self.size = t, size

    def write(self, ring: torch.Tensor, new: torch.Tensor) -> None:
        """One layer's ring (S, H, ring, d_k) takes its rows' new (B, t, D) frames."""
        b, heads = new.shape[0], self.shape[1]
        new = new.view(b, self.t, heads, self.d_k).transpose(1, 2).reshape(-1, self.d_k)
        ring.view(-1, self.d_k).index_copy_(0, self.write_rows, new)

    def read(self, ring: torch.Tensor) -> torch.Tensor:
        """One layer's ring (S, H, ring, d_k) -> its rows' windows (B, H, left + t, d_k), oldest frame first."""
        return ring.view(-1, self.d_k).index_select(0, self.read_rows).view(self.shape)

    def advance(self, caches: Caches, index: torch.Tensor) -> None:
        caches.end.index_copy_(0, index, torch.remainder(self.end + self.t, self.size))


@dataclass(frozen=True)
class ChunkGeometry:
    """The sizes of NeMo's `CacheAwareRNNTPipeline` for one (left, lookahead) context (`init_parameters`):
    a step takes `frame_samples` new samples, makes `chunk_frames` feature frames of them and gives the encoder
    the last `buffer_frames` feature frames (the chunk and `pre_encode` frames before it); the encoder's first
    `drop` output frames are the ones the previous step gave, `encoder_frames` are new."""

    left: int
    lookahead: int
    chunk_frames: int  # feature frames
    pre_encode: int  # feature frames
    buffer_frames: int  # feature frames the encoder takes per step
    frame_samples: int
    encoder_frames: int
    drop: int
    hop_length: int
    sample_rate: int

    @classmethod
    def of(cls, features: FeatureConfig, factor: int, context: tuple[int, int]) -> "ChunkGeometry":
        left, lookahead = context
        chunk = factor + factor * lookahead  # NeMo's chunk_size[1]
        pre_encode = factor + 1  # the causal subsampling's get_streaming_cache_size()[1]
        stride = features.hop_length / features.sample_rate  # NeMo's window_stride, 0.01
        # NeMo's own float arithmetic: 0.09 + 0.08 = 0.16999..., so a 0-lookahead buffer is 16 frames, not 17
        buffer = int((pre_encode * stride + chunk * stride) / stride)
        return cls(
            left=left,
            lookahead=lookahead,
            chunk_frames=chunk,
            pre_encode=buffer - chunk,
            buffer_frames=buffer,
            frame_samples=int(chunk * stride * features.sample_rate),
            encoder_frames=-(-chunk // factor),
            drop=1 + (pre_encode - 1) // factor,
            hop_length=features.hop_length,
            sample_rate=features.sample_rate,
        )

    @property
    def chunk_seconds(self) -> float:
        return self.frame_samples / self.sample_rate


def chunked_mask(queries: int, keys: int, cached: int, lengths: torch.Tensor, offset: torch.Tensor, context):
    """NeMo's `_create_masks` for chunked_limited attention, the query rows kept: (B, 1, queries, keys) True where
    query i may not see key j. Positions count from the first cache slot (`cached` of them, then the frames);
    a key is seen when its chunk of `lookahead + 1` positions is the query's or one of `left / (lookahead + 1)`
    before it, and both are valid: `offset <= position < lengths + cached`."""
    left, lookahead = context
    size = lookahead + 1
    device = lengths.device
    position = torch.arange(keys, device=device)
    chunk = torch.div(position, size, rounding_mode="trunc")
    ahead = chunk[cached:, None] - chunk[None, :]  # (queries, keys)
    seen = (ahead >= 0) & (ahead <= left // size)
    valid = (position[None, :] < (lengths + cached)[:, None]) & (position[None, :] >= offset[:, None])  # (B, keys)
    both = valid[:, cached:, None] & valid[:, None, :]  # (B, queries, keys)
    return ~(both & seen[None])[:, None]


def encode(
    encoder: FastConformer,
    features: torch.Tensor,
    lengths: torch.Tensor,
    context: tuple[int, int],
    caches: Caches | None = None,
    index: torch.Tensor | None = None,
    drop: int = 0,
    block: int = OFFLINE_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, n_mels, T) features (model dtype) and (B,) valid frames -> (B, T', D) encoder output and (B,) lengths.
    With `caches` and `index` (B,), the slots of the rows: one streaming step (NeMo's `cache_aware_stream_step`:
    the first `drop` subsampled frames dropped, each row's caches in front of its keys), the caches of those slots
    updated in place; without: the whole clip from nothing (NeMo's offline forward of the model)."""
    cfg = encoder.cfg
    x, lengths = encoder.pre_encode(features.transpose(1, 2), lengths)
    if drop and caches is not None:
        x, lengths = x[:, drop:], (lengths - drop).clamp(min=0)
    if cfg.xscaling:
        x = x * math.sqrt(cfg.d_model)
    b, t, _ = x.shape
    cached = 0 if caches is None else caches.left
    past_length = None if caches is None else caches.length.index_select(0, index)
    offset = torch.zeros_like(lengths) if caches is None else cached - past_length
    pad = (torch.arange(t, device=x.device)[None, :] >= lengths[:, None])[:, None]  # (B, 1, T) True = padding
    window = None if caches is None else _Window(caches, index, t)
    if caches is None and t > block:
        attend = _Blocks(lengths, context, block, cfg.d_model, x.dtype)
    else:
        mask = chunked_mask(t, cached + t, cached, lengths, offset, context)
        pos_emb = relative_positions(cached + t, cfg.d_model, x.device, x.dtype)

        def attend(attn, h, keys, values):
            return _attention(attn, h, keys, values, pos_emb, mask, window)

    for i, layer in enumerate(encoder.layers):
        x = _layer(layer, x, attend, pad, None if caches is None else (caches, i, index, window))
    if caches is not None:
        caches.length.index_copy_(0, index, torch.clamp(past_length + t, max=cached))
        window.advance(caches, index)
    return x, lengths


def _layer(layer: ConformerLayer, x, attend, pad, cached):
    """One conformer layer (NeMo's ConformerLayer.forward with cache_last_channel/time): (B, T, D) -> (B, T, D).
    `cached`: (caches, layer number, the rows' slots, their `_Window`): the layer's new keys and values written
    to the rings and the window read back, the convolution's cache read in front of its input and set to its
    last K - 1 frames after."""
    x = torch.add(x, layer.feed_forward1(layer.norm_feed_forward1(x)), alpha=0.5)
    h = layer.norm_self_att(x)
    attn = layer.self_attn
    keys, values = attn.linear_k(h), attn.linear_v(h)
    past_time = None
    if cached is not None:
        caches, i, index, window = cached
        window.write(caches.key[i], keys)
        window.write(caches.value[i], values)
        keys, values = caches.key[i], caches.value[i]  # the rings: `attend` reads the window from them
        past_time = caches.time[i].index_select(0, index)
    x = x + attend(attn, h, keys, values)
    conv, time = _conv(layer.conv, layer.norm_conv(x), pad, past_time)
    if cached is not None:
        caches.time[i].index_copy_(0, index, time)
    x = x + conv
    x = torch.add(x, layer.feed_forward2(layer.norm_feed_forward2(x)), alpha=0.5)
    return layer.norm_out(x)


def _attention(attn: RelPositionAttention, h, keys, values, pos_emb, mask, window=None) -> torch.Tensor:
    """NeMo's RelPositionMultiHeadAttention over [cache, chunk] keys and values, its own products: query i, key j
    at relative position (cached + i) - j. Keys and values come projected (B, n, D), or as a layer's rings
    (S, H, ring, d_k) with the `window` to read from them."""
    b, t, _ = h.shape
    heads, d_k = attn.n_heads, attn.d_k
    n = keys.shape[1] if window is None else window.shape[2]
    q = attn.linear_q(h).view(b, t, heads, d_k)
    p = attn.linear_pos(pos_emb).view(-1, heads, d_k).transpose(0, 1)  # (H, 2n - 1, d_k)
    q_u = (q + attn.pos_bias_u).transpose(1, 2)
    q_v = (q + attn.pos_bias_v).transpose(0, 2).reshape(heads, t * b, d_k)  # (H, t B, d_k)
    # one product per head: a (B, H, ...) product would broadcast a copy of the positions to every row
    raw = torch.bmm(q_v, p.transpose(1, 2)).view(heads, t, b, -1).permute(2, 0, 1, 3)  # (B, H, t, 2n - 1)
    shifted = _rel_shift(raw)[..., :n]
    kernels = None if window is None else kernels_for(h)
    if kernels is not None:  # 16 bits on CUDA: the windows read where they lie, one pass
        flat = keys.view(-1, d_k), values.view(-1, d_k)
        out = kernels.ring_attention(
            q_u, *flat, window.read_rows.view(b, heads, n), shifted, mask[:, 0], 1 / math.sqrt(d_k), _MASKED_SCORE
        )
        return attn.linear_out(out.transpose(1, 2).reshape(b, t, heads * d_k))
    if window is not None:
        keys, values = window.read(keys), window.read(values)
    k, v = (x if x.dim() == 4 else x.view(b, n, heads, d_k).transpose(1, 2) for x in (keys, values))
    scores = (torch.matmul(q_u, k.transpose(-2, -1)) + shifted) / math.sqrt(d_k)
    weights = torch.softmax(scores.masked_fill(mask, _MASKED_SCORE), dim=-1).masked_fill(mask, 0.0)
    out = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, heads * d_k)
    return attn.linear_out(out)


class _Blocks:
    """Offline attention over a long clip, `block` queries at a time (`OFFLINE_BLOCK`): a block's queries see only
    the keys from `left` frames before its first chunk to the end of its last chunk, so each block takes those
    keys, the position rows of their relative positions and its piece of NeMo's chunked_limited mask. The same
    terms as `_attention`, products of other shapes."""

    def __init__(self, lengths: torch.Tensor, context: tuple[int, int], block: int, d_model: int, dtype):
        left, lookahead = context
        self.size, self.left_chunks, self.block = lookahead + 1, left // (lookahead + 1), block
        self.lengths = lengths
        # relative positions a block can meet, highest first: query - key from block - 1 + left + chunk down to
        # -(block - 1 + chunk)
        self.top = block - 1 + (self.left_chunks + 1) * self.size
        positions = torch.arange(self.top, -(block + self.size), -1, device=lengths.device)
        self.table = sinusoids(positions, d_model).to(dtype)

    def __call__(self, attn: RelPositionAttention, h, keys, values) -> torch.Tensor:
        b, t, _ = h.shape
        heads, d_k = attn.n_heads, attn.d_k
        size = self.size
        q = attn.linear_q(h).view(b, t, heads, d_k)
        q_u = (q + attn.pos_bias_u).transpose(1, 2)
        q_v = (q + attn.pos_bias_v).transpose(1, 2)
        k = keys.view(b, t, heads, d_k).transpose(1, 2)
        v = values.view(b, t, heads, d_k).transpose(1, 2)
        p = attn.linear_pos(self.table).view(1, -1, heads, d_k).transpose(1, 2)  # (1, H, positions, d_k)
        position = torch.arange(t, device=h.device)
        valid = position[None, :] < self.lengths[:, None]  # (B, T)
        chunk = torch.div(position, size, rounding_mode="trunc")
        out = q_u.new_empty(b, heads, t, d_k)
        for s in range(0, t, self.block):
            e = min(t, s + self.block)
            ks = max(0, (s // size - self.left_chunks) * size)
            ke = min(t, ((e - 1) // size + 1) * size)
            n, m = e - s, ke - ks
            # positions (e - 1 - ks) down to (s - ke + 1): row r, key c at column c + n - 1 - r (`shifted_rows`)
            first = self.top - (e - 1 - ks)
            raw = torch.matmul(q_v[:, :, s:e], p[:, :, first : first + n + m - 1].transpose(-2, -1))
            scores = (torch.matmul(q_u[:, :, s:e], k[:, :, ks:ke].transpose(-2, -1)) + shifted_rows(raw, m)) / (
                math.sqrt(d_k)
            )
            ahead = chunk[s:e, None] - chunk[None, ks:ke]
            seen = (ahead >= 0) & (ahead <= self.left_chunks)
            mask = ~(seen[None] & valid[:, s:e, None] & valid[:, None, ks:ke])[:, None]
            weights = torch.softmax(scores.masked_fill(mask, _MASKED_SCORE), dim=-1).masked_fill(mask, 0.0)
            out[:, :, s:e] = torch.matmul(weights, v[:, :, ks:ke])
        return attn.linear_out(out.transpose(1, 2).reshape(b, t, heads * d_k))


def _rel_shift(x: torch.Tensor) -> torch.Tensor:
    """NeMo's rel_shift: (B, H, T, P) over positions -> row i moved left by T - 1 - i."""
    b, h, t, p = x.shape
    x = F.pad(x, (1, 0)).view(b, h, -1, t)
    return x[:, :, 1:].view(b, h, t, p)


def _conv(conv, x: torch.Tensor, pad: torch.Tensor, past: torch.Tensor | None):
    """NeMo's ConformerConvolution with a causal depthwise convolution: (B, T, D) -> (B, T, D) and the new time
    cache (the last K - 1 GLU outputs, cache included), or None without a cache. The pointwise convolutions run
    as the linear layers they are, on (B, T, D): as convolutions over a step's few frames (B, D, T) cuDNN took a
    general kernel that was a third of a 1.12 s step's GPU time."""
    kernel = conv.depthwise_conv.kernel_size[0]
    x = F.glu(_pointwise(conv.pointwise_conv1, x), dim=-1).transpose(1, 2)  # (B, D, T)
    x = x.masked_fill(pad, 0.0)
    x = F.pad(x, (kernel - 1, 0)) if past is None else torch.cat([past, x], dim=-1)
    after = None if past is None else x[:, :, x.shape[2] - past.shape[2] :]
    x = conv.depthwise_conv(x)
    if isinstance(conv.batch_norm, torch.nn.LayerNorm):
        x = conv.batch_norm(x.transpose(1, 2))
    else:
        x = conv.batch_norm(x).transpose(1, 2)
    return _pointwise(conv.pointwise_conv2, F.silu(x)), after


def _pointwise(conv: torch.nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """A kernel-1 convolution on (B, T, C) frames -> (B, T, C')."""
    return F.linear(x, conv.weight[:, :, 0], conv.bias)


class StepGraphs:
    """`encode` for a batch of streams' steps replayed from a CUDA graph, one per rows class (`size_class`) of one
    context and buffer length: a step of a 0.6b model is some 600 kernels over a few frames per stream, launch-bound
    at every batch size a live server sees, and one replay launches them all.

    Each graph reads and writes the caches' slots in place through a static index; a batch of B rows is copied
    into the first B rows of its class's static features, lengths and index, the spare rows pointing at a scratch
    slot (`scratch`, outside every stream's) whose values are computed and ignored. The same kernels on the same
    shapes as the eager step, so the same numbers. The graphs hold the caches' storage: `reset` drops them when
    the caches are made anew (more slots). They share one memory pool."""

    def __init__(self, encoder: FastConformer, context: tuple[int, int], drop: int):
        self.encoder, self.context, self.drop = encoder, context, drop
        self._graphs: dict[int, _StepGraph] = {}
        self._pool = None
        self.capture_seconds = 0.0

    def reset(self) -> None:
        self._graphs.clear()
        self._pool = None  # a pool dies with the last graph that uses it: the next capture makes a new one

    def __call__(self, features, lengths, caches: Caches, index, scratch: int):
        n = size_class(features.shape[0])
        graph = self._graphs.get(n)
        if graph is None:
            start = time.perf_counter()
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = self._graphs[n] = _StepGraph(self, n, features, lengths, caches, scratch)
            self.capture_seconds += time.perf_counter() - start
        return graph.run(features, lengths, index, scratch)


class _StepGraph:
    def __init__(self, owner: StepGraphs, n: int, features, lengths, caches: Caches, scratch: int):
        def rows(t: torch.Tensor) -> torch.Tensor:  # t's first row, n times: finite values for every row
            return t[:1].expand(n, *t.shape[1:]).clone()

        self.features, self.lengths = rows(features), rows(lengths)
        self.index = torch.full((n,), scratch, dtype=torch.long, device=features.device)

        def step():
            return encode(owner.encoder, self.features, self.lengths, owner.context, caches, self.index, owner.drop)

        for _ in range(2):  # warm-up (cuBLAS workspaces, lazy init) before the capture, as CapturedSteps does
            step()
        self.graph = torch.cuda.CUDAGraph()

        def record():  # the outputs made while capturing are the graph's static outputs
            self.x, self.x_lengths = step()

        capture(self.graph, record, owner._pool)

    def run(self, features, lengths, index, scratch: int):
        b = features.shape[0]
        self.features[:b].copy_(features)
        self.lengths[:b].copy_(lengths)
        self.index[:b].copy_(index)
        self.index[b:].fill_(scratch)  # a larger batch's slots before: their caches must not be written again
        self.graph.replay()
        # the outputs are the graph's static buffers: a copy of the encoder output outlives the next replay
        return self.x[:b].clone(), self.x_lengths[:b].clone()
