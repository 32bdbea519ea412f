"""`transcribe bench --realtime ws://HOST:PORT --folder DIR --sessions 1,64,256`: a load test of a running server's
`/v1/realtime` sessions.

Every file under DIR is read and resampled to 24 kHz PCM16 before any timing. Per level N, N sessions open and are
configured, then their audio starts, spread over 0.8 s (session i sends file i mod the folder's count), each at
real-time pace in appends of 20 to 100 ms (each session its own sizes, seeded), then a second of silence so that server VAD (the
session's default) ends its last turn, and waiting for every turn's `completed`; with `--turns commit`, VAD off
(`turn_detection: null`), no second of silence and one turn a session, committed after its last audio (the same
audio and steps as the in-process bench's stream of that file). A session is timed against the wall clock of its
own sends:
    delta latency   a delta's arrival less the time the audio its step needed (the chunk and its right context,
                    `audio_end_ms`, which this server adds to each delta) was sent
    final latency   a turn's `completed` less the time the audio where VAD ended it (`speech_stopped`'s
                    `audio_end_ms`, the silence included) was sent, or its commit
A session kept up when its p95 delta latency is at most KEPT_UP_SECONDS and it failed nothing; a failure is an
`error` or `failed` event, a refused or dropped connection, or a turn never completed. The level kept up (as the
in-process bench judges its streams) when the p95 of all its deltas is at most KEPT_UP_SECONDS and no session
failed. The sessions are spread over `--client-processes P` processes, by default one per `SESSIONS_PER_PROCESS`
(up to half the machine's cores: the server may share them).
"""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import os
import random
import time
from pathlib import Path

from graphscribe.io.audio import find_audio_files, read_input
from graphscribe.runtime.latency import BEHIND_SHOWN, behind, lateness, percentile
from graphscribe.serve.loadtest import parse_levels

RATE = 24000
PIECES_MS = (20, 40, 60, 80, 100)  # append sizes a session draws from
TAIL_SILENCE_MS = 1000
KEPT_UP_SECONDS = 1.0
END_SECONDS = 60.0  # after its last audio, how long a session waits for its turns
# the sessions' starts spread evenly over this, as the in-process bench (`transcribe bench --streams`) spreads its
# streams' over a chunk (NVIDIA's streaming config's, 0.8 s): clients that all start in the same instant would
# send their chunks in one burst every 0.8 s, a load no real set of callers makes
START_SPREAD_SECONDS = 0.8
# sessions one client process keeps to time: on an H200 host (2026-11-28) 1152 sessions over 4 processes measured
# their own lag (866 kept up, the slowest at their first delta), over 8 processes 1077 kept up
SESSIONS_PER_PROCESS = 144


def read_pcm(paths: list[Path]) -> list[bytes]:
    """Each file as 24 kHz mono PCM16 bytes."""
    out = []
    for path in paths:
        audio = read_input(path, RATE).numpy()
        out.append((audio * 32768).round().clip(-32768, 32767).astype("<i2").tobytes())
    return out


async def one_session(url: str, headers: dict, pcm: bytes, seed: int, start_at: float, commit: bool) -> dict:
    """One session: its audio at real-time pace, its events timed (module docstring); `commit`: VAD off, one turn
    committed after the audio."""
    from websockets.asyncio.client import connect

    rng = random.Random(seed)
    result = {"deltas": [], "finals": [], "failures": [], "turns": 0, "completed": 0, "session": seed,
              "seconds": len(pcm) / 2 / RATE}  # fmt: skip
    silence = bytes(2 * RATE * TAIL_SILENCE_MS // 1000)
    audio = pcm if commit else pcm + silence
    sent: list[tuple[int, float]] = []  # (samples sent in all, time) after each append

    def sent_at(ms: int) -> float | None:
        """When the audio up to `ms` of the session had been sent."""
        need = ms * RATE // 1000
        for samples, at in sent:
            if samples >= need:
                return at
        return None

    try:
        # connected and configured before its audio's start: a level's N handshakes are not in its first deltas
        # (the in-process bench's streams have none)
        async with connect(url, additional_headers=headers, max_size=None, open_timeout=60, ping_interval=None) as ws:
            created = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if created.get("type") != "session.created":
                raise RuntimeError(f"first event {created.get('type')}")
            if commit:
                update = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
                await ws.send(json.dumps({"type": "session.update", "session": update}))
            await asyncio.sleep(max(0.0, start_at - time.monotonic()))
            progress = asyncio.Event()  # an event came
            stopped: dict[str, float] = {}  # turns VAD ended, not completed yet: when their end was sent
            committed_at: list[float] = []  # commit: when the commit was sent

            async def receive():
                while True:
                    event = json.loads(await ws.recv())
                    progress.set()
                    now, kind = time.monotonic(), event["type"]
                    if kind == "input_audio_buffer.speech_started":
                        result["turns"] += 1
                    elif commit and kind == "input_audio_buffer.committed":
                        result["turns"] += 1
                        stopped[event["item_id"]] = committed_at[0]
                    elif kind == "conversation.item.input_audio_transcription.delta" and "audio_end_ms" in event:
                        at = sent_at(event["audio_end_ms"])
                        if at is not None:
                            result["deltas"].append(now - at)
                    elif kind == "input_audio_buffer.speech_stopped":
                        stopped[event["item_id"]] = sent_at(event["audio_end_ms"]) or now
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        result["completed"] += 1
                        if event["item_id"] in stopped:
                            result["finals"].append(now - stopped.pop(event["item_id"]))
                    elif kind in ("error", "conversation.item.input_audio_transcription.failed"):
                        result["failures"].append(event.get("error", {}).get("code", kind))

            receiver = asyncio.ensure_future(receive())
            begin, position = time.monotonic(), 0
            while position < len(audio):
                size = 2 * RATE * rng.choice(PIECES_MS) // 1000
                piece = audio[position : position + size]
                position += len(piece)
                wait = begin + position / 2 / RATE - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await ws.send(
                    json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
                )
                sent.append((position // 2, time.monotonic()))
                if receiver.done():
                    break
            if commit:
                committed_at.append(time.monotonic())
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            deadline = time.monotonic() + END_SECONDS
            # the last turns' answers (with commit, the one turn's, which is announced after the commit)
            while result["completed"] < max(result["turns"], commit) and not receiver.done():
                progress.clear()
                await asyncio.wait_for(progress.wait(), max(0.0, deadline - time.monotonic()))
            if receiver.done():
                receiver.result()  # the connection's end, raised
            receiver.cancel()
    except Exception as err:  # noqa: BLE001 - a failed session is counted, the others go on
        result["failures"].append(f"{type(err).__name__}: {str(err)[:80]}")
    if result["completed"] < result["turns"]:
        result["failures"].append("turn not completed")
    return result


def _run_share(
    url: str, headers: dict, pcms: list[bytes], indices: list[int], start_at: float, n: int, commit: bool
) -> list[dict]:
    async def main():
        starts = [start_at + START_SPREAD_SECONDS * i / n for i in indices]
        return await asyncio.gather(
            *(one_session(url, headers, pcms[i % len(pcms)], i, at, commit) for i, at in zip(indices, starts))
        )

    return asyncio.run(main())


def _worker(args):
    return _run_share(*args)


def run_level(url: str, headers: dict, pcms: list[bytes], n: int, processes: int, commit: bool = False) -> dict:
    start_at = time.monotonic() + 2.0 + n / 250  # every process started and its sessions connected before the audio
    shares = [list(range(p, n, processes)) for p in range(min(processes, n))]
    if len(shares) == 1:
        results = _run_share(url, headers, pcms, shares[0], start_at, n, commit)
    else:
        with multiprocessing.get_context("spawn").Pool(len(shares)) as pool:
            results = [
                r
                for part in pool.map(_worker, [(url, headers, pcms, s, start_at, n, commit) for s in shares])
                for r in part
            ]
    deltas = [d for r in results for d in r["deltas"]]
    finals = [f for r in results for f in r["finals"]]
    whole = [r for r in results if not r["failures"]]
    late = behind([r["deltas"] for r in whole], KEPT_UP_SECONDS)
    failures = [f for r in results for f in r["failures"]]
    return {
        "sessions": n,
        "client_processes": len(shares),
        "kept_up": len(whole) - len(late),
        "level_kept_up": not failures and (percentile(deltas, 95) or 0.0) <= KEPT_UP_SECONDS,
        "failed_sessions": sum(1 for r in results if r["failures"]),
        "failures": sorted(set(failures))[:5],
        "turns": sum(r["turns"] for r in results),
        "deltas": len(deltas),
        "delta_ms": {f"p{q}": _ms(percentile(deltas, q)) for q in (50, 95, 99)},
        "final_ms": {f"p{q}": _ms(percentile(finals, q)) for q in (50, 95, 99)},
        # the sessions that fell behind, the furthest first: how long, how many deltas, where their slowest came
        "behind": [
            {
                "session": whole[i]["session"],
                "seconds": round(whole[i]["seconds"], 2),
                "deltas": len(whole[i]["deltas"]),
                **lateness(whole[i]["deltas"]),
            }
            for i in late[:BEHIND_SHOWN]
        ],  # fmt: skip
    }


def client_processes(sessions: int) -> int:
    """The default `--client-processes` for a level of `sessions`."""
    return max(1, min(-(-sessions // SESSIONS_PER_PROCESS), (os.cpu_count() or 2) // 2))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def bench_realtime(
    url: str, folder: Path | None, sessions: str, api_key: str | None, processes: int | None, turns: str = "vad"
) -> dict:
    levels = parse_levels(sessions, "--sessions", "1,64,256")
    if turns not in ("vad", "commit"):
        raise ValueError(f"--turns {turns}: use vad or commit")
    if not url.startswith(("ws://", "wss://")):
        raise ValueError(f"--realtime {url!r}: give the server as ws://HOST:PORT")
    paths = find_audio_files(folder) if folder is not None and folder.is_dir() else []
    if not paths:
        raise ValueError("--realtime: give --folder DIR with audio files to send")
    url = url.rstrip("/")
    if not url.endswith("/v1/realtime"):
        url += "/v1/realtime"
    url += "?intent=transcription"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    pcms = read_pcm(paths)
    rows = [run_level(url, headers, pcms, n, processes or client_processes(n), turns == "commit") for n in levels]
    seconds = sum(len(p) for p in pcms) / 2 / RATE
    return {"url": url, "folder": str(folder), "files": len(paths), "audio_seconds": round(seconds, 1), "turns": turns,
            "rows": rows}  # fmt: skip


def print_realtime_report(report: dict, console) -> None:
    from rich.table import Table

    title = f"realtime sessions: {report['url']} ({report['files']} files, {report['audio_seconds']} s)"
    table = Table(title=title + (", one committed turn a session" if report.get("turns") == "commit" else ""))
    for column in ("sessions", "kept up (level)", "failed", "turns", "delta p50/p95/p99 ms", "final p50/p95/p99 ms"):
        table.add_column(column, justify="right")
    for row in report["rows"]:
        delta, final = row["delta_ms"], row["final_ms"]
        table.add_row(
            str(row["sessions"]),
            f"{row['kept_up']} ({'yes' if row.get('level_kept_up') else 'no'})",
            str(row["failed_sessions"]),
            str(row["turns"]),
            " / ".join(str(v) for v in delta.values()),
            " / ".join(str(v) for v in final.values()),
        )
    console.print(table)
