"""Whether a CUDA green context (`torch.cuda.GreenContext`: a share of the GPU's SMs) limits the work sent to its
stream, eagerly and through a CUDA graph captured on that stream or on another one, and whether a small kernel on a
stream outside the share runs beside a large one inside it rather than after it.

    python scripts/experiments/green_probe.py --sms 66 --json out.json

Prints and writes ms per call, medians of a few runs: a bfloat16 matmul eager on the default stream and on the green
stream; its graph captured on the default stream, replayed on each; captured on the green stream, replayed on each;
and a chain of small matmuls (the decode's kind of work) alone, beside the large one on the default stream, and
beside it on the green stream.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch


def timed(run, stream: torch.cuda.Stream, repeat: int = 5) -> float:
    """Median ms of run() on `stream`, after one call to warm up."""
    with torch.cuda.stream(stream):
        run()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            begin.record()
            run()
            end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    return round(statistics.median(times), 3)


def captured(run, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    with torch.cuda.stream(stream):
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        run()
    torch.cuda.synchronize()
    return graph


def triton_add(stream: torch.cuda.Stream) -> str:
    """A Triton kernel launched on `stream` (its module loaded where Triton loads it): "ok" if its sums are right."""
    import triton
    import triton.language as tl

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + at, tl.load(x + at, mask=at < n) + tl.load(y + at, mask=at < n), mask=at < n)

    x = torch.arange(4096, device="cuda", dtype=torch.float32)
    out = torch.empty_like(x)
    with torch.cuda.stream(stream):
        add[(4,)](x, x, out, x.numel(), BLOCK=1024)
    torch.cuda.synchronize()
    return "ok" if torch.equal(out, 2 * x) else "wrong sums"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sms", type=int, default=66)
    parser.add_argument("--json")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    green = torch.cuda.GreenContext.create(args.sms, 0)
    inside = green.Stream()
    inside = torch.cuda.Stream(
        stream_id=inside.stream_id, device_index=inside.device_index, device_type=inside.device_type
    )
    plain = torch.cuda.Stream()
    side = torch.cuda.Stream(priority=-1)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    small_x = torch.randn(32, 1024, device="cuda", dtype=torch.bfloat16)
    small_w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)

    def large():
        for _ in range(10):
            torch.mm(a, b)

    def small():
        x = small_x
        for _ in range(400):
            x = torch.tanh(x @ small_w)
        return x

    report = {"sms": props.multi_processor_count, "green_sms": args.sms}

    def attempt(name, call):
        try:
            report[name] = call()
        except Exception as err:  # noqa: BLE001 - a probe: what failed is the finding
            report[name] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            torch.cuda.synchronize()

    attempt("large_eager_plain", lambda: timed(large, plain))
    attempt("large_eager_green", lambda: timed(large, inside))
    g_plain, g_green = captured(large, plain), captured(large, inside)
    attempt("large_graph_plain_on_plain", lambda: timed(g_plain.replay, plain))
    attempt("large_graph_plain_on_green", lambda: timed(g_plain.replay, inside))
    attempt("large_graph_green_on_green", lambda: timed(g_green.replay, inside))
    attempt("large_graph_green_on_plain", lambda: timed(g_green.replay, plain))
    attempt("small_alone", lambda: timed(small, side))
    for where, stream, graph in (("plain", plain, g_plain), ("green", inside, g_green)):
        torch.cuda.synchronize()
        begin, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        with torch.cuda.stream(stream):
            begin.record()
            graph.replay()
        side.wait_event(begin)
        with torch.cuda.stream(side):
            small()
            mid.record()
        with torch.cuda.stream(stream):
            end.record()
        torch.cuda.synchronize()
        report[f"small_beside_large_{where}"] = round(begin.elapsed_time(mid), 3)
        report[f"large_with_small_{where}"] = round(begin.elapsed_time(end), 3)
    attempt("triton_on_green", lambda: triton_add(inside))
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
