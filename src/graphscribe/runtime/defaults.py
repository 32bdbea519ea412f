"""The device's defaults for a run: inputs and padded seconds per batch, host threads, reader threads, padding."""

from __future__ import annotations

import os

import torch

from graphscribe.io.config import CPU_BATCH_SECONDS, SECONDS_PER_GIB, default_batch_files

# Reader threads at most: FLAC decodes at thousands of times real time per thread, and every reader's Python takes
# the GIL from the main thread, which launches the GPU's work: with 8 readers, or 16, a folder takes longer than
# with 4 (about 15% in bfloat16 at batch 128 on an H100).
MAX_READERS = 4


# Torch's intra-op threads in a process whose model is on a GPU: the host side only copies and resamples, and
# one thread per core spins against the readers and the thread that feeds the GPU (two such processes on one host
# run a float32 folder 3x slower; with 4 threads a bfloat16 folder runs about 10% faster and loads in half the
# time).
GPU_HOST_THREADS = 4


# On CUDA, in 16 bits, a batch's padded length is rounded up to a multiple of PAD_SECONDS (1.28 s is 16 encoder
# frames), so batches of nearby lengths share one shape (cuDNN makes a plan, the encoder's layer graphs a capture,
# per new shape), and one clip at a time in a long-lived process reuses shapes too. Padded frames are masked, so
# they change a result only through rounding: not in float32, whose results are NeMo's own products on NeMo's
# shapes (the GPU tests' tiny model would give other tokens than NeMo). In bfloat16 at batch 128 a folder runs
# about 5% faster for it.
PAD_SECONDS = 1.28


def default_batching(device: torch.device, dtype: torch.dtype | None = None) -> tuple[int, float]:
    """Files and padded seconds per batch when not given: wide on CUDA (capped by its memory; fewer files in
    float32, dtype None), small on the CPU."""
    files = default_batch_files(device.type, dtype is not None and dtype.itemsize == 2)
    if device.type == "cuda":
        gib = torch.cuda.get_device_properties(device).total_memory / 2**30
        return files, round(SECONDS_PER_GIB * gib)
    return files, CPU_BATCH_SECONDS


def limit_host_threads(device: str, share: int | None = None) -> None:
    """torch's CPU threads in a process of ours, unless the user chose a number (OMP_NUM_THREADS, which torch
    follows): at most `share` (a device worker's part of the host's cores; None: torch's own count), and where the
    model goes to a GPU (`device` auto or cuda, with CUDA present) at most GPU_HOST_THREADS. The CLI's process and
    every `--devices` worker call it, before loading (placing the weights uses them too)."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    threads = torch.get_num_threads() if share is None else share
    if device != "cpu" and torch.cuda.is_available():
        threads = min(GPU_HOST_THREADS, threads)
    torch.set_num_threads(max(1, threads))


def pad_samples(device: torch.device, dtype: torch.dtype | None, sample_rate: int) -> int:
    """`collate`'s pad_to for a model on `device` in `dtype` (None: float32): PAD_SECONDS on CUDA in 16 bits, else 0."""
    pad = device.type == "cuda" and dtype is not None and dtype.itemsize == 2
    return round(PAD_SECONDS * sample_rate) if pad else 0


def default_workers(device: torch.device) -> int:
    """Reader threads: up to MAX_READERS beside a GPU; 2 on the CPU, where the model wants the cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_READERS, cores)) if device.type == "cuda" else 2
