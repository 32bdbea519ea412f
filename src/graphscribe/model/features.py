"""NeMo-exact log-mel features (AudioToMelSpectrogramPreprocessor at inference).

Uses the checkpoint's own window and filterbank buffers, so the result matches NeMo to
float32 rounding. Always float32, outside autocast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from graphscribe.io.config import FeatureConfig


def feature_lengths(num_samples: torch.Tensor, hop_length: int) -> torch.Tensor:
    """Valid feature frames for signals of `num_samples` samples (NeMo >= 2.5: L // hop)."""
    return torch.div(num_samples, hop_length, rounding_mode="floor")


CHUNK_SAMPLES = 2**22  # samples of each row turned into features at once (about 4 min of 16 kHz audio)
# On CUDA the STFT runs on stretches of fixed sizes: cuFFT makes a plan for every new number of transforms (6-25 ms
# of the host's time at batch 8-128 on the H100), so a batch of a new length paid one; stretches of
# FIXED_FRAMES frames, the last one rounded up to a power of two (at least MIN_FIXED_FRAMES), need a handful
# of plans per batch size.
FIXED_FRAMES = 512
MIN_FIXED_FRAMES = 64
_NORM_CHUNK_FRAMES = 2**15  # frames normalised at once


@dataclass
class PackedClips:
    """Clips laid end to end in the rows of a (R, L) signal (`packing.Packing.pack_samples`), zeros between them."""

    samples: torch.Tensor  # (R, L) bool: a clip's sample
    frames: torch.Tensor  # (R, T) int32: 1 + the clip of each STFT frame (T = L // hop + 1), 0 between clips
    spans: torch.Tensor  # (3, B) int64: each clip's row, first frame and end frame (exclusive)


class LogMel(nn.Module):
    """(B, L) float32 audio at the model's rate -> (B, n_mels, T) log-mel features, normalised per feature unless
    the model says "NA" (streaming models).

    Hours of audio are done a stretch of frames at a time (each STFT frame needs only its own
    samples), so the only full-length tensors are the input and the (B, n_mels, T) output; the
    normalisation accumulates its per-channel sums over the stretches, in place. With `fixed_shapes` (the
    default on CUDA) the stretches have fixed sizes (`FIXED_FRAMES`), the last one computed past the end and cut.
    """

    def __init__(self, cfg: FeatureConfig):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("window", torch.hann_window(cfg.win_length, periodic=False))
        self.register_buffer("fb", torch.zeros(1, cfg.n_mels, cfg.n_fft // 2 + 1))

    @torch.autocast("cuda", enabled=False)
    @torch.autocast("cpu", enabled=False)
    def forward(
        self,
        audio: torch.Tensor,
        num_samples: torch.Tensor,
        chunk_frames: int | None = None,
        fixed_shapes: bool | None = None,
        packed: PackedClips | None = None,
        keep_frames: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`packed`: the rows hold several clips each; each clip is normalised over its own frames and the frames
        between clips are zeros, so each gets the features of its own row (up to the rounding of the sums).
        `keep_frames`: the features cut to this many frames before they are normalised (NeMo's streaming buffers
        drop the last frame of a buffer's STFT so)."""
        cfg = self.cfg
        audio = audio.float()  # (B, L)
        frames = feature_lengths(num_samples, cfg.hop_length)  # (B,)
        total = audio.shape[1] // cfg.hop_length + 1  # STFT frames with center=True
        fixed_shapes = audio.is_cuda if fixed_shapes is None else fixed_shapes
        # per row, not per batch: a clip's chunks (so its float32 rounding) must not depend on its batch
        chunk_frames = chunk_frames or (FIXED_FRAMES if fixed_shapes else max(1, CHUNK_SAMPLES // cfg.hop_length))
        features = audio.new_empty(audio.shape[0], cfg.n_mels, total)
        valid = None if packed is None else packed.samples  # (B, L) a clip's samples, on packed rows
        for start in range(0, total, chunk_frames):
            end = min(total, start + chunk_frames)
            size = end - start
            if fixed_shapes and size < chunk_frames:  # the last stretch: a power of two, cut
                size = min(chunk_frames, max(MIN_FIXED_FRAMES, 1 << (size - 1).bit_length()))
            features[:, :, start:end] = self._log_mel(audio, num_samples, start, start + size, valid)[
                ..., : end - start
            ]
        if keep_frames is not None and total > keep_frames:
            features, frames = features[:, :, :keep_frames], frames.clamp(max=keep_frames)
        if not cfg.normalize:  # NeMo's "NA": the raw log-mel, frames past the signal at its pad value 0.0
            features.masked_fill_(torch.arange(features.shape[2], device=features.device) >= frames[:, None, None], 0.0)
        elif packed is None:
            _normalize_per_feature(features, frames, cfg.std_guard)
        else:
            _normalize_clips(features, packed, cfg.std_guard)
        return features, frames

    def _log_mel(
        self, audio: torch.Tensor, num_samples: torch.Tensor, start: int, end: int, valid: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Log-mel of STFT frames start ... end - 1: (B, n_mels, end - start)."""
        cfg = self.cfg
        half = cfg.n_fft // 2  # center=True: frame f covers samples f * hop - half ... f * hop + half - 1
        first, stop = start * cfg.hop_length - half - 1, (end - 1) * cfg.hop_length + half  # one more for pre-emphasis
        x = F.pad(
            audio[:, max(first, 0) : min(stop, audio.shape[1])], (max(0, -first), max(0, stop - audio.shape[1]))
        )  # zeros outside the signal (NeMo's constant pad)
        if cfg.preemph:
            x = x[:, 1:] - cfg.preemph * x[:, :-1]  # x[t] - 0.97 x[t - 1]; the first sample less 0.97 * 0
        else:
            x = x[:, 1:]
        if valid is None:
            index = torch.arange(first + 1, stop, device=audio.device)
            x = x.masked_fill((index[None, :] < 0) | (index[None, :] >= num_samples[:, None]), 0.0)
        else:  # the sample after a clip's end holds -0.97 x its last: zero, as past the end of a row of its own
            low, high = max(first + 1, 0), min(stop, audio.shape[1])
            inside = F.pad(valid[:, low:high].to(torch.uint8), (low - (first + 1), stop - high)).bool()
            x = x.masked_fill(~inside, 0.0)
        spec = torch.stft(
            x,
            n_fft=cfg.n_fft,
            hop_length=cfg.hop_length,
            win_length=cfg.win_length,
            window=self.window,
            center=False,
            return_complex=True,
        )  # (B, n_fft // 2 + 1, end - start)
        power = torch.view_as_real(spec).pow(2).sum(-1).sqrt().pow(cfg.mag_power)  # NeMo's |X| then ^p: bit-equal
        mel = torch.matmul(self.fb, power)  # (B, n_mels, end - start)
        return torch.log(mel + cfg.log_zero_guard)


def _normalize_per_feature(x: torch.Tensor, frames: torch.Tensor, std_guard: float) -> None:
    """In place: zero mean, unit std per mel channel over the valid frames (std with N - 1); padding frames to 0."""
    count = frames[:, None].to(x.dtype)  # (B, 1)
    chunks = [(s, min(x.shape[-1], s + _NORM_CHUNK_FRAMES)) for s in range(0, x.shape[-1], _NORM_CHUNK_FRAMES)]

    valid = [
        (torch.arange(start, end, device=x.device)[None, :] < frames[:, None])[:, None, :] for start, end in chunks
    ]  # (B, 1, end - start) each, made once for the three passes

    total = x.new_zeros(x.shape[:2])  # (B, n_mels)
    for (start, end), mask in zip(chunks, valid):
        total += torch.where(mask, x[:, :, start:end], 0.0).sum(dim=2)
    mean = total / count
    squares = x.new_zeros(x.shape[:2])
    for (start, end), mask in zip(chunks, valid):
        squares += torch.where(mask, x[:, :, start:end] - mean[:, :, None], 0.0).pow(2).sum(dim=2)
    std = (squares / (count - 1.0)).sqrt()
    std = std.masked_fill(std.isnan(), 0.0) + std_guard  # one valid frame: N - 1 == 0
    for (start, end), mask in zip(chunks, valid):
        part = x[:, :, start:end]
        part.sub_(mean[:, :, None]).div_(std[:, :, None])
        part.masked_fill_(~mask, 0.0)


def _normalize_clips(x: torch.Tensor, packed: PackedClips, std_guard: float) -> None:
    """`_normalize_per_feature` for packed rows, in place: each clip over its own frames (a run of its row: sums
    as differences of running sums in float64, the same on every run); the frames between clips to 0."""
    rows, first, end = packed.spans  # (B,) each
    count = (end - first)[:, None].to(x.dtype)  # (B, 1)

    def clip_sums(v: torch.Tensor) -> torch.Tensor:  # (R, M, T) -> (B, M)
        running = F.pad(v.double().cumsum(-1), (1, 0))  # (R, M, T + 1)
        return (running[rows, :, end] - running[rows, :, first]).to(x.dtype)

    def per_frame(stat: torch.Tensor) -> torch.Tensor:  # (B, M) -> (R, M, T): the frame's clip's, 0 between clips
        table = torch.cat([stat.new_zeros(1, stat.shape[1]), stat])  # row 0: between clips
        return table[packed.frames.long()].permute(0, 2, 1)

    inside = (packed.frames > 0)[:, None, :]  # (R, 1, T)
    mean = clip_sums(torch.where(inside, x, 0.0)) / count
    x.sub_(per_frame(mean))
    std = (clip_sums(torch.where(inside, x, 0.0).pow(2)) / (count - 1.0)).sqrt()
    std = std.masked_fill(std.isnan(), 0.0) + std_guard  # one valid frame: N - 1 == 0
    x.div_(torch.where(inside, per_frame(std), 1.0))
    x.masked_fill_(~inside, 0.0)
