"""One engine alone under a closed loop of N clients, in process: how its throughput grows with the requests in flight.

`transcribe serve --devices all` on two GPUs splits 128 clients' requests over two engine processes, 64 in flight
each. Two GPUs make 1.9x one GPU only if an engine with 64 requests in flight does nearly what one with 128 does.
This measures that curve without HTTP, workers or pipes: the files decoded to samples first, then per level N, N
threads that each submit a request to one `Service` (the server's engine, warmed up as it is; its samples copied
into `Service.samples_buffer`, pinned beside a GPU, as the server receives them; `--memory pageable`: as read),
wait for its answer and submit the next, over every file of the folder once. Per level: RTFx, requests a second,
request latency p50 / p95 (submit to answer), the batches' mean rows, and `alone`: the batches decoded with no next
one queued beside them (`Service.alone`).

    python scripts/experiments/engine_load.py -m v3.nemo --dtype bfloat16 --folder /tmp/f4096 --clients 32,64,128,256

`--profile N`: one more pass at N clients under torch.profiler, its summary beside the levels: the pass's wall time,
the GPU's kernel time (summed over streams, so overlapping kernels count twice), the batching thread's time in the
calls it makes most, and the ten kernels and operators with the most GPU time; `--trace FILE`: its Chrome trace.
`--barrier DIR:N`: N such processes start each level together (two engines on one GPU, each with its clients).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Callable

import torch

from graphscribe import load_model
from graphscribe.io.audio import find_audio_files, read_input
from graphscribe.runtime.latency import percentile
from graphscribe.serve.service import Service


def level(service: Service, batches: list[int], audios: list, clients: int, memory: str = "pinned") -> dict:
    """Every audio once, `clients` at a time, each client submitting its next as its last is answered; `batches`:
    the rows of each batch the service forms (its `on_batch`). memory: "pinned" (each request's samples copied into
    `Service.samples_buffer`, as the server receives them) or "pageable" (submitted as read)."""
    batches.clear()
    service.alone = 0
    latencies: list[float] = []
    order = iter(range(len(audios)))
    lock = threading.Lock()

    def client() -> None:
        answered = threading.Event()
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return
            answered.clear()
            start = time.perf_counter()
            audio = audios[i]
            if memory == "pinned":
                audio = service.samples_buffer(audio.numel()).copy_(audio)
            service.submit(audio, False, lambda *_: answered.set(), f"file {i}")
            answered.wait()
            latencies.append(time.perf_counter() - start)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    seconds = sum(a.numel() for a in audios) / service.model.sample_rate
    return {
        "clients": clients,
        "memory": memory,
        "rtfx": round(seconds / wall, 1),
        "requests_per_second": round(len(audios) / wall, 1),
        "latency_ms": {f"p{q}": round(1000 * percentile(latencies, q), 1) for q in (50, 95)},
        "batches": len(batches),
        "mean_rows": round(sum(batches) / max(1, len(batches)), 1),
        "alone": service.alone,  # batches decoded with nothing queued beside them
    }


def profiled(service: Service, batches: list[int], audios: list, clients: int, trace: str | None) -> dict:
    """One `level` under torch.profiler: where a batch's time goes at `clients` in flight."""
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    # the batching thread's operators too, not only this thread's
    with profile(activities=activities, experimental_config=_ExperimentalConfig(profile_all_threads=True)) as prof:
        row = level(service, batches, audios, clients)
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_ms = sum(e.self_device_time_total for e in kernels) / 1000

    def top(items, key) -> list[dict]:
        items = sorted(items, key=key, reverse=True)[:10]
        return [{"name": e.key[:90], "calls": e.count, "ms": round(key(e) / 1000, 1)} for e in items]

    if trace:
        prof.export_chrome_trace(trace)
    wall_ms = 1000 * len(audios) / row["requests_per_second"]
    return {
        **row,
        "wall_ms": round(wall_ms, 1),
        "gpu_kernel_ms": round(gpu_ms, 1),
        "gpu_kernel_ms_per_batch": round(gpu_ms / max(1, row["batches"]), 2),
        "wall_ms_per_batch": round(wall_ms / max(1, row["batches"]), 2),
        "kernels": top(kernels, lambda e: e.self_device_time_total),
        "host_ops": top(
            [e for e in events if e.device_type != torch.autograd.DeviceType.CUDA], lambda e: e.cpu_time_total
        ),
    }


def meet(barrier: str, step: int) -> None:
    """Wait until N processes (`DIR:N`) have reached level `step`: each leaves a file in DIR."""
    folder, n = barrier.rsplit(":", 1)
    os.makedirs(folder, exist_ok=True)
    open(os.path.join(folder, f"{step}-{os.getpid()}"), "w").close()
    while sum(name.startswith(f"{step}-") for name in os.listdir(folder)) < int(n):
        time.sleep(0.005)


def model_arguments(description: str, clients: str) -> tuple[argparse.ArgumentParser, Callable]:
    """A parser with the model, device, folder and client levels' options, and `load(args)` -> (model, the folder's
    samples): this script's and `engine_timeline.py`'s."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--folder", required=True)
    parser.add_argument("--clients", default=clients)
    parser.add_argument(
        "--memory", default="pinned", help="pinned,pageable: where the requests' samples are (`level`), alternated"
    )

    def load(args):
        model = load_model(args.model, dtype=args.dtype, device=args.device)
        return model, [read_input(path, model.sample_rate) for path in find_audio_files(args.folder)]

    return parser, load


def main() -> None:
    parser, load = model_arguments(__doc__.splitlines()[0], "32,64,128,256")
    parser.add_argument("--repeat", type=int, default=2, help="passes over the folder per level")
    parser.add_argument("--json")
    parser.add_argument(
        "--barrier",
        help="DIR:N: before each level, wait until N processes given the same DIR reach it (engines sharing a GPU)",
    )
    parser.add_argument("--profile", type=int, help="one more pass at this many clients under torch.profiler")
    parser.add_argument("--trace", help="--profile's Chrome trace to this file")
    args = parser.parse_args()
    model, audios = load(args)
    batches: list[int] = []
    # no wait for company: a client here submits its next request the moment its answer comes
    service = Service(model, None, 0.0, on_batch=lambda rows, padded: batches.append(rows))
    service.start()
    service.wait_ready()
    rows = []
    for clients in (int(c) for c in args.clients.split(",")):
        for _ in range(args.repeat):
            for memory in args.memory.split(","):
                if args.barrier:
                    meet(args.barrier, len(rows))
                row = level(service, batches, audios, clients, memory)
                rows.append(row)
                print(json.dumps(row), flush=True)
    profile_row = None
    if args.profile:
        profile_row = profiled(service, batches, audios, args.profile, args.trace)
        print(json.dumps(profile_row, indent=1), flush=True)
    service.close()
    if args.json:
        report = {"model": args.model, "device": str(model.device), "dtype": args.dtype, "files": len(audios)}
        with open(args.json, "w") as out:
            json.dump({**report, "levels": rows, "profiled": profile_row}, out, indent=1)


if __name__ == "__main__":
    main()
