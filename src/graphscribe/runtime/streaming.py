"""Live streams, many at once: NeMo's buffered streaming (`BufferedRNNTPipeline`, stateful, feature-buffer
requests), every stream with a chunk ready stepped in one batch.

A step of a stream takes the next chunk of its audio (0.8 s with NVIDIA's v3 config) into a buffer of its last
left + chunk + right seconds (9.6 + 0.8 + 1.6), computes the features of the whole buffer (normalised over it),
runs the encoder over them, and decodes the chunk's frames (the ones before the last `right`) from the decoding
state the stream's previous step left, then the right context's frames from the state after the chunk (that
state is thrown away: their tokens may still change). What the stream says is `stream_text.StreamText`'s.

Batched: one engine holds every stream's audio ring and decoding state on the device, in slots. A step gathers
the ready streams' buffers (one gather), runs the features and the encoder on them as one batch, decodes their
chunks as one batch from their gathered states (`GreedyDecoder.decode_chunk`, the captured decode graphs), and
scatters the new states back. Streams join and leave between steps; none waits for another's end.

A chunk is stepped once audio past it has come or the stream is finished, so that the last chunk is known as the
last one, as NeMo knows it from the file's length: a file fed whole and the same file fed a sample at a time
give the same tokens.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from graphscribe.io.config import CHUNK_SECONDS, LEFT_SECONDS, RESIDUE_TOKENS, RIGHT_SECONDS, STOP_HISTORY_MS
from graphscribe.model.decoding import DecodeState, size_class
from graphscribe.output.timestamps import Word, token_spans, words_and_segments
from graphscribe.runtime.loaded import LoadedModel
from graphscribe.runtime.stream_text import StreamGeometry, StreamText, Vocabulary

log = logging.getLogger(__name__)

MAX_ROWS = 256  # streams encoded in one batch at most: a step with more runs several batches


@dataclass
class StreamEvent:
    """What a stream says: `partial` (the open utterance's text, may still change), `final` (a finished
    utterance), `done` (the stream's whole text and tokens, after its last audio). Times in seconds from the
    stream's start."""

    type: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0
    words: list[Word] = field(default_factory=list)


class Stream:
    """One live stream of an engine: audio in with `feed`, events out. Made by `StreamEngine.open` (or
    `Model.stream`, whose engine steps it as audio comes)."""

    def __init__(self, engine: StreamEngine, slot: int):
        self.engine = engine
        self.slot = slot
        self.text = engine.new_text()
        self.pending = np.zeros(0, dtype=np.float32)  # fed samples not yet stepped, from `taken` on
        self.taken = 0
        self.fed = 0  # samples fed in all
        self.steps = 0
        self.left_pad = engine.geometry.buffer_samples  # samples of the buffer not yet audio (NeMo's left padding)
        self.decoded = 0  # encoder frames decoded so far (the chunks')
        self.finished = False  # no more audio will come
        self.closed = False  # the last step ran
        self.events: list[StreamEvent] = []
        self.final_text = ""
        self.token_ids: list[int] = []
        self.partial = ""  # the open utterance's text after the last step
        self.tree = None  # its own phrases' boosting tree (`LoadedModel.row_tree`), in a boosted engine

    def feed(self, samples) -> list[StreamEvent]:
        """Samples at the model's rate, (L,) float in [-1, 1] or int16, any length -> the events that audio made
        ready (all of them with an engine of its own; with a shared engine, those its steps made so far)."""
        if self.finished:
            raise ValueError("this stream is finished: open another for more audio")
        audio = _as_float(samples)
        if audio.size:
            left = self.pending[self.taken :]
            self.pending = np.concatenate([left, audio]) if left.size else audio
            self.taken = 0
            self.fed += audio.size
        return self.engine.after_feed(self)

    def finish(self) -> list[StreamEvent]:
        """No more audio: the rest is stepped (its last chunk padded) and `done` closes the events."""
        self.finished = True
        return self.engine.after_feed(self)

    @property
    def ready(self) -> bool:
        """Whether a step can take this stream's next chunk: audio past it has come, or the stream is finished."""
        if self.closed:
            return False
        return self.pending.size - self.taken > self.engine.geometry.frame_samples or self.finished

    def take_events(self) -> list[StreamEvent]:
        events, self.events = self.events, []
        return events

    def take_chunk(self, row: np.ndarray) -> tuple[int, bool]:
        """The next chunk's samples into `row` (a chunk long, zero-padded) -> how many are audio, and whether it
        is the last."""
        size = row.shape[0]
        chunk = self.pending[self.taken : self.taken + size]
        row[: chunk.size] = chunk
        row[chunk.size :] = 0.0
        self.taken += chunk.size
        return chunk.size, self.finished and self.taken == self.pending.size


class _Staging:
    """The host rows a batch's chunks are laid in, then sent to the device in one copy: pinned on CUDA, so the
    host does not wait for the copy, nor the copy go through pageable memory (at 1.12 s chunks a batch of 1024
    streams is 73 MB; laid out chunk by chunk, stacked and copied from pageable memory it took a third of a
    step). Two buffers in turn: a batch's copy may still be queued while the next one is laid out; a buffer is
    reused only once its copy is done."""

    def __init__(self, device: torch.device):
        self.device = device
        self._buffers: list[torch.Tensor] = []
        self._sent: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def rows(self, n: int, size: int, most: int) -> torch.Tensor:
        """(n, size) float32 host rows to fill (their `.numpy()`), then `send`; made for `most` rows at once."""
        if not self._buffers or self._buffers[0].shape[0] < n or self._buffers[0].shape[1] != size:
            pin = self.device.type == "cuda"
            self._buffers = [torch.zeros(max(n, most), size, pin_memory=pin) for _ in range(2)]
            self._sent = [None, None]
        self._turn ^= 1
        if self._sent[self._turn] is not None:
            self._sent[self._turn].synchronize()
        return self._buffers[self._turn][:n]

    def send(self, rows: torch.Tensor) -> torch.Tensor:
        out = rows.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            self._sent[self._turn] = torch.cuda.Event()
            self._sent[self._turn].record()
        return out


class StreamEngine:
    """Every open stream of one model and one streaming config, stepped together (module docstring). A `boosted`
    engine's streams are boosted by their own phrases (`open(tree=)`; `LoadedModel.boosted_decoder`)."""

    boosted = False  # set by `engine_for`

    def __init__(
        self,
        model: LoadedModel,
        chunk_seconds: float = CHUNK_SECONDS,
        left_seconds: float = LEFT_SECONDS,
        right_seconds: float = RIGHT_SECONDS,
        max_rows: int = MAX_ROWS,
        steps_on_feed: bool = False,
    ):
        cfg = model.cfg
        for name, value in (("chunk", chunk_seconds), ("left", left_seconds), ("right", right_seconds)):
            if not (value >= 0) or (name == "chunk" and value <= 0) or value > 600:
                raise ValueError(f"--{name} {value}: give seconds, chunk above 0, each at most 600")
        self.model = model
        self.geometry = StreamGeometry.of(
            chunk_seconds,
            left_seconds,
            right_seconds,
            cfg.features.sample_rate,
            cfg.features.hop_length,
            cfg.encoder.subsampling_factor,
        )
        self.max_rows = max_rows
        self.steps_on_feed = steps_on_feed
        tokenizer = model.tokenizer
        pieces = [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
        self.vocab = Vocabulary.of(pieces, tokenizer.punctuation, tokenizer.unk_id)
        self.device = model.device
        self.streams: dict[int, Stream] = {}  # by slot
        self._free: list[int] = []
        self._capacity = 0
        self._ring = torch.zeros(0, self.geometry.buffer_samples, device=self.device)  # (slots, S)
        self._write = torch.zeros(0, dtype=torch.long)  # (slots,) where each ring's next sample goes (host)
        self._state: DecodeState | None = None  # (slots) rows
        self._zero_encoded: torch.Tensor | None = None  # (T, D) the encoder's output for a buffer of silence
        self.profile: dict[str, float] | None = None  # {}: seconds per stage of the steps, each waited for (slower)
        # slots opened since the last step: their rings and states are reset together there, not one at a time as
        # they open: a reset's index copied to the device on its own waits for the GPU's queued work, and a server
        # opens dozens of turns a second
        self._fresh_slots: list[int] = []
        self._staging = _Staging(self.device)

    # ------------------------------------------------------------------ streams
    def new_text(self) -> StreamText:
        tokenizer = self.model.tokenizer
        return StreamText(self.geometry, self.vocab, tokenizer.sp_decode, STOP_HISTORY_MS, RESIDUE_TOKENS)

    def open(self, tree=None) -> Stream:
        """A new stream, in a free slot (the slots grow as needed); `tree`: its own phrases' boosting tree
        (`LoadedModel.row_tree`), in a boosted engine."""
        if tree is not None and not self.boosted:
            raise ValueError("a stream's own phrases need a boosted engine (engine_for(boosted=True))")
        if not self._free:
            self._grow(max(8, 2 * self._capacity))
        slot = self._free.pop()
        self._write[slot] = 0
        self._fresh_slots.append(slot)  # its ring and decoder state reset at the next step, with the others opened
        stream = Stream(self, slot)
        stream.tree = tree
        self.streams[slot] = stream
        return stream

    def close(self, stream: Stream) -> None:
        """Forget a stream (finished or abandoned): its slot is free for the next."""
        if self.streams.get(stream.slot) is stream:
            del self.streams[stream.slot]
            self._free.append(stream.slot)
        stream.closed = True

    def after_feed(self, stream: Stream) -> list[StreamEvent]:
        if stream.finished and stream.fed == 0 and not stream.closed:  # no audio at all: nothing to step
            stream.events.append(StreamEvent("done", ""))
            self.close(stream)
        if self.steps_on_feed:
            while stream.ready:
                self.step([stream])
        return stream.take_events()

    def ready(self) -> list[Stream]:
        return [s for s in self.streams.values() if s.ready]

    def warm_up(self, most: int) -> None:
        """Step batches of each of `warm_up_rows` stream counts once, on speech (decode graphs of each size class
        captured, encoder shapes and kernels met), so that the first live steps do not wait for them."""
        from graphscribe.io.audio import read_input, speech_path
        from graphscribe.runtime.pipeline import WARM_UP_CLIP

        clip = read_input(speech_path(WARM_UP_CLIP), self.model.sample_rate).numpy()
        for n in warm_up_rows(self.device.type, most, self.max_rows):
            streams = [self.open() for _ in range(n)]
            for s in streams:
                s.feed(clip[: 2 * self.geometry.frame_samples + 1])
            self.step(streams)
            for s in streams:
                self.close(s)
        # What exists now (the model, its modules, the captured graphs' tensors) lives as long as the engine: the
        # collector's full passes need not scan it again. They did at every pass, and a pass with a thousand
        # live streams stopped the steps for 120 ms (H200, 80 ms chunks: p95 chunk latency 225 ms, 66 ms frozen).
        gc.collect()
        gc.freeze()

    def _grow(self, capacity: int) -> None:
        old = self._capacity
        ring = torch.zeros(capacity, self.geometry.buffer_samples, device=self.device)
        ring[:old].copy_(self._ring)
        self._ring = ring
        self._write = torch.cat([self._write, torch.zeros(capacity - old, dtype=torch.long)])
        fresh = self.decoder().fresh_state(capacity, self.device, self.model.dtype)
        if self._state is not None:
            fresh.h[:, :old], fresh.c[:, :old] = self._state.h, self._state.c
            fresh.g[:old], fresh.skip[:old] = self._state.g, self._state.skip
            if fresh.fusion is not None:  # the LM's and boosting tree's states (`model/fusion.py`)
                fresh.fusion[:old] = self._state.fusion
        self._state = fresh
        self._free.extend(range(capacity - 1, old - 1, -1))
        self._capacity = capacity

    def decoder(self):
        """The model's greedy decoder; a boosted engine's boosts each row by its stream's own tree."""
        return self.model.boosted_decoder() if self.boosted else self.model.decoder

    def trees(self, streams: list[Stream]) -> list | None:
        """A boosted engine's rows' trees (a stream without phrases of its own: the options' hotwords, if any)."""
        if not self.boosted:
            return None
        return [self.model.row_tree(()) if s.tree is None else s.tree for s in streams]

    def _pools(self) -> tuple[torch.Tensor, ...]:
        return self._state.parts()

    # ------------------------------------------------------------------ steps
    @torch.inference_mode()
    def step(self, streams: list[Stream] | None = None) -> int:
        """Step every ready stream (or these) once, in batches of at most `max_rows`: the events go to each
        stream's queue. Returns the number of streams stepped.

        A batch's encoder is queued on the device before the text of the batch before it is made on the host, so
        the two run side by side."""
        streams = [s for s in (self.ready() if streams is None else streams) if s.ready]
        mark = time.perf_counter()
        self._reset_fresh_slots()
        self._stage("reset", mark)
        decoded = None
        for start in range(0, len(streams), self.max_rows):
            launched = self._launch(streams[start : start + self.max_rows])
            if decoded is not None:
                self._say(*decoded)
            decoded = self._decode(*launched)
        if decoded is not None:
            self._say(*decoded)
        return len(streams)

    def _reset_fresh_slots(self) -> None:
        """The rings and decoder states of the slots opened since the last step, reset in one go."""
        if not self._fresh_slots:
            return
        slots, self._fresh_slots = self._fresh_slots, []
        index = torch.tensor(slots).to(self.device, non_blocking=True)
        self._ring.index_fill_(0, index, 0.0)
        fresh = self.decoder().fresh_state(1, self.device, self.model.dtype)
        for pool, value in zip(self._pools(), fresh.parts()):
            dim = -2 if pool.dim() == 3 else 0
            shape = list(value.shape)
            shape[dim] = len(slots)
            pool.index_copy_(dim, index, value.expand(*shape).contiguous())

    def _stage(self, name: str, since: float) -> float:
        """With `profile`: wait for the device and add the seconds since `since` to the stage; the time now."""
        if self.profile is None:
            return since
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.profile[name] = self.profile.get(name, 0.0) + now - since
        return now

    def _launch(self, streams: list[Stream]):
        """Queue a batch's buffers, features and encoder on the device -> what `_decode` takes."""
        g = self.geometry
        mark = time.perf_counter()
        frames, counts, last = self._take_chunks(streams)  # (B, F) on the device
        for s in streams:
            s.left_pad = max(0, s.left_pad - g.frame_samples)
        left_pad = [s.left_pad for s in streams]
        lengths = [g.buffer_samples - (g.frame_samples - c) - p for c, p in zip(counts, left_pad)]
        slots = torch.tensor([s.slot for s in streams])
        buffers = self._buffers(slots, frames, left_pad, lengths)  # (B, S) audio first, zeros after
        mark = self._stage("buffers", mark)
        encoded, enc_lengths = self._encode(buffers, torch.tensor(lengths))
        # the buffer's left padding back in place, as the encoder's output for silence (NeMo's zero_encoded)
        rolls = [int(int(p / g.hop_length) / g.subsampling) for p in left_pad]
        roll = torch.tensor(rolls).to(self.device, non_blocking=True)
        if any(rolls):  # known on the host: asking the device would wait for the encoder queued above
            encoded = self._rolled(encoded, roll)
        self._stage("features and encoder", mark)
        return streams, slots, last, encoded, enc_lengths + roll

    def _take_chunks(self, streams: list[Stream]) -> tuple[torch.Tensor, list[int], list[bool]]:
        """The streams' next chunks -> (B, F) samples on the device, each one's count of audio samples and whether
        it is its last."""
        rows = self._staging.rows(len(streams), self.geometry.frame_samples, self.max_rows)
        host = rows.numpy()
        taken = [s.take_chunk(host[i]) for i, s in enumerate(streams)]
        return self._staging.send(rows), [t[0] for t in taken], [t[1] for t in taken]

    def _decode(self, streams, slots, last, encoded, enc_lengths):
        """Decode a launched batch's chunks and right contexts from the streams' states; keep the states after
        the chunks -> what `_say` takes."""
        g, model = self.geometry, self.model
        mark = time.perf_counter()
        window = encoded[:, g.left :]  # (B, C + R, D) the chunk and the right context
        decodable = (enc_lengths - g.left).clamp(min=0)
        is_last = torch.tensor(last).to(self.device, non_blocking=True)
        chunk = torch.where(is_last, decodable, decodable.clamp(max=g.chunk)).clamp(max=window.shape[1])
        index = slots.to(self.device)
        state = DecodeState(*(p.index_select(-2 if p.dim() == 3 else 0, index) for p in self._pools()))
        decoder, trees = self.decoder(), self.trees(streams)
        with model._float32_math():
            chunk_hyps, after = decoder.decode_chunk(window, chunk, state, trees)
            right_hyps, _ = decoder.decode_chunk(_shifted(window, chunk), decodable - chunk, after, trees)
        for pool, value in zip(self._pools(), after.parts()):
            pool.index_copy_(-2 if pool.dim() == 3 else 0, index, value)
        chunk_frames = chunk.tolist()
        self._stage("decode", mark)
        return streams, last, chunk_hyps, right_hyps, chunk_frames

    def _say(self, streams, last, chunk_hyps, right_hyps, chunk_frames) -> None:
        """Each stream's step through its text state, as events."""
        mark = time.perf_counter()
        for i, s in enumerate(streams):
            tokens = chunk_hyps[i].token_ids + right_hyps[i].token_ids
            at = [f + s.decoded for f in chunk_hyps[i].frames]
            at += [f + s.decoded + chunk_frames[i] for f in right_hyps[i].frames]
            s.decoded += chunk_frames[i]
            s.steps += 1
            self._said(s, s.text.step(tokens, at, last[i]), last[i])
            if last[i]:
                self.close(s)
        self._stage("text", mark)

    def _buffers(self, slots: torch.Tensor, frames: torch.Tensor, left_pad: list[int], lengths: list[int]):
        """Write each stream's chunk into its ring, then gather each ring's samples oldest first, rolled by the
        left padding (the audio starts at 0) and zero after the audio (NeMo's right padding mode). The indices
        are made on the device: a batch's (B, S) gather index is hundreds of MB."""
        size, f, device = self.geometry.buffer_samples, self.geometry.frame_samples, self.device
        write = self._write[slots]  # (B,) host
        self._write[slots] = (write + f) % size
        step = torch.stack([write, self._write[slots] + torch.tensor(left_pad), torch.tensor(lengths)])
        write, oldest, length = step.to(device, non_blocking=True)  # (B,) each
        rows = slots.to(device, non_blocking=True)[:, None]  # (B, 1)
        columns = (write[:, None] + torch.arange(f, device=device)) % size  # (B, F)
        self._ring.index_put_((rows.expand(-1, f), columns), frames)
        positions = torch.arange(size, device=device)
        buffers = self._ring[rows, (oldest[:, None] + positions) % size]  # (B, S)
        return buffers.masked_fill_(positions[None, :] >= length[:, None], 0.0)

    def _encode(self, buffers: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) buffers and (B,) sample counts -> (B, T, D) encoder output and (B,) frames: the features of each
        buffer cut to NeMo's expected length and normalised over it, then the encoder."""
        model = self.model
        features, frames = model.module.preprocessor.featurizer(
            buffers, lengths.to(self.device), keep_frames=self.geometry.feature_frames
        )
        return model.encoder_output(features, frames, model.cfg.encoder.local_context)

    def _rolled(self, encoded: torch.Tensor, roll: torch.Tensor) -> torch.Tensor:
        """Each row moved `roll` frames later, the frames before it the encoder's output for silence."""
        zero = self._silence(encoded.shape[1])  # (T, D)
        t = torch.arange(encoded.shape[1], device=self.device)
        source = t[None, :] - roll[:, None]  # (B, T)
        moved = encoded.gather(1, source.clamp(min=0)[:, :, None].expand(-1, -1, encoded.shape[2]))
        return torch.where((source < 0)[:, :, None], zero[None].to(encoded.dtype), moved)

    def _silence(self, frames: int) -> torch.Tensor:
        if self._zero_encoded is None:
            size = self.geometry.buffer_samples
            encoded, _ = self._encode(torch.zeros(1, size, device=self.device), torch.tensor([size]))
            self._zero_encoded = encoded[0]
        return self._zero_encoded[:frames]

    def _said(self, stream: Stream, said, last: bool) -> None:
        """A step's text as events: a final when an utterance ended, a partial when the open one's text changed,
        done after the last step."""
        g = self.geometry
        seconds = g.stride_seconds
        if said.final is not None:
            final = said.final
            text = (" " if final.spaced else "") + final.text if final.text else ""
            if text:
                stream.final_text += text.lstrip(" ") if not stream.final_text else text
            words = self._words(final.token_ids, final.frames)
            stream.events.append(
                StreamEvent("final", final.text, final.token_ids, final.start * seconds, final.end * seconds, words)
            )
        stream.token_ids.extend(said.new_tokens)
        if said.partial != stream.partial:
            stream.partial = said.partial
            if said.partial:
                stream.events.append(StreamEvent("partial", said.partial, list(stream.text.tokens)))
        if last:
            end = stream.fed / g.sample_rate
            stream.events.append(StreamEvent("done", stream.final_text, list(stream.token_ids), 0.0, end))

    def _words(self, tokens: list[int], frames: list[float]) -> list[Word]:
        """NeMo's words of a final, each token a frame long from its (global) frame."""
        model = self.model
        seconds = self.geometry.stride_seconds
        whole = [int(round(f)) for f in frames]
        pieces = [model.tokenizer.piece(t) for t in tokens]
        spans = token_spans(whole, [1] * len(whole), tdt=False)
        words, _ = words_and_segments(
            pieces, spans, model.tokenizer.decode_pieces, model.word_rules, False, lambda f: round(f * seconds, 6)
        )
        return words


def warm_up_rows(device: str, most: int, max_rows: int = MAX_ROWS) -> list[int]:
    """Streams stepped together at a warm-up for up to `most` at once: on CUDA one batch of each rows class
    (`decoding.size_class`: powers of two up to 128, then multiples of 64) up to a step's rows, whose encoder and
    decode graphs a live step would otherwise capture when it first meets the class, a stop of some 150 ms on an
    H200 that the streams behind it wait out; on the CPU one (nothing is captured there)."""
    if most <= 0:
        return []
    if device != "cuda":
        return [1]
    top = min(most, max_rows)
    classes, n = [], 1
    while not classes or classes[-1] < top:
        classes.append(min(size_class(n), top))
        n = classes[-1] + 1
    return classes


def _shifted(window: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Each row's frames from `start` on, first; past the end, frame 0 (NeMo gathers the right context so)."""
    t = window.shape[1]
    index = torch.arange(t, device=window.device)[None, :] + start[:, None]  # (B, T)
    index = torch.where(index < t, index, torch.zeros_like(index))
    return window.gather(1, index[:, :, None].expand(-1, -1, window.shape[2]))


def _as_float(samples) -> np.ndarray:
    """(L,) samples as float32 in [-1, 1]: int16 scaled, floats as they are."""
    if isinstance(samples, torch.Tensor):
        samples = samples.detach().cpu().numpy()
    audio = np.asarray(samples)
    if audio.ndim != 1:
        raise ValueError(f"stream samples: expected one channel (L,), got shape {tuple(audio.shape)}")
    if audio.dtype == np.int16:
        return audio.astype(np.float32) / 32768.0
    if not np.issubdtype(audio.dtype, np.floating):
        raise ValueError(f"stream samples: expected float or int16, got {audio.dtype}")
    return audio.astype(np.float32, copy=False)
