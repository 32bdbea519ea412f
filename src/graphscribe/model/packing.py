"""Packed rows: the clips of a batch laid end to end in fewer rows for the encoder's conformer layers.

A server's batch holds requests of every length at once. Padded to the longest, the layers compute every padded
frame; packed, the clips share rows, and `encoder.Padding.of_segments` keeps each clip's attention to its own
frames. The plan is made on the host from lengths the caller knows, and is applied with two gathers. A plan can
also lay out a batch's samples (`front`, `pack_samples`), so that the features and the subsampling run on the
packed rows too: the front end then computes the clips' samples, not the padding (a server's 32 requests pad to
2.9 times their audio).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PackedFront:
    """A batch whose features and subsampling run on packed rows too (`Model.front_packing`, `Packing.front`):
    1 + the clip of each position (0 between clips) of the samples and of the STFT frames, and masks of a clip's
    frames after each stride-2 convolution (`Subsampling.forward`'s `valid`)."""

    packing: "Packing"
    samples: list[int]  # each clip's
    sample_ids: torch.Tensor  # (R, length x hop x factor) int32
    frame_ids: torch.Tensor  # (R, T) int32
    spans: torch.Tensor  # (3, B) int64: each clip's row, first STFT frame and end frame (`features.PackedClips`)
    valid: list[torch.Tensor]  # (R, T_k) bool, one a stride: the frames that are a clip's
    sample_starts: torch.Tensor  # (B,) int64: each clip's first sample, flat over the rows


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
    row_of: list[int]  # each clip's packed row
    offset_of: list[int]  # each clip's first frame in its packed row

    # packs a batch only when the packed rows hold at most this share of the padded batch's frames: below that
    # the gathers and the changed rounding buy too little
    MAX_SHARE = 0.8
    # frames: a row's length is a multiple of it, so that batches of nearby lengths share one shape (each new one
    # costs a capture of the layer graph and first uses). A longer row holds more clips, so a coarse step costs
    # little padding: a server's batches of 30-55 LibriSpeech-like requests pack to about 1.09 times their frames
    # in rows of 64 as in rows of 16, in fewer than half as many shapes, and the server runs 2-4% faster for it.
    ALIGN = 64

    @classmethod
    def plan(cls, frames: list[int], padded: int, gap: int, device: torch.device) -> "Packing | None":
        """Clips of `frames` encoder frames each (rows of a batch `padded` frames wide), or None when they would
        not save enough (`MAX_SHARE`)."""
        longest = max(frames, default=0)
        if len(frames) < 2 or longest == 0:
            return None
        length = -(-longest // cls.ALIGN) * cls.ALIGN
        shortest = sorted(frames)[:2]
        if shortest[0] + gap + shortest[1] > length and length > cls.MAX_SHARE * padded:
            return None  # no two clips share a row (a batch of like lengths, the CLI's): nothing to lay out
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
        flat = _to_device(np.concatenate([source, target, segments]), device)
        n = len(source)
        segments_2d = flat[2 * n :].view(len(used), length)
        return cls(len(frames), padded, len(used), length, flat[:n], flat[n : 2 * n], segments_2d, row_of, offset_of)

    def front(self, samples: list[int], hop: int, factor: int, device: torch.device) -> "PackedFront":
        """Where the clips of `samples` samples each lie in these rows at every stage of the front end (`hop`
        samples a feature frame, `factor` feature frames an encoder frame), made on the device from one copy of
        their starts and ends (difference arrays, summed along the rows)."""
        row_of, offset_of, n = (np.asarray(v, dtype=np.int64) for v in (self.row_of, self.offset_of, samples))
        width = self.length * hop * factor
        levels = [(hop * factor, n, width)]  # samples
        counts, width = n // hop, width // hop + 1  # STFT frames (center=True), a clip's valid ones
        levels.append((factor, counts, width))
        for k in range(1, factor.bit_length()):  # after each stride-2 convolution
            counts, width = (counts + 2 - 3) // 2 + 1, (width + 2 - 3) // 2 + 1
            levels.append((factor >> k, counts, width))
        parts = []
        for scale, counts, width in levels:
            starts = row_of * width + offset_of * scale
            parts += [starts, np.minimum(starts + counts, row_of * width + width)]
        first = offset_of * factor
        parts += [row_of, first, first + n // hop]
        flat = _to_device(np.concatenate(parts), device)
        b = self.batch
        change = torch.arange(1, b + 1, dtype=torch.int32, device=device)
        change = torch.cat([change, -change])
        ids = []
        for k, (_, _, width) in enumerate(levels):
            delta = torch.zeros(self.rows * width + 1, dtype=torch.int32, device=device)
            delta.scatter_add_(0, flat[2 * k * b : 2 * (k + 1) * b], change)  # integers: any order, the same sums
            ids.append(delta[:-1].cumsum(0, dtype=torch.int32).view(self.rows, width))
        spans = flat[2 * len(levels) * b :].view(3, b)
        return PackedFront(self, samples, ids[0], ids[1], spans, [i > 0 for i in ids[1:]], flat[:b])

    def pack_samples(self, audio: torch.Tensor, front: "PackedFront") -> torch.Tensor:
        """(B, L) padded samples -> (rows, W) with each clip at its place in `front`'s layout, zeros elsewhere."""
        flat = front.sample_ids.view(-1).long()
        clip = (flat - 1).clamp(min=0)
        place = torch.arange(flat.numel(), device=audio.device) - front.sample_starts[clip]
        source = (clip * audio.shape[1] + place).clamp(0, audio.numel() - 1)
        return (audio.reshape(-1)[source] * (flat > 0)).view(front.sample_ids.shape)

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


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device` without the host waiting for the device's queued work: a copy from pageable memory
    waits for the stream (and so holds up the next batch's launches), one from pinned memory is queued."""
    host = torch.from_numpy(array)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
