"""NeMo-exact log-mel features (AudioToMelSpectrogramPreprocessor at inference).

Uses the checkpoint's own window and filterbank buffers, so the result matches NeMo to
float32 rounding. Always float32, outside autocast.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import FeatureConfig


def feature_lengths(num_samples: torch.Tensor, hop_length: int) -> torch.Tensor:
    """Valid feature frames for signals of `num_samples` samples (NeMo >= 2.5: L // hop)."""
    return torch.div(num_samples, hop_length, rounding_mode="floor")


class LogMel(nn.Module):
    """(B, L) float32 audio at the model's rate -> (B, n_mels, T) normalised log-mel features."""

    def __init__(self, cfg: FeatureConfig):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("window", torch.hann_window(cfg.win_length, periodic=False))
        self.register_buffer("fb", torch.zeros(1, cfg.n_mels, cfg.n_fft // 2 + 1))

    @torch.autocast("cuda", enabled=False)
    @torch.autocast("cpu", enabled=False)
    def forward(self, audio: torch.Tensor, num_samples: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        audio = audio.float()  # (B, L)
        frames = feature_lengths(num_samples, cfg.hop_length)  # (B,)
        valid = torch.arange(audio.shape[1], device=audio.device)[None, :] < num_samples[:, None]  # (B, L)
        if cfg.preemph:
            audio = torch.cat([audio[:, :1], audio[:, 1:] - cfg.preemph * audio[:, :-1]], dim=1)
        audio = audio.masked_fill(~valid, 0.0)
        spec = torch.stft(
            audio,
            n_fft=cfg.n_fft,
            hop_length=cfg.hop_length,
            win_length=cfg.win_length,
            window=self.window,
            center=True,
            pad_mode="constant",
            return_complex=True,
        )  # (B, n_fft // 2 + 1, T)
        power = torch.view_as_real(spec).pow(2).sum(-1).sqrt().pow(cfg.mag_power)  # NeMo's |X| then ^p: bit-equal
        mel = torch.matmul(self.fb, power)  # (B, n_mels, T)
        logmel = torch.log(mel + cfg.log_zero_guard)
        features = _normalize_per_feature(logmel, frames, cfg.std_guard)
        pad = torch.arange(features.shape[-1], device=audio.device)[None, :] >= frames[:, None]  # (B, T)
        return features.masked_fill(pad[:, None, :], 0.0), frames


def _normalize_per_feature(x: torch.Tensor, frames: torch.Tensor, std_guard: float) -> torch.Tensor:
    """Zero mean, unit std per mel channel over the valid frames (std with N - 1)."""
    valid = (torch.arange(x.shape[-1], device=x.device)[None, :] < frames[:, None])[:, None, :]  # (B, 1, T)
    count = frames[:, None].to(x.dtype)  # (B, 1)
    mean = torch.where(valid, x, 0.0).sum(dim=2) / count  # (B, n_mels)
    var = torch.where(valid, x - mean[:, :, None], 0.0).pow(2).sum(dim=2) / (count - 1.0)
    std = var.sqrt()
    std = std.masked_fill(std.isnan(), 0.0) + std_guard  # one valid frame: N - 1 == 0
    return (x - mean[:, :, None]) / std[:, :, None]
