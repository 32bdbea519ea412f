"""First-use costs paid while the model loads: CUDA's libraries and Triton's cache key, in a thread.

A process's first transcription on CUDA pays, besides its own work, for loading cuFFT (the features'
STFT), cuDNN (the subsampling convolutions) and cuBLAS, and for Triton hashing its own 400 MB library
to key its kernel cache: about 0.8 s on an H100. None of it needs the
model, and none of it holds the GIL for long (dlopen, file reads and hashing release it), so the CLI
starts `prime` before loading the checkpoint and the two overlap. Nothing here changes a result: the
libraries are loaded once per process whichever thread loads them first.
"""

from __future__ import annotations

import logging
import threading

import torch
import torch.nn.functional as F

from graphscribe.model import TRITON_IMPORT

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
    from graphscribe.model.transducer import (
        resolve_dtype,  # here: model.py's imports are not needed to decide whether to prime
    )

    try:
        half = resolve_dtype(dtype, target)
    except ValueError:
        return None
    thread = threading.Thread(target=_prime, args=(target, half), name="graphscribe-prime", daemon=True)
    thread.start()
    return thread


def _prime(device: torch.device, dtype: torch.dtype) -> None:
    try:
        x = torch.zeros(1, 1, 16, 16, device=device, dtype=dtype)  # the CUDA context, if the loader has not made it
        F.conv2d(x, torch.zeros(1, 1, 3, 3, device=device, dtype=dtype))  # cuDNN
        torch.mm(x[0, 0], x[0, 0])  # cuBLAS
        torch.stft(
            torch.zeros(1024, device=device), 512, window=torch.ones(512, device=device), return_complex=True
        )  # cuFFT
        torch.cuda.synchronize(device)
    except RuntimeError as err:  # a library that fails here fails again, with its message, where it is used
        log.debug("priming CUDA libraries: %s", err)
    try:
        with TRITON_IMPORT:  # not beside a kernel module's import of Triton (`model.import_kernels`)
            from triton.runtime.cache import triton_key

        triton_key()  # cached for the process: the fused decode step's first launch then skips the hashing
    except Exception as err:  # noqa: BLE001 - a head start only: the kernels' own import reports what is wrong
        log.debug("priming Triton: %s", err)
