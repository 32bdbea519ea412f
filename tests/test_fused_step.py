"""The fused decode step (Triton kernels) against NeMo's tokens and against the PyTorch step.

Without CUDA the kernels run through Triton's CPU interpreter (conftest sets TRITON_INTERPRET),
slowly, so these tests use short clips; tests/test_gpu.py runs the same step compiled on a GPU.
Expected tokens and frames are NeMo's own (reference.json of each NeMo-made oracle).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import graphscribe as gs
from graphscribe.model.decoding import GreedyDecoder, decode_step, size_class

pytest.importorskip("triton")

FIXTURES = Path(__file__).parent / "fixtures"
CLIPS = FIXTURES / "nemo-tdt-tiny" / "clips"
SHORT = ["short_2s.wav", "quarter_second.wav", "noise_3s.wav"]  # a padded batch of 3 runs in the 4-row class


def _oracle(name: str, checkpoint: str):
    ref = {c["file"]: c for c in json.loads((FIXTURES / name / "reference.json").read_text())["clips"]}
    return gs.load_model(FIXTURES / name / checkpoint, device="cpu", graphs=False), ref


def _decoder(model, fused: bool, window: int | None = None) -> GreedyDecoder:
    return GreedyDecoder(
        model.module.decoder, model.module.joint, model.cfg.decoding, graphs=False, window=window, fused=fused
    )


@pytest.mark.parametrize(
    "name,checkpoint,window",
    [
        ("nemo-tdt-tiny", "tdt-tiny.nemo", None),  # durations 0-4, max_symbols 10
        ("nemo-rnnt-tiny", "rnnt-tiny.nemo", 3),  # plain RNN-T, one LSTM layer, xscaling and biases
        ("nemo-tdt-tiny-80mel", "tdt-tiny-80mel.nemo", 2),  # max_symbols 3
    ],
)
def test_fused_step_gives_nemo_tokens_in_a_padded_batch(name, checkpoint, window):
    model, ref = _oracle(name, checkpoint)
    encoded, lengths = model.encode([model.read(CLIPS / f) for f in SHORT])
    decoder = _decoder(model, fused=True, window=window)
    hyps = decoder.decode(encoded, lengths)
    assert decoder.fused is not False and list(decoder._buffers) == [size_class(len(SHORT))] == [4]
    assert [(h.token_ids, h.frames) for h in hyps] == [(ref[f]["token_ids"], ref[f]["timestamps"]) for f in SHORT]


def test_tall_tiles_give_nemo_tokens():
    """A batch of 64 rows runs in the 64-row tiles of `fused_step.TALL`: a weight tile read once for all its rows."""
    model, ref = _oracle("nemo-tdt-tiny", "tdt-tiny.nemo")
    names = ["quarter_second.wav", "short_2s.wav"] * 32  # short: the interpreter runs every program in turn
    encoded, lengths = model.encode([model.read(CLIPS / f) for f in names])
    decoder = _decoder(model, fused=True)
    hyps = decoder.decode(encoded, lengths)
    assert list(decoder._buffers) == [64] and decoder._fused_step.tiles_for(64).rows == 64
    assert [(h.token_ids, h.frames) for h in hyps] == [(ref[f]["token_ids"], ref[f]["timestamps"]) for f in names]


def test_one_row_gives_nemo_tokens():
    """A clip alone is the one-row size class, whose prediction net runs on the CUDA cores ("fma" products)."""
    model, ref = _oracle("nemo-tdt-tiny", "tdt-tiny.nemo")
    decoder = _decoder(model, fused=True)
    for name in SHORT:
        encoded, lengths = model.encode([model.read(CLIPS / name)])
        (hyp,) = decoder.decode(encoded, lengths)
        assert (hyp.token_ids, hyp.frames) == (ref[name]["token_ids"], ref[name]["timestamps"]), name
    assert list(decoder._buffers) == [1] and decoder._fused_step.tiles_for(1).net == "fma"


@torch.inference_mode()
def test_fused_state_follows_the_pytorch_step():
    """Step by step from the same state: integer state identical, LSTM state and g within float32 rounding."""
    model, _ = _oracle("nemo-tdt-tiny", "tdt-tiny.nemo")
    encoded, lengths = model.encode([model.read(CLIPS / "librispeech_2086-149220-0033.wav")])
    buffers = {}
    for fused in (False, True):
        decoder = _decoder(model, fused=fused)
        step = decoder._step_fn(encoded.device, encoded.dtype)
        assert (step is decode_step) != fused
        buf = decoder._buffers_for(1, encoded.shape[1], encoded.device, encoded.dtype)
        buf.load(decoder.joint.project_encoder(encoded), lengths)
        buf.restart(decoder.start_state(1, encoded.device, encoded.dtype))
        if fused:
            step.start(buf)
        buffers[fused] = (decoder, step, buf)
    for _ in range(12):
        states = []
        for decoder, step, buf in buffers.values():
            step(buf, decoder.prediction, decoder.joint, decoder.blank_id, decoder.cfg.max_symbols)
            states.append(buf)
        ref, fused = states
        for name in ("t", "active", "count", "run", "last_frame", "row_steps", "records"):
            assert torch.equal(getattr(ref, name), getattr(fused, name)), name
        h, c = buffers[True][0]._fused_step.state(fused)  # the fused step alternates two state buffers
        for name, got in (("h", h), ("c", c), ("g", fused.g)):
            torch.testing.assert_close(got, getattr(ref, name), rtol=1e-5, atol=1e-5, msg=name)
    assert int(ref.count[0]) >= 5  # the steps above emitted tokens, so the LSTM path ran


def test_token_slots_grow_in_the_middle_of_a_decode(monkeypatch):
    """Buffers as small as the input (one token slot a frame): these clips emit more tokens than frames."""
    import graphscribe.model.decoding

    monkeypatch.setattr(graphscribe.model.decoding, "frame_capacity", lambda frames: frames)
    model, ref = _oracle("nemo-tdt-tiny", "tdt-tiny.nemo")
    names = ["silence_1s.wav", "quarter_second.wav"]  # 13 frames, 17 tokens; 4 frames, 12 tokens
    encoded, lengths = model.encode([model.read(CLIPS / f) for f in names])
    decoder = _decoder(model, fused=True)
    hyps = decoder.decode(encoded, lengths)
    assert decoder._buffers[2].max_tokens > encoded.shape[1] + 1  # grown
    assert [(h.token_ids, h.frames) for h in hyps] == [(ref[f]["token_ids"], ref[f]["timestamps"]) for f in names]


def test_tensor_core_path_float16():
    """16-bit weights take the tl.dot path; on this decisive oracle the tokens stay NeMo's."""
    from graphscribe.model.fused_step import FusedStep

    model, ref = _oracle("nemo-tdt-tiny", "tdt-tiny.nemo")
    encoded, lengths = model.encode([model.read(CLIPS / f) for f in SHORT])
    decoder = _decoder(model, fused=True)
    decoder._fused_step = FusedStep(decoder.prediction, decoder.joint, torch.float16, model.cfg.decoding.durations)
    assert not decoder._fused_step.tiles.fp32
    hyps = decoder.decode(encoded, lengths)
    assert [(h.token_ids, h.frames) for h in hyps] == [(ref[f]["token_ids"], ref[f]["timestamps"]) for f in SHORT]


def test_kernels_compile_for_hopper():
    """The interpreter does not apply all of Triton's compile-time rules: compile for sm_90 for real (no GPU needed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("compile_kernels.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize(
    "n,expected", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (100, 128), (128, 128), (129, 192), (200, 256)]
)
def test_size_classes(n, expected):
    assert size_class(n) == expected
