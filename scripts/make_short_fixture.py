#!/usr/bin/env python
"""NeMo's results for clips shorter than one encoder frame (dev script; needs NeMo, CPU, float32).

Cuts the fixture's LibriSpeech clip to 1 ... 1280 samples (from sample 16000 on) and records, for each
cut, NeMo's feature frames and encoder frames and `transcribe()`'s tokens, one clip a batch and all in
one batch, into tests/fixtures/nemo-short/reference.json. Run it where NeMo imports:

    /work/nemo-venv/bin/python scripts/make_short_fixture.py
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

import nemo
import soundfile as sf
import torch
from nemo.collections.asr.models import EncDecRNNTBPEModel
from omegaconf import open_dict

logging.disable(logging.WARNING)

ROOT = Path(__file__).resolve().parent.parent
NEMO_PATH = ROOT / "tests/fixtures/nemo-tdt-tiny/tdt-tiny.nemo"
SOURCE = ROOT / "tests/fixtures/nemo-tdt-tiny/clips/librispeech_2086-149220-0033.wav"
OFFSET = 16000  # samples: the cuts start 1 s into the speech
SAMPLES = [1, 2, 100, 159, 160, 161, 319, 320, 479, 480, 500, 800, 1279, 1280]  # 1280: one encoder frame (80 ms)
OUT = ROOT / "tests/fixtures/nemo-short/reference.json"


def main() -> None:
    model = EncDecRNNTBPEModel.restore_from(str(NEMO_PATH), map_location="cpu").eval()
    decoding = model.cfg.decoding
    with open_dict(decoding):
        decoding.strategy = "greedy_batch"
        decoding.greedy.loop_labels = True
        decoding.greedy.use_cuda_graph_decoder = False
    model.change_decoding_strategy(decoding)
    pcm, rate = sf.read(SOURCE, dtype="int16")
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for n in SAMPLES:
            paths.append(f"{tmp}/cut_{n:04d}.wav")
            sf.write(paths[-1], pcm[OFFSET : OFFSET + n], rate, subtype="PCM_16")
        results = {}
        for batch in (1, len(paths)):
            hyps = model.transcribe(paths, batch_size=batch, verbose=False)
            hyps = hyps[0] if isinstance(hyps, tuple) else hyps
            results[batch] = [([int(t) for t in h.y_sequence], h.text) for h in hyps]
        model.eval()  # transcribe() leaves the model in training mode
        clips = []
        for n, path, single, batched in zip(SAMPLES, paths, results[1], results[len(paths)]):
            audio = torch.tensor(sf.read(path, dtype="float32")[0])[None]
            with torch.no_grad():
                features, feature_frames = model.preprocessor(input_signal=audio, length=torch.tensor([n]))
                _, encoder_frames = model.encoder(audio_signal=features, length=feature_frames)
            clips.append(
                {
                    "samples": n,
                    "feature_frames": int(feature_frames),
                    "encoder_frames": int(encoder_frames),
                    "token_ids": single[0],
                    "text": single[1],
                    "batched_agrees": batched == single,
                }
            )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "nemo_version": nemo.__version__,
                "torch_version": torch.__version__,
                "checkpoint": str(NEMO_PATH.relative_to(ROOT)),
                "source": str(SOURCE.relative_to(ROOT)),
                "offset": OFFSET,
                "decoding": "transcribe(), greedy_batch, loop_labels, CPU float32",
                "clips": clips,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
