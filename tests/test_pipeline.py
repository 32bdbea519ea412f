"""The host pipeline: batches planned longest first under both caps, reading bounded ahead of the consumer,
results in a stable order whatever the batching, threads gone when the caller stops early."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import CLIP_NAMES, CLIPS, NEMO_PATH, reference_clip

from graphscribe.bench.folder import make_folder
from graphscribe.io.audio import load_audio
from graphscribe.output.rendering import PlainHypothesis, RenderPool
from graphscribe.output.writers import WRITERS, render
from graphscribe.runtime import defaults, pipeline, reading
from graphscribe.runtime.clock import StageClock
from graphscribe.runtime.defaults import default_batching
from graphscribe.runtime.reading import READ_AHEAD, ReadAhead, read_ahead
from graphscribe.runtime.scheduler import plan_batches


def test_plan_is_longest_first_in_batches_of_n():
    seconds = [3.0, 9.0, 1.0, 9.0, 5.0]
    assert plan_batches(seconds, 2, None) == [[1, 3], [4, 0], [2]]  # equal lengths keep their input order


def test_plan_caps_padded_seconds():
    seconds = [30.0, 2.0, 29.0, 2.0, 2.0, 40.0, 10.0]
    # padded seconds = files x the first (longest) one's length: 40 alone (over the cap), 30 + 29 = 60 padded
    assert plan_batches(seconds, 8, 60.0) == [[5], [0, 2], [6, 1, 3, 4]]
    assert plan_batches(seconds, 8, 0) == plan_batches(seconds, 8, None) == [[5, 0, 2, 6, 1, 3, 4]]
    assert plan_batches(seconds, 2, 1000.0) == [[5, 0], [2, 6], [1, 3], [4]]


def test_plan_of_nothing():
    assert plan_batches([], 4, 10.0) == []


def test_default_batching_on_the_cpu():
    files, seconds = default_batching(torch.device("cpu"))
    assert files >= 1 and seconds > 0


@pytest.fixture(scope="module")
def short_folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("short"), files=24, seed=3, short=True)


def test_make_folder_is_deterministic_with_librispeech_like_lengths(tmp_path):
    a = make_folder(tmp_path / "a", files=40, seed=5)
    b = make_folder(tmp_path / "b", files=40, seed=5)
    c = make_folder(tmp_path / "c", files=40, seed=6)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]
    infos = [sf.info(str(p)) for p in a]
    assert {(i.samplerate, i.channels, i.format, i.subtype) for i in infos} == {(16000, 1, "FLAC", "PCM_16")}
    seconds = np.array([i.duration for i in infos])
    assert seconds.min() >= 1.5 and seconds.max() <= 30.0
    assert seconds.mean() == pytest.approx(7.45, abs=0.5)
    data = [sf.read(str(p))[0] for p in a[:5]]
    assert all(np.abs(d).max() > 0.05 for d in data)  # speech, not silence
    assert len({d[:1600].tobytes() for d in data}) == 5  # cut at different places


def test_reading_stays_a_few_batches_ahead(model, short_folder, monkeypatch):
    """A slow consumer: the readers wait for it instead of reading the whole folder into memory."""
    started = []
    read = model.read

    def counted_read(item):
        started.append(item)
        return read(item)

    monkeypatch.setattr(model, "read", counted_read)
    batch = 2
    taken = 0
    most_ahead = 0
    for _ in model.transcribe_iter(short_folder, batch_size=batch, batch_seconds=0):
        taken += 1
        time.sleep(0.02)  # room for unbounded readers to run far ahead
        batches_taken = -(-taken // batch)
        most_ahead = max(most_ahead, -(-len(started) // batch) - batches_taken)
    assert taken == len(short_folder) == len(started)
    # the readers' READ_AHEAD batches, the one being transcribed, and one whose transcripts are still being made
    # on the background thread (word_times) while the next is decoded
    assert 1 <= most_ahead <= READ_AHEAD + 2


def test_reading_starts_before_the_first_batch_is_asked_for(short_folder):
    """The CLI makes its ReadAhead before the model loads: the first READ_AHEAD + 1 batches are read meanwhile, and
    no more until the consumer takes them."""
    started = []
    batch = 3

    def counted_read(item):
        started.append(item)
        return load_audio(item, 16000)

    reads = ReadAhead(short_folder, counted_read, 16000, batch, 0, pin=False, workers=2)
    try:
        deadline = time.monotonic() + 30
        while len(started) < (READ_AHEAD + 1) * batch and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # room for unbounded readers to run on
        assert len(started) == (READ_AHEAD + 1) * batch
        taken = [i for b in reads for i in b.indices]
    finally:
        reads.close()
    assert sorted(taken) == list(range(len(short_folder))) and len(started) == len(short_folder)


def test_recycled_buffers_hold_later_batches_whole(short_folder):
    """A batch handed back (`recycle`) lends its buffer to a batch read later: a handful of buffers serve the whole
    folder, and every batch's rows are still its own inputs' samples, zero-padded."""
    reads = ReadAhead(short_folder, lambda item: load_audio(item, 16000), 16000, 2, 0, pin=False, workers=2)
    storages, batches = {}, 0  # kept alive: a buffer freed, not reused, cannot come back at the same address
    for batch in reads:
        storages[batch.storage.data_ptr()] = batch.storage
        for row, i in enumerate(batch.indices):
            audio = load_audio(short_folder[i], 16000)
            assert int(batch.lengths[row]) == audio.numel()
            assert torch.equal(batch.audio[row, : audio.numel()], audio)
            assert not batch.audio[row, audio.numel() :].any()
        reads.recycle(batch)
        batches += 1
    assert batches == -(-len(short_folder) // 2) and len(storages) <= READ_AHEAD + 3 < batches


def test_padded_lengths_round_up_to_shared_shapes(short_folder):
    """With `pad_to`, a batch's width is the next multiple of it (batches of nearby lengths share a shape), and the
    rows past their own samples are zeros; `read_ahead` pads only on CUDA in 16 bits (float32 keeps NeMo's shapes)."""
    pad_to = 16000
    reads = ReadAhead(
        short_folder, lambda item: load_audio(item, 16000), 16000, 3, 0, pin=False, workers=2, pad_to=pad_to
    )
    widths = []
    for batch in reads:
        longest = int(batch.lengths.max())
        widths.append(batch.audio.shape[1])
        assert batch.audio.shape[1] % pad_to == 0 and longest <= batch.audio.shape[1] < longest + pad_to
        for row in range(len(batch.indices)):
            assert not batch.audio[row, int(batch.lengths[row]) :].any()
        reads.recycle(batch)
    assert len(set(widths)) < len(widths)  # shapes shared
    for dtype in (None, torch.bfloat16):  # the CPU has no plans to share
        on_cpu = read_ahead(short_folder[:1], 16000, torch.device("cpu"), dtype=dtype)
        on_cpu.close()
        assert on_cpu.pad_to == 0


def test_closing_before_reading_ends_stops_every_thread(short_folder):
    reads = ReadAhead(short_folder, lambda item: load_audio(item, 16000), 16000, 2, 0, pin=False, workers=2)
    reads.close()
    reads.close()  # twice is harmless
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("graphscribe-")], names
    assert list(reads) == []  # closed: nothing more comes
    # closed while the feeder is between batches (a plan given: it starts at once): iterating ends, never waits for
    # an end marker the feeder did not put
    for _ in range(50):
        plan = [[0, 1], [2, 3], [4, 5]]
        reads = ReadAhead(short_folder, lambda item: load_audio(item, 16000), 16000, 2, 0, False, 2, batches=plan)
        reads.close()
        assert list(reads) == []


def test_stopping_early_stops_the_readers(model, short_folder):
    results = model.transcribe_iter(short_folder, batch_size=2)
    next(results)
    results.close()
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith("graphscribe-")], names


def test_results_in_batch_order_each_input_once(model, tmp_path, short_folder):
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio\n")
    inputs = [*short_folder[:9], bad, *short_folder[9:12]]
    seconds = [sf.info(str(p)).duration for p in short_folder[:12]]
    order = [i for i, _ in model.transcribe_iter(inputs, batch_size=4, batch_seconds=0)]
    assert sorted(order) == list(range(len(inputs)))
    good = [i for i in order if i != 9]
    lengths = [seconds[i if i < 9 else i - 1] for i in good]
    assert lengths == sorted(lengths, reverse=True)  # longest first
    assert order[-1] == 9  # unreadable, so of unknown length: in the last batch, alone


def test_batching_does_not_change_results(model):
    paths = [CLIPS / name for name in CLIP_NAMES]
    expected = [reference_clip(name)["token_ids"] for name in CLIP_NAMES]
    for batch, seconds in [(1, None), (6, 0), (4, 10.0), (6, 1.0)]:
        got = model.transcribe(paths, batch_size=batch, batch_seconds=seconds)
        assert [t.token_ids for t in got] == expected, (batch, seconds)


def test_without_word_times_the_text_and_token_ids_are_nemos(model):
    """word_times=False (what the CLI asks for txt output) keeps NeMo's text and token ids, and leaves the times out."""
    paths = [CLIPS / name for name in CLIP_NAMES]
    got = model.transcribe(paths, batch_size=3, word_times=False)
    assert [(t.text, t.token_ids) for t in got] == [
        (reference_clip(n)["text"], reference_clip(n)["token_ids"]) for n in CLIP_NAMES
    ]
    assert all(t.tokens == t.words == t.segments == [] for t in got)
    with pytest.warns(DeprecationWarning, match="word_times"):  # the keyword's former name, as READMEs gave it
        [old] = model.transcribe(paths[:1], timings=False)
    assert (old.text, old.token_ids, old.words) == (got[0].text, got[0].token_ids, [])


def test_stage_clock_counts_every_stage_on_the_cpu(model):
    """Every stage is timed, and the main thread's stages are parts of the call (the reads run beside them, and
    the text on the transcripts' thread, beside the next batch's stages)."""
    clock = StageClock(model.device)
    start = time.perf_counter()
    got = dict(model.transcribe_iter([CLIPS / name for name in CLIP_NAMES], batch_size=3, clock=clock))
    elapsed = time.perf_counter() - start
    assert [got[i].token_ids for i in range(len(CLIP_NAMES))] == [reference_clip(n)["token_ids"] for n in CLIP_NAMES]
    seconds = clock.seconds()
    main_thread = ("wait", "features", "encoder", "decode")
    for stage in ("read", "text", *main_thread):
        assert seconds[stage] > 0, stage
    assert sum(seconds[stage] for stage in main_thread) <= elapsed
    assert seconds["text"] <= elapsed


class _DecodeStreamHere(pipeline._Streams):
    """_Streams as on CUDA (a decode stream, so the next batch is queued from inside the decode) on the CPU."""

    def __init__(self, device):
        super().__init__(device)
        self.decode = "here"

    def decoding(self, job):
        return contextlib.nullcontext()


def test_the_next_batch_queued_inside_the_decode_leaves_every_result_nemos(model, monkeypatch):
    """The next batch is queued after the first round of the decode's steps, before its first read: each input
    once, in batch order, with NeMo's tokens; a bad input's error where it was."""
    monkeypatch.setattr(pipeline, "_Streams", _DecodeStreamHere)
    calls = []
    decode = model.decoder.decode

    def watched(encoded, lengths, queued=None):
        calls.append(queued is not None)
        return decode(encoded, lengths, queued)

    monkeypatch.setattr(model.decoder, "decode", watched)
    paths = [CLIPS / name for name in CLIP_NAMES]
    got = list(model.transcribe_iter([*paths, CLIPS / "missing.wav"], batch_size=2, word_times=False))
    assert sorted(i for i, _ in got) == list(range(len(paths) + 1))
    results = dict(got)
    assert [results[i].token_ids for i in range(len(paths))] == [reference_clip(n)["token_ids"] for n in CLIP_NAMES]
    assert "missing.wav" in results[len(paths)].error
    assert calls == [True] * 3  # three batches of two, each decoding with the next one's launch inside


class _Buf:
    window, max_skip = 1, 4  # a step moves a row at most 1 + 4 + 1 = 6 frames


def test_a_first_round_is_the_lower_bound_unless_an_earlier_rate_predicts_it():
    """Before any step: the lower bound (300 frames, at most 6 a step: 50); with an earlier decode's rate, 0.7 of
    what it predicts (1.5 frames a step: 0.7 * 300 / 1.5 = 140), within the lower bound and one step a frame."""
    from graphscribe.model.decoding import round_steps

    assert round_steps(_Buf, 300, 300, 0) == 50
    assert round_steps(_Buf, 300, 300, 0, rate=1.5) == 140
    assert round_steps(_Buf, 300, 300, 0, rate=0.1) == 300
    assert round_steps(_Buf, 300, 300, 0, rate=100.0) == 50
    assert round_steps(_Buf, 100, 300, 80, rate=100.0) == round_steps(_Buf, 100, 300, 80)  # later rounds: own rate


def test_a_decode_with_the_next_batch_to_launch_queues_a_longer_first_round(model):
    """With `queued` (the host launches the next batch before its first read) the first round is sized by the last
    decode's rate: fewer host reads, the same hypotheses, `queued` called once."""
    audio = load_audio(CLIPS / CLIP_NAMES[-1], model.sample_rate)
    features, frames = model.batch_features(audio[None], torch.tensor([audio.numel()]))
    encoded, lengths = model.encoder_output(features, frames, None, [audio.numel()])
    decoder, calls = model.decoder, []
    alone = model.decode(encoded, lengths)
    reads_alone = decoder.host_reads
    assert decoder.rate == encoded.shape[1] / decoder.queued_steps
    beside = model.decode(encoded, lengths, lambda: calls.append(decoder.queued_steps))
    assert beside == alone and len(calls) == 1
    assert calls[0] >= 0.7 * encoded.shape[1] / decoder.rate - 4  # the first round queued by then (4 a replay)
    assert decoder.host_reads < reads_alone


class _Source:
    """Batches of the oracle clips, then an error from the source itself (as a GPU's gather can raise)."""

    def __init__(self, sample_rate: int, error: BaseException):
        self.items = [str(CLIPS / name) for name in CLIP_NAMES[:2]]
        self.audio = [load_audio(path, sample_rate) for path in self.items]
        self.error = error

    def __iter__(self):
        yield reading.collate(
            [(i, p, a) for i, (p, a) in enumerate(zip(self.items, self.audio))], reading.HostBuffers(1, False)
        )
        raise self.error

    def recycle(self, batch):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("error", [RuntimeError("CUDA error: out of memory"), ValueError("the source broke")])
def test_what_the_next_batch_raises_inside_the_decode_is_not_the_decoding_batchs(model, monkeypatch, error):
    """An error raised while the next batch is queued from inside a decode (out of memory included) comes out of
    transcribe_stream after that decode: it is not taken for the decoding batch's own failure, which would retry
    that batch alone and drop the next one's inputs."""
    monkeypatch.setattr(pipeline, "_Streams", _DecodeStreamHere)
    stream = pipeline.transcribe_stream(model, _Source(model.sample_rate, error), word_times=False)
    with pytest.raises(type(error), match=str(error)):
        list(stream)


@pytest.mark.gpu
def test_cuda_pipeline_gives_nemo_tokens_and_times_every_stage():
    """Pinned batches copied without waiting, batch k+1 queued before batch k is finished: NeMo's tokens."""
    from graphscribe.api import load_model

    model = load_model(NEMO_PATH, device="cuda", dtype="float32", graphs=True)
    paths = [CLIPS / name for name in CLIP_NAMES] * 3
    clock = StageClock(model.device)
    got = dict(model.transcribe_iter(paths, batch_size=4, clock=clock))
    assert [got[i].token_ids for i in range(len(paths))] == [reference_clip(p.name)["token_ids"] for p in paths]
    seconds = clock.seconds()
    for stage in ("read", "features", "encoder", "decode", "text"):
        assert seconds[stage] > 0, stage


TIMED_FORMATS = ("json", "srt", "vtt", "tsv")


def test_rendered_results_are_the_writers_bytes_in_the_same_order(model, tmp_path):
    """render: worker processes make each input's outputs; they are what the writers make of `Model.make_transcript`'s
    Transcript (the reference path), in the same order, with an unreadable input where it was, and light."""
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio\n")
    paths = [*(CLIPS / name for name in CLIP_NAMES), bad]
    full = list(model.transcribe_iter(paths, batch_size=4))
    light = list(model.transcribe_iter(paths, batch_size=4, render=TIMED_FORMATS))
    assert [i for i, _ in light] == [i for i, _ in full]
    for (_, expected), (_, got) in zip(full, light):
        assert (got.source, got.text, got.token_ids, got.audio_seconds, got.error) == (
            expected.source,
            expected.text,
            expected.token_ids,
            expected.audio_seconds,
            expected.error,
        )
        if expected.error is not None:
            assert got.rendered == {}
            continue
        assert expected.words and got.tokens == got.words == got.segments == []  # no timing objects came back
        assert got.rendered == {fmt: WRITERS[fmt](expected) for fmt in TIMED_FORMATS}
        assert all(render(got, fmt) == got.rendered[fmt] for fmt in TIMED_FORMATS)


def test_rendered_results_of_one_at_a_time_batches(model, monkeypatch):
    """A batch that runs out of memory is redone one input at a time, rendered by the workers all the same."""
    real, calls = model.decode, []

    def decode_or_out_of_memory(encoded, lengths, *rest):
        calls.append(len(lengths))
        if len(lengths) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(encoded, lengths, *rest)

    paths = [CLIPS / name for name in CLIP_NAMES]
    expected = {i: WRITERS["srt"](t) for i, t in model.transcribe_iter(paths, batch_size=3)}
    monkeypatch.setattr(model, "decode", decode_or_out_of_memory)
    got = {i: t.rendered["srt"] for i, t in model.transcribe_iter(paths, batch_size=3, render=("srt",))}
    assert max(calls) == 3 and got == expected


def test_render_workers_import_no_torch(model):
    """The workers load the writers and the tokenizer (SentencePiece's library) only: no torch (seconds to import,
    CUDA state). Read from the workers' own memory maps, after they have rendered."""
    pool = RenderPool(model.transcript_maker, ("json",))
    try:
        [light] = pool.transcripts(["x.wav"], [16000], [PlainHypothesis([1, 2], [0, 3], [1, 1])])
        assert light.rendered["json"].startswith('{"path": "x.wav"')
        for process, _ in pool._children:
            libraries = Path(f"/proc/{process.pid}/maps").read_text()
            assert "_sentencepiece" in libraries and "libtorch" not in libraries
    finally:
        pool.close()


def test_render_workers_write_the_files_they_are_given(model, tmp_path):
    """With outputs, the workers write each input's files (the writers' bytes, whole) and send no text back; a file
    that cannot be written is one line naming it, and that input's later files are not written."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    outputs = [(str(tmp_path / "a.json"), str(tmp_path / "a.srt")), (str(blocked / "b.json"), str(tmp_path / "b.srt"))]
    hyp = PlainHypothesis([1, 2], [0, 3], [1, 1])
    pool = RenderPool(model.transcript_maker, ("json", "srt"), outputs=outputs)
    try:
        first, second = pool.transcripts(["a.wav", "b.wav"], [16000, 16000], [hyp, hyp], [0, 1])
    finally:
        pool.close()
    expected = model.make_transcript("a.wav", 16000, hyp, 0.0)
    assert (tmp_path / "a.json").read_text() == WRITERS["json"](expected)
    assert (tmp_path / "a.srt").read_text() == WRITERS["srt"](expected)
    assert first.write_error is None and first.rendered == {} and first.text == expected.text
    assert second.write_error.startswith(f"{blocked / 'b.json'}: cannot write output (")
    assert not (tmp_path / "b.srt").exists()
    assert pool.written == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a.json", "a.srt"]  # no temporary file


def test_a_stopped_batch_is_counted_once_the_workers_have_written_it(model, tmp_path, monkeypatch):
    """A signal stops the thread waiting for a batch's shares while the workers write them whole (they ignore it):
    `settle` counts them, whether that thread was stopped (here: the caller itself, as a signal stops the main
    thread) or still waits (the finisher's, whose executor may have lost track of it: issue 46's 0 of 256)."""
    from graphscribe.output import rendering

    hyp = PlainHypothesis([1, 2], [0, 3], [1, 1])
    outputs = [(str(tmp_path / f"{k}.json"),) for k in range(4)]
    pool = RenderPool(model.transcript_maker, ("json",), outputs=outputs)
    try:
        received = rendering._received

        def stopped(conn):
            raise KeyboardInterrupt  # a signal while the shares are out

        monkeypatch.setattr(rendering, "_received", stopped)
        with pytest.raises(KeyboardInterrupt):
            pool.transcripts([f"{k}.wav" for k in range(4)], [16000] * 4, [hyp] * 4, range(4))
        monkeypatch.setattr(rendering, "_received", received)
        assert pool.written == 0
        assert pool.settle() == 4 and sorted(p.name for p in tmp_path.iterdir()) == [f"{k}.json" for k in range(4)]

        waiting = threading.Thread(target=pool.transcripts, args=(["a.wav"] * 2, [16000] * 2, [hyp] * 2, [0, 1]))
        waiting.start()
        while not pool._out and waiting.is_alive():  # its shares are out: it holds the pool till they are back
            time.sleep(0.001)
        assert pool.settle() == 6
        waiting.join()
    finally:
        pool.close()


def test_txt_alone_starts_no_worker_processes(model, monkeypatch):
    """Without word_times (txt) or without formats to render, nothing is spawned."""
    started = []
    monkeypatch.setattr(pipeline, "RenderPool", lambda *args: started.append(args))
    paths = [CLIPS / name for name in CLIP_NAMES[:2]]
    list(model.transcribe_iter(paths, word_times=False, render=("txt",)))
    list(model.transcribe_iter(paths))
    assert started == []


def test_render_workers_end_with_their_parent():
    """`transcribe` ends with os._exit, telling its workers nothing: they exit by themselves, at once."""
    script = (
        "import os\n"
        "from graphscribe.api import load_model\n"
        "from graphscribe.output.rendering import RenderPool, PlainHypothesis\n"
        f"pool = RenderPool(load_model({str(NEMO_PATH)!r}, device='cpu').transcript_maker, ('json',))\n"
        "pool.transcripts(['x.wav'], [16000], [PlainHypothesis([1], [0], [1])])\n"
        "print(*(process.pid for process, _ in pool._children), flush=True)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    deadline = time.monotonic() + 30
    while (alive := [p for p in pids if os.path.exists(f"/proc/{p}")]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive == []


def test_warm_up_leaves_results_as_they_were(model, short_folder):
    """A warm-up batch runs anywhere (the CLI runs it on CUDA only) and changes no later result."""
    files = short_folder[:9]
    before = [(i, t.text) for i, t in model.transcribe_iter(files, batch_size=3, word_times=False)]
    assert pipeline.warm_up(model, 3) > 0
    assert pipeline.warm_up(model, 2, batch_seconds=1.0) > 0  # rows of half a second
    assert [(i, t.text) for i, t in model.transcribe_iter(files, batch_size=3, word_times=False)] == before


@pytest.mark.parametrize(
    ("omp", "cuda", "share", "expected"),
    [(None, True, None, 4), (None, True, 2, 2), (None, False, 3, 3), (None, False, None, 16), ("5", True, 2, 16)],
)
def test_host_threads_one_rule_for_the_cli_and_the_workers(monkeypatch, omp, cuda, share, expected):
    """At most the worker's share, at most GPU_HOST_THREADS beside a GPU; OMP_NUM_THREADS (torch's own) wins."""
    chosen = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    if omp is not None:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    defaults.limit_host_threads("cuda:1", share)
    assert (chosen[-1] if chosen else 16) == expected
