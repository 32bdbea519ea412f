"""`transcribe bench --serve URL --folder DIR`: a load test of a running `transcribe serve`.

Every audio file under DIR is read into memory (and its multipart body built) before any timing; then, per
concurrency level N, N clients (aiohttp, asyncio, one connection each) send every file once between them, each
taking the next file as soon as its last answer is in. Per level: RTFx (audio seconds of all the files / wall
time from the first request to the last answer), latency percentiles as the client sees them (upload included),
and failed requests (any answer but 200, or none).

With `--client-processes P` the clients run in P processes, each with its share of the clients and every P-th
file, started together at every level: for a server that one client process cannot keep busy (a remote one, a
machine of many cores). Against `transcribe serve` on an H100, one process is not the limit: 128 clients get as
much from one process as from four (see bench/README.md).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import queue
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np

from graphscribe.io.audio import audio_seconds, find_audio_files

DEFAULT_LEVELS = "1,8,32,128"
REQUEST_TIMEOUT = 600.0  # seconds: a request that takes longer counts as failed
_BOUNDARY = "graphscribe-load-test-boundary"


def parse_levels(value: str, option: str = "--concurrency", example: str = "1,8,32") -> list[int]:
    """ "1,8,32" -> [1, 8, 32]; ValueError naming the option."""
    try:
        levels = [int(s) for s in value.split(",") if s.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise ValueError(f"{option} {value!r}: use comma-separated whole numbers of 1 or more, such as {example}")
    return levels


def multipart_body(name: str, data: bytes, fields: dict[str, str]) -> bytes:
    """A multipart/form-data body (boundary `_BOUNDARY`) with `fields` and the file `data` as `name`."""
    parts = [
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    quoted = name.replace('"', "%22").replace("\r", "").replace("\n", "")
    parts.append(
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{quoted}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
    )
    return b"".join([*parts, data, f"\r\n--{_BOUNDARY}--\r\n".encode()])


def bench_server(
    url: str,
    folder: Path | None,
    levels: str,
    api_key: str | None,
    response_format: str = "json",
    processes: int | None = None,
) -> dict:
    """Run the load test; the report (`rows`: one dict a level). ValueError for bad arguments or a server that is
    not ready. processes: the client processes (None: one)."""
    concurrency = parse_levels(levels)
    if processes is not None and processes < 1:
        raise ValueError(f"--client-processes {processes}: use 1 or more")
    processes = processes or 1
    try:
        import aiohttp  # noqa: F401 - the clients' library, in the server's extra
    except ImportError:
        raise ValueError("--serve: the load test needs aiohttp: pip install 'graphscribe[serve]'") from None
    paths = find_audio_files(folder) if folder is not None and folder.is_dir() else []
    if not paths:
        raise ValueError(f"--folder {folder}: no audio files there (--serve needs a --folder of files to send)")
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
            health = json.loads(answer.read())
    except urllib.error.HTTPError as err:
        body = err.read().decode(errors="replace").strip()
        raise ValueError(f"--serve {url}: /health answers {err.code}: {body}") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"--serve {url}: no answer ({err})") from None
    audio = sum(audio_seconds(p) or 0.0 for p in paths)
    fields = {"model": "graphscribe", "response_format": response_format}
    processes = min(processes, len(paths), max(concurrency))
    plans = [[_part(n, len(paths), processes, k) for n in concurrency] for k in range(processes)]
    if processes == 1:
        parts = [[run] for run in _client(url, headers, paths, fields, plans[0])]
    else:
        parts = _client_processes(url, headers, paths, fields, plans)
    rows = [_row(n, len(paths), part) for n, part in zip(concurrency, parts)]
    for row in rows:
        row["audio_seconds"] = round(audio, 3)
        row["rtfx"] = round(audio / row["wall_seconds"], 1) if row["wall_seconds"] > 0 else None
    return {
        "url": url,
        "server": health,
        "folder": str(folder),
        "files": len(paths),
        "audio_seconds": round(audio, 3),
        "upload_mb": round(sum(p.stat().st_size for p in paths) / 2**20, 1),
        "response_format": response_format,
        "client_processes": processes,
        "timer": "client: from sending a request to its full answer, upload included; RTFx over every file",
        "rows": rows,
    }


def _part(clients: int, files: int, processes: int, k: int) -> tuple[int, int, int] | None:
    """Process k's part of a level of `clients` clients: (its clients, and its files: every `step`-th from `first`),
    or None where the level has fewer clients than processes and k sits it out."""
    clients = min(clients, files)
    active = min(processes, clients)
    if k >= active:
        return None
    return clients // active + (k < clients % active), k, active  # every active-th file: like lengths in each


def _client(url: str, headers: dict, paths: list[Path], fields: dict, plan: list, barrier=None) -> list:
    """One client process's part of every level (`_part`): (start, end, latencies, failures) each, end None where
    it sat the level out; with `barrier`, every level starts when every process is at it. Its files' bodies are
    built before the level's clock starts."""
    import aiohttp  # noqa: F401 - imported before any clock starts

    runs, built, bodies = [], None, []
    for part in plan:
        if part is not None and part[1:] != built:
            built, bodies = (
                part[1:],
                [multipart_body(p.name, p.read_bytes(), fields) for p in paths[part[1] :: part[2]]],
            )
        if barrier is not None:
            barrier.wait()
        if part is None:
            runs.append((0.0, None, [], {}))
            continue
        start = time.time()
        latencies, failures = asyncio.run(_level(url, headers, bodies, part[0]))
        runs.append((start, time.time(), latencies, dict(failures)))
    return runs


def _client_main(url, headers, paths, fields, plan, barrier, results) -> None:
    try:
        results.put(_client(url, headers, paths, fields, plan, barrier))
    except BaseException as err:  # noqa: BLE001 - told to the parent, which stops the others
        barrier.abort()
        results.put(f"{type(err).__name__}: {err}")


def _client_processes(url: str, headers: dict, paths: list[Path], fields: dict, plans: list[list]):
    """Every level's parts from one process per plan (spawned: no state of this one in them), levels in step."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(len(plans)), context.Queue()
    procs = [
        context.Process(target=_client_main, args=(url, headers, paths, fields, plan, barrier, results), daemon=True)
        for plan in plans
    ]
    for p in procs:
        p.start()
    done: list = []
    while len(done) < len(procs):
        try:
            done.append(results.get(timeout=1.0))
        except queue.Empty:
            lost = [p for p in procs if p.exitcode not in (None, 0)]
            if lost and results.empty():  # killed before it could say so: the others would wait at the barrier
                barrier.abort()
                for p in procs:
                    p.kill()
                raise ValueError(f"a client process died (exit code {lost[0].exitcode})") from None
    for p in procs:
        p.join()
    errors = [d for d in done if isinstance(d, str)]
    if errors:
        raise ValueError(f"a client process failed: {errors[0]}")
    return [list(level) for level in zip(*done)]


def _row(clients: int, files: int, parts: list[tuple]) -> dict:
    """One level's row from its processes' parts."""
    ran = [p for p in parts if p[1] is not None]
    wall = max(p[1] for p in ran) - min(p[0] for p in ran)
    latencies = [x for p in ran for x in p[2]]
    failures: Counter[str] = Counter()
    for p in ran:
        failures.update(p[3])
    ms = np.percentile(np.array(latencies) * 1000, [50, 95, 99]) if latencies else [None] * 3
    return {
        "concurrency": min(clients, files),
        "requests": files,
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "wall_seconds": round(wall, 3),
        "p50_ms": _round(ms[0]),
        "p95_ms": _round(ms[1]),
        "p99_ms": _round(ms[2]),
    }


async def _level(url: str, headers: dict, bodies: list[bytes], clients: int) -> tuple[list[float], Counter]:
    """`clients` clients sending every body once between them -> (latencies in seconds, failures by kind). aiohttp,
    not httpx: against a server that answers at once, httpx's client managed 4700 RTFx-worth of these requests at 8
    clients and 510 at 128 (its pool slows with the connections it holds), aiohttp ~3000 requests a second at any
    level (2 cores)."""
    import aiohttp  # here: the server's extra

    clients = min(clients, len(bodies))
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    content_type = {**headers, "Content-Type": f"multipart/form-data; boundary={_BOUNDARY}"}
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        order = iter(bodies)  # shared by the clients: every file once

        async def one_client() -> None:
            for body in order:
                start = time.perf_counter()
                try:
                    async with session.post(
                        f"{url}/v1/audio/transcriptions", data=body, headers=content_type
                    ) as answer:
                        await answer.read()
                        status = answer.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as err:
                    failures[type(err).__name__] += 1
                    continue
                if status != 200:
                    failures[str(status)] += 1
                    continue
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(one_client() for _ in range(clients)))
    return latencies, failures


def _round(value) -> float | None:
    return None if value is None else round(float(value), 1)


def print_report(report: dict, console) -> None:
    from rich.table import Table

    server = report["server"]
    table = Table(
        title=f"{report['url']}: {server.get('model', '?')} on {server.get('device', '?')} {server.get('dtype', '')}; "
        f"{report['files']} files, {report['audio_seconds']:.0f} s of audio, {report['response_format']}",
        caption=report["timer"],
    )
    for column in ("clients", "requests", "failed", "wall s", "RTFx", "p50 ms", "p95 ms", "p99 ms"):
        table.add_column(column, justify="right")
    for row in report["rows"]:
        table.add_row(
            str(row["concurrency"]),
            str(row["requests"]),
            str(row["failed"]),
            f"{row['wall_seconds']:.2f}",
            _cell(row["rtfx"]),
            _cell(row["p50_ms"]),
            _cell(row["p95_ms"]),
            _cell(row["p99_ms"]),
        )
    console.print(table)


def _cell(value) -> str:
    return "-" if value is None else f"{value:.1f}"
