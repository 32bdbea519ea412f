#!/usr/bin/env python
"""Cold start: how long from a process's start to its first transcript, and where the time goes.

    python scripts/cold_start.py --model v3.nemo --json $OUT/cold_start.json            # GPU: device auto
    python scripts/cold_start.py --model /tmp/v3.nemo --device cpu --json /tmp/cold.json

graphscribe must be importable by the child processes (installed, or PYTHONPATH=src). Steps, each
written to the JSON as soon as it is measured:
1. page cache: the checkpoint is read once first (its time says how fast the disk was), so every
   run below finds it in memory.
2. import: `python -c "import graphscribe.cli"` in fresh processes (median of --reps).
3. load: fresh processes that import graphscribe, `load_model()` and transcribe the clip twice; each
   reports `model.load_seconds` (config and tokenizer, weights, CUDA context, module build, placing
   the weights on the device, decoder set-up), the first transcription (first decode: Triton kernels
   from its disk cache, graph capture) and the second (warm), and the seconds from its spawn to each;
   one more such process runs the clip stage by stage instead, synchronising after each stage (`stages`).
4. cli: `python -m graphscribe.cli CLIP --model X --device D --dtype T`, timed from spawn to the first
   transcript line on stdout and to exit (median, min, max of --reps), alternating with runs whose priming
   thread is off (graphscribe/priming.py; `cli_unprimed`); plus one run with an empty Triton cache
   (TRITON_CACHE_DIR) to show what a first run on a fresh machine pays for compiling.
The clip defaults to the package's 7.4 s LibriSpeech clip. `bytecode` says whether the children could use
compiled bytecode (see `bytecode_caches`; --pycache-prefix gives them a cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLIP = Path(__file__).resolve().parents[1] / "src" / "graphscribe" / "data" / "librispeech_2086-149220-0033.wav"


def log(msg: str) -> None:
    print(f"[cold_start {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spread(values: list[float]) -> dict:
    return dict(median=statistics.median(values), min=min(values), max=max(values), all=values) if values else {}


def child(args) -> None:
    """One fresh process: import, load, transcribe twice; JSON on stdout. args.spawned: the parent's clock at spawn."""
    since = lambda: time.time() - args.spawned  # noqa: E731
    report = dict(python_started_s=since())
    start = time.perf_counter()
    import torch

    import graphscribe

    report.update(import_s=time.perf_counter() - start, imported_s=since())
    start = time.perf_counter()
    model = graphscribe.load_model(args.model, device=args.device, dtype=args.dtype)
    report.update(
        load_s=time.perf_counter() - start,
        loaded_s=since(),
        device=str(model.device),
        dtype=str(model.dtype),
        graphs=model.options.graphs,
        load_phases=getattr(model, "load_seconds", None),
    )  # None: a version without phases
    for name in ("first", "second"):
        if args.stages:
            report[f"{name}_stages"] = stages(model, args.clip)
            continue
        start = time.perf_counter()
        [transcript] = model.transcribe([args.clip])
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        report[f"{name}_transcribe_s"] = time.perf_counter() - start
        report[f"{name}_transcript_s"] = since()
        report["tokens"] = len(transcript.token_ids)
        report["error"] = transcript.error
    print(json.dumps(report), flush=True)


def stages(model, clip: Path) -> dict:
    """Seconds per stage of one transcription, the device synchronised after each (first use shows up where it is
    paid: cuFFT in features, cuDNN and cuBLAS in the encoder, Triton's kernels and graph capture in decoding)."""
    import torch

    sync = (lambda: torch.cuda.synchronize(model.device)) if model.device.type == "cuda" else (lambda: None)
    seconds, start = {}, time.perf_counter()

    def lap(name: str) -> None:
        nonlocal start
        sync()
        seconds[name] = time.perf_counter() - start
        start = time.perf_counter()

    audio = model.read(clip)
    lap("read")
    features, frames = model.batch_features(audio[None], torch.tensor([audio.numel()]))
    lap("features")
    encoded, lengths = model.encoder_output(features, frames)
    lap("encoder")
    compile_s, capture_s = model.decoder.compile_seconds, model.decoder.capture_seconds
    [hyp] = model.decode(encoded, lengths)
    lap("decode")
    seconds.update(
        decode_compile=model.decoder.compile_seconds - compile_s,
        decode_capture=model.decoder.capture_seconds - capture_s,
    )
    model.make_transcript(str(clip), audio.numel(), hyp, 0.0)
    lap("text")
    return seconds


def run_child(args, script: Path, stages: bool = False) -> dict:
    cmd = [
        sys.executable,
        str(script),
        "--child",
        "--spawned",
        repr(time.time()),
        "--model",
        args.model,
        "--clip",
        str(args.clip),
        "--device",
        args.device,
        "--dtype",
        args.dtype,
    ] + (["--stages"] if stages else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-3:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The CLI with its priming thread (graphscribe/priming.py) switched off, for the A/B.
UNPRIMED = (
    "import graphscribe.runtime.priming as p; p.prime = lambda *a: None; from graphscribe.cli import entry; entry()"
)


def run_cli(args, env=None, primed: bool = True) -> dict:
    """Spawn the CLI; seconds to its first stdout line (the transcript) and to its exit."""
    start_cli = ["-m", "graphscribe.cli"] if primed else ["-c", UNPRIMED]
    cmd = [
        sys.executable,
        *start_cli,
        str(args.clip),
        "--model",
        args.model,
        "--device",
        args.device,
        "--dtype",
        args.dtype,
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first_line = proc.stdout.readline()
    first = time.perf_counter() - start
    try:
        rest, stderr = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    total = time.perf_counter() - start
    return dict(
        first_transcript_s=first,
        exit_s=total,
        returncode=proc.returncode,
        transcript=first_line.strip()[:200],
        stderr=stderr.strip().splitlines()[-3:],
    )


def bytecode_caches(prefix: Path | None) -> dict:
    """Whether the children can keep compiled bytecode (.pyc): without it every process compiles torch's Python
    source again (about 2.7 s on the lent GPU machine, whose torch has no .pyc files and may not write them);
    pip writes them when it installs a package, so a user's machine has them. --pycache-prefix gives the
    children a writable cache (PYTHONPYCACHEPREFIX), filled by one process before the timed ones."""
    if prefix is not None:
        prefix.mkdir(parents=True, exist_ok=True)
        os.environ["PYTHONPYCACHEPREFIX"] = str(prefix.resolve())
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    import torch

    site = Path(torch.__file__).parent
    return dict(
        pycache_prefix=os.environ.get("PYTHONPYCACHEPREFIX"),
        dont_write_bytecode_env=os.environ.get("PYTHONDONTWRITEBYTECODE"),
        torch_has_pyc=any(site.glob("__pycache__/*.pyc")),
        torch_dir_writable=os.access(site, os.W_OK),
    )


def warm_page_cache(path: Path) -> dict:
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    start, size = time.perf_counter(), 0
    for f in files:
        with open(f, "rb") as handle:
            while chunk := handle.read(1 << 24):
                size += len(chunk)
    seconds = time.perf_counter() - start
    return dict(bytes=size, read_s=seconds, mb_per_s=size / 2**20 / seconds if seconds else None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a .nemo file or checkpoint folder (a local path)")
    ap.add_argument("--clip", type=Path, default=CLIP)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one process")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--pycache-prefix", type=Path, help="a writable bytecode cache for the children (see bytecode)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stages", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    if args.json is None:
        ap.error("--json is required")
    args.model = str(Path(args.model).resolve())
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report: dict = dict(
        model=args.model,
        clip=str(args.clip),
        device=args.device,
        dtype=args.dtype,
        reps=args.reps,
        python=platform.python_version(),
        cpus=os.cpu_count(),
        errors=[],
        bytecode=bytecode_caches(args.pycache_prefix),
    )

    def save() -> None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")

    if args.pycache_prefix is not None:  # one CLI run fills the bytecode cache
        subprocess.run(
            [
                sys.executable,
                "-m",
                "graphscribe.cli",
                str(args.clip),
                "--model",
                args.model,
                "--device",
                args.device,
                "--dtype",
                args.dtype,
            ],
            capture_output=True,
            timeout=args.timeout,
        )
    log(f"bytecode: {report['bytecode']}")
    report["page_cache"] = warm_page_cache(Path(args.model))
    cache = report["page_cache"]
    log(f"read {args.model} once: {cache['bytes'] / 2**20:.0f} MiB in {cache['read_s']:.2f} s")
    save()

    imports = []
    for _ in range(args.reps):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import graphscribe.cli"], check=True, timeout=args.timeout)
        imports.append(time.perf_counter() - start)
    report["import_cli_process_s"] = spread(imports)
    log(f"python -c 'import graphscribe.cli': median {statistics.median(imports):.2f} s")
    save()

    report["load"] = []
    for rep in range(args.reps):
        try:
            run = run_child(args, Path(__file__).resolve())
        except Exception as err:  # noqa: BLE001 - keep going: the CLI runs still tell the story
            report["errors"].append(f"load run {rep}: {type(err).__name__}: {err}")
            log(f"load run {rep} failed: {err}")
            save()
            continue
        report["load"].append(run)
        phases = run.get("load_phases") or {}
        log(
            f"load run {rep}: import {run['import_s']:.2f} s, load {run['load_s']:.2f} s "
            f"({', '.join(f'{k} {v:.2f}' for k, v in phases.items())}), "
            f"first transcribe {run['first_transcribe_s']:.2f} s, "
            f"second {run['second_transcribe_s']:.2f} s; spawn to first transcript {run['first_transcript_s']:.2f} s "
            f"on {run['device']} {run['dtype']}"
        )
        save()
    if report["load"]:
        runs = report["load"]
        keys = sorted({k for r in runs for k in (r.get("load_phases") or {})})
        report["load_summary"] = dict(
            {f"phase_{k}": spread([r["load_phases"][k] for r in runs if r.get("load_phases")]) for k in keys},
            load_s=spread([r["load_s"] for r in runs]),
            import_s=spread([r["import_s"] for r in runs]),
            first_transcribe_s=spread([r["first_transcribe_s"] for r in runs]),
            second_transcribe_s=spread([r["second_transcribe_s"] for r in runs]),
            spawn_to_first_transcript_s=spread([r["first_transcript_s"] for r in runs]),
        )
        save()
    try:
        staged = run_child(args, Path(__file__).resolve(), stages=True)
        report["stages"] = dict(first=staged["first_stages"], second=staged["second_stages"])
        log("first transcription by stage: " + ", ".join(f"{k} {v:.3f}" for k, v in staged["first_stages"].items()))
        log("second: " + ", ".join(f"{k} {v:.3f}" for k, v in staged["second_stages"].items()))
    except Exception as err:  # noqa: BLE001
        report["errors"].append(f"stages: {type(err).__name__}: {err}")
    save()

    with tempfile.TemporaryDirectory() as triton_cache:
        try:
            report["cli_cold_triton_cache"] = run_cli(args, dict(os.environ, TRITON_CACHE_DIR=triton_cache))
            cold = report["cli_cold_triton_cache"]
            log(f"cli, empty Triton cache: first transcript after {cold['first_transcript_s']:.2f} s")
        except Exception as err:  # noqa: BLE001
            report["errors"].append(f"cli with an empty Triton cache: {type(err).__name__}: {err}")
        save()
    runs: dict[str, list] = {"primed": [], "unprimed": []}
    for rep in range(args.reps):
        for variant in runs:  # alternating, so that drift on the machine hits both alike
            try:
                run = run_cli(args, primed=variant == "primed")
            except Exception as err:  # noqa: BLE001
                report["errors"].append(f"cli run {rep} ({variant}): {type(err).__name__}: {err}")
                continue
            runs[variant].append(run)
            log(
                f"cli run {rep} ({variant}): first transcript after {run['first_transcript_s']:.2f} s, exit after "
                f"{run['exit_s']:.2f} s (exit {run['returncode']}): {run['transcript'][:60]!r}"
            )
    report["cli"], report["cli_unprimed"] = runs["primed"], runs["unprimed"]
    for variant, key in (("primed", "cli_summary"), ("unprimed", "cli_unprimed_summary")):
        if runs[variant]:
            report[key] = dict(
                first_transcript_s=spread([r["first_transcript_s"] for r in runs[variant]]),
                exit_s=spread([r["exit_s"] for r in runs[variant]]),
            )
    save()
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
