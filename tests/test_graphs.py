"""The encoder's layer graphs (graphs.LayerGraphs) on the CPU: the weight packing, and the bookkeeping around
the captured layer (slot weights, static input, padding masks, shapes kept), with a stand-in for the CUDA graph
that re-runs what it recorded. The real captures are tested on the GPU (test_gpu.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import NEMO_PATH
from torch import nn

import graphscribe
import graphscribe.model.graphs as graphs
from graphscribe.model.encoder import Padding, relative_positions, run_layers


@pytest.fixture(scope="module")
def model():
    return graphscribe.load_model(NEMO_PATH, device="cpu")


def _batch(model, lengths: list[int], frames: int):
    d = model.cfg.encoder.d_model
    x = torch.randn(len(lengths), frames, d, generator=torch.Generator().manual_seed(frames + len(lengths)))
    padding = Padding(torch.arange(frames)[None, :] < torch.tensor(lengths)[:, None], x.dtype)
    return x, relative_positions(frames, d, x.device, x.dtype), padding


def test_packed_layer_computes_as_before_and_copies_as_one_block(model):
    """The same output bits after packing, and two layers of one structure share the layout, so one copy moves
    every weight of one into the other."""
    first, second = (copy.deepcopy(layer) for layer in model.module.encoder.layers[:2])
    x, pos, padding = _batch(model, [9, 6], 9)
    with torch.inference_mode():
        before = [layer(x, pos, padding, None) for layer in (first, second)]
    flats = [graphs._pack(layer) for layer in (first, second)]
    assert all(flats[0].data_ptr() <= p.data_ptr() < flats[0].data_ptr() + flats[0].nbytes for p in first.parameters())
    with torch.inference_mode():
        assert torch.equal(first(x, pos, padding, None), before[0])
        flats[0].copy_(flats[1])  # the first layer now holds the second's weights
        assert torch.equal(first(x, pos, padding, None), before[1])


class _Replayed:
    """Stands in for torch.cuda.CUDAGraph: replay() runs again what capture recorded, reading the static buffers."""

    def __init__(self):
        self.record = None

    def replay(self):
        self.record()


def _replay_on_the_cpu(monkeypatch) -> None:
    """LayerGraphs on the CPU: `_Replayed` for the CUDA graph, and every batch of full attention applies."""
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Replayed)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(graphs, "capture", lambda graph, record, pool: setattr(graph, "record", record))
    monkeypatch.setattr(graphs.LayerGraphs, "applies", lambda self, x, window: self.enabled and window is None)


def test_layer_graphs_give_the_eager_loops_bits(model, monkeypatch):
    _replay_on_the_cpu(monkeypatch)
    monkeypatch.setattr(graphs.LayerGraphs, "KEEP_SHAPES", 1)  # the newest shape alone is kept
    layers = nn.ModuleList(copy.deepcopy(model.module.encoder.layers[i % 2]) for i in range(5))
    with torch.no_grad():
        for i, layer in enumerate(layers):  # five different layers
            for p in layer.parameters():
                p.add_(0.01 * i * torch.randn_like(p))
    runner = graphs.LayerGraphs(layers)
    batches = [([12, 7], 12), ([12, 10], 12), ([5], 9), ([9, 9, 4], 9), ([12, 3], 12)]  # kept, refreshed, evicted
    for lengths, frames in batches:
        x, pos, padding = _batch(model, lengths, frames)
        with torch.inference_mode():
            expected = run_layers(layers, x, pos, Padding(padding.valid, x.dtype), None)
            got = runner(x, pos, padding, None)
        assert torch.equal(got, expected), (lengths, frames)
    assert list(runner._graphs) == [((2, 12, x.shape[2]), x.dtype)]  # the last shape, made again after others


def test_layer_graphs_share_their_static_buffers(model, monkeypatch):
    """Every shape's input and masks are views of one buffer a name (a larger shape gets a new one), and the
    positions one a length: shapes replayed in turn each give the eager loop's bits, so a replay refreshes what
    the shape before it left in the shared memory."""
    _replay_on_the_cpu(monkeypatch)
    layers = nn.ModuleList(copy.deepcopy(model.module.encoder.layers[i % 2]) for i in range(3))
    runner = graphs.LayerGraphs(layers)
    shapes = [([12, 5, 12], 12), ([9, 4], 9), ([7], 12), ([12, 5, 12], 12), ([9, 9], 9), ([6], 12), ([12, 12, 3], 12)]
    for lengths, frames in shapes:
        x, pos, padding = _batch(model, lengths, frames)
        with torch.inference_mode():
            expected = run_layers(layers, x, pos, Padding(padding.valid, x.dtype), None)
            got = runner(x, pos, padding, None)
        assert torch.equal(got, expected), (lengths, frames)
    kept = {key[0]: graph for key, graph in runner._graphs.items()}
    d = x.shape[2]
    assert set(kept) == {(3, 12, d), (2, 9, d), (1, 12, d)}
    starts = {g.x.data_ptr() for g in kept.values()} | {g.padding.pairs.data_ptr() for g in kept.values()}
    assert len(starts) == 2  # the largest shape came first: one buffer for the inputs, one for the pair masks
    assert kept[(3, 12, d)].pos_emb is kept[(1, 12, d)].pos_emb
    assert kept[(2, 9, d)].pos_emb.shape[0] == 2 * 9 - 1


def test_static_buffers_grow_for_a_larger_shape():
    statics = graphs._Statics()
    small = statics.like("x", torch.zeros(2, 3))
    assert statics.like("x", torch.zeros(3, 2)).data_ptr() == small.data_ptr()  # fits: the same memory
    large = statics.like("x", torch.zeros(7))
    assert large.data_ptr() != small.data_ptr() and statics._flat[("x", torch.float32)].numel() == 12  # twice 6
    assert statics.like("x", torch.zeros(2, dtype=torch.bool)).dtype == torch.bool  # a buffer a dtype


def test_layer_graphs_refresh_packed_rows(model, monkeypatch):
    """A packed batch (`Padding.of_segments`) and an unpacked one of the same shape share a graph: each gets the
    eager loop's bits, so the clips' segments are part of what a replay refreshes."""
    _replay_on_the_cpu(monkeypatch)
    layers = nn.ModuleList(copy.deepcopy(model.module.encoder.layers[i % 2]) for i in range(3))
    runner = graphs.LayerGraphs(layers)
    segments = torch.tensor([[0, 0, 0, 0, 0, -1, -1, -1, -1, 2, 2, 2], [1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1]])
    packed = Padding.of_segments(segments, torch.float32)
    for padding in (packed, _batch(model, [12, 7], 12)[2], packed):
        x, pos, _ = _batch(model, [12, 12], 12)
        with torch.inference_mode():
            fresh = Padding.of_segments(padding.segments, x.dtype)  # no masks made yet
            expected = run_layers(layers, x, pos, fresh, None)
            got = runner(x, pos, padding, None)
        assert torch.equal(got, expected)
    assert len(runner._graphs) == 1
