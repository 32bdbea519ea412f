"""Transcription as a service: requests from many threads, batched across requests through the folder job's code.

    caller (the server's intake thread of an HTTP worker process):  samples received into samples_buffer (pinned
      beside a GPU) -> submit(audio, word_times, done) -> Scheduler.put(request, seconds)
    one batching thread:  Scheduler.take (the longest waiting first, at most `max_batch` rows and `batch_seconds`
      of padded audio; while the GPU is idle a batch waits up to `max_wait` for company)
      -> on CUDA each request's samples copied to the GPU into one padded batch (`gather`; on the CPU `collate`d
      into a reused host buffer) -> pipeline.transcribe_stream: features and encoder of the
      next batch are queued while this one decodes (one captured graph per size class) -> done(transcript, queue s)

The same thread steps the live streams (sessions.py: the realtime sessions' turns, uploads with stream=true) between
batches, once the batch before is answered: the decode steps' buffers and captured graphs are shared.

The batching thread takes the next batch while the one before decodes, without waiting for company: under
load requests pile up while a batch runs, so batches fill by themselves; it blocks on the scheduler only when
nothing is waiting, and then first hands transcribe_stream an empty batch so the last one is finished and
answered. A batch decodes as a batch, as long as its longest request: a decode step costs about the same for 3
rows as for 60, so rows joining a running decode as others finish (continuous batching) would run more steps
beside the encoder and serve less. An hour of audio (local attention) runs alone; a batch
that runs out of memory is retried one request at a time (transcribe_stream), and the request that alone does
not fit gets an error, not its neighbours.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable, Iterator

import torch

from graphscribe.io.audio import read_input
from graphscribe.io.hotwords import HotwordError
from graphscribe.model.decoding import size_class
from graphscribe.model.ngram import Tables
from graphscribe.model.packing import Packing
from graphscribe.output.transcript import Transcript
from graphscribe.runtime.defaults import default_batching, pad_samples
from graphscribe.runtime.loaded import FULL_ATTENTION_MAX_SECONDS
from graphscribe.runtime.pipeline import WARM_UP_CLIP, transcribe_stream, warm_up_encoder
from graphscribe.runtime.reading import READ_AHEAD, Batch, HostBuffers, collate, gather
from graphscribe.runtime.scheduler import Scheduler
from graphscribe.serve.ipc import BadRequest
from graphscribe.serve.sessions import LiveSessions, Said

if TYPE_CHECKING:
    from graphscribe.api import Model

log = logging.getLogger(__name__)

# The longest requests the warm-up readies a server for: the packed-row shapes of batches of them
# (`packed_shape_plans`: rows up to 448 encoder frames) and the decode buffers of every size class (512 frames), as
# long as LibriSpeech's longest utterances. A longer request meets what it needs when it comes.
PACKED_WARM_UP_SECONDS = 35.84
SHORT_FRAMES = 8  # encoder frames: the clip beside each long one in the batches of `packed_shape_plans`
# Warm-up on CUDA: one batch per decode size class up to --max-batch, each row this long (cut to the batch's
# padded-seconds cap): the decode buffers of the class then hold any input up to PACKED_WARM_UP_SECONDS without
# growing (and capturing the class's graph again under the first requests), and its token records have grown. On
# the CPU nothing is captured: one row of a second loads the kernels.
WARM_UP_SECONDS = {"cuda": PACKED_WARM_UP_SECONDS, "cpu": 1.0}
# Requests come in every length at once. In 16 bits the encoder packs a batch's clips end to end in fewer rows
# (packing.Packing), so a batch costs about its audio plus fixed costs: batches are whole, the longest requests
# waiting first. In float32 each clip keeps a row (its numbers are the CLI's), and a
# batch costs the GPU its rows times its longest request's length plus fixed costs: a batch is the run of the waiting
# requests (sorted by length) with the most audio per cost, where n rows whose longest lasts T seconds cost
# `fixed + (extra + n) * T` padded seconds (Scheduler's `cost`; fixed: a batch's own costs, extra: those that grow
# with its length whatever its rows, such as the decode loop's steps), fitted to the GPU's time per batch by rows and
# length (scripts/experiments/batch_cost.py). While no more than half a batch waits, batches are whole: there one
# batch's fixed costs weigh more than its padding. A request waiting over OVERDUE_SECONDS heads the next batch,
# whatever its length. The CPU's: fitted alike, for the demo model on a 2-core machine.
BATCH_COST = {"cuda-float32": (12.4, 0.58), "cpu": (2.9, 3.97)}
OVERDUE_SECONDS = 0.2
# Beside a GPU, a request of up to this many seconds is received into pinned memory (`samples_buffer`), which its
# batch copies to the GPU from (`pipeline.gather`). PyTorch's pinned-memory cache keeps such blocks by power-of-two
# size for reuse: the admitted requests (QUEUE_PER_ROW x max_batch) hold at most 4 MiB each. Longer ones, rare,
# are received into plain memory, copied to the GPU all the same.
PIN_SECONDS = 60.0


@dataclass(eq=False)
class Request:
    """One input waiting for, or in, a batch."""

    audio: torch.Tensor | None  # (L,) float32 at the model's rate; dropped once copied into its batch
    seconds: float
    word_times: bool  # token, word and segment times wanted
    # called once, on the batching thread: (transcript, `times`)
    done: Callable[[Transcript, tuple[float, float]], None]
    name: str = "<upload>"  # names the input in error messages
    put_at: float = 0.0  # time.monotonic()
    tree: Tables | None = None  # its own phrases' boosting tree (`LoadedModel.row_tree`)
    taken_at: float = 0.0  # when its batch was formed; 0 while it waits
    confidence: bool = False  # token and word confidences wanted (include[]=confidence)
    beam: int | None = None  # its own beam size (1: greedy); None: the model's `beam_size`

    def times(self) -> tuple[float, float]:
        """(seconds queued, seconds from its batch's forming to its answer): the access log's `queue` and `batch`."""
        if not self.taken_at:
            return 0.0, 0.0
        return max(0.0, self.taken_at - self.put_at), max(0.0, time.monotonic() - self.taken_at)


class Service:
    """A loaded model serving requests through one batching thread. `start` warms up; `ready` is set after.

    max_batch: rows per batch at most (None: the model's batch size, else the device's default). batch_seconds:
    padded seconds per batch at most (None: the model's, else the device's). max_wait: seconds a batch formed
    while the GPU is idle waits for more requests. on_batch(rows, padded_seconds): called for every batch
    formed (metrics). coming(): requests on their way, not submitted yet (the server's): a batch formed while the GPU
    is idle waits for company only while some are.
    """

    def __init__(
        self,
        model: Model,
        max_batch: int | None = None,
        max_wait: float = 0.005,
        batch_seconds: float | None = None,
        on_batch: Callable[[int, float], None] | None = None,
        coming: Callable[[], int] | None = None,
        on_said: Callable[[list[tuple[Hashable, Said]]], None] | None = None,
        live_streams: int = 0,
        on_live_step: Callable[[int, float], None] | None = None,
    ):
        files, seconds = default_batching(model.device, model.dtype)
        self.model = model
        self.max_batch = max_batch or model.options.batch_size or files
        self.batch_seconds = batch_seconds or model.options.batch_seconds or seconds
        self.max_wait = max_wait
        self.alone = 0  # batches decoded with no next one queued beside them: nothing waited (the GPU then idles)
        self.scheduler: Scheduler[int] = Scheduler(
            self.max_batch,
            self.batch_seconds,
            FULL_ATTENTION_MAX_SECONDS,
            OVERDUE_SECONDS,
            batch_cost(model),
            self.max_batch // 2,
        )
        self.pad_to = pad_samples(model.device, model.dtype, model.sample_rate)
        self.pin = model.device.type == "cuda"
        self.buffers = None if self.pin else HostBuffers(keep=READ_AHEAD + 3, pin=False)  # on CUDA: `gather`
        # request number -> Request, from `submit` to its answer; each number is written by one thread and popped
        # by the batching thread (dict operations are atomic under the GIL)
        self.requests: dict[int, Request] = {}
        self._numbers = itertools.count()
        self._on_batch = on_batch
        self.coming = coming
        self._settled = threading.Event()  # warm-up over, or failed
        self.ready = False
        self.error: BaseException | None = None  # why warming up failed
        self.warm_up_seconds = 0.0
        # live streams (the realtime sessions' turns), stepped by the batching thread between batches; warmed up
        # for up to `live_streams` at once
        self.live = None if on_said is None else LiveSessions(model, on_said, self.scheduler.nudge, on_live_step)
        self.live_streams = live_streams
        self._thread = threading.Thread(target=self._run, name="graphscribe-batch", daemon=True)

    def start(self) -> None:
        """Warm up, then serve, on the batching thread; `wait_ready` returns when it is warm."""
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once warm; raises what stopped the warm-up; False after `timeout` seconds."""
        if not self._settled.wait(timeout):
            return False
        if self.error is not None:
            raise self.error
        return True

    def samples_buffer(self, n: int) -> torch.Tensor:
        """An empty (n,) float32 tensor to receive a request's samples into before `submit`: in pinned memory beside
        a GPU (up to PIN_SECONDS), so that its batch copies it to the GPU with no copy on the host."""
        pin = self.pin and n <= PIN_SECONDS * self.model.sample_rate
        return torch.empty(n, dtype=torch.float32, pin_memory=pin)

    def submit(
        self,
        audio: torch.Tensor,
        word_times: bool,
        done: Callable[[Transcript, float], None],
        name: str = "<upload>",
        confidence: bool = False,
        hotwords: tuple[tuple[str, float | None], ...] = (),
        beam: int | None = None,
    ) -> Request | None:
        """Queue (L,) samples at the model's rate; `done(transcript, times)` (`Request.times`) is called on the
        batching thread when its batch is decoded (`transcript.error` set if it could not be transcribed).
        RuntimeError once closed. hotwords: the request's own phrases (`boosting.parse_request_hotwords`), boosted
        in its row only; a phrase that cannot be boosted, or phrases with a beam, are answered at once, on the
        caller's thread, with a `BadRequest`. beam: the request's beam size (1: greedy; None: the model's
        `beam_size`); rows of every size share a batch (`LoadedModel.decode`)."""
        beam = beam or self.model.options.beam_size
        try:
            tree = self._tree(hotwords, beam) if hotwords else None
        except HotwordError as err:
            done(BadRequest(source=name, error=str(err), param="hotwords"), (0.0, 0.0))
            return None
        seconds = audio.numel() / self.model.sample_rate
        request = Request(
            audio, seconds, word_times, done, name, time.monotonic(), tree=tree, confidence=confidence, beam=beam
        )
        n = next(self._numbers)
        self.requests[n] = request
        try:
            self.scheduler.put(n, request.seconds)
        except RuntimeError:
            del self.requests[n]
            raise
        return request

    def _tree(self, hotwords: tuple[tuple[str, float | None], ...], beam: int) -> Tables | None:
        if beam > 1:
            raise HotwordError(
                f"hotwords: a request's own phrases are boosted in greedy decoding, not with a beam of {beam} "
                "(the server's --beam, unless the request sends its own beam)"
            )
        return self.model.row_tree(hotwords)

    @property
    def in_flight(self) -> int:
        """Requests submitted and not answered yet (waiting or in a batch)."""
        return len(self.requests)

    def close(self, timeout: float | None = None) -> None:
        """Transcribe what is waiting, then stop the batching thread."""
        self.scheduler.close()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the batching thread
    def _run(self) -> None:
        if self.model.device.type == "cuda":  # the current device is per thread, and Triton launches on it
            torch.cuda.set_device(next(self.model.module.parameters()).device)  # "cuda" alone names no index
        warm_up: list[Batch] | None = None
        while True:
            try:
                if warm_up is None:
                    warm_up = self._warm_up()
                for n, transcript in transcribe_stream(self.model, _Batches(self, warm_up)):
                    self._answer(n, transcript)
                return  # closed, and everything answered
            except Exception as err:  # noqa: BLE001 - the server outlives one broken batch
                if not self._settled.is_set():
                    self.error = err
                    self._settled.set()
                    return
                log.error("transcription failed: %s", str(err).splitlines()[0] if str(err) else type(err).__name__)
                self._fail_taken(f"internal error: {err}")
                warm_up = []

    def _answer(self, n: int, transcript: Transcript) -> None:
        request = self.requests.pop(n, None)
        if request is not None:
            if not (request.confidence or self.model.options.confidence):  # its batch's, asked for by another
                for item in (*transcript.tokens, *transcript.words):
                    item.confidence = None
            request.done(transcript, request.times())

    def _fail_taken(self, message: str) -> None:
        """Answer the requests whose batches were lost with `message`; those still waiting stay queued."""
        for n, request in list(self.requests.items()):
            if request.taken_at:
                self._answer(n, Transcript(source=request.name, error=message))

    def _warm_up(self) -> list[Batch]:
        """Warm up before the first request: the encoder of a batch of each packed shape (`packed_shape_plans`;
        `pipeline.warm_up_encoder`), then the batches of `warm_up_plans`, of real speech, made as `_Batches` makes
        them, which transcribe_stream runs ahead of the requests: graphs are captured and kernels compiled."""
        from graphscribe.io.audio import speech_path

        start = time.perf_counter()
        model, rate = self.model, self.model.sample_rate
        clip = read_input(speech_path(WARM_UP_CLIP), rate)
        shapes = packed_shape_plans(model, self.max_batch, self.batch_seconds)
        plans = warm_up_plans(model, self.max_batch, self.batch_seconds)
        longest = max(max(plan) for plan in shapes + plans)
        tiled = clip.repeat(int(longest * rate) // clip.numel() + 1)

        def speech(seconds: float) -> torch.Tensor:
            return tiled[: max(1, int(seconds * rate))]

        warm_up_encoder(
            model,
            (
                gather(
                    [(i, "<warm-up>", speech(s)) for i, s in enumerate(plan)],
                    model.device,
                    model.copy_stream,
                    self.pad_to,
                )
                for plan in shapes
            ),
        )
        if self.live is not None and self.live_streams:
            self.live.warm_up(self.live_streams)
        left = len(plans)

        def warmed(_: Transcript, __: float) -> None:
            nonlocal left
            left -= 1
            if left == 0:  # every batch answered: every class and path warm
                self.warm_up_seconds = time.perf_counter() - start
                self.ready = True
                self._settled.set()

        batches = []
        for plan in plans:
            numbers = []
            for seconds in plan:
                n = next(self._numbers)
                self.requests[n] = Request(
                    speech(seconds), seconds, True, lambda *_: None, "<warm-up>", time.monotonic()
                )
                numbers.append(n)
            self.requests[numbers[-1]].done = warmed  # one answer a batch
            batches.append(self._take(numbers, counted=False))
        return batches

    def _take(self, numbers: list[int], counted: bool = True) -> Batch:
        """The requests `numbers` as one padded batch; their samples are dropped (copied into the batch)."""
        now = time.monotonic()
        requests = [self.requests[n] for n in numbers]
        rows = [(n, r.name, r.audio) for n, r in zip(numbers, requests)]
        if self.pin:  # on CUDA: from each request's memory to the GPU
            batch = gather(rows, self.model.device, self.model.copy_stream, self.pad_to)
        else:
            batch = collate(rows, self.buffers, self.pad_to)
        batch.word_times = any(r.word_times for r in requests)
        batch.confidence = any(r.confidence for r in requests)
        batch.trees = [r.tree for r in requests] if any(r.tree is not None for r in requests) else None
        own = self.model.options.beam_size
        beams = [r.beam or own for r in requests]
        batch.beams = beams if any(b != own for b in beams) else None
        for r in requests:
            r.audio, r.taken_at = None, now
        if counted and self._on_batch is not None:
            self._on_batch(len(numbers), batch.audio.numel() / self.model.sample_rate)
        return batch


def warm_up_plans(model: Model, max_batch: int, batch_seconds: float) -> list[list[float]]:
    """The warm-up's batches, each a list of its inputs' seconds: on CUDA one batch per decode size class up to
    max_batch (the classes the scheduler's batches fall in), and in 16 bits two of mixed lengths, whose clips share
    rows from the samples on (`Model.front_packing`): the kernels of those paths compile at the warm-up, not under
    the first requests, which with Triton's cache empty (a fresh machine) would wait about 2 s for them. On the CPU
    one input of a second."""
    longest = WARM_UP_SECONDS[model.device.type]
    if model.device.type != "cuda":
        return [[min(longest, batch_seconds)]]
    sizes = sorted({min(1 << k, max_batch) for k in range(size_class(max_batch).bit_length())})
    plans = [[min(longest, batch_seconds / rows)] * rows for rows in sizes]
    if model.packs_rows:
        for rows, top in ((max_batch, longest), (max(2, max_batch // 2), longest / 2)):
            plans.append([min(top * (i + 1) / rows, batch_seconds / rows) for i in range(rows)])
    return plans


def packed_shape_plans(model: Model, max_batch: int, batch_seconds: float) -> list[list[float]]:
    """In 16 bits on CUDA, a batch (its inputs' seconds) for each shape of packed rows that a server's batch of
    requests of up to PACKED_WARM_UP_SECONDS can take (`Packing`: R rows of L frames, L a multiple of
    `Packing.ALIGN`, R up to half of max_batch), largest first; none elsewhere. Each has 2R clips: R of nearly L
    frames, each alone in a row with one of SHORT_FRAMES beside it. A shape met for the first time costs its layer
    graph's capture and the first uses of its products (~15-20 ms on the H100): without them a server's first pass
    over a folder meets a new shape in about 30 of 100 batches and runs at about 83% of a later pass's speed."""
    if model.device.type != "cuda" or not model.packs_rows:
        return []
    cfg = model.cfg
    per_frame = cfg.features.hop_length * cfg.encoder.subsampling_factor  # samples an encoder frame
    gap = model.module.encoder.gap  # frames the encoder's packing leaves between clips

    def seconds(frames: int) -> float:  # a clip of exactly `frames` encoder frames, half a hop to spare
        return (frames * per_frame - cfg.features.hop_length // 2) / model.sample_rate

    top = int(PACKED_WARM_UP_SECONDS * model.sample_rate) // per_frame
    shapes = [
        (rows, length)
        for length in range(Packing.ALIGN, top + 1, Packing.ALIGN)
        for rows in range(1, max_batch // 2 + 1)
        if 2 * rows * seconds(length) <= batch_seconds
    ]
    shapes.sort(key=lambda shape: -shape[0] * shape[1])  # the static buffers are made once, for the largest
    return [[seconds(length - gap - SHORT_FRAMES)] * rows + [seconds(SHORT_FRAMES)] * rows for rows, length in shapes]


def batch_cost(model: Model) -> tuple[float, float] | None:
    """The Scheduler's `cost` for `model` (BATCH_COST); None where its encoder packs rows (`Model.packs_rows`)."""
    if model.packs_rows:
        return None
    return BATCH_COST["cuda-float32" if model.device.type == "cuda" else "cpu"]


class _Batches:
    """transcribe_stream's source of batches: the warm-up batches, then the scheduler's, taken while the one
    before decodes; an empty batch whenever nothing waits, so the one before is finished and answered before the
    thread blocks."""

    def __init__(self, service: Service, warm_up: list[Batch]):
        self.service, self.warm_up = service, warm_up
        self.items = service.requests  # named only for unreadable rows, which never come: uploads are decoded first

    def __iter__(self) -> Iterator[Batch]:
        scheduler, live = self.service.scheduler, self.service.live
        yield from self.warm_up
        queued = bool(self.warm_up)  # a batch is queued on the GPU, not yet decoded
        step_in = None  # seconds until the live streams' next step
        while True:
            if live is not None:
                live.apply_ops()
                step_in = live.step_in()
                if step_in == 0.0:
                    if queued:  # the batch before answered first: its decode buffers are the streams' too
                        yield _empty_batch()
                        queued = False
                    live.step()
                    continue
            if queued:  # the GPU has work: take what waits, no waiting for company
                numbers = scheduler.take(timeout=0.0)
            else:
                numbers = scheduler.take(wait=self.service.max_wait, company=self.service.coming, timeout=step_in)
                if numbers is None and (scheduler.closed or live is None):
                    return  # closed and empty
            if numbers is None:
                if queued:
                    self.service.alone += 1
                    yield _empty_batch()
                queued = False
                continue
            yield self.service._take(numbers)
            queued = True

    def recycle(self, batch: Batch) -> None:
        if batch.storage is not None:
            self.service.buffers.give(batch.storage)
            batch.storage = None

    def close(self) -> None:
        """Nothing to stop: the scheduler is the service's (closed by `Service.close`)."""


def _empty_batch() -> Batch:
    return Batch([], [], torch.zeros(0, 0), torch.zeros(0, dtype=torch.long))
