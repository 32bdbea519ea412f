"""The decode step as four fused Triton kernels (CUDA): `decoding.decode_step`'s math, fewer launches.

`decode_step` (PyTorch) is the reference and the CPU path; `FusedStep` computes the same
step for the same `DecodeBuffers` in four launches (three for a one-layer prediction net):

  1. `joint_kernel`   the joint on the W frames of every row's window (relu(f + g) times the
                       output layer, bias added) with the token and duration argmax fused in:
                       each program keeps only the max and its index over its block of columns.
  2. `advance_kernel` one program per row: the argmax over the column blocks, the chain of
                       blanks through the window, the emission (record, counters, frame), and the
                       first LSTM layer's cell. Its input half, embedding times W_ih plus both
                       biases, is one row of a table computed once (`FusedStep.table`), so the
                       first layer reads a row instead of a matrix.
  3. `lstm_kernel`    each further LSTM layer: a program takes a few hidden units and all four
                       of their gate rows, so W_ih h (of the layer below), W_hh h, biases and the
                       cell update stay in one program.
  4. `project_kernel` g = W_pred h + b of the top layer's new h, for the rows that emitted.

Shallow fusion (`fusion.Fusion`: an n-gram LM, boosting trees) adds no launch of its own kind: before kernel 1
each model's scores from each row's state, times its weight, are laid out as (K, N, V) in PyTorch; kernel 1 also
keeps the argmax of the non-blank logits plus them (added model by model, in float32, as `Fusion.choose`), and
kernel 2 emits that token where the joint chose one (the joint alone decides blank or not); the models' states
move after kernel 4.

W_hh h of a layer needs only that layer's new state, so it is computed off the path from one
token to the next, for the next step: by extra programs of the launch after the one that made
the state (layer l's in kernel 3 of layer l + 1, the top layer's in kernel 4), which are
otherwise short of memory traffic; `FusedStep.start` computes it once for the start state.
Every matrix kernel has a second grid axis over blocks of batch rows, so a large batch reads
each weight tile from L2 in parallel rather than once per row block in turn, and a block whose
rows have all finished (or did not emit) skips its products. At one row too: the check's load
costs little next to the steps queued after a clip's end, which it makes cheap (H100: 7.4 s alone 2.0
instead of 2.2-2.5 ms, 77 s the same).

The LSTM state is double-buffered: a step reads one copy and writes the other (rows that do
not emit copy theirs), so no program overwrites what another program of its launch still
reads; steps run in pairs (`STEPS_PER_CHECK` is even), so every round starts from `buf.h`,
`buf.c`. On Hopper the kernels are launched as programmatic dependent launches: the next
kernel is scheduled while the last one finishes, and waits (`gdc_wait`) before it reads.

Arithmetic: the joint's 16-bit output layer goes through tensor cores, accumulating in float32.
Float32 weights (the joint's in float32 models, and the prediction net's always: LSTM and
projection stay float32, as in `Transducer.to_inference`) take `Tiles.fp32` or "tf32x3":
"ieee" (FMA, each sum in k order) or "tf32x3" (tensor cores, each product split in three TF32
products: float32's accuracy, not its exact bits). The tiles' height (16 batch rows, 64 or 128 for
large batches: `TALL`) does not change a row's bits (measured: its LSTM state after the 77 s tier
is the same in all four), and every row starts from the same state (`GreedyDecoder.start_state`),
so a row's result does not depend on its batch, with one exception: a batch of one row (`ONE_ROW`)
computes the prediction net's products on the CUDA cores ("fma", one row per program), where a
16-row tensor-core tile would carry 15 empty rows. The LSTM state is float32 either way.

Tested against `decode_step` on the CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton

from graphscribe.model.heads import Joint, PredictionNet
from graphscribe.model.step_kernels import (
    advance_kernel,
    hh_kernel,
    joint_kernel,
    lstm_kernel,
    project_kernel,
)


@dataclass(frozen=True)
class Tiles:
    """Tile sizes and arithmetic of the kernels. The same for every batch size class but one row's."""

    joint_cols: int  # joint output columns per program
    units: int  # LSTM hidden units per program (4x as many gate rows), also in the W_hh h programs
    proj_cols: int  # projection columns per program
    k: int  # reduction chunk
    fp32: str | None  # float32 weights: "ieee" or "tf32x3"; None: 16-bit weights
    rows: int = 16  # batch rows (or rows x window frames) per tile; tl.dot wants >= 16
    warps: int = 4  # per program of the matrix kernels
    stages: int = 3  # software pipelining of the joint's loads
    gate_stages: int = 3  # the same for the LSTM, projection and W_hh h products
    advance_warps: int = 1  # per program (one row) of the advance kernel
    net: str = ""  # the prediction net's products (LSTM, projection, W_hh h): "" tensor-core tiles of `rows` rows
    #                as the joint's; "fma": CUDA cores, one batch row per program, each sum in k order per lane
    net_k: int = 0  # reduction chunk of the prediction net's products (0: k)
    net_warps: int = 0  # per program of the prediction net's kernels (0: warps)

    @property
    def net_arithmetic(self) -> str:
        """ "fma", or the tensor-core products of the prediction net's float32 weights: "ieee" or "tf32x3"."""
        return "fma" if self.net == "fma" else self.fp32 or "tf32x3"

    @property
    def net_rows(self) -> int:
        return 1 if self.net == "fma" else self.rows


# Chosen from H100 sweeps (scripts/experiments/tune_step.py): k 64, a 4-warp advance kernel, and 32 projection
# columns, the best single change at B = 1, 8 and 128 in float32. 3xTF32: 2.7x faster than IEEE FMA
# products, the same tokens. 64-row tiles are faster at B = 128 and slower at B = 1: 16 rows up to 32-row batches,
# taller ones from 64 (`TALL`).
FP32_TILES = Tiles(joint_cols=64, units=8, proj_cols=32, k=64, fp32="tf32x3", advance_warps=4)
HALF_TILES = Tiles(joint_cols=64, units=8, proj_cols=32, k=64, fp32=None, advance_warps=4)
# One batch row (the 1-row size class, a single clip): a tensor-core tile of 16 rows would carry 15 empty ones, and
# the prediction net's products read their weights at ~1 TB/s. On the CUDA cores, 8 gate rows and 128 k per
# program, 8 warps, an LSTM layer's 6.5 MB takes 3.2 us instead of 6.7. So a clip decoded alone and the same clip
# in a batch of 2 or more differ in the last bits of the LSTM state (both float32 products, summed in different
# orders), as NeMo's cuBLAS GEMMs of different shapes do. The joint's programs get 8 warps: 77 s decode in 9.6
# instead of 12.5 ms in bfloat16, 14.5 instead of 14.9 in float32.
ONE_ROW = dict(units=2, proj_cols=8, net="fma", net_k=128, net_warps=8, warps=8)
# Batches of 64 rows and more, by the least size class: taller tiles, so that each weight tile is read from L2 once
# for 64 or 128 batch rows rather than once per 16 (at 128 rows a step read its 42 MB of weights 8 times from L2).
# The 77 s tier decoded at B=128 in 46.9 instead of 73.7 ms in float32 and 29.2 instead of 41.0 in bfloat16; at B=64
# in 31.3 / 21.6 instead of 41.2 / 26.7; at B=32 16 rows stay the faster in float32. The
# bits do not change: a row's LSTM state after the 77 s tier is the same in 16-, 32-, 64- and 128-row tiles.
TALL = {64: dict(rows=64), 128: dict(rows=128, warps=8)}


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class FusedStep:
    """The step's weights laid out for the kernels, prepared once per decoder; called like `decode_step`.

    `tiles`: for the size classes from 2 rows up to the least of `tall`; `one_row`: for one row (default: `tiles`
    with `ONE_ROW`); `tall`: tiles by least size class (default: `TALL` applied to the default tiles; none when
    `tiles` is given, which then serve every class but one row's). `start(buf)` must follow every `buf.restart` (it
    computes W_hh h of the start state)."""

    def __init__(
        self,
        prediction: PredictionNet,
        joint: Joint,
        dtype: torch.dtype,
        durations: tuple[int, ...],
        tiles: Tiles | None = None,
        one_row: Tiles | None = None,
        tall: dict[int, Tiles] | None = None,
    ):
        lstm = prediction.prediction.dec_rnn.lstm
        self.layers, self.hidden = lstm.num_layers, lstm.hidden_size
        default = HALF_TILES if dtype in (torch.bfloat16, torch.float16) else FP32_TILES
        if tall is None:
            tall = {} if tiles else {least: replace(default, **changes) for least, changes in TALL.items()}
        self.tiles, self.tall = tiles or default, tall
        self.one_row = one_row or replace(self.tiles, **ONE_ROW)
        out = joint.joint_net[-1]
        self.vocab = joint.num_token_logits  # V + 1 token logits, blank last
        self.outputs, self.joint_hidden = out.weight.shape
        self.tdt = len(durations) > 0
        with torch.no_grad():
            weight = lambda name: getattr(lstm, name).detach()  # noqa: E731
            embed = prediction.prediction.embed.weight.detach().float()  # (V + 1, H)
            self.table = torch.addmm(
                weight("bias_ih_l0").float() + weight("bias_hh_l0").float(), embed, weight("weight_ih_l0").float().t()
            ).contiguous()  # (V + 1, 4H)
            # The prediction net stays float32 whatever the dtype, as `Transducer.to_inference` keeps it: with
            # 16-bit LSTM weights a long recording's state drifts until blank wins every frame, and most of three
            # hours of audio comes out empty (see bench/README.md).
            self.w_hh = torch.stack([weight(f"weight_hh_l{i}") for i in range(self.layers)]).float().contiguous()
            self.w_ih = [weight(f"weight_ih_l{i}").float().contiguous() for i in range(1, self.layers)]
            self.bias = [
                (weight(f"bias_ih_l{i}") + weight(f"bias_hh_l{i}")).float().contiguous() for i in range(1, self.layers)
            ]
            self.w_pred = joint.pred.weight.detach().float().contiguous()  # (J, H)
            self.b_pred = joint.pred.bias.detach().float().contiguous()
            self.w_out = out.weight.detach().to(dtype).contiguous()  # (O, J)
            self.b_out = out.bias.detach().float().contiguous()
        if len(durations) > 8 or any(not 0 <= d < 256 for d in durations):
            raise ValueError(f"TDT durations {durations} do not pack into 8 bits each")
        self.packed_durations = sum(d << (8 * i) for i, d in enumerate(durations))
        # programmatic dependent launch: Hopper and later, not under the CPU interpreter
        self.pdl = (
            self.table.is_cuda
            and torch.cuda.get_device_capability(self.table.device)[0] >= 9
            and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
        )

    def joint_blocks(self, tiles: Tiles) -> tuple[int, int]:
        """The joint's column blocks, and how many of them hold duration columns (after the V + 1 token columns)."""
        blocks = triton.cdiv(self.outputs, tiles.joint_cols)
        return blocks, blocks - self.vocab // tiles.joint_cols if self.tdt else 1

    def weight_bytes(self) -> int:
        """Bytes of weights a step reads (the table's one row aside): the floor of its memory traffic."""
        weights = [self.w_hh, self.w_pred, self.w_out, *self.w_ih]
        return sum(w.numel() * w.element_size() for w in weights)

    def _scratch(self, buf) -> dict:
        """Per-buffers scratch, made on the first call (before any capture) and kept with the buffers."""
        if buf.scratch is None:
            n, w, device = buf.n, buf.window, buf.t.device
            blocks, duration_blocks = self.joint_blocks(self.tiles_for(n))
            partial, durations = (n * w, blocks), (n * w, _next_pow2(duration_blocks))
            gates = (self.layers, n, 4 * self.hidden)
            buf.scratch = dict(
                tok_val=torch.empty(partial, device=device),
                tok_idx=torch.empty(partial, device=device, dtype=torch.int32),
                dur_val=torch.full(durations, float("-inf"), device=device),
                dur_idx=torch.zeros(durations, device=device, dtype=torch.int32),
                hh=torch.empty(gates, device=device),
                emit=torch.zeros(n, device=device, dtype=torch.int32),
                states=((buf.h, buf.c), (torch.empty_like(buf.h), torch.empty_like(buf.c))),
            )  # read one, write the other
            if buf.fusion is not None:  # the token models' weighted scores, the fused choice's partials, the token
                models = len(buf.fusion.models)
                buf.scratch.update(
                    fused_b=torch.zeros(models, n, self.vocab - 1, device=device),
                    fus_val=torch.empty(partial, device=device),
                    fus_idx=torch.empty(partial, device=device, dtype=torch.int32),
                    tok=torch.zeros(n, device=device, dtype=torch.int32),
                )
        return buf.scratch

    def state(self, buf) -> tuple[torch.Tensor, torch.Tensor]:
        """The LSTM state (h, c) after the steps so far: `buf.h`, `buf.c` after an even number of steps."""
        return self._scratch(buf)["states"][buf.parity]

    def tiles_for(self, n: int) -> Tiles:
        """The tiles of the size class of n rows."""
        if n == 1:
            return self.one_row
        taller = [least for least in self.tall if n >= least]
        return self.tall[max(taller)] if taller else self.tiles

    def start(self, buf) -> None:
        """W_hh h of the state in `buf` (after `buf.restart`), which the first step reads."""
        s, tiles = self._scratch(buf), self.tiles_for(buf.n)
        h = s["states"][buf.parity][0]
        gate_blocks = triton.cdiv(self.hidden, tiles.units)
        hh_kernel[(self.layers * gate_blocks, triton.cdiv(buf.n, tiles.net_rows))](
            h,
            self.w_hh,
            s["hh"],
            buf.n,
            self.hidden,
            gate_blocks,
            BM=tiles.net_rows,
            BQ=4 * tiles.units,
            BK=tiles.net_k or tiles.k,
            FP32=tiles.net_arithmetic,
            num_warps=tiles.net_warps or tiles.warps,
            num_stages=tiles.gate_stages,
        )

    def __call__(self, buf, prediction=None, joint=None, blank_id: int = 0, max_symbols: int = 10) -> None:
        s, tiles = self._scratch(buf), self.tiles_for(buf.n)
        n, w, layers, hidden = buf.n, buf.window, self.layers, self.hidden
        (h, c), (h_out, c_out) = s["states"][buf.parity], s["states"][1 - buf.parity]
        buf.parity = 1 - buf.parity
        pdl, hh = self.pdl, s["hh"]
        gate_blocks = triton.cdiv(hidden, tiles.units)  # programs per layer over hidden units
        proj_blocks = triton.cdiv(self.joint_hidden, tiles.proj_cols)
        row_blocks = triton.cdiv(n, tiles.net_rows)
        blocks, duration_blocks = self.joint_blocks(tiles)
        launch = dict(PDL=pdl, launch_pdl=pdl)
        fusion, models = buf.fusion, 0
        if fusion is not None:  # the models' weighted scores, laid out for the joint's kernel
            models = len(fusion.models)
            fusion.scores(out=s["fused_b"])
        # without fusion its pointers are placeholders the kernels do not read
        fused_b, fus_val, fus_idx, tok = (
            s.get(name, s["tok_val"]) for name in ("fused_b", "fus_val", "fus_idx", "tok")
        )
        # the prediction net's float32 weights
        net = dict(
            launch,
            BM=tiles.net_rows,
            BK=tiles.net_k or tiles.k,
            FP32=tiles.net_arithmetic,
            num_warps=tiles.net_warps or tiles.warps,
            num_stages=tiles.gate_stages,
        )
        joint_kernel[(blocks, triton.cdiv(n * w, tiles.rows))](
            buf.enc,
            buf.g,
            buf.t,
            buf.active,
            self.w_out,
            self.b_out,
            s["tok_val"],
            s["tok_idx"],
            s["dur_val"],
            s["dur_idx"],
            fused_b,
            fus_val,
            fus_idx,
            n,
            buf.max_frames,
            w,
            self.joint_hidden,
            self.vocab,
            self.outputs,
            blocks,
            BM=tiles.rows,
            BC=tiles.joint_cols,
            BK=tiles.k,
            FP32=tiles.fp32 or "",
            TDT=self.tdt,
            NBD=_next_pow2(duration_blocks),
            K=models,
            num_warps=tiles.warps,
            num_stages=tiles.stages,
            **launch,
        )
        advance_kernel[(n,)](
            s["tok_val"],
            s["tok_idx"],
            s["dur_val"],
            s["dur_idx"],
            buf.t,
            buf.lengths,
            buf.active,
            buf.last_frame,
            buf.run,
            buf.count,
            buf.row_steps,
            buf.records,
            s["emit"],
            fus_val,
            fus_idx,
            tok,
            self.table,
            hh[0],
            h[0],
            c[0],
            h_out[0],
            c_out[0],
            w,
            blocks,
            hidden,
            buf.max_tokens,
            blank_id,
            max_symbols,
            WB=_next_pow2(w),
            NB=_next_pow2(blocks),
            NBD=_next_pow2(duration_blocks),
            HB=_next_pow2(hidden),
            TDT=self.tdt,
            DURATIONS=self.packed_durations,
            FUSED=models > 0,
            num_warps=tiles.advance_warps,
            PDL=pdl,
            launch_pdl=pdl,
        )
        for i in range(1, layers):  # layer i, and W_hh h of layer i - 1 for the next step
            lstm_kernel[(2 * gate_blocks, row_blocks)](
                h_out[i - 1],
                self.w_ih[i - 1],
                self.bias[i - 1],
                hh[i],
                h[i],
                c[i],
                h_out[i],
                c_out[i],
                s["emit"],
                self.w_hh[i - 1],
                hh[i - 1],
                n,
                hidden,
                gate_blocks,
                BU=tiles.units,
                **net,
            )
        top = layers - 1  # the projection, and W_hh h of the top layer for the next step
        project_kernel[(proj_blocks + gate_blocks, row_blocks)](
            h_out[top],
            self.w_pred,
            self.b_pred,
            buf.g,
            s["emit"],
            self.w_hh[top],
            hh[top],
            n,
            hidden,
            self.joint_hidden,
            proj_blocks,
            BC=tiles.proj_cols,
            BQ=4 * tiles.units,
            **net,
        )
        if fusion is not None:  # the rows that emitted move on in each model; blank never moves a state
            fusion.move(s["tok"].long(), s["emit"].bool())
