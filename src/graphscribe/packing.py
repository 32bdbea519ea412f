"""Packed rows: the clips of a batch laid end to end in fewer rows for the encoder's conformer layers.

A server's batch holds requests of every length at once. Padded to the longest, the layers compute every padded
frame; packed, the clips share rows, and `encoder.Padding.of_segments` keeps each clip's attention to its own
frames. The plan is made on the host from lengths the caller knows, and is applied with two gathers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Packing:
    """The clips of a padded batch laid end to end in fewer rows for the conformer layers, and back after.

    A batch of requests comes in every length at once: its rows are padded to the longest, and every layer
    computes every padded frame (32 LibriSpeech-length clips: 2.9 times their frames). Packed, the clips share
    rows of `length` frames (first fit, longest first), `gap` padded frames apart: attention sees only the keys
    of the query's own clip (`Padding.of_segments`), with the same relative positions as in a row of its own, and
    the convolution module reads zeros across the gap, as it does past a clip's end. The other operations work
    frame by frame. So a clip gets the numbers of its own row, up to the rounding of sums over a longer row.
    """

    batch: int  # rows of the padded batch
    padded: int  # frames a row of the padded batch
    rows: int
    length: int  # frames a packed row
    source: torch.Tensor  # (N,) flat frame b * padded + t of each clip frame, clip by clip
    target: torch.Tensor  # (N,) flat frame r * length + u where that frame goes
    segments: torch.Tensor  # (rows, length) the clip (its row in the batch) of each frame, -1 for gaps and padding

    # packs a batch only when the packed rows hold at most this share of the padded batch's frames: below that
    # the gathers and the changed rounding buy too little
    MAX_SHARE = 0.8
    ALIGN = 16  # frames: a row's length is a multiple of it, so that batches of nearby lengths share one shape

    @classmethod
    def plan(cls, frames: list[int], padded: int, gap: int, device: torch.device) -> "Packing | None":
        """Clips of `frames` encoder frames each (rows of a batch `padded` frames wide), or None when they would
        not save enough (`MAX_SHARE`)."""
        longest = max(frames, default=0)
        if len(frames) < 2 or longest == 0:
            return None
        length = -(-longest // cls.ALIGN) * cls.ALIGN
        used: list[int] = []  # frames taken in each packed row, gaps included
        row_of, offset_of = [0] * len(frames), [0] * len(frames)
        for i in sorted(range(len(frames)), key=lambda i: -frames[i]):
            need = frames[i]
            for r, taken in enumerate(used):
                if taken + gap + need <= length:
                    row_of[i], offset_of[i] = r, taken + gap
                    used[r] = taken + gap + need
                    break
            else:
                row_of[i], offset_of[i] = len(used), 0
                used.append(need)
        if len(used) * length > cls.MAX_SHARE * len(frames) * padded:
            return None
        counts = np.asarray(frames, dtype=np.int64)
        clip = np.repeat(np.arange(len(frames)), counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        source = clip * padded + within
        target = np.asarray(row_of)[clip] * length + np.asarray(offset_of)[clip] + within
        segments = np.full(len(used) * length, -1, dtype=np.int64)
        segments[target] = clip
        # one copy to the device for all three
        flat = torch.from_numpy(np.concatenate([source, target, segments])).to(device, non_blocking=True)
        n = len(source)
        segments_2d = flat[2 * n :].view(len(used), length)
        return cls(len(frames), padded, len(used), length, flat[:n], flat[n : 2 * n], segments_2d)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """(B, padded, D) -> (rows, length, D), zeros between the clips."""
        d = x.shape[-1]
        packed = x.new_zeros(self.rows * self.length, d)
        packed.index_copy_(0, self.target, x.reshape(-1, d).index_select(0, self.source))
        return packed.view(self.rows, self.length, d)

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """(rows, length, D) -> (B, padded, D), zeros on the padded frames."""
        d = y.shape[-1]
        out = y.new_zeros(self.batch * self.padded, d)
        out.index_copy_(0, self.source, y.reshape(-1, d).index_select(0, self.target))
        return out.view(self.batch, self.padded, d)
