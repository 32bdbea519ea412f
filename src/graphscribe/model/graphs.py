"""CUDA graphs: decode steps and encoder layers captured once and replayed.

`CapturedSteps` records `steps` consecutive calls of a step function (which reads and
writes only static buffers) into one `torch.cuda.CUDAGraph`, after a warm-up on a side
stream. Replaying it launches the whole sequence of kernels with one call, instead of a
few dozen launches per step. The graphs of one decoder share one memory pool.
`LayerGraphs` runs the encoder's layer stack from one captured layer, `FeatureGraphs` the features of packed rows
(see there).
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections import OrderedDict
from typing import Callable

import torch
from torch import nn

from graphscribe.model.encoder import Padding, run_layers
from graphscribe.model.features import LogMel, PackedClips

log = logging.getLogger(__name__)

_WARMUP_CALLS = 2  # eager calls on a side stream before capture (cuBLAS/cuDNN workspaces, lazy init)


def capture(graph: torch.cuda.CUDAGraph, record: Callable[[], None], pool) -> None:
    """Record the kernels `record()` launches into `graph`, its memory from `pool`.

    Not `torch.cuda.graph`, which empties the allocator's device and pinned-host caches at every capture (the
    readers' pinned buffers then cost cudaHostAlloc calls again). thread_local: the reader threads may pin host
    memory meanwhile.
    """
    stream = _capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
        try:
            record()
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)


@functools.cache
def _capture_stream() -> torch.cuda.Stream:
    return torch.cuda.Stream()


def pool_of(live: list["CapturedSteps"]):
    """The memory pool of a live graph, or a new one: a pool dies with the last graph that uses it."""
    return live[0].graph.pool() if live else torch.cuda.graph_pool_handle()


def step_runner(owner, key, one: Callable[[], None], steps: int, restore: Callable[[], None], warm_up: bool, what: str):
    """`steps` calls of `one` as one callable, for a decoder's loop (the greedy one and the beam search): the replay
    of a graph captured on first use, after eager warm-up calls and `restore()` (`warm_up=False` captures again in
    the middle of a decode, its buffers regrown, leaving the state as it is); should capturing fail, eager calls,
    one warning, and `owner.graphs` off. `owner` keeps the graphs by `key` (`_captured`) and `capture_seconds`."""
    captured = owner._captured.get(key)
    if captured is None:
        try:
            pool = pool_of(list(owner._captured.values()))
            captured = CapturedSteps(one, steps, pool, before_capture=restore, warm_up=warm_up)
        except RuntimeError as err:  # capture is an optimisation: decode eagerly rather than fail
            log.warning("CUDA graph capture failed (%s); %s eagerly", str(err).splitlines()[0], what)
            owner.graphs = False
            if warm_up:
                restore()
            return eager_steps(one, steps)
        owner.capture_seconds += captured.capture_seconds
        owner._captured[key] = captured
    return captured.replay


def eager_steps(one: Callable[[], None], steps: int) -> Callable[[], None]:
    def eager() -> None:
        for _ in range(steps):
            one()

    return eager


class CapturedSteps:
    """`steps` calls of `step()` captured once; `replay()` runs them again on the current stream."""

    def __init__(
        self,
        step: Callable[[], None],
        steps: int,
        pool,
        before_capture: Callable[[], None] | None = None,
        warm_up: bool = True,
    ):
        start = time.perf_counter()
        if warm_up:  # not needed again once the step ran in this process (capturing runs nothing)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(_WARMUP_CALLS):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            if before_capture is not None:
                before_capture()  # the warm-up wrote to the buffers: let the owner put them back
        self.graph = torch.cuda.CUDAGraph()

        def record():
            for _ in range(steps):
                step()

        capture(self.graph, record, pool)
        torch.cuda.synchronize()
        self.steps = steps
        self.capture_seconds = time.perf_counter() - start

    def replay(self) -> None:
        self.graph.replay()


class _Shapes:
    """Graphs kept by a key of their shape, the most recently used up to `KEEP_SHAPES`: their static buffers views
    of one set (`_Statics`), their memory one pool, the seconds spent capturing them summed."""

    # Captured shapes are kept, most recently used, up to KEEP_SHAPES: a server's batches come in many shapes (rows
    # x padded length; its warm-up captures every packed shape of up to 36 s, ~220), and a shape dropped is captured
    # again when it comes back. Their static buffers are views of one set (`_Statics`), so a shape kept costs its
    # graph, not its own copy of a batch's input and masks (~2 GB for those ~220).
    KEEP_SHAPES = 512

    def __init__(self):
        self._graphs: OrderedDict[tuple, object] = OrderedDict()
        self._statics = _Statics()
        self._pool = None
        self.enabled = True
        self.capture_seconds = 0.0  # summed over the captures so far

    def _kept(self, key: tuple):
        graph = self._graphs.get(key)
        if graph is not None:
            self._graphs.move_to_end(key)
        return graph

    def _keep(self, key: tuple, make: Callable[["_Statics", object], object]):
        """`make(statics, pool)`, a new graph of the shape `key`, timed and kept."""
        start = time.perf_counter()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = make(self._statics, self._pool)
        self.capture_seconds += time.perf_counter() - start
        self._graphs[key] = graph
        while len(self._graphs) > self.KEEP_SHAPES:
            self._graphs.popitem(last=False)
        return graph

    def release(self) -> None:
        """Drop the captured graphs and their memory (out of memory elsewhere)."""
        self._graphs.clear()
        self._statics = _Statics()
        self._pool = None


class LayerGraphs(_Shapes):
    """The encoder's layer stack from one captured layer, replayed once a layer with that layer's weights.

    A small batch's encoder waits on its host: each layer is about 80 kernel launches, 24 layers a few thousand
    per batch, which take longer to launch than the GPU takes to run them. The layers all have one structure, so
    one graph of one layer serves them all: `slot`, a copy of layer 0 whose weights are static buffers, is captured
    once per batch shape (after layer 0 has run eagerly on that shape: its cuBLAS and cuDNN plans exist, and
    its work is the batch's own); every later layer copies its weights into the slot and replays the graph, and a
    later batch of that shape replays it for every layer, the first one too. Each
    layer's weights are packed into one buffer (`_pack`), so that copy is one block.
    The same kernels on the same shapes and the same values as the eager loop: the output is bit-equal to it.

    Only for full attention, and in float32 on batches of at most `MAX_FRAMES` encoder frames: there the launches
    bound the encoder (replayed, 8 clips of 4 s take about 60% of their eager time on an H100), while on larger
    batches the GPU is the bottleneck and copying every layer's weights costs more than the launches save. In 16
    bits on every batch: the encoder alone runs about 2% slower replayed, but the host, which launches the next
    batch's work while the GPU runs this one, is the tighter limit of a whole run, and replays free it (a folder in
    bfloat16 runs about 8% faster). The graphs kept share one memory pool; replays run in stream order, and what
    one layer hands the next lives in the static input, outside the pool.
    """

    # batch x encoder frames at most, by bytes per element (None: any); 16-bit products are ~4x faster
    MAX_FRAMES = {4: 768, 2: None}

    def __init__(self, layers: nn.ModuleList):
        super().__init__()
        self.layers = layers
        # packed at the first batch that applies (`_pack_layers`): (N,) a layer, the captured layer and its (N,)
        self._weights: list[torch.Tensor] | None = None
        self.slot: nn.Module | None = None
        self._slot_weights: torch.Tensor | None = None
        self._positions: dict[tuple, torch.Tensor] = {}  # (T, dtype) -> (2T - 1, D): a length's, for its shapes

    def applies(self, x: torch.Tensor, window: tuple[int, int] | None) -> bool:
        frames = x.shape[0] * x.shape[1]
        if not (self.enabled and window is None and x.is_cuda and x.element_size() in self.MAX_FRAMES):
            return False
        limit = self.MAX_FRAMES[x.element_size()]
        return limit is None or frames <= limit

    def __call__(
        self, x: torch.Tensor, pos_emb: torch.Tensor, padding: Padding, window: tuple[int, int] | None
    ) -> torch.Tensor:
        """x (B, T, D) after subsampling, pos_emb (2T - 1, D), the batch's `Padding` -> (B, T, D) after every layer."""
        if not self.applies(x, window):
            return run_layers(self.layers, x, pos_emb, padding, window)
        if self._weights is None:
            self._pack_layers()
        graph = self._kept((tuple(x.shape), x.dtype))  # layers keep their input's shape: the first one's is every one's
        if graph is not None:  # a shape seen before: every layer from its graph, the first one too
            graph.refresh(padding)
            graph.x.copy_(x)
            return self._replay(graph, self._weights)
        x = self.layers[0](x, pos_emb, padding, None)  # eager: the batch's first layer, and warm-up for the capture
        try:
            graph = self._capture(x, pos_emb, padding)
        except RuntimeError as err:  # capture is an optimisation: run the rest eagerly rather than fail
            log.warning(
                "CUDA graph capture of the encoder layer failed (%s); running it eagerly", str(err).splitlines()[0]
            )
            self.release()
            self.enabled = False
            return run_layers(self.layers[1:], x, pos_emb, padding, None)
        graph.x.copy_(x)
        return self._replay(graph, self._weights[1:])

    def _replay(self, graph: "_LayerGraph", weights: list[torch.Tensor]) -> torch.Tensor:
        for w in weights:
            self._slot_weights.copy_(w)
            graph.graph.replay()
        return graph.x.clone()  # the static buffer is the next batch's input

    def _pack_layers(self) -> None:
        """Every layer's weights packed into one buffer, and `slot`, the layer that is captured (its own copy)."""
        with torch.inference_mode(False):  # the layers' own parameters stay normal tensors
            self._weights = [_pack(layer) for layer in self.layers]
            self.slot = copy.deepcopy(self.layers[0])
            self._slot_weights = _pack(self.slot)

    def release(self) -> None:
        super().release()
        self._positions.clear()

    def _capture(self, x: torch.Tensor, pos_emb: torch.Tensor, padding: Padding) -> "_LayerGraph":
        """A graph of `slot` for x's shape, after the eager first layer has made x and the masks the layer reads."""
        positions = self._positions.get((x.shape[1], x.dtype))
        if positions is None:
            positions = self._positions[(x.shape[1], x.dtype)] = pos_emb.clone()
        return self._keep(
            (tuple(x.shape), x.dtype),
            lambda statics, pool: _LayerGraph(self.slot, x, positions, padding, statics, pool),
        )


class FeatureGraphs(_Shapes):
    """The log-mel features of packed rows (`features.PackedClips`), captured once per shape and replayed.

    A packed batch's features are about 130 small operations (a few per stretch of `FIXED_FRAMES` frames, then the
    clips' normalisation): on an H200 a 32-row server batch takes 3.6 ms of the host's time to launch them and
    1.5 ms of the GPU's to run them, so the GPU waits on the host, and the encoder's launches after them start
    late. Replayed, they are a few copies into static buffers and one launch. The first batch of a shape runs
    eagerly (cuFFT's and cuBLAS's plans are then made, outside the capture), and the shape is captured after it
    (a server's warm-up meets every packed shape); later batches of the shape replay it: the same kernels on the
    same shapes, bit-equal to the eager features. The captured STFT runs cuFFT plans from PyTorch's plan cache,
    which keeps thousands; the shapes use a few each.

    A shape is the packed rows and their samples, and the clips rounded up to a power of two, at least
    `MIN_CLIPS`: the spans of the clips beyond the batch's are empty, and no frame reads their sums, so a server's
    batches of any number of clips share the graph of their rows. The graphs' static buffers are views of one set
    (`_Statics`), and each graph's output is copied into one of them and cloned out, so the graphs' own memory pool
    holds only what one batch needs at a time.
    """

    MIN_CLIPS = 64  # a server's largest batch: its batches of 2-64 clips share one graph a row shape

    def __init__(self, featurizer: LogMel):
        super().__init__()
        self.featurizer = featurizer

    def __call__(self, packed: torch.Tensor, clips: PackedClips, replay: bool = True) -> torch.Tensor:
        """(R, W) float32 packed samples and their clips -> (R, n_mels, T) features, as `featurizer` computes them
        (replay=False, or not on CUDA: eagerly)."""
        if not (replay and self.enabled and packed.is_cuda):
            return self._eager(packed, clips)
        clip_slots = max(self.MIN_CLIPS, 1 << (clips.spans.shape[1] - 1).bit_length())
        key = (tuple(packed.shape), clip_slots)
        graph = self._kept(key)
        if graph is not None:
            return graph.replay(packed, clips)
        features = self._eager(packed, clips)  # makes the plans the capture then uses
        try:
            self._keep(
                key, lambda statics, pool: _FeatureGraph(self.featurizer, packed, clips, clip_slots, statics, pool)
            )
        except RuntimeError as err:  # capture is an optimisation: compute eagerly rather than fail
            log.warning(
                "CUDA graph capture of the features failed (%s); computing them eagerly", str(err).splitlines()[0]
            )
            self.release()
            self.enabled = False
        return features

    def _eager(self, packed: torch.Tensor, clips: PackedClips) -> torch.Tensor:
        return self.featurizer(packed, _row_samples(packed), packed=clips)[0]


class _FeatureGraph:
    """The features of one packed shape captured: static samples, clip masks and spans in, features out (filled at
    each replay: capturing runs nothing)."""

    def __init__(
        self, featurizer: LogMel, packed: torch.Tensor, clips: PackedClips, clip_slots: int, statics: "_Statics", pool
    ):
        self.audio = statics.like("audio", packed)
        self.samples = statics.like("samples", clips.samples)
        self.frames = statics.like("frames", clips.frames)
        self.spans = statics.like("spans", clips.spans.new_empty(3, clip_slots))
        rows = self._rows = _row_samples(packed)  # read by the graph
        total = packed.shape[1] // featurizer.cfg.hop_length + 1
        self.out = statics.like("out", packed.new_empty(packed.shape[0], featurizer.cfg.n_mels, total))
        static = PackedClips(self.samples, self.frames, self.spans)
        self.graph = torch.cuda.CUDAGraph()
        capture(self.graph, lambda: self.out.copy_(featurizer(self.audio, rows, packed=static)[0]), pool)

    def _fill(self, packed: torch.Tensor, clips: PackedClips) -> None:
        self.audio.copy_(packed)
        self.samples.copy_(clips.samples)
        self.frames.copy_(clips.frames)
        used = clips.spans.shape[1]
        self.spans[:, :used].copy_(clips.spans)
        self.spans[:, used:].zero_()  # empty clips: row 0, frames 0 to 0

    def replay(self, packed: torch.Tensor, clips: PackedClips) -> torch.Tensor:
        self._fill(packed, clips)
        self.graph.replay()
        return self.out.clone()  # the static buffer is the next batch's


def _row_samples(packed: torch.Tensor) -> torch.Tensor:
    """(R,) the samples of each packed row: all of them (the clips' own are masked, `PackedClips.samples`)."""
    return torch.full((packed.shape[0],), packed.shape[1], device=packed.device)


class _Statics:
    """The static buffers of every captured shape: by name, views of one buffer from its start. Replays run one
    after another in stream order, each after its own input and masks are copied in (`_LayerGraph.refresh`), so
    the shapes can share the memory. A larger shape gets a new buffer, at least twice the old one (the graphs
    captured on the old one keep theirs): a server's warm-up captures its largest shapes first."""

    def __init__(self):
        self._flat: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def like(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """An uninitialised view shaped as t, in the buffer `name` of t's dtype."""
        key = (name, t.dtype)
        flat = self._flat.get(key)
        if flat is None or flat.numel() < t.numel():
            size = t.numel() if flat is None else max(t.numel(), 2 * flat.numel())
            flat = self._flat[key] = torch.empty(size, dtype=t.dtype, device=t.device)
        return flat[: t.numel()].view(t.shape)


class _LayerGraph:
    """One layer captured for one batch shape: static input/output `x` and padding masks (views of `_Statics`),
    and the positions of its length (`LayerGraphs._positions`)."""

    def __init__(
        self, slot: nn.Module, x: torch.Tensor, positions: torch.Tensor, padding: Padding, statics: _Statics, pool
    ):
        self.x = statics.like("x", x)  # (B, T, D): the layer's input, overwritten with its output
        self.pos_emb = positions
        self.padding = Padding(statics.like("valid", padding.valid), padding.dtype)
        for name, mask in _masks(padding).items():  # made by the eager layer: every mask the layer reads
            self.padding.__dict__[name] = statics.like(name, mask)
        self.refresh(padding)
        self.graph = torch.cuda.CUDAGraph()
        capture(self.graph, lambda: self.x.copy_(slot(self.x, self.pos_emb, self.padding, None)), pool)

    def refresh(self, padding: Padding) -> None:
        self.padding.valid.copy_(padding.valid)
        for name, mask in _masks(self.padding).items():
            mask.copy_(getattr(padding, name))


def _masks(padding: Padding) -> dict[str, torch.Tensor]:
    """The padding masks made so far (cached properties), by name."""
    return {name: value for name, value in vars(padding).items() if isinstance(value, torch.Tensor) and name != "valid"}


_ALIGN_BYTES = 512  # where each tensor of a packed module starts, as the allocator's blocks do


def _pack(module: nn.Module) -> torch.Tensor:
    """Move a module's floating-point parameters and buffers into one flat buffer, each a view of it with the same
    values (the module computes exactly as before): its weights then copy as one block, not one copy a tensor.
    Two modules of one structure get one layout."""
    tensors = [t for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]
    if len({t.dtype for t in tensors}) != 1:
        raise ValueError(f"one dtype expected, got {sorted({str(t.dtype) for t in tensors})}")
    align = _ALIGN_BYTES // tensors[0].element_size()
    sizes = [-(-t.numel() // align) * align for t in tensors]
    flat = torch.empty(sum(sizes), dtype=tensors[0].dtype, device=tensors[0].device)
    offset = 0
    for t, size in zip(tensors, sizes):
        view = flat[offset : offset + t.numel()].view(t.shape)
        view.copy_(t)
        t.data = view
        offset += size
    return flat
