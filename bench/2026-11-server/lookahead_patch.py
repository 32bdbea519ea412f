"""Patches a copy of src (argv[1]) for run37: the server's batching thread takes and collates batch k+1 right after
queueing batch k's features and encoder (the GPU busy with them), before it decodes batch k-1, rather than after."""

import sys

root = sys.argv[1] + "/graphscribe/"
p = root + "pipeline.py"
s = open(p).read()
old = """    renderer: RenderPool | None = None,
) -> Iterator[tuple[int, Transcript]]:"""
new = """    renderer: RenderPool | None = None,
    look_ahead: bool = False,
) -> Iterator[tuple[int, Transcript]]:"""
assert s.count(old) == 1
s = s.replace(old, new)
old = """        encoded: _Job | None = None  # queued up to its encoder, not decoded yet
        for batch in reads:
            job = _start(model, batch, clock)  # queued on the GPU: it runs while `encoded` is decoded
            if encoded is not None:"""
new = """        encoded: _Job | None = None  # queued up to its encoder, not decoded yet
        source = iter(reads)
        batch = next(source, None)
        while batch is not None:
            job = _start(model, batch, clock)  # queued on the GPU: it runs while `encoded` is decoded
            following = next(source, None) if look_ahead and batch.indices else _LATER
            if encoded is not None:"""
assert s.count(old) == 1
s = s.replace(old, new)
old = """                finisher.add(failed)
            encoded = job
        if encoded is not None:"""
new = """                finisher.add(failed)
            encoded = job
            batch = next(source, None) if following is _LATER else following
        if encoded is not None:"""
assert s.count(old) == 1
s = s.replace(old, new)
old = "class _Finisher:"
s = s.replace(old, "_LATER = object()\n\n\n" + old, 1)
open(p, "w").write(s)
p = root + "service.py"
s = open(p).read()
old = "transcribe_stream(self.model, _Batches(self, warm_up))"
assert s.count(old) == 1
s = s.replace(old, "transcribe_stream(self.model, _Batches(self, warm_up), look_ahead=True)")
open(p, "w").write(s)
print("patched", root)
