#!/usr/bin/env python
"""graphscribe against NeMo 3.0's `transcribe()` on a folder: same files, same checkpoint, one run.

On the GPU machine, with graphscribe importable (PYTHONPATH=/tmp/site:$PWD/src) and NeMo's wheels
installed into /tmp/nemo-site (see scripts/nemo_peer.py and scripts/gpu_run.sh):

    python scripts/compare_folder.py --folder DIR --model v3.nemo --nemo-path /tmp/nemo-site \
        --batch-sizes 8,32,128 --dtypes float32,bfloat16 --out $OUT/folder

Parts, in this order (each appends to OUT/compare_folder.json as soon as it has a figure, so a part
that fails or is stopped loses nothing measured before it; NeMo runs last so that a failing NeMo
side cannot cost our figures):
1. cli: our CLI as a subprocess, per dtype, batch size and graphs on/off:
   `python -m graphscribe.cli DIR --model X --batch B --dtype D --graphs|--no-graphs --format json -o TMP`
   (only options every version of the CLI has). Timed from start to exit; the summary line on stderr
   is kept (its "in T s" is the transcription alone, without start-up and loading); token ids from the
   JSON files. Before the timed runs of a dtype, one untimed run on the longest files compiles the
   Triton kernels into Triton's disk cache (a fresh machine has none) and warms the files' pages.
2. api: `load_model(X, dtype=D).transcribe(arrays, batch_size=B)` in this process on the same files
   read beforehand (at the model's sample rate), graphs on and off; one untimed warm-up call on the
   longest B files, then one timed call over all, CUDA synchronised.
3. nemo: scripts/nemo_folder.py in a subprocess with PYTHONPATH=NEMO_PATH (NeMo's own packages: ours
   may not suit its pins): TF32 off in float32, bfloat16 as `model.to(torch.bfloat16)`, greedy_batch
   label looping with NeMo's CUDA-graph decoder, `transcribe(paths, batch_size=B, num_workers=N)` after
   a warm-up, per dtype and batch size.
Then a Markdown table (OUT/compare_folder.md, printed): RTFx of each, ratio to NeMo, and whether the
token ids equal NeMo's for the same dtype and batch size (with the count of files that differ).

`--parts cli,api` skips NeMo; `--parts table` rebuilds the table from OUT's JSON files.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import soundfile as sf

SUMMARY = re.compile(r"transcribed (\d+) of (\d+) files(?: \((\d+) failed\))?: ([\d.]+) s of audio in ([\d.]+) s")
LOADED = re.compile(r"loaded in ([\d.]+) s")


def log(msg: str) -> None:
    print(f"[compare_folder {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Results:
    """OUT/compare_folder.json, rewritten after every figure."""

    def __init__(self, path: Path, initial: dict | None):
        """initial None: go on from the file there (the table part alone)."""
        self.path = path
        self.data = initial if initial is not None else json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("cli", [])
        self.data.setdefault("api", [])
        self.data.setdefault("errors", [])

    def add(self, part: str, row: dict) -> None:
        self.data[part].append(row)
        self.save()

    def save(self) -> None:
        self.path.write_text(json.dumps(self.data, separators=(",", ":")) + "\n")


# ---------------------------------------------------------------------------- our CLI


def run_cli(args, paths: list[str], batch: int, dtype: str, graphs: bool, outputs: Path, timeout: float) -> dict:
    """One CLI process over `paths` (a folder or files); wall time, summary line and token ids per file."""
    cmd = [
        sys.executable,
        "-m",
        "graphscribe.cli",
        *paths,
        "--model",
        args.model,
        "--batch",
        str(batch),
        "--dtype",
        dtype,
        "--graphs" if graphs else "--no-graphs",
        "--format",
        "json",
        "-o",
        str(outputs),
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    stderr_lines = proc.stderr.strip().splitlines()
    summary = next((line for line in reversed(stderr_lines) if SUMMARY.search(line)), None)
    row = dict(
        dtype=dtype,
        batch_size=batch,
        graphs=graphs,
        returncode=proc.returncode,
        process_s=wall,
        summary=summary,
        stderr_tail=stderr_lines[-5:],
        token_ids=read_cli_outputs(outputs),
    )
    if summary:
        done, total, _, audio, seconds = SUMMARY.search(summary).groups()
        row.update(files_done=int(done), audio_s=float(audio), transcribe_s=float(seconds))
        loaded = LOADED.search(summary)
        row["load_s"] = float(loaded.group(1)) if loaded else None
    return row


def read_cli_outputs(outputs: Path) -> dict[str, list[int]]:
    ids = {}
    for path in outputs.rglob("*.json"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                if "tokens" in record:
                    ids[record["path"]] = [t["id"] for t in record["tokens"]]
    return ids


def part_cli(args, folder: Path, files: list[str], seconds: dict[str, float], results: Results) -> None:
    longest = sorted(files, key=lambda f: -seconds[f])[: max(args.sizes)]
    for dtype in args.dtypes:
        with tempfile.TemporaryDirectory() as tmp:
            log(f"cli {dtype}: untimed warm-up run on the {len(longest)} longest files (Triton's kernel cache)")
            try:
                warm = run_cli(args, longest, max(args.sizes), dtype, True, Path(tmp), args.timeout)
                log(f"cli {dtype} warm-up: {warm['process_s']:.1f} s, exit {warm['returncode']}: {warm['summary']}")
            except Exception as err:  # noqa: BLE001 - recorded; the timed runs still go
                results.data["errors"].append(f"cli warm-up {dtype}: {type(err).__name__}: {err}")
        for batch in args.sizes:
            for graphs in args.graphs:
                what = f"cli {dtype} B={batch} graphs={'on' if graphs else 'off'}"
                try:
                    with tempfile.TemporaryDirectory() as tmp:
                        row = run_cli(args, [str(folder)], batch, dtype, graphs, Path(tmp), args.timeout)
                except Exception as err:  # noqa: BLE001 - a hung or broken run must not stop the others
                    results.add(
                        "cli", dict(dtype=dtype, batch_size=batch, graphs=graphs, error=f"{type(err).__name__}: {err}")
                    )
                    log(f"{what} failed: {err}")
                    continue
                results.add("cli", row)
                log(
                    f"{what}: process {row['process_s']:.1f} s, exit {row['returncode']}, {len(row['token_ids'])} "
                    f"outputs; {row['summary']}"
                )


# ---------------------------------------------------------------------------- our Python API


def part_api(args, files: list[str], seconds: dict[str, float], results: Results) -> None:
    import torch

    import graphscribe

    read: dict[int, list] = {}  # sample rate -> the files' samples, read once for every dtype
    for dtype in args.dtypes:
        model = None
        try:
            start = time.perf_counter()
            model = graphscribe.load_model(args.model, dtype=dtype, graphs=True)
            load_s = time.perf_counter() - start
            if model.sample_rate not in read:  # read beforehand: not timed
                read[model.sample_rate] = read_arrays(files, model.sample_rate, results)
            names, arrays = read[model.sample_rate]
            audio = sum(a.numel() for a in arrays) / model.sample_rate
            log(f"api {dtype}: loaded in {load_s:.1f} s on {model.device}, {len(arrays)} files read ({audio:.1f} s)")
            order = sorted(range(len(names)), key=lambda i: -seconds[names[i]])
            for graphs in args.graphs:
                model.use_graphs(graphs)
                for batch in args.sizes:
                    what = f"api {dtype} B={batch} graphs={'on' if graphs else 'off'}"
                    try:
                        row = time_api(model, arrays, names, order, batch)
                    except Exception as err:  # noqa: BLE001 - one failing size must not lose the others
                        results.add(
                            "api",
                            dict(dtype=dtype, batch_size=batch, graphs=graphs, error=f"{type(err).__name__}: {err}"),
                        )
                        log(f"{what} failed: {traceback.format_exc()}")
                        continue
                    row.update(
                        dtype=dtype,
                        batch_size=batch,
                        graphs=graphs,
                        graphs_used=model.options.graphs,
                        audio_s=audio,
                        load_s=load_s,
                        rtfx=audio / row["wall_s"],
                        device=str(model.device),
                    )
                    results.add("api", row)
                    log(f"{what}: {row['wall_s']:.2f} s, RTFx {row['rtfx']:.1f} (warm-up {row['warmup_s']:.2f} s)")
        except Exception as err:  # noqa: BLE001 - e.g. the model does not load: NeMo still runs
            results.data["errors"].append(f"api {dtype}: {type(err).__name__}: {err}")
            results.save()
            log(f"api {dtype} failed: {traceback.format_exc()}")
        finally:
            del model
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def read_arrays(files: list[str], sample_rate: int, results: Results) -> tuple[list[str], list]:
    from graphscribe.io.audio import AudioError, load_audio

    names, arrays = [], []
    for f in files:
        try:
            arrays.append(load_audio(f, sample_rate))
            names.append(f)
        except AudioError as err:  # the CLI and NeMo report it their way; here it is left out
            results.data["errors"].append(f"api: {err}")
    return names, arrays


def time_api(model, arrays, files, order, batch) -> dict:
    import torch

    def sync():
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)

    warm = [arrays[i] for i in order[:batch]]
    sync()
    start = time.perf_counter()
    model.transcribe(warm, batch_size=batch)
    sync()
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    transcripts = model.transcribe(arrays, batch_size=batch)
    sync()
    wall = time.perf_counter() - start
    errors = [f"{f}: {t.error}" for f, t in zip(files, transcripts) if t.error]
    return dict(
        warmup_s=warmup_s,
        wall_s=wall,
        errors=errors[:10],
        token_ids={f: t.token_ids for f, t in zip(files, transcripts) if t.error is None},
    )


# ---------------------------------------------------------------------------- NeMo


def part_nemo(args, list_file: Path, results: Results) -> None:
    nemo_json = args.out / "nemo_folder.json"
    cmd = [
        args.nemo_python,
        str(Path(__file__).with_name("nemo_folder.py")),
        "--model",
        args.model,
        "--files-from",
        str(list_file),
        "--batch-sizes",
        ",".join(map(str, args.sizes)),
        "--dtype",
        ",".join(args.dtypes),
        "--num-workers",
        str(args.num_workers),
        "--json",
        str(nemo_json),
    ]
    env = dict(os.environ, PYTHONPATH=args.nemo_path, PYTHONUNBUFFERED="1")
    log(f"nemo: {' '.join(cmd)}")
    start = time.perf_counter()
    try:
        with open(args.out / "nemo_folder.log", "w") as log_file:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            timer = threading.Timer(args.nemo_timeout, proc.kill)  # a silent hang ends too
            timer.start()
            for line in proc.stdout:  # echo NeMo's progress as it comes, keep all of it in the log
                log_file.write(line)
                log_file.flush()
                if line.startswith("[nemo_folder") or "Error" in line:
                    print(line, end="", file=sys.stderr, flush=True)
            proc.wait()
            timer.cancel()
        if proc.returncode == -9:
            results.data["errors"].append(f"nemo: killed after {args.nemo_timeout} s")
        results.data["nemo_returncode"] = proc.returncode
    except Exception as err:  # noqa: BLE001 - NeMo's side failing keeps ours
        results.data["errors"].append(f"nemo: {type(err).__name__}: {err}")
        log(f"nemo failed: {traceback.format_exc()}")
    results.data["nemo_s"] = time.perf_counter() - start
    results.save()
    log(
        f"nemo: exit {results.data.get('nemo_returncode')} after {results.data['nemo_s']:.0f} s; log in "
        f"{args.out / 'nemo_folder.log'}"
    )


# ---------------------------------------------------------------------------- table


def table(results: dict, nemo: dict) -> str:
    nemo_runs = {(r["dtype"], r["batch_size"]): r for r in nemo.get("runs", []) if "error" not in r}
    lines = [
        f"{results.get('files')} files, {results.get('audio_s', 0):.0f} s of audio; model {results.get('model')}; "
        f"NeMo {nemo.get('nemo_version', '-')} on {nemo.get('device', '-')} (transcribe(), num_workers "
        f"{nemo.get('num_workers', '-')}, CUDA-graph decoder {'on' if nemo.get('cuda_graph_decoder') else 'off'})",
        "",
        "RTFx = audio seconds / wall seconds. CLI: transcription time from its summary line (the whole process, "
        "start-up and loading included, in brackets); API: `transcribe(arrays)` after a warm-up; NeMo: "
        "`transcribe(paths)` after a warm-up.",
        "",
        "| dtype | B | ours | RTFx ours | RTFx NeMo | ours / NeMo | same token ids as NeMo |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [("CLI", r) for r in results.get("cli", [])] + [("API", r) for r in results.get("api", [])]
    rows.sort(key=lambda x: (x[1]["dtype"], x[1]["batch_size"], x[0] != "CLI", not x[1]["graphs"]))
    for how, row in rows:
        label = f"{how}, {'graphs' if row['graphs'] else 'no graphs'}"
        if row.get("graphs_used") is False and row["graphs"]:
            label += " (none without CUDA)"
        ref = nemo_runs.get((row["dtype"], row["batch_size"]))
        ours = _rtfx(how, row)
        ours_text = "failed" if ours is None else f"{ours:.0f}"
        if how == "CLI" and row.get("process_s") and row.get("audio_s"):
            ours_text += f" ({row['audio_s'] / row['process_s']:.0f})"
        theirs = ref["rtfx"] if ref else None
        ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
        lines.append(
            f"| {row['dtype']} | {row['batch_size']} | {label} | {ours_text} | "
            f"{f'{theirs:.0f}' if theirs else '-'} | {ratio} | {_same(row, ref)} |"
        )
    return "\n".join(lines)


def _rtfx(how: str, row: dict) -> float | None:
    if "error" in row:
        return None
    if how == "CLI":
        return row["audio_s"] / row["transcribe_s"] if row.get("transcribe_s") else None
    return row.get("rtfx")


def _same(row: dict, ref: dict | None) -> str:
    if ref is None or "token_ids" not in row:
        return "-"
    theirs, ours = ref["token_ids"], row["token_ids"]
    differ = [f for f in theirs if ours.get(f) != theirs[f]]
    return "yes" if not differ else f"no: {len(differ)} of {len(theirs)} files differ"


def differences(results: dict, nemo: dict) -> list[dict]:
    """For each of our runs: the files whose ids differ from NeMo's (first 20), with the first one's ids."""
    nemo_runs = {(r["dtype"], r["batch_size"]): r for r in nemo.get("runs", []) if "error" not in r}
    report = []
    for how in ("cli", "api"):
        for row in results.get(how, []):
            ref = nemo_runs.get((row["dtype"], row["batch_size"]))
            if ref is None or "token_ids" not in row:
                continue
            differ = [f for f in ref["token_ids"] if row["token_ids"].get(f) != ref["token_ids"][f]]
            entry = dict(
                how=how,
                dtype=row["dtype"],
                batch_size=row["batch_size"],
                graphs=row["graphs"],
                differ=len(differ),
                files=differ[:20],
            )
            if differ:
                first = differ[0]
                entry["first"] = dict(file=first, ours=row["token_ids"].get(first), nemo=ref["token_ids"][first])
            report.append(entry)
    return report


# ---------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", type=Path, required=True)
    ap.add_argument("--model", required=True, help=".nemo checkpoint (both sides load this file)")
    ap.add_argument("--nemo-path", default="", help="NeMo's site folder, the PYTHONPATH of the NeMo process")
    ap.add_argument("--nemo-python", default=sys.executable, help="the Python that runs NeMo")
    ap.add_argument("--batch-sizes", default="8,32,128")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--graphs", default="on,off", help="our decoding with CUDA graphs on, off, or both")
    ap.add_argument("--num-workers", type=int, default=8, help="NeMo's DataLoader workers")
    ap.add_argument("--parts", default="cli,api,nemo", help="cli, api, nemo, table (table only: from OUT's JSON)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for one CLI run")
    ap.add_argument("--nemo-timeout", type=float, default=900, help="seconds for the whole NeMo process")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    args.graphs = [{"on": True, "off": False}[g.strip()] for g in args.graphs.split(",") if g.strip()]
    args.model = str(Path(args.model).resolve())
    parts = {p.strip() for p in args.parts.split(",")}
    args.out.mkdir(parents=True, exist_ok=True)

    from graphscribe.io.audio import find_audio_files

    folder = args.folder.resolve()
    files = [str(p) for p in find_audio_files(folder)]
    if not files:
        log(f"{folder}: no audio files")
        return 2
    seconds = {}
    for f in files:
        try:
            seconds[f] = sf.info(f).duration
        except Exception:  # noqa: BLE001 - a bad file: both sides report it
            seconds[f] = 0.0
    list_file = args.out / "files.txt"
    list_file.write_text("\n".join(files) + "\n")
    for f in files:  # read once: every run finds the files in the page cache
        Path(f).read_bytes()
    results = Results(
        args.out / "compare_folder.json",
        None
        if parts == {"table"}
        else dict(
            folder=str(folder),
            model=args.model,
            files=len(files),
            audio_s=sum(seconds.values()),
            argv=sys.argv,
            batch_sizes=args.sizes,
            dtypes=args.dtypes,
        ),
    )
    log(f"{len(files)} files, {sum(seconds.values()):.1f} s of audio under {folder}; parts {sorted(parts)}")

    if "cli" in parts:
        part_cli(args, folder, files, seconds, results)
    if "api" in parts:
        part_api(args, files, seconds, results)
    if "nemo" in parts:
        part_nemo(args, list_file, results)

    nemo_json = args.out / "nemo_folder.json"
    nemo = json.loads(nemo_json.read_text()) if nemo_json.exists() else {}
    results.data["differences"] = differences(results.data, nemo)
    results.save()
    text = table(results.data, nemo)
    (args.out / "compare_folder.md").write_text(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
