"""`transcribe bench --streams N,N,... --folder DIR`: live streams on one engine, N at once.

Each file is a stream. `--pace realtime`: a stream's audio arrives at real-time pace in pieces of
`PIECE_SECONDS`, the N streams' starts spread over one chunk; a chunk's latency runs from the moment its audio
has arrived (the last sample of the chunk, and then one piece more: a chunk is stepped once audio past it has
come) to the end of the step that decoded it, and a stream's finalisation latency from its last sample to its
`done`. The level keeps up when the chunks' p95 latency is at most the chunk. `--pace max`: every stream's audio
is there at once and the engine steps as fast as it goes (NeMo's `nemo_stream.py` measures so), N streams open at
a time, the next file joining as one ends: the real-time factor.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from graphscribe.io.audio import AudioError, read_input
from graphscribe.runtime.cache_aware_streams import engine_for
from graphscribe.runtime.latency import BEHIND_SHOWN, behind, lateness, percentile
from graphscribe.runtime.streaming import StreamEngine

PIECE_SECONDS = 0.02  # a real-time source's appends


@dataclass
class _Live:
    """One stream of a real-time level: its audio, when it starts, what has been fed and measured."""

    audio: np.ndarray
    start: float  # seconds after the level's start
    stream: object = None
    fed: int = 0
    stepped: int = 0
    latencies: list[float] = field(default_factory=list)
    done_latency: float | None = None


def read_folder(paths: list[Path], rate: int) -> tuple[list[np.ndarray], list[str]]:
    audios, errors = [], []
    for path in paths:
        try:
            audios.append(read_input(path, rate).numpy())
        except AudioError as err:
            errors.append(str(err))
    return audios, errors


def realtime_level(engine: StreamEngine, audios: list[np.ndarray], n: int, trace: list | None = None) -> dict:
    """N streams at real-time pace (files reused in turn when N is larger than the folder); `trace`: a list that
    gets each step's start (ms into the level), rows, feeding and step milliseconds."""
    g = engine.geometry
    rate, chunk_s = g.sample_rate, g.frame_samples / g.sample_rate
    piece = max(1, int(PIECE_SECONDS * rate))
    lives = [_Live(audios[i % len(audios)], chunk_s * i / n) for i in range(n)]
    busy = 0.0  # seconds spent stepping
    loop = {"feed": [], "step": [], "after": [], "rows": []}  # each step's stages: where a tail comes from
    t0 = time.perf_counter()
    open_lives = list(lives)
    while open_lives:
        now = time.perf_counter() - t0
        for live in open_lives:
            if now < live.start or live.stream is not None and live.stream.finished:
                continue
            if live.stream is None:
                live.stream = engine.open()
            target = min(len(live.audio), int((now - live.start) * rate) // piece * piece)
            if target > live.fed:
                live.stream.feed(live.audio[live.fed : target])
                live.fed = target
            if live.fed == len(live.audio):
                live.stream.finish()
        ready = engine.ready()
        if not ready:
            wait = piece / rate - (time.perf_counter() - t0 - now)
            if wait > 0:
                time.sleep(wait)
            continue
        fed = time.perf_counter() - t0
        engine.step(ready)
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        after = time.perf_counter() - t0
        busy += after - now
        loop["feed"].append(fed - now)
        loop["step"].append(after - fed)
        loop["rows"].append(len(ready))
        if trace is not None:
            trace.append(
                [round(now * 1000, 1), len(ready), round((fed - now) * 1000, 2), round((after - fed) * 1000, 2)]
            )
        for live in open_lives:
            s = live.stream
            if s is None:
                continue
            while live.stepped < s.steps:
                k = live.stepped
                end = min(len(live.audio), (k + 1) * g.frame_samples)
                arrived = end + piece if end < len(live.audio) else end  # the piece after the chunk, or the end
                live.latencies.append(after - live.start - arrived / rate)
                live.stepped += 1
            s.take_events()
            if s.closed and live.done_latency is None:
                live.done_latency = after - live.start - len(live.audio) / rate
        open_lives = [live for live in open_lives if live.done_latency is None]
        loop["after"].append(time.perf_counter() - t0 - after)
    wall = time.perf_counter() - t0
    latencies = [x for live in lives for x in live.latencies]
    finals = [live.done_latency for live in lives]
    audio = sum(len(live.audio) for live in lives) / rate
    p95 = percentile(latencies, 95)
    late = behind([live.latencies for live in lives], chunk_s)
    return {
        "streams": n,
        "pace": "realtime",
        "kept_up": p95 is not None and p95 <= chunk_s,
        # each stream's own p95 against the chunk: the realtime load test's count of sessions, for comparing them
        "streams_kept_up": n - len(late),
        # those behind, the furthest first: their audio, chunks, p95 and slowest chunk, and which chunk that was
        "behind": [
            {
                "seconds": round(len(lives[i].audio) / rate, 2),
                "chunks": len(lives[i].latencies),
                **lateness(lives[i].latencies),
            }
            for i in late[:BEHIND_SHOWN]
        ],
        "chunk_latency_ms": {f"p{q}": _ms(percentile(latencies, q)) for q in (50, 95, 99)},
        "final_latency_ms": {f"p{q}": _ms(percentile(finals, q)) for q in (50, 95, 99)},
        "audio_seconds": round(audio, 2),
        "wall_seconds": round(wall, 2),
        "busy_share": round(busy / wall, 3),
        "chunks": len(latencies),
        "steps": len(loop["rows"]),
        "loop_ms": {k: _spread(v, 1000) for k, v in loop.items() if k != "rows"},
        "rows": _spread(loop["rows"], 1),
    }


def _spread(values: list[float], scale: float) -> dict:
    """p50, p95 and the largest of a level's per-step values, times `scale`."""
    return {
        "p50": round(percentile(values, 50) * scale, 1) if values else None,
        "p95": round(percentile(values, 95) * scale, 1) if values else None,
        "max": round(max(values) * scale, 1) if values else None,
    }


def max_pace_level(engine: StreamEngine, audios: list[np.ndarray], n: int) -> dict:
    """Every file's audio at once, N streams open at a time, steps as fast as they go."""
    queue = list(range(len(audios)))[::-1]
    streams: list = []
    steps, step_seconds = 0, []
    start = time.perf_counter()
    while queue or streams:
        while queue and len(streams) < n:
            s = engine.open()
            s.feed(audios[queue.pop()])
            s.finish()
            streams.append(s)
        begin = time.perf_counter()
        engine.step()
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        step_seconds.append(time.perf_counter() - begin)
        steps += 1
        for s in streams:
            s.take_events()
        streams = [s for s in streams if not s.closed]
    wall = time.perf_counter() - start
    audio = sum(len(a) for a in audios) / engine.geometry.sample_rate
    return {
        "streams": n,
        "pace": "max",
        "rtfx": round(audio / wall, 1),
        "audio_seconds": round(audio, 2),
        "wall_seconds": round(wall, 3),
        "steps": steps,
        "step_ms": {"mean": _ms(sum(step_seconds) / len(step_seconds)), "p95": _ms(percentile(step_seconds, 95))},
    }


def run_stream_bench(
    model,
    paths: list[Path],
    levels: list[int],
    pace: str,
    chunk: float,
    left: float,
    right: float,
    profile: bool = False,
):
    """One report: a row per level (`realtime_level` or `max_pace_level`), after the server's warm-up
    (`StreamEngine.warm_up`: a step of each size class) and a level of the largest N on two chunks of each stream
    (capture and first uses off the clock)."""
    audios, errors = read_folder(paths, model.sample_rate)
    if not audios:
        raise ValueError("no readable audio files in the folder")
    engine = engine_for(model, chunk, left, right)
    engine.warm_up(max(levels))
    warm = [a[: 2 * engine.geometry.frame_samples] for a in audios[: max(levels)]]
    max_pace_level(engine, warm * max(1, max(levels) // max(1, len(warm))), max(levels))
    gc.collect()
    gc.freeze()  # what the warm level left is as long-lived as the warm-up's (`StreamEngine.warm_up`)
    rows = [
        realtime_level(engine, audios, n) if pace == "realtime" else max_pace_level(engine, audios, n) for n in levels
    ]
    if profile:  # once more, each stage waited for: where a step's time goes
        engine.profile, trace = {}, []
        if pace == "realtime":
            realtime_level(engine, audios, max(levels), trace)
        else:
            max_pace_level(engine, audios, max(levels))
        row = {"streams": max(levels), "profile_seconds": {k: round(v, 3) for k, v in engine.profile.items()}}
        rows.append(row | ({"trace": trace} if trace else {}))
    g = engine.geometry
    return {
        "model": model.source,
        "device": str(model.device),
        "gpu": torch.cuda.get_device_name(model.device) if model.device.type == "cuda" else None,
        "dtype": str(model.dtype).replace("torch.", ""),
        "chunk": g.frame_samples / g.sample_rate,
        "left": g.left * g.stride_seconds,
        "right": g.right * g.stride_seconds,
        "files": len(audios),
        "unreadable": errors,
        "levels": rows,
    }


def print_stream_report(report: dict, console) -> None:
    from rich.table import Table

    title = f"{report['model']} on {report['gpu'] or report['device']}, {report['dtype']}, chunk {report['chunk']} s"
    table = Table(title=title + f" (left {report['left']:.2f} s, right {report['right']:.2f} s)")
    for name in ("streams", "pace", "kept up (streams)", "chunk p50/p95/p99 ms", "final p50/p95 ms", "RTFx", "busy"):
        table.add_column(name)
    for row in report["levels"]:
        if "profile_seconds" in row:
            console.print(f"{row['streams']} streams, seconds per stage (each waited for): {row['profile_seconds']}")
            continue
        if row["pace"] == "max":
            table.add_row(str(row["streams"]), "max", "", "", "", f"{row['rtfx']:.0f}", "")
        else:
            c, f = row["chunk_latency_ms"], row["final_latency_ms"]
            table.add_row(
                str(row["streams"]),
                "realtime",
                ("yes" if row["kept_up"] else "no") + f" ({row.get('streams_kept_up', '?')})",
                f"{c['p50']}/{c['p95']}/{c['p99']}",
                f"{f['p50']}/{f['p95']}",
                f"{row['audio_seconds'] / row['wall_seconds']:.0f}",
                f"{row['busy_share']:.0%}",
            )
    console.print(table)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
