"""Gives every Python thread its name at the OS level (its first 15 bytes), so `top -H`, /proc and
`cpu_probe.py` show "graphscribe-bat" rather than "python3" (Python 3.14 does this itself). Linux only.

    PYTHONPATH=scripts/experiments/thread_names:src transcribe serve ...
"""

import ctypes
import threading

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None

if _prctl is not None:
    _inner = threading.Thread._bootstrap_inner

    def _named(self):
        _prctl(15, self.name.removeprefix("graphscribe-").encode()[:15], 0, 0, 0)  # PR_SET_NAME
        _inner(self)

    threading.Thread._bootstrap_inner = _named
