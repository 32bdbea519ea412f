"""`transcribe bench --serve URL --folder DIR`: a load test of a running `transcribe serve`.

Every audio file under DIR is read into memory (and its multipart body built) before any timing; then, per
concurrency level N, N clients (aiohttp, asyncio, one connection each) send every file once between them, each
taking the next file as soon as its last answer is in. Per level: RTFx (audio seconds of all the files / wall
time from the first request to the last answer), latency percentiles as the client sees them (upload included),
and failed requests (any answer but 200, or none).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np

from .audio import audio_seconds, find_audio_files

DEFAULT_LEVELS = "1,8,32,128"
REQUEST_TIMEOUT = 600.0  # seconds: a request that takes longer counts as failed
_BOUNDARY = "graphscribe-load-test-boundary"


def parse_levels(value: str) -> list[int]:
    """ "1,8,32" -> [1, 8, 32]; ValueError naming the option."""
    try:
        levels = [int(s) for s in value.split(",") if s.strip()]
    except ValueError:
        levels = []
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency {value!r}: use comma-separated whole numbers of 1 or more, such as 1,8,32")
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
    url: str, folder: Path | None, levels: str, api_key: str | None, response_format: str = "json"
) -> dict:
    """Run the load test; the report (`rows`: one dict a level). ValueError for bad arguments or a server that is
    not ready."""
    concurrency = parse_levels(levels)
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
    seconds = [audio_seconds(p) or 0.0 for p in paths]
    fields = {"model": "graphscribe", "response_format": response_format}
    bodies = [multipart_body(p.name, p.read_bytes(), fields) for p in paths]
    rows = [asyncio.run(_level(url, headers, bodies, n)) for n in concurrency]
    audio = sum(seconds)
    for row in rows:
        row["audio_seconds"] = round(audio, 3)
        row["rtfx"] = round(audio / row["wall_seconds"], 1) if row["wall_seconds"] > 0 else None
    return {
        "url": url,
        "server": health,
        "folder": str(folder),
        "files": len(paths),
        "audio_seconds": round(audio, 3),
        "upload_mb": round(sum(map(len, bodies)) / 2**20, 1),
        "response_format": response_format,
        "timer": "client: from sending a request to its full answer, upload included; RTFx over every file",
        "rows": rows,
    }


async def _level(url: str, headers: dict, bodies: list[bytes], clients: int) -> dict:
    """One level: `clients` clients sending every body once between them. aiohttp, not httpx: against a server that
    answers at once, httpx's client managed 4700 RTFx-worth of these requests at 8 clients and 510 at 128 (its pool
    slows with the connections it holds), aiohttp ~3000 requests a second at any level (2 cores)."""
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

        start = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        wall = time.perf_counter() - start
    ms = np.percentile(np.array(latencies) * 1000, [50, 95, 99]) if latencies else [None] * 3
    return {
        "concurrency": clients,
        "requests": len(bodies),
        "failed": sum(failures.values()),
        "failures": dict(failures),
        "wall_seconds": round(wall, 3),
        "p50_ms": _round(ms[0]),
        "p95_ms": _round(ms[1]),
        "p99_ms": _round(ms[2]),
    }


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
