"""Patches a copy of src (argv[1]) for run39: the encoder's layer graphs keep 4 GiB of captured shapes'
static buffers instead of LayerGraphs.KEEP_BYTES's 1 GiB (do warm passes stop capturing?)."""

import sys

p = sys.argv[1] + "/graphscribe/graphs.py"
s = open(p).read()
old = "    KEEP_BYTES = 1 << 30\n"
assert s.count(old) == 1
open(p, "w").write(s.replace(old, "    KEEP_BYTES = 4 << 30\n"))
print("patched", p)
