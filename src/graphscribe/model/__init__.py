"""The math: features, encoder, transducer heads, decoding, and the kernels and graphs beside them."""

import importlib
import threading

# Triton's package imports its own modules in a circle: two threads importing it at once (the CLI's priming thread
# and a batch's first kernels) can find it half made ("partially initialized module 'triton.runtime.cache'"), and a
# kernel module that fails to import stays off for the process. Every import of Triton here takes this lock.
TRITON_IMPORT = threading.RLock()  # re-entrant: a kernel module may import another through it


def import_kernels(name: str):
    """`graphscribe.model.<name>`, a module of Triton kernels, imported under `TRITON_IMPORT` (ImportError as ever)."""
    with TRITON_IMPORT:
        return importlib.import_module(f"graphscribe.model.{name}")
