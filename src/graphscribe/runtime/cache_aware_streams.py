"""Live streams of a cache-aware streaming model, many at once: NeMo's `CacheAwareRNNTPipeline`, every stream
with a chunk ready stepped in one batch.

A step of a stream takes the next chunk of audio (lookahead + 1 encoder frames: 80 ms at lookahead 0, 1.12 s at
13), computes that chunk's feature frames from its own samples and one hop before them, appends them to the
stream's feature buffer (the chunk and the 9 frames before it), and runs one encoder step on the buffer with the
stream's caches (`model.cache_aware.encode`); the decoder goes on from the stream's state over the new frames.
Nothing is computed twice: a chunk costs about its own audio.

Batched as the buffered streams are (`streaming.StreamEngine`, whose scheduling, events and slots this engine
shares): per slot on the device the audio hop before the next chunk, the feature buffer, the encoder's caches
and the decoder state; a step gathers the ready streams' rows, runs the features, the encoder step and the
decode steps as one batch, and scatters the rows back.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from graphscribe.io.config import (
    CHUNK_SECONDS,
    LEFT_SECONDS,
    RESIDUE_TOKENS,
    RIGHT_SECONDS,
    STOP_HISTORY_MS,
)
from graphscribe.model.cache_aware import Caches, ChunkGeometry, StepGraphs, encode
from graphscribe.model.decoding import DecodeState
from graphscribe.runtime.loaded import LoadedModel
from graphscribe.runtime.stream_text import Final, StepText, StreamText, merge_frames
from graphscribe.runtime.streaming import MAX_ROWS, Stream, StreamEngine

END_PIECES = ("<EOU>", "<EOB>")  # parakeet_realtime_eou's end-of-utterance and end-of-backchannel pieces
# Streams encoded in one batch at most. A cache-aware row is a chunk and its caches, not a buffered stream's
# seconds of context: at 80 ms one batch of 1024 nemotron-0.6b streams took 37 ms on an H200 (bfloat16), and
# batches of 256 spent more of a step in launches and host work than in the GPU's.
CACHE_AWARE_MAX_ROWS = 1024


def contexts_by_chunk(model: LoadedModel) -> dict[float, tuple[int, int]]:
    """A cache-aware model's chunk seconds -> its (left, lookahead) attention context, the default first."""
    cfg = model.cfg
    out = {}
    for context in cfg.encoder.streaming_contexts:
        geometry = ChunkGeometry.of(cfg.features, cfg.encoder.subsampling_factor, context)
        out.setdefault(round(geometry.chunk_seconds, 6), context)
    return out


def choose_context(model: LoadedModel, chunk_seconds: float | None) -> tuple[int, int]:
    """The context whose chunk is `chunk_seconds`, or the model's default one for None; ValueError naming the
    chunks there are otherwise."""
    chunks = contexts_by_chunk(model)
    if chunk_seconds is None:
        return next(iter(chunks.values()))
    for seconds, context in chunks.items():
        if abs(seconds - chunk_seconds) < 1e-6:
            return context
    listed = ", ".join(f"{s:g}" for s in sorted(chunks))
    raise ValueError(f"--chunk {chunk_seconds:g}: this cache-aware model streams in chunks of {listed} s")


class CacheAwareEngine(StreamEngine):
    """Every open stream of one cache-aware model at one (left, lookahead) context, stepped together."""

    def __init__(
        self,
        model: LoadedModel,
        chunk_seconds: float | None = None,
        max_rows: int = CACHE_AWARE_MAX_ROWS,
        steps_on_feed: bool = False,
    ):
        cfg = model.cfg
        self.context = choose_context(model, chunk_seconds)
        self.chunk = ChunkGeometry.of(cfg.features, cfg.encoder.subsampling_factor, self.context)
        super().__init__(model, self.chunk.chunk_seconds, 0.0, 0.0, max_rows, steps_on_feed)
        # the chunk in whole encoder frames, not from its seconds: 1.12 / 0.08 is 14.000000000000002 in floats
        frames, samples = self.chunk.encoder_frames, self.chunk.frame_samples
        self.geometry = dataclasses.replace(
            self.geometry,
            chunk=frames,
            chunk_frames_float=float(frames),
            initial_delay=0.0,
            frame_samples=samples,
            buffer_samples=0,  # no audio ring: a step needs only the hop before its chunk (`_hop`)
            feature_frames=self.chunk.buffer_frames,
        )
        self._ring = torch.zeros(0, 0, device=self.device)
        self.log_zero = math.log(cfg.features.log_zero_guard)  # NeMo's LOG_MEL_ZERO: a fresh buffer's frames
        self._features = torch.zeros(0, cfg.features.n_mels, self.chunk.buffer_frames, device=self.device)
        self._hop = torch.zeros(0, cfg.features.hop_length, device=self.device)  # the samples before each chunk
        self._step_graphs: StepGraphs | None = None  # CUDA with graphs: made at the first step
        self._caches = Caches.zeros(cfg.encoder, self.context, 1, self.device, model.dtype)

    def new_text(self) -> StreamText:
        tokenizer = self.model.tokenizer
        return CacheAwareText(self.geometry, self.vocab, tokenizer.sp_decode, STOP_HISTORY_MS, RESIDUE_TOKENS)

    def warm_up(self, most: int) -> None:
        """The slots for `most` streams made first: growing them later makes the caches anew, and the step graphs
        captured on the old ones would be captured again at the first live steps."""
        if most > self._capacity:
            self._grow(most)
        super().warm_up(most)

    def _grow(self, capacity: int) -> None:
        old = self._capacity
        super()._grow(capacity)
        features = torch.full((capacity, *self._features.shape[1:]), self.log_zero, device=self.device)
        features[:old] = self._features
        self._features = features
        self._hop = torch.cat([self._hop, self._hop.new_zeros(capacity - old, self._hop.shape[1])])
        # one slot more than the streams': the scratch slot that a graph's spare rows read and write
        caches = Caches.zeros(self.model.cfg.encoder, self.context, capacity + 1, self.device, self.model.dtype)
        caches.copy_slots(self._caches, old)
        self._caches = caches
        if self._step_graphs is not None:
            self._step_graphs.reset()  # captured on the old caches' storage

    def _reset_fresh_slots(self) -> None:
        if self._fresh_slots:
            index = torch.tensor(self._fresh_slots).to(self.device, non_blocking=True)
            self._features.index_fill_(0, index, self.log_zero)
            self._hop.index_fill_(0, index, 0.0)
            self._caches.reset(index)
        super()._reset_fresh_slots()

    def _launch(self, streams: list[Stream]):
        """Queue a batch's features and encoder step on the device -> what `_decode` takes."""
        g, model = self.chunk, self.model
        mark = time.perf_counter()
        frames, counts, last = self._take_chunks(streams)  # (B, F)
        hop = self._hop.shape[1]
        # new frames' valid count: the piece's frames (hop + audio) // hop, less the one before the chunk
        valid = [(hop + c) // hop for c in counts]
        slots = torch.tensor([s.slot for s in streams])
        index = slots.to(self.device, non_blocking=True)
        piece = torch.cat([self._hop[index], frames], dim=1)  # (B, hop + F)
        self._hop.index_copy_(0, index, frames[:, -hop:])
        piece_lengths = torch.tensor([hop + c for c in counts]).to(self.device, non_blocking=True)
        features, _ = model.module.preprocessor.featurizer(piece, piece_lengths)  # (B, M, F / hop + 2)
        new = features[:, :, 1 : g.chunk_frames + 1]  # the piece's last frame is STFT padding: NeMo cuts it
        buffers = torch.cat([self._features[index][:, :, g.chunk_frames :], new], dim=2)
        self._features.index_copy_(0, index, buffers)
        # the last chunk's padding frames are masked: NeMo's right padding, (chunk + 1) - valid frames
        lengths = [g.buffer_frames - ((g.chunk_frames + 1) - v if is_last else 0) for v, is_last in zip(valid, last)]
        lengths = torch.tensor(lengths).to(self.device, non_blocking=True)
        mark = self._stage("features", mark)
        with model._float32_math():
            if model.options.graphs:  # CUDA: the step replayed from its rows class's graph
                if self._step_graphs is None:
                    self._step_graphs = StepGraphs(model.module.encoder, self.context, g.drop)
                encoded, enc_lengths = self._step_graphs(
                    buffers.to(model.dtype), lengths, self._caches, index, self._capacity
                )
            else:
                encoded, enc_lengths = encode(
                    model.module.encoder, buffers.to(model.dtype), lengths, self.context, self._caches, index, g.drop
                )
        self._stage("encoder", mark)
        return streams, slots, last, encoded, enc_lengths

    def _decode(self, streams, slots, last, encoded, enc_lengths):
        """Decode a launched batch's new frames from the streams' states; keep the states after them."""
        model = self.model
        mark = time.perf_counter()
        index = slots.to(self.device)
        state = DecodeState(*(p.index_select(-2 if p.dim() == 3 else 0, index) for p in self._pools()))
        with model._float32_math():
            hyps, after = self.decoder().decode_chunk(encoded, enc_lengths, state, self.trees(streams))
        for pool, value in zip(self._pools(), after.parts()):
            pool.index_copy_(-2 if pool.dim() == 3 else 0, index, value)
        frames = enc_lengths.tolist()
        self._stage("decode", mark)
        return streams, last, hyps, frames

    def _say(self, streams, last, hyps, frames) -> None:
        mark = time.perf_counter()
        for i, s in enumerate(streams):
            at = [f + s.decoded for f in hyps[i].frames]
            s.decoded += frames[i]
            s.steps += 1
            self._said(s, s.text.step(hyps[i].token_ids, at, last[i]), last[i])
            if last[i]:
                self.close(s)
        self._stage("text", mark)


@dataclass
class CacheAwareText(StreamText):
    """What a cache-aware stream says after each step (NeMo's `CacheAwareRNNTPipeline.run_greedy_decoder`): every
    token is kept as it comes (no clipping, no overlap to merge); an utterance ends at the stream's end or when
    the last `stop_history` frames before the newest carry no token (a ring of the latest frames' labels).

    A model with end-of-utterance pieces (parakeet_realtime_eou's `<EOU>`, and `<EOB>` for a backchannel) ends the
    utterance where it emits one: the tokens before it are a final; the piece is in the stream's token ids but
    never in its text."""

    def __post_init__(self):
        super().__post_init__()
        # NeMo keeps the labels of the last stop + residue frames (blank where none; blanks at the start) and asks
        # whether more than `stop` of them before the newest are blank in a row; the run of blank frames at the end
        # of the stream so far says the same
        self.window = self.stop_frames + self.residue_tokens if self.stop_frames > 0 else 0
        self.blank_run = self.window
        self.ends = frozenset(i for i, p in enumerate(self.vocab.pieces) if p in END_PIECES)
        self._partial = ("", 0)  # the open utterance's text and its token count

    def step(self, tokens: list[int], frames: list[int], last: bool) -> StepText:
        """A step's tokens, each at its global encoder frame."""
        size = self.geometry.chunk
        if tokens:
            self.blank_run = size - 1 - max(f % size for f in frames)
        else:
            self.blank_run += size
        first = self.steps == 0
        finals = []
        start = 0
        for i, token in enumerate(tokens):
            if token in self.ends:  # the utterance ends here: the tokens before it, not the piece itself
                self._extend(tokens[start:i], frames[start:i])
                if self.tokens:
                    finals.append(self._final(first and not finals))
                self.tokens, self.frames = [], []
                start = i + 1
        self._extend(tokens[start:], frames[start:])
        if self.tokens and (last or self._silent()):
            finals.append(self._final(first and not finals))
            self.tokens, self.frames = [], []
        self.steps += 1
        return StepText(list(tokens), _joined(finals), self.partial())

    def partial(self) -> str:
        """The open utterance's text, made again only when it has grown (tokens are only added or all cleared)."""
        if self._partial[1] != len(self.tokens):
            self._partial = (super().partial(), len(self.tokens))
        return self._partial[0]

    def _extend(self, tokens: list[int], frames: list[int]) -> None:
        if tokens:
            self.tokens.extend(tokens)
            self.frames = merge_frames(self.frames, list(frames))

    def _silent(self) -> bool:
        """`detect_eou_near_pivot` at the newest frame: more than `stop_frames` blank frames before it, counted in
        NeMo's window of the latest frames."""
        if not self.window:
            return False
        return min(self.blank_run - 1, self.window - 1) > self.stop_frames


def engine_for(
    model: LoadedModel,
    chunk_seconds: float = CHUNK_SECONDS,
    left_seconds: float = LEFT_SECONDS,
    right_seconds: float = RIGHT_SECONDS,
    max_rows: int | None = None,
    steps_on_feed: bool = False,
    boosted: bool = False,
) -> StreamEngine:
    """The engine the model streams with: cache-aware for a cache-aware model (`chunk_seconds` picks its context;
    the buffered default, `CHUNK_SECONDS`, stands for the model's own default; the left and right seconds are the
    model's own), NeMo's buffered streaming for any other. `max_rows`: None for the kind's own. `boosted`: its
    streams boosted by their own phrases (`StreamEngine.open(tree=)`)."""
    if model.cfg.encoder.cache_aware:
        chunk = None if chunk_seconds == CHUNK_SECONDS else chunk_seconds
        engine = CacheAwareEngine(model, chunk, max_rows or CACHE_AWARE_MAX_ROWS, steps_on_feed)
    else:
        engine = StreamEngine(model, chunk_seconds, left_seconds, right_seconds, max_rows or MAX_ROWS, steps_on_feed)
    engine.boosted = boosted
    return engine


def _joined(finals: list[Final]) -> Final | None:
    """A step's finals as one (a step is at most 1.12 s: two utterances ended in one are said together)."""
    if len(finals) <= 1:
        return finals[0] if finals else None
    text = " ".join(f.text for f in finals if f.text)
    tokens = [t for f in finals for t in f.token_ids]
    frames = [t for f in finals for t in f.frames]
    return Final(tokens, frames, text, finals[0].start, finals[-1].end, finals[0].spaced)
