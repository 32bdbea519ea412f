"""`transcribe serve` with its one device behind an engine process: the path `--devices` takes with several (HTTP
workers -> the server's process -> the engine's process and back), on one GPU, to weigh that path's cost against
the in-process engine of a one-device server in the same command.

    python scripts/experiments/serve_routed.py -m v3.nemo --dtype bfloat16 --devices cuda:0 --port 8000

Every argument is `transcribe serve`'s; `--devices` names the one device.
"""

from __future__ import annotations

import sys

from graphscribe import cli
from graphscribe.serve import command


class _Routed(list):
    """One device that `serve` counts as several (`len(names) > 1`), so that it runs in an engine process; everything
    that lists the devices still finds the one. What counts them counts two: the default HTTP workers (4 a GPU, at
    most one per 4 cores: 4 on a 16-core host either way) and the engine's host threads (half the cores; the GPU's
    engine uses few)."""

    def __len__(self) -> int:
        return max(2, super().__len__())


def main() -> None:
    parse = command.devices_or_exit
    command.devices_or_exit = lambda devices, device: _Routed(parse(devices, device))
    sys.argv[1:1] = ["serve"]
    cli.entry()


if __name__ == "__main__":
    main()
