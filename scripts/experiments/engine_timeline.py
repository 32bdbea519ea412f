"""Where a batch's wall time goes in one engine under N clients: the GPU's timeline of each batch and the batching
thread's host time, from CUDA events and clocks around the pipeline's stages (no profiler, so no profiler overhead).

An engine with 64 requests in flight (32-row batches) serves about two thirds of what one with 128 (63-row
batches) does (`engine_load.py`); this shows where each batch's time goes. It wraps `pipeline._start` (a batch's
copy, features and encoder, launched while the batch before decodes), `LoadedModel.decode` and the stages around
them, records a CUDA event before each batch's features, before its encoder layers and after them (on the
encoder's stream) and before and after its decode (on the decode stream), and reports per batch, as medians over a
level: the encoder stream's time (features and layers) and the layers' alone, the decode's GPU time, the encoder
stream's gap between one batch's encoder and the next one's (the GPU's encoder work waiting for the host), the
decode's wait for its own encoder, and the host time of each wrapped call. `--sync-debug` runs one more level under
`torch.cuda.set_sync_debug_mode("warn")` and counts the synchronizing calls by the graphscribe frames that made them.

    python scripts/experiments/engine_timeline.py -m v3.nemo --dtype bfloat16 --folder /tmp/f4096 --clients 64,128

`--replay-features on,off` alternates the packed features replayed from their graphs and computed eagerly, level by
level in one process (the graphs captured at the warm-up either way). `--windows 0,2` alternates the decoder's frames
a step (0: `decoding.WINDOWS`' choice by batch size class; each a decoder of its own, warmed by one unreported
level at each client count first); each level reports the decode's steps and host reads a batch. `--green-sms N`
puts each batch's copy, features and encoder (and the graphs they replay, captured there) on a CUDA green context
of N SMs, the decode on the whole GPU as before, so that its small step kernels find SMs the encoder cannot take
(the ninth 2026-11-29 session in bench/README.md: the encoder loses more than the decode gains).
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import statistics
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_load import level, model_arguments  # noqa: E402

from graphscribe.runtime import loaded, pipeline, scheduler  # noqa: E402
from graphscribe.serve import service as service_module  # noqa: E402
from graphscribe.serve.service import Service  # noqa: E402

HOST_CALLS = {  # (module or class, attribute): the calls timed on the host
    "start": (pipeline, "_start"),
    "decode_stage": (pipeline, "_decode"),
    "transcripts": (pipeline, "_transcripts"),
    "take": (service_module.Service, "_take"),
    "schedule": (scheduler.Scheduler, "take"),
    "features": (loaded.LoadedModel, "batch_features"),
    "front_packing": (loaded.LoadedModel, "front_packing"),
    "encoder": (loaded.LoadedModel, "encoder_output"),
    "decode": (loaded.LoadedModel, "decode"),
}


class Timeline:
    """Host times of the wrapped calls on the batching thread and CUDA events around each batch's stages."""

    def __init__(self):
        self.host: dict[str, list[float]] = collections.defaultdict(list)
        # before its features, before its encoder layers (`encoder_output`), after them; rows
        self.encoders: list[tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event, int]] = []
        self._layers: torch.cuda.Event | None = None  # the batch being started's mark before its encoder
        self.decodes: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.steps: list[tuple[int, int]] = []  # each decode's queued steps and host reads
        self.on = False

    def reset(self) -> None:
        torch.cuda.synchronize()
        self.host.clear()
        self.encoders.clear()
        self.decodes.clear()
        self.steps.clear()
        self.base = torch.cuda.Event(enable_timing=True)
        self.base.record()

    def wrap(self) -> None:
        for name, (owner, attribute) in HOST_CALLS.items():
            setattr(owner, attribute, self._timed(name, getattr(owner, attribute)))
        start, decode, encoder = pipeline._start, loaded.LoadedModel.decode, loaded.LoadedModel.encoder_output

        def started(model, batch, clock):
            before, self._layers = self._event(), None
            job = start(model, batch, clock)
            if self.on and batch.indices and job.encoded is not None and self._layers is not None:
                self.encoders.append((before, self._layers, self._event(), len(batch.indices)))
            return job

        def encoding(model, *args, **kwargs):
            self._layers = self._event()
            return encoder(model, *args, **kwargs)

        def decoding(model, encoded, *args, **kwargs):
            before = self._event()
            hyps = decode(model, encoded, *args, **kwargs)
            if self.on:
                self.decodes.append((before, self._event()))
                self.steps.append((model.decoder.queued_steps, model.decoder.host_reads))
            return hyps

        pipeline._start, loaded.LoadedModel.decode, loaded.LoadedModel.encoder_output = started, decoding, encoding

    def _event(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _timed(self, name, call):
        @functools.wraps(call)
        def timed(*args, **kwargs):
            if not self.on or threading.current_thread().name != "graphscribe-batch":
                return call(*args, **kwargs)
            began = time.perf_counter()
            result = call(*args, **kwargs)
            if name == "transcripts":  # a generator: timed as it is drained
                result = list(result)
            self.host[name].append(1000 * (time.perf_counter() - began))
            return iter(result) if name == "transcripts" else result

        return timed

    def report(self) -> dict:
        torch.cuda.synchronize()

        def at(event) -> float:
            return self.base.elapsed_time(event)

        enc = [(at(a), at(c), rows) for a, _, c, rows in self.encoders]
        layers = [at(c) - at(b) for _, b, c, _ in self.encoders]
        dec = [(at(a), at(b)) for a, b in self.decodes]
        n = min(len(enc), len(dec))

        def med(values) -> float:
            return round(statistics.median(values), 2) if values else 0.0

        busy = _union([(a, b) for a, b, _ in enc] + dec)
        window = max(b for _, b in dec) - min(a for a, _, _ in enc) if n else 0.0
        return {
            "batches": n,
            "encoder_gpu_ms": med([b - a for a, b, _ in enc]),  # features, then the encoder's layers
            "layers_gpu_ms": med(layers),  # from `encoder_output`'s launch (or the stream reaching it) to its end
            "encoder_stream_gap_ms": med([max(0.0, enc[k + 1][0] - enc[k][1]) for k in range(len(enc) - 1)]),
            "decode_gpu_ms": med([b - a for a, b in dec]),  # from its encoder's end (or its launch) to its end
            "decode_after_encoder_ms": med([dec[k][0] - enc[k][1] for k in range(n)]),
            "period_ms": med([enc[k + 1][0] - enc[k][0] for k in range(len(enc) - 1)]),
            "gpu_idle_share": round(1 - busy / window, 3) if window else 0.0,
            "decode_steps": med([s for s, _ in self.steps]),
            "host_reads": med([r for _, r in self.steps]),
            "host_ms_per_call": {
                name: {"calls": len(v), "p50": med(v), "sum": round(sum(v), 1)} for name, v in self.host.items()
            },
        }


def on_green(sms: int):
    """The encoder's side of every batch (`pipeline._start`, and the graphs captured in it) on a green context of
    `sms` SMs; the decode's stream and graphs stay on the whole GPU. Returns the context (kept alive by the caller)."""
    from graphscribe.model import graphs

    made = torch.cuda.GreenContext.create(sms, torch.cuda.current_device())
    s = made.Stream()
    green = torch.cuda.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)
    plain = graphs._capture_stream()

    def capture_stream() -> torch.cuda.Stream:  # a graph captured on the green stream runs on its SMs only
        return green if torch.cuda.current_stream().cuda_stream == green.cuda_stream else plain

    graphs._capture_stream = capture_stream
    start = pipeline._start

    def started(*args, **kwargs):
        with torch.cuda.stream(green):
            return start(*args, **kwargs)

    pipeline._start = started
    return made


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def sync_calls(service: Service, batches: list[int], audios: list, clients: int) -> list[dict]:
    """One level under the sync debug mode: the synchronizing calls by the innermost graphscribe frames."""
    counts: collections.Counter = collections.Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return shown(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack() if "graphscribe" in f.filename][-4:]
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(frames))
        counts[(threading.current_thread().name, where)] += 1

    warnings.showwarning = record
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        level(service, batches, audios, clients)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = shown
    return [{"thread": t, "where": w, "calls": c} for (t, w), c in counts.most_common(20)]


def main() -> None:
    parser, load = model_arguments(__doc__.splitlines()[0], "64,128")
    parser.add_argument("--sync-debug", type=int, help="one more level at this many clients, its syncs counted")
    parser.add_argument(
        "--replay-features",
        default="on",
        help="on,off: packed features replayed from graphs (`graphs.FeatureGraphs`) or eager, alternated per level",
    )
    parser.add_argument("--windows", default="0", help="0,2: the decoder's frames a step (0: by batch size class)")
    parser.add_argument("--green-sms", type=int, default=0, help="the encoder's side on a green context of N SMs")
    parser.add_argument("--json")
    args = parser.parse_args()
    model, audios = load(args)
    levels = [int(c) for c in args.clients.split(",")]
    windows = [int(w) for w in args.windows.split(",")]
    decoders = {w: model.decoder if w == 0 else model._new_decoder() for w in windows}
    for w, decoder in decoders.items():
        decoder.window = w or None
    batches: list[int] = []
    timeline = Timeline()
    timeline.wrap()
    green = on_green(args.green_sms) if args.green_sms else None  # noqa: F841 - alive while the engine runs
    service = Service(model, None, 0.0, on_batch=lambda rows, padded: batches.append(rows))
    service.start()
    service.wait_ready()
    if len(windows) > 1:  # each decoder's graphs captured before the timed levels
        for w, clients in itertools.product(windows, sorted(set(levels))):
            model.decoder = decoders[w]
            level(service, batches, audios, clients)
    rows = []
    for clients in levels:
        for memory, replay, w in itertools.product(args.memory.split(","), args.replay_features.split(","), windows):
            model._feature_graphs.enabled = replay == "on"
            model.decoder = decoders[w]
            timeline.reset()
            timeline.on = True
            row = level(service, batches, audios, clients, memory)
            row["replay_features"] = replay
            row["window"] = w
            row["green_sms"] = args.green_sms
            timeline.on = False
            row.update(timeline.report())
            rows.append(row)
            print(json.dumps(row), flush=True)
    syncs = sync_calls(service, batches, audios, args.sync_debug) if args.sync_debug else None
    for entry in syncs or []:
        print(json.dumps(entry), flush=True)
    service.close()
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"model": args.model, "dtype": args.dtype, "levels": rows, "syncs": syncs}, out, indent=1)


if __name__ == "__main__":
    main()
