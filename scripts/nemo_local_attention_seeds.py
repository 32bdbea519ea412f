#!/usr/bin/env python
"""Show that NeMo 3.0.0's `change_attention_model` local attention depends on the random seed (needs NeMo).

    python scripts/nemo_local_attention_seeds.py   # run with a Python that has nemo_toolkit 3.0.0

On a `use_bias: false` checkpoint (tests/fixtures/nemo-tdt-tiny, like every Parakeet TDT model), the
Longformer attention layers that `change_attention_model("rel_pos_local_attn", [8, 8])` builds carry
linear_q/k/v/out biases that the checkpoint does not have, initialised from torch's random generator. The
script builds them under two seeds and prints the biases' size and the encoder outputs' difference, between
the seeds and against `shared/fixtures/nemo-extras-tdt-tiny` (made that way, under an unknown seed).
Output of one run: tests/fixtures/nemo-local-attention/seeds.log.
"""

import json
import logging
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from nemo.collections.asr.models import ASRModel

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "fixtures" / "nemo-extras-tdt-tiny"
CHECKPOINT = ROOT / "tests" / "fixtures" / "nemo-tdt-tiny" / "tdt-tiny.nemo"


def encoder_outputs(seed: int, names: list[str]) -> tuple[dict, dict]:
    model = ASRModel.restore_from(str(CHECKPOINT), map_location="cpu")
    torch.manual_seed(seed)
    model.change_attention_model(self_attention_model="rel_pos_local_attn", att_context_size=[8, 8])
    model.change_subsampling_conv_chunking_factor(1)
    model.eval()  # the new modules are built in training mode
    attn = model.encoder.layers[0].self_attn
    biases = {
        n: round(float(p.abs().max()), 4)
        for n, p in attn.named_parameters()
        if n.startswith("linear_") and n.endswith(".bias")
    }
    outputs = {}
    for name in names:
        audio, _ = sf.read(str(SHARED / name if "/" in name else SHARED / "clips" / name), dtype="float32")
        with torch.inference_mode():
            feats, frames = model.preprocessor(
                input_signal=torch.tensor(audio)[None], length=torch.tensor([len(audio)])
            )
            encoded, _ = model.encoder(audio_signal=feats, length=frames)
        outputs[name] = encoded[0].numpy()
    return biases, outputs


def main() -> None:
    logging.disable(logging.WARNING)
    clips = json.loads((SHARED / "reference.json").read_text())["local_attention"]["clips"]
    names = [clip["file"] for clip in clips]
    shared = np.load(SHARED / "reference.npz")
    runs = {seed: encoder_outputs(seed, names) for seed in (0, 1)}
    for seed, (biases, _) in runs.items():
        print(f"seed {seed}: largest |bias| of layer 0's new attention: {biases}")
    for i, name in enumerate(names):
        a, b = runs[0][1][name], runs[1][1][name]
        line = f"{name}: encoder output, seed 0 vs seed 1: max |diff| {float(np.abs(a - b).max()):.3g}"
        ref = shared[f"clip{i}_encoder_local"] if f"clip{i}_encoder_local" in shared.files else None
        if ref is not None and ref.shape == a.shape:
            line += (
                f"; vs the shared reference: seed 0 {float(np.abs(a - ref).max()):.3g}, "
                f"seed 1 {float(np.abs(b - ref).max()):.3g}"
            )
        print(line)


if __name__ == "__main__":
    main()
