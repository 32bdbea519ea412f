"""A transducer loaded on one device and dtype, as the stages the runtime drives: audio in, features, encoder
output, hypotheses, transcripts. Batching many inputs is the pipeline's (`runtime/pipeline.py`)."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import replace
from typing import Callable, Union

import numpy as np
import torch

from graphscribe.io.audio import read_input
from graphscribe.io.hotwords import parse_hotwords, parse_phrase
from graphscribe.io.options import RunOptions
from graphscribe.io.tokenizer import Tokenizer
from graphscribe.model import cache_aware
from graphscribe.model.beam import BeamDecoder, Fusion
from graphscribe.model.boosting import boosting_tables
from graphscribe.model.confidence import check_method, measured, replay_batch
from graphscribe.model.decoding import GreedyDecoder, Hypothesis
from graphscribe.model.encoder import encoder_frames, memory_estimate
from graphscribe.model.features import PackedClips
from graphscribe.model.fusion import fusion_models
from graphscribe.model.graphs import FeatureGraphs, LayerGraphs
from graphscribe.model.ngram import Tables
from graphscribe.model.packing import PackedFront, Packing
from graphscribe.model.row_boosting import RowTrees
from graphscribe.model.subsampling import subsampled_lengths
from graphscribe.model.transducer import Transducer, available_memory, cudnn_without_tf32, resolve_device, resolve_dtype
from graphscribe.output.rendering import TranscriptMaker
from graphscribe.output.timestamps import WordRules
from graphscribe.output.transcript import Transcript

log = logging.getLogger(__name__)


# What transcribe takes: a path (any format audio.py reads; "-" for standard input), or (L,), (L, C) or (C, L) samples
# at the model's rate (a tensor or a NumPy array; `audio.prepare_audio`)
Input = Union[str, os.PathLike, torch.Tensor, np.ndarray]

_ATTENTION = ("auto", "full", "local")
# --attention auto: longest input run with full attention. NVIDIA's model cards give 24 minutes as the longest
# single pass with full attention (parakeet-tdt-0.6b-v2/v3, the length its memory allows on an 80 GB card);
# past it NeMo's users switch to local attention, and so does auto.
FULL_ATTENTION_MAX_SECONDS = 24 * 60
# The longest clip a batch's features and subsampling run packed with (`Model.front_packing`): a packed row is as
# long as it, in one pass of the subsampling (whose first output, 256 channels at half the frame rate, then holds
# about 130 kB an encoder frame in 16 bits: 200 MB a row of 2 minutes).
PACKED_FRONT_MAX_SECONDS = 120
TREES_KEPT = 64  # boosting trees of recent phrase lists kept (`LoadedModel.row_tree`)
_MEMORY_HEADROOM = 0.8  # auto: full attention only while its estimate is below this share of the free memory


class LoadedModel:
    """A loaded transducer on one device and dtype, ready to transcribe."""

    load_seconds: dict[str, float]  # set by load_model: seconds per loading phase and "total"

    def __init__(self, module: Transducer, tokenizer: Tokenizer, options: RunOptions, source: str):
        self.cfg = module.cfg
        if options.attention not in _ATTENTION:
            raise ValueError(f"--attention {options.attention}: use auto, full or local")
        if options.beam_size < 1:
            raise ValueError(f"--beam {options.beam_size}: use 1 (greedy) or more")
        if options.attention_window < 1:
            raise ValueError(f"--attention-window {options.attention_window}: use 1 or more frames")
        if options.attention == "full" and self.cfg.encoder.local_context is not None:
            log.warning(
                f"{source}: trained with local attention {list(self.cfg.encoder.local_context)}; "
                "--attention full runs it with full attention, which is not what NeMo computes for it"
            )
        if options.confidence:
            check_method(options.confidence_method)
        self.source = source
        # a cache-aware model's (left, lookahead) attention context offline: NeMo's default, the first it lists
        self.context = self.cfg.encoder.streaming_contexts[0] if self.cfg.encoder.cache_aware else None
        self.device = resolve_device(options.device)
        self.dtype = resolve_dtype(options.dtype, self.device)
        if self.device.type != "cuda":
            options = replace(options, graphs=False)  # CUDA only; the CLI says so when asked
        self.options = options
        self.module = module.to_inference(self.device, self.dtype)
        self.tokenizer = tokenizer
        vocab = self.cfg.prediction.vocab_size
        o = options
        self.fusion = fusion_models(o.lm, o.lm_weight, o.hotwords, o.boost, tokenizer, vocab, self.device)
        self.decoder = self._new_decoder()
        self._boosted: GreedyDecoder | None = None  # rows with their own phrases: made at the first such batch
        self._trees: dict[tuple, Tables | None] = {}  # phrase lists -> their trees (the server's recent requests')
        self._trees_lock = threading.Lock()  # `row_tree` is called from the server's intake threads too
        self.beam: BeamDecoder | None = None  # beam_size > 1: decodes files (streams stay greedy, `decoder`)
        self._beams: dict[int, BeamDecoder] = {}  # other beam sizes, asked for by rows (a server's requests)
        self.fuse(Fusion(self.fusion) if self.fusion and options.beam_size > 1 else None)
        self._layer_graphs: LayerGraphs | None = None  # made at the first batch that uses them
        self._feature_graphs = FeatureGraphs(self.module.preprocessor.featurizer)  # packed rows' (batch_features)
        self._copy_stream: torch.cuda.Stream | None = None  # host-to-device copies of batches (`_copied`)
        decoding = self.cfg.decoding
        self.word_rules = WordRules(
            tokenizer.punctuation,
            tokenizer.wordpiece,
            decoding.word_separator,
            decoding.segment_separators,
            decoding.segment_gap,
        )
        self.transcript_maker = TranscriptMaker(
            tokenizer.model_proto,
            self.word_rules,
            decoding.is_tdt,
            window_stride=self.cfg.features.hop_length / self.cfg.features.sample_rate,
            subsampling=self.cfg.encoder.subsampling_factor,
            sample_rate=self.cfg.features.sample_rate,
            aggregation=options.confidence_method.aggregation,
        )

    def use_graphs(self, enabled: bool) -> None:
        """Decode and encode with (CUDA only) or without captured graphs from now on: a fresh decoder (fresh
        captures); the encoder's captured layers are kept for whenever graphs are on."""
        self.options = replace(self.options, graphs=enabled and self.device.type == "cuda")
        self.decoder = self._new_decoder()
        self._beams = {}
        if self.beam is not None:
            self.fuse(self.beam.fusion)
        self._boosted = None

    @property
    def capture_seconds(self) -> float:
        """Seconds spent capturing CUDA graphs so far: the decoders', the encoder layers' and the packed features'
        (the server's /metrics)."""
        layers = self._layer_graphs.capture_seconds if self._layer_graphs is not None else 0.0
        beam = sum(b.capture_seconds for b in (self.beam, *self._beams.values()) if b is not None)
        return self.decoder.capture_seconds + beam + layers + self._feature_graphs.capture_seconds

    def release_graphs(self) -> None:
        """Free the encoder's captured layers and features (their memory pools), e.g. after running out of memory."""
        if self._layer_graphs is not None:
            self._layer_graphs.release()
        self._feature_graphs.release()

    def _new_decoder(self) -> GreedyDecoder:
        return GreedyDecoder(
            self.module.decoder,
            self.module.joint,
            self.cfg.decoding,
            graphs=self.options.graphs,
            fusion=self.fusion,
            predictions=self.options.confidence,
        )

    def row_tree(self, phrases: tuple[tuple[str, float | None], ...], source: str = "hotwords") -> Tables | None:
        """The boosting tree of a request's or a stream's own phrases (`boosting.parse_request_hotwords`) with the
        options' hotwords: a request's phrases add to the process's, in one tree. HotwordError for a phrase that
        does not tokenise; None for no phrases at all. Recent lists are kept (a client sends the same ones again)."""
        own = self.options.hotwords  # a str is a comma-separated list, as `fusion_models` takes it
        key = (*(parse_hotwords(own) if isinstance(own, str) else map(parse_phrase, own)), *phrases)
        with self._trees_lock:
            if key in self._trees:
                return self._trees[key]
        # built outside the lock: a request's thousand phrases must not hold up the batching thread's lookups
        tree = boosting_tables(list(key), self.tokenizer, self.cfg.prediction.vocab_size, source) if key else None
        with self._trees_lock:
            if len(self._trees) >= TREES_KEPT:
                self._trees.pop(next(iter(self._trees)))
            return self._trees.setdefault(key, tree)

    def boosted_decoder(self) -> GreedyDecoder:
        """Greedy decoding with each row's own tree (`row_boosting.RowTrees`) after the options' LM, if any."""
        if self._boosted is None:
            lm = self.fusion[:1] if self.options.lm is not None else []
            trees = RowTrees(self.cfg.prediction.vocab_size, self.device)
            self._boosted = GreedyDecoder(
                self.module.decoder,
                self.module.joint,
                self.cfg.decoding,
                self.options.graphs,
                fusion=[*lm, (trees, self.options.boost)],
                predictions=self.options.confidence,
            )
        return self._boosted

    def fuse(self, fusion: Fusion | None) -> None:
        """Fuse token-level models (an n-gram LM, a boosting tree) into the beam search from now on; None: none.
        The options' `lm` and `hotwords` are fused so at loading; greedy decoding takes them from `self.fusion`,
        so a fusion given here with `beam_size` 1 is refused."""
        if fusion is not None and self.options.beam_size < 2:
            raise ValueError("a language model is fused into the beam search: use a beam of 2 or more")
        self._beams = {}
        if self.options.beam_size > 1:
            self.beam = self._new_beam(self.options.beam_size, fusion)

    def _new_beam(self, size: int, fusion: Fusion | None) -> BeamDecoder:
        o, module = self.options, self.module
        return BeamDecoder(module.decoder, module.joint, self.cfg.decoding, size, fusion, o.nbest, o.graphs)

    def beam_decoder(self, size: int) -> BeamDecoder:
        """The beam search of `size` hypotheses: the options' (`beam_size`), or one made at its first use and kept,
        with the same fusion (a server's request that asks for its own beam)."""
        if size == self.options.beam_size and self.beam is not None:
            return self.beam
        if size not in self._beams:
            fusion = self.beam.fusion if self.beam is not None else Fusion(self.fusion) if self.fusion else None
            self._beams[size] = self._new_beam(size, fusion)
        return self._beams[size]

    @property
    def sample_rate(self) -> int:
        return self.cfg.features.sample_rate

    # ------------------------------------------------------------------ stages
    def read(self, item) -> torch.Tensor:
        """A path, or samples at the model's rate -> (L,) float32 mono; raises AudioError (`audio.read_input`), for
        a file of over `options.max_audio_seconds` too."""
        return read_input(item, self.sample_rate, self.options.max_audio_seconds)

    @torch.inference_mode()
    def features(self, audios: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded batch of audio -> (B, n_mels, T) float32 features and (B,) lengths."""
        lengths = torch.tensor([a.numel() for a in audios])
        if len(audios) == 1:  # no padded copy of a long recording
            return self.batch_features(audios[0][None], lengths)
        batch = torch.zeros(len(audios), int(lengths.max()))
        for i, a in enumerate(audios):
            batch[i, : a.numel()] = a
        return self.batch_features(batch, lengths)

    @torch.inference_mode()
    def batch_features(
        self, audio: torch.Tensor, lengths: torch.Tensor, front: PackedFront | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) zero-padded audio and (B,) sample counts, anywhere (pinned: copied without waiting) ->
        (B, n_mels, T) float32 features and (B,) feature frames on the model's device. With `front`
        (`front_packing`): (R, n_mels, T) features of the clips laid end to end, its masks set; with graphs, replayed
        per packed shape (`graphs.FeatureGraphs`): the same numbers."""
        audio = self._copied(audio)
        lengths = lengths.to(self.device, non_blocking=True)
        if front is None:
            return self.module.preprocessor.featurizer(audio, lengths)
        packed = front.packing.pack_samples(audio, front)
        clips = PackedClips(front.sample_ids > 0, front.frame_ids, front.spans)
        features = self._feature_graphs(packed, clips, replay=self.options.graphs)
        return features, torch.div(lengths, self.cfg.features.hop_length, rounding_mode="floor")

    def front_packing(self, samples: list[int], padded: int, window: tuple[int, int] | None) -> PackedFront | None:
        """Whether a batch of clips of `samples` samples each (rows `padded` samples wide) runs its features and
        subsampling on packed rows, as its layers would (`packs_rows`, full attention, `Packing.plan`), and in
        one pass of the subsampling (no time chunks: a row of minutes goes the padded way)."""
        if not self.packs_rows or window is not None or len(samples) < 2:
            return None
        if max(samples) > PACKED_FRONT_MAX_SECONDS * self.sample_rate:
            return None
        hop, factor = self.cfg.features.hop_length, self.cfg.encoder.subsampling_factor
        frames = encoder_frames(samples, hop, factor)
        plan = Packing.plan(frames, subsampled_lengths(padded // hop + 1, factor), self.module.encoder.gap, self.device)
        return None if plan is None else plan.front(samples, hop, factor, self.device)

    def _copied(self, host: torch.Tensor) -> torch.Tensor:
        """A pinned host tensor on the device, copied on a stream of its own: the copy runs while the GPU works on
        what was queued before it (on the current stream it would wait behind the batch before's encoder, about
        1 ms of a server's 25 ms batch), and the current stream waits only for the copy."""
        if self.device.type != "cuda" or not host.is_pinned():
            return host.to(self.device, non_blocking=True)
        current = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.copy_stream):
            device = host.to(self.device, non_blocking=True)
        current.wait_stream(self.copy_stream)
        device.record_stream(current)  # made on the copy stream, used and freed on this one
        return device

    @property
    def copy_stream(self) -> torch.cuda.Stream:
        """The CUDA stream that batches' samples go to the device on (`_copied`, `pipeline.gather`)."""
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        return self._copy_stream

    @property
    def packs_rows(self) -> bool:
        """Whether a batch of clips of many lengths runs its layers on packed rows (`encoder_output`): in 16 bits."""
        return self.dtype.itemsize == 2 and not self.cfg.encoder.cache_aware

    @torch.inference_mode()
    def encoder_output(
        self,
        features: torch.Tensor,
        lengths: torch.Tensor,
        window: tuple[int, int] | None = None,
        samples: list[int] | None = None,
        front: PackedFront | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, n_mels, T) features and (B,) frames -> (B, T', D) encoder output in the model dtype and (B,) lengths.

        window: None for full attention, (left, right) frames for local attention (`attention_for` chooses).
        With graphs, a small batch's layers replay one captured layer (`graphs.LayerGraphs`): the same numbers.
        samples: the clips' sample counts, known on the host: in 16 bits a batch of clips of many lengths runs its
        layers on packed rows (`packing.Packing`). float32 keeps a row a clip: its numbers are then NeMo's for that
        batch, which a request's text against the CLI's depends on."""
        if self.cfg.encoder.cache_aware:  # NeMo's offline pass of a streaming model: one context, no caches
            with self._float32_math():
                x, lengths = cache_aware.encode(self.module.encoder, features.to(self.dtype), lengths, self.context)
            return x, lengths
        layers = None
        if self.options.graphs:
            if self._layer_graphs is None:  # packs the layers' weights at its first small batch (see LayerGraphs)
                self._layer_graphs = LayerGraphs(self.module.encoder.layers)
            layers = self._layer_graphs
        frames = None
        if samples is not None and self.packs_rows:
            frames = encoder_frames(samples, self.cfg.features.hop_length, self.cfg.encoder.subsampling_factor)
        with self._float32_math():
            return self.module.encoder(features.to(self.dtype), lengths, window, layers, frames, front)

    @torch.inference_mode()
    def encode(self, audios: list[torch.Tensor], sources: list[str] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded batch of audio -> (B, T', D) encoder output in the model dtype and (B,) lengths."""
        samples = [a.numel() for a in audios]
        return self.encoder_output(*self.features(audios), self.attention_for(samples, sources), samples)

    def attention_for(self, samples: list[int], sources: list[str] | None = None) -> tuple[int, int] | None:
        """The encoder's attention for a batch of inputs of `samples` samples each: None (full) or a (left, right)
        window of local attention.

        full: always full. A checkpoint trained with local attention otherwise runs with its own window.
        local: (W, W) with W = attention_window. auto: full attention (NeMo's default output) unless
        the longest input is over FULL_ATTENTION_MAX_SECONDS or `memory_estimate` says full attention
        would not fit in the free memory; then local, with one note on stderr naming the inputs.
        """
        own = self.cfg.encoder.local_context
        if self.options.attention == "full" or self.cfg.encoder.cache_aware:  # its own chunked attention, in blocks
            return None
        if own is not None:
            return own
        window = (self.options.attention_window, self.options.attention_window)
        if self.options.attention == "local":
            return window
        longest = max(samples, default=0)
        if longest / self.sample_rate > FULL_ATTENTION_MAX_SECONDS:
            reason = f"longer than {FULL_ATTENTION_MAX_SECONDS // 60} min"
        else:
            need = memory_estimate(self.cfg, len(samples), longest, self.dtype.itemsize, None)
            free = available_memory(self.device)
            if need <= _MEMORY_HEADROOM * free:
                return None
            reason = f"full attention would need about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        names = sources or ["<array>"] * len(samples)
        listed = ", ".join(f"{n} ({k / self.sample_rate / 60:.1f} min)" for n, k in zip(names[:3], samples))
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        log.warning(
            f"{listed}{more}: {reason}: local attention, {window[0]} frames each side "
            "(NeMo's rel_pos_local_attn; --attention full to keep full attention)"
        )
        return window

    def decode(
        self,
        encoded: torch.Tensor,
        lengths: torch.Tensor,
        queued: Callable[[], None] | None = None,
        trees: list[Tables | None] | None = None,
        beams: list[int] | None = None,
    ) -> list[Hypothesis]:
        """encoded (B, T, D), lengths (B,) -> a hypothesis per row. queued: called once the first round of steps is
        queued on the device (`Decoder.decode`). Greedy, or the beam search with `options.beam_size` > 1.
        beams: each row's own beam size (None: the options' for every row): the rows of each size are decoded
        together, greedy (1) or by that size's beam search (`beam_decoder`), and put back in their order.
        trees: each row's own boosting tree (`row_tree`; None: the options' phrases only): greedy rows with any
        run with each row's tree, without any today's decoder (the fused step where it runs); ValueError for a
        tree in a beam's row."""
        size = self.options.beam_size
        if beams is None or all(b == size for b in beams):
            return self._decode_rows(size, encoded, lengths, queued, trees)
        rows_of: dict[int, list[int]] = {}
        for row, b in enumerate(beams):
            rows_of.setdefault(b, []).append(row)
        hyps: list[Hypothesis] = [None] * len(beams)  # type: ignore[list-item]
        for b, rows in rows_of.items():
            index = torch.tensor(rows, device=encoded.device)
            own = [trees[r] for r in rows] if trees is not None else None
            part = self._decode_rows(b, encoded.index_select(0, index), lengths.index_select(0, index), queued, own)
            queued = None  # once: the first group's steps are queued
            for r, hyp in zip(rows, part):
                hyps[r] = hyp
        return hyps

    def _decode_rows(self, beam: int, encoded, lengths, queued, trees) -> list[Hypothesis]:
        """Rows decoded alike: greedy (beam 1, with their own trees if any) or by the beam search of `beam`."""
        boosted = trees is not None and any(tree is not None for tree in trees)
        if beam < 1:
            raise ValueError(f"beam {beam}: use 1 (greedy) or more")
        if beam > 1 and boosted:
            raise ValueError("a row's own phrases are boosted in greedy decoding, not in a beam search")
        with self._float32_math():
            if beam > 1:
                return self.beam_decoder(beam).decode(encoded, lengths, queued)
            if boosted:
                rows = [self.row_tree(()) if tree is None else tree for tree in trees]
                return self.boosted_decoder().decode(encoded, lengths, queued, rows)
            return self.decoder.decode(encoded, lengths, queued)

    @torch.inference_mode()
    def add_confidences(self, encoded: torch.Tensor, hyps: list[Hypothesis]) -> None:
        """Set each hypothesis's token confidences (`options.confidence_method`) from `encoded` (B, T, D), the
        encoder output it was decoded from: the joint on each token's frame and the prediction output its step read,
        which a decoder with `options.confidence` keeps (`confidence.measured`); otherwise (a request's own
        `confidence`, the beam search) its emitting steps replayed in a few batched calls (`confidence.replay_batch`)."""
        tokens, frames = [h.token_ids for h in hyps], [h.frames for h in hyps]
        method = self.options.confidence_method
        kept = [h.predictions for h in hyps]
        with self._float32_math():
            if all(p is not None or not t for p, t in zip(kept, tokens)):  # the decode kept each step's output
                values = measured(self.module.joint, encoded, kept, frames, method)
            else:
                start = self.decoder.start_state(len(hyps), encoded.device, encoded.dtype)
                values = replay_batch(self.module.decoder, self.module.joint, start, encoded, tokens, frames, method)
        for hyp, confidences in zip(hyps, values):
            hyp.confidences, hyp.predictions = confidences, None

    def _float32_math(self):
        """float32 means float32 on CUDA: cuDNN would otherwise run the encoder's convolutions (and the prediction
        net's LSTM) in TF32, which moves the features enough to flip near-tied tokens against NeMo's float32
        result. Only around our own calls (graph captures included): the process's setting is left as it was."""
        if self.device.type == "cuda" and self.dtype == torch.float32:
            return cudnn_without_tf32()
        return contextlib.nullcontext()

    def frame_seconds(self, frame: int) -> float:
        """Seconds at an encoder frame, computed as NeMo does (frame x window stride x subsampling factor)."""
        return self.transcript_maker.frame_seconds(frame)

    def make_transcript(
        self, source: str, samples: int, hyp: Hypothesis, seconds: float, word_times: bool = True
    ) -> Transcript:
        """A hypothesis of `samples` samples of audio as a Transcript; `word_times=False`: text and token ids only
        (no tokens, words, segments)."""
        return self.transcript_maker.make(self.tokenizer, source, samples, hyp, seconds, word_times)

    # ------------------------------------------------------------------ API
