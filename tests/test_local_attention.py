"""Long recordings: NeMo's local attention, the attention switch, bounded-memory features and subsampling.

Expected tokens, frames and encoder outputs are NeMo 3.0.0's (fixtures/nemo-local-attention, see its
README for why not shared/fixtures/nemo-extras-*). The chunked features and subsampling are checked
against the one-pass computation, which the parity tests check against NeMo.
"""

from __future__ import annotations

import io
import json
import logging
import math
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import CLIPS, FIXTURES, NEMO_PATH
from test_cli import in_process

from graphscribe.api import load_model
from graphscribe.io.config import UnsupportedModelError, model_config_from_nemo
from graphscribe.model.encoder import Padding, _full_attention_nemo, full_attention, local_attention, memory_estimate
from graphscribe.runtime import loaded as model_module

LOCAL = FIXTURES / "nemo-local-attention"
REFERENCE = json.loads((LOCAL / "reference.json").read_text())
DEMO_PATH = Path(__file__).parent.parent / "src" / "graphscribe" / "data" / "demo.nemo"
CHECKPOINTS = {"tdt-tiny": NEMO_PATH, "demo": DEMO_PATH}
RUNS = [(name, run) for name, spec in REFERENCE["models"].items() for run in spec["runs"]]
RUN_IDS = [f"{name}-{run['att_context_size'][0]}-{run['att_context_size'][1]}" for name, run in RUNS]


def _relative_error(ours: np.ndarray, nemo: np.ndarray) -> float:
    return float(np.linalg.norm(ours - nemo) / max(np.linalg.norm(nemo), 1e-12))


@pytest.fixture(scope="module")
def reference_arrays() -> dict[str, np.ndarray]:
    with np.load(LOCAL / "reference.npz") as data:
        return {key: data[key] for key in data.files}


def _repacked(source: Path, target: Path, **encoder) -> Path:
    """`source` with its encoder config changed (a checkpoint that was trained that way, as far as the loader sees)."""
    with tarfile.open(source) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    name = next(n for n in members if n.endswith("model_config.yaml"))
    config = yaml.safe_load(members[name])
    config["encoder"].update(encoder)
    members[name] = yaml.safe_dump(config).encode()
    with tarfile.open(target, "w") as tar:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return target


@pytest.fixture(scope="module")
def local_checkpoints(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("local")
    return {
        run_id: _repacked(
            CHECKPOINTS[name],
            folder / f"{run_id}.nemo",
            self_attention_model="rel_pos_local_attn",
            att_context_size=run["att_context_size"],
        )
        for run_id, (name, run) in zip(RUN_IDS, RUNS)
    }


# ---------------------------------------------------------------------------- NeMo parity


@pytest.mark.parametrize("run_id", RUN_IDS)
def test_local_attention_checkpoint_matches_nemo(local_checkpoints, reference_arrays, run_id):
    """A checkpoint whose config says rel_pos_local_attn [L, R]: NeMo's encoder output, tokens and frames.

    Every window: encoder frames and output per clip, tokens of the padded batch (NeMo's batch and
    single results are the same). The first tdt-tiny window also decodes every clip alone.
    """
    name, run = RUNS[RUN_IDS.index(run_id)]
    model = load_model(local_checkpoints[run_id], device="cpu", graphs=False)  # attention="auto"
    assert model.cfg.encoder.local_context == tuple(run["att_context_size"])
    single = run is RUNS[0][1]
    audios = [model.read(FIXTURES / clip["file"]) for clip in run["clips"]]
    for i, (clip, audio) in enumerate(zip(run["clips"], audios)):
        encoded, lengths = model.encode([audio])
        assert int(lengths[0]) == clip["encoder_frames"]
        key = f"{name}_{run['att_context_size'][0]}_{run['att_context_size'][1]}_clip{i}"
        if key in reference_arrays:
            ours = encoded[0, : clip["encoder_frames"]].numpy().T
            assert _relative_error(ours, reference_arrays[key]) < 1e-4, clip["file"]
        if single:
            [hyp] = model.decode(encoded, lengths)
            assert hyp.token_ids == clip["token_ids"], clip["file"]
            assert hyp.frames == clip["timestamps"], clip["file"]
    # one padded batch (NeMo's batch gives its single results); the demo model's without its 62 s clip, which would
    # pad every row to it (the tdt-tiny runs batch it)
    rows = [i for i, c in enumerate(run["clips"]) if name != "demo" or c["encoder_frames"] < 200]
    encoded, lengths = model.encode([audios[i] for i in rows])
    hyps = model.decode(encoded, lengths)
    assert run["batch_token_ids"] == [c["token_ids"] for c in run["clips"]]
    assert run["batch_timestamps"] == [c["timestamps"] for c in run["clips"]]
    assert [h.token_ids for h in hyps] == [run["clips"][i]["token_ids"] for i in rows]
    assert [h.frames for h in hyps] == [run["clips"][i]["timestamps"] for i in rows]


def test_switching_a_full_attention_checkpoint_to_local_matches_nemo():
    """--attention local --attention-window W on the original checkpoint: NeMo's [W, W] numbers."""
    name, run = RUNS[0]
    window = run["att_context_size"][0]
    assert run["att_context_size"] == [window, window]
    model = load_model(CHECKPOINTS[name], device="cpu", graphs=False, attention="local", attention_window=window)
    results = model.transcribe([FIXTURES / clip["file"] for clip in run["clips"]], batch_size=len(run["clips"]))
    assert [t.token_ids for t in results] == run["batch_token_ids"]
    assert [t.frames for t in results] == run["batch_timestamps"]


def test_local_attention_is_not_full_attention():
    """The references are not full attention's: a window that hides frames changes the tokens."""
    name, run = RUNS[0]
    model = load_model(CHECKPOINTS[name], device="cpu", graphs=False, attention="full")
    clip = run["clips"][0]  # 7.4 s, 93 frames: most keys are outside a window of 8
    assert clip["encoder_frames"] > 4 * max(run["att_context_size"])
    [transcript] = model.transcribe([FIXTURES / clip["file"]])
    assert transcript.token_ids != clip["token_ids"]


# ---------------------------------------------------------------------------- attention functions


def _qkv(b=2, h=3, t=37, d_k=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_u, q_v, k, v = (torch.randn(b, h, t, d_k, generator=g).to(dtype) for _ in range(4))
    valid = torch.arange(t)[None, :] < torch.tensor([t, t - 11])[:, None]
    return q_u, q_v, k, v, valid


def test_full_attention_equals_nemos_formulation_in_groups(monkeypatch):
    """SDPA with the position bias, one group or a row at a time, against NeMo's matmul/rel_shift/softmax."""
    from graphscribe.model import encoder

    q_u, q_v, k, v, valid = _qkv()
    p = torch.randn(3, 2 * 37 - 1, 8)
    padding = Padding(valid, q_u.dtype)
    expected = _full_attention_nemo(q_u, q_v, k, v, p, padding)
    rows = valid[:, None, :, None]
    assert torch.allclose(full_attention(q_u, q_v, k, v, p, padding) * rows, expected * rows, atol=1e-5)
    monkeypatch.setattr(encoder, "_GROUP_BYTES", 1)  # one query row per group
    assert torch.allclose(full_attention(q_u, q_v, k, v, p, padding) * rows, expected * rows, atol=1e-5)


def _banded_reference(q_u, q_v, k, v, p, valid, left, right):
    """Local attention written out densely from NeMo's Longformer layout (diagonal column c = key offset c - w)."""
    b, h, t, d_k = q_u.shape
    w = max(left, right)
    bd = torch.matmul(q_v, p.transpose(-2, -1))  # (B, H, T, left + right + 1)
    scores = torch.full((b, h, t, t), -10000.0)
    for i in range(t):
        for c in range(2 * w + 1):
            j = i + c - w
            if not (0 <= j < t) or not (w - left <= c <= w + right):
                continue
            term = torch.einsum("bhd,bhd->bh", q_u[:, :, i], k[:, :, j])
            if c < left:
                term = term + bd[:, :, i, c]
            if c >= 2 * w - right:
                term = term + bd[:, :, i, left + c - (2 * w - right)]
            scores[:, :, i, j] = term / math.sqrt(d_k)
    scores = scores.masked_fill(~valid[:, None, None, :], -10000.0)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("window", [(4, 4), (2, 6), (7, 3), (0, 5), (40, 40)], ids=str)
def test_local_attention_follows_nemos_diagonals(monkeypatch, window):
    from graphscribe.model import encoder

    q_u, q_v, k, v, valid = _qkv()
    p = torch.randn(3, sum(window) + 1, 8)
    expected = _banded_reference(q_u, q_v, k, v, p, valid, *window)
    rows = valid[:, None, :, None]
    assert torch.allclose(local_attention(q_u, q_v, k, v, p, valid, window) * rows, expected * rows, atol=1e-5)
    monkeypatch.setattr(encoder, "_GROUP_BYTES", 1)  # one block per group
    assert torch.allclose(local_attention(q_u, q_v, k, v, p, valid, window) * rows, expected * rows, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kind", ["full", "local"])
def test_half_precision_attention(dtype, kind):
    """bfloat16 / float16: the bias is made in the queries' dtype (SDPA requires it), results near float32's."""
    q_u, q_v, k, v, valid = _qkv()
    p = torch.randn(3, 2 * 37 - 1 if kind == "full" else 9, 8)
    if kind == "full":
        run = lambda *a: full_attention(*a[:-1], Padding(a[-1], a[0].dtype))  # noqa: E731
    else:
        run = lambda *a: local_attention(*a, (4, 4))  # noqa: E731
    exact = run(q_u, q_v, k, v, p, valid)
    half = run(q_u.to(dtype), q_v.to(dtype), k.to(dtype), v.to(dtype), p.to(dtype), valid)
    assert half.dtype == dtype
    rows = valid[:, None, :, None]
    assert torch.allclose(half.float() * rows, exact * rows, atol=0.1)


def test_padded_query_rows_are_zero_before_the_output_projection(model):
    """NeMo zeroes the attention probabilities of padded queries: their rows come out as linear_out(0)."""
    attn = model.module.encoder.layers[0].self_attn
    x = torch.randn(2, 20, 64)
    valid = torch.arange(20)[None, :] < torch.tensor([20, 13])[:, None]
    from graphscribe.model.encoder import Padding, relative_positions, window_positions

    with torch.no_grad():
        for window, pos in (
            (None, relative_positions(20, 64, x.device, x.dtype)),
            ((3, 3), window_positions((3, 3), 64, x.device, x.dtype)),
        ):
            out = attn(x, pos, Padding(valid, x.dtype), window)
            assert torch.allclose(out[1, 13:], attn.linear_out(torch.zeros(64)).expand(7, 64))


def test_half_precision_model_runs_local_and_full():
    model = load_model(NEMO_PATH, device="cpu", graphs=False, dtype="bfloat16")
    audio = model.read(CLIPS / "librispeech_2086-149220-0033.wav")
    for attention in ("full", "local"):
        model.options = replace(model.options, attention=attention, attention_window=8)
        encoded, lengths = model.encode([audio])
        assert encoded.dtype == torch.bfloat16 and torch.isfinite(encoded.float()).all()


# ---------------------------------------------------------------------------- bounded memory, same numbers


def test_chunked_subsampling_is_the_same(model):
    audios = [
        model.read(CLIPS / name) for name in ("librispeech_2086-149220-0033.wav", "short_2s.wav", "quarter_second.wav")
    ]
    features, lengths = model.features(audios)
    features = features[:, :, :-3]  # an odd length that is no multiple of the subsampling factor
    pre_encode = model.module.encoder.pre_encode
    with torch.no_grad():
        whole, whole_lengths = pre_encode(features.transpose(1, 2), lengths.clamp(max=features.shape[2]))
        for chunk in (1, 2, 7, 30):
            chunked, chunked_lengths = pre_encode(features.transpose(1, 2), lengths.clamp(max=features.shape[2]), chunk)
            assert torch.equal(chunked_lengths, whole_lengths)
            assert torch.allclose(chunked, whole, atol=1e-5, rtol=1e-5), chunk


def _two_clips(model) -> tuple[torch.Tensor, torch.Tensor]:
    """7.4 s and 2 s of speech as a zero-padded (2, L) batch and its (2,) lengths."""
    audios = [model.read(CLIPS / name) for name in ("librispeech_2086-149220-0033.wav", "short_2s.wav")]
    lengths = torch.tensor([a.numel() for a in audios])
    batch = torch.zeros(2, int(lengths.max()))
    for i, a in enumerate(audios):
        batch[i, : a.numel()] = a
    return batch, lengths


def test_chunked_features_are_the_same(model):
    batch, lengths = _two_clips(model)
    featurizer = model.module.preprocessor.featurizer
    whole, frames = featurizer(batch, lengths)
    for chunk in (1, 50, 333):
        chunked, chunked_frames = featurizer(batch, lengths, chunk)
        assert torch.equal(chunked_frames, frames)
        assert torch.allclose(chunked, whole, atol=1e-5), chunk


def test_fixed_shape_stretches_are_the_same(model):
    """CUDA's STFT stretches of fixed sizes (the last one computed past the end of the batch and cut) give the
    features of one pass: same frames, same values to float32 rounding, padding frames still 0."""
    batch, lengths = _two_clips(model)
    featurizer = model.module.preprocessor.featurizer
    whole, frames = featurizer(batch, lengths, fixed_shapes=False)
    assert whole.shape[-1] > 512  # more than one stretch, the last one cut
    for chunk in (None, 100, 333):
        fixed, fixed_frames = featurizer(batch, lengths, chunk, fixed_shapes=True)
        assert torch.equal(fixed_frames, frames)
        assert fixed.shape == whole.shape
        assert torch.allclose(fixed, whole, atol=1e-5), chunk
        assert not fixed[1, :, int(frames[1]) :].any()


@pytest.fixture
def two_threads():
    """torch's default of more than one intra-op thread, which this test's bits are about (the suite runs with one,
    with which the CPU's float32 kernels round a clip alone and in a batch differently whatever the chunking)."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_chunks_are_sized_per_row_so_a_batch_does_not_change_a_clip(model, monkeypatch, two_threads):
    """Chunked and one-pass products round differently in float32, so the chunking of a clip must not depend on
    its batch: memory budgets that one clip fits in but 32 do not leave the clip's bits as they are alone."""
    import graphscribe.model.encoder as encoder_module
    import graphscribe.model.features as features_module
    import graphscribe.model.subsampling as subsampling_module

    audio = model.read(CLIPS / "librispeech_2086-149220-0033.wav")
    enc = model.cfg.encoder
    frames = audio.numel() // model.cfg.features.hop_length + 1
    t = -(-frames // enc.subsampling_factor) + 1
    per_frame = subsampling_module.conv_bytes_per_frame(
        1, enc.subsampling_channels, enc.subsampling_factor, enc.n_mels, 4
    )
    monkeypatch.setattr(features_module, "CHUNK_SAMPLES", 2 * audio.numel())
    monkeypatch.setattr(subsampling_module, "CONV_BYTES", 2 * t * per_frame)
    monkeypatch.setattr(encoder_module, "_GROUP_BYTES", 2 * enc.n_heads * encoder_module._aligned(t) * t * 4)
    alone, _ = model.encode([audio])
    batched, _ = model.encode([audio] * 32)
    assert torch.equal(batched[17], alone[0])


# ---------------------------------------------------------------------------- the switch


def test_auto_switches_long_inputs_with_one_note(model, monkeypatch, caplog):
    audio = 16000 * 90  # samples
    assert model.attention_for([audio], ["a.wav"]) is None  # 90 s: full attention
    monkeypatch.setattr(model_module, "FULL_ATTENTION_MAX_SECONDS", 60)
    with caplog.at_level(logging.WARNING, logger="graphscribe"):
        assert model.attention_for([audio], ["a.wav"]) == (256, 256)
    [note] = caplog.records
    assert "a.wav (1.5 min)" in note.getMessage() and "local attention" in note.getMessage()


def test_auto_switches_when_full_attention_would_not_fit(model, monkeypatch, caplog):
    audio = 16000 * 30  # samples
    need = memory_estimate(model.cfg, 2, audio, 4, None)
    monkeypatch.setattr(model_module, "available_memory", lambda device: need)  # less the headroom: too little
    with caplog.at_level(logging.WARNING, logger="graphscribe"):
        assert model.attention_for([audio, audio], ["a.wav", "b.wav"]) == (256, 256)
    assert "a.wav" in caplog.text and "b.wav" in caplog.text and "GiB free" in caplog.text
    monkeypatch.setattr(model_module, "available_memory", lambda device: 2 * need)
    assert model.attention_for([audio, audio], ["a.wav", "b.wav"]) is None


def test_attention_options(tmp_path, caplog):
    local = _repacked(
        NEMO_PATH, tmp_path / "local.nemo", self_attention_model="rel_pos_local_attn", att_context_size=[6, 2]
    )
    audio = [16000 * 5]  # samples
    assert load_model(local, device="cpu").attention_for(audio) == (6, 2)  # its own window, whatever the option
    assert load_model(local, device="cpu", attention="local", attention_window=99).attention_for(audio) == (6, 2)
    with caplog.at_level(logging.WARNING, logger="graphscribe"):
        forced = load_model(local, device="cpu", attention="full")
    assert forced.attention_for(audio) is None and "trained with local attention" in caplog.text
    assert load_model(NEMO_PATH, device="cpu", attention="local", attention_window=40).attention_for(audio) == (40, 40)
    with pytest.raises(ValueError, match="--attention sparse"):
        load_model(NEMO_PATH, device="cpu", attention="sparse")
    with pytest.raises(ValueError, match="--attention-window 0"):
        load_model(NEMO_PATH, device="cpu", attention_window=0)


@pytest.mark.parametrize(
    "encoder,message",
    [
        ({"self_attention_model": "rel_pos_local_attn", "att_context_size": [-1, 64]}, "no unlimited side"),
        ({"self_attention_model": "rel_pos_local_attn", "att_context_size": [0, 0]}, "above 0"),
        ({"self_attention_model": "abs_pos"}, "abs_pos"),
        (
            {"self_attention_model": "rel_pos_local_attn", "att_context_size": [8, 8], "global_tokens": 2},
            "global_tokens",
        ),
        (
            {"self_attention_model": "rel_pos_local_attn", "att_context_size": [8, 8], "global_attn_separate": True},
            "global_attn_separate",
        ),
    ],
    ids=["unlimited_side", "zero", "abs_pos", "global_tokens", "global_attn_separate"],
)
def test_unsupported_local_attention_configs_are_named(encoder, message):
    with tarfile.open(NEMO_PATH) as tar:
        config = yaml.safe_load(tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith(".yaml"))))
    config["encoder"].update(encoder)
    with pytest.raises(UnsupportedModelError, match=message):
        model_config_from_nemo(config)


def test_multi_context_config_uses_the_first():
    with tarfile.open(NEMO_PATH) as tar:
        config = yaml.safe_load(tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith(".yaml"))))
    config["encoder"].update(self_attention_model="rel_pos_local_attn", att_context_size=[[16, 4], [16, 16]])
    assert model_config_from_nemo(config).encoder.local_context == (16, 4)


# ---------------------------------------------------------------------------- the memory estimate


def test_memory_estimate_grows_linearly_for_local_attention(model):
    minute = 16000 * 60
    local = [memory_estimate(model.cfg, 1, m * minute, 4, (256, 256)) for m in (30, 60, 120, 240)]
    steps = np.diff(local)
    assert (steps > 0).all() and steps[2] == pytest.approx(2 * steps[1], rel=0.05)
    assert memory_estimate(model.cfg, 8, 10 * minute, 4, None) > memory_estimate(model.cfg, 1, 10 * minute, 4, None)
    assert memory_estimate(model.cfg, 1, minute, 2, None) < memory_estimate(model.cfg, 1, minute, 4, None)


_PEAK = """
import sys, torch
from graphscribe.api import load_model
from graphscribe.model.encoder import memory_estimate

def status(key):  # kB in /proc/self/status
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024

model = load_model(sys.argv[1], device="cpu", graphs=False, attention=sys.argv[2], attention_window=64)
audio = torch.randn(int(sys.argv[3])) * 0.1
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the memory in use now
before = status("VmRSS:")
encoded, lengths = model.encode([audio])
with torch.inference_mode():
    model.module.joint.project_encoder(encoded)  # the decoder's input
window = None if sys.argv[2] == "full" else (64, 64)
print(status("VmHWM:") - before, memory_estimate(model.cfg, 1, audio.numel(), 4, window))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's peak-RSS reset")
@pytest.mark.parametrize("attention,minutes", [("full", 1.5), ("local", 2)])
def test_memory_estimate_bounds_the_measured_peak(attention, minutes):
    """The estimate is at least the peak host memory that encoding a few minutes takes (the demo model, CPU)."""
    result = subprocess.run(
        [sys.executable, "-c", _PEAK, str(DEMO_PATH), attention, str(int(16000 * 60 * minutes))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    measured, estimate = map(int, result.stdout.split())
    assert 0 < measured <= estimate


def test_long_audio_bench_runs_on_the_cpu(tmp_path):
    """scripts/long_audio_bench.py end to end at tiny sizes: both tables, OOM-free rows, JSON and markdown."""
    script = Path(__file__).parent.parent / "scripts" / "long_audio_bench.py"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "--model",
            str(NEMO_PATH),
            "--device",
            "cpu",
            "--minutes",
            "0.05,0.1",
            "--dtypes",
            "float32",
            "--batch-sizes",
            "1,2",
            "--clip-seconds",
            "2",
            "--reps",
            "1",
            "--window",
            "8",
            "--budget-seconds",
            "300",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "results.json").read_text())
    assert [(r["minutes"], r["attention"], r["status"]) for r in report["long_audio"]] == [
        (m, a, "ok") for m in (0.05, 0.1) for a in ("local", "auto", "full")
    ]
    assert all(not r["auto_switched"] for r in report["long_audio"])
    assert [r["batch"] for r in report["encoder"]] == [1, 2]
    assert all(r["status"] == "ok" and r["max_abs_diff"] < 1e-3 for r in report["encoder"])
    assert "| float32 | 0.1 | local | local [8, 8] |" in (tmp_path / "results.md").read_text()


def test_cli_attention_options(capsys):
    """`transcribe --attention local --attention-window 8`: NeMo's [8, 8] tokens; a bad value: one line, exit 2."""
    run = next(r for n, r in RUNS if n == "tdt-tiny" and r["att_context_size"] == [8, 8])
    clip = next(c for c in run["clips"] if c["file"].endswith("short_2s.wav"))
    path = FIXTURES / clip["file"]
    result = in_process(capsys, path, "--attention", "local", "--attention-window", "8", "-f", "json")
    assert result.returncode == 0, result.stderr
    tokens = json.loads(result.stdout)["tokens"]
    assert [t["id"] for t in tokens] == clip["token_ids"] and [t["frame"] for t in tokens] == clip["timestamps"]
    bad = in_process(capsys, path, "--attention", "sparse")
    assert bad.returncode == 2
    assert [line for line in bad.stderr.splitlines() if line.startswith("error:")] == [
        "error: --attention sparse: use auto, full or local"
    ]
