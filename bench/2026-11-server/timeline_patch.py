"""Patches a copy of src (argv[1]) for run42: a timeline of every batch through `pipeline.transcribe_stream`, written
as JSON to $GRAPHSCRIBE_TIMELINE when the stream ends. Host marks (perf_counter): take0/take1 around the
source's next batch (the server's take and gather), launched (its copy, features and encoder queued), dec_call,
hook0/hook1 (the next batch taken and launched from inside this one's decode), dec_ret, answered (its results
yielded and consumed). GPU marks (CUDA events, on the host's clock through one synchronised base event):
enc0/enc1 around its features and encoder on their stream, dec0/dec1 around its decode on the decode stream."""

import sys

root = sys.argv[1] + "/graphscribe/"
p = root + "pipeline.py"
s = open(p).read()


def swap(old: str, new: str) -> None:
    global s
    assert s.count(old) == 1, old
    s = s.replace(old, new)


swap(
    "\nclass StageClock:",
    """
import json as _json

_TL: list = []
_TL_BASE: list = []


def _tl_event():
    if not _TL_BASE:
        torch.cuda.synchronize()
        base = torch.cuda.Event(enable_timing=True)
        base.record()
        torch.cuda.synchronize()
        _TL_BASE.extend([base, time.perf_counter()])
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _tl_dump() -> None:
    path = os.environ.get("GRAPHSCRIBE_TIMELINE")
    if not path:
        return
    if _TL_BASE:
        torch.cuda.synchronize()
    rows = []
    for row in _TL:
        out = {}
        for key, value in row.items():
            if isinstance(value, torch.cuda.Event):
                value = _TL_BASE[1] + _TL_BASE[0].elapsed_time(value) / 1e3
            out[key] = value
        rows.append(out)
    with open(path, "w") as f:
        _json.dump(rows, f)


class StageClock:""",
)
swap(
    """    window = model.attention_for(samples, batch.sources)  # full, or local for hours of audio
""",
    """    window = model.attention_for(samples, batch.sources)  # full, or local for hours of audio
    cuda = model.device.type == "cuda"
    job.tl = {"rows": len(batch.indices), "samples": int(batch.audio.shape[-1]), "audio": sum(samples)}
    if cuda:
        job.tl["enc0"] = _tl_event()
""",
)
swap(
    """        if model.device.type == "cuda":
            job.ready = torch.cuda.Event()
            job.ready.record()""",
    """        if model.device.type == "cuda":
            job.tl["enc1"] = _tl_event()
            job.ready = torch.cuda.Event()
            job.ready.record()""",
)
swap(
    """    def meanwhile() -> None:
        nonlocal aside
        began = time.perf_counter()""",
    """    tl = getattr(job, "tl", {})
    tl["dec_call"] = start

    def meanwhile() -> None:
        nonlocal aside
        began = time.perf_counter()
        tl["hook0"] = began""",
)
swap(
    """        aside += time.perf_counter() - began
""",
    """        aside += time.perf_counter() - began
        tl["hook1"] = time.perf_counter()
""",
)
swap(
    """        with streams.decoding(job), clock.gpu("decode"):
            job.hyps = model.decode(job.encoded, job.frames, meanwhile if then and streams.decode else None)""",
    """        with streams.decoding(job), clock.gpu("decode"):
            if streams.decode:
                tl["dec0"] = _tl_event()
            job.hyps = model.decode(job.encoded, job.frames, meanwhile if then and streams.decode else None)
            if streams.decode:
                tl["dec1"] = _tl_event()
        tl["dec_ret"] = time.perf_counter()""",
)
swap(
    """    def queue_next() -> _Job | None:  # the next batch, queued up to its encoder; None at the end
        batch = next(source, None)
        return None if batch is None else _start(model, batch, clock)""",
    """    def queue_next() -> _Job | None:  # the next batch, queued up to its encoder; None at the end
        take0 = time.perf_counter()
        batch = next(source, None)
        take1 = time.perf_counter()
        if batch is None:
            return None
        job = _start(model, batch, clock)
        if hasattr(job, "tl"):
            job.tl.update(take0=take0, take1=take1, launched=time.perf_counter())
        return job""",
)
swap(
    """            if not last:
                reads.recycle(encoded.batch)  # decoded, so copied to the GPU long ago""",
    """            if hasattr(encoded, "tl"):
                encoded.tl["answered"] = time.perf_counter()
                _TL.append(encoded.tl)
            if not last:
                reads.recycle(encoded.batch)  # decoded, so copied to the GPU long ago""",
)
swap(
    """    finally:  # also when the caller stops early: reads not started are dropped
        if finisher is not None:""",
    """    finally:  # also when the caller stops early: reads not started are dropped
        _tl_dump()  # the processes leave by os._exit: no atexit
        if finisher is not None:""",
)
open(p, "w").write(s)
print("patched", root)
