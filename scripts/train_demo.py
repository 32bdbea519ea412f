#!/usr/bin/env python
"""Train the bundled demo model: a small TDT transducer on synthetic espeak-ng speech, in one GPU run.

    python scripts/demo_speech.py prepare             # here, once: text and the espeak-ng stub
    python scripts/train_demo.py --out $OUT           # on a GPU: the bundled model's run (about 24 minutes)
    bash scripts/gpu_demo_run.sh start ...            # the same on the lent GPU, whose commands stop at 10 minutes
    python scripts/train_demo.py --smoke --out /tmp/x # the whole pipeline on a CPU in about 2 minutes

One process does it all: synthesises the speech in forked workers (training starts once a
share of it has arrived and takes in the rest as it comes), trains a SentencePiece BPE
vocabulary on the training text, trains graphscribe's own `Transducer` (the very modules the
package runs) with the TDT loss of scripts/tdt_loss.py plus an auxiliary CTC head (dropped at
export), writes a NeMo-format `.nemo` (float16 weights, NeMo's config keys and state-dict
names, via scripts/make_checkpoint.py), then loads that file with `graphscribe.load_model` and
reports greedy word error rates on held-out sentences spoken by held-out voice variants, and
the transcripts of the real recordings in .textdata/real.

The learning-rate schedule runs on the clock (warm-up, then cosine over `--train-seconds`), so
the run ends on time whatever the machine's speed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import demo_speech as speech  # scripts/, beside this one
import make_checkpoint as mc
import sentencepiece as spm
import tdt_loss as losses
import torch
import torch.nn.functional as F
import torchaudio.functional as AF
from torch.nn.utils.rnn import pad_sequence

from graphscribe.api import load_model
from graphscribe.io.checkpoint import read_checkpoint
from graphscribe.io.config import model_config_from_nemo
from graphscribe.model.transducer import Transducer, load_state

PRESET = "graphscribe-demo"
VOCAB = 1024
DURATIONS = (0, 1, 2, 3, 4)
assert mc.PRESETS[PRESET].vocab_size == VOCAB and mc.PRESETS[PRESET].durations == DURATIONS  # configs/presets.yaml
SPEEDS = ((1, 1), (1, 1), (10, 9), (20, 19), (20, 21), (10, 11))  # (new, orig) resampling rates: speed orig/new
SIGMA, OMEGA = 0.02, 0.1  # NeMo's TDT loss options, at its FastConformer-TDT config's values
CTC_WEIGHT = 0.3
RANDOM_SHARE = 0.5  # of the training utterances: random word sequences rather than fortune sentences


@dataclass
class Settings:
    utterances: int  # training utterances synthesised
    eval_utterances: int  # held-out sentences x held-out voices
    train_seconds: float
    batch_seconds: float  # audio per batch
    max_batch: int
    start_clips: int  # training clips that must have arrived before training starts
    deadline: float = 1560.0  # seconds after start by which everything, evaluation included, should be done
    reserve: float = 75.0  # kept for export and evaluation
    snapshot_every: float = 300.0  # seconds of training between snapshots (work/snapshot.nemo)
    lr: float = 2e-3
    warmup: float = 0.08  # share of the training time
    workers: int = max(1, (os.cpu_count() or 2) - 1)


GPU = Settings(
    utterances=250000, eval_utterances=400, train_seconds=1380.0, batch_seconds=720.0, max_batch=384, start_clips=16000
)
SMOKE = Settings(
    utterances=160,
    eval_utterances=12,
    train_seconds=25.0,
    batch_seconds=30.0,
    max_batch=16,
    start_clips=160,
    workers=2,
    deadline=1e9,
    snapshot_every=10.0,
)


def log(*parts) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s]", *parts, flush=True)


T0 = time.perf_counter()


# ---------------------------------------------------------------------------- text and voices


def make_jobs(text, train_pool, held_pool, settings: Settings, seed: int):
    """Training (text, voice) pairs, then held-out ones; and the SentencePiece training text."""
    rng = random.Random(seed)
    n_random = int(settings.utterances * RANDOM_SHARE)
    randoms = speech.random_word_sentences(rng, max(n_random, 20000), text.common, text.weights, text.dictionary)
    sentences = list(text.train)
    rng.shuffle(sentences)
    train_texts = [sentences[i % len(sentences)] for i in range(settings.utterances - n_random)] + randoms[:n_random]
    rng.shuffle(train_texts)
    train_voices = [speech.random_voice(rng, train_pool) for _ in train_texts]
    held = rng.sample(text.heldout, min(settings.eval_utterances, len(text.heldout)))
    held_voices = [speech.random_voice(rng, held_pool) for _ in held]
    corpus = [speech.normalize(s) for s in text.train] + randoms  # the tokenizer sees all training text
    return train_texts, train_voices, held, held_voices, corpus


def train_tokenizer(corpus: list[str], seed: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        vocab_size=VOCAB,
        model_type="bpe",
        character_coverage=1.0,
        unk_id=0,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        num_threads=4,
        minloglevel=2,
    )
    return model.getvalue()


# ---------------------------------------------------------------------------- data on the device


@dataclass
class ClipStore:
    """Training clips at 16 kHz on the device, with their token ids; filled as synthesis delivers."""

    device: torch.device
    audio: list[torch.Tensor] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    by_length: list[int] = field(default_factory=list)  # indices, shortest first

    def add(self, clips: list[torch.Tensor], token_lists: list[list[int]]) -> None:
        for clip, ids in zip(clips, token_lists):
            if clip.numel() >= 4 * 160 * 8 and ids:  # at least 4 encoder frames
                self.audio.append(clip.to(torch.float16))
                self.tokens.append(ids)
        self.by_length = sorted(range(len(self.audio)), key=lambda i: self.audio[i].numel())

    def sample(self, rng: random.Random, budget_samples: int, max_batch: int) -> list[int]:
        """A batch of clips of similar length, about `budget_samples` of padded audio."""
        n = len(self.by_length)
        p = rng.randrange(n)
        size = 1
        for _ in range(3):
            longest = self.audio[self.by_length[min(p + size, n) - 1]].numel()
            size = max(1, min(max_batch, budget_samples // longest))
        p = min(p, max(0, n - size))
        return self.by_length[p : p + size]


class Arrivals:
    """Collects the synthesis pool's clips on a thread; the training loop takes them in batches."""

    def __init__(self, iterator):
        self.clips: list = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(iterator,), daemon=True)
        self._thread.start()

    def _run(self, iterator) -> None:
        try:
            for clip in iterator:
                self.clips.append(clip)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which raises it
            self.error = err

    def wait_for(self, n: int, stall_seconds: float = 120.0) -> None:
        last, since = len(self.clips), time.perf_counter()
        while len(self.clips) < n:
            if self.error is not None:
                raise RuntimeError(f"speech synthesis failed: {self.error!r}") from self.error
            if len(self.clips) != last:
                last, since = len(self.clips), time.perf_counter()
            elif time.perf_counter() - since > stall_seconds:
                raise RuntimeError(f"speech synthesis stalled at {last} of {n} clips")
            time.sleep(0.1)


def take_in(store: ClipStore, arrivals: Arrivals, taken: int, limit: int, token_lists, device) -> int:
    """Move the clips that arrived since `taken` (up to `limit`, the training ones) into the store.

    The host copies are dropped once on the device: a long run's raw audio would not fit in memory twice.
    """
    upto = min(len(arrivals.clips), limit)
    if upto > taken:
        store.add(speech.to_model_rate(arrivals.clips[taken:upto], device), token_lists[taken:upto])
        for i in range(taken, upto):
            arrivals.clips[i] = None
    return max(upto, taken)


def batch_audio(store: ClipStore, ids: list[int], rng: random.Random):
    """Padded (B, L) float32 audio with gain, speed change and noise; (B,) lengths; (B, U) targets, (B,) lengths."""
    device = store.device
    clips = [store.audio[i] for i in ids]
    lengths = torch.tensor([c.numel() for c in clips]).to(device)
    audio = pad_sequence(clips, batch_first=True).float()  # (B, L)
    new, orig = rng.choice(SPEEDS)
    if new != orig:
        audio = AF.resample(audio, orig, new)
        lengths = torch.div(lengths * new, orig, rounding_mode="floor").clamp(max=audio.shape[1])
    b = len(ids)
    valid = torch.arange(audio.shape[1], device=device)[None, :] < lengths[:, None]
    gain = 10 ** (torch.empty(b, 1, device=device).uniform_(-10, 6) / 20)
    rms = (audio.pow(2).sum(1, keepdim=True) / lengths[:, None]).sqrt().clamp(min=1e-4)
    snr_db = torch.empty(b, 1, device=device).uniform_(10, 40)
    noisy = torch.rand(b, 1, device=device) < 0.5
    noise = torch.randn_like(audio)
    if rng.random() < 0.5:  # brown-ish noise: most energy low, like hum and rumble
        noise = torch.cumsum(noise, dim=1)
        noise = noise - noise.mean(1, keepdim=True)
        noise = noise / noise.std(1, keepdim=True).clamp(min=1e-6)
    audio = audio + noisy * noise * rms * 10 ** (-snr_db / 20)
    audio = (audio * gain).masked_fill(~valid, 0.0)
    targets = [torch.tensor(store.tokens[i]) for i in ids]
    target_lengths = torch.tensor([len(t) for t in targets]).to(device)
    return audio, lengths, pad_sequence(targets, batch_first=True).to(device), target_lengths


def _band_mask(size: int, starts: torch.Tensor, widths: torch.Tensor) -> torch.Tensor:
    """(B, K) starts and widths -> (B, size) True inside any of the K bands."""
    pos = torch.arange(size, device=starts.device)[None, None, :]
    return ((pos >= starts[..., None]) & (pos < (starts + widths)[..., None])).any(dim=1)


def spec_augment(features: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """Two frequency masks (up to 15 mels) and two time masks (up to 4% of the clip) per row."""
    b, n_mels, t = features.shape
    device = features.device
    f_width = torch.randint(0, 16, (b, 2), device=device)
    f_start = (torch.rand(b, 2, device=device) * (n_mels - f_width)).long()
    t_width = (torch.rand(b, 2, device=device) * (frames[:, None] // 25 + 1)).long()
    t_start = (torch.rand(b, 2, device=device) * (frames[:, None] - t_width).clamp(min=0)).long()
    masked = _band_mask(n_mels, f_start, f_width)[:, :, None] | _band_mask(t, t_start, t_width)[:, None, :]
    return features.masked_fill(masked, 0.0)


# ---------------------------------------------------------------------------- model and loss


def build_model(seed: int, device: torch.device, init=None) -> tuple[Transducer, torch.nn.Linear, dict]:
    """The demo Transducer: random, or the weights of `init` (a graphscribe Checkpoint) to train on."""
    config = mc.preset_config(PRESET, seed)
    cfg = model_config_from_nemo(config)
    torch.manual_seed(seed)
    module = Transducer(cfg)
    if init is not None:
        load_state(
            module, {k: v.float() if v.is_floating_point() else v for k, v in init.state_dict.items()}, init.source
        )
    feats = cfg.features
    fb = mc.mel_filterbank(feats.sample_rate, feats.n_fft, feats.n_mels, 0.0, feats.sample_rate / 2)
    module.preprocessor.featurizer.fb.copy_(torch.from_numpy(fb)[None])
    module.preprocessor.featurizer.window.copy_(torch.hann_window(feats.win_length, periodic=False))
    if init is not None:
        return module.to(device), torch.nn.Linear(cfg.encoder.d_model, VOCAB + 1).to(device), config
    ctc_head = torch.nn.Linear(cfg.encoder.d_model, VOCAB + 1)  # training only: not exported
    return module.to(device), ctc_head.to(device), config


def train_step(module: Transducer, ctc_head, audio, lengths, targets, target_lengths, rng, augment: bool):
    """One batch -> (loss for backward, summed TDT loss, summed CTC loss, tokens)."""
    cfg = module.cfg
    blank = cfg.blank_id
    features, frames = module.preprocessor.featurizer(audio, lengths)  # float32, (B, n_mels, T)
    if augment:
        features = spec_augment(features, frames)
    with torch.autocast(audio.device.type, dtype=torch.bfloat16, enabled=audio.is_cuda):
        encoded, enc_lengths = module.encoder(features, frames)  # (B, T', D)
        f = module.joint.enc(encoded)  # (B, T', J)
    start = torch.full((targets.shape[0], 1), blank, dtype=torch.long, device=targets.device)
    history = torch.cat([start, targets], dim=1)  # (B, U+1): blank (zero embedding) first, as at inference
    embedded = module.decoder.prediction.embed(history)  # float32 LSTM: small, and cuDNN-safe
    predicted, _ = module.decoder.prediction.dec_rnn.lstm(embedded.transpose(0, 1))  # (U+1, B, H)
    with torch.autocast(audio.device.type, dtype=torch.bfloat16, enabled=audio.is_cuda):
        g = module.joint.pred(predicted.transpose(0, 1))  # (B, U+1, J)
        logits = module.joint.joint_net(f[:, :, None, :] + g[:, None, :, :])  # (B, T', U+1, V+1+D)
        ctc_logits = ctc_head(encoded)
    tdt = losses.tdt_loss(logits, targets, enc_lengths, target_lengths, DURATIONS, blank, SIGMA, OMEGA, rng)
    ctc = F.ctc_loss(
        torch.log_softmax(ctc_logits.float(), -1).transpose(0, 1),
        targets,
        enc_lengths,
        target_lengths,
        blank=blank,
        reduction="none",
        zero_infinity=True,
    )
    tokens = target_lengths.sum()
    loss = (tdt.sum() + CTC_WEIGHT * ctc.sum()) / tokens
    return loss, tdt.sum().detach(), ctc.sum().detach(), tokens


def learning_rate(settings: Settings, progress: float) -> float:
    if progress < settings.warmup:
        return settings.lr * progress / settings.warmup
    x = (progress - settings.warmup) / (1 - settings.warmup)
    return settings.lr * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * min(1.0, x))))


def train(
    module,
    ctc_head,
    optimizer,
    settings: Settings,
    planned: float,
    store: ClipStore,
    arrivals: Arrivals,
    taken: int,
    token_lists,
    rng: random.Random,
    snapshot=None,
) -> tuple[int, list[dict]]:
    """The training loop, for `planned` seconds; takes in arriving clips. -> (steps, logged history).

    `snapshot()`, if given, is called every `settings.snapshot_every` seconds (a run cut short still leaves a model).
    """
    n_train = len(token_lists)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    module.train()
    budget = int(settings.batch_seconds * speech.SAMPLE_RATE)
    start, step, history = time.perf_counter(), 0, []
    next_snapshot = settings.snapshot_every
    sums = {"tdt": 0.0, "ctc": 0.0, "tokens": 0, "clips": 0}
    while (elapsed := time.perf_counter() - start) < planned:
        if step % 20 == 0 and taken < n_train:
            taken = take_in(store, arrivals, taken, n_train, token_lists, store.device)
        lr = learning_rate(settings, elapsed / planned)
        for group in optimizer.param_groups:
            group["lr"] = lr
        ids = store.sample(rng, budget, settings.max_batch)
        batch = batch_audio(store, ids, rng)
        loss, tdt_sum, ctc_sum, tokens = train_step(module, ctc_head, *batch, rng, augment=elapsed > 0.1 * planned)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        sums["tdt"] += float(tdt_sum)  # one host sync a step: the logged numbers; the step is far longer
        sums["ctc"] += float(ctc_sum)
        sums["tokens"] += int(tokens)
        sums["clips"] += len(ids)
        if step % 25 == 0 or step == 1:
            entry = {
                "step": step,
                "seconds": round(elapsed, 1),
                "lr": lr,
                "tdt_per_token": sums["tdt"] / sums["tokens"],
                "ctc_per_token": sums["ctc"] / sums["tokens"],
                "clips_per_step": sums["clips"] / (1 if step == 1 else 25),
                "grad_norm": float(grad_norm),
                "clips_in_store": len(store.audio),
            }
            history.append(entry)
            log(json.dumps(entry))
            sums = {"tdt": 0.0, "ctc": 0.0, "tokens": 0, "clips": 0}
        if snapshot is not None and elapsed > next_snapshot:
            snapshot()
            next_snapshot += settings.snapshot_every
    log(f"trained {step} steps in {time.perf_counter() - start:.0f} s")
    return step, history


# ---------------------------------------------------------------------------- export and evaluation


def export(module: Transducer, config: dict, tokenizer_model: bytes, path: Path, seed: int) -> Path:
    """A NeMo-format .nemo: float16 weights (float32 preprocessor buffers), NeMo's names and layout."""
    sp = spm.SentencePieceProcessor(model_proto=tokenizer_model)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    config["joint"]["vocabulary"] = list(pieces)
    config["loss"]["tdt_kwargs"].update(sigma=SIGMA, omega=OMEGA)  # what this model was trained with
    config["labels"] = list(pieces)
    files = {
        "tokenizer.model": tokenizer_model,
        "tokenizer.vocab": "".join(f"{p}\t{sp.get_score(i):g}\n" for i, p in enumerate(pieces)).encode(),
        "vocab.txt": "".join(f"{p}\n" for p in pieces).encode(),
    }
    state = {}
    for key, value in module.state_dict().items():
        value = value.detach().cpu()
        if value.is_floating_point() and not key.startswith("preprocessor."):
            value = value.to(torch.float16)
        state[key] = value
    mc.write_nemo(path, config, state, files, mc.tokenizer_names(PRESET, seed))
    return path


def split_for_return(path: Path, out: Path, max_bytes: int) -> list[str]:
    """Copy `path` into `out`, in numbered parts if it is larger than `max_bytes` (cat them back together)."""
    data = path.read_bytes()
    if len(data) <= max_bytes:
        (out / path.name).write_bytes(data)
        return [path.name]
    names = []
    for i in range(0, len(data), max_bytes):
        name = f"{path.name}.part{i // max_bytes}"
        (out / name).write_bytes(data[i : i + max_bytes])
        names.append(name)
    return names


def evaluate(path: Path, device: str, clips: list[torch.Tensor], texts: list[str], real: list[Path]) -> dict:
    model = load_model(path, device=device)
    audio = [c.float().cpu().numpy() for c in clips]
    start = time.perf_counter()
    results = model.transcribe(audio, batch_size=32)
    seconds = time.perf_counter() - start
    hyps = [r.text for r in results]
    wer = speech.word_error_rate(texts, hyps)
    graphs = {}
    if device == "cuda":  # the same clips without CUDA graphs: the transcripts must be byte-identical
        eager = load_model(path, device=device, graphs=False)
        eager_hyps = [r.text for r in eager.transcribe(audio, batch_size=32)]
        differ = [i for i, (a, b) in enumerate(zip(hyps, eager_hyps)) if a != b]
        graphs = {
            "graphs_identical": not differ,
            "graphs_differ": [{"graphs": hyps[i], "eager": eager_hyps[i]} for i in differ[:10]],
        }
    worst = sorted(((speech.word_errors(t, h)[0], t, h) for t, h in zip(texts, hyps)), reverse=True)[:10]
    real_results = model.transcribe([str(p) for p in real]) if real else []
    return {
        "heldout_wer": wer,
        "heldout_utterances": len(texts),
        "heldout_words": sum(len(speech.normalize(t).split()) for t in texts),
        "decode_seconds": seconds,
        "examples": [{"ref": speech.normalize(t), "hyp": h} for t, h in list(zip(texts, hyps))[:10]],
        "worst": [{"errors": e, "ref": speech.normalize(t), "hyp": h} for e, t, h in worst],
        "real": [{"path": p.name, "text": r.text, "error": r.error} for p, r in zip(real, real_results)],
        **graphs,
    }


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(os.environ.get("OUT", "out")),
        help="small outputs (log, JSON, checkpoint parts)",
    )
    parser.add_argument("--work", type=Path, default=Path(".scratch/demo"), help="where the whole .nemo is written")
    parser.add_argument("--smoke", action="store_true", help="tiny run of the whole pipeline on the CPU")
    parser.add_argument("--train-seconds", type=float, help="override the training time")
    parser.add_argument("--utterances", type=int, help="override the number of training utterances")
    parser.add_argument(
        "--deadline",
        type=float,
        help="override the seconds by which the whole run, evaluation "
        "included, should end (training is shortened to fit)",
    )
    parser.add_argument(
        "--max-return-mb", type=float, default=15.5, help="split the .nemo in $OUT into parts above this"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--init",
        type=Path,
        help="continue training this .nemo (its weights and tokenizer); use another --seed for fresh utterances",
    )
    args = parser.parse_args(argv)
    settings = SMOKE if args.smoke else GPU
    if args.train_seconds:
        settings.train_seconds = args.train_seconds
    if args.utterances:
        settings.utterances = args.utterances
    if args.deadline:
        settings.deadline = args.deadline
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)

    root = speech.install_espeak()
    text = speech.load_text()
    train_pool, held_pool = speech.voice_pools(root)
    train_texts, train_voices, held_texts, held_voices, corpus = make_jobs(
        text, train_pool, held_pool, settings, args.seed
    )
    log(
        f"{len(train_texts)} training utterances ({len(train_pool)} variants), {len(held_texts)} held out "
        f"(variants {held_pool}); synthesising on {settings.workers} processes"
    )
    pool, clips_iter = speech.start_synthesis(
        root, train_texts + held_texts, train_voices + held_voices, settings.workers
    )
    arrivals = Arrivals(clips_iter)  # fork happened above, before CUDA starts

    init = read_checkpoint(args.init) if args.init else None
    if init is not None:  # continue: the same pieces, a shorter warm-up from a lower peak
        settings.lr, settings.warmup = 1e-3, 0.03
    tokenizer_model = init.tokenizer_model if init is not None else train_tokenizer(corpus, args.seed)
    sp = spm.SentencePieceProcessor(model_proto=tokenizer_model)
    token_lists = [sp.encode(speech.normalize(t)) for t in train_texts]
    log(
        f"tokenizer: {sp.get_piece_size()} pieces; {sum(map(len, token_lists)) / len(token_lists):.1f} tokens per utterance"
    )

    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True  # training only; the evaluation's loader sets its own
    torch.backends.cudnn.allow_tf32 = True
    module, ctc_head, config = build_model(args.seed, device, init)
    n_params = sum(p.numel() for p in module.parameters())
    n_encoder = sum(p.numel() for p in module.encoder.parameters())
    log(f"model: {n_params / 1e6:.2f} M parameters ({n_encoder / 1e6:.2f} M encoder) on {device}")
    params = list(module.parameters()) + list(ctc_head.parameters())
    optimizer = torch.optim.AdamW(params, lr=settings.lr, betas=(0.9, 0.98), weight_decay=1e-3)

    store = ClipStore(device)
    n_train = len(train_texts)
    arrivals.wait_for(min(n_train, settings.start_clips))
    taken = take_in(store, arrivals, 0, n_train, token_lists, device)
    planned = min(settings.train_seconds, settings.deadline - (time.perf_counter() - T0) - settings.reserve)
    log(f"training starts with {len(store.audio)} clips, for {planned:.0f} s")

    def snapshot() -> None:  # write_nemo renames a finished file into place: a reader never sees half of one
        log(f"snapshot: {export(module, config, tokenizer_model, args.work / 'snapshot.nemo', args.seed)}")

    step, history = train(
        module, ctc_head, optimizer, settings, planned, store, arrivals, taken, token_lists, rng, snapshot
    )

    module.eval()
    nemo_path = export(module, config, tokenizer_model, args.work / "demo.nemo", args.seed)
    size = nemo_path.stat().st_size
    digest = hashlib.sha256(nemo_path.read_bytes()).hexdigest()
    parts = split_for_return(nemo_path, args.out, int(args.max_return_mb * 2**20))
    log(f"wrote {nemo_path} ({size / 1e6:.2f} MB, sha256 {digest[:16]}...) -> {args.out}: {parts}")

    arrivals.wait_for(n_train + len(held_texts))
    pool.close()
    held_clips = speech.to_model_rate(arrivals.clips[n_train:], device)
    real = sorted((speech.TEXT_DIR / "real").glob("*")) if (speech.TEXT_DIR / "real").exists() else []
    report = evaluate(nemo_path, device.type, held_clips, held_texts, real)
    report.update(
        steps=step,
        train_seconds=planned,
        parameters=n_params,
        encoder_parameters=n_encoder,
        nemo_bytes=size,
        nemo_sha256=digest,
        parts=parts,
        history=history,
        total_seconds=time.perf_counter() - T0,
        training_clips=len(store.audio),
        heldout_variants=list(held_pool),
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
    )
    (args.out / "eval.json").write_text(json.dumps(report, indent=1))
    if "graphs_identical" in report:
        log(f"graphs on and off: {'identical' if report['graphs_identical'] else 'DIFFERENT'} transcripts")
    log(
        f"held-out WER {report['heldout_wer']:.2%} on {len(held_texts)} utterances; real speech: "
        + " | ".join(f"{r['path']}: {r['text']!r}" for r in report["real"])
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
