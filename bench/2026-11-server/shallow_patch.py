"""Patches a copy of src (argv[1]) for run40: the server decodes each batch right after queueing its features and
encoder, and answers it, before it takes the next one (no overlap of batch k's decode with batch k+1's encoder,
but a request is answered one batch cycle after it is taken instead of two). In a closed loop of clients,
throughput is clients over latency: does the shallower pipeline win back what the lost overlap costs?"""

import sys

root = sys.argv[1] + "/graphscribe/"
p = root + "pipeline.py"
s = open(p).read()
old = """    renderer: RenderPool | None = None,
) -> Iterator[tuple[int, Transcript]]:"""
new = """    renderer: RenderPool | None = None,
    shallow: bool = False,
) -> Iterator[tuple[int, Transcript]]:"""
assert s.count(old) == 1
s = s.replace(old, new)
old = """            encoded = job
        if encoded is not None:"""
new = """            encoded = job
            if shallow and job.batch.indices:
                decoded = _decode(model, encoded, clock, streams)
                yield from finisher.drain() if finisher else ()
                yield from _finish(model, decoded, clock, streams, timings, renderer)
                reads.recycle(encoded.batch)
                encoded = None
        if encoded is not None:"""
assert s.count(old) == 1
s = s.replace(old, new)
open(p, "w").write(s)
p = root + "service.py"
s = open(p).read()
old = "transcribe_stream(self.model, _Batches(self, warm_up))"
assert s.count(old) == 1
s = s.replace(old, "transcribe_stream(self.model, _Batches(self, warm_up), shallow=True)")
open(p, "w").write(s)
print("patched", root)
