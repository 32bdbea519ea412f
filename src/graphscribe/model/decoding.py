"""Greedy TDT / RNN-T decoding: one step function, run eagerly or replayed from a CUDA graph.

The rules are NeMo's label-looping greedy decoder's (tdt_label_looping.py):
  - token = argmax of the token logits, d = durations[argmax of the duration logits];
  - a blank with d == 0 advances one frame; a blank leaves the prediction state alone;
  - a token is emitted at frame t, updates the prediction net, and moves t by d (may be 0);
  - after `max_symbols` tokens on one frame with d == 0, the frame is forced on by one;
  - a row stops when t reaches its length. Plain RNN-T: blank d = 1, token d = 0.

One `decode_step` looks at a window of W frames at once: the joint runs on frames
t .. t+W-1 with the same prediction output (one matrix product, which costs what one
frame costs: the joint's weights are read once), then the chain of blanks from t is
followed inside the window by pointer jumping. So one step does what NeMo's inner
"skip blanks" loop and one emission do, and the number of steps is about the number of
tokens instead of the number of joint evaluations. Frames off the chain are computed
and ignored, so the tokens are NeMo's.

All state lives in `DecodeBuffers`, allocated once per batch size class and written in
place, so the step can be captured in a CUDA graph (`graphs.py`) and replayed; the eager
path calls the very same function. On CUDA that function is `fused_step.FusedStep`: the same
step in four Triton kernels, tested against `decode_step`, which stays the CPU path.

Shallow fusion (an n-gram LM, phrase boosting: `Fusion`) is NeMo's label-looping greedy with `fusion_models`: the
joint alone decides blank or not; where it picks a token, the token is the argmax of its token logits plus each
model's weight x score, and each model's state follows the emitted token.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from graphscribe.io.config import DecodingConfig
from graphscribe.model import import_kernels
from graphscribe.model.fusion import Fusion
from graphscribe.model.heads import Joint, PredictionNet
from graphscribe.model.ngram import TokenModel
from graphscribe.model.row_boosting import RowTrees

log = logging.getLogger(__name__)

STEPS_PER_CHECK = 4  # decode steps run (or replayed) at a time; even: the fused step's state alternates buffers
# Of the steps the rate so far predicts, the share a round queues before its host read (`round_steps`). On the H100
# (one row) 0.7 and 1.0 took the same time within noise on the 7.4 s and 77 s tiers (a finished row's step is
# cheap), and 0.7 queues the fewest steps after a clip's end: 7.4 s 36 for 34 needed (1.0: 40; the rate of the last
# round alone: 48), at the cost of more host reads on long clips (77 s: 9, 1.0: 5).
ROUND_SHARE = 0.7


@dataclass
class DecodeState:
    """Where a row's decoding stands at the end of a chunk, to go on with the next chunk (streaming), as NeMo's
    label-looping decoders carry it (`BatchedLabelLoopingState`): the prediction net's state after the last token,
    its projected output, and how many frames past the chunk's end the last step jumped (a TDT duration)."""

    h: torch.Tensor  # (L, B, H) LSTM state
    c: torch.Tensor  # (L, B, H)
    g: torch.Tensor  # (B, J) projected prediction output
    skip: torch.Tensor  # (B,) frames of the next chunk to skip
    fusion: torch.Tensor | None = None  # (B, K) each fused model's state (NeMo's fusion_states_list); None: start

    def parts(self) -> tuple[torch.Tensor, ...]:
        """The state's tensors, the row dimension -2 in the 3-D ones and 0 in the others (a stream engine's pools)."""
        return (self.h, self.c, self.g, self.skip) + ((self.fusion,) if self.fusion is not None else ())


@dataclass
class Hypothesis:
    token_ids: list[int]
    frames: list[int]  # encoder frame at which each token was emitted
    durations: list[int]  # predicted duration of each token, in encoder frames (RNN-T: 0)
    steps: int = 0  # decode steps spent on the batch this clip was in (its slowest row's)
    confidences: list[float] | None = None  # each token's, when asked for (`LoadedModel.add_confidences`)
    # (tokens, J) the prediction output each token's step read, when kept (`GreedyDecoder(predictions=True)`)
    predictions: torch.Tensor | None = field(default=None, compare=False, repr=False)


class DecodeBuffers:
    """Static state of a batch of N rows, allocated once and written in place by `decode_step`."""

    def __init__(
        self,
        n: int,
        max_frames: int,
        window: int,
        joint: Joint,
        prediction: PredictionNet,
        durations: tuple[int, ...],
        max_symbols: int,
        device: torch.device,
        dtype: torch.dtype,
        fusion: list[tuple[TokenModel, float]] = (),
        predictions: bool = False,
    ):
        j, layers, hidden = joint.cfg.hidden, prediction.cfg.layers, prediction.cfg.hidden
        state_dtype = prediction.prediction.embed.weight.dtype  # the prediction net may stay float32
        self.n, self.max_frames, self.window = n, max_frames, window
        # token slots per row: one a frame to start with (Parakeet emits about 0.3), grown between rounds when a row
        # could fill them (`grow_records`); + 1: a slot written (and not counted) by rows that do not emit
        self.max_tokens = max_frames + 1
        ints = dict(device=device, dtype=torch.long)
        self.rows = torch.arange(n, **ints)  # (N,)
        self.offsets = torch.arange(window, **ints)  # (W,)
        durations = durations or (0,)
        # skip_table[is_blank, duration index]: frames to move on; a blank's duration 0 counts as 1.
        self.skip_table = torch.tensor([list(durations), [max(d, 1) for d in durations]], **ints)  # (2, D)
        self.max_skip = max(max(durations), 1)  # frames a blank moves on at most
        self.positions = torch.arange(window + self.max_skip, **ints)  # (W + max_skip,) window positions and beyond
        self.enc = torch.zeros(n, max_frames, j, device=device, dtype=dtype)  # (N, T, J) projected encoder
        # lengths, current frame, tokens emitted so far, steps taken while active: rows of one tensor, which a host
        # read copies whole (`Progress`); an even number of columns keeps each row 16-byte aligned, as the kernels
        # are compiled for
        self.counters = torch.zeros(4, n + n % 2, **ints)  # (4, N or N + 1)
        self.lengths, self.t, self.count, self.row_steps = (row[:n] for row in self.counters)
        self.active = torch.zeros(n, device=device, dtype=torch.bool)
        self.h = torch.zeros(layers, n, hidden, device=device, dtype=state_dtype)  # (L, N, H)
        self.c = torch.zeros(layers, n, hidden, device=device, dtype=state_dtype)
        self.g = torch.zeros(n, j, device=device, dtype=dtype)  # (N, J) projected prediction output
        self.last_frame = torch.zeros(n, **ints)  # frame of the last emitted token
        self.run = torch.zeros(n, **ints)  # tokens emitted in a row on last_frame
        self.records = torch.zeros(n, self.max_tokens, 3, device=device, dtype=torch.int32)  # [token, frame, duration]
        self.scratch: dict | None = None  # the fused step's, made on its first call
        self.parity = 0  # which of the fused step's two state buffers holds the state (0: h and c above)
        self.fusion = Fusion(list(fusion), n, device) if fusion else None
        # with confidences: beside each token slot, the prediction output its step read (`keep_prediction`)
        self.predictions = torch.zeros(n, self.max_tokens, j, device=device, dtype=dtype) if predictions else None

    def grow_records(self, slots: int) -> None:
        """At least `slots` token slots per row, keeping what is recorded (a captured graph must be made again)."""
        size = max(slots, 2 * self.max_tokens)
        grown = torch.zeros(self.n, size, 3, device=self.records.device, dtype=self.records.dtype)
        grown[:, : self.max_tokens].copy_(self.records)
        if self.predictions is not None:
            kept = self.predictions.new_zeros(self.n, size, self.predictions.shape[2])
            kept[:, : self.max_tokens].copy_(self.predictions)
            self.predictions = kept
        self.records, self.max_tokens = grown, size

    def keep_prediction(self) -> None:
        """Before a step: each row's prediction output into its next token slot, the one a token of this step is
        recorded in (a row that does not emit writes it again at its next step). A token's confidence is measured
        on the logits of the step that emitted it: these and its frame give them back without running the
        prediction net over the tokens again (`confidence.measured`)."""
        slot = self.count[:, None, None].expand(self.n, 1, self.predictions.shape[2])
        self.predictions.scatter_(1, slot, self.g[:, None, :])

    def load(self, enc_projected: torch.Tensor, lengths: torch.Tensor) -> None:
        """A batch's input: enc_projected (B, T, J), lengths (B,) for the first B <= N rows (the others stay empty)."""
        b, t = enc_projected.shape[:2]
        self.enc[:b, :t].copy_(enc_projected)
        self.lengths.zero_()
        self.lengths[:b].copy_(lengths)

    def restart(self, start: tuple[torch.Tensor, ...]) -> None:
        """Every row back to its first frame and start = (h0, c0, g0), the state after the start symbol (N rows),
        or (h0, c0, g0, t0) with each row's first frame; in-place writes only (captured as a graph by
        `GreedyDecoder`)."""
        h0, c0, g0, *first = start
        if first:
            self.t.copy_(first[0])
        else:
            self.t.zero_()
        torch.lt(self.t, self.lengths, out=self.active)
        self.h.copy_(h0)
        self.c.copy_(c0)
        self.g.copy_(g0)
        self.last_frame.fill_(-1)
        self.run.zero_()
        self.count.zero_()
        self.row_steps.zero_()
        self.parity = 0
        if self.fusion is not None:
            self.fusion.reset()


def decode_step(buf: DecodeBuffers, prediction: PredictionNet, joint: Joint, blank_id: int, max_symbols: int) -> None:
    """One greedy step for all N rows: skip blanks through a window of frames, emit at most one token.

    Inside a captured graph: only in-place writes to `buf`, no host reads.
    """
    n, w = buf.n, buf.window
    vocab = joint.num_token_logits
    frame = buf.t[:, None] + buf.offsets  # (N, W)
    in_clip = frame < buf.lengths[:, None]
    f = buf.enc[buf.rows[:, None], frame.clamp(max=buf.max_frames - 1)]  # (N, W, J)
    logits = joint.logits(f, buf.g[:, None, :])  # (N, W, V + 1 + D)
    tokens = logits[..., :vocab].argmax(dim=-1)  # (N, W)
    blank = tokens == blank_id
    if logits.shape[-1] > vocab:  # TDT: the duration, where a blank's 0 counts as 1
        durations = buf.skip_table[blank.long(), logits[..., vocab:].argmax(dim=-1)]  # (N, W)
    else:  # RNN-T: tokens stay on their frame, blanks move on by one
        durations = blank.long()

    # Follow blanks from position 0: next[i] = i + d_i for a blank inside the clip, else i (stop).
    # Positions >= W (past the window) stop too; 2**k hops reach the end of any chain in the window.
    hop = buf.positions.repeat(n, 1)  # (N, W + max_skip)
    hop[:, :w] += durations * (blank & in_clip)
    for _ in range(math.ceil(math.log2(w)) if w > 1 else 0):
        hop = hop.gather(1, hop)
    landing = hop[:, 0]  # (N,) window position where the chain stops
    at = landing.clamp(max=w - 1)[:, None]
    token = tokens.gather(1, at)[:, 0]  # (N,)
    if buf.fusion is not None:
        token = buf.fusion.choose(logits, at, token, blank_id)
    duration = durations.gather(1, at)[:, 0]
    landing_frame = buf.t + landing
    emit = buf.active & (landing < w) & (landing_frame < buf.lengths)  # landed on a token
    if buf.fusion is not None:
        buf.fusion.move(token, emit)

    # Record (token, frame, duration) in the row's next slot; rows that do not emit write a slot they do not count.
    record = torch.stack([token, landing_frame, duration], dim=1)[:, None, :].to(buf.records.dtype)  # (N, 1, 3)
    buf.records.scatter_(1, buf.count[:, None, None].expand(n, 1, 3), record)
    buf.count.add_(emit)
    same_frame = buf.last_frame == landing_frame
    torch.where(emit, buf.run * same_frame + 1, buf.run, out=buf.run)
    torch.where(emit, landing_frame, buf.last_frame, out=buf.last_frame)

    # Prediction net for the emitted tokens; the other rows keep their state.
    out, h, c = prediction.step(token, buf.h, buf.c)
    g = joint.project_prediction(out.to(buf.g.dtype))
    keep = emit[None, :, None]
    torch.where(keep, h, buf.h, out=buf.h)
    torch.where(keep, c, buf.c, out=buf.c)
    torch.where(emit[:, None], g, buf.g, out=buf.g)

    force = emit & (buf.run >= max_symbols) & (duration == 0)  # max_symbols on this frame: move on
    advance = landing + (duration + force) * emit
    buf.row_steps.add_(buf.active)
    buf.t.add_(advance * buf.active)
    torch.lt(buf.t, buf.lengths, out=buf.active)


@dataclass
class Progress:
    """The buffers' counters as one host read found them (a copy, no kernel), for the first b rows."""

    remaining: int  # frames still to go for the furthest-behind row
    emitted: int  # most tokens recorded in a row
    counts: list[int]  # tokens recorded, by row
    steps: int  # most steps a row took while active

    @classmethod
    def read(cls, buf: DecodeBuffers, b: int) -> "Progress":
        lengths, t, count, steps = (row[:b] for row in buf.counters.tolist())
        return cls(max(max(x - y for x, y in zip(lengths, t)), 0), max(count), count, max(steps))


def round_steps(buf: DecodeBuffers, remaining: int, first: int, queued: int, rate: float | None = None) -> int:
    """Steps to queue before the next host read, for `remaining` frames still to go (`first` before the first
    step: the batch's frames, `queued` steps queued since).

    At least the lower bound (a step moves a row at most W + max_skip + 1 frames); after a first round, ROUND_SHARE
    of what the rate so far predicts, at most one a frame. A row's rate changes along a clip (a run of blanks goes
    fast, speech slowly); a step queued after the last row finishes still costs its launches (its kernels skip
    their products), and a round costs a host read that leaves the GPU idle. `rate`: frames a step to predict the
    first round by (an earlier decode's), where the host has other work before its first read.
    """
    lower = -(-remaining // (buf.window + buf.max_skip + 1))
    if queued == 0 or first <= remaining:
        if queued == 0 and rate:
            return max(lower, min(remaining, math.ceil(ROUND_SHARE * remaining / rate)))
        return lower
    rate = (first - remaining) / queued  # frames a step so far, of the furthest-behind row
    return max(lower, min(remaining, math.ceil(ROUND_SHARE * remaining / rate)))


def frame_capacity(frames: int) -> int:
    """Frames the buffers hold for inputs of `frames`: powers of two up to 4096 (few recaptures), then multiples of
    4096 (an hour is 45 000 frames: no doubling)."""
    return max(64, 1 << math.ceil(math.log2(max(frames, 1)))) if frames <= 4096 else -(-frames // 4096) * 4096


# Frames a step looks at, by batch size class, measured on the H100 (scripts/experiments/tune_step.py): a wider window
# skips more blanks per step, but multiplies the joint's rows; from 16 rows on, one frame a step is fastest.
WINDOWS = {1: 8, 2: 4, 4: 2, 8: 2}


def default_window(n: int) -> int:
    """Frames looked at per step for a batch of n rows (its size class)."""
    return WINDOWS.get(size_class(n), 1)


def size_class(n: int) -> int:
    """Rows of the buffers (and graph) that a batch of n uses: a power of two up to 128, then multiples of 64.

    A partial last batch replays the graph of its class with the spare rows empty, instead of capturing anew.
    """
    return 1 << (n - 1).bit_length() if n <= 128 else -(-n // 64) * 64


class GreedyDecoder:
    """Batched greedy decoding of encoder output; `graphs=True` replays captured CUDA graphs (CUDA only).

    `fused`: the Triton step on CUDA (None: on CUDA when Triton is there); the PyTorch `decode_step` otherwise.
    `fusion`: token models (an n-gram LM, a boosting tree) with their weights, fused into every step (`Fusion`).
    """

    def __init__(
        self,
        prediction: PredictionNet,
        joint: Joint,
        cfg: DecodingConfig,
        graphs: bool,
        window: int | None = None,
        fused: bool | None = None,
        fusion: list[tuple[TokenModel, float]] | None = None,
        predictions: bool = False,
    ):
        self.prediction, self.joint, self.cfg = prediction, joint, cfg
        self.fusion = list(fusion or [])
        self.predictions = predictions  # each token's step's prediction output kept (`DecodeBuffers`), for confidence
        self.fused = fused
        # cuDNN wants the LSTM weights in one chunk (lost by .to(dtype)); otherwise it copies them at every
        # call, which also breaks graph capture.
        prediction.prediction.dec_rnn.lstm.flatten_parameters()
        self.blank_id = prediction.cfg.vocab_size
        self.graphs = graphs
        self.window = window
        self._fused_step = None  # FusedStep, made for the first CUDA batch
        self._buffers: dict[int, DecodeBuffers] = {}  # by batch size class N
        self._captured: dict = {}  # CapturedSteps by batch size class N, for the buffers above; they share a pool
        self._restarts: dict = {}  # by batch size class N: `buf.restart` and the fused step's `start` as one graph
        self._start: dict = {}  # by (device, dtype): the state after the start symbol, for one row (`start_state`)
        self.capture_seconds = 0.0  # spent capturing graphs, reported apart from decoding
        self.compile_seconds = 0.0  # spent preparing and compiling the fused step (first use; Triton caches on disk)
        self.host_reads = 0  # rounds of the last decode: each one host read (a wait for the GPU)
        self.queued_steps = 0  # steps the last decode ran (or replayed), finished rows' included
        self.rate: float | None = None  # frames a queued step over the last decode: its first round's prediction

    def _step_fn(self, device: torch.device, dtype: torch.dtype):
        """The one step for this device: the fused kernels on CUDA, unless unavailable or not wanted."""
        if self.fused is False or (device.type != "cuda" and not self.fused):
            return decode_step
        if self._fused_step is None:
            try:
                FusedStep = import_kernels("fused_step").FusedStep

                start = time.perf_counter()
                self._fused_step = FusedStep(self.prediction, self.joint, dtype, self.cfg.durations)
                self.compile_seconds += time.perf_counter() - start
            except (ImportError, ValueError) as err:  # no Triton, or a model it does not take: the PyTorch step
                log.warning("fused decode step unavailable (%s); using the PyTorch step", err)
                self.fused = False
                return decode_step
        return self._fused_step

    def _check_fused(self, buf: DecodeBuffers, step, start: tuple[torch.Tensor, ...]) -> object:
        """The step to use on these buffers (whose state it leaves spent): the fused step, checked by one call on
        its first buffers (it compiles its kernels), or the PyTorch step if that fails."""
        if step is decode_step or buf.scratch is not None:
            return step
        begin = time.perf_counter()
        try:
            _restart_eagerly(buf, step, start)
            step(buf, self.prediction, self.joint, self.blank_id, self.cfg.max_symbols)
            if buf.t.is_cuda:
                torch.cuda.synchronize(buf.t.device)
        except (RuntimeError, ValueError, TypeError) as err:  # Triton's compile errors are RuntimeErrors
            # an optimisation must never stop a transcription: the reference step gives the same tokens
            log.warning("fused decode step failed (%s); using the PyTorch step", str(err).splitlines()[0])
            self.fused = False
            step = decode_step
        self.compile_seconds += time.perf_counter() - begin
        return step

    def _buffers_for(self, n: int, frames: int, device: torch.device, dtype: torch.dtype) -> DecodeBuffers:
        buf = self._buffers.get(n)
        if buf is None or buf.max_frames < frames or buf.enc.device != device or buf.enc.dtype != dtype:
            buf = DecodeBuffers(
                n,
                frame_capacity(frames),
                self.window or default_window(n),
                self.joint,
                self.prediction,
                self.cfg.durations,
                self.cfg.max_symbols,
                device,
                dtype,
                self.fusion,
                self.predictions,
            )
            self._buffers[n] = buf
            self._captured.pop(n, None)
            self._restarts.pop(n, None)
        return buf

    def _restarter(self, buf: DecodeBuffers, step, start: tuple[torch.Tensor, ...]):
        """A callable that puts every row of `buf` back to its start (`buf.restart`, then the fused step's
        `start`): a graph replay with graphs (a dozen small launches in one), eager calls otherwise."""
        eager = functools.partial(_restart_eagerly, buf, step, start)
        if not (self.graphs and buf.enc.is_cuda):
            return eager
        graph = self._restarts.get(buf.n)
        if graph is None:
            begin = time.perf_counter()
            eager()  # once before the capture: the start kernel is loaded, and capturing runs nothing
            try:
                from graphscribe.model.graphs import capture, pool_of

                graph = torch.cuda.CUDAGraph()
                capture(graph, eager, pool_of(list(self._captured.values())))
                torch.cuda.synchronize(buf.enc.device)
            except RuntimeError as err:  # capture is an optimisation: restart eagerly rather than fail
                log.warning("CUDA graph capture failed (%s); decoding eagerly", str(err).splitlines()[0])
                self.graphs = False
                return eager
            self.capture_seconds += time.perf_counter() - begin
            self._restarts[buf.n] = graph

        def replay() -> None:
            graph.replay()
            buf.parity = 0  # as `restart` sets it on the host

        return replay

    def _runner(self, buf: DecodeBuffers, step, restore, warm_up: bool = True):
        """A callable that runs STEPS_PER_CHECK steps: a graph replay, or eager calls of the same step.

        A graph is captured on first use, after eager warm-up calls and `restore()`; `warm_up=False` captures a
        graph again in the middle of a decode (the buffers were regrown), leaving the state as it is."""

        from graphscribe.model.graphs import eager_steps, step_runner

        def one() -> None:
            if buf.predictions is not None:
                buf.keep_prediction()
            step(buf, self.prediction, self.joint, self.blank_id, self.cfg.max_symbols)

        if self.graphs and buf.enc.is_cuda:
            return step_runner(self, buf.n, one, STEPS_PER_CHECK, restore, warm_up, "decoding")
        return eager_steps(one, STEPS_PER_CHECK)

    def start_state(self, n: int, device: torch.device, dtype: torch.dtype):
        """Prediction state and projected output after the start symbol (blank), as NeMo starts, for n rows.

        The same for every row and every batch: computed once for one row and repeated, so that a row starts from
        the same bits in any batch (cuDNN's LSTM gave other bits from 32 rows on than at 2-16),
        and a decode does not pay for it again. Views of the kept tensors: a captured restart reads them."""
        one = self._start.get((device, dtype))
        if one is None:
            h, c = self.prediction.initial_state(1, device, self.prediction.prediction.embed.weight.dtype)
            start = torch.full((1,), self.blank_id, device=device, dtype=torch.long)
            out, h, c = self.prediction.step(start, h, c)
            one = self._start[(device, dtype)] = (h, c, self.joint.project_prediction(out.to(dtype)))
        h, c, g = one
        return h.expand(-1, n, -1), c.expand(-1, n, -1), g.expand(n, -1)

    @torch.inference_mode()
    def decode(
        self, encoded: torch.Tensor, lengths: torch.Tensor, queued: Callable[[], None] | None = None, trees=None
    ) -> list[Hypothesis]:
        """encoded (B, T, D) encoder output, lengths (B,) valid frames -> one hypothesis per row. queued: called once,
        when the first round of steps is queued and before the host first waits for the device (the pipeline
        launches its next batch there, beside this one's steps). trees: each row's boosting tree (`ngram.Tables`,
        None: no phrases), with a `RowTrees` among the fusion models."""
        return self._decode(encoded, lengths, queued, None, trees)[0]

    @torch.inference_mode()
    def decode_chunk(
        self, encoded: torch.Tensor, lengths: torch.Tensor, state: DecodeState | None, trees=None
    ) -> tuple[list[Hypothesis], DecodeState]:
        """A chunk of each row's stream: (B, T, D) encoder output and (B,) valid frames, decoded from where `state`
        left each row (None: every row at its start) -> hypotheses (frames local to the chunk) and the state at
        the chunk's end. The same steps as `decode`; only the start differs. trees: as `decode`'s, the same
        for a row from chunk to chunk."""
        if state is None:
            state = self.fresh_state(encoded.shape[0], encoded.device, encoded.dtype)
        return self._decode(encoded, lengths, None, state, trees)

    def fresh_state(self, b: int, device: torch.device, dtype: torch.dtype) -> DecodeState:
        """The state of b rows before their first chunk: after the start symbol, nothing to skip."""
        h, c, g = self.start_state(b, device, dtype)  # dtype: the joint's, as the encoder output's
        fusion = None
        if self.fusion:
            fusion = torch.tensor([[model.start_state for model, _ in self.fusion]] * b, device=device)  # (B, K)
        return DecodeState(h.clone(), c.clone(), g.clone(), torch.zeros(b, dtype=torch.long, device=device), fusion)

    def _decode(
        self,
        encoded: torch.Tensor,
        lengths: torch.Tensor,
        queued: Callable[[], None] | None,
        carried: DecodeState | None,
        trees=None,
    ) -> tuple[list[Hypothesis], DecodeState | None]:
        b, frames = encoded.shape[:2]
        device = encoded.device
        enc_projected = self.joint.project_encoder(encoded)  # (B, T, J), once for all frames
        step = self._step_fn(device, enc_projected.dtype)
        n = b if step is decode_step and device.type != "cuda" else size_class(b)  # graphs are kept per class
        row_trees = next((m for m, _ in self.fusion if isinstance(m, RowTrees)), None)
        if row_trees is not None and row_trees.load(trees or [], n):  # the tables grew: capture on the new ones
            self._captured.clear()
            self._restarts.clear()
        buf = self._buffers_for(n, frames, device, enc_projected.dtype)
        start = self.start_state(n, device, enc_projected.dtype)
        buf.load(enc_projected, lengths.to(device))
        step = self._check_fused(buf, step, start)
        if carried is None:
            restart = self._restarter(buf, step, start)
        else:  # each row from its own state: an eager restart (a few copies), the steps replayed as usual
            restart = functools.partial(_restart_carried, buf, step, _rows(start, carried, b), carried.fusion)
        restart()
        run = self._runner(buf, step, restart)
        # Before any step no row has more than `frames` to go and none has a token: the first round needs no read.
        done = Progress(frames, 0, [0] * b, 0)
        self.host_reads = self.queued_steps = 0
        # with other work for the host before its first read (`queued`), the first round is as long as the last
        # decode's rate predicts, not the lower bound: the GPU decodes on while the host launches the next batch
        rate = self.rate if queued is not None else None
        while done.remaining > 0:
            steps = round_steps(buf, done.remaining, frames, self.queued_steps, rate=rate)
            steps = math.ceil(steps / STEPS_PER_CHECK) * STEPS_PER_CHECK
            self.queued_steps += steps
            if done.emitted + steps >= buf.max_tokens:  # a row could fill its token slots in this round
                buf.grow_records(done.emitted + steps + 1)
                self._captured.pop(buf.n, None)
                run = self._runner(buf, step, restart, warm_up=False)
            for _ in range(steps // STEPS_PER_CHECK):
                run()
            if queued is not None:
                queued()
                queued = None
            done = Progress.read(buf, b)  # the one host read per round
            self.host_reads += 1
        if self.queued_steps:
            self.rate = frames / self.queued_steps
        hyps = _collect(buf, done, keep=carried is None)  # a stream's chunks have no confidences
        if carried is None:
            return hyps, None
        # an even number of steps leaves the LSTM state in buf.h, buf.c (the fused step alternates two copies)
        skip = (buf.t[:b] - buf.lengths[:b]).clamp(min=0)
        fusion = buf.fusion.carry_out(b) if buf.fusion is not None else None
        return hyps, DecodeState(buf.h[:, :b].clone(), buf.c[:, :b].clone(), buf.g[:b].clone(), skip, fusion)


def _restart_eagerly(buf: DecodeBuffers, step, start: tuple[torch.Tensor, ...]) -> None:
    """`buf.restart`, then the fused step's W_hh h of the start state (which its first step reads)."""
    buf.restart(start)
    if step is not decode_step:
        step.start(buf)


def _restart_carried(buf: DecodeBuffers, step, start: tuple[torch.Tensor, ...], fusion: torch.Tensor | None) -> None:
    """`_restart_eagerly`, then the fusion models' states carried from the last chunk into their rows."""
    _restart_eagerly(buf, step, start)
    if fusion is not None and buf.fusion is not None:
        buf.fusion.carry_in(fusion)


def _rows(start: tuple[torch.Tensor, ...], state: DecodeState, b: int) -> tuple[torch.Tensor, ...]:
    """The start of N rows whose first b go on from `state` and the rest (spare rows) start afresh."""
    h0, c0, g0 = (x.clone() for x in start)
    h0[:, :b], c0[:, :b], g0[:b] = state.h, state.c, state.g
    first = torch.zeros(g0.shape[0], dtype=torch.long, device=g0.device)
    first[:b] = state.skip
    return h0, c0, g0, first


def _collect(buf: DecodeBuffers, done: Progress, keep: bool = True) -> list[Hypothesis]:
    """The records of the rows the last host read counted, as hypotheses: one more host read. keep: with the
    prediction outputs the buffers kept, if any."""
    b, width = len(done.counts), done.emitted
    records = buf.records[:b, :width].cpu().numpy()  # (B, width, 3)
    # a live step's rows mostly emit nothing: those skip NumPy (three tolist calls a row were a stream's largest
    # host cost at 80 ms chunks)
    hyps = [
        Hypothesis(*records[i, :count].T.tolist(), done.steps) if count else Hypothesis([], [], [], done.steps)
        for i, count in enumerate(done.counts)
    ]
    if keep and buf.predictions is not None:  # one copy for the batch (the buffers are the next decode's), a view a row
        kept = buf.predictions[:b, :width].clone()
        for i, hyp in enumerate(hyps):
            hyp.predictions = kept[i, : done.counts[i]]
    return hyps
