"""Copy of src with stage times in the access log: read (upload read and parsed), submit (decoded, sent to the
engine), engine (sent -> answer back), answer (-> response sent)."""

import shutil
import sys

src, dst = sys.argv[1], sys.argv[2]
shutil.copytree(src, dst, dirs_exist_ok=True)
p = f"{dst}/graphscribe/http_front.py"
s = open(p).read()
s = s.replace(
    """        settings = self.settings
        form = await read_form(request, settings.max_upload, settings.upload_stall)""",
    """        settings = self.settings
        t0 = time.perf_counter()
        form = await read_form(request, settings.max_upload, settings.upload_stall)
        t1 = time.perf_counter()""",
)
s = s.replace(
    """            transcript, queue_seconds = await future
        finally:""",
    """            t2 = time.perf_counter()
            transcript, queue_seconds = await future
            t3 = time.perf_counter()
            request.scope["probe"] = (t0, t1, t2, t3)
        finally:""",
)
s = s.replace(
    '''            line += f" total {1000 * elapsed:.0f} ms"''',
    '''            line += f" total {1000 * elapsed:.0f} ms"
            probe = scope.get("probe")
            if probe:
                end = start + elapsed
                t0, t1, t2, t3 = probe
                line += f" | pre {1000*(t0-start):.1f} read {1000*(t1-t0):.1f} submit {1000*(t2-t1):.1f} engine {1000*(t3-t2):.1f} answer {1000*(end-t3):.1f}"''',
)
assert s.count("probe") >= 4
open(p, "w").write(s)

p = f"{dst}/graphscribe/server.py"
s = open(p).read()
old = """    service = Service(
        model,
        max_batch,"""
assert old in s
s = s.replace(
    old,
    """    import os as _os, sys as _sys
    if _os.environ.get("PROBE_SWITCH"):
        _sys.setswitchinterval(float(_os.environ["PROBE_SWITCH"]))
"""
    + old,
)
open(p, "w").write(s)
