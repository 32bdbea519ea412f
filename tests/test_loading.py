"""Fast loading: weights memory-mapped from the archive, modules built on the meta device.

Every expected tensor comes from the archive itself, read the plain way: tarfile, then
`torch.load` of the member's bytes.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import tarfile
import zipfile

import pytest
import torch
from conftest import NEMO_PATH, SPEECH_CLIP

from graphscribe.api import load_model
from graphscribe.io.checkpoint import (
    WEIGHTS_NAME,
    CheckpointError,
    _load_weights,
    _map_tensors,
    _TarMembers,
    _zip_records,
    demo_path,
    read_checkpoint,
)

DEMO = demo_path()  # float16 weights: a conversion on every load


def _members(path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _pack(path, members: dict[str, bytes], mode: str = "w"):
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _weights_key(members: dict[str, bytes]) -> str:
    return next(name for name in members if name.endswith(WEIGHTS_NAME))


def _archive_state(path) -> dict[str, torch.Tensor]:
    """The reference: the weights member read by tarfile, loaded from its bytes."""
    members = _members(path)
    return torch.load(io.BytesIO(members[_weights_key(members)]), weights_only=True)


def _assert_same(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]):
    assert state.keys() == expected.keys()
    for key, tensor in expected.items():
        assert state[key].dtype == tensor.dtype and state[key].shape == tensor.shape, key
        assert torch.equal(state[key], tensor), key


def _mapped(state: dict[str, torch.Tensor], size: int) -> bool:
    """All tensors lie in one span of at most `size` bytes: views of one map, not separate allocations."""
    starts = [t.untyped_storage().data_ptr() for t in state.values() if t.numel()]
    ends = [t.untyped_storage().data_ptr() + t.untyped_storage().nbytes() for t in state.values() if t.numel()]
    return max(ends) - min(starts) <= size


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("source", [NEMO_PATH, DEMO], ids=["tdt-tiny", "demo"])
def test_weights_are_the_archives_and_memory_mapped(source, caplog):
    checkpoint = read_checkpoint(source)
    _assert_same(checkpoint.state_dict, _archive_state(source))
    members = _members(source)
    assert _mapped(checkpoint.state_dict, len(members[_weights_key(members)]))
    assert _warnings(caplog) == []


def test_the_map_is_private(tmp_path):
    path = _pack(tmp_path / "model.nemo", _members(NEMO_PATH))
    before = path.read_bytes()
    state = read_checkpoint(path).state_dict
    for tensor in state.values():
        if tensor.is_floating_point():
            tensor.fill_(123.0)
    assert path.read_bytes() == before
    _assert_same(read_checkpoint(path).state_dict, _archive_state(path))


def test_extracted_folder_is_memory_mapped(tmp_path, caplog):
    folder = tmp_path / "extracted"
    with tarfile.open(NEMO_PATH) as tar:
        tar.extractall(folder, filter="data")
    state = read_checkpoint(folder).state_dict
    _assert_same(state, _archive_state(NEMO_PATH))
    assert _mapped(state, (folder / WEIGHTS_NAME).stat().st_size)
    assert _warnings(caplog) == []


@pytest.mark.parametrize("variant", ["gzip", "deflated_records", "legacy_format"])
def test_unmappable_weights_are_read_with_one_warning(tmp_path, caplog, speech_ids, variant):
    members = _members(NEMO_PATH)
    key, expected = _weights_key(members), _archive_state(NEMO_PATH)
    if variant == "deflated_records":  # a valid torch zip whose records are compressed: torch reads it, no map can
        members[key] = _deflated(members[key])
    elif variant == "legacy_format":  # torch's format before 1.6, not a zip
        buffer = io.BytesIO()
        torch.save(expected, buffer, _use_new_zipfile_serialization=False)
        members[key] = buffer.getvalue()
    path = _pack(tmp_path / "model.nemo", members, mode="w:gz" if variant == "gzip" else "w")

    _assert_same(read_checkpoint(path).state_dict, expected)
    [warning] = _warnings(caplog)
    assert "model.nemo" in warning and "into memory" in warning
    model = load_model(path, device="cpu", graphs=False)
    assert model.transcribe([SPEECH_CLIP])[0].token_ids == speech_ids


def _deflated(data: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info))
    return out.getvalue()


def test_records_past_the_member_are_never_mapped():
    """The map covers the whole file: a tensor that would run past its member's end is refused."""
    members = _TarMembers(NEMO_PATH)
    try:
        index = _load_weights(NEMO_PATH, members, "meta")
        with members.open(WEIGHTS_NAME) as f:
            records, _ = _zip_records(f)
        (file, start, size), _ = members.span(WEIGHTS_NAME)
    finally:
        members.close()
    assert _map_tensors(index, records, (file, start, size))[0] is not None
    state, reason = _map_tensors(index, records, (file, start, size // 2))
    assert state is None and "no aligned record" in reason
    shifted = {offset + 4: length for offset, length in records.items()}  # records that are not where torch says
    assert _map_tensors(index, shifted, (file, start, size))[0] is None


def test_truncated_archive_is_named(tmp_path):
    data = _pack(tmp_path / "whole.nemo", _members(NEMO_PATH)).read_bytes()
    weights_end = data.rfind(b"PK\x05\x06")  # the weights zip's last bytes: its end-of-directory record
    path = tmp_path / "model.nemo"
    path.write_bytes(data[: weights_end - 1000])
    with pytest.raises(CheckpointError, match="model.nemo"):
        load_model(path, device="cpu")


def test_escaping_names_do_not_reach_the_map(tmp_path, speech_ids):
    """A member named ../model_weights.ckpt before the real one: ignored, the top-level one is mapped."""
    members = _members(NEMO_PATH)
    key = _weights_key(members)
    evil = {"../model_weights.ckpt": b"not a checkpoint", "/abs/model_weights.ckpt": b"not one either"}
    path = _pack(tmp_path / "model.nemo", {**evil, **members})
    _assert_same(read_checkpoint(path).state_dict, _archive_state(NEMO_PATH))
    assert len(members[key]) > 0
    model = load_model(path, device="cpu", graphs=False)
    assert model.transcribe([SPEECH_CLIP])[0].token_ids == speech_ids


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loaded_module_holds_the_archives_weights(dtype):
    """Encoder and joint in the model dtype, preprocessor and prediction net in float32; nothing left on meta."""
    model = load_model(DEMO, device="cpu", dtype=dtype, graphs=False)
    expected = _archive_state(DEMO)
    wanted = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    for key, tensor in model.module.state_dict().items():
        assert not tensor.is_meta, key
        part = key.split(".", 1)[0]
        if tensor.is_floating_point():
            assert tensor.dtype == (wanted if part in ("encoder", "joint") else torch.float32), key
        assert torch.equal(tensor, expected[key].to(tensor.dtype)), key
    assert set(model.load_seconds) >= {"config_tokenizer", "weights", "build", "place", "total"}


def test_float32_on_the_cpu_uses_the_map_itself():
    """No copy at all: the module's float32 tensors are the mapped ones."""
    checkpoint_size = len(_members(NEMO_PATH)[_weights_key(_members(NEMO_PATH))])
    model = load_model(NEMO_PATH, device="cpu", graphs=False)
    state = {k: v for k, v in model.module.state_dict().items() if k.split(".", 1)[0] in ("encoder", "joint")}
    assert _mapped(state, checkpoint_size)


@pytest.mark.parametrize("allow_tf32", [True, False])
def test_loading_leaves_cudnn_tf32_as_it_was(monkeypatch, allow_tf32):
    """The float32 encoder's no-TF32 rule is scoped to our own calls, not set for the whole process."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", allow_tf32)
    model = load_model(NEMO_PATH, device="cpu", graphs=False)
    model.transcribe([SPEECH_CLIP])
    assert torch.backends.cudnn.allow_tf32 is allow_tf32


@pytest.mark.parametrize("allow_tf32", [True, False])
def test_float32_on_cuda_runs_without_tf32_inside_our_calls_only(model, monkeypatch, allow_tf32):
    """A float32 model on CUDA (its device stood in for here) turns cuDNN's TF32 off while it runs, then back."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", allow_tf32)
    monkeypatch.setattr(model, "device", torch.device("cuda"))
    with model._float32_math():
        assert torch.backends.cudnn.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is allow_tf32
    monkeypatch.setattr(model, "dtype", torch.bfloat16)  # 16-bit: the process's setting stays
    with model._float32_math():
        assert torch.backends.cudnn.allow_tf32 is allow_tf32


def test_loading_imports_no_compiler():
    """Building on the meta device must not pull in torch._dynamo (1.5 s) through torch._refs."""
    code = (
        "import sys\nfrom graphscribe.api import load_model\n"
        f"load_model({str(DEMO)!r}, device='cpu', graphs=False)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TRITON_INTERPRET="0"),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_summary_line_reports_the_load_time_apart(tmp_path):
    clips = NEMO_PATH.parent / "clips"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphscribe.cli",
            str(clips / "short_2s.wav"),
            str(clips / "espeak_fox.wav"),
            "--model",
            str(NEMO_PATH),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    [summary] = [line for line in result.stderr.splitlines() if "transcribed" in line]
    assert summary.startswith("loaded in ") and " s; transcribed 2 of 2 files: " in summary


def test_run_options_and_keywords_over_them_load_alike():
    """One RunOptions carries how to run a model; keywords of its fields replace them; device and dtype come back
    resolved."""
    from graphscribe.io.options import RunOptions

    model = load_model(NEMO_PATH, RunOptions(device="cpu", batch_size=3, attention="local"), graphs=False)
    assert model.options == RunOptions(
        device="cpu", dtype="float32", graphs=False, batch_size=3, attention="local", attention_window=256
    )
    with pytest.raises(TypeError, match="'batch'"):
        load_model(NEMO_PATH, device="cpu", batch=3)
    with pytest.raises(TypeError, match="RunOptions"):
        load_model(NEMO_PATH, "cpu")
