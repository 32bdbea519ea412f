"""Reading `.nemo` checkpoints: safely, in every packaging, with errors that name the problem.

Each test repacks the NeMo fixture's own members (with tarfile) into the variant it needs.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import pytest
import torch
import yaml
from conftest import NEMO_PATH, SPEECH_CLIP

from graphscribe.api import load_model
from graphscribe.io.checkpoint import CheckpointError, read_checkpoint
from graphscribe.io.config import UnsupportedModelError


def _fixture_members() -> dict[str, bytes]:
    """Member name (as NeMo wrote it, e.g. './model_config.yaml') -> bytes."""
    with tarfile.open(NEMO_PATH) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


MEMBERS = _fixture_members()
CONFIG = "./model_config.yaml"
WEIGHTS = "./model_weights.ckpt"
TOKENIZER = next(name for name in MEMBERS if name.endswith("_tokenizer.model"))


def _pack(path, members: dict[str, bytes], extra: list[tarfile.TarInfo] = (), mode: str = "w"):
    """Write a tar at `path`: `extra` (links, evil names) first, then the members."""
    with tarfile.open(path, mode) as tar:
        for info in extra:
            tar.addfile(info, io.BytesIO(b"evil\n") if info.isfile() else None)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _with(**replace: bytes) -> dict[str, bytes]:
    members = dict(MEMBERS)
    for key, data in replace.items():
        members[{"config": CONFIG, "weights": WEIGHTS}[key]] = data
    return members


def _config() -> dict:
    return yaml.safe_load(MEMBERS[CONFIG])


def _state_dict() -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(MEMBERS[WEIGHTS]), weights_only=True)


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _loads_and_transcribes(path, speech_ids):
    model = load_model(path, device="cpu", graphs=False)
    [transcript] = model.transcribe([SPEECH_CLIP])
    assert transcript.error is None and transcript.token_ids == speech_ids


# ---------------------------------------------------------------------------- safe reading


def test_evil_members_are_ignored_and_nothing_is_written(tmp_path, monkeypatch, speech_ids):
    work = tmp_path / "work" / "deeper"  # the cwd while loading; '../evil.txt' would land in work/
    work.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    evil = []
    for name in ("../evil.txt", "../../evil.txt", str(outside / "abs_evil"), "/abs/evil", "./../model_config.yaml"):
        info = tarfile.TarInfo(name)
        info.size = 5
        evil.append(info)
    link = tarfile.TarInfo("evil_link")
    link.type, link.linkname = tarfile.SYMTYPE, str(outside / "linked")
    config_link = tarfile.TarInfo("./model_weights.ckpt")  # a link posing as the weights, before the real ones
    config_link.type, config_link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hard = tarfile.TarInfo("evil_hard")
    hard.type, hard.linkname = tarfile.LNKTYPE, "../evil.txt"
    checkpoint = _pack(tmp_path / "model.nemo", MEMBERS, evil + [link, config_link, hard])

    monkeypatch.chdir(work)
    before = _tree(tmp_path)
    _loads_and_transcribes(checkpoint, speech_ids)
    assert _tree(tmp_path) == before
    assert not os.path.exists("/abs/evil")


def test_nested_member_does_not_shadow_the_top_level_one(tmp_path, speech_ids):
    members = {"./backup/model_weights.ckpt": b"stale", "./backup/model_config.yaml": b"stale: true\n"}
    members.update(MEMBERS)  # the real files come after, at the top level where NeMo reads them
    _loads_and_transcribes(_pack(tmp_path / "model.nemo", members), speech_ids)


def test_gzipped_nemo_loads(tmp_path, speech_ids):
    _loads_and_transcribes(_pack(tmp_path / "model.nemo", MEMBERS, mode="w:gz"), speech_ids)


def test_extracted_folder_loads(tmp_path, speech_ids):
    folder = tmp_path / "extracted"
    with tarfile.open(NEMO_PATH) as tar:
        tar.extractall(folder, filter="data")
    _loads_and_transcribes(folder, speech_ids)


@pytest.mark.parametrize("missing", [CONFIG, WEIGHTS, TOKENIZER], ids=["config", "weights", "tokenizer"])
def test_missing_member_is_named(tmp_path, missing):
    members = {k: v for k, v in MEMBERS.items() if k != missing}
    path = _pack(tmp_path / "model.nemo", members)
    with pytest.raises(CheckpointError) as err:
        load_model(path, device="cpu")
    assert os.path.basename(missing) in str(err.value)
    assert "model.nemo" in str(err.value)


@pytest.mark.parametrize("missing", [CONFIG, TOKENIZER], ids=["config", "tokenizer"])
def test_missing_member_in_folder_is_named(tmp_path, missing):
    folder = tmp_path / "extracted"
    with tarfile.open(NEMO_PATH) as tar:
        tar.extractall(folder, filter="data")
    (folder / os.path.basename(missing)).unlink()
    with pytest.raises(CheckpointError, match=os.path.basename(missing)):
        load_model(folder, device="cpu")


def test_missing_weight_is_named(tmp_path):
    state = _state_dict()
    del state["joint.enc.weight"]
    path = _pack(tmp_path / "model.nemo", _with(weights=_saved(state)))
    with pytest.raises(CheckpointError, match=r"joint\.enc\.weight"):
        load_model(path, device="cpu")


def test_misshapen_weight_is_named(tmp_path):
    state = _state_dict()
    state["decoder.prediction.embed.weight"] = torch.zeros(7, 3)
    path = _pack(tmp_path / "model.nemo", _with(weights=_saved(state)))
    with pytest.raises(CheckpointError, match=r"decoder\.prediction\.embed\.weight"):
        load_model(path, device="cpu")


class _Payload:
    """Unpickling this would run os.makedirs(target): proof that code ran."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.makedirs, (str(self.target),))


@pytest.mark.parametrize("kind", ["reduce", "os_system"])
def test_pickled_code_is_refused_and_never_runs(tmp_path, kind):
    marker = tmp_path / "code_ran"
    payload = {"x": _Payload(marker)} if kind == "reduce" else {"x": os.system}
    path = _pack(tmp_path / "model.nemo", _with(weights=_saved(payload)))
    with pytest.raises(CheckpointError, match="model_weights.ckpt"):
        read_checkpoint(path)
    assert not marker.exists()


def test_weights_that_are_not_a_state_dict(tmp_path):
    path = _pack(tmp_path / "model.nemo", _with(weights=_saved([torch.zeros(3)])))
    with pytest.raises(CheckpointError, match="state dict"):
        read_checkpoint(path)


# ---------------------------------------------------------------------------- config switches


@pytest.mark.parametrize(
    "section,key,value,named",
    [
        ("encoder", "_target_", "nemo.collections.asr.modules.SqueezeformerEncoder", "SqueezeformerEncoder"),
        ("encoder", "self_attention_model", "abs_pos", "abs_pos"),
        ("preprocessor", "normalize", "all_features", "all_features"),
        ("encoder", "att_context_size", [70, 13], "att_context_size"),
        (
            "decoder",
            "_target_",
            "nemo.collections.asr.modules.StatelessTransducerDecoder",
            "StatelessTransducerDecoder",
        ),
    ],
    ids=["encoder_target", "abs_pos", "all_features", "limited_context", "stateless_decoder"],
)
def test_unsupported_switch_is_named(tmp_path, section, key, value, named):
    config = _config()
    config[section][key] = value
    path = _pack(tmp_path / "model.nemo", _with(config=yaml.safe_dump(config).encode()))
    with pytest.raises(UnsupportedModelError) as err:
        load_model(path, device="cpu")
    assert named in str(err.value)
    assert key in str(err.value) or named in str(err.value)


def test_interpolation_in_preprocessor_resolves(tmp_path, speech_ids):
    config = _config()
    config["preprocessor"]["sample_rate"] = "${model.sample_rate}"
    config["encoder"]["feat_in"] = "${preprocessor.features}"
    path = _pack(tmp_path / "model.nemo", _with(config=yaml.safe_dump(config).encode()))
    _loads_and_transcribes(path, speech_ids)
    assert load_model(path, device="cpu").sample_rate == 16000


def test_invalid_yaml_is_a_checkpoint_error(tmp_path):
    path = _pack(tmp_path / "model.nemo", _with(config=b"encoder: [unclosed\n  : : :"))
    with pytest.raises(CheckpointError, match="model_config.yaml"):
        read_checkpoint(path)


# ---------------------------------------------------------------------------- not a checkpoint


def test_garbage_nemo_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "garbage.nemo"
    path.write_bytes(os.urandom(1) + b"this is not a tar archive" * 100)
    with pytest.raises(CheckpointError, match="garbage.nemo"):
        load_model(path, device="cpu")


def test_missing_nemo_file_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        load_model(tmp_path / "nope.nemo", device="cpu")


def test_hugging_face_id_offline_says_to_pass_a_file(tmp_path):
    """Run in a fresh interpreter so HF_HUB_OFFLINE is read at import: no network access is tried."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
    code = (
        "from graphscribe.io.checkpoint import CheckpointError, read_checkpoint\n"
        "try:\n    read_checkpoint('nvidia/parakeet-tdt-0.6b-v2')\n"
        "except CheckpointError as err:\n    print('CheckpointError:', err)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    message = result.stdout.strip()
    assert message.startswith("CheckpointError: nvidia/parakeet-tdt-0.6b-v2")
    assert ".nemo file" in message and "--model" in message
    assert len(message.splitlines()) == 1


# ---------------------------------------------------------------------------- joint without dropout


def _without_joint_dropout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """NeMo's names for a joint trained with jointnet.dropout 0. RNNTJoint._joint_net_modules
    (nemo/collections/asr/modules/rnnt.py, lines 1753-1757 at NeMo 8cfedd7) builds
    `[activation] + ([Dropout(p=dropout)] if dropout else []) + [Linear(joint_hidden, num_classes)]`,
    so without dropout the output Linear is `joint_net.1`, not `joint_net.2`."""
    return {key.replace("joint.joint_net.2.", "joint.joint_net.1."): value for key, value in state.items()}


@pytest.mark.parametrize("dropout", [0, 0.0, None], ids=["zero", "zero_float", "null"])
def test_joint_trained_without_dropout_loads(tmp_path, speech_ids, dropout):
    config = _config()
    config["joint"]["jointnet"]["dropout"] = dropout
    weights = _saved(_without_joint_dropout(_state_dict()))
    path = _pack(tmp_path / "model.nemo", _with(config=yaml.safe_dump(config).encode(), weights=weights))
    _loads_and_transcribes(path, speech_ids)


def test_joint_dropout_missing_from_the_config_means_none(tmp_path, speech_ids):
    config = _config()
    del config["joint"]["jointnet"]["dropout"]  # NeMo: jointnet.get('dropout', 0.0)
    weights = _saved(_without_joint_dropout(_state_dict()))
    path = _pack(tmp_path / "model.nemo", _with(config=yaml.safe_dump(config).encode(), weights=weights))
    _loads_and_transcribes(path, speech_ids)


def test_joint_names_that_disagree_with_the_config_dropout_are_named(tmp_path):
    config = _config()
    config["joint"]["jointnet"]["dropout"] = 0
    path = _pack(tmp_path / "model.nemo", _with(config=yaml.safe_dump(config).encode()))  # keys still joint_net.2
    with pytest.raises(CheckpointError, match="joint.joint_net"):
        load_model(path, device="cpu")


def test_canary_checkpoint_is_named_before_its_tokenizer_is_looked_for(tmp_path):
    config = _config()
    config["target"] = "nemo.collections.asr.models.aed_multitask_models.EncDecMultiTaskModel"
    config["tokenizer"] = {"type": "agg", "langs": {"en": {"type": "bpe"}}}  # no model_path, as Canary's
    path = _pack(tmp_path / "canary-1b.nemo", _with(config=yaml.safe_dump(config).encode()))
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(path)
    assert str(err.value) == (
        f"{path}: a Canary (attention encoder-decoder) model (EncDecMultiTaskModel); "
        "graphscribe runs Parakeet transducers (TDT, RNN-T, hybrid TDT/RNN-T + CTC), full-context or cache-aware "
        "streaming, only"
    )


def test_hybrid_checkpoint_with_a_ctc_head_loads(tmp_path, speech_ids):
    config = _config()
    config["target"] = "nemo.collections.asr.models.hybrid_rnnt_ctc_bpe_models.EncDecHybridRNNTCTCBPEModel"
    state = _state_dict()
    # NeMo's hybrid model keeps its CTC head as `ctc_decoder` (ConvASRDecoder: decoder_layers.0 a Conv1d k=1)
    state["ctc_decoder.decoder_layers.0.weight"] = torch.zeros(129, 64, 1)
    state["ctc_decoder.decoder_layers.0.bias"] = torch.zeros(129)
    path = _pack(tmp_path / "model.nemo", _with(config=yaml.safe_dump(config).encode(), weights=_saved(state)))
    _loads_and_transcribes(path, speech_ids)
