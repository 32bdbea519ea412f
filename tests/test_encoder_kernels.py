"""The encoder's fused 16-bit kernels (`encoder_kernels`) against the PyTorch formulation and NeMo's encoder.

On a GPU the kernels run compiled; without CUDA through Triton's CPU interpreter (conftest sets
TRITON_INTERPRET), and the model-level test routes the CPU to them (the encoder takes them for 16-bit
activations on CUDA only). References are computed on the CPU in float32. tests/test_gpu.py runs the
kernels inside the whole model (graphs against eager, NeMo's tokens).
"""

import copy
import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import CLIP_NAMES, CLIPS, NEMO_PATH, reference_clip

import graphscribe as gs
import graphscribe.model.encoder as encoder
import graphscribe.model.subsampling as subsampling

kernels = pytest.importorskip("graphscribe.model.encoder_kernels")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter's pace is per program (~0.2 s each, whatever its block): where a whole model's features go through
# the first convolution on the CPU, a program takes 16 frames instead of one (128 mels: 64 outputs a frame).
# test_first_conv_matches_pytorch covers the default blocks and their edges.
INTERPRETED_BLOCK_P = 1024


@pytest.fixture
def few_programs(monkeypatch):
    """On the CPU, the model-level tests' first convolution in fewer, larger interpreted programs."""
    if DEVICE == "cpu":
        monkeypatch.setattr(kernels, "first_conv", functools.partial(kernels.first_conv, block_p=INTERPRETED_BLOCK_P))


def _on_device(*modules):
    return [copy.deepcopy(m).to(DEVICE) for m in modules]


def _conv_module_reference(h, valid, conv, norm):
    """The conv module between its pointwise convolutions as NeMo writes it, in float32: (B, T, 2C) -> (B, T, C)."""
    x = F.glu(h.float().transpose(1, 2), dim=1).masked_fill(~valid[:, None, :], 0.0)
    conv, norm = conv.float(), norm.float()
    return F.silu(norm(conv(x))).transpose(1, 2)


@pytest.mark.parametrize("channels,kernel,bias", [(40, 9, True), (72, 9, False), (24, 31, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_glu_depthwise_matches_pytorch(channels, kernel, bias, dtype):
    gen = torch.Generator().manual_seed(channels + kernel)
    b, t = 3, 37
    h = torch.randn(b, t, 2 * channels, generator=gen)
    valid = torch.arange(t)[None, :] < torch.tensor([37, 20, 1])[:, None]
    conv = torch.nn.Conv1d(channels, channels, kernel, padding=(kernel - 1) // 2, groups=channels, bias=bias)
    norm = torch.nn.BatchNorm1d(channels).eval()
    with torch.no_grad():
        for p in [*conv.parameters(), norm.weight, norm.bias, norm.running_mean]:
            p.copy_(torch.randn(p.shape, generator=gen))
        norm.running_var.copy_(torch.rand(channels, generator=gen) + 0.5)
    h, conv, norm = h.to(dtype), conv.to(dtype), norm.to(dtype)
    with torch.inference_mode():
        want = _conv_module_reference(h, valid, conv, norm)
        got = kernels.glu_depthwise(h.to(DEVICE), valid.to(DEVICE), *_on_device(conv, norm)).cpu()
    assert got.dtype == dtype and got.shape == (b, t, channels)
    tol = 1e-5 if dtype == torch.float32 else 1e-2  # bfloat16: one rounding of the output
    assert torch.allclose(got.float(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_position_bias_matches_pytorch(monkeypatch, dtype):
    """Groups of query rows (forced small), a padded row and a packed one: the fused bias equals the PyTorch one,
    and a query sees exactly the keys of its own clip."""
    gen = torch.Generator().manual_seed(1)
    b, h, t, d_k = 3, 2, 29, 8
    q_v = torch.randn(b, h, t, d_k, generator=gen).to(dtype)
    p = torch.randn(h, 2 * t - 1, d_k, generator=gen).to(dtype)
    # clips as (row, first frame, frames): row 0 one clip filling it, row 1 one of 11, row 2 three packed with gaps
    clips = [(0, 0, 29), (1, 0, 11), (2, 0, 3), (2, 7, 12), (2, 23, 5)]
    segments = torch.full((b, t), -1, dtype=torch.long)
    clip_of = {}  # (row, frame) -> clip
    for n, (row, first, frames) in enumerate(clips):
        segments[row, first : first + frames] = n
        clip_of.update({(row, f): n for f in range(first, first + frames)})
    scale, width = 0.35, encoder._aligned(t)
    for start, end in [(0, t), (0, 7), (7, 16), (16, t)]:
        p_rows = p[:, t - end : 2 * t - 1 - start]
        want = encoder._position_bias(q_v[:, :, start:end], p_rows, segments, start, scale, width)  # CPU: PyTorch
        monkeypatch.setattr(encoder, "kernels_for", lambda x: kernels)
        got = encoder._position_bias(
            q_v[:, :, start:end].to(DEVICE), p_rows.to(DEVICE), segments.to(DEVICE), start, scale, width
        )
        monkeypatch.undo()
        assert got.stride(2) == width
        got = got.cpu()
        assert got.shape == want.shape == (b, h, end - start, t)
        seen = torch.tensor(
            [
                [
                    [(r, i) in clip_of and clip_of.get((r, j)) == clip_of[(r, i)] for j in range(t)]
                    for i in range(start, end)
                ]
                for r in range(b)
            ]
        )  # (B, n, t)
        assert torch.equal(got == encoder._MASKED_SCORE, (~seen[:, None]).expand_as(got))
        assert torch.equal(want == encoder._MASKED_SCORE, (~seen[:, None]).expand_as(got))
        tol = 1e-6 if dtype == torch.float32 else 1e-2
        assert torch.allclose(got.float(), want.float(), rtol=tol, atol=tol)


def test_fused_bfloat16_encoder_is_near_nemo(monkeypatch, reference_arrays, few_programs):
    """The NeMo-made tiny checkpoint in bfloat16 through the fused kernels: its encoder output is as near NeMo's
    float32 output (reference.npz) as the PyTorch formulation's in bfloat16, on a batch of two padded clips (a
    short one: the interpreter is slow)."""
    model = gs.load_model(NEMO_PATH, device=DEVICE, graphs=False, dtype="bfloat16")
    name = "short_2s.wav"
    index = CLIP_NAMES.index(name)
    clip = reference_clip(name)
    audio = model.read(CLIPS / name)
    features, lengths = model.features([audio, audio[: audio.numel() // 2]])
    nemo = reference_arrays[f"clip{index}_encoder"].T  # (frames, D)

    def error(fused: bool) -> float:
        monkeypatch.setattr(encoder, "kernels_for", lambda x: kernels if fused else None)
        monkeypatch.setattr(subsampling, "kernels_for", lambda x: kernels if fused else None)
        with torch.inference_mode():
            encoded, _ = model.module.encoder(features.to(torch.bfloat16), lengths)
        ours = encoded[0, : clip["encoder_frames"]].float().cpu().numpy()
        return float(np.linalg.norm(ours - nemo) / np.linalg.norm(nemo))

    unfused, fused = error(False), error(True)
    assert unfused < 0.05  # bfloat16's own distance from float32
    assert fused < 1.5 * unfused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_first_conv_matches_pytorch(dtype):
    """The subsampling's first convolution with its ReLU and mask against PyTorch's: odd sizes, a row shorter than
    the batch, a row with no frames (a time chunk past its end) and a negative length; the features' layout."""
    gen = torch.Generator().manual_seed(3)
    b, t, f, c = 4, 45, 19, 12
    first = torch.nn.Conv2d(1, c, 3, 2, 1)
    with torch.no_grad():
        for p in first.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(b, f, t, generator=gen).to(dtype).transpose(1, 2)[:, None]  # (B, 1, T, F), time contiguous
    lengths = torch.tensor([45, 30, 0, -7])
    halved = subsampling._halved(lengths)
    first = first.to(dtype)
    with torch.inference_mode():
        want = subsampling._relu_masked(
            copy.deepcopy(first).float()(subsampling._mask_time(x.float(), lengths)), halved
        )
        got = kernels.first_conv(x.to(DEVICE), lengths.to(DEVICE), halved.to(DEVICE), *_on_device(first)).cpu()
    assert got.dtype == dtype and got.shape == want.shape == (b, c, 23, 10)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(got.float(), want, rtol=tol, atol=tol * want.abs().max().item())
    assert not got[2].any() and not got[3].any() and not got[1, :, 15:].any()


def test_first_conv_on_packed_rows_matches_pytorchs(monkeypatch, few_programs):
    """Packed rows (`Subsampling._masked_stack`): the fused first convolution masks nothing (the features between
    clips are zeros) and its output is masked by frame after it; PyTorch's layers masked by frame give the same."""
    from graphscribe.model.packing import Packing

    monkeypatch.setattr(Packing, "ALIGN", 16)  # rows short enough for these short clips to share them
    model = gs.load_model(NEMO_PATH, device="cpu", graphs=False, dtype="bfloat16")
    names = ["noise_3s.wav", "short_2s.wav", "silence_1s.wav", "quarter_second.wav"]  # short: the interpreter's pace
    audios = [model.read(CLIPS / name) for name in names]
    samples = [a.numel() for a in audios]
    batch = torch.zeros(len(audios), max(samples))
    for i, a in enumerate(audios):
        batch[i, : a.numel()] = a
    sub = model.module.encoder.pre_encode
    with torch.inference_mode():
        front = model.front_packing(samples, batch.shape[1], None)
        features, _ = model.batch_features(batch, torch.tensor(samples), front)
        x = features.transpose(1, 2).to(torch.bfloat16)[:, None]  # (R, 1, T, F)
        conv = copy.deepcopy(sub.conv)
        conv[0].bias.add_(4.0)  # the first convolution's output between clips, unmasked, would be far from zero
        want = sub._masked_stack(x, list(conv), None, front.valid).float()
        layers = _on_device(*conv)
        got = sub._masked_stack(x.to(DEVICE), layers, kernels, [v.to(DEVICE) for v in front.valid]).cpu().float()
    assert got.shape == want.shape and got.shape[0] == front.packing.rows
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    outside = ~front.valid[-1][:, None, :, None].expand_as(got)
    assert not got[outside].any()  # zeros between the clips, as past a clip's own row
