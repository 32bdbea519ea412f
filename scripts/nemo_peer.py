#!/usr/bin/env python
"""NeMo side of the peer benchmark: time NeMo's own encoder and greedy transducer decoding.

Runs under NeMo (nemo_toolkit 3.0.0). On the GPU machine, with the wheels of .whl and
.whl-nemo carried:

    pip install --no-index --no-deps --target /tmp/nemo-site .whl/*.whl .whl-nemo/*.whl
    PYTHONPATH=/tmp/nemo-site python scripts/nemo_peer.py --model X.nemo \
        --clips a.wav b.wav --batch-sizes 1 8 --reps 5 --device cuda --dtype float32 \
        --json $OUT/nemo_peer.json

Here on CPU (check against the tiny oracle; CUDA graphs need CUDA, so only "nograph"):

    /work/nemo-venv/bin/python scripts/nemo_peer.py \
        --model /work/shared/fixtures/nemo-tdt-tiny/tdt-tiny.nemo \
        --clips /work/shared/fixtures/nemo-tdt-tiny/clips/*.wav \
        --batch-sizes 1 2 --reps 3 --device cpu --modes nograph \
        --check-reference /work/shared/fixtures/nemo-tdt-tiny/reference.json --json /tmp/peer.json

For each (clip, B) it runs the preprocessor + encoder once on B copies of the clip (timed
separately, `encoder_ms` covers preprocessor + encoder), then times
`model.decoding.rnnt_decoder_predictions_tensor(encoder_output=..., encoded_lengths=...)`
for greedy_batch label-looping decoding with use_cuda_graph_decoder true ("cudagraph") and
false ("nograph"): one warm-up call, then --reps timed calls with torch.cuda.synchronize()
around each; median / min / max in ms. Token ids of row 0 and encoder frames are recorded.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import sys
import time
from pathlib import Path

import torch


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def load_wav_16k_mono(path: str) -> torch.Tensor:
    """Read a WAV as float32 mono 16 kHz; convert with torchaudio if needed."""
    try:
        import soundfile as sf

        x, sr = sf.read(path, dtype="float32", always_2d=True)
        wav = torch.from_numpy(x.T.copy())  # [C, N]
    except Exception:  # soundfile missing or unsupported format
        import torchaudio

        wav, sr = torchaudio.load(path)
    if wav.shape[0] > 1:
        wav = wav.mean(0, keepdim=True)
    if sr != 16000:
        import torchaudio

        wav = torchaudio.functional.resample(wav, sr, 16000)
    return wav[0].contiguous().float()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def set_decoding(model, max_symbols, use_cuda_graph):
    from omegaconf import OmegaConf

    dcfg = copy.deepcopy(model.cfg.decoding)
    OmegaConf.set_struct(dcfg, False)
    dcfg.strategy = "greedy_batch"
    if "greedy" not in dcfg or dcfg.greedy is None:
        dcfg.greedy = {}
    if max_symbols is not None:
        dcfg.greedy.max_symbols = max_symbols
    dcfg.greedy.loop_labels = True
    dcfg.greedy.use_cuda_graph_decoder = bool(use_cuda_graph)
    model.change_decoding_strategy(dcfg, verbose=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clips", nargs="+", required=True)
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument(
        "--modes",
        nargs="+",
        default=None,
        choices=["cudagraph", "nograph"],
        help="default: cudagraph and nograph on cuda, nograph on cpu",
    )
    ap.add_argument("--max-symbols", type=int, default=None, help="default: the checkpoint's decoding config")
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--tf32",
        action="store_true",
        help="let cuDNN use TF32 in float32 (PyTorch's default); off by default, as in graphscribe, "
        "so that both compute the same float32 encoder output",
    )
    ap.add_argument(
        "--check-reference",
        default=None,
        help="reference.json of a fixture: compare row-0 token ids of every B and mode",
    )
    args = ap.parse_args()

    logging.getLogger("nemo_logger").setLevel(logging.ERROR)
    import nemo
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from nemo.utils import logging as nemo_logging

    nemo_logging.setLevel(logging.ERROR)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda but CUDA is not available")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if dtype == torch.float32 and not args.tf32:
        torch.backends.cudnn.allow_tf32 = False
    modes = args.modes or (["cudagraph", "nograph"] if device.type == "cuda" else ["nograph"])

    t0 = time.perf_counter()
    model = EncDecRNNTBPEModel.restore_from(args.model, map_location=device)
    model = model.to(device).eval()
    model.preprocessor.featurizer.dither = 0.0
    model.preprocessor.featurizer.pad_to = 0
    if dtype != torch.float32:
        # preprocessor stays float32 (NeMo runs it outside autocast); encoder / decoder / joint cast
        model.encoder.to(dtype)
        model.decoder.to(dtype)
        model.joint.to(dtype)
    load_s = time.perf_counter() - t0
    log(f"loaded {args.model} in {load_s:.2f} s on {device} ({args.dtype}), nemo {nemo.__version__}")

    results = []
    rows = []
    for clip in args.clips:
        wav = load_wav_16k_mono(clip)
        for B in args.batch_sizes:
            sig = wav.unsqueeze(0).repeat(B, 1).to(device)
            lens = torch.full((B,), wav.numel(), dtype=torch.long, device=device)

            def run_encoder():
                with torch.inference_mode():
                    feats, feat_len = model.preprocessor(input_signal=sig, length=lens)
                    enc, enc_len = model.encoder(audio_signal=feats.to(dtype), length=feat_len)
                return enc, enc_len

            run_encoder()  # warm-up
            enc_times = []
            for _ in range(args.reps):
                sync(device)
                t = time.perf_counter()
                enc, enc_len = run_encoder()
                sync(device)
                enc_times.append((time.perf_counter() - t) * 1e3)
            frames = int(enc_len[0])
            for mode in modes:
                set_decoding(model, args.max_symbols, mode == "cudagraph")

                def run_decode():
                    with torch.inference_mode():
                        return model.decoding.rnnt_decoder_predictions_tensor(
                            encoder_output=enc, encoded_lengths=enc_len
                        )

                hyps = run_decode()  # warm-up (and CUDA graph capture)
                times = []
                for _ in range(args.reps):
                    sync(device)
                    t = time.perf_counter()
                    hyps = run_decode()
                    sync(device)
                    times.append((time.perf_counter() - t) * 1e3)
                h = hyps[0]
                ids = h.y_sequence.tolist() if torch.is_tensor(h.y_sequence) else list(h.y_sequence)
                ids = [int(i) for i in ids]
                rec = dict(
                    clip=str(clip),
                    clip_name=Path(clip).name,
                    seconds=wav.numel() / 16000.0,
                    batch=B,
                    mode=mode,
                    encoder_frames=frames,
                    n_tokens=len(ids),
                    token_ids=ids,
                    encoder_ms=dict(median=statistics.median(enc_times), min=min(enc_times), max=max(enc_times)),
                    decode_ms=dict(median=statistics.median(times), min=min(times), max=max(times)),
                    decode_ms_all=times,
                )
                results.append(rec)
                rows.append(
                    f"{Path(clip).name[:28]:28s} {wav.numel() / 16000:7.2f}s B={B:<3d} T={frames:<5d} tok={len(ids):<5d} "
                    f"{mode:9s} enc {rec['encoder_ms']['median']:9.2f} ms  decode {rec['decode_ms']['median']:9.2f} ms "
                    f"(min {rec['decode_ms']['min']:.2f}, max {rec['decode_ms']['max']:.2f})"
                )
                log(rows[-1])

    check = None
    if args.check_reference:
        ref = json.loads(Path(args.check_reference).read_text())
        by_name = {c["file"]: c["token_ids"] for c in ref["clips"]}
        check = []
        for r in results:
            if r["clip_name"] in by_name:
                check.append(
                    dict(
                        clip=r["clip_name"],
                        batch=r["batch"],
                        mode=r["mode"],
                        agrees=r["token_ids"] == by_name[r["clip_name"]],
                    )
                )
        n_ok = sum(c["agrees"] for c in check)
        log(f"reference check: {n_ok}/{len(check)} (clip, B, mode) rows agree with {args.check_reference}")

    print("\n".join(rows))
    out = dict(
        tool="nemo_peer",
        nemo_version=nemo.__version__,
        tf32=bool(torch.backends.cudnn.allow_tf32),
        torch_version=torch.__version__,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        dtype=args.dtype,
        model=args.model,
        reps=args.reps,
        load_s=load_s,
        max_symbols=model.cfg.decoding.greedy.get("max_symbols", None),
        results=results,
        reference_check=check,
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        log(f"wrote {args.json}")
    if check is not None and not all(c["agrees"] for c in check):
        sys.exit(1)


if __name__ == "__main__":
    main()
