#!/usr/bin/env python
"""NeMo-made oracles for local attention (rel_pos_local_attn), for tests/fixtures/nemo-local-attention (dev script).

Runs ONLY where NeMo 3.0.0 is importable (not the project's venv), CPU, float32, e.g.

    python scripts/make_nemo_local_fixtures.py --out tests/fixtures/nemo-local-attention

Why not only `shared/fixtures/nemo-extras-*`: those were made with NeMo 3.0.0's
`change_attention_model("rel_pos_local_attn", [W, W])`, which builds the new attention layers
without passing the checkpoint's `use_bias` (conformer_encoder.py, NeMo 3.0.0; fixed later
upstream), so on a `use_bias: false` checkpoint (every Parakeet TDT model, and both fixture
checkpoints) linear_q/k/v/out get freshly initialised *random* biases. Their numbers depend on the
random state of the process that made them and no implementation can reproduce them.

Here NeMo builds the local-attention encoder the way it does for a checkpoint whose config says
so: `restore_from(..., override_config_path=...)` with `encoder.self_attention_model:
rel_pos_local_attn` and `encoder.att_context_size: [L, R]`, so that ConformerLayer constructs
RelPositionMultiHeadAttentionLongformer with the checkpoint's use_bias and the weights load
strictly. That is also what `change_attention_model` computes once it passes use_bias. Windows
include L != R (NeMo's Longformer adds the positional term at column offsets that are only right
for L == R) and windows longer than the shortest clips.

Per model and window: token ids and frames per clip (greedy_batch, label looping, max_symbols
from the checkpoint), the padded batch of all clips, encoder frames, and (for the windows listed
in ENCODER_ARRAYS) the encoder output of each clip in reference.npz.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
import yaml
from omegaconf import OmegaConf

logging.getLogger("nemo_logger").setLevel(logging.ERROR)

from nemo.collections.asr.models import EncDecRNNTBPEModel  # noqa: E402
from nemo.utils import logging as nemo_logging  # noqa: E402

nemo_logging.setLevel(logging.ERROR)

ROOT = Path(__file__).resolve().parent.parent
TINY_CLIPS = ["librispeech_2086-149220-0033.wav", "espeak_fox.wav", "short_2s.wav", "quarter_second.wav"]
MODELS = {
    "tdt-tiny": dict(
        checkpoint=ROOT / "tests/fixtures/nemo-tdt-tiny/tdt-tiny.nemo",
        clips=[ROOT / "tests/fixtures/nemo-tdt-tiny/clips" / c for c in TINY_CLIPS]
        + [ROOT / "tests/fixtures/nemo-timestamps/clips/long_mix_62s.flac"],
        windows=[[8, 8], [5, 11], [12, 3], [0, 6]],
    ),
    "demo": dict(
        checkpoint=ROOT / "src/graphscribe/data/demo.nemo",
        clips=[ROOT / f"tests/fixtures/nemo-timestamps/clips/demo{i}.flac" for i in range(4)]
        + [ROOT / "tests/fixtures/nemo-timestamps/clips/long_mix_62s.flac"],
        windows=[[32, 32], [20, 45]],
    ),
}
ENCODER_ARRAYS = {("tdt-tiny", (8, 8)), ("tdt-tiny", (5, 11)), ("tdt-tiny", (12, 3)), ("demo", (32, 32))}


def local_model(checkpoint: Path, window: list[int]) -> EncDecRNNTBPEModel:
    with tarfile.open(checkpoint) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model_config.yaml"))
        config = yaml.safe_load(tar.extractfile(member))
    config["encoder"]["self_attention_model"] = "rel_pos_local_attn"
    config["encoder"]["att_context_size"] = list(window)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(config, f)
    model = EncDecRNNTBPEModel.restore_from(str(checkpoint), map_location="cpu", override_config_path=f.name)
    model.eval()
    layer = model.encoder.layers[0].self_attn
    assert type(layer).__name__ == "RelPositionMultiHeadAttentionLongformer", type(layer)
    assert (layer.linear_q.bias is not None) == bool(config["encoder"].get("use_bias", True))
    dcfg = copy.deepcopy(model.cfg.decoding)
    OmegaConf.set_struct(dcfg, False)
    dcfg.strategy = "greedy_batch"
    dcfg.greedy.loop_labels = True
    dcfg.greedy.use_cuda_graph_decoder = False
    model.change_decoding_strategy(dcfg, verbose=False)
    return model


@torch.inference_mode()
def encode(model, signals):
    lengths = torch.tensor([len(s) for s in signals])
    batch = torch.zeros(len(signals), int(lengths.max()))
    for i, s in enumerate(signals):
        batch[i, : len(s)] = torch.from_numpy(s)
    features, feature_lengths = model.preprocessor(input_signal=batch, length=lengths)
    return model.encoder(audio_signal=features, length=feature_lengths)


@torch.inference_mode()
def decode(model, encoded, lengths):
    hyps = model.decoding.rnnt_decoder_predictions_tensor(
        encoder_output=encoded, encoded_lengths=lengths, return_hypotheses=True
    )
    out = []
    for h in hyps:
        ids = h.y_sequence.tolist() if torch.is_tensor(h.y_sequence) else list(h.y_sequence)
        ts = h.timestamp.get("timestep", []) if isinstance(h.timestamp, dict) else h.timestamp
        out.append(([int(i) for i in ids], [int(t) for t in (ts.tolist() if torch.is_tensor(ts) else ts)]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/nemo-local-attention")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import nemo

    reference = {"nemo_version": nemo.__version__, "torch_version": torch.__version__, "models": {}}
    arrays = {}
    for name, spec in MODELS.items():
        signals = [sf.read(p, dtype="float32")[0] for p in spec["clips"]]
        runs = []
        for window in spec["windows"]:
            model = local_model(spec["checkpoint"], window)
            clips = []
            for i, (path, signal) in enumerate(zip(spec["clips"], signals)):
                encoded, lengths = encode(model, [signal])
                [(ids, frames)] = decode(model, encoded, lengths)
                clips.append(
                    {
                        "file": str(path.relative_to(ROOT / "tests/fixtures")),
                        "samples": len(signal),
                        "encoder_frames": int(lengths[0]),
                        "token_ids": ids,
                        "timestamps": frames,
                    }
                )
                if (name, tuple(window)) in ENCODER_ARRAYS:
                    arrays[f"{name}_{window[0]}_{window[1]}_clip{i}"] = encoded[0, :, : int(lengths[0])].numpy()
            encoded, lengths = encode(model, signals)
            batch = decode(model, encoded, lengths)
            runs.append(
                {
                    "att_context_size": window,
                    "clips": clips,
                    "batch_token_ids": [ids for ids, _ in batch],
                    "batch_timestamps": [ts for _, ts in batch],
                }
            )
            print(
                name,
                window,
                [len(c["token_ids"]) for c in clips],
                "batch == single:",
                [b[0] for b in batch] == [c["token_ids"] for c in clips],
                flush=True,
            )
        reference["models"][name] = {"checkpoint": str(spec["checkpoint"].relative_to(ROOT)), "runs": runs}
    (args.out / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    np.savez_compressed(args.out / "reference.npz", **arrays)


if __name__ == "__main__":
    main()
