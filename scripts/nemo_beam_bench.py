#!/usr/bin/env python
"""NeMo 3.0's greedy and `malsd_batch` beam search on a folder: throughput and every file's token ids (the peer and
the oracle of bench/2026-11-beam, issue 49); greedy with GPU phrase boosting or with word confidence on (the peer of
bench/2026-11-boost-confidence, issue 50).

Runs only where NeMo 3.0 is importable (`PYTHONPATH=/tmp/nemo-site` on the lent GPU, `/work/nemo-cpu` here):

    python scripts/nemo_beam_bench.py --model X.nemo --folder DIR --beam 4 --batch-size 128 --dtype bfloat16 \
        --runs greedy,beam --json OUT.json [--limit FILES] [--device cuda]

What it does (as scripts/nemo_folder.py, whose float32 and bfloat16 it follows):
- float32: TF32 off for cuDNN and matmuls; bfloat16: `model.to(torch.bfloat16)` (transcribe_speech.py's
  `compute_dtype`), a fresh decoding strategy after the cast.
- greedy: `greedy_batch`, label looping, NeMo's CUDA-graph decoder (its default); beam: `malsd_batch` with
  `beam_size` --beam, NeMo's defaults otherwise (`allow_cuda_graphs` on, `score_norm`, the best hypothesis
  returned), `max_symbols` the model's greedy max_symbols (graphscribe's `DecodingConfig.max_symbols`), both through
  `model.change_decoding_strategy`.
- boost: greedy as above with NeMo's boosting tree of the --phrases file's phrases (one a line; its default tree
  settings, `boosting_tree_alpha` --boost); confidence: greedy with `confidence_cfg` preserving frame, token and
  word confidence (its default method: entropy, Tsallis, alpha 0.33, exponential norm; aggregation min).
- Per run: one untimed warm-up `transcribe()` of the longest min(B, files) files (graph capture, cuDNN plans,
  worker start-up), then one timed `model.transcribe(paths, batch_size=B, num_workers=N, return_hypotheses=True)`
  over every file, CUDA synchronised around it. RTFx = audio seconds / wall seconds; each file's best hypothesis'
  `y_sequence`, keyed by the path as given.

The JSON is rewritten after every run; a run that fails records its error and the next goes on.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import time
import traceback
from pathlib import Path

import torch

AUDIO_SUFFIXES = {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a"}
MAX_SYMBOLS = 10  # NeMo's greedy default, where the checkpoint's config names none
# NeMo's BoostingTreeModelConfig defaults (as scripts/fixtures/make_nemo_fusion_fixtures.py)
TREE_DEFAULTS = {"context_score": 1.0, "depth_scaling": 2.0, "unk_score": 0.0, "final_eos_score": 1.0}
RUN_NAMES = {"greedy": "greedy", "boost": "greedy, phrases boosted", "confidence": "greedy, confidence on"}


def log(msg: str) -> None:
    print(f"[nemo_beam_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def set_strategy(model, base, run: str, beam: int, phrases: list[str] | None = None, boost: float = 1.0) -> None:
    """greedy: greedy_batch with NeMo's CUDA-graph decoder; beam: malsd_batch of `beam` hypotheses; boost: greedy
    with a boosting tree of `phrases`; confidence: greedy with word confidences. Each from `base`, the checkpoint's
    own decoding config (change_decoding_strategy keeps the last run's in model.cfg)."""
    from omegaconf import OmegaConf

    dcfg = copy.deepcopy(base)
    OmegaConf.set_struct(dcfg, False)
    if "greedy" not in dcfg or dcfg.greedy is None:
        dcfg.greedy = {}
    max_symbols = dcfg.greedy.get("max_symbols", None) or MAX_SYMBOLS
    if run in ("greedy", "boost", "confidence"):
        dcfg.strategy = "greedy_batch"
        dcfg.greedy.loop_labels = True
        dcfg.greedy.use_cuda_graph_decoder = True
        if run == "boost":
            dcfg.greedy.boosting_tree = {"key_phrases_list": phrases, **TREE_DEFAULTS}
            dcfg.greedy.boosting_tree_alpha = boost
        if run == "confidence":
            from nemo.collections.asr.parts.utils.asr_confidence_utils import ConfidenceConfig

            conf = ConfidenceConfig(
                preserve_frame_confidence=True, preserve_token_confidence=True, preserve_word_confidence=True
            )
            dcfg.confidence_cfg = OmegaConf.structured(conf)
    else:
        dcfg.strategy = "malsd_batch"
        dcfg.beam = {
            "beam_size": beam,
            "return_best_hypothesis": True,
            "score_norm": True,
            "allow_cuda_graphs": True,
            "max_symbols": max_symbols,  # RNNTDecoding reads beam.max_symbols
        }
    model.change_decoding_strategy(dcfg, verbose=False)


def token_ids(hypothesis) -> list[int]:
    ids = hypothesis.y_sequence
    return [int(i) for i in (ids.tolist() if torch.is_tensor(ids) else ids)]


def transcribe(model, paths: list[str], batch: int, workers: int) -> list:
    with torch.inference_mode():
        out = model.transcribe(paths, batch_size=batch, num_workers=workers, return_hypotheses=True, verbose=False)
    if isinstance(out, tuple):  # (best, all) in older NeMo versions
        out = out[0]
    if len(out) != len(paths):
        raise RuntimeError(f"transcribe returned {len(out)} results for {len(paths)} files")
    return [h[0] if isinstance(h, list) else h for h in out]  # an n-best list: its best


def measure(model, files: list[str], seconds: dict[str, float], args, device: torch.device) -> dict:
    longest = sorted(files, key=lambda f: -seconds[f])[: min(args.batch_size, len(files))]
    start = time.perf_counter()
    transcribe(model, longest, args.batch_size, args.num_workers)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    hyps = transcribe(model, files, args.batch_size, args.num_workers)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - start
    audio = sum(seconds.values())
    return dict(
        warmup_s=warmup,
        wall_s=wall,
        audio_s=audio,
        rtfx=audio / wall,
        token_ids={f: token_ids(h) for f, h in zip(files, hyps)},
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help=".nemo checkpoint")
    ap.add_argument("--folder", required=True, help="audio files under this folder, recursively (sorted paths)")
    ap.add_argument("--limit", type=int, help="the first FILES files of the sorted list only")
    ap.add_argument("--runs", default="greedy,beam", help="greedy, beam, boost, confidence: any of them in order")
    ap.add_argument("--phrases", help="boost: a file of phrases to boost, one a line (an optional ':score' is cut)")
    ap.add_argument("--boost", type=float, default=1.0, help="boost: NeMo's boosting_tree_alpha")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--num-workers", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    out: dict = dict(tool="nemo_beam_bench", argv=sys.argv, model=args.model, runs=[], errors=[])
    out_path = Path(args.json)
    out_path.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out_path.write_text(json.dumps(out, separators=(",", ":")) + "\n")

    try:
        import soundfile as sf

        root = Path(args.folder).resolve()
        files = sorted(str(p) for p in root.rglob("*") if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES)
        files = files[: args.limit] if args.limit else files
        if not files:
            raise ValueError(f"no audio files in {args.folder}")
        seconds = {f: sf.info(f).duration for f in files}
        logging.getLogger("nemo_logger").setLevel(logging.ERROR)
        import nemo
        from nemo.collections.asr.models import ASRModel
        from nemo.utils import logging as nemo_logging

        nemo_logging.setLevel(logging.ERROR)
        device = torch.device(args.device)
        if args.dtype == "float32":
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        start = time.perf_counter()
        model = ASRModel.restore_from(args.model, map_location=device).eval()
        if args.dtype == "bfloat16":
            model.to(torch.bfloat16)
        base = copy.deepcopy(model.cfg.decoding)
        out.update(
            files=len(files),
            audio_s=sum(seconds.values()),
            dtype=args.dtype,
            batch_size=args.batch_size,
            beam=args.beam,
            num_workers=args.num_workers,
            nemo_version=nemo.__version__,
            torch_version=torch.__version__,
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            load_s=time.perf_counter() - start,
        )
        log(f"NeMo {nemo.__version__}: {len(files)} files, {out['audio_s']:.1f} s of audio, {args.dtype}")
        save()
    except Exception as err:  # noqa: BLE001 - recorded in the JSON, then a non-zero exit
        out["errors"].append(f"setup: {type(err).__name__}: {err}")
        log(f"setup failed: {traceback.format_exc()}")
        save()
        return 1

    for run in [r.strip() for r in args.runs.split(",") if r.strip()]:
        name = RUN_NAMES.get(run, f"malsd_batch beam {args.beam}")
        try:
            phrases = None
            if run == "boost":
                lines = Path(args.phrases).read_text(encoding="utf-8").splitlines()
                phrases = [line.rsplit(":", 1)[0].strip() for line in lines if line.strip()]
            set_strategy(model, base, run, args.beam, phrases, args.boost)
            result = measure(model, files, seconds, args, device)
        except Exception as err:  # noqa: BLE001 - one failing run must not lose the other
            out["runs"].append(dict(run=run, name=name, error=f"{type(err).__name__}: {err}"))
            log(f"{name} failed: {traceback.format_exc()}")
            save()
            continue
        out["runs"].append(dict(run=run, name=name, **result))
        log(f"{name}: {result['wall_s']:.2f} s, RTFx {result['rtfx']:.1f} (warm-up {result['warmup_s']:.2f} s)")
        save()
    log(f"wrote {out_path}")
    return 1 if any("error" in r for r in out["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
