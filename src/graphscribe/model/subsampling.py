"""NeMo's dw_striding subsampling (x8 in time): three stride-2 convolutions over (time, mel), each masking padded
frames, run in time chunks for long inputs; the lengths it gives."""

from __future__ import annotations

import functools
import logging
import math

import torch
import torch.nn.functional as F
from torch import nn

from graphscribe.io.config import EncoderConfig
from graphscribe.model import import_kernels

log = logging.getLogger(__name__)

_KERNEL, _STRIDE, _PAD = 3, 2, 1  # subsampling convolutions

CONV_BYTES = 512 * 2**20  # subsampling: time chunks keep the first convolution's output near this per batch row


MIN_CHUNK = 64  # subsampling: output frames a chunk has at least (each chunk recomputes one more)


_INDEX_LIMIT = 2**31 - 1  # elements a tensor of PyTorch's own CUDA convolution kernels may have (32-bit indexing)


def subsampled_lengths(lengths, factor: int, causal: bool = False):
    """Frames after `log2(factor)` stride-2 convolutions: floor((L + 2 - 3) / 2 + 1) each, or with the causal
    padding (2 before, 1 after) floor(L / 2 + 1); ints or tensors."""
    pad = _CAUSAL_PAD if causal else 2 * _PAD
    for _ in range(int(math.log2(factor))):
        lengths = (lengths + pad - _KERNEL) // _STRIDE + 1
    return lengths


_CAUSAL_PAD = 3  # NeMo's CausalConv2D pads both axes with kernel - 1 = 2 zeros before and stride - 1 = 1 after


class CausalConv2d(nn.Conv2d):
    """NeMo's CausalConv2D: (2, 1) zeros around the time axis and the mel axis alike, then no padding of its own.

    Run as the convolution padded by 2 on every side, its outputs past the causal ones cut: the same windows over
    the same zeros (a window starting past the first (2, 1) padding's end only exists on an odd axis, as the last
    output, which is cut), where padding the input first wrote a copy of it, the first subsampling layer's
    input and the depthwise layers' (B, C, T, F) maps a second time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, f = x.shape[2] // 2 + 1, x.shape[3] // 2 + 1  # floor((L + 3 - 3) / 2) + 1 each
        y = F.conv2d(x, self.weight, self.bias, self.stride, 2, self.dilation, self.groups)
        return y[:, :, :t, :f]


class Subsampling(nn.Module):
    """dw_striding: Conv2d(1, C, 3, s2) + ReLU, then [depthwise s2, pointwise, ReLU] x (log2(factor) - 1).

    Long inputs go through the convolutions in time chunks, so the first convolution's output
    (C channels at half the frame rate) never exists for the whole recording: the same numbers as
    one pass (each chunk starts on a multiple of `factor` and recomputes one output frame before
    it, the only one that sees the chunk's edge), memory bounded by `CONV_BYTES`.
    """

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.factor = cfg.subsampling_factor
        self.causal = cfg.cache_aware  # NeMo's causal_downsampling
        channels = cfg.subsampling_channels
        strided, pad = (CausalConv2d, 0) if self.causal else (nn.Conv2d, _PAD)
        layers: list[nn.Module] = [strided(1, channels, _KERNEL, _STRIDE, pad), nn.ReLU()]
        for _ in range(int(math.log2(cfg.subsampling_factor)) - 1):
            layers += [
                strided(channels, channels, _KERNEL, _STRIDE, pad, groups=channels),
                nn.Conv2d(channels, channels, 1),
                nn.ReLU(),
            ]
        self.conv = nn.Sequential(*layers)
        freq = subsampled_lengths(cfg.n_mels, cfg.subsampling_factor, self.causal)
        self.out = nn.Linear(channels * freq, cfg.d_model)

    def forward(
        self,
        x: torch.Tensor,
        lengths: torch.Tensor,
        chunk_frames: int | None = None,
        valid: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, F) features -> (B, T', D) and (B,) lengths; `chunk_frames`: output frames per chunk (tests).

        valid: for packed rows (`packing.Packing.front`), (R, T_k) masks of the frames that are a clip's, before
        each stride-2 convolution and after the last: they stand in for the rows' lengths (one pass, no chunks);
        `lengths` are then the clips' frames."""
        b, t, f = x.shape
        out_lengths = subsampled_lengths(lengths, self.factor, self.causal)
        if self.causal:  # streaming models' inputs are chunks or one clip: one pass, NeMo's masks
            return self._project(self._causal_stack(x.unsqueeze(1), lengths)), out_lengths
        if valid is not None:
            return self._project(self._convs(x, lengths, valid)), out_lengths
        t_out = subsampled_lengths(t, self.factor)
        if chunk_frames is None:  # per row: a clip's chunks (so its float32 rounding) must not depend on its batch
            per_frame = conv_bytes_per_frame(1, self.conv[0].out_channels, self.factor, f, x.element_size())
            chunk_frames = max(MIN_CHUNK, CONV_BYTES // per_frame)
        if chunk_frames >= t_out:
            return self._project(self._convs(x, lengths)), out_lengths
        y = x.new_empty(b, t_out, self.out.out_features)
        for start in range(0, t_out, chunk_frames):
            end = min(t_out, start + chunk_frames)
            first = max(0, start - 1)  # output frame `first` sees the chunk's left edge: recomputed, dropped
            offset = first * self.factor
            part = self._convs(x[:, offset : end * self.factor], lengths - offset)
            y[:, start:end] = self._project(part[:, :, start - first : end - first])
        return y, out_lengths

    def _convs(self, x: torch.Tensor, lengths: torch.Tensor, valid: list[torch.Tensor] | None = None) -> torch.Tensor:
        """(B, T, F) features -> (B, C, T', F'), padding masked before every layer.

        On CUDA through PyTorch's own kernels (im2col and a GEMM per row, a direct depthwise kernel), not
        cuDNN's: cuDNN builds execution plans for every input shape it has not seen, 75-110 ms a batch at
        B=128 in bfloat16 and 8 ms at B=8 in float32 on the H100, and a folder's batches nearly all have a
        shape of their own. The same float32 bits as cuDNN's (tests/test_gpu.py), so
        NeMo's tokens stay. Those kernels index in 32 bits, so a large batch goes through in groups of rows:
        each row is computed alone either way."""
        x = x.unsqueeze(1)  # (B, 1, T, F)
        if not x.is_cuda:
            return self._conv_stack(x, lengths, valid)
        cudnn = torch.backends.cudnn
        per_row = self.conv[0].out_channels * ((x.shape[2] + 1) // 2) * ((x.shape[3] + 1) // 2)  # largest tensor
        rows = max(1, _INDEX_LIMIT // per_row)
        with cudnn.flags(
            enabled=False, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic, allow_tf32=cudnn.allow_tf32
        ):
            if rows >= x.shape[0]:
                return self._conv_stack(x, lengths, valid)
            groups = range(0, x.shape[0], rows)
            if valid is not None:
                return torch.cat(
                    [self._conv_stack(x[i : i + rows], None, [v[i : i + rows] for v in valid]) for i in groups]
                )
            return torch.cat([self._conv_stack(x[i : i + rows], lengths[i : i + rows]) for i in groups])

    def _conv_stack(
        self, x: torch.Tensor, lengths: torch.Tensor | None, valid: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        """Padded frames are zero wherever a layer reads across frames: before the first convolution, and each
        ReLU (which every depthwise convolution follows) masks as it goes (`_relu_masked`), the last one the
        output. A pointwise convolution or a ReLU reads no other frame, so a mask before them would change no
        valid frame: the same numbers as masking before every layer, in fewer passes over the largest tensors."""
        layers = list(self.conv)
        kernels = kernels_for(x)
        if valid is not None:  # packed rows: masks by frame, one a stride
            return self._masked_stack(x, layers, kernels, valid)
        if kernels is not None:  # 16-bit on CUDA: the first convolution, its ReLU and mask in one pass
            halved = _halved(lengths)
            x = kernels.first_conv(x, lengths, halved, layers[0])
            layers, lengths = layers[2:], halved
        else:
            x = _mask_time(x, lengths)
        for layer in layers:
            if isinstance(layer, nn.ReLU):
                x = _relu_masked(x, lengths)
                continue
            x = layer(x)
            if layer.stride != (1, 1):
                lengths = _halved(lengths)
        return x  # (B, C, T', F')

    def _causal_stack(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """NeMo's MaskedConvSequential on causal convolutions, (B, 1, T, F) -> (B, C, T', F'): the time mask
        applied before every layer and after the last, the lengths following each stride. Masking is needed
        only where a layer reads across frames, so the input is masked and each ReLU with its mask is one pass
        (`_relu_masked`): the pointwise convolutions read one frame each, and what they make of a masked frame is
        masked by the ReLU after them. The same numbers, two passes over the largest maps instead of six."""
        x = _mask_time(x, lengths)
        for layer in self.conv:
            if isinstance(layer, nn.ReLU):
                x = _relu_masked(x, lengths)
                continue
            x = layer(x)
            if isinstance(layer, nn.Conv2d) and layer.stride != (1, 1):
                lengths = torch.div(lengths + _CAUSAL_PAD - _KERNEL, _STRIDE, rounding_mode="floor") + 1
        return x

    @staticmethod
    def _masked_stack(x: torch.Tensor, layers: list[nn.Module], kernels, valid: list[torch.Tensor]) -> torch.Tensor:
        """`_conv_stack` on packed rows: the frames between clips zero wherever a layer reads across frames, as past
        the end of a clip's own row. The fused first convolution masks nothing (the features between clips are
        zeros), then one pass masks its output."""
        level = 0
        if kernels is not None:
            whole_in = torch.full((x.shape[0],), x.shape[2], device=x.device)
            whole_out = torch.full((x.shape[0],), valid[1].shape[1], device=x.device)
            x = kernels.first_conv(x, whole_in, whole_out, layers[0])
            x = x * valid[1][:, None, :, None].to(x.dtype)
            layers, level = layers[2:], 1
        else:
            x = x * valid[0][:, None, :, None].to(x.dtype)
        for layer in layers:
            if isinstance(layer, nn.ReLU):
                x = torch.where(valid[level][:, None, :, None], x.clamp(min=0), 0.0)
                continue
            x = layer(x)
            if layer.stride != (1, 1):
                level += 1
        return x  # (R, C, T', F')

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, f = x.shape
        return self.out(x.transpose(1, 2).reshape(b, t, c * f))  # (B, T', D)


def _halved(lengths: torch.Tensor) -> torch.Tensor:
    """Frames after one stride-2 convolution, (L + 2 - 3) // 2 + 1, rounding down also below zero (time chunks)."""
    return torch.div(lengths + 2 * _PAD - _KERNEL, _STRIDE, rounding_mode="floor") + 1


def conv_bytes_per_frame(batch: int, channels: int, factor: int, n_mels: int, itemsize: int) -> int:
    """Bytes of the first subsampling convolution's output (stride 2) per output frame (stride `factor`)."""
    return batch * channels * (factor // 2) * ((n_mels + 1) // 2) * itemsize


def _mask_time(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    valid = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]  # (B, T)
    return x * valid[:, None, :, None].to(x.dtype)


def _relu_masked(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """`_mask_time(relu(x))` in one pass over (B, C, T, F): clamped to [0, inf) on frames, [0, 0] on padding."""
    valid = torch.arange(x.shape[2], device=x.device)[None, :] < lengths[:, None]  # (B, T)
    top = torch.where(valid, torch.inf, 0.0).to(x.dtype)[:, None, :, None]
    return torch.clamp(x, min=top.new_zeros(()), max=top)


def kernels_for(x: torch.Tensor):
    """`encoder_kernels` for 16-bit activations on CUDA; None elsewhere (float32 keeps NeMo's own operations, the
    CPU has no Triton) or if Triton is missing, which is said once."""
    return _encoder_kernels() if x.is_cuda and x.dtype != torch.float32 else None


@functools.cache
def _encoder_kernels():
    try:
        encoder_kernels = import_kernels("encoder_kernels")
    except ImportError as err:
        log.warning("fused encoder kernels unavailable (%s); using PyTorch's operations", err)
        return None
    return encoder_kernels
