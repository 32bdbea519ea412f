#!/usr/bin/env python
"""NeMo 3.0's own CacheAwareRNNTPipeline on a folder of audio: throughput, step latency against the chunk, and
every file's token ids (the peer and the oracle of `scripts/compare_cache_aware.py`).

Runs only where NeMo 3.0 is importable (`PYTHONPATH=/tmp/nemo-site` on the lent GPU, `/work/nemo-cpu` here):

    python scripts/nemo_cache_aware_bench.py CKPT FOLDER --chunk 0.08 --streams 64,256 --device cuda \
        --dtype float32 --out DIR [--limit FILES] [--offline FILES]

The pipeline is built as tests/fixtures/nemo-cache-aware's maker builds it (`PipelineBuilder.build_pipeline`)
from NVIDIA's config for nemotron-speech-streaming-en-0.6b (NVIDIA-NeMo/Speech
examples/asr/conf/asr_streaming_inference/cache_aware_rnnt.yaml: frame requests, encoder and feature caches,
greedy_batch with max_symbols 10 and the CUDA-graph decoder off, 800 ms end-of-utterance history), adapted:
`att_context_size` is the model's context whose chunk is `--chunk` ((lookahead + 1) x 80 ms), `batch_size` the
level's N, `--dtype` (float32 by default) and matmul precision `highest` (no TF32: the float32 peer of
graphscribe's float32, whose token ids it must give).

Each level runs `BasePipeline.run()` over every file's audio (read beforehand with NeMo's reader, off the clock):
N streams at a time, every chunk there at once, the next file joining as one ends (max pace). Reported per level:
the real-time factor (audio seconds / wall seconds), and the time of each step (NeMo's request streamer's
`next()`: framing and features, plus `transcribe_step`: encoder, decoder, text), with the steps whose batch was
full (N streams) apart: at real-time pace every open stream has one chunk per chunk period, so N streams keep
real time when a full step takes at most the chunk (`keeps_real_time`: its p95 <= the chunk).

`--offline FILES`: also the model's own offline pass (`model.transcribe`, batch 1, the model's default context,
as graphscribe's `transcribe()` runs a cache-aware model) on the first FILES files.

Prints one JSON line (NeMo's logs go to stderr); writes DIR/result.json and DIR/transcripts.json (per file:
`token_ids` of the stream, `offline_token_ids` where run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NEMO_REDIRECT_LOGS_TO_STDERR", "1")  # stdout keeps the JSON line

AUDIO_EXTS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a")
SAMPLE_RATE = 16000  # Hz
ENCODER_FRAME_SECONDS = 0.08  # 8 x 10 ms feature frames

# NVIDIA's cache_aware_rnnt.yaml for nemotron-speech-streaming-en-0.6b (ITN, NMT, metrics and beam search left
# out: off). Filled from the command line: asr.model_name, device, compute_dtype, streaming.att_context_size,
# batch_size and num_slots.
BASE_CFG = {
    "asr": {
        "model_name": None,
        "device": "cuda",
        "device_id": 0,
        "compute_dtype": "float32",
        "use_amp": False,
        "decoding": {
            "strategy": "greedy_batch",
            "preserve_alignments": False,
            "fused_batch_size": -1,
            "greedy": {
                "use_cuda_graph_decoder": False,  # NVIDIA's config: "Disabled due to issues with decoding"
                "max_symbols": 10,
                "ngram_lm_model": None,
                "ngram_lm_alpha": 0.0,
                "boosting_tree": {
                    "model_path": None,
                    "key_phrases_file": None,
                    "key_phrases_list": None,
                    "source_lang": "en",
                },
                "boosting_tree_alpha": 0.0,
            },
        },
    },
    "itn": {
        "input_case": "lower_cased",
        "whitelist": None,
        "overwrite_cache": False,
        "max_number_of_permutations_per_split": 729,
        "left_padding_size": 4,
        "batch_size": 32,
        "n_jobs": 16,
    },
    "confidence": {
        "exclude_blank": True,
        "aggregation": "mean",
        "method_cfg": {"name": "entropy", "entropy_type": "tsallis", "alpha": 0.5, "entropy_norm": "exp"},
    },
    "endpointing": {"stop_history_eou": 800, "residue_tokens_at_end": 2},
    "streaming": {
        "sample_rate": SAMPLE_RATE,
        "batch_size": 64,
        "word_boundary_tolerance": 4,
        "att_context_size": [70, 13],
        "use_cache": True,
        "use_feat_cache": True,
        "chunk_size_in_secs": None,  # the model's chunk: (lookahead + 1) encoder frames
        "request_type": "frame",
        "num_slots": 256,
    },
    "matmul_precision": "highest",
    "log_level": 40,
    "pipeline_type": "cache_aware",
    "asr_decoding_type": "rnnt",
    "audio_file": None,
    "output_filename": None,
    "output_dir": None,
    "enable_pnc": False,
    "enable_itn": False,
    "enable_nmt": False,
    "asr_output_granularity": "segment",
    "cache_dir": None,
    "lang": "en",
    "return_tail_result": False,
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ckpt", help="a cache-aware streaming .nemo (EncDecRNNTBPEModel)")
    p.add_argument("folder", type=Path, help="folder of audio files (searched recursively, name order)")
    p.add_argument("--chunk", type=float, default=1.12, help="seconds per step: picks the attention context")
    p.add_argument("--streams", default="64", help="N,N,...: streams at once, a level each (64)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--matmul-precision", default="highest", choices=["highest", "high", "medium"])
    p.add_argument("--limit", type=int, default=None, help="only the first FILES files")
    p.add_argument("--offline", type=int, default=0, metavar="FILES", help="the model's offline pass on FILES files")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    return p.parse_args(argv)


def list_audio(folder: Path, limit: int | None) -> list[Path]:
    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in AUDIO_EXTS)
    return paths[:limit]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def model_contexts(ckpt: Path) -> list[list[int]]:
    """The checkpoint's [left, lookahead] attention contexts, the default first (read from its model_config.yaml)."""
    import tarfile

    import yaml

    with tarfile.open(ckpt, "r:*") as tar:
        member = next(m for m in tar.getmembers() if m.name.removeprefix("./") == "model_config.yaml")
        raw = yaml.safe_load(tar.extractfile(member).read())["encoder"]["att_context_size"]
    return [list(map(int, c)) for c in raw] if isinstance(raw[0], list) else [list(map(int, raw))]


def context_for(contexts: list[list[int]], chunk: float) -> list[int]:
    """The context whose chunk ((lookahead + 1) x 80 ms) is `chunk` seconds."""
    for left, lookahead in contexts:
        if abs((lookahead + 1) * ENCODER_FRAME_SECONDS - chunk) < 1e-6:
            return [left, lookahead]
    chunks = ", ".join(f"{(c[1] + 1) * ENCODER_FRAME_SECONDS:g}" for c in contexts)
    raise SystemExit(f"--chunk {chunk:g}: this model streams in chunks of {chunks} s")


class Recorder:
    """Every stream's token ids and every step's time and batch size, from hooks on NeMo's own objects."""

    def __init__(self, pipeline, sync):
        from nemo.collections.asr.inference.streaming.state.state import StreamingState

        self.ids: dict[int, list[int]] = {}
        self.steps: list[tuple[int, float]] = []  # (batch, seconds: request fetch + transcribe_step)
        orig_update = StreamingState._update_state

        def _update_state(state, output, skip):  # every token a stream's state takes (cache-aware: skip 0)
            before = len(state.tokens)
            orig_update(state, output, skip)
            state.__dict__.setdefault("_bench_ids", []).extend(int(t) for t in state.tokens[before:])

        StreamingState._update_state = _update_state
        orig_delete, orig_step, orig_requests = (
            pipeline.delete_state,
            pipeline.transcribe_step,
            pipeline.get_request_generator,
        )

        def delete_state(stream_id):
            state = pipeline.get_state(stream_id)
            if state is not None:
                self.ids[stream_id] = list(state.__dict__.get("_bench_ids", []))
            orig_delete(stream_id)

        def get_request_generator():
            return _TimedRequests(orig_requests(), self, sync)

        def transcribe_step(requests):
            out = orig_step(requests)
            sync()
            self.steps.append((len(requests), time.perf_counter() - self._fetch_start))
            return out

        pipeline.delete_state, pipeline.transcribe_step = delete_state, transcribe_step
        pipeline.get_request_generator = get_request_generator
        self._fetch_start = 0.0


class _TimedRequests:
    """NeMo's request streamer; marks when each step's `next()` (framing and features) begins."""

    def __init__(self, inner, recorder: Recorder, sync):
        self._inner, self._recorder, self._sync = inner, recorder, sync

    def __iter__(self):
        return self

    def __next__(self):
        self._sync()
        self._recorder._fetch_start = time.perf_counter()
        return next(self._inner)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def run_level(pipeline, recorder: Recorder, audio: list, n: int, chunk: float, sync) -> dict:
    from nemo.collections.asr.inference.streaming.framing.request_options import ASRRequestOptions

    pipeline.batch_size = n  # read only by get_request_generator: one built pipeline serves every level
    recorder.ids.clear()
    recorder.steps.clear()
    sync()
    start = time.perf_counter()
    pipeline.run(list(audio), options=[ASRRequestOptions() for _ in audio])
    sync()
    wall = time.perf_counter() - start
    seconds = sum(len(a) for a in audio) / SAMPLE_RATE
    all_steps = [s for _, s in recorder.steps]
    full = [s for b, s in recorder.steps if b == n]
    p95_full = percentile(full, 95)
    return {
        "streams": n,
        "pace": "max",
        "rtfx": round(seconds / wall, 1),
        "audio_seconds": round(seconds, 2),
        "wall_seconds": round(wall, 3),
        "steps": len(all_steps),
        "step_ms": {"mean": ms(statistics.mean(all_steps)), "p95": ms(percentile(all_steps, 95))},
        "full_steps": len(full),
        "full_step_ms": {f"p{q}": ms(percentile(full, q)) for q in (50, 95, 99)},
        "keeps_real_time": None if p95_full is None else p95_full <= chunk,
    }


def offline_ids(model, paths: list[Path], context: list[int], sync) -> tuple[dict[str, list[int]], float]:
    """The model's own offline pass, one file at a time, at the model's default context."""
    import torch

    model.encoder.set_default_att_context_size(context)
    model.preprocessor.featurizer.dither = 0.0
    sync()
    start = time.perf_counter()
    with torch.inference_mode():
        hyps = model.transcribe([str(p) for p in paths], batch_size=1, return_hypotheses=True, verbose=False)
    sync()
    wall = time.perf_counter() - start
    model.eval()  # NeMo 3.0's transcribe() leaves the modules in training mode (../shared/NEMO_ON_GPU.md)
    hyps = hyps[0] if isinstance(hyps, tuple) else hyps
    return {p.name: [int(t) for t in h.y_sequence.tolist()] for p, h in zip(paths, hyps)}, wall


def main(argv=None) -> int:
    args = parse_args(argv)
    import nemo
    import torch
    from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder
    from nemo.collections.asr.inference.utils.audio_io import read_audio
    from omegaconf import OmegaConf

    levels = [int(n) for n in args.streams.split(",")]
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    paths = list_audio(args.folder, args.limit)
    if not paths:
        print(f"no audio files under {args.folder}", file=sys.stderr)
        return 2
    contexts = model_contexts(args.ckpt)
    context = context_for(contexts, args.chunk)
    cfg = OmegaConf.create(BASE_CFG)
    cfg.asr.model_name = str(Path(args.ckpt).resolve())
    cfg.asr.device, cfg.asr.device_id = device.split(":")[0], int(device.partition(":")[2] or 0)
    cfg.asr.compute_dtype = args.dtype
    cfg.matmul_precision = args.matmul_precision
    cfg.streaming.att_context_size = context
    cfg.streaming.batch_size = cfg.streaming.num_slots = max(levels)

    if args.matmul_precision == "highest":
        # matmul_precision reaches only the matmuls: torch's cuDNN convolutions (the subsampling and the conv
        # modules) run in TF32 unless told, which moves NeMo's float32 ids with its batch's shapes
        torch.backends.cudnn.allow_tf32 = False
    start = time.perf_counter()
    pipeline = PipelineBuilder.build_pipeline(cfg)
    build_s = time.perf_counter() - start
    dev = pipeline.device

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    recorder = Recorder(pipeline, sync)
    audio = [read_audio(str(p), target_sr=SAMPLE_RATE, mono=True) for p in paths]
    # warm-up off the clock: the largest level, every stream two chunks long
    frame = int(round(pipeline.chunk_size_in_secs * SAMPLE_RATE))
    warm = [audio[i % len(audio)][: 2 * frame].clone() for i in range(max(levels))]
    start = time.perf_counter()
    run_level(pipeline, recorder, warm, max(levels), args.chunk, sync)
    warm_s = time.perf_counter() - start

    rows, ids = [], None
    for n in levels:
        rows.append(run_level(pipeline, recorder, audio, n, args.chunk, sync))
        level_ids = {paths[sid].name: recorder.ids.get(sid, []) for sid in range(len(paths))}
        if ids is None:
            ids = level_ids
        rows[-1]["token_ids_as_first_level"] = level_ids == ids
        # NeMo against itself: its ids move with the batch it runs in (float32 products of other shapes)
        rows[-1]["files_as_first_level"] = sum(level_ids[name] == ids[name] for name in ids)
    transcripts = {name: {"token_ids": token_ids} for name, token_ids in ids.items()}
    result = {
        "peer": "NeMo CacheAwareRNNTPipeline",
        "model": str(args.ckpt),
        "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "dtype": args.dtype,
        "matmul_precision": args.matmul_precision,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "chunk": round(pipeline.chunk_size_in_secs, 4),
        "att_context_size": context,
        "feature_buffer_frames": pipeline.expected_feature_buffer_len,
        "decoder": "greedy_batch, max_symbols 10, no CUDA graphs",
        "files": len(paths),
        "build_seconds": round(build_s, 2),
        "warmup_seconds": round(warm_s, 2),
        "levels": rows,
        "nemo": nemo.__version__,
        "torch": torch.__version__,
    }
    if args.offline:
        default = contexts[0]
        offline, wall = offline_ids(pipeline.asr_model.asr_model, paths[: args.offline], default, sync)
        for name, token_ids in offline.items():
            transcripts[name]["offline_token_ids"] = token_ids
        result["offline"] = {"files": len(offline), "att_context_size": default, "wall_seconds": round(wall, 2)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "transcripts.json").write_text(json.dumps(transcripts, indent=1) + "\n")
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
