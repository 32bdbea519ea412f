"""Batched beam search for TDT and RNN-T: NeMo 3.0's `malsd_batch` (modified ALSD), with shallow fusion.

The rules are NeMo's `ModifiedALSDBatched{TDT,RNNT}Computer.modified_alsd_torch` and `BatchedBeamHyps`
(tests/fixtures/nemo-beam/README.md lists them with NeMo's lines). Per input a beam of K hypotheses, each with a
score, a frame t, a prediction-net state, an LM state per fusion model and its label history; every step extends
every hypothesis by exactly one symbol (blank or token):

  1. the joint on each hypothesis' frame; TDT: top-K of log p(v) + log p(d) over (token, duration) pairs, a blank
     of duration 0 moving one frame; RNN-T: top-K of log p(v). Fusion models change log p first (`fused`);
  2. K x K candidates `score + top-K`; a finished hypothesis (t past its last frame) stays as it is in slot 0; one
     with `max_symbols` tokens on its frame gets a forced blank only; the best K candidates are the new beam;
  3. history, score, frame, token count and a rolling hash of the tokens are updated;
  4. hypotheses with the same tokens (TDT: and the same next frame) merge: the best keeps the logsumexp of their
     scores, the others become dead slots (-inf);
  5. a token runs the prediction net and moves the fusion states; a blank keeps both;
  6. TDT: t += duration; RNN-T: t += 1 on blank.

At the end each input's beam is sorted by score / (tokens + 1) (NeMo's `score_norm`), dead slots dropped; the
raw scores are reported. With 16-bit logits on CUDA and no fusion, 1-4 and 6 run as two fused Triton passes
(`beam_kernels.py`); float32 keeps the PyTorch operations below, NeMo's bits.

All state lives in `BeamBuffers`, allocated once per (rows, beam) and written in place by `beam_step`, which reads
nothing back to the host: with graphs on CUDA, `BeamDecoder` captures 8 steps once per batch size class and replays
them, as the greedy decoder does; eagerly it calls the same step. The host reads only between rounds of steps, to
see how many frames the furthest-behind input still has to go (the next round's length; 0: done).
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np
import torch

from graphscribe.io.config import DecodingConfig
from graphscribe.model import import_kernels
from graphscribe.model.decoding import Hypothesis, frame_capacity, size_class
from graphscribe.model.heads import Joint, PredictionNet

log = logging.getLogger(__name__)

HASH_MULTIPLIER = 6364136223846793005  # NeMo's rolling hash of a token sequence: h * M + 1 + token (mod 2**64)
EPS = 1e-2  # NeMo's clamp of p(blank) in lm_weighted_full: log(1 - min(p_blank, 1 - EPS))
STEPS_PER_CHECK = 8  # steps a graph replays; a step after a row's end leaves its hypotheses as they are
PRUNING_MODES = ("late", "early")
BLANK_MODES = ("lm_weighted_full", "no_score")


class FusionModel(Protocol):
    """A token-level model fused into the search (NeMo's `NGramGPULanguageModel`): states are int64 ids."""

    def start(self, batch_size: int, device: torch.device) -> torch.Tensor:
        """(B,) int64: the state of a sentence's start (<s>)."""

    def advance(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """states (B,) -> (scores (B, V) float32 natural log of each non-blank token, next states (B, V) int64)."""


@dataclass(frozen=True)
class Fusion:
    """Shallow fusion: models with their weights, combined as NeMo's `topk_fusion_model` does.

    pruning "late": the weighted scores are added to every token's log-probability before the top-K; "early": to
    the top-K tokens of the plain log-probabilities. blank "lm_weighted_full" (NeMo's default): tokens also get
    weight x log(1 - p(blank)) and blank's log-probability is multiplied by 1 + weight; "no_score": blank as is.
    """

    models: Sequence[tuple[FusionModel, float]]
    pruning: str = "late"
    blank: str = "lm_weighted_full"

    def __post_init__(self):
        if self.pruning not in PRUNING_MODES or self.blank not in BLANK_MODES:
            raise ValueError(f"fusion: pruning {self.pruning!r} or blank mode {self.blank!r} unknown")

    @property
    def weight(self) -> float:
        return sum(w for _, w in self.models)


@dataclass
class ScoredPath:
    """One hypothesis of an n-best list: tokens, their frames and durations, NeMo's raw score."""

    token_ids: list[int]
    frames: list[int]
    durations: list[int]
    score: float


@dataclass
class BeamHypothesis(Hypothesis):
    """The best hypothesis of a beam search (as greedy's, for the transcript code), its score and the n-best list,
    best first (the best included)."""

    score: float = 0.0
    alternatives: list[ScoredPath] = field(default_factory=list)


class BeamBuffers:
    """Static state of N inputs x K hypotheses, allocated once and written in place by `beam_step`.

    Per hypothesis (N, K) tensors; the prediction net's rows (R = N x K) in input-major order; the history of every
    step (N, K, S) with the parent slot of each extension, grown between rounds (`grow`)."""

    def __init__(
        self,
        n: int,
        k: int,
        max_frames: int,
        steps: int,
        joint: Joint,
        prediction: PredictionNet,
        durations: tuple[int, ...],
        fusion: Fusion | None,
        device: torch.device,
        dtype: torch.dtype,
    ):
        j, layers, hidden = joint.cfg.hidden, prediction.cfg.layers, prediction.cfg.hidden
        state_dtype = prediction.prediction.embed.weight.dtype
        ints = dict(device=device, dtype=torch.long)
        self.n, self.k, self.max_frames, self.fusion = n, k, max_frames, fusion
        self.blank_id = prediction.cfg.vocab_size
        self.tdt = bool(durations)
        self.max_move = max(max(durations or (1,)), 1)  # frames a step moves a hypothesis on at most
        self.durations = torch.tensor(durations or (0,), **ints)  # (D,) frames of each duration index
        self.row_of = torch.arange(n, **ints).repeat_interleave(k)  # (R,) the input of each hypothesis row
        self.slot0 = torch.arange(k, device=device) == 0  # (K,) where a finished or forced hypothesis goes
        self.enc = torch.zeros(n, max_frames, j, device=device, dtype=dtype)  # (N, T, J) projected encoder
        self.last = torch.zeros(n, 1, **ints)  # (N, 1) last frame (length - 1)
        self.scores = torch.zeros(n, k, device=device, dtype=torch.float32)
        self.t = torch.zeros(n, k, **ints)  # frame of each hypothesis
        self.active = torch.zeros(n, k, device=device, dtype=torch.bool)  # t <= last
        self.lasts = torch.zeros(n, k, **ints)  # tokens on the current frame (max_symbols)
        self.count = torch.zeros(n, k, **ints)  # tokens so far
        self.hash = torch.zeros(n, k, **ints)  # rolling hash of the tokens
        self.last_label = torch.zeros(n, k, **ints)  # last token, -1 before the first
        self.h = torch.zeros(layers, n * k, hidden, device=device, dtype=state_dtype)  # (L, R, H)
        self.c = torch.zeros(layers, n * k, hidden, device=device, dtype=state_dtype)
        self.g = torch.zeros(n * k, j, device=device, dtype=dtype)  # (R, J) projected prediction output
        models = fusion.models if fusion else ()
        vocab = prediction.cfg.vocab_size
        self.lm_states = [torch.zeros(n * k, **ints) for _ in models]  # (R,) each fusion model's state
        self.lm_next = [torch.zeros(n * k, vocab, **ints) for _ in models]  # (R, V) its state after each token
        self.lm_scores = torch.zeros(n, k, vocab, device=device, dtype=torch.float32)  # weighted sum, (N, K, V)
        self.pos = torch.zeros(1, **ints)  # steps taken: the history's next column
        self.steps = 0  # the same, counted on the host (the loop queues the steps)
        self._history(steps, device)

    def state(self) -> dict[str, torch.Tensor]:
        """The tensors a step writes, by name (`beam_kernels.select`)."""
        names = ("scores", "t", "active", "lasts", "count", "hash", "last_label", "last", "pos")
        return {name: getattr(self, name) for name in (*names, "labels", "parents", "frames", "spans")}

    def _history(self, steps: int, device: torch.device) -> None:
        shape = (self.n, self.k, steps)
        # label (-1: a finished hypothesis kept), parent slot, frame the symbol starts at, its duration
        self.labels = torch.full(shape, -1, device=device, dtype=torch.int32)
        self.parents = torch.zeros(shape, device=device, dtype=torch.int32)
        self.frames = torch.zeros(shape, device=device, dtype=torch.int32)
        self.spans = torch.zeros(shape, device=device, dtype=torch.int32)
        self.capacity = steps

    def grow(self, steps: int) -> None:
        """Room for at least `steps` steps of history, keeping what is recorded."""
        old = (self.labels, self.parents, self.frames, self.spans)
        self._history(max(steps, 2 * self.capacity), self.labels.device)
        for new, kept in zip((self.labels, self.parents, self.frames, self.spans), old):
            new[:, :, : kept.shape[2]].copy_(kept)

    def load(self, enc_projected: torch.Tensor, lengths: torch.Tensor) -> None:
        """A batch's input: enc_projected (B, T, J), lengths (B,) for the first B <= N inputs (the others empty)."""
        b, t = enc_projected.shape[:2]
        self.enc[:b, :t].copy_(enc_projected)
        self.last.fill_(-1)
        self.last[:b, 0].copy_(lengths - 1)

    def restart(self, h0: torch.Tensor, c0: torch.Tensor, g0: torch.Tensor) -> None:
        """Every hypothesis at its start: hypothesis 0 of each input live (score 0), the others dead (-inf), all on
        frame 0 after the start symbol (h0, c0 (L, R, H), g0 (R, J)); the fusion models at <s>."""
        self.scores.fill_(-math.inf)
        self.scores[:, 0] = 0.0
        self.t.zero_()
        torch.le(self.t, self.last, out=self.active)
        self.lasts.zero_()
        self.count.zero_()
        self.hash.zero_()
        self.last_label.fill_(-1)
        self.h.copy_(h0)
        self.c.copy_(c0)
        self.g.copy_(g0)
        self.pos.zero_()
        self.steps = 0
        self.labels.fill_(-1)
        if self.fusion is not None:
            self.lm_scores.zero_()
            for (model, weight), states, after in zip(self.fusion.models, self.lm_states, self.lm_next):
                states.copy_(model.start(self.n * self.k, states.device))
                scores, nxt = model.advance(states)
                after.copy_(nxt)
                self.lm_scores.add_(weight * scores.float().view(self.n, self.k, -1))


def _fused(lp: torch.Tensor, buf: BeamBuffers, blank_id: int) -> torch.Tensor:
    """Late fusion: log-probabilities (N, K, V + 1) with the fusion models' weighted scores in (NeMo's
    `topk_fusion_model`, late modes; the forced blank sees these too)."""
    fusion = buf.fusion
    tokens, blank = lp[..., :blank_id], lp[..., blank_id:]
    if fusion.blank == "no_score":
        return torch.cat([tokens + buf.lm_scores, blank], dim=-1)
    non_blank = torch.log1p(-torch.clamp(torch.exp(blank), max=1.0 - EPS))  # (N, K, 1)
    return torch.cat([tokens + (non_blank * fusion.weight + buf.lm_scores), blank * (1 + fusion.weight)], dim=-1)


def _early(top: torch.Tensor, labels: torch.Tensor, lp: torch.Tensor, buf: BeamBuffers, blank_id: int) -> torch.Tensor:
    """Early fusion: the plain top-K values (N, K, K) of `labels` with the fusion terms added to the tokens."""
    fusion = buf.fusion
    is_blank = labels == blank_id
    lm = buf.lm_scores.gather(2, torch.where(is_blank, 0, labels))
    if fusion.blank == "no_score":
        return torch.where(is_blank, top, top + lm)
    non_blank = torch.log1p(-torch.clamp(torch.exp(lp[..., blank_id : blank_id + 1]), max=1.0 - EPS))
    return torch.where(is_blank, top * (1 + fusion.weight), top + non_blank * fusion.weight + lm)


def _candidates(buf: BeamBuffers, logits: torch.Tensor, blank_id: int):
    """Step 1: each hypothesis' top K (values, labels, duration frames), all (N, K, K), and the score of its
    forced blank (N, K)."""
    n, k = buf.n, buf.k
    # float32 as NeMo computes it (log_softmax's dtype: the 16-bit logits read once, no float32 copy of them)
    lp = torch.log_softmax(logits[:, : blank_id + 1], dim=-1, dtype=torch.float32).view(n, k, -1)  # (N, K, V + 1)
    late = buf.fusion is not None and buf.fusion.pruning == "late"
    early = buf.fusion is not None and not late
    if late:
        lp = _fused(lp, buf, blank_id)
    if not buf.tdt:
        top, labels = lp.topk(k, dim=-1)
        if early:
            top = _early(top, labels, lp, buf, blank_id)
        return top, labels, torch.zeros_like(labels), lp[..., blank_id]
    dlp = torch.log_softmax(logits[:, blank_id + 1 :], dim=-1, dtype=torch.float32).view(n, k, -1)  # (N, K, D)
    d = dlp.shape[-1]
    # NeMo takes the top K of all (V + 1) x D sums. The K best pairs all pair one of the K best tokens with a
    # duration (a pair of any other token is beaten by the K better tokens' pairs of the same duration), so the
    # K x D sums give the same candidates with the same values (the order of exact ties aside) for 1/V of the
    # memory traffic. Early fusion: the K best plain tokens, fused, then x D.
    top, tokens = lp.topk(k, dim=-1)  # (N, K, K)
    if early:
        top = _early(top, tokens, lp, buf, blank_id)
    top, index = (top[..., :, None] + dlp[..., None, :]).view(n, k, -1).topk(k, dim=-1)  # (N, K, K) of K x D
    labels = tokens.gather(2, index // d)
    frames = buf.durations[index % d]  # NeMo moves by the duration's index: the same for Parakeet's 0..4
    frames = torch.where((labels == blank_id) & (frames == 0), 1, frames)  # a blank moves on
    return top, labels, frames, lp[..., blank_id] + dlp.max(dim=-1).values


def _kernels_for(logits: torch.Tensor):
    """`beam_kernels` for 16-bit logits on CUDA; None elsewhere (float32 keeps PyTorch's operations, NeMo's
    bits) or without Triton, which is said once."""
    return _beam_kernels() if logits.is_cuda and logits.dtype != torch.float32 else None


@functools.cache
def _beam_kernels():
    try:
        beam_kernels = import_kernels("beam_kernels")
    except ImportError as err:
        log.warning("the beam search's fused kernels are unavailable (%s); using PyTorch's operations", err)
        return None
    return beam_kernels


def beam_step(buf: BeamBuffers, prediction: PredictionNet, joint: Joint, blank_id: int, max_symbols: int) -> None:
    """One step of the search for all N x K hypotheses (the module docstring's 1-6).

    Inside a captured graph: only in-place writes to `buf`, no host reads (the fusion models' `advance` included).
    """
    n, k = buf.n, buf.k
    rows = buf.row_of
    f = buf.enc[rows, torch.minimum(buf.t, buf.last).clamp(min=0).view(-1)]  # (R, J)
    logits = joint.logits(f, buf.g)
    kernels = _kernels_for(logits) if buf.fusion is None else None
    if kernels is not None:  # 16 bits on CUDA: 1-4 and 6 in two fused passes (`beam_kernels.select`)
        durations = buf.durations if buf.tdt else None
        source, step_label = kernels.select(logits, blank_id + 1, durations, buf.state(), max_symbols, HASH_MULTIPLIER)
        buf.pos.add_(1)
        _predict(buf, prediction, joint, source, step_label, step_label == blank_id)
        return
    top, labels, frames, forced = _candidates(buf, logits, blank_id)

    # 2: candidates; finished hypotheses kept in slot 0 (label -1), max_symbols' forced blank in slot 0
    active = buf.active[..., None]
    cand = torch.where(active, buf.scores[..., None] + top, -math.inf)  # (N, K, K)
    cand = torch.where(buf.slot0 & ~active, buf.scores[..., None], cand)
    labels = torch.where(active, labels, -1)
    force = ((buf.lasts >= max_symbols) & buf.active)[..., None]
    cand = torch.where(force, torch.where(buf.slot0, (buf.scores + forced)[..., None], -math.inf), cand)
    labels = torch.where(force, blank_id, labels)
    frames = torch.where(force & (frames == 0), 1, frames)  # the forced blank: its top candidate's duration
    scores, pick = cand.view(n, -1).topk(k, dim=-1)  # (N, K)
    parent = pick // k
    label = labels.view(n, -1).gather(1, pick)
    extended = label >= 0
    is_blank = label == blank_id
    is_token = extended & ~is_blank

    # 3: history and per-hypothesis counters
    t = buf.t.gather(1, parent)
    moved = torch.where(extended, frames.view(n, -1).gather(1, pick), 0) if buf.tdt else is_blank.long()
    at = buf.pos.expand(n, k)[..., None]
    buf.labels.scatter_(2, at, label[..., None].int())
    buf.parents.scatter_(2, at, parent[..., None].int())
    buf.frames.scatter_(2, at, t[..., None].int())
    buf.spans.scatter_(2, at, moved[..., None].int())
    buf.pos.add_(1)
    lasts = buf.lasts.gather(1, parent) + is_token
    reset = (moved > 0) if buf.tdt else is_blank
    buf.lasts.copy_(lasts.masked_fill(reset, 0))
    buf.count.copy_(buf.count.gather(1, parent) + is_token)
    old_hash = buf.hash.gather(1, parent)
    torch.where(is_token, old_hash * HASH_MULTIPLIER + 1 + label, old_hash, out=buf.hash)
    torch.where(is_token, label, buf.last_label.gather(1, parent), out=buf.last_label)
    buf.t.copy_(t + moved)
    buf.scores.copy_(scores)

    # 4: merge equal hypotheses
    if k > 1:
        _recombine(buf)

    # 5: the prediction net and the fusion states follow the tokens; a blank (or a finished one) keeps its parent's
    step_label = torch.where(extended, label, blank_id).view(-1)
    keep = step_label == blank_id  # (R,)
    source = (rows.view(n, k) * k + parent).view(-1)  # (R,) the parent's row
    _predict(buf, prediction, joint, source, step_label, keep)
    if buf.fusion is not None:
        _advance_fusion(buf, source, torch.where(keep, 0, step_label), keep)

    # 6: time
    torch.le(buf.t, buf.last, out=buf.active)


def _predict(buf: BeamBuffers, prediction: PredictionNet, joint: Joint, source, step_label, keep) -> None:
    """Step 5's prediction net: each hypothesis row takes its parent row's (`source`, (R,)) state, moved by its
    symbol (`step_label`) unless it keeps it (`keep`: a blank or a finished hypothesis)."""
    h, c, g = buf.h[:, source], buf.c[:, source], buf.g[source]
    out, h_new, c_new = prediction.step(step_label, h, c)
    g_new = joint.project_prediction(out.to(g.dtype))
    torch.where(keep[None, :, None], h, h_new, out=buf.h)
    torch.where(keep[None, :, None], c, c_new, out=buf.c)
    torch.where(keep[:, None], g, g_new, out=buf.g)


def _recombine(buf: BeamBuffers) -> None:
    """Hypotheses of one input with the same tokens (hash, last token, count; TDT: and next frame) merge: the best
    (first on ties) gets the logsumexp of the group, the others -inf (NeMo's `recombine_hyps_`)."""
    same = (
        (buf.hash[:, :, None] == buf.hash[:, None, :])
        & (buf.last_label[:, :, None] == buf.last_label[:, None, :])
        & (buf.count[:, :, None] == buf.count[:, None, :])
    )
    if buf.tdt:
        same &= buf.t[:, :, None] == buf.t[:, None, :]
    group = torch.where(same, buf.scores[:, None, :], -math.inf)  # (N, K, K)
    best = group.argmax(dim=-1) == torch.arange(buf.k, device=group.device)
    buf.scores.copy_(torch.logsumexp(group, dim=-1).masked_fill(~best, -math.inf))


def _advance_fusion(buf: BeamBuffers, source: torch.Tensor, token: torch.Tensor, keep: torch.Tensor) -> None:
    """Each fusion model's state moves along the step's token (a blank keeps the parent's), then its scores of every
    token for the next step; source (R,) the parent rows, token (R,) (0 where kept), keep (R,)."""
    buf.lm_scores.zero_()
    for (model, weight), states, after in zip(buf.fusion.models, buf.lm_states, buf.lm_next):
        moved = after[source, token]  # (R,): the parent row's next state after the token, not its whole row
        states.copy_(torch.where(keep, states[source], moved))
        scores, nxt = model.advance(states)
        after.copy_(nxt)
        buf.lm_scores.add_(weight * scores.float().view(buf.n, buf.k, -1))


class BeamDecoder:
    """Batched beam search of encoder output: `decode` as `GreedyDecoder.decode`, one `BeamHypothesis` per input.

    nbest: the hypotheses' `alternatives` hold the sorted n-best list (else only the best is made). graphs: on CUDA,
    STEPS_PER_CHECK steps are captured once per batch size class as one CUDA graph and replayed (`CapturedSteps`);
    the eager path runs the same `beam_step`. On CUDA the buffers have the rows of the batch's size class either way
    (the spare rows hold no input and stay finished), so a partial batch replays its class's graph and both paths
    run the same kernels on the same shapes."""

    def __init__(
        self,
        prediction: PredictionNet,
        joint: Joint,
        cfg: DecodingConfig,
        beam_size: int,
        fusion: Fusion | None = None,
        nbest: bool = False,
        graphs: bool = False,
    ):
        if beam_size < 1:
            raise ValueError(f"beam size {beam_size}: use 1 or more")
        self.prediction, self.joint, self.cfg = prediction, joint, cfg
        self.beam_size, self.fusion, self.nbest, self.graphs = beam_size, fusion, nbest, graphs
        # cuDNN wants the LSTM weights in one chunk; otherwise it copies them at every call, which breaks capture
        prediction.prediction.dec_rnn.lstm.flatten_parameters()
        self.blank_id = prediction.cfg.vocab_size
        self._buffers: dict[int, BeamBuffers] = {}  # by inputs per batch: a batch of another size keeps the others
        self._captured: dict = {}  # CapturedSteps by inputs per batch, for the buffers above; they share a pool
        self._start: dict = {}  # by (device, dtype): the state after the start symbol, for one row
        self.steps = 0  # steps the last decode ran
        self.host_reads = 0  # rounds of the last decode: each one host read (a wait for the GPU)
        self.capture_seconds = 0.0  # spent capturing graphs, reported apart from decoding

    def _replayed(self, device: torch.device) -> bool:
        """Whether the steps on `device` replay captured graphs (CUDA graphs: CUDA only)."""
        return self.graphs and device.type == "cuda"

    def _buffers_for(self, n: int, frames: int, device: torch.device, dtype: torch.dtype) -> BeamBuffers:
        buf = self._buffers.get(n)
        if buf is None or buf.max_frames < frames or buf.enc.device != device or buf.enc.dtype != dtype:
            capacity = frame_capacity(frames)
            buf = BeamBuffers(
                n,
                self.beam_size,
                capacity,
                2 * capacity,
                self.joint,
                self.prediction,
                self.cfg.durations,
                self.fusion,
                device,
                dtype,
            )
            self._buffers[n] = buf
            self._captured.pop(n, None)
        return buf

    def _start_state(self, rows: int, device: torch.device, dtype: torch.dtype):
        """The prediction state and projected output after the start symbol (blank) for `rows` rows: computed once
        for one row and repeated, so that a hypothesis starts from the same bits in any batch."""
        one = self._start.get((device, dtype))
        if one is None:
            h, c = self.prediction.initial_state(1, device, self.prediction.prediction.embed.weight.dtype)
            out, h, c = self.prediction.step(torch.full((1,), self.blank_id, device=device), h, c)
            one = self._start[(device, dtype)] = (h, c, self.joint.project_prediction(out.to(dtype)))
        h, c, g = one
        return h.expand(-1, rows, -1), c.expand(-1, rows, -1), g.expand(rows, -1)

    def _runner(self, buf: BeamBuffers, restore: Callable[[], None], warm_up: bool = True) -> Callable[[], None]:
        """A callable that runs STEPS_PER_CHECK steps: a graph replay, or eager calls of the same `beam_step`.

        A graph is captured on first use, after eager warm-up steps and `restore()`; `warm_up=False` captures again
        in the middle of a decode (the history was regrown), leaving the state as it is."""

        from graphscribe.model.graphs import eager_steps, step_runner

        def one() -> None:
            beam_step(buf, self.prediction, self.joint, self.blank_id, self.cfg.max_symbols)

        if self._replayed(buf.enc.device):
            return step_runner(self, buf.n, one, STEPS_PER_CHECK, restore, warm_up, "the beam search runs")
        return eager_steps(one, STEPS_PER_CHECK)

    @torch.inference_mode()
    def decode(
        self, encoded: torch.Tensor, lengths: torch.Tensor, queued: Callable[[], None] | None = None
    ) -> list[BeamHypothesis]:
        """encoded (B, T, D) encoder output, lengths (B,) valid frames -> one hypothesis per input. queued: called
        once, when the first round of steps is queued."""
        b, frames = encoded.shape[:2]
        device = encoded.device
        enc_projected = self.joint.project_encoder(encoded)  # (B, T, J)
        n = size_class(b) if device.type == "cuda" or self._replayed(device) else b
        buf = self._buffers_for(n, frames, device, enc_projected.dtype)
        buf.load(enc_projected, lengths.to(device))
        start = self._start_state(n * self.beam_size, device, enc_projected.dtype)
        restore = functools.partial(buf.restart, *start)
        restore()
        run = self._runner(buf, restore)
        remaining = int(lengths.max()) if b else 0  # frames still to go: before any step, the longest input's
        # every step moves each live hypothesis on by a token or a frame, at most max_symbols tokens a frame
        bound = frames * (self.cfg.max_symbols + 1) + STEPS_PER_CHECK
        self.host_reads = 0
        while remaining > 0:
            if buf.steps > bound:
                raise RuntimeError(f"beam search: still decoding after {buf.steps} steps of {frames} frames")
            # no live hypothesis ends sooner than its frames to go over the longest move a step (the lower bound:
            # queued steps after an input's end are no-ops, and every round costs a host read that idles the GPU)
            rounds = -(-remaining // (buf.max_move * STEPS_PER_CHECK))
            if buf.steps + rounds * STEPS_PER_CHECK > buf.capacity:  # new history tensors: a graph is captured on them
                buf.grow(buf.steps + rounds * STEPS_PER_CHECK)
                self._captured.pop(buf.n, None)
                run = self._runner(buf, restore, warm_up=False)
            for _ in range(rounds):
                run()
            buf.steps += rounds * STEPS_PER_CHECK
            if queued is not None:
                queued()
                queued = None
            remaining = _remaining(buf)  # the one host read per round
            self.host_reads += 1
        self.steps = buf.steps
        return _results(buf, b, self.nbest)


def _remaining(buf: BeamBuffers) -> int:
    """Frames still to go for the furthest-behind input: over the inputs with a live hypothesis on its frames (a
    dead slot, -inf after a merge, may stay on its frame, but it never comes back), its last frame + 1 less the
    frame of its furthest live one (the others' children can move no further a step than it). 0: all done."""
    live = buf.active & (buf.scores > -math.inf)  # (N, K)
    furthest = torch.where(live, buf.t, -1).amax(dim=1)  # (N,)
    return int(torch.where(live.any(dim=1), buf.last[:, 0] + 1 - furthest, 0).amax())


def _results(buf: BeamBuffers, b: int, nbest: bool) -> list[BeamHypothesis]:
    """Each input's beam sorted by score / (tokens + 1), dead slots dropped, its label paths read back through the
    parent slots (on the host: one copy of the history)."""
    steps = buf.steps
    scores = buf.scores[:b].cpu()
    order = torch.sort(scores / (buf.count[:b].cpu().float() + 1), dim=-1, descending=True, stable=True).indices
    order = order.numpy() if nbest else order[:, :1].numpy()  # (B, M) slots wanted
    history = [x[:b, :, :steps].cpu().numpy() for x in (buf.labels, buf.parents, buf.frames, buf.spans)]
    labels, frames, spans = _backtrack(*history, order)  # each (B, M, steps)
    scores = scores.numpy()
    out = []
    for i in range(b):
        alts = []
        for m, slot in enumerate(order[i]):
            if scores[i, slot] == -math.inf:
                continue
            alts.append(_alternative(labels[i, m], frames[i, m], spans[i, m], float(scores[i, slot]), buf))
        best = alts[0]
        out.append(
            BeamHypothesis(
                best.token_ids, best.frames, best.durations, steps, score=best.score, alternatives=alts if nbest else []
            )
        )
    return out


def _alternative(labels: np.ndarray, frames: np.ndarray, spans: np.ndarray, score: float, buf: BeamBuffers):
    blank = buf.blank_id
    tokens = (labels >= 0) & (labels != blank)
    durations = spans[tokens].tolist() if buf.tdt else [0] * int(tokens.sum())
    return ScoredPath(labels[tokens].tolist(), frames[tokens].tolist(), durations, score)


def _backtrack(labels, parents, frames, spans, order: np.ndarray):
    """The paths ending in slots `order` (B, M): each (B, M, steps) of labels, frames and durations."""
    b, m = order.shape
    steps = labels.shape[2]
    rows = np.arange(b)[:, None]
    slots = np.empty((b, m, steps), dtype=np.int64)  # the slot each path held at each step
    ptr = order
    for s in range(steps - 1, -1, -1):  # one small gather a step; the three arrays are then read at once
        slots[:, :, s] = ptr
        ptr = parents[rows, ptr, s]
    return [np.take_along_axis(x, slots, axis=1) for x in (labels, frames, spans)]
