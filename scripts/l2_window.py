#!/usr/bin/env python
"""Experiment: does keeping the decode step's weights in the GPU's L2 cache (an access policy window with
persisting hits) make the fused step faster?

    python scripts/l2_window.py --model v3.nemo [--dtypes float32,bfloat16] [--json F]

A step reads the prediction net (float32, ~21 MB for the 0.6b) and the joint's output layer (21 MB in float32,
10.5 MB in bfloat16) once, and nothing else of note: the whole set is near the H100's 50 MB L2. The script lays
the weights out in one buffer, marks a range of it persisting (driver API through ctypes: the stream for eager
steps, every kernel node of the captured graphs for graph replay), and times the 77 s and 7.4 s tiers
(median of --reps), checking the token ids against the run without a window.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time

import torch

import graphscribe as gs
import graphscribe.graphs as graphs
from graphscribe.bench import tier_clips
from graphscribe.decoding import GreedyDecoder

cuda = ctypes.CDLL("libcuda.so.1")
ATTR_L2 = 38  # CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE
ATTR_MAX_PERSISTING = 108  # CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE
ATTR_MAX_WINDOW = 109  # CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE
LIMIT_PERSISTING = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE
ACCESS_POLICY_WINDOW = 1  # CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW (stream and kernel node attribute)
STREAMING, PERSISTING = 1, 2  # CUaccessProperty
NODE_KERNEL = 0  # CU_GRAPH_NODE_TYPE_KERNEL


class Window(ctypes.Structure):
    _fields_ = [
        ("base_ptr", ctypes.c_void_p),
        ("num_bytes", ctypes.c_size_t),
        ("hitRatio", ctypes.c_float),
        ("hitProp", ctypes.c_int),
        ("missProp", ctypes.c_int),
    ]


class AttrValue(ctypes.Union):
    _fields_ = [("accessPolicyWindow", Window), ("pad", ctypes.c_char * 64)]


def check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def device_attr(attr: int) -> int:
    value = ctypes.c_int()
    check(cuda.cuDeviceGetAttribute(ctypes.byref(value), attr, torch.cuda.current_device()), "cuDeviceGetAttribute")
    return value.value


WINDOW: AttrValue | None = None  # the window of the current configuration (None: no window)
NODES_SET = [0]


def set_stream_window(stream: torch.cuda.Stream) -> None:
    value = WINDOW if WINDOW is not None else AttrValue()
    check(
        cuda.cuStreamSetAttribute(ctypes.c_void_p(stream.cuda_stream), ACCESS_POLICY_WINDOW, ctypes.byref(value)),
        "cuStreamSetAttribute",
    )


def set_node_windows(raw_graph: int) -> int:
    count = ctypes.c_size_t()
    check(cuda.cuGraphGetNodes(ctypes.c_void_p(raw_graph), None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * count.value)()
    check(cuda.cuGraphGetNodes(ctypes.c_void_p(raw_graph), nodes, ctypes.byref(count)), "cuGraphGetNodes")
    kernels = 0
    for node in nodes:
        kind = ctypes.c_int()
        check(cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType")
        if kind.value == NODE_KERNEL:
            check(
                cuda.cuGraphKernelNodeSetAttribute(ctypes.c_void_p(node), ACCESS_POLICY_WINDOW, ctypes.byref(WINDOW)),
                "cuGraphKernelNodeSetAttribute",
            )
            kernels += 1
    return kernels


class WindowedSteps(graphs.CapturedSteps):
    """CapturedSteps whose kernel nodes get the window before the graph is instantiated."""

    def __init__(self, step, steps, pool, before_capture=None, warm_up=True):
        if warm_up:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            if before_capture is not None:
                before_capture()
        self.graph = torch.cuda.CUDAGraph(keep_graph=WINDOW is not None)
        with torch.cuda.graph(self.graph, pool=pool):
            for _ in range(steps):
                step()
        if WINDOW is not None:
            NODES_SET[0] = set_node_windows(self.graph.raw_cuda_graph())
            self.graph.instantiate()
        torch.cuda.synchronize()
        self.steps, self.capture_seconds = steps, 0.0


def arena(fused, order: list[str]) -> dict[str, tuple[int, int]]:
    """Copy the step's weights into one buffer in `order`; return each one's byte range in it."""
    tensors = {
        "w_hh": fused.w_hh,
        "w_ih": fused.w_ih[0] if fused.w_ih else None,
        "w_pred": fused.w_pred,
        "w_out": fused.w_out,
    }
    tensors = {k: v for k, v in tensors.items() if v is not None}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    buf = torch.empty(total + 256 * len(tensors), dtype=torch.uint8, device=fused.w_out.device)
    ranges, offset = {}, 0
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        view = buf[offset : offset + nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        ranges[name] = (offset, nbytes)
        if name == "w_ih":
            fused.w_ih = [view]
        else:
            setattr(fused, name, view)
        offset += -(-nbytes // 256) * 256
    fused._arena = buf
    return ranges


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    l2, max_persist, max_window = device_attr(ATTR_L2), device_attr(ATTR_MAX_PERSISTING), device_attr(ATTR_MAX_WINDOW)
    print(
        f"L2 {l2 / 2**20:.1f} MiB, max persisting {max_persist / 2**20:.1f} MiB, max window {max_window / 2**20:.1f} MiB"
    )
    graphs.CapturedSteps = WindowedSteps
    import graphscribe.decoding  # noqa: F401  (imports CapturedSteps from graphs at call time)

    global WINDOW
    rows = []
    order = ["w_hh", "w_ih", "w_pred", "w_out"]
    for dtype in args.dtypes.split(","):
        model = gs.load_model(args.model, device="cuda", dtype=dtype)
        tiers = tier_clips(model)
        clips = {"77s": tiers[-1].audio, "7.4s": tiers[0].audio}
        encoded = {}
        for name, audio in clips.items():
            enc, lengths = model.encode([audio])
            encoded[name] = (enc, lengths)
        reference = {}
        for config in ["none", "pred", "joint", "all-scaled", "all", "none-again"]:
            WINDOW = None
            check(cuda.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")
            check(
                cuda.cuCtxSetLimit(LIMIT_PERSISTING, ctypes.c_size_t(0 if config.startswith("none") else max_persist)),
                "cuCtxSetLimit",
            )
            for graphs_on in (True, False):
                decoder = GreedyDecoder(
                    model.module.decoder, model.module.joint, model.cfg.decoding, graphs=graphs_on, fused=True
                )
                fused = decoder._step_fn(torch.device("cuda"), next(iter(encoded.values()))[0].dtype)
                ranges = arena(fused, order)
                size = sum(n for _, n in ranges.values())
                if config == "pred":
                    lo, hi = ranges["w_hh"][0], ranges["w_pred"][0] + ranges["w_pred"][1]
                elif config == "joint":
                    lo, hi = ranges["w_out"][0], ranges["w_out"][0] + ranges["w_out"][1]
                elif config.startswith("all"):
                    lo, hi = 0, ranges["w_out"][0] + ranges["w_out"][1]
                if not config.startswith("none"):
                    nbytes = hi - lo
                    ratio = 1.0 if config != "all-scaled" else min(1.0, max_persist / nbytes)
                    WINDOW = AttrValue()
                    WINDOW.accessPolicyWindow = Window(
                        fused._arena.data_ptr() + lo, nbytes, ratio, PERSISTING, STREAMING
                    )
                stream = torch.cuda.Stream()
                set_stream_window(stream)
                with torch.cuda.stream(stream):
                    for name, (enc, lengths) in encoded.items():
                        for batch in (1, 8):
                            e = enc.expand(batch, -1, -1).contiguous()
                            ln = lengths.expand(batch).contiguous()
                            hyps = decoder.decode(e, ln)  # warm-up (and capture)
                            times = []
                            for _ in range(args.reps):
                                torch.cuda.synchronize()
                                start = time.perf_counter()
                                hyps = decoder.decode(e, ln)
                                torch.cuda.synchronize()
                                times.append(time.perf_counter() - start)
                            key = (name, batch)
                            tokens = [h.token_ids for h in hyps]
                            same = reference.setdefault(key, tokens) == tokens
                            row = dict(
                                dtype=dtype,
                                config=config,
                                graphs=graphs_on,
                                clip=name,
                                batch=batch,
                                ms=round(1e3 * statistics.median(times), 3),
                                best_ms=round(1e3 * min(times), 3),
                                window_mb=round((hi - lo) / 2**20, 1) if WINDOW is not None else 0,
                                weights_mb=round(size / 2**20, 1),
                                same_tokens=same,
                                steps=hyps[0].steps,
                                kernel_nodes=NODES_SET[0] if graphs_on and WINDOW is not None else None,
                            )
                            rows.append(row)
                            print(json.dumps(row), flush=True)
                WINDOW = None
                set_stream_window(stream)
        del model
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
