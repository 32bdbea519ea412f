"""`transcribe serve` with the model's work replaced by an instant answer ("x"): what the HTTP workers, the engine's
intake and a load test's clients manage alone, on this machine. The model still loads (the engine needs its sample
rate and batch sizes); nothing runs on it after the warm-up.

    python scripts/experiments/serve_without_model.py -m v3.nemo --port 8001 [serve's options]
"""

from __future__ import annotations

import sys

import graphscribe.serve.service
from graphscribe.output.transcript import Transcript
from graphscribe.serve.server import serve_app


def instant(model, batches, *args, **kwargs):
    for batch in batches:
        for index, source in zip(batch.indices, batch.sources):
            yield index, Transcript(source=source, text="x", audio_seconds=float(batch.lengths[0]) / 16000)
        batches.recycle(batch)


if __name__ == "__main__":  # the HTTP workers import this module again (spawned): only the engine serves
    graphscribe.serve.service.transcribe_stream = instant
    serve_app(sys.argv[1:])
