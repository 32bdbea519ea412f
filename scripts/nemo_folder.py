#!/usr/bin/env python
"""NeMo side of the folder comparison: NeMo 3.0's own `transcribe()` over files, timed, with token ids.

Runs under NeMo (nemo_toolkit 3.0.0), in its own process with NeMo's site folder on PYTHONPATH
(scripts/compare_folder.py starts it so). On the GPU machine, with NeMo's wheels in /tmp/nemo-site:

    PYTHONPATH=/tmp/nemo-site python scripts/nemo_folder.py --model X.nemo --folder DIR \
        --batch-sizes 8,32,128 --dtype float32,bfloat16 --json $OUT/nemo_folder.json

Here on the CPU (the tiny NeMo fixture; every run must give reference.json's token ids):

    /work/nemo-venv/bin/python scripts/nemo_folder.py --model tests/fixtures/nemo-tdt-tiny/tdt-tiny.nemo \
        --folder tests/fixtures/nemo-tdt-tiny/clips --batch-sizes 1,4 --dtype float32 --num-workers 2 \
        --device cpu --check-reference tests/fixtures/nemo-tdt-tiny/reference.json --json /tmp/nemo_folder.json

What it does, per dtype in the order given (float32 first: bfloat16 is a cast of the loaded model):
- float32: TF32 off for cuDNN and matmuls (NeMo's float32, as graphscribe computes it).
- bfloat16: `model.to(torch.bfloat16)`, what NeMo's examples/asr/transcribe_speech.py does with its
  `compute_dtype` option (its default on GPUs with bfloat16). `--bf16-via amp` tries that script's other
  way first, `amp=true amp_dtype=bfloat16` (float32 weights under torch.amp.autocast); if it fails
  (NeMo 3.0: "mat1 and mat2 must have the same dtype"), the error is recorded and the cast is used.
- Decoding: greedy_batch, label looping, NeMo's CUDA-graph decoder (`use_cuda_graph_decoder`; without CUDA
  NeMo decodes without graphs).
- Per batch size B: one untimed warm-up `transcribe()` of the longest min(B, files) files with batch B
  (CUDA graph capture, cuDNN autotuning, worker start-up), then one timed
  `model.transcribe(paths, batch_size=B, num_workers=N, return_hypotheses=True)` over every file, wall
  clock with CUDA synchronised. RTFx = audio seconds / wall seconds. Token ids per file from each
  Hypothesis's `y_sequence`, keyed by the path as given.

The JSON is rewritten after every run, so a run stopped half-way keeps what it measured; a failing
run records its error and the next one goes on. Progress lines go to stderr, flushed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import sys
import time
import traceback
from pathlib import Path

import torch

AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a", ".aiff", ".aif"}


def log(msg: str) -> None:
    print(f"[nemo_folder {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def list_files(args) -> list[str]:
    if args.files_from:
        return [line.strip() for line in Path(args.files_from).read_text().splitlines() if line.strip()]
    root = Path(args.folder).resolve()
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)


def audio_seconds(files: list[str]) -> dict[str, float]:
    import soundfile as sf

    seconds = {}
    for f in files:
        try:
            seconds[f] = sf.info(f).duration
        except Exception as err:  # noqa: BLE001 - one unreadable file must not stop the run
            log(f"cannot read the length of {f}: {err}")
            seconds[f] = 0.0
    return seconds


def set_decoding(model, use_cuda_graph: bool) -> None:
    """greedy_batch with label looping, NeMo's CUDA-graph decoder on or off (as scripts/nemo_peer.py)."""
    from omegaconf import OmegaConf

    dcfg = copy.deepcopy(model.cfg.decoding)
    OmegaConf.set_struct(dcfg, False)
    dcfg.strategy = "greedy_batch"
    if "greedy" not in dcfg or dcfg.greedy is None:
        dcfg.greedy = {}
    dcfg.greedy.loop_labels = True
    dcfg.greedy.use_cuda_graph_decoder = bool(use_cuda_graph)
    model.change_decoding_strategy(dcfg, verbose=False)


def cast_bfloat16(model, args) -> None:
    """transcribe_speech.py's compute_dtype: the whole model cast; a fresh decoder (graphs captured anew)."""
    model.to(torch.bfloat16)
    set_decoding(model, use_cuda_graph=not args.no_cuda_graphs)


def token_ids(hypothesis) -> list[int]:
    ids = hypothesis.y_sequence
    ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
    return [int(i) for i in ids]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_transcribe(model, paths: list[str], batch: int, workers: int, autocast) -> list:
    with autocast(), torch.inference_mode():
        out = model.transcribe(paths, batch_size=batch, num_workers=workers, return_hypotheses=True, verbose=False)
    if isinstance(out, tuple):  # (best, all) in older NeMo versions
        out = out[0]
    if len(out) != len(paths):
        raise RuntimeError(f"transcribe returned {len(out)} results for {len(paths)} files")
    return out


def measure(model, files, seconds, batch, args, device, autocast) -> dict:
    longest = sorted(files, key=lambda f: -seconds[f])[: min(batch, len(files))]
    t = time.perf_counter()
    run_transcribe(model, longest, batch, args.num_workers, autocast)
    sync(device)
    warmup_s = time.perf_counter() - t
    sync(device)
    t = time.perf_counter()
    hyps = run_transcribe(model, files, batch, args.num_workers, autocast)
    sync(device)
    wall = time.perf_counter() - t
    audio = sum(seconds.values())
    return dict(
        batch_size=batch,
        warmup_s=warmup_s,
        warmup_files=len(longest),
        wall_s=wall,
        audio_s=audio,
        rtfx=audio / wall if wall > 0 else None,
        token_ids={f: token_ids(h) for f, h in zip(files, hyps)},
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help=".nemo checkpoint")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--folder", help="audio files under this folder, recursively (sorted paths)")
    source.add_argument("--files-from", help="a text file with one audio path per line (used as given)")
    ap.add_argument("--batch-sizes", default="8,32,128")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16, or both in order: float32,bfloat16")
    ap.add_argument(
        "--bf16-via",
        default="cast",
        choices=["cast", "amp"],
        help="cast: model.to(bfloat16) (transcribe_speech.py compute_dtype); amp: autocast first",
    )
    ap.add_argument("--num-workers", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-cuda-graphs", action="store_true", help="NeMo's decoder without its CUDA graphs")
    ap.add_argument("--check-reference", help="a fixture's reference.json: every run's ids must equal its token_ids")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()

    out: dict = dict(tool="nemo_folder", argv=sys.argv, model=args.model, runs=[], errors=[])
    out_path = Path(args.json)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out_path.write_text(json.dumps(out, separators=(",", ":")) + "\n")

    try:
        sizes = [int(s) for s in args.batch_sizes.split(",") if s.strip()]
        dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
        if not sizes or any(d not in ("float32", "bfloat16") for d in dtypes):
            raise ValueError(f"--batch-sizes {args.batch_sizes!r} / --dtype {args.dtype!r}")
        files = list_files(args)
        if not files:
            raise ValueError(f"no audio files in {args.folder or args.files_from}")
        seconds = audio_seconds(files)
        out.update(files=len(files), audio_s=sum(seconds.values()), num_workers=args.num_workers)
        log(f"{len(files)} files, {sum(seconds.values()):.1f} s of audio; batch sizes {sizes}; dtypes {dtypes}")

        logging.getLogger("nemo_logger").setLevel(logging.ERROR)
        import nemo
        from nemo.collections.asr.models import EncDecRNNTBPEModel
        from nemo.utils import logging as nemo_logging

        nemo_logging.setLevel(logging.ERROR)
        device = torch.device(args.device)
        out.update(
            nemo_version=nemo.__version__,
            torch_version=torch.__version__,
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        )
        t = time.perf_counter()
        model = EncDecRNNTBPEModel.restore_from(args.model, map_location=device).eval()
        set_decoding(model, use_cuda_graph=not args.no_cuda_graphs)
        out["load_s"] = time.perf_counter() - t
        out["cuda_graph_decoder"] = not args.no_cuda_graphs
        log(f"NeMo {nemo.__version__} loaded {args.model} on {out['device']} in {out['load_s']:.1f} s")
        save()
    except Exception as err:  # noqa: BLE001 - recorded for the comparison, then a non-zero exit
        out["errors"].append(f"setup: {type(err).__name__}: {err}")
        log(f"setup failed: {traceback.format_exc()}")
        save()
        return 1

    for dtype in dtypes:
        autocast, via = contextlib.nullcontext, "float32"
        if dtype == "float32":
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            if next(model.parameters()).dtype != torch.float32:
                out["errors"].append("float32 asked after bfloat16: the model is cast already; skipped")
                continue
        elif args.bf16_via == "amp" and not out.get("amp_failed"):
            via = "amp (torch.amp.autocast bfloat16, float32 weights)"
            autocast = lambda: torch.amp.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731
        else:
            cast_bfloat16(model, args)
            via = "model.to(torch.bfloat16)"
        for batch in sizes:
            log(f"{dtype} ({via}) B={batch}: warm-up, then {len(files)} files")
            try:
                try:
                    run = measure(model, files, seconds, batch, args, device, autocast)
                except RuntimeError as err:
                    if autocast is contextlib.nullcontext:
                        raise
                    out["amp_failed"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
                    log(f"amp failed ({out['amp_failed']}); casting the model to bfloat16 instead")
                    cast_bfloat16(model, args)
                    autocast, via = contextlib.nullcontext, "model.to(torch.bfloat16) (after amp failed)"
                    run = measure(model, files, seconds, batch, args, device, autocast)
            except Exception as err:  # noqa: BLE001 - one failing batch size must not lose the others
                out["runs"].append(dict(dtype=dtype, batch_size=batch, via=via, error=f"{type(err).__name__}: {err}"))
                log(f"{dtype} B={batch} failed: {traceback.format_exc()}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                save()
                continue
            run.update(dtype=dtype, via=via)
            out["runs"].append(run)
            log(
                f"{dtype} B={batch}: {run['wall_s']:.2f} s for {run['audio_s']:.1f} s of audio, RTFx {run['rtfx']:.1f} "
                f"(warm-up {run['warmup_s']:.2f} s)"
            )
            save()

    status = 0
    if args.check_reference:
        reference = json.loads(Path(args.check_reference).read_text())
        expected = {c["file"]: c["token_ids"] for c in reference["clips"]}
        checks = []
        for run in [r for r in out["runs"] if r["dtype"] == "float32"]:  # the reference is NeMo's float32
            for path, ids in run.get("token_ids", {}).items():
                name = Path(path).name
                if name in expected:
                    checks.append(
                        dict(dtype=run["dtype"], batch_size=run["batch_size"], file=name, agrees=ids == expected[name])
                    )
        out["reference_check"] = checks
        bad = [c for c in checks if not c["agrees"]]
        log(
            f"reference check: {len(checks) - len(bad)}/{len(checks)} (file, dtype, B) agree with "
            f"{args.check_reference}"
        )
        status = 1 if bad or not checks else 0
    save()
    log(f"wrote {out_path}")
    return status or (1 if any("error" in r for r in out["runs"]) else 0)


if __name__ == "__main__":
    sys.exit(main())
