"""Device names for `--devices` (the folder job's workers, the server's engines): `all` or a comma list, checked
against the CUDA devices this process may use. No torch imported here unless the driver's library is missing."""

from __future__ import annotations

import ctypes
import re

_DEVICE = re.compile(r"cpu|cuda(?::(\d+))?")


def cuda_device_count() -> int:
    """CUDA devices this process may use (CUDA_VISIBLE_DEVICES applies), asked of the driver itself: importing torch
    to ask it would hold the workers back by its ~2 s. Where the driver's library is missing, torch's answer."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0  # no device, or a driver that cannot run: as torch.cuda.is_available() says then
    return count.value


def parse_devices(value: str) -> list[str]:
    """`--devices`: all (every CUDA device) or a comma list of cpu, cuda, cuda:N -> torch device names, such as
    ["cuda:0", "cuda:1"]; cpu may repeat (one worker each). ValueError with one line for a bad value."""
    names = [v.strip().lower() for v in value.split(",")]
    count = cuda_device_count() if any(name != "cpu" for name in names) else 0
    if names == ["all"]:
        if count == 0:
            raise ValueError("--devices all: this machine has no CUDA device (cpu,cpu runs two CPU workers)")
        return [f"cuda:{i}" for i in range(count)]
    devices: list[str] = []
    for name in names:
        match = _DEVICE.fullmatch(name)
        if match is None:
            raise ValueError(f"--devices {value}: {name or 'an empty name'}: use all, or a comma list of cpu, cuda:N")
        if name == "cpu":
            devices.append(name)
            continue
        if count == 0:
            raise ValueError(f"--devices {value}: {name}: CUDA is not available on this machine")
        index = int(match.group(1) or 0)
        if index >= count:
            raise ValueError(f"--devices {value}: {name}: this machine has {count} CUDA device(s)")
        if f"cuda:{index}" in devices:
            raise ValueError(f"--devices {value}: cuda:{index} is listed twice")
        devices.append(f"cuda:{index}")
    return devices
