"""Cache-aware streaming models against NeMo 3.0's own outputs (fixtures/nemo-cache-aware, its README).

The oracle is NeMo's `CacheAwareRNNTPipeline` (the streaming path NVIDIA ships for these models) and the
models' own offline pass, on two tiny NeMo-built models (TDT and RNN-T) at three lookaheads each.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import FIXTURES

import graphscribe
from graphscribe.io.config import UnsupportedModelError, model_config_from_nemo
from graphscribe.model import cache_aware
from graphscribe.model.cache_aware import Caches, ChunkGeometry
from graphscribe.runtime.cache_aware_streams import CacheAwareEngine, contexts_by_chunk, engine_for

FOLDER = FIXTURES / "nemo-cache-aware"
ROOT = FIXTURES.parent.parent
REFERENCE = json.loads((FOLDER / "reference.json").read_text())
MODELS = list(REFERENCE["models"])
LOOKAHEADS = [(name, key) for name in MODELS for key in REFERENCE["models"][name]["lookaheads"]]


def _context(key: str) -> tuple[int, int]:
    left, lookahead = key.split("_")
    return int(left), int(lookahead)


@pytest.fixture(scope="module")
def models():
    return {name: graphscribe.load_model(FOLDER / f"{name}.nemo", device="cpu") for name in MODELS}


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    out = {}
    for name, info in REFERENCE["clips"].items():
        audio, _ = sf.read(ROOT / info["file"], dtype="float32")
        out[name] = audio if audio.ndim == 1 else audio.mean(axis=1)
    return out


def test_config_is_read_as_cache_aware(models):
    for model in models.values():
        enc = model.cfg.encoder
        assert enc.streaming_contexts == ((16, 3), (16, 1), (16, 0))
        assert enc.conv_layer_norm and not model.cfg.features.normalize
        assert model.context == (16, 3)  # NeMo's default: the first listed
    assert contexts_by_chunk(models["ca-tdt-tiny"]) == {0.32: (16, 3), 0.16: (16, 1), 0.08: (16, 0)}


@pytest.mark.parametrize("name,key", LOOKAHEADS)
def test_chunk_geometry_is_the_pipeline_s(models, name, key):
    cfg = models[name].cfg
    g = ChunkGeometry.of(cfg.features, cfg.encoder.subsampling_factor, _context(key))
    want = REFERENCE["models"][name]["lookaheads"][key]["pipeline_geometry"]
    assert (g.frame_samples, g.chunk_frames, g.buffer_frames) == (
        want["frame_samples"],
        want["feature_chunk_frames"],
        want["feature_buffer_frames"],
    )
    assert (g.encoder_frames, g.drop) == (want["encoder_frames_per_chunk"], want["drop_extra_pre_encoded"])


def test_encoder_step_is_nemo_s(models):
    """Three steps of NeMo's `conformer_stream_step` (reference.npz): the output and the caches. NeMo caches each
    layer's normalised attention input; ours holds its keys and values, which are those inputs projected."""
    arrays = np.load(FOLDER / "reference.npz")
    assert "ca-tdt-tiny" in str(arrays["meta"]) and "16, 3" in str(arrays["meta"])
    encoder = models["ca-tdt-tiny"].module.encoder

    def projected(channel: torch.Tensor, name: str) -> torch.Tensor:  # (layers, C, D) -> (layers, 1, C, D)
        return torch.stack([getattr(layer.self_attn, name)(c) for layer, c in zip(encoder.layers, channel)])[:, None]

    for i in range(3):

        def a(key):
            return torch.from_numpy(np.asarray(arrays[f"step{i}_{key}"]))

        with torch.inference_mode():
            channel = a("cache_last_channel_in")
            after = Caches.of_history(  # slot 0 holds NeMo's caches going in, then the step's coming out
                projected(channel, "linear_k"),
                projected(channel, "linear_v"),
                a("cache_last_time_in")[:, None].clone(),
                a("cache_last_channel_len_in")[None].clone(),
                encoder.cfg.n_heads,
                4,
            )
            x, _ = cache_aware.encode(
                encoder,
                a("features")[None],
                a("feature_length")[None],
                (16, 3),
                after,
                torch.tensor([0]),
                int(a("drop_extra_pre_encoded")),
            )
            want_key = projected(a("cache_last_channel_out"), "linear_k")[:, 0]
        torch.testing.assert_close(x[0], a("encoder").T, atol=2e-6, rtol=0)
        valid = int(a("cache_last_channel_len_out"))  # the slots before them are masked: zeros here, biases there
        torch.testing.assert_close(after.history("key")[:, 0, -valid:], want_key[:, -valid:], atol=2e-6, rtol=0)
        torch.testing.assert_close(after.time[:, 0], a("cache_last_time_out"), atol=2e-6, rtol=0)
        assert after.length.item() == valid


@pytest.mark.parametrize("name,key", LOOKAHEADS)
def test_offline_is_nemo_s(models, name, key):
    """The models' own offline pass (a batch of padded clips), at each lookahead's attention context."""
    model = models[name]
    model.context = _context(key)
    try:
        names = list(REFERENCE["clips"])
        got = model.transcribe([ROOT / REFERENCE["clips"][c]["file"] for c in names], batch_size=5)
    finally:
        model.context = model.cfg.encoder.streaming_contexts[0]
    want = REFERENCE["models"][name]["lookaheads"][key]["offline_model"]
    assert [t.token_ids for t in got] == [want[c]["token_ids"] for c in names]


def _staggered(engine: CacheAwareEngine, clips: dict[str, np.ndarray], order: list[str], most: int) -> dict:
    """The clips as live streams of one engine, NeMo's multi-stream way: at most one new stream a step while
    fewer than `most` are open, each fed a chunk a step. -> the finished streams by clip."""
    size = engine.geometry.frame_samples
    waiting, live, done = list(order), {}, {}
    while waiting or live:
        if waiting and len(live) < most:
            name = waiting.pop(0)
            live[name] = [engine.open(), 0]
        for name, (stream, fed) in list(live.items()):
            audio = clips[name]
            if stream.finished:
                continue
            stream.feed(audio[fed : fed + size])
            live[name][1] = fed + size
            if fed + size >= audio.size:
                stream.finish()
        engine.step()
        for name, (stream, _) in list(live.items()):
            if stream.closed:
                done[name] = stream
                del live[name]
    return done


@pytest.mark.parametrize("name,key", LOOKAHEADS)
def test_staggered_streams_are_the_pipeline_s(models, clips, name, key):
    """Nine clips through one engine, up to 8 at once with staggered starts (NeMo's own multi-stream run): each
    stream's token ids and text equal NeMo's pipeline for that clip alone (its 8-stream run gives the same)."""
    ref = REFERENCE["models"][name]["lookaheads"][key]
    seconds = ChunkGeometry.of(models[name].cfg.features, 8, _context(key)).chunk_seconds
    engine = engine_for(models[name], seconds)
    assert isinstance(engine, CacheAwareEngine) and engine.context == _context(key)
    streams = _staggered(engine, clips, ref["pipeline_multi_stream"]["order"], 8)
    for clip, stream in streams.items():
        want = ref["pipeline"][clip]
        assert stream.token_ids == want["token_ids"], clip
        assert stream.final_text == want["text"], clip


@pytest.mark.parametrize("name", MODELS)
def test_one_stream_fed_unevenly(models, clips, name):
    """One stream through `Model.stream`, fed in pieces that do not line up with chunks: the pipeline's tokens,
    and its finals where its end-of-utterance fired."""
    ref = REFERENCE["models"][name]["lookaheads"]["16_3"]["pipeline"]["long_jfk_silence_libri"]
    audio = clips["long_jfk_silence_libri"]
    stream = models[name].stream()
    events = []
    for start in range(0, audio.size, 3001):
        events += stream.feed(audio[start : start + 3001])
    events += stream.finish()
    assert stream.token_ids == ref["token_ids"]
    assert [e.text for e in events if e.type == "done"] == [ref["text"]]
    # a final where NeMo's end of utterance fired with an utterance open
    finals, open_ = 0, False
    for _, tokens, eou in ref["steps"]:
        open_ = open_ or bool(tokens)
        if eou and open_:
            finals, open_ = finals + 1, False
    assert len([e for e in events if e.type == "final"]) == finals


def test_chunk_picks_the_context(models):
    model = models["ca-rnnt-tiny"]
    assert engine_for(model, 0.08).context == (16, 0)
    assert engine_for(model).context == (16, 3)  # the buffered default: the model's own
    with pytest.raises(
        ValueError, match=r"--chunk 0.5: this cache-aware model streams in chunks of 0.08, 0.16, 0.32 s"
    ):
        engine_for(model, 0.5)


def test_partial_streaming_switches_are_refused():
    config = json.loads(json.dumps(REFERENCE["models"]["ca-rnnt-tiny"]["config"]))
    config["encoder"]["causal_downsampling"] = False
    with pytest.raises(UnsupportedModelError, match="needs all of .*causal_downsampling=true; this one has only"):
        model_config_from_nemo(_with_sections(config))
    config["encoder"]["causal_downsampling"] = True
    config["encoder"]["att_context_size"] = [[16, 4]]
    with pytest.raises(UnsupportedModelError, match=r"att_context_size \[16, 4\]: .*divisible by lookahead \+ 1"):
        model_config_from_nemo(_with_sections(config))


def _with_sections(config: dict) -> dict:
    """The recorded config sections (the RNN-T's: no durations to list), with the tokenizer section besides."""
    return {**config, "tokenizer": {"type": "bpe"}}


def test_captured_step_gives_the_eager_steps_tokens(models, clips, monkeypatch):
    """`StepGraphs` on the CPU, a stand-in for the CUDA graph re-running what it recorded: the static buffers, the
    spare rows of a class and the copies in and out give the eager engine's tokens (NeMo's), batches of 3 and 5
    streams in classes of 4 and 8."""
    import graphscribe.model.cache_aware as ca

    class Replayed:
        def replay(self):
            self.record()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Replayed)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(ca, "capture", lambda graph, record, pool: setattr(graph, "record", record))
    model = models["ca-tdt-tiny"]
    monkeypatch.setattr(model, "options", dataclasses.replace(model.options, graphs=True))
    ref = REFERENCE["models"]["ca-tdt-tiny"]["lookaheads"]["16_1"]
    engine = engine_for(model, 0.16)
    streams = _staggered(engine, clips, list(REFERENCE["clips"]), 5)
    assert engine._step_graphs is not None and {4, 8} <= set(engine._step_graphs._graphs)
    for clip, stream in streams.items():
        assert stream.token_ids == ref["pipeline"][clip]["token_ids"], clip


def test_an_end_of_utterance_piece_ends_a_final():
    """parakeet_realtime_eou's `<EOU>`: the tokens before it are a final, the piece is never in the text, the
    tokens after it open the next utterance; a stream's token ids keep it (NeMo's hypothesis has it)."""
    from graphscribe.runtime.cache_aware_streams import CacheAwareText
    from graphscribe.runtime.stream_text import StreamGeometry, Vocabulary

    pieces = ["\u2581hel", "lo", "<EOU>", "\u2581next", "\u2581one", "<EOB>", "<unk>"]
    vocab = Vocabulary.of(pieces, frozenset(), 6)
    text = CacheAwareText(
        StreamGeometry.of(0.16, 0.0, 0.0, 16000, 160, 8),
        vocab,
        lambda ids: "".join(pieces[i] for i in ids).replace("\u2581", " "),
    )
    said = text.step([0, 1, 2, 3], [0, 0, 1, 1], last=False)
    assert said.new_tokens == [0, 1, 2, 3]
    assert said.final.text == "hello" and said.final.token_ids == [0, 1]
    assert said.partial == " next"
    said = text.step([4, 5], [2, 3], last=False)
    assert said.final.text == "next one" and said.final.token_ids == [3, 4]
    assert text.step([], [], last=True).final is None  # nothing open: no empty final


def test_realtime_sessions_of_a_cache_aware_model(models, tmp_path):
    """`/v1/realtime` on a cache-aware checkpoint, the real server and the official `openai` realtime client: a
    manual turn's deltas come before the commit and its completed text is the in-process stream's for that PCM."""
    import openai
    from conftest import SPEECH_CLIP
    from test_realtime import MANUAL, pcm24, streamed_text, transcribe_manually
    from test_server import KEY, start_server

    served = start_server(tmp_path / "stderr.txt", "--model", str(FOLDER / "ca-tdt-tiny.nemo"))
    try:
        pcm = pcm24(SPEECH_CLIP)
        client = openai.OpenAI(api_key=KEY, base_url=served.url + "/v1")
        with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            assert conn.recv().type == "session.created"
            conn.session.update(session=MANUAL)
            assert conn.recv().type == "session.updated"
            events = transcribe_manually(conn, pcm)
    finally:
        assert served.stop() == 0, served.log.read_text()
    kinds = [e.type for e in events]
    assert kinds[0].endswith(".delta") and "input_audio_buffer.committed" in kinds
    assert events[-1].transcript == streamed_text(models["ca-tdt-tiny"], pcm) != ""


def test_every_chunk_of_a_released_context_list_is_whole_frames():
    """nemotron's contexts: 1.12 / 0.08 is 14.000000000000002 and 0.56 / 0.08 7.000000000000001 in floats; a step
    must still take exactly lookahead + 1 frames of audio."""
    model = graphscribe.load_model(FOLDER / "ca-rnnt-tiny.nemo", device="cpu")
    for lookahead in (13, 6, 1, 0):
        enc = dataclasses.replace(model.cfg.encoder, streaming_contexts=((70, lookahead),))
        model.cfg = dataclasses.replace(model.cfg, encoder=enc)
        engine = engine_for(model, round(0.08 * (lookahead + 1), 2))
        assert engine.geometry.frame_samples == engine.chunk.frame_samples == 1280 * (lookahead + 1)
        assert engine.geometry.chunk == lookahead + 1


@pytest.mark.parametrize("key", ["16_3", "16_0"])
def test_a_long_clip_offline_attends_in_blocks(models, key):
    """Past `OFFLINE_BLOCK` frames the offline pass attends block by block (memory linear in the length): the same
    output as NeMo's one (T, T) pass, to float32 rounding, padded rows included; blocks of 8 and 12 frames cut
    chunks and the left context in every way."""
    model = models["ca-rnnt-tiny"]
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(2, model.cfg.features.n_mels, 800, generator=gen) - 5
    lengths = torch.tensor([800, 523])
    with torch.inference_mode():
        whole, whole_lengths = cache_aware.encode(model.module.encoder, features, lengths, _context(key))
        for block in (8, 12):
            blocks, block_lengths = cache_aware.encode(
                model.module.encoder, features, lengths, _context(key), block=block
            )
            assert torch.equal(block_lengths, whole_lengths) and whole.shape[1] > 8 * block
            for row, n in enumerate(whole_lengths.tolist()):
                torch.testing.assert_close(blocks[row, :n], whole[row, :n], atol=2e-5, rtol=1e-5)


def test_warm_up_makes_the_slots_first(models, monkeypatch):
    """A warm-up for N streams grows the slots to N before it captures a class: no class is dropped by a later
    growth (CPU stand-in graphs)."""
    import graphscribe.model.cache_aware as ca

    class Replayed:
        def replay(self):
            self.record()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Replayed)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(ca, "capture", lambda graph, record, pool: setattr(graph, "record", record))
    monkeypatch.setattr("graphscribe.runtime.streaming.warm_up_rows", lambda device, most, rows: [1, 2, 4, 8, 16])
    model = models["ca-tdt-tiny"]
    monkeypatch.setattr(model, "options", dataclasses.replace(model.options, graphs=True))
    engine = engine_for(model, 0.32)
    engine.warm_up(16)
    assert set(engine._step_graphs._graphs) == {1, 2, 4, 8, 16}


@pytest.mark.parametrize("key", ["16_3", "16_0"])
def test_ring_attention_kernel_is_the_gathered_windows(models, monkeypatch, key):
    """The fused kernel (16 bits on CUDA; here Triton's interpreter) reads each window from the rings where it lies:
    steps of two streams, one a step behind the other, give the outputs of the gathered windows' attention."""
    kernels = pytest.importorskip("graphscribe.model.encoder_kernels")
    encoder = models["ca-tdt-tiny"].module.encoder
    context = _context(key)
    g = ChunkGeometry.of(models["ca-tdt-tiny"].cfg.features, encoder.cfg.subsampling_factor, context)
    gen = torch.Generator().manual_seed(3)
    feats = torch.randn(4, 2, models["ca-tdt-tiny"].cfg.features.n_mels, g.buffer_frames, generator=gen)
    lengths = torch.tensor([g.buffer_frames, g.buffer_frames - 3])

    def run(fused: bool) -> list[torch.Tensor]:
        caches = Caches.zeros(encoder.cfg, context, 3, "cpu", torch.float32)
        index = torch.tensor([2, 0])
        outs = []
        with torch.inference_mode(), monkeypatch.context() as patch:
            if fused:
                patch.setattr(cache_aware, "kernels_for", lambda x: kernels)
            for step in range(4):
                rows = index if step else index[:1]  # slot 0 joins a step later
                x, _ = cache_aware.encode(
                    encoder, feats[step, : len(rows)], lengths[: len(rows)], context, caches, rows, g.drop
                )
                outs.append(x)
        return outs

    for got, want in zip(run(True), run(False)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
