"""The decode step as four fused Triton kernels (CUDA): `decoding.decode_step`'s math, fewer launches.

`decode_step` (PyTorch) is the reference and the CPU path; `FusedStep` computes the same
step for the same `DecodeBuffers` in four launches (three for a one-layer prediction net):

  1. `_joint_kernel`   the joint on the W frames of every row's window (relu(f + g) times the
                       output layer, bias added) with the token and duration argmax fused in:
                       each program keeps only the max and its index over its block of columns.
                       In the same launch, programs past the joint's compute W_hh h of every
                       LSTM layer: it needs only the state before the step, so it is off the
                       path from one token to the next.
  2. `_advance_kernel` one program per row: the argmax over the column blocks, the chain of
                       blanks through the window, the emission (record, counters, frame), and the
                       first LSTM layer's cell. Its input half, embedding times W_ih plus both
                       biases, is one row of a table computed once (`FusedStep.table`), so the
                       first layer reads a row instead of a matrix.
  3. `_gates_kernel`   each further LSTM layer's gates: W_ih h (of the layer below) plus the
                       W_hh h of kernel 1 plus biases, spread over many programs by gate rows.
  4. `_project_kernel` the top layer's cell and g = W_pred h + b for the rows that emitted, and
                       the new state of the layers above the first.

A cell is computed where its output is read, from the gates and the old cell state. The
LSTM state is double-buffered: a step reads one copy and writes the other (rows that do not
emit copy theirs), so no program overwrites what another program of its launch still reads;
steps run in pairs (`STEPS_PER_CHECK` is even), so every round starts from `buf.h`, `buf.c`.

Arithmetic: float32 weights go through `tl.dot` in IEEE float32 (FMA, each sum in k order,
so a row's result does not depend on its batch); 16-bit weights through tensor cores,
accumulating in float32. The LSTM state is float32 either way. Kernel 1 returns at once when
every row has finished, kernel 3 when no row emitted.

Tested against `decode_step` on the CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .heads import Joint, PredictionNet

_NO_INDEX = tl.constexpr(2**30)  # larger than any column index


@dataclass(frozen=True)
class Tiles:
    """Tile sizes of one arithmetic: rows x columns x reduction. The same for every batch size."""

    rows: int  # batch rows (or row x window frames) per tile, >= 16 for tl.dot
    joint_cols: int  # joint output columns per program
    cols: int  # LSTM gate rows / projection columns per program
    k: int  # reduction chunk
    fp32: bool  # float32 weights: IEEE float32 products; else 16-bit weights on tensor cores
    warps: int = 4  # per program


FP32_TILES = Tiles(rows=16, joint_cols=32, cols=16, k=32, fp32=True)
HALF_TILES = Tiles(rows=16, joint_cols=64, cols=16, k=64, fp32=False)


@triton.jit
def _mac(acc, x, w, FP32: tl.constexpr):
    """acc (M, C) += x (M, K) @ w (C, K)^T, accumulating in float32."""
    if FP32:
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    else:
        acc = tl.dot(x.to(w.dtype), tl.trans(w), acc)
    return acc


@triton.jit
def _tanh(x):
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _cell(gi, gf, gg, go, c):
    """LSTM cell (PyTorch's gate order i, f, g, o) -> new h, new c."""
    c = tl.sigmoid(gf) * c + tl.sigmoid(gi) * _tanh(gg)
    return tl.sigmoid(go) * _tanh(c), c


@triton.jit
def _cell_from_gates(gates, c, n, j, ok, H):
    """New (h, c) of hidden units j for rows n from the layer's gates (N, 4H) and old cell state (N, H)."""
    at = gates + n[:, None] * 4 * H + j[None, :]
    return _cell(tl.load(at, mask=ok, other=0.0), tl.load(at + H, mask=ok, other=0.0),
                 tl.load(at + 2 * H, mask=ok, other=0.0), tl.load(at + 3 * H, mask=ok, other=0.0),
                 tl.load(c + n[:, None] * H + j[None, :], mask=ok, other=0.0))


@triton.jit
def _new_h(src, gates, c, n, k, ok, H, FROM_GATES: tl.constexpr):
    """A (rows, k) tile of a layer's new h: read (the first layer's, from kernel 2), or made from its gates."""
    if FROM_GATES:
        h, _ = _cell_from_gates(gates, c, n, k, ok, H)
    else:
        h = tl.load(src + n[:, None] * H + k[None, :], mask=ok, other=0.0)
    return h


@triton.jit
def _count(flags, N):
    """How many of the N flags are set (int32)."""
    n = tl.arange(0, 128)
    total = tl.sum(tl.load(flags + n, mask=n < N, other=0).to(tl.int32))
    for n0 in range(128, N, 128):
        total += tl.sum(tl.load(flags + n0 + n, mask=n0 + n < N, other=0).to(tl.int32))
    return total


@triton.jit(do_not_specialize=["N", "T", "W"])
def _joint_kernel(enc, g, t, active,  # (N, T, J) projected frames, (N, J), (N,), (N,)
                  w_out, b_out,  # (O, J), (O,): O = V + 1 token logits (blank last), then D durations
                  tok_val, tok_idx, dur_val, dur_idx,  # (N * W, NBJ) max and index per column block
                  h, w_hh, hh,  # (L, N, H) state, (L, 4H, H), (L, N, 4H) out
                  N, T, W, J, V1, O, H, NBJ, NBQ,
                  BM: tl.constexpr, BC: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
                  FP32: tl.constexpr, TDT: tl.constexpr):
    pid = tl.program_id(0)
    if _count(active, N) > 0:
        if pid < NBJ:  # joint columns [pid * BC, pid * BC + BC)
            cols = pid * BC + tl.arange(0, BC)
            col_ok = cols < O
            bias = tl.load(b_out + cols, mask=col_ok, other=0.0).to(tl.float32)
            for m0 in range(0, N * W, BM):  # rows r = n * W + w: frame t[n] + w of row n
                r = m0 + tl.arange(0, BM)
                r_ok = r < N * W
                n = r // W
                frame = tl.minimum(tl.load(t + n, mask=r_ok, other=0) + r % W, T - 1)
                enc_row = (n.to(tl.int64) * T + frame) * J
                acc = tl.zeros((BM, BC), tl.float32)
                for k0 in range(0, J, BK):
                    k = k0 + tl.arange(0, BK)
                    x_ok = r_ok[:, None] & (k < J)[None, :]
                    f = tl.load(enc + enc_row[:, None] + k[None, :], mask=x_ok, other=0.0).to(tl.float32)
                    gk = tl.load(g + n[:, None] * J + k[None, :], mask=x_ok, other=0.0).to(tl.float32)
                    w = tl.load(w_out + cols[:, None] * J + k[None, :], mask=col_ok[:, None] & (k < J)[None, :], other=0.0)
                    acc = _mac(acc, tl.maximum(f + gk, 0.0), w, FP32)
                logits = acc + bias[None, :]  # (BM, BC)
                tokens = tl.where((cols < V1)[None, :], logits, float("-inf"))
                best = tl.max(tokens, axis=1)
                at = tl.min(tl.where(tokens == best[:, None], cols[None, :], _NO_INDEX), axis=1)
                tl.store(tok_val + r * NBJ + pid, best, mask=r_ok)
                tl.store(tok_idx + r * NBJ + pid, at, mask=r_ok)
                if TDT:
                    durs = tl.where(((cols >= V1) & col_ok)[None, :], logits, float("-inf"))
                    best = tl.max(durs, axis=1)
                    at = tl.min(tl.where(durs == best[:, None], cols[None, :] - V1, _NO_INDEX), axis=1)
                    tl.store(dur_val + r * NBJ + pid, best, mask=r_ok)
                    tl.store(dur_idx + r * NBJ + pid, at, mask=r_ok)
        else:  # W_hh h for gate rows [q * BQ, q * BQ + BQ) of layer l
            layer = (pid - NBJ) // NBQ
            q = ((pid - NBJ) % NBQ) * BQ + tl.arange(0, BQ)
            q_ok = q < 4 * H
            for n0 in range(0, N, BM):
                n = n0 + tl.arange(0, BM)
                n_ok = n < N
                acc = tl.zeros((BM, BQ), tl.float32)
                for k0 in range(0, H, BK):
                    k = k0 + tl.arange(0, BK)
                    x = tl.load(h + (layer * N + n[:, None]) * H + k[None, :], mask=n_ok[:, None] & (k < H)[None, :], other=0.0)
                    w = tl.load(w_hh + (layer * 4 * H + q[:, None]) * H + k[None, :], mask=q_ok[:, None] & (k < H)[None, :], other=0.0)
                    acc = _mac(acc, x, w, FP32)
                tl.store(hh + (layer * N + n[:, None]) * 4 * H + q[None, :], acc, mask=n_ok[:, None] & q_ok[None, :])


@triton.jit(do_not_specialize=["W", "max_tokens", "blank_id", "max_symbols"])
def _advance_kernel(tok_val, tok_idx, dur_val, dur_idx, durations,  # partials of kernel 1; (D,) TDT durations
                    t, lengths, active, last_frame, run, count, row_steps, records,  # row state (N,), records (N, max_tokens, 3)
                    emit_out,  # (N,) out: whether the row emitted
                    table, hh, h, c, h_out, c_out,  # (V + 1, 4H) first layer's input half; (N, 4H) its W_hh h; (N, H) x 4
                    W, NBJ, H, max_tokens, blank_id, max_symbols,
                    WB: tl.constexpr, NB: tl.constexpr, HB: tl.constexpr, TDT: tl.constexpr):
    row = tl.program_id(0)
    w = tl.arange(0, WB)
    w_ok = w < W
    tile = (row * W + w)[:, None] * NBJ + tl.arange(0, NB)[None, :]
    tile_ok = w_ok[:, None] & (tl.arange(0, NB) < NBJ)[None, :]
    # argmax over the column blocks (the first index of the max, as torch.argmax)
    vals = tl.load(tok_val + tile, mask=tile_ok, other=float("-inf"))
    best = tl.max(vals, axis=1)
    tokens = tl.min(tl.where(vals == best[:, None], tl.load(tok_idx + tile, mask=tile_ok, other=_NO_INDEX), _NO_INDEX), axis=1)
    blank = tokens == blank_id  # (WB,)
    if TDT:  # a blank's duration 0 counts as 1
        vals = tl.load(dur_val + tile, mask=tile_ok, other=float("-inf"))
        best = tl.max(vals, axis=1)
        which = tl.min(tl.where(vals == best[:, None], tl.load(dur_idx + tile, mask=tile_ok, other=_NO_INDEX), _NO_INDEX), axis=1)
        skips = tl.load(durations + which, mask=w_ok, other=1).to(tl.int64)
        skips = tl.where(blank, tl.maximum(skips, 1), skips)
    else:  # RNN-T: blanks move on by one frame, tokens stay
        skips = blank.to(tl.int64)

    t_row = tl.load(t + row)
    length = tl.load(lengths + row)
    is_active = tl.load(active + row) != 0
    moving = blank & ((t_row + w) < length) & w_ok  # blanks inside the clip: the chain goes on
    landing = t_row * 0
    for _ in range(0, W):  # follow the blanks from window position 0
        landing += tl.sum(tl.where((w == landing) & moving, skips, 0))
    here = w == landing
    tok = tl.sum(tl.where(here, tokens, 0))
    duration = tl.sum(tl.where(here, skips, 0))
    frame = t_row + landing
    emit = is_active & (landing < W) & (frame < length)

    n_emitted = tl.load(count + row)
    slot = records + (row * max_tokens + n_emitted) * 3
    tl.store(slot, tok.to(records.dtype.element_ty), mask=emit)
    tl.store(slot + 1, frame.to(records.dtype.element_ty), mask=emit)
    tl.store(slot + 2, duration.to(records.dtype.element_ty), mask=emit)
    tl.store(count + row, n_emitted + emit)
    last = tl.load(last_frame + row)
    runs = tl.load(run + row)
    runs = tl.where(emit, runs * (last == frame) + 1, runs)
    tl.store(run + row, runs)
    tl.store(last_frame + row, tl.where(emit, frame, last))
    force = emit & (runs >= max_symbols) & (duration == 0)  # max_symbols on this frame: move on
    advance = landing + (duration + force) * emit
    tl.store(row_steps + row, tl.load(row_steps + row) + is_active)
    t_new = t_row + advance * is_active
    tl.store(t + row, t_new)
    tl.store(active + row, t_new < length)
    tl.store(emit_out + row, emit.to(tl.int32))

    # the first LSTM layer: the cell for the emitted token, the old state for a row that did not emit
    j = tl.arange(0, HB)
    ok = j < H
    x = table + tok.to(tl.int64) * 4 * H + j
    r = hh + row * 4 * H + j
    new = ok & emit
    gi = tl.load(x, mask=new, other=0.0) + tl.load(r, mask=new, other=0.0)
    gf = tl.load(x + H, mask=new, other=0.0) + tl.load(r + H, mask=new, other=0.0)
    gg = tl.load(x + 2 * H, mask=new, other=0.0) + tl.load(r + 2 * H, mask=new, other=0.0)
    go = tl.load(x + 3 * H, mask=new, other=0.0) + tl.load(r + 3 * H, mask=new, other=0.0)
    c_old = tl.load(c + row * H + j, mask=ok, other=0.0)
    h_new, c_new = _cell(gi, gf, gg, go, c_old)
    tl.store(h_out + row * H + j, tl.where(emit, h_new, tl.load(h + row * H + j, mask=ok, other=0.0)), mask=ok)
    tl.store(c_out + row * H + j, tl.where(emit, c_new, c_old), mask=ok)


@triton.jit(do_not_specialize=["N"])
def _gates_kernel(x_src, x_gates, x_c,  # the layer below: its new h (N, H), or its gates (N, 4H) and old c (N, H)
                  w_ih, bias, hh, gates, emit,  # (4H, H), (4H,), (N, 4H) W_hh h, (N, 4H) out, (N,)
                  N, H, BM: tl.constexpr, BQ: tl.constexpr, BK: tl.constexpr,
                  FP32: tl.constexpr, FROM_GATES: tl.constexpr):
    if _count(emit, N) > 0:
        q = tl.program_id(0) * BQ + tl.arange(0, BQ)  # gate rows of this program
        q_ok = q < 4 * H
        b = tl.load(bias + q, mask=q_ok, other=0.0)
        for n0 in range(0, N, BM):
            n = n0 + tl.arange(0, BM)
            n_ok = n < N
            acc = tl.zeros((BM, BQ), tl.float32)
            for k0 in range(0, H, BK):
                k = k0 + tl.arange(0, BK)
                x = _new_h(x_src, x_gates, x_c, n, k, n_ok[:, None] & (k < H)[None, :], H, FROM_GATES)
                w = tl.load(w_ih + q[:, None] * H + k[None, :], mask=q_ok[:, None] & (k < H)[None, :], other=0.0)
                acc = _mac(acc, x, w, FP32)
            ok = n_ok[:, None] & q_ok[None, :]
            acc += tl.load(hh + n[:, None] * 4 * H + q[None, :], mask=ok, other=0.0) + b[None, :]
            tl.store(gates + n[:, None] * 4 * H + q[None, :], acc, mask=ok)


@triton.jit(do_not_specialize=["N", "L"])
def _project_kernel(top_src, gates, h, c, h_out, c_out,  # (N, H) first layer's new h; (L, N, 4H); (L, N, H) x 4
                    w_pred, b_pred, g, emit,  # (J, H), (J,), (N, J) out, (N,)
                    N, H, J, L, BM: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
                    FP32: tl.constexpr, TOP_FROM_GATES: tl.constexpr):
    pid = tl.program_id(0)
    top = L - 1
    if _count(emit, N) > 0:  # g = W_pred h + b of the top layer's new h, for the rows that emitted
        j = pid * BC + tl.arange(0, BC)
        j_ok = j < J
        bias = tl.load(b_pred + j, mask=j_ok, other=0.0).to(tl.float32)
        for n0 in range(0, N, BM):
            n = n0 + tl.arange(0, BM)
            n_ok = n < N
            acc = tl.zeros((BM, BC), tl.float32)
            for k0 in range(0, H, BK):
                k = k0 + tl.arange(0, BK)
                x = _new_h(top_src, gates + top * N * 4 * H, c + top * N * H, n, k, n_ok[:, None] & (k < H)[None, :],
                           H, TOP_FROM_GATES)
                w = tl.load(w_pred + j[:, None] * H + k[None, :], mask=j_ok[:, None] & (k < H)[None, :], other=0.0)
                acc = _mac(acc, x, w, FP32)
            emitted = tl.load(emit + n, mask=n_ok, other=0) != 0
            tl.store(g + n[:, None] * J + j[None, :], acc + bias[None, :], mask=(n_ok & emitted)[:, None] & j_ok[None, :])
    # the new state of layers 1.. for this program's share of the hidden units (layer 0's came from kernel 2)
    for j0 in range(pid * BC, H, tl.num_programs(0) * BC):
        j = j0 + tl.arange(0, BC)
        for n0 in range(0, N, BM):
            n = n0 + tl.arange(0, BM)
            n_ok = n < N
            ok = n_ok[:, None] & (j < H)[None, :]
            emitted = (tl.load(emit + n, mask=n_ok, other=0) != 0)[:, None]
            for layer in range(1, L):
                at = (layer * N + n[:, None]) * H + j[None, :]
                h_new, c_new = _cell_from_gates(gates + layer * N * 4 * H, c + layer * N * H, n, j, ok, H)
                tl.store(h_out + at, tl.where(emitted, h_new, tl.load(h + at, mask=ok, other=0.0)), mask=ok)
                tl.store(c_out + at, tl.where(emitted, c_new, tl.load(c + at, mask=ok, other=0.0)), mask=ok)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class FusedStep:
    """The step's weights laid out for the kernels, prepared once per decoder; called like `decode_step`."""

    def __init__(self, prediction: PredictionNet, joint: Joint, dtype: torch.dtype, durations: tuple[int, ...],
                 tiles: Tiles | None = None):
        lstm = prediction.prediction.dec_rnn.lstm
        self.layers, self.hidden = lstm.num_layers, lstm.hidden_size
        self.tiles = tiles or (HALF_TILES if dtype in (torch.bfloat16, torch.float16) else FP32_TILES)
        out = joint.joint_net[-1]
        self.vocab = joint.num_token_logits  # V + 1 token logits, blank last
        self.outputs, self.joint_hidden = out.weight.shape
        self.tdt = len(durations) > 0
        with torch.no_grad():
            weight = lambda name: getattr(lstm, name).detach()  # noqa: E731
            embed = prediction.prediction.embed.weight.detach().float()  # (V + 1, H)
            self.table = torch.addmm(weight("bias_ih_l0").float() + weight("bias_hh_l0").float(), embed,
                                     weight("weight_ih_l0").float().t()).contiguous()  # (V + 1, 4H)
            self.w_hh = torch.stack([weight(f"weight_hh_l{i}") for i in range(self.layers)]).to(dtype).contiguous()
            self.w_ih = [weight(f"weight_ih_l{i}").to(dtype).contiguous() for i in range(1, self.layers)]
            self.bias = [(weight(f"bias_ih_l{i}") + weight(f"bias_hh_l{i}")).float().contiguous()
                         for i in range(1, self.layers)]
            self.w_pred = joint.pred.weight.detach().to(dtype).contiguous()  # (J, H)
            self.b_pred = joint.pred.bias.detach().float().contiguous()
            self.w_out = out.weight.detach().to(dtype).contiguous()  # (O, J)
            self.b_out = out.bias.detach().float().contiguous()
        self.durations = torch.tensor(durations or (1,), device=self.table.device, dtype=torch.long)
        self.joint_blocks = triton.cdiv(self.outputs, self.tiles.joint_cols)
        self.gate_blocks = triton.cdiv(4 * self.hidden, self.tiles.cols)

    def weight_bytes(self) -> int:
        """Bytes of weights a step reads (the table's one row aside): the floor of its memory traffic."""
        weights = [self.w_hh, self.w_pred, self.w_out, *self.w_ih]
        return sum(w.numel() * w.element_size() for w in weights)

    def _scratch(self, buf) -> dict:
        """Per-buffers scratch, made on the first call (before any capture) and kept with the buffers."""
        if buf.scratch is None:
            n, w, device = buf.n, buf.window, buf.t.device
            partial = (n * w, self.joint_blocks)
            gates = (self.layers, n, 4 * self.hidden)
            buf.scratch = dict(
                tok_val=torch.empty(partial, device=device), tok_idx=torch.empty(partial, device=device, dtype=torch.int32),
                dur_val=torch.empty(partial, device=device), dur_idx=torch.empty(partial, device=device, dtype=torch.int32),
                hh=torch.empty(gates, device=device), gates=torch.zeros(gates, device=device),
                emit=torch.zeros(n, device=device, dtype=torch.int32),
                states=((buf.h, buf.c), (torch.empty_like(buf.h), torch.empty_like(buf.c))))  # read one, write the other
        return buf.scratch

    def state(self, buf) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM state (h, c) after the steps so far: `buf.h`, `buf.c` after an even number of steps."""
        return self._scratch(buf)["states"][buf.parity]

    def __call__(self, buf, prediction=None, joint=None, blank_id: int = 0, max_symbols: int = 10) -> None:
        s, tiles = self._scratch(buf), self.tiles
        n, w, layers, hidden = buf.n, buf.window, self.layers, self.hidden
        (h, c), (h_out, c_out) = s["states"][buf.parity], s["states"][1 - buf.parity]
        buf.parity = 1 - buf.parity
        _joint_kernel[(self.joint_blocks + layers * self.gate_blocks,)](
            buf.enc, buf.g, buf.t, buf.active, self.w_out, self.b_out,
            s["tok_val"], s["tok_idx"], s["dur_val"], s["dur_idx"], h, self.w_hh, s["hh"],
            n, buf.max_frames, w, self.joint_hidden, self.vocab, self.outputs, hidden, self.joint_blocks, self.gate_blocks,
            BM=tiles.rows, BC=tiles.joint_cols, BQ=tiles.cols, BK=tiles.k, FP32=tiles.fp32, TDT=self.tdt,
            num_warps=tiles.warps)
        _advance_kernel[(n,)](
            s["tok_val"], s["tok_idx"], s["dur_val"], s["dur_idx"], self.durations,
            buf.t, buf.lengths, buf.active, buf.last_frame, buf.run, buf.count, buf.row_steps, buf.records,
            s["emit"], self.table, s["hh"][0], h[0], c[0], h_out[0], c_out[0],
            w, self.joint_blocks, hidden, buf.max_tokens, blank_id, max_symbols,
            WB=_next_pow2(w), NB=_next_pow2(self.joint_blocks), HB=_next_pow2(hidden), TDT=self.tdt)
        for i in range(1, layers):  # the layer below: its new h (i == 1), else its gates and old cell state
            _gates_kernel[(self.gate_blocks,)](
                h_out[0], s["gates"][i - 1], c[i - 1], self.w_ih[i - 1], self.bias[i - 1], s["hh"][i], s["gates"][i],
                s["emit"], n, hidden, BM=tiles.rows, BQ=tiles.cols, BK=tiles.k, FP32=tiles.fp32, FROM_GATES=i > 1,
                num_warps=tiles.warps)
        _project_kernel[(triton.cdiv(self.joint_hidden, tiles.cols),)](
            h_out[0], s["gates"], h, c, h_out, c_out, self.w_pred, self.b_pred, buf.g, s["emit"],
            n, hidden, self.joint_hidden, layers, BM=tiles.rows, BC=tiles.cols, BK=tiles.k, FP32=tiles.fp32,
            TOP_FROM_GATES=layers > 1, num_warps=tiles.warps)
