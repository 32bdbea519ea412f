"""First-use costs paid while the model loads, in threads: CUDA's libraries, Triton's cache key, every kernel.

A process's first transcription on CUDA pays, besides its own work, for loading cuFFT (the features'
STFT), cuDNN (the subsampling convolutions) and cuBLAS, and for Triton hashing its own 400 MB library
to key its kernel cache: about 0.8 s on the lent H100 (bench/h100-session14/). None of it needs the
model, and none of it holds the GIL for long (dlopen, file reads and hashing release it), so the CLI
starts `prime` before loading the checkpoint and the two overlap. Nothing here changes a result: the
libraries are loaded once per process whichever thread loads them first.

Then each kernel's first launch in a process costs more: CUDA loads its module (lazy loading), Triton loads the
fused decode step's kernels from its disk cache. A cold first batch paid 1.3-1.4 s of such first uses on the lent
H100 (bench/h100-session19/), three times the GPU time of the batch. `prime_model` pays them while the weights go
to the GPU: `load_model` starts it once the config is read, and the model waits for it before its first work
(`Model.wait_for_priming`). It runs the model's own code (features, encoder, decoding, text) on silence, with a
one-layer copy of the model of the same shapes and zero weights (zeros: every number finite, decoding bounded).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import torch
import torch.nn.functional as F

PRIMER_THREAD = "graphscribe-prime-model"
PRIMING_SECONDS = 2.0  # of silence a row

log = logging.getLogger(__name__)


def prime(device: str, dtype: str) -> threading.Thread | None:
    """Start loading what a first transcription with `--device device --dtype dtype` needs; None where that is not
    a CUDA device of this machine (the loader reports bad requests, and the CPU has nothing to load)."""
    if device == "cpu" or not torch.cuda.is_available():
        return None
    try:
        target = torch.device("cuda" if device == "auto" else device)
    except RuntimeError:
        return None
    if target.type != "cuda" or (target.index or 0) >= torch.cuda.device_count():
        return None
    half = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype, torch.float32)
    thread = threading.Thread(target=_prime, args=(target, half), name="graphscribe-prime", daemon=True)
    thread.start()
    return thread


def _prime(device: torch.device, dtype: torch.dtype) -> None:
    try:
        x = torch.zeros(1, 1, 16, 16, device=device, dtype=dtype)  # the CUDA context, if the loader has not made it
        F.conv2d(x, torch.zeros(1, 1, 3, 3, device=device, dtype=dtype))  # cuDNN
        torch.mm(x[0, 0], x[0, 0])  # cuBLAS
        torch.stft(torch.zeros(1024, device=device), 512, window=torch.ones(512, device=device),
                   return_complex=True)  # cuFFT
        torch.cuda.synchronize(device)
    except RuntimeError as err:  # a library that fails here fails again, with its message, where it is used
        log.debug("priming CUDA libraries: %s", err)
    try:
        from triton.runtime.cache import triton_key

        triton_key()  # cached for the process: the fused decode step's first launch then skips the hashing
    except (ImportError, OSError) as err:
        log.debug("priming Triton: %s", err)


def prime_model(cfg, tokenizer, device: torch.device, dtype: torch.dtype, rows: int) -> threading.Thread | None:
    """Start running the model's kernels once, on a batch of `rows` rows (the size class a transcription will
    use) of silence, with a zero-weight one-layer model of `cfg`'s shapes; None off CUDA (nothing to load)."""
    if device.type != "cuda":
        return None
    thread = threading.Thread(target=_prime_model, args=(cfg, tokenizer, device, dtype, rows), name=PRIMER_THREAD,
                              daemon=True)
    thread.start()
    return thread


def _prime_model(cfg, tokenizer, device: torch.device, dtype: torch.dtype, rows: int) -> None:
    try:
        run_silence(cfg, tokenizer, device, dtype, rows)
    except Exception as err:  # noqa: BLE001 - priming only saves time: whatever fails here fails again where it is used
        log.debug("priming the model's kernels: %s", err)


def run_silence(cfg, tokenizer, device: torch.device, dtype: torch.dtype, rows: int):
    """A zero-weight one-layer model of `cfg`'s shapes transcribes `rows` rows of silence, through the stages a
    transcription runs (pinned audio, features, encoder, decoding, text); -> the first row's Transcript."""
    from .config import RunOptions
    from .model import _DTYPE_NAMES, Model, empty_transducer  # here: model.py imports this module

    with torch.inference_mode():
        module = empty_transducer(replace(cfg, encoder=replace(cfg.encoder, n_layers=1)), dtype).to_empty(device=device)
        for tensor in [*module.parameters(), *module.buffers()]:
            tensor.zero_()
        model = Model(module, tokenizer, RunOptions(device=str(device), dtype=_DTYPE_NAMES[dtype], graphs=False),
                      "<priming>")
        samples = int(PRIMING_SECONDS * model.sample_rate)
        pin = device.type == "cuda"
        audio = torch.zeros(rows, samples, pin_memory=pin)
        lengths = torch.full((rows,), samples, dtype=torch.long, pin_memory=pin)
        encoded, frames = model.encoder_output(*model.padded_features(audio, lengths))
        transcript = model.finish("<priming>", audio[0], model.decode(encoded, frames)[0], 0.0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return transcript
