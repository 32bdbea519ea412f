"""The fused decode step's Triton kernels: `fused_step.py` says what each computes and how `FusedStep`
launches them; `decoding.decode_step` is their math."""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_NO_INDEX = tl.constexpr(2**30)  # larger than any column index


@triton.jit
def _mac(acc, x, w, FP32: tl.constexpr):
    """acc (M, C) += x (M, K) @ w (C, K)^T, accumulating in float32; FP32: "ieee", "tf32x3" or "" (16-bit w)."""
    if FP32 == "":
        acc = tl.dot(x.to(w.dtype), tl.trans(w), acc)
    else:
        acc = tl.dot(x, tl.trans(w), acc, input_precision=FP32)
    return acc


@triton.jit
def _wait_for_previous(PDL: tl.constexpr):
    """Programmatic dependent launch: wait until the previous kernel is done, and let the next one be scheduled."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _cell(gi, gf, gg, go, c):
    """LSTM cell (PyTorch's gate order i, f, g, o) -> new h, new c."""
    c = tl.sigmoid(gf) * c + tl.sigmoid(gi) * _tanh(gg)
    return tl.sigmoid(go) * _tanh(c), c


@triton.jit
def _any_set(flags, rows, N):
    """Whether any of flags[rows] (rows < N) is set."""
    return tl.sum(tl.load(flags + rows, mask=rows < N, other=0).to(tl.int32)) > 0


@triton.jit
def _products(x, n, n_ok, w, q, q_ok, K, BM: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, FP32: tl.constexpr):
    """(BM, BQ): sum_k x[n, k] w[q, k] for batch rows n and weight rows q; x (N, K), w (Q, K) float32.

    FP32 "fma": on the CUDA cores, every (row, weight row, lane) sum in k order, the lanes summed at the end (BM
    is 1 then, so that the sum's order is the same whatever the batch); otherwise `_mac`'s tensor-core tiles."""
    if FP32 == "fma":
        lanes = tl.zeros((BM, BQ, BK), tl.float32)
        for k0 in range(0, K, BK):
            k = k0 + tl.arange(0, BK)
            wk = tl.load(w + q[:, None] * K + k[None, :], mask=q_ok[:, None] & (k < K)[None, :], other=0.0)
            xk = tl.load(x + n[:, None] * K + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
            lanes += xk[:, None, :] * wk[None, :, :]
        acc = tl.sum(lanes, axis=2)
    else:
        acc = tl.zeros((BM, BQ), tl.float32)
        for k0 in range(0, K, BK):
            k = k0 + tl.arange(0, BK)
            wk = tl.load(w + q[:, None] * K + k[None, :], mask=q_ok[:, None] & (k < K)[None, :], other=0.0)
            xk = tl.load(x + n[:, None] * K + k[None, :], mask=n_ok[:, None] & (k < K)[None, :], other=0.0)
            acc = _mac(acc, xk, wk, FP32)
    return acc


@triton.jit
def _hh_block(h, w_hh, hh, q0, n0, N, H, BM: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr, FP32: tl.constexpr):
    """hh[n, q] = sum_k h[n, k] w_hh[q, k] for batch rows n0 .. n0 + BM and gate rows q0 .. q0 + BQ of one layer:
    h (N, H), w_hh (4H, H), hh (N, 4H)."""
    q = q0 + tl.arange(0, BQ)
    q_ok = q < 4 * H
    n = n0 + tl.arange(0, BM)
    n_ok = n < N
    acc = _products(h, n, n_ok, w_hh, q, q_ok, H, BM, BQ, BK, FP32)
    tl.store(hh + n[:, None] * 4 * H + q[None, :], acc, mask=n_ok[:, None] & q_ok[None, :])


@triton.jit(do_not_specialize=["N", "T", "W"])
def joint_kernel(
    enc,
    g,
    t,
    active,  # (N, T, J) projected frames, (N, J), (N,), (N,)
    w_out,
    b_out,  # (O, J), (O,): O = V + 1 token logits (blank last), then D durations
    tok_val,
    tok_idx,
    dur_val,
    dur_idx,  # (N * W, NBJ) and (N * W, NBD): max and index per column block
    fused_b,  # (K, N, V1 - 1): the fused token models' weighted scores of each row's state, model by model
    fus_val,
    fus_idx,  # (N * W, NBJ): max and index per column block of the non-blank logits plus those scores
    N,
    T,
    W,
    J,
    V1,
    O,  # noqa: E741 - the kernel names its sizes by letter
    NBJ,
    BM: tl.constexpr,
    BC: tl.constexpr,
    BK: tl.constexpr,
    FP32: tl.constexpr,
    TDT: tl.constexpr,
    NBD: tl.constexpr,
    PDL: tl.constexpr,
    K: tl.constexpr = 0,  # fused token models (0: none, and the three pointers above are not read)
):
    pid = tl.program_id(0)  # joint columns [pid * BC, pid * BC + BC)
    r = tl.program_id(1) * BM + tl.arange(0, BM)  # rows r = n * W + w: frame t[n] + w of batch row n
    _wait_for_previous(PDL)
    r_ok = r < N * W
    n = r // W
    if _any_set(active, tl.where(r_ok, n, N), N):  # a block of finished (or spare) rows skips its products
        cols = pid * BC + tl.arange(0, BC)
        col_ok = cols < O
        bias = tl.load(b_out + cols, mask=col_ok, other=0.0).to(tl.float32)
        frame = tl.minimum(tl.load(t + n, mask=r_ok, other=0) + r % W, T - 1)
        enc_row = (n.to(tl.int64) * T + frame) * J
        acc = tl.zeros((BM, BC), tl.float32)
        for k0 in range(0, J, BK):
            k = k0 + tl.arange(0, BK)
            x_ok = r_ok[:, None] & (k < J)[None, :]
            # the weights first: their loads need no other load's result (f's address needs t)
            w = tl.load(w_out + cols[:, None] * J + k[None, :], mask=col_ok[:, None] & (k < J)[None, :], other=0.0)
            f = tl.load(enc + enc_row[:, None] + k[None, :], mask=x_ok, other=0.0).to(tl.float32)
            gk = tl.load(g + n[:, None] * J + k[None, :], mask=x_ok, other=0.0).to(tl.float32)
            acc = _mac(acc, tl.maximum(f + gk, 0.0), w, FP32)
        logits = acc + bias[None, :]  # (BM, BC)
        tokens = tl.where((cols < V1)[None, :], logits, float("-inf"))
        best = tl.max(tokens, axis=1)
        at = tl.min(tl.where(tokens == best[:, None], cols[None, :], _NO_INDEX), axis=1)
        tl.store(tok_val + r * NBJ + pid, best, mask=r_ok)
        tl.store(tok_idx + r * NBJ + pid, at, mask=r_ok)
        if K > 0:  # shallow fusion (`fusion.Fusion.choose`): the scores added to the logits in float32, in order
            v = V1 - 1
            f_ok = r_ok[:, None] & (cols < v)[None, :]
            fused = tl.where((cols < v)[None, :], logits, float("-inf"))
            for k in tl.static_range(K):
                fused += tl.load(fused_b + (k * N + n[:, None]) * v + cols[None, :], mask=f_ok, other=0.0)
            best = tl.max(fused, axis=1)
            at = tl.min(tl.where(fused == best[:, None], cols[None, :], _NO_INDEX), axis=1)
            tl.store(fus_val + r * NBJ + pid, best, mask=r_ok)
            tl.store(fus_idx + r * NBJ + pid, at, mask=r_ok)
        if TDT and (pid + 1) * BC > V1:  # one of the NBD blocks that hold duration columns
            durs = tl.where(((cols >= V1) & col_ok)[None, :], logits, float("-inf"))
            best = tl.max(durs, axis=1)
            at = tl.min(tl.where(durs == best[:, None], cols[None, :] - V1, _NO_INDEX), axis=1)
            d = pid - V1 // BC
            tl.store(dur_val + r * NBD + d, best, mask=r_ok)
            tl.store(dur_idx + r * NBD + d, at, mask=r_ok)


@triton.jit(do_not_specialize=["W", "max_tokens", "blank_id", "max_symbols"])
def advance_kernel(
    tok_val,
    tok_idx,
    dur_val,
    dur_idx,  # partials of kernel 1
    t,
    lengths,
    active,
    last_frame,
    run,
    count,
    row_steps,
    records,  # row state (N,), records (N, max_tokens, 3)
    emit_out,  # (N,) out: whether the row emitted
    fus_val,
    fus_idx,  # partials of kernel 1 with FUSED: the fused choice among the non-blank tokens
    tok_out,  # (N,) out with FUSED: the token the row emitted (where it did)
    table,
    hh,
    h,
    c,
    h_out,
    c_out,  # (V + 1, 4H) first layer's input half; (N, 4H) its W_hh h; (N, H) x 4
    W,
    NBJ,
    H,
    max_tokens,
    blank_id,
    max_symbols,
    WB: tl.constexpr,
    NB: tl.constexpr,
    NBD: tl.constexpr,
    HB: tl.constexpr,
    TDT: tl.constexpr,
    DURATIONS: tl.constexpr,
    PDL: tl.constexpr,
    FUSED: tl.constexpr = False,
):
    """DURATIONS: the TDT durations packed 8 bits each (duration i is (DURATIONS >> 8 i) & 255): no lookup load.
    FUSED: the joint alone decides blank or not; where a row emits, the token is the fused one (`Fusion.choose`)."""
    row = tl.program_id(0)
    _wait_for_previous(PDL)
    # every load that does not need this kernel's results first, so that they are in flight together
    w = tl.arange(0, WB)
    w_ok = w < W
    tile = (row * W + w)[:, None] * NBJ + tl.arange(0, NB)[None, :]
    tile_ok = w_ok[:, None] & (tl.arange(0, NB) < NBJ)[None, :]
    vals = tl.load(tok_val + tile, mask=tile_ok, other=float("-inf"))
    idx = tl.load(tok_idx + tile, mask=tile_ok, other=_NO_INDEX)
    if FUSED:
        f_vals = tl.load(fus_val + tile, mask=tile_ok, other=float("-inf"))
        f_idx = tl.load(fus_idx + tile, mask=tile_ok, other=_NO_INDEX)
    if TDT:
        d_tile = (row * W + w)[:, None] * NBD + tl.arange(0, NBD)[None, :]
        d_vals = tl.load(dur_val + d_tile, mask=w_ok[:, None], other=float("-inf"))
        d_idx = tl.load(dur_idx + d_tile, mask=w_ok[:, None], other=_NO_INDEX)
    t_row = tl.load(t + row)
    length = tl.load(lengths + row)
    is_active = tl.load(active + row) != 0
    n_emitted = tl.load(count + row)
    last = tl.load(last_frame + row)
    runs = tl.load(run + row)
    steps = tl.load(row_steps + row)
    j = tl.arange(0, HB)
    ok = j < H
    r = hh + row * 4 * H + j
    hi, hf, hg, ho = (
        tl.load(r, mask=ok, other=0.0),
        tl.load(r + H, mask=ok, other=0.0),
        tl.load(r + 2 * H, mask=ok, other=0.0),
        tl.load(r + 3 * H, mask=ok, other=0.0),
    )
    c_old = tl.load(c + row * H + j, mask=ok, other=0.0)
    h_old = tl.load(h + row * H + j, mask=ok, other=0.0)

    # argmax over the column blocks (the first index of the max, as torch.argmax)
    best = tl.max(vals, axis=1)
    tokens = tl.min(tl.where(vals == best[:, None], idx, _NO_INDEX), axis=1)
    blank = tokens == blank_id  # (WB,)
    if TDT:  # a blank's duration 0 counts as 1
        best = tl.max(d_vals, axis=1)
        which = tl.min(tl.where(d_vals == best[:, None], d_idx, _NO_INDEX), axis=1)
        skips = ((DURATIONS >> (8 * which).to(tl.int64)) & 255).to(tl.int64)
        skips = tl.where(blank, tl.maximum(skips, 1), skips)
    else:  # RNN-T: blanks move on by one frame, tokens stay
        skips = blank.to(tl.int64)

    moving = blank & ((t_row + w) < length) & w_ok  # blanks inside the clip: the chain goes on
    landing = t_row * 0
    for _ in range(0, W):  # follow the blanks from window position 0
        landing += tl.sum(tl.where((w == landing) & moving, skips, 0))
    here = w == landing
    tok = tl.sum(tl.where(here, tokens, 0))
    if FUSED:
        best = tl.max(f_vals, axis=1)
        fused = tl.min(tl.where(f_vals == best[:, None], f_idx, _NO_INDEX), axis=1)
        tok = tl.where(tok == blank_id, tok, tl.sum(tl.where(here, fused, 0)))
        tl.store(tok_out + row, tok.to(tok_out.dtype.element_ty))
    duration = tl.sum(tl.where(here, skips, 0))
    frame = t_row + landing
    emit = is_active & (landing < W) & (frame < length)

    slot = records + (row * max_tokens + n_emitted) * 3
    tl.store(slot, tok.to(records.dtype.element_ty), mask=emit)
    tl.store(slot + 1, frame.to(records.dtype.element_ty), mask=emit)
    tl.store(slot + 2, duration.to(records.dtype.element_ty), mask=emit)
    tl.store(count + row, n_emitted + emit)
    runs = tl.where(emit, runs * (last == frame) + 1, runs)
    tl.store(run + row, runs)
    tl.store(last_frame + row, tl.where(emit, frame, last))
    force = emit & (runs >= max_symbols) & (duration == 0)  # max_symbols on this frame: move on
    advance = landing + (duration + force) * emit
    tl.store(row_steps + row, steps + is_active)
    t_new = t_row + advance * is_active
    tl.store(t + row, t_new)
    tl.store(active + row, t_new < length)
    tl.store(emit_out + row, emit.to(tl.int32))

    # the first LSTM layer: the cell for the emitted token, the old state for a row that did not emit
    x = table + tok.to(tl.int64) * 4 * H + j
    new = ok & emit
    gi = tl.load(x, mask=new, other=0.0) + hi
    gf = tl.load(x + H, mask=new, other=0.0) + hf
    gg = tl.load(x + 2 * H, mask=new, other=0.0) + hg
    go = tl.load(x + 3 * H, mask=new, other=0.0) + ho
    h_new, c_new = _cell(gi, gf, gg, go, c_old)
    tl.store(h_out + row * H + j, tl.where(emit, h_new, h_old), mask=ok)
    tl.store(c_out + row * H + j, tl.where(emit, c_new, c_old), mask=ok)


@triton.jit(do_not_specialize=["N"])
def lstm_kernel(
    x,
    w_ih,
    bias,
    hh,
    h,
    c,
    h_out,
    c_out,
    emit,  # (N, H) new h below; (4H, H); (4H,); (N, 4H); (N, H) x 4
    w_hh_below,
    hh_below,  # (4H, H), (N, 4H) out: the layer below's W_hh h for the next step
    N,
    H,
    NBU,
    BM: tl.constexpr,
    BU: tl.constexpr,
    BK: tl.constexpr,
    FP32: tl.constexpr,
    PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    n0 = tl.program_id(1) * BM
    _wait_for_previous(PDL)
    n = n0 + tl.arange(0, BM)
    n_ok = n < N
    any_emit = _any_set(emit, n, N)  # no row of the block emitted: its state and W_hh h stay as they are
    if pid < NBU:  # hidden units [pid * BU, pid * BU + BU) of this layer
        units = pid * BU + tl.arange(0, BU)
        u_ok = units < H
        g4 = tl.arange(0, 4 * BU)
        q = (g4 // BU) * H + pid * BU + g4 % BU  # their gate rows, gate by gate: i.., f.., g.., o..
        q_ok = (pid * BU + g4 % BU) < H
        b = tl.load(bias + q, mask=q_ok, other=0.0)
        acc = tl.zeros((BM, 4 * BU), tl.float32)
        if any_emit:
            acc = _products(x, n, n_ok, w_ih, q, q_ok, H, BM, 4 * BU, BK, FP32)
        acc += tl.load(hh + n[:, None] * 4 * H + q[None, :], mask=n_ok[:, None] & q_ok[None, :], other=0.0) + b[None, :]
        # (BM, 4 BU) -> four (BM, BU) gates
        ig, fo = tl.split(tl.reshape(tl.permute(tl.reshape(acc, (BM, 4, BU)), (0, 2, 1)), (BM, BU, 2, 2)))
        gi, gg = tl.split(ig)
        gf, go = tl.split(fo)
        at = n[:, None] * H + units[None, :]
        ok = n_ok[:, None] & u_ok[None, :]
        c_old = tl.load(c + at, mask=ok, other=0.0)
        h_new, c_new = _cell(gi, gf, gg, go, c_old)
        emitted = (tl.load(emit + n, mask=n_ok, other=0) != 0)[:, None]
        tl.store(h_out + at, tl.where(emitted, h_new, tl.load(h + at, mask=ok, other=0.0)), mask=ok)
        tl.store(c_out + at, tl.where(emitted, c_new, c_old), mask=ok)
    elif any_emit:  # W_hh h of the layer below, from its new state (x), for the next step
        _hh_block(x, w_hh_below, hh_below, (pid - NBU) * 4 * BU, n0, N, H, BM, 4 * BU, BK, FP32)


@triton.jit(do_not_specialize=["N"])
def project_kernel(
    x,
    w_pred,
    b_pred,
    g,
    emit,  # (N, H) top layer's new h; (J, H); (J,); (N, J) out; (N,)
    w_hh_top,
    hh_top,  # (4H, H), (N, 4H) out: the top layer's W_hh h for the next step
    N,
    H,
    J,
    NBP,
    BM: tl.constexpr,
    BC: tl.constexpr,
    BQ: tl.constexpr,
    BK: tl.constexpr,
    FP32: tl.constexpr,
    PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    n0 = tl.program_id(1) * BM
    _wait_for_previous(PDL)
    n = n0 + tl.arange(0, BM)
    n_ok = n < N
    if _any_set(emit, n, N):
        if pid < NBP:  # projection columns [pid * BC, pid * BC + BC)
            j = pid * BC + tl.arange(0, BC)
            j_ok = j < J
            bias = tl.load(b_pred + j, mask=j_ok, other=0.0).to(tl.float32)
            acc = _products(x, n, n_ok, w_pred, j, j_ok, H, BM, BC, BK, FP32)
            emitted = tl.load(emit + n, mask=n_ok, other=0) != 0
            tl.store(
                g + n[:, None] * J + j[None, :], acc + bias[None, :], mask=(n_ok & emitted)[:, None] & j_ok[None, :]
            )
        else:  # W_hh h of the top layer, from its new state, for the next step
            _hh_block(x, w_hh_top, hh_top, (pid - NBP) * BQ, n0, N, H, BM, BQ, BK, FP32)


@triton.jit(do_not_specialize=["N"])
def hh_kernel(
    h,
    w_hh,
    hh,
    N,
    H,
    NBQ,  # (L, N, H), (L, 4H, H), (L, N, 4H) out
    BM: tl.constexpr,
    BQ: tl.constexpr,
    BK: tl.constexpr,
    FP32: tl.constexpr,
):
    """W_hh h of every layer for the start state (the steps then compute it for the state they make)."""
    layer = tl.program_id(0) // NBQ
    _hh_block(
        h + layer * N * H,
        w_hh + layer * 4 * H * H,
        hh + layer * N * 4 * H,
        (tl.program_id(0) % NBQ) * BQ,
        tl.program_id(1) * BM,
        N,
        H,
        BM,
        BQ,
        BK,
        FP32,
    )
