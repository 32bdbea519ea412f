"""Packed rows (`packing.Packing`): the clips of a batch laid end to end in fewer rows, each clip still getting
NeMo's own encoder output for it alone (reference.npz), in float32 and in bfloat16, eager and through the layer
graphs' bookkeeping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CLIP_NAMES, CLIPS, NEMO_PATH, reference_clip

import graphscribe as gs
from graphscribe.model import encoder
from graphscribe.model.features import PackedClips
from graphscribe.model.packing import Packing

CPU = torch.device("cpu")


@pytest.fixture
def align16(monkeypatch):
    """Rows a multiple of 16 frames long: the examples worked out by hand have clips of a few frames."""
    monkeypatch.setattr(Packing, "ALIGN", 16)


def test_plan_lays_clips_first_fit_longest_first(align16):
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


def test_plan_keeps_rows_when_packing_saves_little(align16):
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


def test_front_layout_worked_by_hand(align16):
    """The plan of the first test, laid out for its samples (hop 2, factor 2: 4 samples an encoder frame): where
    each clip lies among the samples, the STFT frames and after the stride-2 convolution, worked out by hand."""
    plan = Packing.plan([10, 3, 3, 2], padded=10, gap=4, device=CPU)
    samples = [40, 12, 12, 8]  # 20, 6, 6, 4 feature frames; 10, 3, 3, 2 encoder frames
    front = plan.front(samples, hop=2, factor=2, device=CPU)
    ids = torch.zeros(2, 64, dtype=torch.int32)  # 16 encoder frames x 4 samples a row
    ids[0, 0:40], ids[0, 56:64], ids[1, 0:12], ids[1, 28:40] = 1, 4, 2, 3  # clip 3 at frame 14, clip 2 at 7
    assert torch.equal(front.sample_ids, ids)
    frames = torch.zeros(2, 33, dtype=torch.int32)  # 64 // 2 + 1 STFT frames (center=True)
    frames[0, 0:20], frames[0, 28:32], frames[1, 0:6], frames[1, 14:20] = 1, 4, 2, 3
    assert torch.equal(front.frame_ids, frames)
    assert front.spans.tolist() == [[0, 1, 1, 0], [0, 0, 14, 28], [20, 6, 20, 32]]  # rows, first, end frames
    before, after = front.valid  # the subsampling's masks: its input frames, and the 17 after its one stride (the
    assert torch.equal(before, frames > 0)  # encoder's rows and one more, outside every clip)
    assert torch.equal(after[:, :16], plan.segments >= 0) and not after[:, 16].any()
    audio = torch.arange(1.0, 161.0).view(4, 40)  # sample i of clip b holds 40 b + i + 1
    packed = plan.pack_samples(audio, front)
    expected = torch.zeros(2, 64)
    expected[0, :40], expected[0, 56:], expected[1, :12], expected[1, 28:40] = (
        audio[0],
        audio[3, :8],
        audio[1, :12],
        audio[2, :12],
    )
    assert torch.equal(packed, expected)


@pytest.fixture
def packing_model(monkeypatch):
    """The tiny checkpoint in float32 (NeMo's reference is float32), packing as a 16-bit model does."""
    monkeypatch.setattr(gs.Model, "packs_rows", property(lambda self: True))
    return gs.load_model(NEMO_PATH, device="cpu", graphs=False)


def _padded(audios):
    samples = [a.numel() for a in audios]
    batch = torch.zeros(len(audios), max(samples))
    for i, a in enumerate(audios):
        batch[i, : a.numel()] = a
    return batch, torch.tensor(samples), samples


def test_packed_front_end_gives_each_clip_nemos_features_and_output(packing_model, reference_arrays):
    """The six clips' samples laid end to end (`Model.front_packing`): each clip's features are NeMo's for it alone,
    normalised over its own frames, and so is its encoder output. The silent clip is left out: its features are
    ill-conditioned, ours differ from NeMo's there whatever the batch (test_nemo_parity)."""
    model = packing_model
    batch, lengths, samples = _padded([model.read(CLIPS / name) for name in CLIP_NAMES])
    with torch.inference_mode():
        front = model.front_packing(samples, batch.shape[1], None)
        assert front is not None and front.packing.rows < len(CLIP_NAMES)
        features, frames = model.batch_features(batch, lengths, front)
        encoded, out_lengths = model.encoder_output(features, frames, None, samples, front)
    assert features.shape[0] == front.packing.rows
    assert out_lengths.tolist() == [reference_clip(name)["encoder_frames"] for name in CLIP_NAMES]
    rows, first, end = front.spans.tolist()
    errors = _relative_errors(encoded, reference_arrays)
    for i, name in enumerate(CLIP_NAMES):
        if name == "silence_1s.wav":
            continue
        nemo = reference_arrays[f"clip{i}_features"]  # (n_mels, N)
        ours = features[rows[i], :, first[i] : end[i]].numpy()
        assert ours.shape == nemo.shape
        assert np.abs(ours - nemo).max() < 1e-3, name  # as each clip alone (test_nemo_parity)
        assert errors[i] < 1e-4, name
        assert not encoded[i, out_lengths[i] :].any()  # padded frames are zeros
    assert not features[front.frame_ids[:, None, :].expand_as(features) == 0].any()  # zeros between clips


def test_empty_clip_spans_leave_packed_features_as_they_are(packing_model):
    """`graphs.FeatureGraphs` replays one graph for a shape's batches of any number of clips: the spans past the
    batch's clips are empty (row 0, frames 0 to 0). No frame reads their statistics, so the features are bit-equal to
    those of the batch's own spans, and hold no NaN (an empty clip's mean is 0 / 0)."""
    model = packing_model
    featurizer = model.module.preprocessor.featurizer
    batch, lengths, samples = _padded([model.read(CLIPS / name) for name in CLIP_NAMES])
    with torch.inference_mode():
        front = model.front_packing(samples, batch.shape[1], None)
        packed = front.packing.pack_samples(batch, front)
        rows = torch.full((packed.shape[0],), packed.shape[1])
        own, _ = featurizer(packed, rows, packed=PackedClips(front.sample_ids > 0, front.frame_ids, front.spans))
        spans = torch.cat([front.spans, torch.zeros(3, 64 - len(samples), dtype=torch.long)], dim=1)
        slots, _ = featurizer(packed, rows, packed=PackedClips(front.sample_ids > 0, front.frame_ids, spans))
    assert torch.equal(own, slots)
    assert not slots.isnan().any()


def test_bfloat16_front_end_packs_and_stays_near_nemo(reference_arrays):
    """A 16-bit batch of mixed lengths packs its front end by itself (the pipeline's `_start` asks for it); each
    clip is as near NeMo's float32 output as bfloat16 allows, and as near as with the front end padded."""
    from graphscribe.runtime.clock import StageClock
    from graphscribe.runtime.pipeline import _start
    from graphscribe.runtime.reading import Batch

    model = gs.load_model(NEMO_PATH, device="cpu", graphs=False, dtype="bfloat16")
    batch, lengths, samples = _padded([model.read(CLIPS / name) for name in CLIP_NAMES])
    with torch.inference_mode():
        assert model.front_packing(samples, batch.shape[1], None) is not None
        assert model.front_packing(samples, batch.shape[1], (64, 64)) is None  # local attention: rows as they come
        job = _start(model, Batch(list(range(6)), CLIP_NAMES, batch, lengths), StageClock(model.device, False))
        features, frames = model.batch_features(batch, lengths)  # the front end padded, the layers packed
        padded_front, _ = model.encoder_output(features, frames, None, samples)
    packed_errors = _relative_errors(job.encoded, reference_arrays)
    padded_errors = _relative_errors(padded_front, reference_arrays)
    assert max(packed_errors) < 0.05  # bfloat16's own distance from float32 (test_encoder_kernels)
    assert max(packed_errors) < 1.5 * max(padded_errors)


def test_front_end_packs_only_what_pays(packing_model):
    """Not one clip, not clips of like lengths (no two share a row), not float32 (its rows are the CLI's), not
    clips past PACKED_FRONT_MAX_SECONDS (one pass of the subsampling a row)."""
    from graphscribe.runtime.loaded import PACKED_FRONT_MAX_SECONDS

    model = packing_model
    rate = model.sample_rate
    assert model.front_packing([rate * 7, rate * 2, rate * 2, rate * 2], rate * 7, None) is not None  # rows share
    assert model.front_packing([rate * 7], rate * 7, None) is None
    assert model.front_packing([rate * 7, rate * 7 - 800], rate * 7, None) is None
    longest = (PACKED_FRONT_MAX_SECONDS + 1) * rate
    assert model.front_packing([longest, rate * 2, rate * 2, rate * 2], longest, None) is None


def test_float32_keeps_its_front_end_padded():
    model = gs.load_model(NEMO_PATH, device="cpu", graphs=False)
    rate = model.sample_rate
    assert model.front_packing([rate * 7, rate * 2, rate * 2, rate * 2], rate * 7, None) is None


def test_a_servers_warm_up_packs_two_batches_of_mixed_lengths():
    """On CUDA in 16 bits the server's warm-up (`service.warm_up_plans`) has a batch a decode size class, of like
    lengths (no two clips share a row), and two of mixed lengths whose front end packs, so the packed paths' kernels
    compile before the first request; float32 and the CPU have none of mixed lengths."""
    from types import SimpleNamespace

    from graphscribe.serve.service import warm_up_plans

    cuda = torch.device("cuda")
    plans = warm_up_plans(SimpleNamespace(device=cuda, packs_rows=True), 64, 3200.0)
    assert [len(p) for p in plans] == [1, 2, 4, 8, 16, 32, 64, 64, 32]
    model = gs.load_model(NEMO_PATH, device="cpu", graphs=False, dtype="bfloat16")  # packs as on CUDA
    rate = model.sample_rate
    packed = []
    for plan in plans:
        samples = [int(s * rate) for s in plan]
        packed.append(model.front_packing(samples, max(samples), None) is not None)
    assert packed == [False] * 7 + [True, True]
    assert [len(p) for p in warm_up_plans(SimpleNamespace(device=cuda, packs_rows=False), 64, 3200.0)] == [
        1,
        2,
        4,
        8,
        16,
        32,
        64,
    ]
    assert warm_up_plans(SimpleNamespace(device=torch.device("cpu"), packs_rows=True), 8, 120.0) == [[1.0]]


def test_a_servers_warm_up_meets_every_packed_shape():
    """`service.packed_shape_plans`: on CUDA in 16 bits one batch for each (rows, length) of packed rows, rows up
    to half the batch and lengths in steps of `Packing.ALIGN` up to 35.84 s (448 frames of 80 ms), largest first;
    each batch, made as the server makes it (padded to `PAD_SECONDS`), packs to exactly its shape with the real
    packing decision. None in float32 or on the CPU."""
    from types import SimpleNamespace

    from graphscribe.runtime.defaults import PAD_SECONDS
    from graphscribe.serve.service import packed_shape_plans

    model = gs.load_model(NEMO_PATH, device="cpu", graphs=False, dtype="bfloat16")  # packs as on CUDA
    rate = model.sample_rate
    cuda = SimpleNamespace(
        device=torch.device("cuda"), packs_rows=True, cfg=model.cfg, module=model.module, sample_rate=rate
    )
    plans = packed_shape_plans(cuda, 64, 3200.0)
    pad = round(PAD_SECONDS * rate)
    shapes = []
    for plan in plans:
        samples = [int(s * rate) for s in plan]
        front = model.front_packing(samples, -(-max(samples) // pad) * pad, None)
        shapes.append((front.packing.rows, front.packing.length))
    grid = {(rows, length) for rows in range(1, 33) for length in range(64, 449, 64)}
    assert len(shapes) == len(grid) and set(shapes) == grid
    assert [r * length for r, length in shapes] == sorted((r * length for r, length in grid), reverse=True)
    assert all(len(plan) == 2 * rows for plan, (rows, _) in zip(plans, shapes))
    assert len(packed_shape_plans(cuda, 64, 40.0)) < len(grid)  # within the padded-seconds cap
    assert packed_shape_plans(SimpleNamespace(device=torch.device("cuda"), packs_rows=False), 64, 3200.0) == []
    assert packed_shape_plans(SimpleNamespace(device=torch.device("cpu"), packs_rows=True), 64, 3200.0) == []
