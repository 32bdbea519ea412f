"""The host side of transcribing many inputs: reading runs ahead in threads while the GPU works.

    inputs -> lengths (file headers) -> batches, longest first (at most N files, S seconds of padded audio)
    -> a pool of reader threads: decode, mix down, resample (libsndfile and torch release the GIL)
    -> one zero-padded (B, L) buffer a batch (pinned on CUDA, so the copy to the GPU is asynchronous)
       [`ReadAhead`: all of the above, from the moment it is made; the CLI makes it while the model loads]
    -> features, encoder (queued on the GPU) -> decoding (its own CUDA stream) -> transcripts
       [`transcribe_stream`]

The main thread keeps the GPU fed: it queues batch k's first round of decode steps on a stream of its own, then
batch k+1's copy, features and encoder, which run beside those steps, then waits for batch k's decode (which
reads a few numbers back to the host as it goes: on one stream the GPU would wait for the host's launches of
every next batch), then makes batch k's transcripts (and the caller writes them); the readers stay READ_AHEAD
batches ahead, so host memory is bounded by the batch size, not by the number of inputs.
Results come in batch order, each batch's unreadable inputs first; a batch that runs out of memory is
retried one input at a time, and an input that alone does not fit gets an error.
"""

from __future__ import annotations

import collections
import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

import torch

from graphscribe.io.audio import read_input, speech_path
from graphscribe.output.rendering import RenderPool
from graphscribe.output.transcript import Transcript
from graphscribe.runtime.clock import StageClock
from graphscribe.runtime.defaults import default_batching, pad_samples
from graphscribe.runtime.reading import Batch, HostBuffers, ReadAhead, collate, input_name

if TYPE_CHECKING:
    from graphscribe.model.decoding import Hypothesis
    from graphscribe.runtime.loaded import LoadedModel


@dataclass
class _Job:
    """A batch on its way through the model."""

    batch: Batch
    encoded: torch.Tensor | None = None  # (B, T', D)
    frames: torch.Tensor | None = None  # (B,) encoder frames
    ready: torch.cuda.Event | None = None  # CUDA: recorded after the encoder, on its stream
    hyps: list[Hypothesis] | None = None
    out_of_memory: bool = False
    seconds: float = 0.0  # host time spent on it


def transcribe_stream(
    model: LoadedModel,
    reads: ReadAhead,
    clock: StageClock | None = None,
    word_times: bool = True,
    render: Sequence[str] = (),
    renderer: RenderPool | None = None,
) -> Iterator[tuple[int, Transcript]]:
    """Yield (index, Transcript) for every input of `reads`, a batch at a time, longest first; `word_times=False`
    leaves out the token, word and segment times (text and token ids only: less host work a file), as does a
    batch's own `word_times=False`.

    reads: a ReadAhead, or any source of Batches with `items`, `recycle` and `close` (the server's). The next
    batch is taken, and queued up to its encoder, while one decodes (on CUDA once its first steps are queued);
    an empty Batch (no rows) has the one before it finished at once, so a source that is about to wait for
    inputs yields one first.

    With word times, a batch's transcripts are made on a thread of their own (`_TranscriptThread`) while this one
    queues and decodes the next batches: this thread spends most of a batch waiting for the GPU. `render`, output
    formats (`writers.WRITERS`' names): with word times, transcripts are made and rendered by worker processes instead
    (`rendering.RenderPool`), and come light: text, token ids and `rendered`, no token, word or segment objects.
    Their millisecond of Python a file would otherwise hold the GIL that this thread launches the GPU's work with.
    `renderer`: the caller's pool instead of one made for `render` (the CLI's writes the output files too), to
    use with word times; the caller closes it."""
    clock = clock or StageClock(model.device, enabled=False)
    items = reads.items
    streams = _Streams(model.device)
    own = renderer is None and bool(render) and word_times  # what it makes, it closes
    renderer = RenderPool(model.transcript_maker, render) if own else renderer
    background = _TranscriptThread(model, clock, word_times, renderer) if word_times else None
    confidence = model.options.confidence and word_times  # only outputs with words carry confidences
    source = iter(reads)

    def queue_next() -> _Job | None:  # the next batch, queued up to its encoder; None at the end
        batch = next(source, None)
        return None if batch is None else _start(model, batch, clock)

    def failed(job: _Job) -> list[tuple[int, Transcript]]:
        return [(i, Transcript(source=input_name(items[i]), error=error)) for i, error in job.batch.failed]

    try:
        job = queue_next()  # queued up to its encoder, not decoded yet
        if job is not None:
            yield from failed(job)
        while job is not None:
            # the next batch is queued while this one decodes: on CUDA once the decode's first steps are on the GPU
            # (its encoder runs beside them), so this one's answer waits for no launch of the next one's
            upcoming: list[_Job | None] = []
            _decode(model, job, clock, streams, lambda: upcoming.append(queue_next()), confidence)
            if not upcoming:  # not called: nothing decoded on a GPU (no rows, out of memory, the CPU)
                upcoming.append(queue_next())
            following = upcoming[0]
            last = following is None
            # here, in order: one at a time runs the GPU; a batch without times is text only (tens of microseconds
            # a row), answered now rather than a batch later
            if background is None or job.out_of_memory or not job.batch.word_times:
                yield from background.drain() if background else ()
                yield from _transcripts(model, job, clock, streams, word_times, renderer)
            else:
                background.submit(job)
                # the end, or an empty batch (the source is about to wait): everything answered now
                yield from background.drain() if last or not following.batch.indices else background.ready()
            if not last:
                reads.recycle(job.batch)  # decoded, so copied to the GPU long ago
                if background is None:
                    yield from failed(following)
                else:
                    background.add(failed(following))
            job = following
        yield from background.drain() if background else ()
    finally:  # also when the caller stops early: reads not started are dropped
        if background is not None:
            background.close()
        if own:
            renderer.close()
        reads.close()


class _TranscriptThread:
    """Decoded batches made into transcripts on one thread (or by `renderer`'s processes, which that thread waits
    for), handed back in the order they were given."""

    def __init__(self, model: LoadedModel, clock: StageClock, word_times: bool, renderer: RenderPool | None = None):
        self.model, self.clock, self.word_times, self.renderer = model, clock, word_times, renderer
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="graphscribe-transcripts")
        self._queue: collections.deque[Future] = collections.deque()

    def submit(self, job: _Job) -> None:
        self._queue.append(
            self._pool.submit(
                lambda: list(_transcripts(self.model, job, self.clock, None, self.word_times, self.renderer))
            )
        )

    def add(self, results: list[tuple[int, Transcript]]) -> None:
        if not results:
            return
        done: Future = Future()
        done.set_result(results)
        self._queue.append(done)

    def ready(self) -> Iterator[tuple[int, Transcript]]:
        """What is done already, in order; waits only to keep at most two batches unfinished."""
        while self._queue and (self._queue[0].done() or len(self._queue) > 2):
            yield from self._queue.popleft().result()

    def drain(self) -> Iterator[tuple[int, Transcript]]:
        while self._queue:
            yield from self._queue.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class _Streams:
    """Where decoding runs: on CUDA a stream of its own (high priority: its small step kernels then start as soon
    as the encoder's leave an SM free), waiting for its batch's encoder; elsewhere the current one."""

    def __init__(self, device: torch.device):
        self.decode = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
        self.encode: torch.cuda.Stream | None = None  # while decoding: the stream the caller was on

    @contextlib.contextmanager
    def decoding(self, job: _Job):
        if self.decode is None:
            yield
            return
        self.decode.wait_event(job.ready)
        job.encoded.record_stream(self.decode)  # made on the encoder's stream: not reused before decoding is done
        job.frames.record_stream(self.decode)
        self.encode = torch.cuda.current_stream(self.decode.device)
        try:
            with torch.cuda.stream(self.decode):
                yield
        finally:
            self.encode = None

    def outside(self):
        """Back on the caller's stream while decoding (the next batch's features and encoder)."""
        return torch.cuda.stream(self.encode) if self.encode is not None else contextlib.nullcontext()


def _start(model: LoadedModel, batch: Batch, clock: StageClock) -> _Job:
    """Queue the copy to the device, features and encoder; out of memory marks the job for one-at-a-time."""
    job = _Job(batch)
    if not batch.indices:
        return job
    start = time.perf_counter()
    samples = batch.lengths.tolist()
    window = model.attention_for(samples, batch.sources)  # full, or local for hours of audio
    try:
        front = model.front_packing(samples, batch.audio.shape[1], window)  # the clips end to end, or None
        with clock.gpu("features"):
            features, feature_frames = model.batch_features(batch.audio, batch.lengths, front)
        with clock.gpu("encoder"):
            job.encoded, job.frames = model.encoder_output(features, feature_frames, window, samples, front)
        if model.device.type == "cuda":
            job.ready = torch.cuda.Event()
            job.ready.record()
    except (torch.OutOfMemoryError, RuntimeError) as err:
        _out_of_memory_or_raise(model, err)
        job.out_of_memory = True
    job.seconds += time.perf_counter() - start
    return job


def _decode(
    model: LoadedModel,
    job: _Job,
    clock: StageClock,
    streams: _Streams,
    then: Callable[[], None] | None = None,
    confidence: bool = False,
) -> _Job:
    """Decode a job queued up to its encoder. then: on CUDA, called once the decode's first round of steps is
    queued, before the host waits for it, on the stream the encoder runs on: the caller's next batch is launched
    while this one decodes. confidence (or the batch's own): then the hypotheses' token confidences, from the encoder
    output before it is let go (`LoadedModel.add_confidences`), for a batch with word times."""
    if job.encoded is None:
        return job
    start = time.perf_counter()
    aside = 0.0  # host time in `then`, its own job's
    raised: list[BaseException] = []  # by `then`: raised once this job is decoded, not taken for its failure

    def meanwhile() -> None:
        nonlocal aside
        began = time.perf_counter()
        try:
            with streams.outside():
                then()
        except BaseException as err:  # noqa: BLE001 - re-raised below
            raised.append(err)
        aside += time.perf_counter() - began

    try:
        with streams.decoding(job):
            with clock.gpu("decode"):
                queued = meanwhile if then and streams.decode else None
                job.hyps = model.decode(job.encoded, job.frames, queued, job.batch.trees, job.batch.beams)
            if (confidence or job.batch.confidence) and job.batch.word_times:
                with clock.gpu("confidence"):
                    model.add_confidences(job.encoded, job.hyps)
    except (torch.OutOfMemoryError, RuntimeError) as err:
        _out_of_memory_or_raise(model, err)
        job.out_of_memory = True
    job.encoded = job.frames = None  # the encoder output's memory is reused once decoding is done (record_stream)
    job.seconds += time.perf_counter() - start - aside
    if raised:
        raise raised[0]
    return job


def _transcripts(
    model: LoadedModel,
    job: _Job,
    clock: StageClock,
    streams: _Streams,
    word_times: bool,
    renderer: RenderPool | None = None,
) -> Iterator[tuple[int, Transcript]]:
    """A decoded job's transcripts (light and rendered by `renderer` when given); one that ran out of memory is
    redone one input at a time."""
    batch = job.batch
    if job.out_of_memory:
        yield from (
            _alone(model, batch.row(r), clock, streams, word_times, renderer) for r in range(len(batch.indices))
        )
        return
    if job.hyps is None:
        return
    start = time.perf_counter()
    with clock.host("text"):
        if renderer is not None:
            transcripts = renderer.transcripts(batch.sources, batch.lengths.tolist(), job.hyps, batch.indices)
        else:
            transcripts = [
                model.make_transcript(source, int(n), hyp, 0.0, word_times and batch.word_times)
                for n, source, hyp in zip(batch.lengths.tolist(), batch.sources, job.hyps)
            ]
    seconds = (job.seconds + time.perf_counter() - start) / len(transcripts)  # its batch's host time, shared
    for transcript in transcripts:
        transcript.seconds = seconds
    yield from zip(batch.indices, transcripts)


def _alone(
    model: LoadedModel,
    batch: Batch,
    clock: StageClock,
    streams: _Streams,
    word_times: bool,
    renderer: RenderPool | None,
) -> tuple[int, Transcript]:
    """One input, start to end; an error if it does not fit in memory either."""
    job = _decode(model, _start(model, batch, clock), clock, streams, None, model.options.confidence and word_times)
    if not job.out_of_memory:
        [result] = _transcripts(model, job, clock, streams, word_times, renderer)
        return result
    minutes = int(batch.lengths[0]) / model.sample_rate / 60
    source = batch.sources[0]
    return batch.indices[0], Transcript(
        source=source,
        error=(
            f"{source}: out of {model.device.type.upper()} memory for {minutes:.1f} min of audio; "
            "try --attention local, a smaller --attention-window, or split the file"
        ),
    )


def _out_of_memory_or_raise(model: LoadedModel, err: Exception) -> None:
    text = str(err)
    if not (isinstance(err, torch.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text):
        raise err
    if model.device.type == "cuda":
        model.release_graphs()
        torch.cuda.empty_cache()


WARM_UP_CLIP = "librispeech_2086-149220-0033.wav"  # `warm_up`'s real speech, shipped in the package


def warm_up_run(model: LoadedModel, inputs: int, batch_size: int | None, batch_seconds: float | None) -> float:
    """On CUDA, `warm_up` on a batch as wide as a run of `inputs` inputs starts with (its batch size and padded-seconds
    cap, or the device's) -> seconds taken; 0 on the CPU, which has no first uses worth moving off the clock. The
    CLI's process and every `--devices` worker call it after loading."""
    if model.device.type != "cuda":
        return 0.0
    rows, seconds = default_batching(model.device, model.dtype)
    return warm_up(model, min(batch_size or rows, inputs), seconds if batch_seconds is None else batch_seconds)


def warm_up(model: LoadedModel, rows: int, batch_seconds: float | None = None) -> float:
    """Run one batch of `rows` copies of the shipped LibriSpeech clip (7.4 s, cut to batch_seconds / rows) through
    `model` as `transcribe_stream` runs a batch, and wait for it -> seconds taken. Nothing it makes is kept but
    what later batches reuse: loaded kernels, Triton's launchers, cuBLAS's and cuDNN's handles, pinned memory,
    captured decode graphs (whose buffers grow for longer inputs, as they would anyway).

    A process's first batch on CUDA pays ~0.85 s of such first uses in bfloat16 on an H100, most of it in that
    batch: the CLI pays it here, before the transcription's clock starts, on one device
    and in every `--devices` worker alike, and the summary line gives it as part of the loading time."""
    start = time.perf_counter()
    rows = max(1, rows)
    clip = read_input(speech_path(WARM_UP_CLIP), model.sample_rate)  # (L,)
    if batch_seconds:
        clip = clip[: max(1, int(batch_seconds / rows * model.sample_rate))]
    pin = model.device.type == "cuda"
    pad_to = pad_samples(model.device, model.dtype, model.sample_rate)
    batch = collate([(r, "<warm-up>", clip) for r in range(rows)], HostBuffers(keep=0, pin=pin), pad_to, pin)
    clock = StageClock(model.device, enabled=False)
    streams = _Streams(model.device)
    # with confidences on, their replay too: its first uses (cuDNN's LSTM) are paid here as the decode's are
    job = _decode(model, _start(model, batch, clock), clock, streams, None, model.options.confidence)
    for _ in _transcripts(model, job, clock, streams, False):
        pass
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    return time.perf_counter() - start


def warm_up_encoder(model: LoadedModel, batches: Iterable[Batch]) -> None:
    """Queue each batch's features and encoder as `transcribe_stream` does, and nothing after (no decode), for what
    that leaves behind: its shape's layer graph and the first uses of its products; then wait for them. Stops at
    the first that runs out of memory (its shape is then made when a batch of it comes)."""
    clock = StageClock(model.device, enabled=False)
    for batch in batches:
        if _start(model, batch, clock).out_of_memory:
            break
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
