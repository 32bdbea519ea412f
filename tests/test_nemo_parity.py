"""Parity with NeMo, and the greedy decoding rules against a scripted joint.

Part 1 runs the NeMo-made tiny TDT checkpoint and compares every stage with what NeMo
computed (reference.json / reference.npz). Part 2 drives `GreedyDecoder` with a fake
prediction net and joint whose logits are a lookup table indexed by (row, frame, tokens
emitted so far); the expected tokens are worked out by hand from NeMo's rules.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import CLIP_NAMES, CLIPS, SPEECH_CLIP, reference_clip

from graphscribe.io.config import DecodingConfig, FeatureConfig, JointConfig, PredictionConfig
from graphscribe.model.decoding import GreedyDecoder
from graphscribe.model.features import _normalize_per_feature
from graphscribe.model.heads import Joint, PredictionNet

# ============================================================================ part 1: NeMo parity


def _relative_error(ours: np.ndarray, nemo: np.ndarray) -> float:
    return float(np.linalg.norm(ours - nemo) / max(np.linalg.norm(nemo), 1e-12))


def _read(model, name: str) -> torch.Tensor:
    return model.read(CLIPS / name)


LOGMEL_ULPS = 2  # how far two CPUs' float32 log-mels may differ, in ulps at the largest |log-mel| (1 seen)
UNIT_ROUNDOFF = 2.0**-24  # float32


def _normalization_tolerance(nemo: np.ndarray, cfg: FeatureConfig) -> np.ndarray:
    """How far correct float32 features may be from NeMo's, per element of one clip's (n_mels, N) features, from
    the conditioning of NeMo's per_feature normalisation y = (x - m) / (s + g) (m, s: a mel row's mean and
    std of its log-mel x over N frames, g = std_guard).

    The STFT, GEMM and log kernels round differently on other CPUs, so x may differ from NeMo's by d, a few
    ulps at X = |log(log_zero_guard)|, the largest |x| can be; each mean carries at most ceil(log2 N) u X of
    summation rounding, and s moves by at most the std of the differences, d sqrt(N / (N - 1)). To first order

        |dy| <= (2 d + 2 ceil(log2 N) u X + |y| d sqrt(N / (N - 1))) / (s + g),

    and 1 / (s + g) = (1 - r) / g, where r = s / (s + g) is the rms of NeMo's y over the row (with N - 1), so
    the bound comes from the fixture alone. Speech rows (s ~ 1) give under 1e-4 of max |y|; the rows of a
    silent clip (1-LSB dither under log_zero_guard: s ~ 2e-5, about ten ulps of x) give up to about 1, since there
    one ulp of x is 0.06 of y: those rows are rounding noise scaled up.
    """
    frames = nemo.shape[1]
    y = nemo.astype(np.float64)
    rms = np.sqrt((y**2).sum(axis=1, keepdims=True) / (frames - 1))  # (n_mels, 1)
    amplification = (1.0 - rms) / cfg.std_guard  # 1 / (s + g)
    largest = abs(np.log(cfg.log_zero_guard))
    d = LOGMEL_ULPS * float(np.spacing(np.float32(largest)))
    summation = np.ceil(np.log2(frames)) * UNIT_ROUNDOFF * largest
    return (2 * d + 2 * summation + np.abs(y) * d * np.sqrt(frames / (frames - 1))) * amplification


def _assert_features_match(ours: np.ndarray, nemo: np.ndarray, cfg: FeatureConfig, name: str) -> None:
    """Within 1e-4 of NeMo's largest value (and 1e-4 relative in all), or the normalisation's own conditioning
    (`_normalization_tolerance`) where that is larger: only in rows that barely vary."""
    assert ours.shape == nemo.shape, name
    conditioning = _normalization_tolerance(nemo, cfg)
    error = np.abs(ours.astype(np.float64) - nemo)
    assert (error <= np.maximum(1e-4 * np.abs(nemo).max(), conditioning)).all(), name
    assert np.linalg.norm(error) <= max(1e-4 * np.linalg.norm(nemo), np.linalg.norm(conditioning)), name


def _nemo_features(nemo: np.ndarray, samples: int, hop_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NeMo's (n_mels, N) features as a batch of one, zero-padded to the frames its preprocessor makes."""
    features = torch.zeros(1, nemo.shape[0], samples // hop_length + 1)  # (1, n_mels, T)
    features[0, :, : nemo.shape[1]] = torch.from_numpy(nemo)
    return features, torch.tensor([nemo.shape[1]])


@pytest.mark.parametrize("index", range(len(CLIP_NAMES)), ids=CLIP_NAMES)
def test_features_match_nemo(model, reference_arrays, index):
    clip = reference_clip(CLIP_NAMES[index])
    audio = _read(model, clip["file"])
    assert audio.numel() == clip["samples"]
    features, lengths = model.features([audio])  # (1, n_mels, T)
    assert int(lengths[0]) == clip["feature_frames"]
    nemo = reference_arrays[f"clip{index}_features"]  # (n_mels, feature_frames)
    ours = features[0, :, : clip["feature_frames"]].float().cpu().numpy()
    _assert_features_match(ours, nemo, model.cfg.features, clip["file"])


def test_speech_features_keep_the_plain_bound(model, reference_arrays):
    """The conditioning term loosens nothing where the log-mel varies: every speech row stays under 1e-4 max |y|."""
    nemo = reference_arrays[f"clip{CLIP_NAMES.index(SPEECH_CLIP.name)}_features"]
    assert (_normalization_tolerance(nemo, model.cfg.features) < 1e-4 * np.abs(nemo).max()).all()


def _ulps_away(x: torch.Tensor, ulps: np.ndarray) -> torch.Tensor:
    """x moved by `ulps` (an integer array of x's shape) float32 ulps, each element its own way."""
    moved = x.numpy().copy()
    for _ in range(int(np.abs(ulps).max())):
        step = np.nextafter(moved, np.where(ulps > 0, np.inf, -np.inf).astype(np.float32))
        moved = np.where(np.abs(ulps) > 0, step, moved)
        ulps = ulps - np.sign(ulps)
    return torch.from_numpy(moved)


@pytest.mark.parametrize("name", ["silence_1s.wav", SPEECH_CLIP.name])
def test_other_cpus_rounding_stays_within_the_bound(model, reference_arrays, name):
    """Another CPU emulated: the log-mel moved by up to LOGMEL_ULPS ulps, summed in reverse, then normalised.

    The silent clip's plain 1e-4 bound fails this way (as it does on Intel Sapphire Rapids); the conditioning
    bound holds, and still rejects a normalisation with the wrong std guard."""
    clip = reference_clip(name)
    nemo = reference_arrays[f"clip{CLIP_NAMES.index(name)}_features"]
    cfg = model.cfg.features
    audio, frames = _read(model, name), clip["feature_frames"]
    log_mel = model.module.preprocessor.featurizer._log_mel(audio[None], torch.tensor([audio.numel()]), 0, frames)
    rng = np.random.default_rng(0)
    plain_bound_held = True
    for share in (0.03, 1.0):
        ulps = rng.integers(-LOGMEL_ULPS, LOGMEL_ULPS + 1, size=log_mel.shape) * (rng.random(log_mel.shape) < share)
        moved = _ulps_away(log_mel, ulps).flip(-1).contiguous()  # reversed: other summation orders
        _normalize_per_feature(moved, torch.tensor([frames]), cfg.std_guard)
        ours = moved.flip(-1)[0].numpy()
        _assert_features_match(ours, nemo, cfg, name)
        plain_bound_held &= bool(np.abs(ours - nemo).max() < 1e-4 * np.abs(nemo).max())
    assert plain_bound_held == (name == SPEECH_CLIP.name)
    wrong = log_mel.clone()
    _normalize_per_feature(wrong, torch.tensor([frames]), 100 * cfg.std_guard)
    with pytest.raises(AssertionError):
        _assert_features_match(wrong[0].numpy(), nemo, cfg, name)


@pytest.mark.parametrize("index", range(len(CLIP_NAMES)), ids=CLIP_NAMES)
def test_encoder_matches_nemo(model, reference_arrays, index):
    """From NeMo's own features, so that the silent clip's ill-conditioned features (above) do not carry into it."""
    clip = reference_clip(CLIP_NAMES[index])
    features = _nemo_features(reference_arrays[f"clip{index}_features"], clip["samples"], model.cfg.features.hop_length)
    encoded, lengths = model.encoder_output(*features)  # (1, T', D), full attention as NeMo
    assert int(lengths[0]) == clip["encoder_frames"]
    nemo = reference_arrays[f"clip{index}_encoder"]  # (D, encoder_frames)
    ours = encoded[0, : clip["encoder_frames"]].float().cpu().numpy().T
    assert ours.shape == nemo.shape
    assert _relative_error(ours, nemo) < 1e-4
    assert np.abs(ours - nemo).max() < 1e-4 * np.abs(nemo).max()


@pytest.mark.parametrize("name", CLIP_NAMES)
def test_tokens_timestamps_and_text_match_nemo(model, name):
    clip = reference_clip(name)
    [transcript] = model.transcribe([CLIPS / name])
    assert transcript.error is None
    assert transcript.token_ids == clip["token_ids"]
    assert [t.frame for t in transcript.tokens] == clip["timestamps"]
    assert transcript.text == clip["text"]
    assert transcript.audio_seconds == pytest.approx(clip["samples"] / 16000)


def test_reference_batch_is_nemo_single(reference):
    """The fixture's own claim, so the batch tests below may compare with either."""
    assert reference["batch_token_ids"] == [clip["token_ids"] for clip in reference["clips"]]


def _orders():
    forward = list(range(len(CLIP_NAMES)))
    shuffled = forward[:]
    random.Random(1234).shuffle(shuffled)
    return {"forward": forward, "reversed": forward[::-1], "shuffled": shuffled}


@pytest.mark.parametrize("order_name", ["forward", "reversed", "shuffled"])
@pytest.mark.parametrize("batch_size", [2, 3, 6])
def test_padded_batches_give_nemo_tokens(model, reference, batch_size, order_name):
    """Padded batches in the given order (no sorting): every clip gets NeMo's ids and frames."""
    order = _orders()[order_name]
    audios = {i: _read(model, CLIP_NAMES[i]) for i in order}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        encoded, lengths = model.encode([audios[i] for i in chunk])
        assert lengths.tolist() == [reference["clips"][i]["encoder_frames"] for i in chunk]
        for i, hyp in zip(chunk, model.decode(encoded, lengths)):
            assert hyp.token_ids == reference["batch_token_ids"][i], CLIP_NAMES[i]
            assert hyp.frames == reference["clips"][i]["timestamps"], CLIP_NAMES[i]


@pytest.mark.parametrize("batch_size", [1, 4, 6])
def test_transcribe_batches_give_nemo_text(model, reference, batch_size):
    results = model.transcribe([CLIPS / name for name in CLIP_NAMES], batch_size=batch_size)
    assert [t.token_ids for t in results] == reference["batch_token_ids"]
    assert [t.text for t in results] == [clip["text"] for clip in reference["clips"]]
    assert [t.text for t in results] == reference["nemo_transcribe_text"]


def test_arrays_transcribe_like_paths(model, reference):
    arrays = [sf.read(CLIPS / name, dtype="float32")[0] for name in CLIP_NAMES]
    assert all(a.dtype == np.float32 and a.ndim == 1 for a in arrays)
    from_arrays = model.transcribe(arrays, batch_size=3)
    from_paths = model.transcribe([str(CLIPS / name) for name in CLIP_NAMES], batch_size=3)
    for a, p, clip in zip(from_arrays, from_paths, reference["clips"]):
        assert a.error is None and p.error is None
        assert a.token_ids == p.token_ids == clip["token_ids"]
        assert a.frames == p.frames == clip["timestamps"]
        assert a.text == p.text == clip["text"]


def test_token_times_are_frames_times_80_ms(model):
    clip = reference_clip(CLIP_NAMES[1])
    [transcript] = model.transcribe([CLIPS / clip["file"]])
    for token, frame in zip(transcript.tokens, clip["timestamps"]):
        assert token.start == pytest.approx(frame * 0.08)
        assert token.end >= token.start


OTHER_ORACLES = ["nemo-rnnt-tiny", "nemo-tdt-tiny-80mel"]  # more NeMo-made fixtures, where present


@pytest.mark.parametrize("oracle", OTHER_ORACLES)
def test_other_nemo_oracles(oracle):
    """Plain RNN-T and 80-mel TDT oracles: features, encoder, ids, frames and text, single and batched."""
    from graphscribe.api import load_model

    folder = CLIPS.parent.parent / oracle
    if not folder.is_dir():
        pytest.skip(f"{oracle} fixture not present")
    ref = json.loads((folder / "reference.json").read_text())
    arrays = np.load(folder / "reference.npz")
    model = load_model(folder / ref["checkpoint"], device="cpu", graphs=False)
    assert model.cfg.decoding.is_tdt == (ref["model_type"] == "tdt")
    audios = [model.read(CLIPS / clip["file"]) for clip in ref["clips"]]
    for i, (clip, audio) in enumerate(zip(ref["clips"], audios)):
        features, _ = model.features([audio])
        ours = features[0, :, : clip["feature_frames"]].numpy()
        _assert_features_match(ours, arrays[f"clip{i}_features"], model.cfg.features, clip["file"])
        nemo_features = _nemo_features(arrays[f"clip{i}_features"], clip["samples"], model.cfg.features.hop_length)
        encoded, lengths = model.encoder_output(*nemo_features)
        assert int(lengths[0]) == clip["encoder_frames"]
        ours = encoded[0, : clip["encoder_frames"]].float().numpy().T
        assert _relative_error(ours, arrays[f"clip{i}_encoder"]) < 1e-4, clip["file"]
    singles = [model.transcribe([CLIPS / clip["file"]])[0] for clip in ref["clips"]]
    assert [t.token_ids for t in singles] == [clip["token_ids"] for clip in ref["clips"]]
    assert [t.frames for t in singles] == [clip["timestamps"] for clip in ref["clips"]]
    assert [t.text for t in singles] == [clip["text"] for clip in ref["clips"]]
    encoded, lengths = model.encode(audios)  # all six in one padded batch, NeMo's order
    hyps = model.decode(encoded, lengths)
    assert [h.token_ids for h in hyps] == ref["batch_token_ids"]
    assert [h.frames for h in hyps] == ref["batch_timestamps"]


# ============================================================================ part 2: scripted joint
#
# Rules (NEMO_NOTES.md "Greedy TDT", NeMo's tdt_label_looping.py):
#   t = 0; token = argmax(token logits), d = durations[argmax(duration logits)];
#   blank: d == 0 becomes 1, t += d, prediction state unchanged;
#   token: emitted at frame t, prediction state updated, t += d (may be 0);
#   after max_symbols tokens on one frame with d == 0 the frame is forced on by one;
#   stop when t >= length. Plain RNN-T: blank d = 1, token d = 0.

VOCAB = 6  # token ids 0..5
BLANK = VOCAB  # blank id = vocab size (NeMo's convention)
POISON = 5  # what frames past a row's length say; it must never be emitted
TDT_DURATIONS = (0, 1, 2, 3, 4)
MAX_COUNT = 24  # table depth in tokens emitted


class _Prediction(PredictionNet):
    """Prediction net whose output carries the number of step() calls that were kept (its LSTM is unused)."""

    def __init__(self):
        super().__init__(PredictionConfig(vocab_size=VOCAB, hidden=2, layers=1))

    def step(self, tokens, h, c):
        h = torch.stack([h[..., 0] + 1, tokens.to(h.dtype).expand_as(h[..., 1])], dim=-1)  # (1, N, 2)
        return h[-1], h, c


class _Joint(Joint):
    """Joint with f = (frame, row, 0), g = (0, 0, tokens emitted) and logits = table[row, frame, emitted]."""

    def __init__(self, table: torch.Tensor, durations):
        super().__init__(
            JointConfig(encoder_hidden=3, pred_hidden=2, hidden=3, vocab_size=VOCAB, num_durations=len(durations))
        )
        self.table = table  # (R, T, MAX_COUNT, V + 1 + D)

    def project_encoder(self, encoded):
        return encoded

    def project_prediction(self, out):
        emitted = out[:, :1] - 1  # the start symbol is the first step
        return torch.cat([torch.zeros_like(out), emitted], dim=-1)

    def logits(self, f, g):
        x = (f + g).round().long()
        frame, row, emitted = x[..., 0], x[..., 1], x[..., 2].clamp(0, MAX_COUNT - 1)
        return self.table[row, frame.clamp(0, self.table.shape[1] - 1), emitted]


def _entry(token, duration, durations) -> torch.Tensor:
    logits = torch.zeros(VOCAB + 1 + len(durations))
    logits[BLANK if token == "B" else token] = 1.0
    if durations:
        logits[VOCAB + 1 + durations.index(duration)] = 1.0
    return logits


def _decode(rows: list[dict], durations, max_symbols: int, window: int):
    """rows: dicts with 'length', 'script' {(frame, emitted) or frame: (token | 'B', duration)} and
    optionally 'default' (what unscripted frames say; blank d1 if not given)."""
    frames = max(r["length"] for r in rows) + 2  # padding frames past every row
    table = torch.zeros(len(rows), frames, MAX_COUNT, VOCAB + 1 + len(durations))
    for r, row in enumerate(rows):
        for t in range(frames):
            for k in range(MAX_COUNT):
                if t >= row["length"]:
                    rule = (POISON, 0)
                else:
                    rule = row["script"].get((t, k), row["script"].get(t, row.get("default", ("B", 1))))
                table[r, t, k] = _entry(*rule, durations)
    encoded = torch.zeros(len(rows), frames, 3)  # (N, T, 3): frame index, row index, 0
    encoded[..., 0] = torch.arange(frames, dtype=torch.float32)
    encoded[..., 1] = torch.arange(len(rows), dtype=torch.float32)[:, None]
    lengths = torch.tensor([r["length"] for r in rows])
    decoder = GreedyDecoder(
        _Prediction(),
        _Joint(table, durations),
        DecodingConfig(durations=durations, max_symbols=max_symbols),
        graphs=False,
        window=window,
    )
    return [list(zip(h.token_ids, h.frames, h.durations)) for h in decoder.decode(encoded, lengths)]


# Each case: length, script, max_symbols, expected (token, frame, duration) worked out by hand.
TDT_CASES = {
    "blank_d0_advances_one_frame": dict(
        length=3,
        max_symbols=10,
        script={(0, 0): ("B", 0), (1, 0): (1, 1), (2, 1): (2, 0), (2, 2): ("B", 0)},
        # t0 blank d0 -> t1; emit 1@1 d1 -> t2; emit 2@2 d0 stays; blank d0 -> t3 end
        expected=[(1, 1, 1), (2, 2, 0)],
    ),
    "token_d0_stays": dict(
        length=2,
        max_symbols=10,
        script={(0, 0): (3, 0), (0, 1): (4, 0), (0, 2): (0, 1)},
        # three tokens on frame 0 (the last moves on by 1), then frame 1 blank d1 -> end
        expected=[(3, 0, 0), (4, 0, 0), (0, 0, 1)],
    ),
    "max_symbols_force_only_when_d0": dict(
        length=4,
        max_symbols=2,
        script={(0, 0): (1, 0), (0, 1): (2, 2), (2, 2): (3, 0)},
        # 1@0 d0 (run 1); 2@0 d2 (run 2, but d>0: t=2, no extra +1); 3@2 d0; blank -> 3; blank -> 4
        expected=[(1, 0, 0), (2, 0, 2), (3, 2, 0)],
    ),
    "token_on_last_frame_kept_past_end": dict(
        length=3,
        max_symbols=10,
        script={(0, 0): ("B", 2), (2, 0): (4, 4)},
        # blank d2 -> t2 (frame 1 skipped); 4@2 d4 -> t6 past the end: kept, row stops
        expected=[(4, 2, 4)],
    ),
    "token_jump_past_end_stops_row": dict(
        length=3,
        max_symbols=10,
        script={(0, 0): (1, 3), 1: (2, 1), 2: (2, 1)},
        # 1@0 d3 -> t3 = length: frames 1 and 2 are never looked at
        expected=[(1, 0, 3)],
    ),
    "blank_jump_past_end_stops_row": dict(
        length=3, max_symbols=10, script={(0, 0): ("B", 4), 1: (2, 1), 2: (2, 1)}, expected=[]
    ),
    "blanks_skip_frames": dict(
        length=6,
        max_symbols=10,
        script={(0, 0): ("B", 3), 1: (2, 1), 2: (2, 1), (3, 0): (3, 1), (4, 1): ("B", 2), 5: (4, 1)},
        # blank d3 -> t3; 3@3 d1 -> t4; blank d2 -> t6 end (frames 1, 2, 5 skipped)
        expected=[(3, 3, 1)],
    ),
    "long_blank_chain": dict(
        length=12,
        max_symbols=10,
        script={(10, 0): (2, 1)},
        # blanks d1 over frames 0..9, 2@10 d1, blank on 11 -> end
        expected=[(2, 10, 1)],
    ),
    "empty_row": dict(length=0, max_symbols=10, script={}, expected=[]),
    "single_frame_row": dict(
        length=1, max_symbols=10, script={(0, 0): (1, 0), (0, 1): (2, 1)}, expected=[(1, 0, 0), (2, 0, 1)]
    ),
}


def _max_symbols_case(m: int) -> dict:
    # frame 0 says "1, d0" and frame 1 says "2, d0" forever: m tokens each, then forced on.
    expected = [(1, 0, 0)] * m + [(2, 1, 0)] * m
    return dict(length=2, max_symbols=m, script={0: (1, 0), 1: (2, 0)}, expected=expected)


for _m in (1, 2, 3):
    TDT_CASES[f"max_symbols_{_m}"] = _max_symbols_case(_m)

WINDOWS = [1, 2, 3, 8]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("case", sorted(TDT_CASES))
def test_tdt_rules_single_row(case, window):
    spec = TDT_CASES[case]
    [result] = _decode([spec], TDT_DURATIONS, spec["max_symbols"], window)
    assert result == spec["expected"]


@pytest.mark.parametrize("window", [1, 8])
def test_rows_emitting_more_tokens_than_frames(window):
    """Every frame says "1, d0": max_symbols tokens a frame, more than the buffers' first token slots (one a frame)."""
    frames, m = 80, 10
    spec = dict(length=frames, script={t: (1, 0) for t in range(frames)})
    short = dict(length=3, script={(1, 0): (2, 1)})  # a second row that is done early
    result = _decode([spec, short], TDT_DURATIONS, m, window)
    assert result == [[(1, t, 0) for t in range(frames) for _ in range(m)], [(2, 1, 1)]]


def test_tdt_durations_are_looked_up_not_indexed():
    """d = durations[argmax]: with durations (0, 2, 3) the second duration logit means 2 frames."""
    durations = (0, 2, 3)
    spec = dict(length=6, default=("B", 2), script={(2, 0): (1, 3), (5, 1): (2, 2)})
    # blank d2 -> t2; 1@2 d3 -> t5; 2@5 d2 -> end
    for window in WINDOWS:
        [result] = _decode([dict(spec)], durations, 10, window)
        assert result == [(1, 2, 3), (2, 5, 2)]


@pytest.mark.parametrize("window", WINDOWS)
def test_tdt_rows_of_different_lengths_in_one_batch(window):
    names = [
        "long_blank_chain",
        "token_on_last_frame_kept_past_end",
        "empty_row",
        "max_symbols_2",
        "blanks_skip_frames",
        "single_frame_row",
        "token_d0_stays",
    ]
    groups = {}
    for name in names:
        groups.setdefault(TDT_CASES[name]["max_symbols"], []).append(name)
    for max_symbols, group in groups.items():
        rows = [TDT_CASES[name] for name in group]
        batched = _decode(rows, TDT_DURATIONS, max_symbols, window)
        assert batched == [row["expected"] for row in rows]
        assert batched == [_decode([row], TDT_DURATIONS, max_symbols, window)[0] for row in rows]


RNNT_CASES = {
    "tokens_stay_blank_moves_on_max_symbols": dict(
        length=3,
        max_symbols=3,
        script={(0, 0): 1, (0, 1): 2, (0, 2): "B", 1: 3, 2: "B"},
        # 1@0, 2@0, blank -> t1; 3@1 x3 (max_symbols) -> forced to t2; blank -> end
        expected=[(1, 0, 0), (2, 0, 0), (3, 1, 0), (3, 1, 0), (3, 1, 0)],
    ),
    "token_on_last_frame": dict(length=2, max_symbols=10, script={(1, 0): 4}, expected=[(4, 1, 0)]),
    "max_symbols_1": dict(
        length=3, max_symbols=1, script={0: 1, 1: 2, 2: 3}, expected=[(1, 0, 0), (2, 1, 0), (3, 2, 0)]
    ),
    "all_blank": dict(length=5, max_symbols=10, script={}, expected=[]),
}


def _rnnt_rows(names):
    return [
        dict(length=RNNT_CASES[n]["length"], script={k: (v, 0) for k, v in RNNT_CASES[n]["script"].items()})
        for n in names
    ]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("case", sorted(RNNT_CASES))
def test_rnnt_rules(case, window):
    spec = RNNT_CASES[case]
    [result] = _decode(_rnnt_rows([case]), (), spec["max_symbols"], window)
    assert result == spec["expected"]


@pytest.mark.parametrize("window", WINDOWS)
def test_rnnt_rows_of_different_lengths_in_one_batch(window):
    names = ["token_on_last_frame", "all_blank"]
    assert _decode(_rnnt_rows(names), (), 10, window) == [RNNT_CASES[n]["expected"] for n in names]
