#!/usr/bin/env python
"""Benchmark NVIDIA NeMo's own buffered (chunked) RNN-T/TDT streaming pipeline on a folder of audio.

Uses NeMo 3.0's streaming inference stack unchanged:
  PipelineBuilder.build_pipeline(cfg)           (nemo.collections.asr.inference.factory.pipeline_builder)
    -> BufferedPipelineBuilder -> RNNTInferenceWrapper(.nemo, decoding_cfg) + BufferedRNNTPipeline
  pipeline.run(audio, options)                  (BasePipeline.run: ContinuousBatchedRequestStreamer feeds
                                                 N streams at a time; new files join as others finish)

The config mirrors NVIDIA's examples/asr/conf/asr_streaming_inference/parakeet_tdt_0.6b_v3.yaml
(NVIDIA-NeMo/Speech): chunk 0.8 s, left 9.6 s, right 1.6 s, feature_buffer requests, stateful decoding,
right padding, greedy_batch with CUDA-graph decoder, max_symbols 10, bfloat16 without AMP, matmul
precision "high". Audio is read once with NeMo's own reader (librosa, 16 kHz mono) before the timed
region and handed to the pipeline as tensors, so the wall time is inference only, as upstream's
preload_audio=true does; the pipeline is then driven as fast as it goes (no real-time pacing).

Usage:
  python nemo_stream.py CKPT.nemo FOLDER --streams N --chunk 0.8 --left 9.6 --right 1.6 \
      [--device cuda] [--dtype float32|bfloat16] [--limit FILES] [--out DIR] [--offline]

Prints one JSON line on stdout (NeMo's logs go to stderr); writes DIR/transcripts.json and DIR/result.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

# NeMo logs INFO to stdout unless told otherwise; keep stdout for the JSON line.
os.environ.setdefault("NEMO_REDIRECT_LOGS_TO_STDERR", "1")

AUDIO_EXTS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a")

# NVIDIA's streaming config for parakeet-tdt-0.6b-v3 (NVIDIA-NeMo/Speech,
# examples/asr/conf/asr_streaming_inference/parakeet_tdt_0.6b_v3.yaml), ITN/NMT off.
# asr.model_name, asr.device, asr.compute_dtype and the streaming sizes are filled from the command line.
BASE_CFG = {
    "asr": {
        "model_name": None,
        "device": "cuda",
        "device_id": 0,
        "compute_dtype": "bfloat16",
        "use_amp": False,
        "decoding": {
            "strategy": "greedy_batch",
            "preserve_alignments": False,
            "fused_batch_size": -1,
            "greedy": {
                "use_cuda_graph_decoder": True,
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
        "sample_rate": 16000,
        "batch_size": 1,
        "left_padding_size": 9.6,
        "right_padding_size": 1.6,
        "chunk_size": 0.8,
        "word_boundary_tolerance": 4,
        "request_type": "feature_buffer",
        "stateful": True,
        "padding_mode": "right",
    },
    "matmul_precision": "high",
    "log_level": 30,
    "pipeline_type": "buffered",
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
    p.add_argument("ckpt", help=".nemo checkpoint (EncDecRNNTBPEModel, RNN-T or TDT)")
    p.add_argument("folder", help="folder of audio files (searched recursively)")
    # Left unset, a value comes from the built-in parakeet-tdt-0.6b-v3 config (or --config).
    p.add_argument("--streams", type=int, default=None, help="streams decoded together (streaming.batch_size; 1)")
    p.add_argument("--chunk", type=float, default=None, help="chunk size, s (streaming.chunk_size; 0.8)")
    p.add_argument("--left", type=float, default=None, help="left context, s (streaming.left_padding_size; 9.6)")
    p.add_argument("--right", type=float, default=None, help="right context, s (streaming.right_padding_size; 1.6)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="asr.compute_dtype (bfloat16; NeMo forces float32 on CPU)",
    )
    p.add_argument("--amp", action="store_true", help="asr.use_amp=true (weights float32, autocast to --dtype)")
    p.add_argument("--limit", type=int, default=None, help="use only the first FILES files (by path)")
    p.add_argument("--out", default="nemo_stream_out", help="output folder")
    p.add_argument(
        "--order",
        default="duration",
        choices=["duration", "name"],
        help="feeding order; upstream's asr_streaming_infer.py sorts by duration, shortest first",
    )
    p.add_argument(
        "--warmup-files", type=int, default=None, help="files in the warm-up run (default: min(streams, files))"
    )
    p.add_argument("--warmup-sec", type=float, default=10.0, help="warm-up clips are cut to this length")
    p.add_argument("--runs", type=int, default=1, help="timed runs over the folder (mean and min reported)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="greedy.use_cuda_graph_decoder=false")
    p.add_argument("--stateless", action="store_true", help="streaming.stateful=false")
    p.add_argument(
        "--request-type",
        default=None,
        choices=["feature_buffer", "frame"],
        help="streaming.request_type (feature_buffer)",
    )
    p.add_argument("--padding-mode", default=None, choices=["right", "left"], help="streaming.padding_mode (right)")
    p.add_argument(
        "--matmul-precision",
        default=None,
        choices=["highest", "high", "medium"],
        help="torch float32 matmul precision (high = TF32)",
    )
    p.add_argument(
        "--config",
        default=None,
        help="optional upstream YAML (e.g. parakeet_tdt_0.6b_v3.yaml) merged over the built-in "
        "config before the command-line values",
    )
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="also time encoder and decoder calls (adds a device sync after each encoder call)",
    )
    p.add_argument(
        "--offline",
        action="store_true",
        help="also run model.transcribe() on the same audio and compare with the streamed text",
    )
    p.add_argument("--offline-batch", type=int, default=32, help="batch size for --offline transcribe()")
    p.add_argument("--offline-workers", type=int, default=4, help="DataLoader workers for --offline")
    p.add_argument("--log-level", type=int, default=30, help="NeMo log level (20 = INFO)")
    return p.parse_args(argv)


def list_audio(folder: str, limit: int | None) -> list[str]:
    paths = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.lower().endswith(AUDIO_EXTS):
                paths.append(os.path.join(root, name))
    if limit is not None:
        paths = paths[:limit]
    return paths


def file_keys(paths: list[str], folder: str) -> list[str]:
    base = [os.path.basename(p) for p in paths]
    if len(set(base)) == len(base):
        return base
    return [os.path.relpath(p, folder) for p in paths]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def word_errors(ref: str, hyp: str) -> tuple[int, int]:
    r, h = ref.split(), hyp.split()
    prev = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        cur = [i] + [0] * len(h)
        for j in range(1, len(h) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r[i - 1] != h[j - 1]))
        prev = cur
    return prev[len(h)], len(r)


def build_cfg(args, device: str, device_id: int):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(BASE_CFG)
    if args.config:
        cfg = OmegaConf.merge(cfg, OmegaConf.load(args.config))
    cfg.asr.model_name = os.path.abspath(args.ckpt)
    cfg.asr.device = device
    cfg.asr.device_id = device_id
    cfg.asr.decoding.strategy = "greedy_batch"
    overrides = {
        ("asr", "compute_dtype"): args.dtype,
        ("asr", "use_amp"): True if args.amp else None,
        ("streaming", "batch_size"): args.streams,
        ("streaming", "chunk_size"): args.chunk,
        ("streaming", "left_padding_size"): args.left,
        ("streaming", "right_padding_size"): args.right,
        ("streaming", "stateful"): False if args.stateless else None,
        ("streaming", "request_type"): args.request_type,
        ("streaming", "padding_mode"): args.padding_mode,
    }
    for (sec, key), val in overrides.items():
        if val is not None:
            cfg[sec][key] = val
    if args.no_cuda_graphs:
        cfg.asr.decoding.greedy.use_cuda_graph_decoder = False
    if args.matmul_precision is not None:
        cfg.matmul_precision = args.matmul_precision
    cfg.log_level = args.log_level
    cfg.pipeline_type = "buffered"
    cfg.asr_decoding_type = "rnnt"
    cfg.enable_itn = False
    cfg.enable_nmt = False
    return cfg


class _TimedRequests:
    """Wraps NeMo's ContinuousBatchedRequestStreamer: times each next() (framing + feature extraction)."""

    def __init__(self, inner, stats, sync):
        self._inner, self._stats, self._sync = inner, stats, sync

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        try:
            reqs = next(self._inner)
        finally:
            self._sync()
        self._stats["fetch"].append(time.perf_counter() - t0)
        return reqs

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _TimedCallable:
    """Stands in for the pipeline's decoding computer (or encoder), timing each call."""

    def __init__(self, inner, bucket, sync):
        self._inner, self._bucket, self._sync = inner, bucket, sync

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        out = self._inner(*a, **k)
        self._sync()
        self._bucket.append(time.perf_counter() - t0)
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


def main(argv=None) -> int:
    args = parse_args(argv)

    import nemo
    import torch
    from nemo.collections.asr.inference.factory.pipeline_builder import PipelineBuilder
    from nemo.collections.asr.inference.streaming.framing.request_options import ASRRequestOptions
    from nemo.collections.asr.inference.streaming.state.state import StreamingState
    from nemo.collections.asr.inference.utils.audio_io import read_audio

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    device_type, _, dev_idx = device.partition(":")
    device_id = int(dev_idx) if dev_idx else 0

    paths = list_audio(args.folder, args.limit)
    if not paths:
        print(f"no audio files ({', '.join(AUDIO_EXTS)}) under {args.folder}", file=sys.stderr)
        return 2
    keys = file_keys(paths, args.folder)

    cfg = build_cfg(args, device_type, device_id)
    sr = int(cfg.streaming.sample_rate)

    t_build = time.perf_counter()
    pipeline = PipelineBuilder.build_pipeline(cfg)
    build_s = time.perf_counter() - t_build
    dev = pipeline.device

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    # Token ids: NeMo's streaming state only grows its token list in StreamingState._update_state
    # (cleared at each end of utterance), so record what each call appends, per state.
    orig_update_state = StreamingState._update_state

    def _update_state(self, output, skip):
        n0 = len(self.tokens)
        orig_update_state(self, output, skip)
        self.__dict__.setdefault("_bench_token_ids", []).extend(int(t) for t in self.tokens[n0:])

    StreamingState._update_state = _update_state
    captured_ids: dict[int, list[int]] = {}
    orig_delete_state = pipeline.delete_state

    def delete_state(stream_id):
        st = pipeline.get_state(stream_id)
        if st is not None:
            captured_ids[stream_id] = list(st.__dict__.get("_bench_token_ids", []))
        orig_delete_state(stream_id)

    pipeline.delete_state = delete_state

    # Per-step timing: one step = one batch of requests (one chunk of each active stream).
    stats = {"fetch": [], "step": [], "batch": [], "enc": [], "dec": []}
    orig_get_gen = pipeline.get_request_generator
    pipeline.get_request_generator = lambda: _TimedRequests(orig_get_gen(), stats, sync)
    orig_transcribe_step = pipeline.transcribe_step

    def transcribe_step(requests):
        t0 = time.perf_counter()
        out = orig_transcribe_step(requests)
        sync()
        stats["step"].append(time.perf_counter() - t0)
        stats["batch"].append(len(requests))
        return out

    pipeline.transcribe_step = transcribe_step
    if args.breakdown:
        pipeline.asr_model.encode = _TimedCallable(pipeline.asr_model.encode, stats["enc"], sync)
        if pipeline.decoding_computer is not None:  # stateful: the label-looping computer, called directly
            pipeline.decoding_computer = _TimedCallable(pipeline.decoding_computer, stats["dec"], sync)
        else:  # stateless: the model's rnnt_decoder_predictions_tensor through the wrapper
            pipeline.asr_model.decode = _TimedCallable(pipeline.asr_model.decode, stats["dec"], sync)

    # Read all audio up front with NeMo's own reader (librosa, resampled to 16 kHz mono).
    t_load = time.perf_counter()
    audio = [read_audio(p, target_sr=sr, mono=True) for p in paths]
    load_s = time.perf_counter() - t_load
    durations = [len(a) / sr for a in audio]
    order = list(range(len(paths)))
    if args.order == "duration":
        order.sort(key=lambda i: durations[i])

    def run_pipeline(samples: list):
        for k in stats:
            stats[k].clear()
        captured_ids.clear()
        options = [ASRRequestOptions() for _ in samples]
        sync()
        t0 = time.perf_counter()
        out = pipeline.run(samples, options=options)
        sync()
        return out, time.perf_counter() - t0

    # Warm-up: enough streams to fill the batch (CUDA graphs are captured for the largest batch),
    # clips cut to --warmup-sec.
    n_streams = int(cfg.streaming.batch_size)
    n_warm = args.warmup_files if args.warmup_files is not None else min(n_streams, len(paths))
    warm_s = 0.0
    if n_warm > 0:
        cut = int(args.warmup_sec * sr)
        warm = [audio[order[i % len(order)]][:cut].clone() for i in range(n_warm)]
        _, warm_s = run_pipeline(warm)

    samples = [audio[i] for i in order]
    walls = []
    for _ in range(max(1, args.runs)):
        output, wall = run_pipeline(samples)
        walls.append(wall)

    audio_s = sum(durations)
    wall = statistics.mean(walls)
    transcripts = {}
    ids_consistent = 0
    tok = pipeline.tokenizer
    for sid, i in enumerate(order):
        text = output.get(sid, {}).get("text", "")
        ids = captured_ids.get(sid, [])
        transcripts[keys[i]] = {"text": text, "token_ids": ids, "duration_s": round(durations[i], 3)}
        try:
            if " ".join(tok.ids_to_text(ids).split()) == " ".join(text.split()):
                ids_consistent += 1
        except Exception:
            pass

    steps = stats["step"]
    iters = [a + b for a, b in zip(stats["fetch"], stats["step"])]

    def ms(xs):
        return round(1000 * statistics.mean(xs), 3) if xs else None

    def p95(xs):
        return round(1000 * pct(xs, 95), 3) if xs else None

    dc = pipeline.decoding_computer
    dc = getattr(dc, "_inner", dc)
    graphs_mode = getattr(dc, "cuda_graphs_mode", None) if dc is not None else None
    pre_cfg = pipeline.preprocessor_config
    result = {
        "mode": "nemo_buffered_stream",
        "files": len(paths),
        "audio_s": round(audio_s, 3),
        "wall_s": round(wall, 4),
        "wall_s_runs": [round(w, 4) for w in walls],
        "rtfx": round(audio_s / wall, 2) if wall > 0 else None,
        "rtfx_best": round(audio_s / min(walls), 2) if min(walls) > 0 else None,
        "streams": n_streams,
        "batch_mean": round(statistics.mean(stats["batch"]), 2) if stats["batch"] else None,
        "batch_max": max(stats["batch"]) if stats["batch"] else None,
        "steps": len(steps),
        # step = pipeline.transcribe_step (encoder + decoder + text bookkeeping) for one batch of chunks;
        # iter = step + NeMo's request streamer next() (audio buffering + log-mel features on device)
        "step_ms_mean": ms(steps),
        "step_ms_p95": p95(steps),
        "iter_ms_mean": ms(iters),
        "iter_ms_p95": p95(iters),
        "warmup_files": n_warm,
        "warmup_s": round(warm_s, 3),
        "load_audio_s": round(load_s, 3),
        "build_s": round(build_s, 3),
        "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
        "dtype": str(pipeline.asr_model.cast_dtype).replace("torch.", ""),
        "compute_dtype": str(pipeline.asr_model.compute_dtype).replace("torch.", ""),
        "use_amp": pipeline.asr_model.use_amp,
        "decoder": type(dc).__name__ if dc is not None else None,
        "cuda_graphs": (str(graphs_mode) if graphs_mode is not None else "off") if dev.type == "cuda" else "n/a (cpu)",
        # files whose token ids detokenize to exactly the pipeline's text (NeMo's word grouping can drop
        # stray punctuation tokens, so a mismatch is not necessarily an error)
        "ids_detok_equals_text": f"{ids_consistent}/{len(paths)}",
        "config": {
            "chunk_s": float(cfg.streaming.chunk_size),
            "left_s": float(cfg.streaming.left_padding_size),
            "right_s": float(cfg.streaming.right_padding_size),
            # after NeMo rounds the sizes to whole encoder frames (stateful mode)
            "effective_chunk_s": round(pipeline.chunk_size, 4),
            "effective_left_s": round(pipeline.left_padding_size, 4),
            "effective_right_s": round(pipeline.right_padding_size, 4),
            "buffer_s": round(pipeline.buffer_size_in_secs, 4),
            "model_stride_s": pipeline.model_stride_in_secs,
            "request_type": str(cfg.streaming.request_type),
            "stateful": bool(cfg.streaming.stateful),
            "padding_mode": str(cfg.streaming.padding_mode),
            "strategy": str(cfg.asr.decoding.strategy),
            "use_cuda_graph_decoder": bool(cfg.asr.decoding.greedy.use_cuda_graph_decoder),
            "max_symbols": int(cfg.asr.decoding.greedy.max_symbols),
            "matmul_precision": str(cfg.matmul_precision),
            "order": args.order,
            "preprocessor": {
                "dither": float(pre_cfg.get("dither", 0.0)),
                "pad_to": int(pre_cfg.get("pad_to", 0)),
                "normalize": str(pre_cfg.get("normalize")),
                "per_buffer_normalize": "per_feature (pipeline)",
            },
        },
        "nemo": getattr(nemo, "__version__", None),
        "torch": torch.__version__,
    }
    if args.breakdown:
        result.update(
            {
                "enc_ms_mean": ms(stats["enc"]),
                "enc_ms_p95": p95(stats["enc"]),
                "enc_calls": len(stats["enc"]),
                "dec_ms_mean": ms(stats["dec"]),
                "dec_ms_p95": p95(stats["dec"]),
                "dec_calls": len(stats["dec"]),
                "enc_s_total": round(sum(stats["enc"]), 4),
                "dec_s_total": round(sum(stats["dec"]), 4),
            }
        )

    if args.offline:
        result["offline"] = run_offline(args, pipeline, paths, durations, order, keys, transcripts, sync)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "transcripts.json"), "w") as f:
        json.dump(transcripts, f, ensure_ascii=False, indent=1)
    detail = dict(
        result,
        per_step={
            "batch": stats["batch"],
            "step_ms": [round(1000 * x, 3) for x in steps],
            "fetch_ms": [round(1000 * x, 3) for x in stats["fetch"]],
        },
    )
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump(detail, f, ensure_ascii=False)
    StreamingState._update_state = orig_update_state
    print(json.dumps(result, ensure_ascii=False), flush=True)
    return 0


def run_offline(args, pipeline, paths, durations, order, keys, transcripts, sync) -> dict:
    """model.transcribe() over the same files, same model object and decoding config.

    Files are passed by path (NeMo's ordinary file transcription): its in-memory tensor path pads clips
    shorter than 1 s to 1 s, which file transcription does not."""
    import torch

    model = pipeline.asr_model.asr_model
    feat = model.preprocessor.featurizer
    feat.dither = 0.0
    feat.pad_to = 0
    # The wrapper cast the whole model (preprocessor buffers included) to the compute dtype; give the
    # mel filterbank and window back their float32 values so features match the streaming path, which
    # builds its own float32 preprocessor. Features are still handed to the encoder in the model dtype.
    for name in ("window", "fb"):
        buf = getattr(feat, name, None)
        if isinstance(buf, torch.Tensor) and buf.is_floating_point() and buf.dtype != torch.float32:
            fresh = getattr(pipeline.preprocessor.featurizer, name, None)
            setattr(feat, name, (fresh if fresh is not None else buf).detach().to(buf.device, torch.float32))
    model.eval()
    files = [paths[i] for i in order]

    def transcribe(xs):
        amp = torch.amp.autocast(
            device_type=pipeline.asr_model.device_str.split(":")[0],
            dtype=pipeline.asr_model.compute_dtype,
            enabled=pipeline.asr_model.use_amp,
        )
        with amp, torch.inference_mode():
            hyps = model.transcribe(
                xs,
                batch_size=args.offline_batch,
                return_hypotheses=True,
                verbose=False,
                num_workers=args.offline_workers,
            )
        if isinstance(hyps, tuple):
            hyps = hyps[0]
        return hyps

    transcribe(files[-min(len(files), args.offline_batch) :])  # warm-up on the longest batch
    sync()
    t0 = time.perf_counter()
    hyps = transcribe(files)
    sync()
    wall = time.perf_counter() - t0

    errs = words = exact = same_ids = 0
    for h, i in zip(hyps, order):
        text = h.text if hasattr(h, "text") else str(h)
        ids = (
            h.y_sequence.tolist()
            if hasattr(h, "y_sequence") and torch.is_tensor(h.y_sequence)
            else list(getattr(h, "y_sequence", []) or [])
        )
        entry = transcripts[keys[i]]
        entry["offline_text"] = text
        entry["offline_token_ids"] = [int(x) for x in ids]
        e, nw = word_errors(text, entry["text"])
        errs += e
        words += nw
        exact += int(" ".join(text.split()) == " ".join(entry["text"].split()))
        same_ids += int(entry["offline_token_ids"] == entry["token_ids"])
    audio_s = sum(durations)
    n = len(files)
    return {
        "wall_s": round(wall, 4),
        "rtfx": round(audio_s / wall, 2) if wall > 0 else None,
        "batch": args.offline_batch,
        "workers": args.offline_workers,
        "text_exact_match": f"{exact}/{n}",
        "token_ids_exact_match": f"{same_ids}/{n}",
        "stream_vs_offline_wer": round(errs / words, 4) if words else 0.0,
        "offline_words": words,
    }


if __name__ == "__main__":
    sys.exit(main())
