"""The server's batching without HTTP: N client threads in a closed loop submit a folder's files (decoded into memory
first) to one `Service`, each sending its next file as soon as its answer is in. Per pass: RTFx, batches, rows a
batch, padded seconds over audio seconds, graph capture seconds. A variant sets the Scheduler's cost rule for every
dtype (fixed=F,extra=G; service.batch_cost), service.OVERDUE_SECONDS, graphs.LayerGraphs.KEEP_BYTES (keep=BYTES), the
Service's max_batch (rows=N) and packed rows off (pack=0: packing.Packing.MAX_SHARE = 0) before its Service is made
(and warmed up); unset, each is as shipped.

    python scripts/experiments/service_policy.py -m v3.nemo --folder /tmp/f4096 --clients 128 --reps 2 \\
        --variant "" --variant pack=0,fixed=88.8,extra=1.24 --variant keep=1073741824
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import graphscribe.model.graphs
import graphscribe.model.packing
import graphscribe.serve.service
from graphscribe import load_model
from graphscribe.io.audio import find_audio_files
from graphscribe.serve.service import Service


def parse_variant(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (part.split("=") for part in text.split(",") if part)}


def one_pass(service: Service, audios: list, clients: int) -> float:
    order, lock = iter(range(len(audios))), threading.Lock()

    def client() -> None:
        answered = threading.Event()
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return
            answered.clear()
            service.submit(audios[i], False, lambda t, q: answered.set())
            answered.wait()

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--json")
    args = parser.parse_args()
    model = load_model(args.model, dtype=args.dtype)
    paths = find_audio_files(args.folder)
    with ThreadPoolExecutor(8) as pool:
        audios = list(pool.map(model.read, paths))
    seconds = sum(a.numel() for a in audios) / model.sample_rate
    rows = []
    shipped_cost = graphscribe.serve.service.batch_cost
    shipped_keep, shipped_overdue = (
        graphscribe.model.graphs.LayerGraphs.KEEP_BYTES,
        graphscribe.serve.service.OVERDUE_SECONDS,
    )
    shipped_share = graphscribe.model.packing.Packing.MAX_SHARE
    for text in args.variant or [""]:
        knobs = parse_variant(text)
        if "fixed" in knobs:  # the cost rule with these constants, for every device and dtype
            rule = (knobs["fixed"], knobs.get("extra", 0.0))
            graphscribe.serve.service.batch_cost = lambda model, rule=rule: rule
        else:
            graphscribe.serve.service.batch_cost = shipped_cost
        graphscribe.model.packing.Packing.MAX_SHARE = shipped_share if knobs.get("pack", 1) else 0.0
        graphscribe.serve.service.OVERDUE_SECONDS = knobs.get("overdue", shipped_overdue)
        graphscribe.model.graphs.LayerGraphs.KEEP_BYTES = int(knobs.get("keep", shipped_keep))
        batches: list[tuple[int, float]] = []
        service = Service(
            model,
            max_batch=int(knobs["rows"]) if "rows" in knobs else None,
            on_batch=lambda r, p: batches.append((r, p)),
        )
        service.start()
        service.wait_ready()
        for rep in range(args.reps):
            batches.clear()
            captured = model.capture_seconds
            wall = one_pass(service, audios, args.clients)
            row = {
                "variant": text or "shipped",
                "rep": rep,
                "clients": args.clients,
                "rtfx": round(seconds / wall, 1),
                "wall_s": round(wall, 3),
                "batches": len(batches),
                "rows_mean": round(sum(r for r, _ in batches) / len(batches), 1),
                "padded_over_audio": round(sum(p for _, p in batches) / seconds, 3),
                "capture_s": round(model.capture_seconds - captured, 3),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        service.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
