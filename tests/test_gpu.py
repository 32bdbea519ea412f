"""GPU tests: CUDA-graph decoding and encoding give NeMo's tokens and exactly what eager code gives.

Marked `gpu`: skipped without CUDA. On the lent GPU: `pytest -m gpu tests/test_gpu.py`.
A 0.6b-v3-shaped checkpoint for the real-speech tests is named by GRAPHSCRIBE_TEST_V3
(made by `scripts/make_checkpoint.py parakeet-tdt-0.6b-v3 OUT --calibrate ...`).
"""

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import graphscribe as gs
from graphscribe.io.audio import speech_path

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

FIXTURES = Path(__file__).parent / "fixtures"
ORACLES = [
    ("nemo-tdt-tiny", "tdt-tiny.nemo"),
    ("nemo-rnnt-tiny", "rnnt-tiny.nemo"),
    ("nemo-tdt-tiny-80mel", "tdt-tiny-80mel.nemo"),
]
CLIPS = FIXTURES / "nemo-tdt-tiny" / "clips"
# silence_1s is +-1 LSB of noise: its log-mel features, normalised by a standard deviation near the 1e-5 guard, carry
# float32 rounding of up to 0.06 (against 2e-5 on speech: float32 against float64 on the CPU), so the GPU's rounding
# moves the near ties that an LM, boosting and the beam's scores compare on it. The CPU tests hold it to NeMo's bits.
DEVICE_BOUND = {"silence_1s"}


def _reference(name):
    return json.loads((FIXTURES / name / "reference.json").read_text())


def _result(transcripts):
    return [(t.token_ids, t.frames, t.text) for t in transcripts]


@pytest.mark.parametrize("name,checkpoint", ORACLES)
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("batch", [1, 6])
def test_float32_matches_nemo_on_gpu(name, checkpoint, graphs, batch):
    ref = _reference(name)
    model = gs.load_model(FIXTURES / name / checkpoint, device="cuda", dtype="float32", graphs=graphs)
    got = model.transcribe([CLIPS / c["file"] for c in ref["clips"]], batch_size=batch)
    assert _result(got) == [(c["token_ids"], c["timestamps"], c["text"]) for c in ref["clips"]]
    if graphs:
        assert model.decoder.capture_seconds > 0  # the graph path really ran


@pytest.mark.parametrize("name,checkpoint", ORACLES)
@pytest.mark.parametrize("rows", [64, 128])
def test_tall_tiles_match_nemo_on_gpu(name, checkpoint, rows):
    """Batches of 64 and 128 rows decode in the taller tiles of `fused_step.TALL` (the clips repeated)."""
    clips = _reference(name)["clips"]
    clips = [clips[i % len(clips)] for i in range(rows)]
    model = gs.load_model(FIXTURES / name / checkpoint, device="cuda", dtype="float32")
    got = model.transcribe([CLIPS / c["file"] for c in clips], batch_size=rows)
    assert _result(got) == [(c["token_ids"], c["timestamps"], c["text"]) for c in clips]
    assert model.decoder._fused_step.tiles_for(rows).rows == rows


@pytest.mark.parametrize("name,checkpoint", ORACLES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphs_equal_eager(name, checkpoint, dtype):
    paths = sorted(CLIPS.glob("*.wav"))
    results = {}
    for graphs in (False, True):
        model = gs.load_model(FIXTURES / name / checkpoint, device="cuda", dtype=dtype, graphs=graphs)
        results[graphs] = [_result(model.transcribe(paths, batch_size=b)) for b in (1, 4)]
    assert results[True] == results[False]


def test_capture_failure_falls_back_to_eager(monkeypatch, caplog):
    ref = _reference("nemo-tdt-tiny")

    class Broken:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("capture refused for the test")

    import graphscribe.model.graphs

    monkeypatch.setattr(graphscribe.model.graphs, "CapturedSteps", Broken)
    model = gs.load_model(FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo", device="cuda", dtype="float32", graphs=True)
    with caplog.at_level(logging.WARNING, logger="graphscribe"):
        # batch 1: the silent clip's features are ill-conditioned enough that cuFFT's rounding for another
        # padded length flips a token (NeMo alike); this test is about the fallback, not padding.
        got = model.transcribe([CLIPS / c["file"] for c in ref["clips"]], batch_size=1)
    assert [t.token_ids for t in got] == [c["token_ids"] for c in ref["clips"]]
    assert sum("capture failed" in r.message for r in caplog.records) == 1  # warned once
    assert model.decoder.graphs is False


def test_buffers_grow_and_graphs_are_recaptured():
    ref = {c["file"]: c for c in _reference("nemo-tdt-tiny")["clips"]}
    model = gs.load_model(FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo", device="cuda", dtype="float32", graphs=True)
    short = model.transcribe([CLIPS / "short_2s.wav"])[0]
    first_capacity = model.decoder._buffers[1].max_frames
    long = torch.cat([model.read(CLIPS / "librispeech_2086-149220-0033.wav")] * 10)  # 74 s: outgrows the buffers
    model.transcribe([long])
    assert model.decoder._buffers[1].max_frames > first_capacity
    again = model.transcribe([CLIPS / "short_2s.wav"])[0]
    assert short.token_ids == again.token_ids == ref["short_2s.wav"]["token_ids"]


V3 = os.environ.get("GRAPHSCRIBE_TEST_V3")


@pytest.mark.skipif(not V3, reason="set GRAPHSCRIBE_TEST_V3 to a 0.6b-v3-shaped .nemo")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_real_speech_graphs_equal_eager_v3(dtype):
    speech = [speech_path(name) for name in ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac")]
    results = {}
    model = gs.load_model(V3, device="cuda", dtype=dtype)
    audio = [model.read(p) for p in speech]
    inputs = audio + [torch.cat(audio * 3), audio[0][: 3 * 16000]]  # 7.4 s, 11 s, 55 s, 3 s
    for graphs in (False, True):
        model.use_graphs(graphs)
        results[graphs] = [_result(model.transcribe(inputs, batch_size=b)) for b in (1, 8)]
        assert all(len(ids) > 0 for ids, _, _ in results[graphs][0])
    assert results[True] == results[False]
    if dtype == "float32":  # bfloat16 matrix products round differently for other batch shapes
        assert results[True][0] == results[True][1]  # batched == serial


@pytest.mark.skipif(not V3, reason="set GRAPHSCRIBE_TEST_V3 to a 0.6b-v3-shaped .nemo")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_front_end_stays_near_each_clip_alone_v3(dtype, monkeypatch):
    """Clips of mixed lengths with their features and subsampling on packed rows (`Model.front_packing`; in 16 bits
    the fused first convolution, then a mask by frame): each clip's encoder output against the clip alone, as near
    as the same batch with its front end padded (float32: packing forced, to float32's rounding)."""
    monkeypatch.setattr(gs.Model, "packs_rows", property(lambda self: True))
    model = gs.load_model(V3, device="cuda", dtype=dtype)
    clip = model.read(speech_path("librispeech_2086-149220-0033.wav"))
    audio = [torch.cat([clip, clip])[: n * 16000] for n in (14, 3, 2, 5, 1)]
    samples = [a.numel() for a in audio]
    batch = torch.zeros(len(audio), max(samples))
    for i, a in enumerate(audio):
        batch[i, : a.numel()] = a
    lengths = torch.tensor(samples)

    def distances(encoded):
        out = []
        for i, a in enumerate(audio):
            alone, frames = model.encode([a])
            n = int(frames[0])
            out.append(((encoded[i, :n] - alone[0, :n]).float().norm() / alone[0, :n].float().norm()).item())
        return out

    with torch.inference_mode():
        front = model.front_packing(samples, batch.shape[1], None)
        assert front is not None and front.packing.rows < len(audio)
        packed, _ = model.encoder_output(*model.batch_features(batch, lengths, front), None, samples, front)
        padded, _ = model.encoder_output(*model.batch_features(batch, lengths), None, samples)
        packed_distances, padded_distances = distances(packed), distances(padded)
    if dtype == "float32":
        assert max(packed_distances) < 1e-4
    else:
        assert max(packed_distances) < max(0.02, 1.5 * max(padded_distances))


def test_packed_features_replay_bit_equal_to_eager():
    """`graphs.FeatureGraphs`: the first batch of a packed shape runs eagerly and captures the shape; later batches
    of that shape, of other clips and other numbers of them, replay it (its inputs refilled each time), bit-equal
    to their eager features."""
    model = gs.load_model(FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo", device="cuda", dtype="bfloat16", graphs=True)
    clip = model.read(speech_path("librispeech_2086-149220-0033.wav"))
    speech = torch.cat([clip, clip.flip(0)])
    shapes, outputs = set(), []
    for seconds in ([7, 2, 2, 1.5], [7, 3, 1, 1], [6.5, 2.5, 1, 1, 1]):
        audio = [speech[1000 * k :][: int(s * 16000)] for k, s in enumerate(seconds)]  # each clip its own
        samples = [a.numel() for a in audio]
        batch = torch.zeros(len(audio), max(samples))
        for i, a in enumerate(audio):
            batch[i, : a.numel()] = a
        with torch.inference_mode():
            front = model.front_packing(samples, batch.shape[1], None)
            shapes.add((front.packing.rows, front.packing.length))
            model.use_graphs(True)
            replayed, _ = model.batch_features(batch, torch.tensor(samples), front)
            model.use_graphs(False)
            eager, _ = model.batch_features(batch, torch.tensor(samples), front)
        outputs.append(replayed)
        assert torch.equal(replayed, eager), seconds
    assert len(shapes) == 1 and len(model._feature_graphs._graphs) == 1
    assert not torch.equal(outputs[1], outputs[2][:, :, : outputs[1].shape[2]])


def test_demo_cli_graphs_on_and_off_print_the_same_bytes():
    """The bundled demo model through the real CLI on the GPU: --graphs and --no-graphs, batched."""
    heldout = FIXTURES / "demo-heldout"
    outputs = {}
    for flag in ("--graphs", "--no-graphs"):
        done = subprocess.run(
            [sys.executable, "-m", "graphscribe.cli", str(heldout), "--batch", "4", "--device", "cuda", flag],
            capture_output=True,
            env={**os.environ, "GRAPHSCRIBE_MODEL": "demo"},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr.decode()
        outputs[flag] = done.stdout
    assert outputs["--graphs"] == outputs["--no-graphs"]
    assert len(outputs["--graphs"].splitlines()) == len(list(heldout.glob("*.wav")))


def test_partial_batch_replays_the_graph_of_its_size_class():
    ref = _reference("nemo-tdt-tiny")
    paths = [CLIPS / c["file"] for c in ref["clips"]]
    model = gs.load_model(FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo", device="cuda", dtype="float32", graphs=True)
    model.transcribe(paths[:4], batch_size=4)
    first = dict(model.decoder._captured)
    got = model.transcribe(paths[:3], batch_size=3)  # 3 rows run in the 4-row graph, the spare row empty
    assert list(first) == [4] and model.decoder._captured == first
    assert list(model.decoder._restarts) == [4]  # the restart graph too: its static lengths hold the spare row's 0
    assert [t.token_ids for t in got] == [c["token_ids"] for c in ref["clips"][:3]]


@pytest.mark.parametrize("fused", [True, False])
def test_token_slots_grow_under_graphs(monkeypatch, fused):
    """Buffers with one token slot a frame, on clips that emit more: the graph is captured again mid-decode."""
    import graphscribe.model.decoding
    from graphscribe.model.decoding import GreedyDecoder

    monkeypatch.setattr(graphscribe.model.decoding, "frame_capacity", lambda frames: frames)
    ref = {c["file"]: c for c in _reference("nemo-tdt-tiny")["clips"]}
    model = gs.load_model(FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo", device="cuda", dtype="float32")
    names = ["silence_1s.wav", "quarter_second.wav"]  # 13 frames, 17 tokens; 4 frames, 12 tokens
    encoded, lengths = model.encode([model.read(CLIPS / f) for f in names])
    decoder = GreedyDecoder(model.module.decoder, model.module.joint, model.cfg.decoding, graphs=True, fused=fused)
    hyps = decoder.decode(encoded, lengths)
    assert decoder._buffers[2].max_tokens > encoded.shape[1] + 1 and decoder.graphs
    assert [(h.token_ids, h.frames) for h in hyps] == [(ref[f]["token_ids"], ref[f]["timestamps"]) for f in names]


@pytest.mark.skipif(not V3, reason="set GRAPHSCRIBE_TEST_V3 to a 0.6b-v3-shaped .nemo")
def test_fused_step_gives_the_pytorch_steps_tokens_v3():
    """float32 on the 0.6b-v3 shape: the Triton step and the PyTorch step (cuBLAS, cuDNN) agree on real speech."""
    from graphscribe.model.decoding import GreedyDecoder

    model = gs.load_model(V3, device="cuda", dtype="float32")
    audio = [
        model.read(speech_path(name)) for name in ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac")
    ]
    encoded, lengths = model.encode([audio[0], audio[1], torch.cat(audio * 3)])
    results = []
    for fused in (True, False):
        decoder = GreedyDecoder(model.module.decoder, model.module.joint, model.cfg.decoding, graphs=True, fused=fused)
        results.append([(h.token_ids, h.frames) for h in decoder.decode(encoded, lengths)])
        assert (decoder._fused_step is not None) == fused
    assert results[0] == results[1]
    assert all(len(ids) > 10 for ids, _ in results[0])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_encoder_layer_graphs_equal_eager(dtype, monkeypatch):
    """A small batch's layers replayed from one captured layer: bit-equal to the eager loop, shape after shape,
    a shape seen again with other padding, and more shapes than the graphs kept."""
    from graphscribe.model.graphs import LayerGraphs

    monkeypatch.setattr(LayerGraphs, "KEEP_SHAPES", 3)  # 8 shapes below: some are dropped and made again
    model = gs.load_model(V3 or FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo", device="cuda", dtype=dtype)
    a, b = (model.read(speech_path(n)) for n in ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac"))
    cut = [b[: k * 16000] for k in (2, 3, 4, 5, 6)]
    batches = [[a, b], [a[:80000], b], [b, cut[0]]] + [[c] for c in cut] + [[a, b], torch.cat([a, b])[None]]
    layers = model.module.encoder.layers
    assert len(layers) > 1
    for batch in batches:
        features, frames = model.features(list(batch))
        with torch.inference_mode(), model._float32_math():  # the same math as encoder_output's (no TF32)
            eager, eager_frames = model.module.encoder(features.to(model.dtype), frames)
        graphed, graphed_frames = model.encoder_output(features, frames)
        assert torch.equal(graphed, eager) and torch.equal(graphed_frames, eager_frames)
    graphs = model._layer_graphs
    assert graphs.enabled and len(graphs._graphs) == 3 and graphs.capture_seconds > 0


def test_encoder_capture_failure_runs_the_layers_eagerly(monkeypatch, caplog):
    import graphscribe.model.graphs

    class Broken:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("capture refused for the test")

    ref = _reference("nemo-tdt-tiny")
    paths = [CLIPS / c["file"] for c in ref["clips"]]
    model = gs.load_model(FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo", device="cuda", dtype="float32", graphs=True)
    monkeypatch.setattr(graphscribe.model.graphs, "_LayerGraph", Broken)
    with caplog.at_level(logging.WARNING, logger="graphscribe"):
        got = model.transcribe(paths, batch_size=1)
    assert [t.token_ids for t in got] == [c["token_ids"] for c in ref["clips"]]
    assert sum("encoder layer failed" in r.message for r in caplog.records) == 1  # warned once
    assert model._layer_graphs.enabled is False


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_subsampling_without_cudnn_gives_cudnns_bits(monkeypatch, dtype):
    """The subsampling convolutions run through PyTorch's own kernels on CUDA (no per-shape cuDNN plans): in
    float32 the same bits as cuDNN's (what NeMo runs), on batches and lengths of several shapes; in groups of rows
    (forced small here) the same bits as in one call, in both dtypes."""
    import graphscribe.model.subsampling as subsampling_module

    model = gs.load_model(V3 or FIXTURES / "nemo-tdt-tiny" / "tdt-tiny.nemo", device="cuda", dtype=dtype)
    sub = model.module.encoder.pre_encode
    a, b = (model.read(speech_path(n)) for n in ("librispeech_2086-149220-0033.wav", "jfk_44k1_stereo_24bit.flac"))
    batches = [[a], [b], [a, b], [b[:40000], a, b[:100000], a[:20000], b[:170000], a, b, a[:5000]]]
    for batch in batches:
        features, frames = model.features(batch)
        x = features.to(model.dtype).transpose(1, 2)
        with torch.inference_mode():
            ours = sub._convs(x, frames)
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                cudnn = sub._conv_stack(x.unsqueeze(1), frames)
            monkeypatch.setattr(subsampling_module, "_INDEX_LIMIT", sub.conv[0].out_channels * x.shape[1] * x.shape[2])
            grouped = sub._convs(x, frames)  # about four rows a group
            monkeypatch.undo()
        if dtype == "float32":
            assert torch.equal(ours, cudnn)
        assert torch.equal(grouped, ours)


@pytest.mark.parametrize("name,checkpoint", ORACLES[:2])
def test_service_on_gpu_gives_nemos_tokens(name, checkpoint):
    """The server's path on CUDA: samples received into pinned memory (`Service.samples_buffer`), each batch gathered
    from there straight to the GPU (`pipeline.gather`), NeMo's tokens back. One request at a time, so each batch is
    one clip unpadded, as NeMo's reference was made (a tiny random model's near ties move with a batch's padding);
    a request too long to pin comes from plain memory."""
    from graphscribe.io.audio import read_input
    from graphscribe.serve.service import PIN_SECONDS, Service

    ref = _reference(name)
    model = gs.load_model(FIXTURES / name / checkpoint, device="cuda", dtype="float32")
    service = Service(model, max_batch=6)
    service.start()
    assert service.wait_ready(120)
    assert service.samples_buffer(16000).is_pinned()
    assert not service.samples_buffer(int(PIN_SECONDS * model.sample_rate) + 1).is_pinned()
    got = []
    for clip in ref["clips"]:
        audio = read_input(str(CLIPS / clip["file"]), model.sample_rate)
        samples = service.samples_buffer(audio.numel())
        samples.copy_(audio)
        answered = threading.Event()
        service.submit(samples, True, lambda t, _: (got.append(t), answered.set()))
        assert answered.wait(60)
    service.close(60)
    assert _result(got) == [(c["token_ids"], c["timestamps"], c["text"]) for c in ref["clips"]]


@pytest.mark.parametrize("pad_to", [0, 1024])
def test_gather_pads_rows_with_zeros_on_the_gpu(pad_to):
    """`pipeline.gather`: rows from pinned and from plain memory, in a zeroed (B, L) tensor on the GPU, L the longest
    row rounded up to pad_to, as torch's own pad_sequence lays them out; the memory it reuses held NaN."""
    from torch.nn.utils.rnn import pad_sequence

    from graphscribe.runtime.reading import gather

    device = torch.device("cuda")
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):  # the allocator keeps a pool a stream: this one's, which gather allocates from
        dirty = torch.full((64, 40000), float("nan"), device=device)
        del dirty  # its memory goes back to the pool, NaN in it
    generator = torch.Generator().manual_seed(0)
    rows = []
    for k, n in enumerate([12345, 40000, 1, 31000]):
        audio = torch.randn(n, generator=generator)
        rows.append((k, f"row{k}", audio.pin_memory() if k % 2 else audio))
    batch = gather(rows, device, stream, pad_to)
    expected = pad_sequence([a for _, _, a in rows], batch_first=True)
    if pad_to:
        expected = torch.nn.functional.pad(expected, (0, -(-40000 // pad_to) * pad_to - 40000))
    torch.cuda.synchronize()
    assert batch.audio.is_cuda and batch.audio.shape == expected.shape
    assert torch.equal(batch.audio.cpu(), expected)
    assert batch.lengths.tolist() == [12345, 40000, 1, 31000]
    assert batch.indices == [0, 1, 2, 3] and batch.sources == ["row0", "row1", "row2", "row3"]


@pytest.mark.parametrize("name", ["ca-tdt-tiny", "ca-rnnt-tiny"])
def test_cache_aware_streams_match_nemo_on_gpu(name):
    """Cache-aware streams on CUDA in float32 (test_cache_aware.py's oracle), all nine clips 8 at once with
    staggered starts: the encoder step replayed from graphs gives the eager step's tokens on every stream, and
    both give NeMo's pipeline tokens (made on the CPU) on every stream not within 1e-5 of a tie (the fixture's
    `noise_flip`: another device's float32 rounding may tip those)."""
    import soundfile as sf
    from test_cache_aware import FOLDER, REFERENCE, _staggered

    from graphscribe.runtime.cache_aware_streams import engine_for

    audio = {}
    for clip, info in REFERENCE["clips"].items():
        samples, _ = sf.read(Path(__file__).parent.parent / info["file"], dtype="float32")
        audio[clip] = samples if samples.ndim == 1 else samples.mean(axis=1)
    models = {g: gs.load_model(FOLDER / f"{name}.nemo", device="cuda", dtype="float32", graphs=g) for g in (0, 1)}
    for key, ref in REFERENCE["models"][name]["lookaheads"].items():
        seconds = 0.08 * (int(key.split("_")[1]) + 1)
        order = ref["pipeline_multi_stream"]["order"]
        got = [
            {c: s.token_ids for c, s in _staggered(engine_for(models[g], seconds), audio, order, 8).items()}
            for g in (0, 1)
        ]
        assert got[1] == got[0], key
        robust = [c for c, r in ref["pipeline"].items() if r["noise_flip"] is None or r["noise_flip"] > 1e-5]
        assert len(robust) >= 8
        assert {c: got[0][c] for c in robust} == {c: ref["pipeline"][c]["token_ids"] for c in robust}, key


@pytest.mark.parametrize("graphs", [False, True])
def test_confidence_on_gpu_is_nemo_s(graphs):
    """`confidence=True` on CUDA in float32, graphs on and off, the clips batched: NeMo's token and word
    confidences (fixtures/nemo-confidence, its default setting) to float32 rounding, for the demo model and the
    tiny ones; their silent clip alone (a padded batch moves its features, in NeMo too)."""
    reference = json.loads((FIXTURES / "nemo-confidence" / "reference.json").read_text())
    root = FIXTURES.parent.parent
    for name, spec in reference["models"].items():
        model = gs.load_model(root / spec["checkpoint"], device="cuda", dtype="float32", graphs=graphs, confidence=True)
        clips = [c for c in spec["clips"] if c != "silence_1s"]
        got = model.transcribe([root / spec["clips"][c] for c in clips], batch_size=len(clips))
        for clip, transcript in zip(clips, got):
            want = spec["settings"]["default"]["clips"][clip]
            assert transcript.token_ids == want["token_ids"], (name, clip)
            tokens = [t.confidence for t in transcript.tokens]
            assert tokens == pytest.approx(want["token_confidence"], rel=1e-4, abs=1e-6), (name, clip)
            words = [w.confidence for w in transcript.words if w.word.strip()]
            assert words == pytest.approx(want["word_confidence"], rel=1e-4, abs=1e-6), (name, clip)


@pytest.mark.parametrize("folder,checkpoint", ORACLES[:2])
def test_fusion_in_graphs_gives_nemos_tokens(folder, checkpoint):
    """An n-gram LM and a boosting tree fused into the captured decode steps (the fused Triton step's), float32,
    each clip alone and as one batch: NeMo's greedy_batch tokens (nemo-fusion)."""
    fusion = _reference("nemo-fusion")
    name = checkpoint.removesuffix(".nemo")
    runs = fusion["models"][name]["runs"]
    lm = str(FIXTURES.parent.parent / fusion["lm"])
    model = gs.load_model(
        FIXTURES / folder / checkpoint, device="cuda", dtype="float32", lm=lm, hotwords=tuple(fusion["phrases"])
    )
    assert model.decoder.graphs and model.fusion
    root = FIXTURES.parent.parent
    clips = [c for c in fusion["clips"] if c not in DEVICE_BOUND]
    singles = [model.transcribe([root / fusion["clips"][c]])[0] for c in clips]
    assert [(t.token_ids, t.frames) for t in singles] == [
        (runs["lm0.5+boost1.0"][c]["token_ids"], runs["lm0.5+boost1.0"][c]["timestamps"]) for c in clips
    ]
    assert model.decoder._captured and model.decoder._fused_step is not None and model.decoder.fused is not False
    batch = model.transcribe([root / fusion["clips"][c] for c in clips], batch_size=len(clips))
    assert [t.token_ids for t in batch] == [t.token_ids for t in singles]


@pytest.mark.parametrize("name", ["tdt-tiny", "rnnt-tiny"])
@pytest.mark.parametrize("beam", [2, 4, 8])
@pytest.mark.parametrize("fused", [False, True])
def test_beam_float32_matches_nemo_on_gpu(name, beam, fused, monkeypatch):
    """The beam search on CUDA in float32, every clip but DEVICE_BOUND's as one batch: NeMo's best hypothesis (made on the CPU)
    and its score to float32 rounding (fixtures/nemo-beam). fused: the step's compiled kernels (model/beam_kernels.py,
    16-bit logits' otherwise) made to take float32's."""
    if fused:
        import graphscribe.model.beam as beam_module
        from graphscribe.model import beam_kernels

        monkeypatch.setattr(beam_module, "_kernels_for", lambda logits: beam_kernels)
    ref = _reference("nemo-beam")
    spec = ref["models"][name]
    root = Path(__file__).parent.parent
    model = gs.load_model(root / spec["checkpoint"], device="cuda", dtype="float32", beam_size=beam, nbest=True)
    clips = [c for c in ref["clips"] if c not in DEVICE_BOUND]
    got = model.transcribe([root / ref["clips"][c]["file"] for c in clips], batch_size=len(clips))
    run = spec["runs"][f"malsd_batch/beam{beam}/nolm"]["single"]
    assert [t.token_ids for t in got] == [run[c][0]["token_ids"] for c in clips]
    for t, c in zip(got, clips):
        assert t.alternatives[0].score == pytest.approx(run[c][0]["score"], rel=1e-5, abs=5e-4), c


@pytest.mark.parametrize("durations", [5, 0])
def test_beam_candidates_kernel_compiled_is_pytorchs(durations):
    """The beam search's fused candidates kernel (model/beam_kernels.py) compiled, on a step of v3's shape (beam 4 x
    128 inputs, 8193 tokens) in bfloat16: PyTorch's log-softmax top K values to float32 rounding, each token one
    with its value (16-bit logits tie often: the search's tests are through the interpreter against NeMo's)."""
    from graphscribe.model import beam_kernels

    vocab, rows, k = 8193, 512, 4
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (3 * torch.randn(rows, vocab + durations, device="cuda", generator=gen)).to(torch.bfloat16)
    top, tokens, blank, dur = beam_kernels.candidates(logits, vocab, k)
    lp = torch.log_softmax(logits[:, :vocab], dim=-1, dtype=torch.float32)
    values = lp.topk(k, dim=-1).values
    torch.testing.assert_close(top, values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lp.gather(1, tokens), values, rtol=1e-5, atol=1e-5)
    assert (tokens.sort(dim=1).values.diff(dim=1) > 0).all()  # K distinct tokens a row
    torch.testing.assert_close(blank, lp[:, -1], rtol=1e-5, atol=1e-5)
    if durations:
        torch.testing.assert_close(dur, torch.log_softmax(logits[:, vocab:].float(), dim=-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tdt-tiny", "rnnt-tiny"])
@pytest.mark.parametrize("lm", [False, True])
def test_beam_graphs_equal_eager_and_nemo_on_gpu(name, lm):
    """Beam 4 in float32 with its steps replayed from CUDA graphs: every bit of the eager search's hypotheses (the
    n-best and scores), batches of 3 and 5 in the graphs of classes 4 and 8 (spare rows) and the 8 of the fixture's
    batch, and NeMo's malsd_batch best hypotheses (made on the CPU), without and with the ARPA LM fused."""
    ref = _reference("nemo-beam")
    spec = ref["models"][name]
    root = Path(__file__).parent.parent
    extra = dict(lm=str(root / "tests/fixtures/nemo-beam/lm.arpa"), lm_weight=ref["lm_weight"]) if lm else {}
    key = f"malsd_batch/beam4/lm{ref['lm_weight']}-late-lm_weighted_full" if lm else "malsd_batch/beam4/nolm"
    run = spec["runs"][key]["single"]
    models = {
        graphs: gs.load_model(
            root / spec["checkpoint"], device="cuda", dtype="float32", beam_size=4, nbest=True, graphs=graphs, **extra
        )
        for graphs in (False, True)
    }
    batch = ref["batch"]
    short = [c for c in batch if not c.startswith("long")]
    for clips in (batch, short, batch[:3]):
        audios = [models[False].read(root / ref["clips"][c]["file"]) for c in clips]
        encoded = models[False].encode(audios)
        eager, graphs = (models[g].decode(*encoded) for g in (False, True))
        assert graphs == eager, clips
        assert [h.token_ids for h in graphs] == [run[c][0]["token_ids"] for c in clips], clips
        for h, c in zip(graphs, clips):
            assert h.score == pytest.approx(run[c][0]["score"], rel=1e-5, abs=5e-4), c
    assert sorted(models[True].beam._captured) == [4, 8] and not models[False].beam._captured


def test_beam_history_regrown_under_graphs_on_gpu():
    """Beam 4 with room for 8 steps of history: each growth captures the steps again on the new tensors (mid-decode,
    no warm-up), and the hypotheses are the eager search's, every bit."""
    from graphscribe.model.beam import BeamBuffers

    ref = _reference("nemo-beam")
    spec = ref["models"]["tdt-tiny"]
    root = Path(__file__).parent.parent
    models = {
        g: gs.load_model(root / spec["checkpoint"], device="cuda", dtype="float32", beam_size=4, nbest=True, graphs=g)
        for g in (False, True)
    }
    encoded = models[False].encode([models[False].read(root / ref["clips"]["long_mix"]["file"])])
    module, beam = models[True].module, models[True].beam
    beam._buffers[1] = BeamBuffers(
        1, 4, 512, 8, module.joint, module.decoder, models[True].cfg.decoding.durations, None, "cuda", torch.float32
    )
    got = models[True].decode(*encoded)
    assert got == models[False].decode(*encoded)
    assert beam._buffers[1].capacity >= beam.steps > 8 and beam._captured
    assert got[0].token_ids == spec["runs"]["malsd_batch/beam4/nolm"]["single"]["long_mix"][0]["token_ids"]


@pytest.mark.parametrize("folder,checkpoint", ORACLES[:2])
def test_phrases_per_row_in_graphs_give_nemos_tokens(folder, checkpoint):
    """Rows boosted by their own trees in the captured decode steps (`row_boosting.RowTrees`), float32: the eight
    clips in one batch, rows with the plain list, the scored list or none, moved along between decodes: each row
    NeMo's tokens for its own phrases, the graphs replayed on the refilled tables (no capture again); a tree past
    the tables' capacity grows them and the graphs are captured again, with the eager step's tokens."""
    from graphscribe.io.hotwords import parse_request_hotwords

    fusion = _reference("nemo-fusion")
    name = checkpoint.removesuffix(".nemo")
    runs = fusion["models"][name]["runs"]
    root = FIXTURES.parent.parent
    model = gs.load_model(FIXTURES / folder / checkpoint, device="cuda", dtype="float32")
    clips = [c for c in fusion["clips"] if c not in DEVICE_BOUND]
    outs = [model.encode([model.read(root / fusion["clips"][c])]) for c in clips]
    encoded = torch.nn.utils.rnn.pad_sequence([e[0, : int(n[0])] for e, n in outs], batch_first=True)
    lengths = torch.tensor([int(n[0]) for _, n in outs], device="cuda")
    plain = ", ".join(fusion["phrases"])
    scored = ", ".join(f"{p}:{s}" if s else p for p, s in fusion["scored_phrases"])
    run = {plain: "boost1.0", scored: "scored-boost1.0", None: "nofusion"}
    trees = {text: model.row_tree(parse_request_hotwords(text)) for text in (plain, scored)} | {None: None}
    lists = ([plain, scored, None] * 3)[: len(clips)]
    captured = None
    for shift in range(3):
        rows = lists[shift:] + lists[:shift]
        hyps = model.decode(encoded, lengths, trees=[trees[t] for t in rows])
        assert [h.token_ids for h in hyps] == [runs[run[t]][c]["token_ids"] for c, t in zip(clips, rows)], shift
        decoder = model.boosted_decoder()
        assert decoder.graphs and decoder._captured
        captured = captured or dict(decoder._captured)
        assert decoder._captured == captured  # replayed, not captured again
    pieces = [model.tokenizer.piece(i).lstrip("\u2581") for i in range(8, 120)]
    big = model.row_tree(parse_request_hotwords(", ".join(f"{a}{b}" for a in pieces[:30] for b in pieces[:30])))
    hyps = model.decode(encoded, lengths, trees=([big, None] * 5)[: len(clips)])
    assert decoder._captured != captured  # the tables grew: captured on the new ones
    eager = gs.load_model(FIXTURES / folder / checkpoint, device="cuda", dtype="float32", graphs=False)
    expected = eager.decode(encoded, lengths, trees=[eager.row_tree(parse_request_hotwords(", ".join(
        f"{a}{b}" for a in pieces[:30] for b in pieces[:30])))] * len(clips))  # fmt: skip
    assert [h.token_ids for h in hyps[::2]] == [h.token_ids for h in expected[::2]]
