"""Compile the fused decode step's kernels, the encoder's, the beam search's and greedy fusion's lookups for a
Hopper GPU (sm_90) without one: Triton's compiler and ptxas run on the CPU. Run by tests/test_fused_step.py in a process of its own (without
the interpreter), which catches what the interpreter lets through (a global that is not a constexpr, say)."""

import inspect
from dataclasses import replace

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from graphscribe.model import beam_kernels as bk
from graphscribe.model import chain_kernels as ck
from graphscribe.model import encoder_kernels as ek
from graphscribe.model import fused_step as fs
from graphscribe.model import step_kernels as sk

F32, I32, I64 = "*fp32", "*i32", "*i64"


def compile_kernel(kernel, pointers: dict[str, str], constexprs: dict) -> None:
    """Scalars are i32 unless named; every parameter not in `constexprs` is a pointer in `pointers` or a scalar
    (named in `pointers` with its type, e.g. "fp32", if it is not an i32)."""
    signature = {
        name: "constexpr" if name in constexprs else pointers.get(name, "i32")
        for name in inspect.signature(kernel.fn).parameters
    }
    triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32))


def main() -> None:
    # (weights, tiles, whether the one-row class is made from them): the large batches' TALL tiles are not
    kinds = [
        ("*fp32", fs.FP32_TILES, True),
        ("*fp32", replace(fs.FP32_TILES, fp32="ieee"), True),
        ("*bf16", fs.HALF_TILES, True),
        *(("*fp32", replace(fs.FP32_TILES, **c), False) for c in fs.TALL.values()),
    ]
    for weights, tiles, with_one_row in kinds:
        mm = dict(BM=tiles.rows, BK=tiles.k, FP32=tiles.fp32 or "", PDL=True)
        # fused: token models (shallow fusion): TDT with two in the 16-bit tiles, RNN-T with one in float32's default
        fusion = ((True, 2),) if weights == "*bf16" else ((False, 1),) if tiles is fs.FP32_TILES else ()
        for tdt, fused in ((True, 0), (False, 0), *fusion):
            compile_kernel(
                sk.joint_kernel,
                dict(
                    enc=weights,
                    g=weights,
                    t=I64,
                    active="*i1",
                    w_out=weights,
                    b_out=F32,
                    tok_val=F32,
                    tok_idx=I32,
                    dur_val=F32,
                    dur_idx=I32,
                    fused_b=F32,
                    fus_val=F32,
                    fus_idx=I32,
                ),
                dict(mm, BC=tiles.joint_cols, TDT=tdt, NBD=2, K=fused),
            )
            compile_kernel(
                sk.advance_kernel,
                dict(
                    tok_val=F32,
                    tok_idx=I32,
                    dur_val=F32,
                    dur_idx=I32,
                    t=I64,
                    lengths=I64,
                    active="*i1",
                    last_frame=I64,
                    run=I64,
                    count=I64,
                    row_steps=I64,
                    records=I32,
                    emit_out=I32,
                    fus_val=F32,
                    fus_idx=I32,
                    tok_out=I32,
                    table=F32,
                    hh=F32,
                    h=F32,
                    c=F32,
                    h_out=F32,
                    c_out=F32,
                ),
                dict(WB=8, NB=256, NBD=2, HB=1024, TDT=tdt, DURATIONS=0x0403020100, PDL=True, FUSED=fused > 0),
            )
        # the prediction net (float32 weights whatever the dtype): tensor-core tiles, and the one-row class's
        # CUDA-core products
        for net in (tiles, replace(tiles, **fs.ONE_ROW)) if with_one_row else (tiles,):
            mm = dict(BM=net.net_rows, BK=net.net_k or net.k, FP32=net.net_arithmetic)
            compile_kernel(
                sk.lstm_kernel,
                dict(
                    x=F32,
                    w_ih=F32,
                    bias=F32,
                    hh=F32,
                    h=F32,
                    c=F32,
                    h_out=F32,
                    c_out=F32,
                    emit=I32,
                    w_hh_below=F32,
                    hh_below=F32,
                ),
                dict(mm, PDL=True, BU=net.units),
            )
            compile_kernel(
                sk.project_kernel,
                dict(x=F32, w_pred=F32, b_pred=F32, g=weights, emit=I32, w_hh_top=F32, hh_top=F32),
                dict(mm, PDL=True, BC=net.proj_cols, BQ=4 * net.units),
            )
            compile_kernel(sk.hh_kernel, dict(h=F32, w_hh=F32, hh=F32), dict(mm, BQ=4 * net.units))
    for half in ("*bf16", "*fp16"):  # the encoder's kernels (16-bit activations and weights)
        compile_kernel(
            ek._glu_depthwise_kernel,
            dict(
                h_ptr=half,
                valid_ptr="*i1",
                w_ptr=half,
                conv_bias_ptr=half,
                bn_w_ptr=half,
                bn_b_ptr=half,
                mean_ptr=half,
                var_ptr=half,
                out_ptr=half,
                eps="fp32",
            ),
            dict(K=9, HAS_BIAS=True, BLOCK_T=32, BLOCK_C=64),
        )
        compile_kernel(
            ek._first_conv_kernel,
            dict(x_ptr=half, len0_ptr=I64, len1_ptr=I64, w_ptr=half, bias_ptr=half, out_ptr=half),
            dict(BLOCK_P=64, BLOCK_C=64),
        )
        compile_kernel(
            ek._position_bias_kernel,
            dict(raw_ptr=half, segments_ptr=I64, out_ptr=half, scale="fp32"),
            dict(BLOCK_I=16, BLOCK_J=256),
        )
        for durations in (8, 0):  # TDT's, RNN-T's
            compile_kernel(
                bk._candidates_kernel,
                dict(logits_ptr=half, top_ptr=F32, token_ptr=I64, blank_ptr=F32, dur_ptr=F32),
                dict(K=4, BLOCK_V=16384, BLOCK_D=durations),
            )
            compile_kernel(
                bk._select_kernel,
                dict(
                    top_ptr=F32,
                    token_ptr=I64,
                    blank_ptr=F32,
                    dur_ptr=F32,
                    durations_ptr=I64,
                    scores_ptr=F32,
                    t_ptr=I64,
                    active_ptr="*i1",
                    lasts_ptr=I64,
                    count_ptr=I64,
                    hash_ptr=I64,
                    last_label_ptr=I64,
                    last_ptr=I64,
                    pos_ptr=I64,
                    labels_ptr=I32,
                    parents_ptr=I32,
                    frames_ptr=I32,
                    spans_ptr=I32,
                    source_ptr=I64,
                    step_label_ptr=I64,
                ),
                dict(MULT=6364136223846793005, K=4, KP=4, CP=128 if durations else 16, TDT=bool(durations)),
            )
    # greedy fusion's lookups: an LM's or a tree's dense root, and rows' own trees
    chain = dict(chain_ptr=I64, backoff_ptr=F32, total_ptr=F32, first_ptr=I64, count_ptr=I64, token_ptr=I64)
    for dense in (True, False):
        compile_kernel(
            ck._scores_kernel,
            dict(
                chain, states_ptr=I64, weight_ptr=F32, root_has_ptr="*i1", root_score_ptr=F32, out_ptr=F32, alpha="fp32"
            ),  # fmt: skip
            dict(DENSE_ROOT=dense, W=32, BLOCK_V=4096),
        )
        compile_kernel(
            ck._move_kernel,
            dict(
                chain,
                states_ptr=I64,
                tokens_ptr=I64,
                emit_ptr="*i1",
                target_ptr=I64,
                root_has_ptr="*i1",
                root_next_ptr=I64,
                roots_ptr=I64,
            ),  # fmt: skip
            dict(DENSE_ROOT=dense, W=32),
        )
    print("compiled")


if __name__ == "__main__":
    main()
