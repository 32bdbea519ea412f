"""Fused Triton kernels for the encoder's 16-bit path on CUDA: fewer passes over its largest tensors.

The float32 encoder keeps NeMo's own operations (its bits are NeMo's); in bfloat16 and float16 the memory-bound
element-wise work between the matrix products was half the encoder's GPU time at batch 128 on the H100.
Each kernel here computes, in one pass, what `encoder.py` computes in several:

  `glu_depthwise`  the conv module between its two pointwise convolutions: GLU, padded frames zeroed,
                   the depthwise convolution over time, batch norm (running statistics) and SiLU, on (B, T, C)
                   activations, so the pointwise convolutions are plain linear layers without transposes.
  `first_conv`     the subsampling's first convolution (one channel in, 3 x 3, stride 2) with its ReLU and
                   frame mask: its output is the encoder's largest tensor (C channels at half the frame rate),
                   written once, where PyTorch's kernels made a column copy, a product per row, and two passes.
  `position_bias`  full attention's additive bias: the position term of each head, shifted so that column
                   j is key j, scaled, padded keys (and another clip's, in a packed row) at NeMo's -10000,
                   from a per-head product that needs no broadcast copy of the positions.
  `ring_attention` a cache-aware streaming step's attention (cache_aware.py): each query's keys and values
                   read from its slot's ring where they lie, scores, mask, softmax and the weighted values in
                   one pass, where gathering the window of every row and head first was most of a step's time.

Arithmetic in float32 inside each kernel, one rounding to the model dtype at the end; the tile sizes change no
bit of it (the defaults were the fastest on an H100 batch of 128 rows of 10 s). Tested against the
PyTorch formulation, compiled on a GPU and on the CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _glu_depthwise_kernel(
    h_ptr,
    valid_ptr,
    w_ptr,
    conv_bias_ptr,
    bn_w_ptr,
    bn_b_ptr,
    mean_ptr,
    var_ptr,
    out_ptr,
    T,
    C,
    eps,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a large batch of long clips passes 2^31 elements
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)  # output frames
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)  # channels
    c_ok = c < C
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for k in tl.static_range(K):
        src = t + (k - (K - 1) // 2)  # input frame of tap k: the convolution's zero padding outside [0, T)
        inside = (src >= 0) & (src < T)
        frame = tl.load(valid_ptr + b * T + src, mask=inside, other=0) != 0  # padded frames count as zeros
        m = frame[:, None] & c_ok[None, :]
        row = h_ptr + (b * T + src)[:, None] * (2 * C)
        a = tl.load(row + c[None, :], mask=m, other=0.0).to(tl.float32)
        g = tl.load(row + C + c[None, :], mask=m, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + c * K + k, mask=c_ok, other=0.0).to(tl.float32)
        acc += w[None, :] * (a * tl.sigmoid(g))
    if HAS_BIAS:
        acc += tl.load(conv_bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    mean = tl.load(mean_ptr + c, mask=c_ok, other=0.0).to(tl.float32)
    var = tl.load(var_ptr + c, mask=c_ok, other=1.0).to(tl.float32)
    scale = tl.load(bn_w_ptr + c, mask=c_ok, other=0.0).to(tl.float32) / tl.sqrt(var + eps)
    y = (acc - mean[None, :]) * scale[None, :] + tl.load(bn_b_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    y = y * tl.sigmoid(y)
    out = out_ptr + (b * T + t)[:, None] * C + c[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=(t < T)[:, None] & c_ok[None, :])


def glu_depthwise(
    h: torch.Tensor,
    valid: torch.Tensor,
    conv: torch.nn.Conv1d,
    norm: torch.nn.BatchNorm1d,
    block_t: int = 32,
    block_c: int = 64,
    warps: int = 4,
) -> torch.Tensor:
    """silu(norm(conv(glu(h) with padded frames zeroed))) for h (B, T, 2C) -> (B, T, C), time on axis 1.

    `conv` is the depthwise convolution (weight (C, 1, K), odd K, "same" padding), `norm` the batch norm in
    eval mode; `valid` (B, T) is True on frames. `block_t` frames x `block_c` channels a program.
    """
    b, t, two_c = h.shape
    c = two_c // 2
    k = conv.kernel_size[0]
    h = h.contiguous()
    out = h.new_empty(b, t, c)
    grid = (b, triton.cdiv(t, block_t), triton.cdiv(c, block_c))
    bias = conv.bias if conv.bias is not None else conv.weight
    _glu_depthwise_kernel[grid](
        h,
        valid.contiguous(),
        conv.weight,
        bias,
        norm.weight,
        norm.bias,
        norm.running_mean,
        norm.running_var,
        out,
        t,
        c,
        norm.eps,
        K=k,
        HAS_BIAS=conv.bias is not None,
        BLOCK_T=block_t,
        BLOCK_C=block_c,
        num_warps=warps,
    )
    return out


@triton.jit
def _first_conv_kernel(
    x_ptr,
    len0_ptr,
    len1_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    sxb,
    sxt,
    sxf,
    T0,
    F0,
    T1,
    F1,
    C,
    BLOCK_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    pos = tl.program_id(1) * BLOCK_P + tl.arange(0, BLOCK_P)  # output (frame, frequency) pairs, frame-major
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)  # channels
    c_ok = c < C
    t1 = pos // F1
    f1 = pos % F1
    x_row = x_ptr + b * sxb  # offsets within a row fit 32 bits
    frames0 = tl.minimum(T0, tl.load(len0_ptr + b).to(tl.int32))  # input frames that are not padding
    kept = (pos < T1 * F1) & (t1 < tl.load(len1_ptr + b).to(tl.int32))  # output frames that are not padding
    acc = tl.zeros((BLOCK_C, BLOCK_P), dtype=tl.float32)
    for u in tl.static_range(3):
        t0 = 2 * t1 - 1 + u
        t0_ok = kept & (t0 >= 0) & (t0 < frames0)
        for v in tl.static_range(3):
            f0 = 2 * f1 - 1 + v
            x = tl.load(x_row + t0 * sxt + f0 * sxf, mask=t0_ok & (f0 >= 0) & (f0 < F0), other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c * 9 + (u * 3 + v), mask=c_ok, other=0.0).to(tl.float32)
            acc += w[:, None] * x[None, :]
    acc += tl.load(bias_ptr + c, mask=c_ok, other=0.0).to(tl.float32)[:, None]
    y = tl.where(kept[None, :], tl.maximum(acc, 0.0), 0.0)
    out = out_ptr + b * C * T1 * F1 + (c * (T1 * F1))[:, None] + pos[None, :]
    tl.store(out, y.to(out_ptr.dtype.element_ty), mask=c_ok[:, None] & (pos < T1 * F1)[None, :])


def first_conv(
    x: torch.Tensor,
    lengths: torch.Tensor,
    lengths1: torch.Tensor,
    conv: torch.nn.Conv2d,
    block_p: int = 64,
    block_c: int = 64,
    warps: int = 4,
) -> torch.Tensor:
    """relu(conv(x)) with frames past `lengths1` zeroed, for x (B, 1, T, F) with frames past `lengths` taken as
    zeros -> (B, C, T / 2, F / 2) (3 x 3 kernel, stride 2, padding 1). `block_p` outputs x `block_c` channels a
    program."""
    b, _, t0, f0 = x.shape
    c = conv.out_channels
    t1, f1 = (t0 - 1) // 2 + 1, (f0 - 1) // 2 + 1
    out = x.new_empty(b, c, t1, f1)
    grid = (b, triton.cdiv(t1 * f1, block_p), triton.cdiv(c, block_c))
    _first_conv_kernel[grid](
        x,
        lengths.contiguous(),
        lengths1.contiguous(),
        conv.weight,
        conv.bias,
        out,
        x.stride(0),
        x.stride(2),
        x.stride(3),
        t0,
        f0,
        t1,
        f1,
        c,
        BLOCK_P=block_p,
        BLOCK_C=block_c,
        num_warps=warps,
    )
    return out


@triton.jit
def _position_bias_kernel(
    raw_ptr,
    segments_ptr,
    out_ptr,
    B,
    H,
    N,
    T,
    P,
    START,
    WIDTH,
    scale,
    MASKED: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets, as above
    b = bh // H
    h = bh % H
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)  # query rows of the group
    i_ok = i < N
    src_row = raw_ptr + ((h * B + b) * N + i) * P + (N - 1 - i)  # key j of row i: column j + n - 1 - i
    dst_row = out_ptr + ((b * H + h) * N + i) * WIDTH
    query = tl.load(segments_ptr + b * T + START + i, mask=i_ok, other=-1)  # the query's clip, -1 padding
    for j0 in range(0, T, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_ok = j < T
        key = tl.load(segments_ptr + b * T + j, mask=j_ok, other=-1)
        seen = (key[None, :] == query[:, None]) & (query[:, None] >= 0)  # a frame of the query's own clip
        m = i_ok[:, None] & j_ok[None, :]
        x = tl.load(src_row[:, None] + j[None, :], mask=m & seen, other=0.0).to(tl.float32) * scale
        x = tl.where(seen, x, MASKED)
        tl.store(dst_row[:, None] + j[None, :], x.to(out_ptr.dtype.element_ty), mask=m)


def position_bias(
    raw: torch.Tensor,
    segments: torch.Tensor,
    start: int,
    scale: float,
    width: int,
    masked: float,
    block_i: int = 16,
    block_j: int = 256,
    warps: int = 4,
) -> torch.Tensor:
    """Full attention's bias for a group of n query rows from the position term of each head.

    raw (H, B, n, t + n - 1): q_v p^T of rows start ... start + n - 1 against positions t - end ... 2t - 2 - start
    (row r, key j at column j + n - 1 - r); segments (B, t) int64, each frame's clip (-1: padding; several clips
    share a packed row). -> (B, H, n, t), a view of rows `width` (>= t) long: raw * scale where the key is a frame
    of the query's own clip, `masked` (the caller's, NeMo's -10000) elsewhere. `block_i` rows a program, `block_j`
    keys a pass.
    """
    h, b, n, p = raw.shape
    t = segments.shape[1]
    out = raw.new_empty(b, h, n, width)
    grid = (b * h, triton.cdiv(n, block_i))
    _position_bias_kernel[grid](
        raw.contiguous(),
        segments.contiguous(),
        out,
        b,
        h,
        n,
        t,
        p,
        start,
        width,
        scale,
        MASKED=masked,
        BLOCK_I=block_i,
        BLOCK_J=block_j,
        num_warps=warps,
    )
    return out[..., :t]


@triton.jit
def _ring_attention_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    read_ptr,
    bd_ptr,
    mask_ptr,
    out_ptr,
    H,
    T,
    N,
    scale,
    MASKED: tl.constexpr,
    D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)  # one row and head: all its queries against its window
    b = bh // H
    i = tl.arange(0, BLOCK_T)
    j = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    i_ok = i < T
    j_ok = j < N
    both = i_ok[:, None] & j_ok[None, :]
    q = tl.load(q_ptr + (bh * T + i)[:, None] * D + d[None, :], mask=i_ok[:, None], other=0.0)
    rows = tl.load(read_ptr + bh * N + j, mask=j_ok, other=0)  # the window's ring rows, oldest first
    k = tl.load(k_ptr + rows[:, None] * D + d[None, :], mask=j_ok[:, None], other=0.0)
    s = tl.dot(q, tl.trans(k))  # (BLOCK_T, BLOCK_N) float32
    s += tl.load(bd_ptr + (bh * T + i)[:, None] * N + j[None, :], mask=both, other=0.0).to(tl.float32)
    s = s * scale
    masked = tl.load(mask_ptr + (b * T + i)[:, None] * N + j[None, :], mask=both, other=1) != 0
    s = tl.where(masked, MASKED, s)
    s = tl.where(j_ok[None, :], s, float("-inf"))
    e = tl.exp(s - tl.max(s, axis=1)[:, None])
    w = tl.where(masked, 0.0, e / tl.sum(e, axis=1)[:, None])
    v = tl.load(v_ptr + rows[:, None] * D + d[None, :], mask=j_ok[:, None], other=0.0)
    out = tl.dot(w.to(v.dtype), v)
    tl.store(out_ptr + (bh * T + i)[:, None] * D + d[None, :], out.to(out_ptr.dtype.element_ty), mask=i_ok[:, None])


def ring_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    read: torch.Tensor,
    bd: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    masked: float,
    warps: int = 4,
) -> torch.Tensor:
    """A streaming step's attention over windows that lie in rings.

    q (B, H, t, d_k) the queries with the content bias; keys, values (R, d_k) every ring's rows; read (B, H, n)
    int64, the ring rows of each row and head's window in time order; bd (B, H, t, n) the shifted position term;
    mask (B, t, n) bool, True where a query may not see a key. -> (B, H, t, d_k): softmax((q k^T + bd) * scale,
    masked keys at `masked`) with the masked weights zeroed, times the values (NeMo's attention, as
    `cache_aware._attention` computes it on gathered windows).
    """
    b, h, t, d_k = q.shape
    n = read.shape[-1]
    out = q.new_empty(b, h, t, d_k)
    _ring_attention_kernel[(b * h,)](
        q.contiguous(),
        keys,
        values,
        read.contiguous(),
        bd.contiguous(),
        mask.contiguous(),
        out,
        h,
        t,
        n,
        scale,
        MASKED=masked,
        D=d_k,
        BLOCK_T=max(16, triton.next_power_of_2(t)),
        BLOCK_N=max(16, triton.next_power_of_2(n)),
        num_warps=warps,
    )
    return out
