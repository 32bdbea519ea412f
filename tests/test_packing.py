"""Packed rows (`packing.Packing`): the clips of a batch laid end to end in fewer rows, each clip still getting
NeMo's own encoder output for it alone (reference.npz), in float32 and in bfloat16, eager and through the layer
graphs' bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CLIP_NAMES, NEMO_PATH, reference_clip

import graphscribe as gs
from graphscribe import encoder
from graphscribe.packing import Packing

CPU = torch.device("cpu")


def test_plan_lays_clips_first_fit_longest_first():
    """Rows 16 frames long (10 rounded up to ALIGN), 4 frames between clips; worked out by hand."""
    plan = Packing.plan([10, 3, 3, 2], padded=10, gap=4, device=CPU)
    assert (plan.rows, plan.length) == (2, 16)
    expected = torch.full((2, 16), -1)
    expected[0, :10] = 0  # the longest opens row 0
    expected[1, :3] = 1  # 10 + 4 + 3 > 16: a new row
    expected[1, 7:10] = 2  # after clip 1 and its gap
    expected[0, 14:16] = 3  # 10 + 4 + 2 = 16: fits row 0 exactly
    assert torch.equal(plan.segments, expected)
    x = torch.arange(1.0, 41.0).view(4, 10, 1)  # frame t of clip b holds 10 b + t + 1
    packed = plan.pack(x)
    assert packed[0, 14, 0] == x[3, 0, 0] and packed[1, 9, 0] == x[2, 2, 0]
    assert not packed[plan.segments < 0].any()  # gaps and the rows' ends are zeros
    valid = torch.arange(10)[None, :] < torch.tensor([10, 3, 3, 2])[:, None]
    assert torch.equal(plan.unpack(packed)[..., 0], torch.where(valid, x[..., 0], 0.0))


def test_plan_keeps_rows_when_packing_saves_little():
    assert Packing.plan([10, 9, 8], padded=10, gap=4, device=CPU) is None  # no two clips share a row
    assert Packing.plan([10], padded=10, gap=4, device=CPU) is None
    assert Packing.plan([9, 3], padded=9, gap=4, device=CPU) is None  # one row of 16 for 2 x 9: over 80%
    assert Packing.plan([11, 1], padded=11, gap=4, device=CPU) is not None  # one row of 16 for 2 x 11


def _nemo_features_batch(model, reference_arrays):
    """NeMo's own features of the six clips as one zero-padded batch (the silent clip's features are
    ill-conditioned: ours differ from NeMo's there, test_nemo_parity), and the clips' sample counts."""
    samples = [reference_clip(name)["samples"] for name in CLIP_NAMES]
    nemo = [reference_arrays[f"clip{i}_features"] for i in range(len(CLIP_NAMES))]  # (n_mels, N) each
    features = torch.zeros(len(nemo), nemo[0].shape[0], max(samples) // model.cfg.features.hop_length + 1)
    for i, f in enumerate(nemo):
        features[i, :, : f.shape[1]] = torch.from_numpy(f)
    return features, torch.tensor([f.shape[1] for f in nemo]), samples


def _relative_errors(encoded, reference_arrays) -> list[float]:
    errors = []
    for i, name in enumerate(CLIP_NAMES):
        frames = reference_clip(name)["encoder_frames"]
        nemo = reference_arrays[f"clip{i}_encoder"]  # (D, frames), each clip alone in NeMo
        ours = encoded[i, :frames].float().numpy().T
        errors.append(float(np.linalg.norm(ours - nemo) / np.linalg.norm(nemo)))
    return errors


@pytest.fixture
def packs(monkeypatch):
    """The packings made while the test runs."""
    made = []
    plan = Packing.plan.__func__

    def recording(cls, *args, **kwargs):
        made.append(plan(cls, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(Packing, "plan", classmethod(recording))
    return made


def test_packed_float32_batch_gives_each_clip_nemos_output(reference_arrays, packs):
    """The six fixture clips (0.25-7.4 s) in one batch, packed (float32 packs only when asked: `frames` given)."""
    model = gs.load_model(NEMO_PATH, device="cpu", graphs=False)
    features, lengths, samples = _nemo_features_batch(model, reference_arrays)
    frames = encoder.encoder_frames(samples, model.cfg.features.hop_length, model.cfg.encoder.subsampling_factor)
    assert frames == [reference_clip(name)["encoder_frames"] for name in CLIP_NAMES]
    with torch.inference_mode():
        encoded, out_lengths = model.module.encoder(features, lengths, None, None, frames)
    assert len(packs) == 1 and packs[0] is not None and packs[0].rows < len(CLIP_NAMES)
    assert out_lengths.tolist() == frames
    assert max(_relative_errors(encoded, reference_arrays)) < 1e-4  # as each clip alone (test_nemo_parity)
    for i, n in enumerate(frames):
        assert not encoded[i, n:].any()  # padded frames are zeros


def test_bfloat16_batches_pack_and_stay_near_nemo(reference_arrays, packs):
    """In 16 bits the model packs by itself; each clip is as near NeMo's float32 output as bfloat16 allows, and as
    near as the same batch unpacked."""
    model = gs.load_model(NEMO_PATH, device="cpu", graphs=False, dtype="bfloat16")
    features, lengths, samples = _nemo_features_batch(model, reference_arrays)
    with torch.inference_mode():
        packed, _ = model.encoder_output(features, lengths, None, samples)
        assert len(packs) == 1 and packs[0] is not None
        unpacked, _ = model.encoder_output(features, lengths)  # no sample counts: rows as they come
    assert len(packs) == 1
    packed_errors = _relative_errors(packed, reference_arrays)
    unpacked_errors = _relative_errors(unpacked, reference_arrays)
    assert max(packed_errors) < 0.05  # bfloat16's own distance from float32 (test_encoder_kernels)
    assert max(packed_errors) < 1.5 * max(unpacked_errors)
