"""The fused decode step (Triton kernels) against NeMo's tokens and against the PyTorch step.

Without CUDA the kernels run through Triton's CPU interpreter (conftest sets TRITON_INTERPRET),
slowly: its time is the programs launched, so these tests decode short clips or a clip's first frames
(`_encode`), in few steps; tests/test_gpu.py runs the same step compiled on a GPU.
Expected tokens and frames are NeMo's own (reference.json of each NeMo-made oracle).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import graphscribe as gs
from graphscribe.model.decoding import GreedyDecoder, decode_step, size_class

pytest.importorskip("triton")

FIXTURES = Path(__file__).parent / "fixtures"
CLIPS = FIXTURES / "nemo-tdt-tiny" / "clips"
SHORT = ["short_2s.wav", "quarter_second.wav", "noise_3s.wav"]  # a padded batch of 3 runs in the 4-row class
# noise_3s's first 3 frames: its 12 tokens there (10 of them on frame 1, up to max_symbols) in as many steps as
# quarter_second's 12; the whole clip (19 tokens, to frame 38) made the batch's decode 48 steps
SHORT_CUT = {"noise_3s.wav": 3}
# The oracle whose tokens come one a frame (max_symbols 3): in one round of steps a row reaches tokens that the
# prediction net's output after the first decides (silence_1s's 84 at frame 3), where tdt-tiny's runs of 10 tokens
# on a frame take 12 steps; for the size classes whose step is many programs (one row, 64 rows)
SPARSE = ("nemo-tdt-tiny-80mel", "tdt-tiny-80mel.nemo")


def _oracle(name: str, checkpoint: str):
    ref = {c["file"]: c for c in json.loads((FIXTURES / name / "reference.json").read_text())["clips"]}
    return gs.load_model(FIXTURES / name / checkpoint, device="cpu", graphs=False), ref


def _encode(model, names: list[str], cut: dict[str, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The clips' encoder output as one padded batch, a clip in `cut` to its first `cut[name]` frames (the encoder
    still sees the whole clip): fewer steps to decode, and NeMo's tokens before that frame to expect (`_nemo`)."""
    encoded, lengths = model.encode([model.read(CLIPS / f) for f in names])
    cut = cut or {}
    lengths = torch.tensor([min(int(n), cut.get(f, int(n))) for f, n in zip(names, lengths)], dtype=lengths.dtype)
    return encoded[:, : int(lengths.max())], lengths


def _nemo(ref: dict, names: list[str], cut: dict[str, int] | None = None) -> list[tuple[list[int], list[int]]]:
    """NeMo's (token ids, frames) of each clip, of a clip in `cut` those before frame `cut[name]`: greedy decoding
    reads the frames in order, so these are what it emits from the first `cut[name]` frames alone."""
    cut = cut or {}
    out = []
    for f in names:
        kept = [(i, t) for i, t in zip(ref[f]["token_ids"], ref[f]["timestamps"]) if t < cut.get(f, t + 1)]
        out.append(([i for i, _ in kept], [t for _, t in kept]))
    return out


def _decoder(model, fused: bool, window: int | None = None, predictions: bool = False) -> GreedyDecoder:
    return GreedyDecoder(
        model.module.decoder,
        model.module.joint,
        model.cfg.decoding,
        graphs=False,
        window=window,
        fused=fused,
        predictions=predictions,
    )


@pytest.mark.parametrize(
    "name,checkpoint,window,cut",
    [
        ("nemo-tdt-tiny", "tdt-tiny.nemo", None, SHORT_CUT),  # durations 0-4, max_symbols 10
        # plain RNN-T, one LSTM layer, xscaling and biases: short_2s's 10 tokens are all on frame 0, noise_3s's
        # first at frame 14 (the 80-mel oracle, max_symbols 3, is the tall-tile and one-row tests')
        ("nemo-rnnt-tiny", "rnnt-tiny.nemo", 3, {"short_2s.wav": 2, "noise_3s.wav": 15}),
    ],
)
def test_fused_step_gives_nemo_tokens_in_a_padded_batch(name, checkpoint, window, cut):
    model, ref = _oracle(name, checkpoint)
    encoded, lengths = _encode(model, SHORT, cut)
    decoder = _decoder(model, fused=True, window=window)
    hyps = decoder.decode(encoded, lengths)
    assert decoder.fused is not False and list(decoder._buffers) == [size_class(len(SHORT))] == [4]
    assert len(set(lengths.tolist())) == len(SHORT)  # padded: every row ends at another frame
    assert [(h.token_ids, h.frames) for h in hyps] == _nemo(ref, SHORT, cut)


def test_tall_tiles_give_nemo_tokens():
    """A batch of 64 rows runs in the 64-row tiles of `fused_step.TALL`: a weight tile read once for all its rows."""
    model, ref = _oracle(*SPARSE)
    names = ["silence_1s.wav", "short_2s.wav"] * 32
    # the interpreter runs every program in turn, 64 advance programs a step: the clips' first 4 frames, two tokens
    # each, in one round of steps
    cut = {"silence_1s.wav": 4, "short_2s.wav": 4}
    encoded, lengths = _encode(model, names, cut)
    decoder = _decoder(model, fused=True)
    hyps = decoder.decode(encoded, lengths)
    assert list(decoder._buffers) == [64] and decoder._fused_step.tiles_for(64).rows == 64
    assert [(h.token_ids, h.frames) for h in hyps] == _nemo(ref, names, cut)


def test_one_row_gives_nemo_tokens():
    """A clip alone is the one-row size class, whose prediction net runs on the CUDA cores ("fma" products)."""
    model, ref = _oracle(*SPARSE)
    decoder = _decoder(model, fused=True)
    # one round of steps each (one row's step is 77 programs): silence_1s's first 8 frames (3 tokens), then
    # quarter_second whole in the same buffers, restarted
    for name, cut in (("silence_1s.wav", {"silence_1s.wav": 8}), ("quarter_second.wav", None)):
        (hyp,) = decoder.decode(*_encode(model, [name], cut))
        assert [(hyp.token_ids, hyp.frames)] == _nemo(ref, [name], cut), name
    assert list(decoder._buffers) == [1] and decoder._fused_step.tiles_for(1).net == "fma"


@torch.inference_mode()
def test_fused_state_follows_the_pytorch_step():
    """Step by step from the same state: integer state identical, LSTM state and g within float32 rounding."""
    model, _ = _oracle("nemo-tdt-tiny", "tdt-tiny.nemo")
    encoded, lengths = model.encode([model.read(CLIPS / "librispeech_2086-149220-0033.wav")])
    buffers = {}
    for fused in (False, True):
        decoder = _decoder(model, fused=fused)
        step = decoder._step_fn(encoded.device, encoded.dtype)
        assert (step is decode_step) != fused
        buf = decoder._buffers_for(1, encoded.shape[1], encoded.device, encoded.dtype)
        buf.load(decoder.joint.project_encoder(encoded), lengths)
        buf.restart(decoder.start_state(1, encoded.device, encoded.dtype))
        if fused:
            step.start(buf)
        buffers[fused] = (decoder, step, buf)
    # max_symbols 2 (the 80mel oracle's is 3) for both steps: the clip's run of 10 tokens on frame 0 (and on frame 1)
    # is cut short, the row moved on, within the few steps the interpreter affords at one row (77 programs a step)
    for _ in range(4):
        states = []
        for decoder, step, buf in buffers.values():
            step(buf, decoder.prediction, decoder.joint, decoder.blank_id, 2)
            states.append(buf)
        ref, fused = states
        for name in ("t", "active", "count", "run", "last_frame", "row_steps", "records"):
            assert torch.equal(getattr(ref, name), getattr(fused, name)), name
        h, c = buffers[True][0]._fused_step.state(fused)  # the fused step alternates two state buffers
        for name, got in (("h", h), ("c", c), ("g", fused.g)):
            torch.testing.assert_close(got, getattr(ref, name), rtol=1e-5, atol=1e-5, msg=name)
    assert int(ref.count[0]) >= 3  # the steps above emitted tokens, so the LSTM path ran
    assert int(ref.t[0]) >= 2  # and twice max_symbols tokens on a frame moved the row on


FUSION = json.loads((FIXTURES / "nemo-fusion" / "reference.json").read_text())


def test_fused_step_with_an_lm_and_phrases_gives_nemos_tokens():
    """Shallow fusion in the fused kernels (the LM, then the boosting tree: two models added in order), a padded
    batch of the TDT model (the RNN-T's step differs only in the durations, which fusion leaves alone): NeMo's
    greedy_batch tokens with both fused (nemo-fusion), the PyTorch step's, and tokens other than the joint's alone
    (the fused choice really ran)."""
    from graphscribe.model.fusion import fusion_models

    name, folder = "tdt-tiny", "nemo-tdt-tiny"
    names, cut = ["quarter_second.wav", "noise_3s.wav"], {"noise_3s.wav": 3}  # 12 tokens each
    model, _ = _oracle(folder, f"{name}.nemo")
    runs = FUSION["models"][name]["runs"]
    expected = {f"{c}.wav": runs[f"lm{FUSION['lm_weight']}+boost{FUSION['boost']}"][c] for c in FUSION["clips"]}
    plain = {f"{c}.wav": runs["nofusion"][c] for c in FUSION["clips"]}
    fusion = fusion_models(
        str(FIXTURES.parent.parent / FUSION["lm"]), FUSION["lm_weight"], tuple(FUSION["phrases"]), FUSION["boost"],
        model.tokenizer, model.module.joint.num_token_logits - 1, torch.device("cpu"),
    )  # fmt: skip
    encoded, lengths = _encode(model, names, cut)
    got = {}
    for fused in (True, False):
        decoder = GreedyDecoder(
            model.module.decoder, model.module.joint, model.cfg.decoding, graphs=False, fused=fused, fusion=fusion
        )
        got[fused] = [(h.token_ids, h.frames) for h in decoder.decode(encoded, lengths)]
        assert (decoder._fused_step is not None) == fused and decoder.fused is fused
    assert got[True] == got[False] == _nemo(expected, names, cut)
    assert all(a != b for a, b in zip(got[True], _nemo(plain, names, cut)))


def test_token_slots_grow_in_the_middle_of_a_decode(monkeypatch):
    """Buffers as small as the input (one token slot a frame): these clips emit more tokens than frames. The
    prediction outputs kept for confidences (`keep_prediction`) grow with the slots and are the PyTorch step's."""
    import graphscribe.model.decoding

    monkeypatch.setattr(graphscribe.model.decoding, "frame_capacity", lambda frames: frames)
    model, ref = _oracle("nemo-tdt-tiny", "tdt-tiny.nemo")
    names = ["silence_1s.wav", "quarter_second.wav"]  # 1 frame (of 13), 10 tokens; 4 frames, 12 tokens
    cut = {"silence_1s.wav": 1}
    encoded, lengths = _encode(model, names, cut)
    decoder = _decoder(model, fused=True, predictions=True)
    hyps = decoder.decode(encoded, lengths)
    assert decoder._buffers[2].max_tokens > encoded.shape[1] + 1  # grown
    assert [(h.token_ids, h.frames) for h in hyps] == _nemo(ref, names, cut)
    monkeypatch.undo()  # the PyTorch step's buffers as large as usual: no growth there
    plain = _decoder(model, fused=False, predictions=True).decode(encoded, lengths)
    for fused, pytorch in zip(hyps, plain):
        assert fused.predictions.shape == (len(fused.token_ids), model.module.joint.cfg.hidden)
        torch.testing.assert_close(fused.predictions, pytorch.predictions, rtol=1e-5, atol=1e-5)


def test_tensor_core_path_float16():
    """16-bit weights take the tl.dot path; on this decisive oracle the tokens stay NeMo's."""
    from graphscribe.model.fused_step import FusedStep

    model, ref = _oracle("nemo-tdt-tiny", "tdt-tiny.nemo")
    encoded, lengths = _encode(model, SHORT, SHORT_CUT)
    decoder = _decoder(model, fused=True)
    decoder._fused_step = FusedStep(decoder.prediction, decoder.joint, torch.float16, model.cfg.decoding.durations)
    assert not decoder._fused_step.tiles.fp32
    hyps = decoder.decode(encoded, lengths)
    assert [(h.token_ids, h.frames) for h in hyps] == _nemo(ref, SHORT, SHORT_CUT)


def test_kernels_compile_for_hopper():
    """The interpreter does not apply all of Triton's compile-time rules: compile for sm_90 for real (no GPU needed)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("compile_kernels.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize(
    "n,expected", [(1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (100, 128), (128, 128), (129, 192), (200, 256)]
)
def test_size_classes(n, expected):
    assert size_class(n) == expected
