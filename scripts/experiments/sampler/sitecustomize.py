"""A stack sampler for any Python process started with this folder on PYTHONPATH and GRAPHSCRIBE_SAMPLE_DIR set:
every millisecond a thread of its own notes each thread's innermost frames; every 2 s the counts, most first per
thread, are written to DIR/samples-PID.txt (the server exits through os._exit, so nothing waits for exit).
Where py-spy cannot attach (the lent GPU machine allows no ptrace). GRAPHSCRIBE_SWITCH_INTERVAL=S sets the
interpreter's switch interval (how long a thread holding the GIL keeps it from one that waits). A thread waiting for the GIL shows where it
will run next; one in C code that released it (a CUDA synchronisation, a pipe read) shows the call.

    GRAPHSCRIBE_SAMPLE_DIR=/tmp/samples PYTHONPATH=scripts/experiments/sampler:src transcribe serve -m v3.nemo
"""

import os

if os.environ.get("GRAPHSCRIBE_SAMPLE_DIR"):
    import collections
    import sys
    import threading
    import time

    def _sample(folder: str) -> None:
        counts: collections.Counter = collections.Counter()
        me = threading.get_ident()
        path = os.path.join(folder, f"samples-{os.getpid()}.txt")
        last = time.monotonic()
        while True:
            time.sleep(0.001)
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                where = []
                while frame is not None and len(where) < 4:
                    code = frame.f_code
                    where.append(f"{os.path.basename(code.co_filename)}:{code.co_name}:{frame.f_lineno}")
                    frame = frame.f_back
                counts[(names.get(ident, str(ident)), " < ".join(where))] += 1
            if time.monotonic() - last > 2.0:
                last = time.monotonic()
                by_thread: dict = collections.defaultdict(list)
                for (thread, where), n in counts.most_common():
                    by_thread[thread].append((n, where))
                with open(path + ".tmp", "w") as f:
                    for thread, rows in sorted(by_thread.items(), key=lambda kv: -sum(n for n, _ in kv[1])):
                        total = sum(n for n, _ in rows)
                        f.write(f"== {thread}: {total} samples\n")
                        for n, where in rows[:12]:
                            f.write(f"  {100 * n / total:5.1f}%  {where}\n")
                os.replace(path + ".tmp", path)

    os.makedirs(os.environ["GRAPHSCRIBE_SAMPLE_DIR"], exist_ok=True)
    threading.Thread(target=_sample, args=(os.environ["GRAPHSCRIBE_SAMPLE_DIR"],), name="sampler", daemon=True).start()

if os.environ.get("GRAPHSCRIBE_SWITCH_INTERVAL"):  # seconds: how long a thread holds the GIL while others wait
    import sys

    sys.setswitchinterval(float(os.environ["GRAPHSCRIBE_SWITCH_INTERVAL"]))
