"""Hostile and broken checkpoints: every one ends in one line naming the file and the problem, exit 2 from the CLI.

Each archive repacks the NeMo fixture's own members with one part made bad.
"""

from __future__ import annotations

import copy
import os
import pickle
import resource
import subprocess
import sys
import time

import pytest
import yaml
from conftest import CLIPS
from test_checkpoint import MEMBERS, WEIGHTS, _config, _pack, _with

from graphscribe.io.checkpoint import MAX_CONFIG_BYTES, CheckpointError, read_checkpoint
from graphscribe.io.config import UnsupportedModelError, model_config_from_nemo

CLI_ADDRESS_SPACE = 5 << 30  # bytes: a normal CLI run on the fixture needs 3-4 GB of address space (torch's libraries)
CLIP = CLIPS / "quarter_second.wav"


def _cli(model, limit: int | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`transcribe --device cpu --model MODEL clip`, under an address-space limit where given."""

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {k: v for k, v in os.environ.items() if k != "GRAPHSCRIBE_MODEL"}
    command = [sys.executable, "-m", "graphscribe.cli", "--device", "cpu", "--model", str(model), str(CLIP)]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        preexec_fn=limit_memory if limit else None,
    )


def _assert_one_line_exit_2(result: subprocess.CompletedProcess, *named: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for text in named:
        assert text in lines[0], lines[0]
    return lines[0]


def _nemo_with_config(tmp_path, config_text: str, name: str = "model.nemo"):
    return _pack(tmp_path / name, _with(config=config_text.encode()))


# ---------------------------------------------------------------------------- config references


def _resolved_config(**replace) -> dict:
    config = copy.deepcopy(_config())
    for dotted, value in replace.items():
        *parents, key = dotted.split("__")
        node = config
        for part in parents:
            node = node[part]
        node[key] = value
    return config


@pytest.mark.parametrize(
    "replace,named",
    [
        ({"encoder__d_model": "${encoder.d_model}"}, "encoder.d_model"),
        (
            {
                "encoder__d_model": "${joint.jointnet.encoder_hidden}",
                "joint__jointnet__encoder_hidden": "${model.encoder.d_model}",
            },
            "encoder.d_model",
        ),
        ({"encoder__extra": {"x": "${encoder.extra}"}}, "encoder.extra"),
    ],
    ids=["self", "two_step_cycle", "section_containing_itself"],
)
def test_reference_cycle_is_named(replace, named):
    with pytest.raises(UnsupportedModelError, match="refers back to itself") as err:
        model_config_from_nemo(_resolved_config(**replace))
    assert named in str(err.value)


def test_long_reference_chain_is_refused():
    config = _resolved_config()
    config["chain"] = {f"k{i}": f"${{chain.k{i + 1}}}" for i in range(100)}
    config["chain"]["k100"] = 1
    with pytest.raises(UnsupportedModelError, match="chain.k0: references chained more than"):
        model_config_from_nemo(config)


def test_reference_cycle_through_the_cli(tmp_path):
    config = _config()
    config["encoder"]["n_layers"] = "${encoder.n_heads}"
    config["encoder"]["n_heads"] = "${encoder.n_layers}"
    result = _cli(_nemo_with_config(tmp_path, yaml.safe_dump(config)))
    _assert_one_line_exit_2(result, "model.nemo", "encoder.n_", "refers back to itself")


# ---------------------------------------------------------------------------- alias bombs and size


def _alias_bomb(levels: int = 9) -> str:
    """The "billion laughs": 9 levels of 9 aliases to the level below, 9**9 (387 M) strings once expanded."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for level in range(1, levels + 1):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_in_bounded_memory_and_time(tmp_path):
    config_text = yaml.safe_dump(_config()) + _alias_bomb()
    path = _nemo_with_config(tmp_path, config_text)
    start = time.perf_counter()
    normal = _cli(_pack(tmp_path / "good.nemo", MEMBERS), limit=CLI_ADDRESS_SPACE)
    normal_seconds = time.perf_counter() - start
    assert normal.returncode == 0, normal.stderr  # the limit leaves room for a normal load
    result = _cli(path, limit=CLI_ADDRESS_SPACE, timeout=normal_seconds + 20)
    _assert_one_line_exit_2(result, "model.nemo", "expands to more than")


def test_alias_bomb_in_the_api_is_an_unsupported_model_error():
    config = _config()
    config.update(yaml.safe_load(_alias_bomb()))  # shared lists, as PyYAML builds aliases: little memory
    with pytest.raises(UnsupportedModelError, match="expands to more than"):
        model_config_from_nemo(config)


def test_oversized_config_is_refused(tmp_path):
    config_text = yaml.safe_dump(_config()) + "padding: " + "x" * MAX_CONFIG_BYTES + "\n"
    with pytest.raises(CheckpointError, match="model_config.yaml is larger than"):
        read_checkpoint(_nemo_with_config(tmp_path, config_text))


def test_self_containing_yaml_is_refused():
    config = _config()
    config.update(yaml.safe_load("loop: &loop [1, *loop]"))  # a list that contains itself
    with pytest.raises(UnsupportedModelError, match="nested more than"):
        model_config_from_nemo(config)


# ---------------------------------------------------------------------------- corrupt weights


def _corrupt(kind: str) -> bytes:
    data = MEMBERS[WEIGHTS]
    if kind == "truncated":
        return data[: len(data) // 2]
    if kind == "zeroed":
        return data[:200] + bytes(len(data) - 400) + data[-200:]
    return b"\x80\x02}q\x00(X\x01\x00\x00\x00xq\x01cbuiltins\nnot_a_thing\n" + os.urandom(64)  # a broken pickle


@pytest.mark.parametrize("kind", ["truncated", "zeroed", "pickle"])
def test_corrupt_weights_give_our_message_without_weights_only_advice(tmp_path, kind):
    path = _pack(tmp_path / "model.nemo", _with(weights=_corrupt(kind)))
    with pytest.raises(CheckpointError) as err:
        read_checkpoint(path)
    message = str(err.value)
    assert message.startswith(f"{path}: model_weights.ckpt cannot be read: ")
    assert "weights_only" not in message and "\n" not in message


def test_corrupt_weights_through_the_cli(tmp_path):
    path = _pack(tmp_path / "model.nemo", _with(weights=_corrupt("truncated")))
    line = _assert_one_line_exit_2(_cli(path), "model.nemo", "model_weights.ckpt", "corrupt")
    assert "weights_only" not in line


def test_a_raw_pickle_as_weights_is_our_line_alone(tmp_path):
    """torch warned in two lines about the pickle's protocol before our line (issue 46)."""
    path = _pack(tmp_path / "model.nemo", _with(weights=pickle.dumps({"encoder.weight": [1.0]}, protocol=4)))
    _assert_one_line_exit_2(_cli(path), "model.nemo", "model_weights.ckpt cannot be read")


@pytest.mark.parametrize("content", [b"", b"root:x:0:0:root:/root:/bin/bash\n" * 40], ids=["empty", "passwd"])
def test_a_file_that_is_no_archive_is_one_line(tmp_path, content):
    """tarfile's error lists every compression it tried, a line each (issue 46): the plain tar's reason instead."""
    path = tmp_path / "model.nemo"
    path.write_bytes(content)
    line = _assert_one_line_exit_2(_cli(path), "model.nemo")
    reason = "empty file" if not content else "invalid header"
    assert line == f"error: {path}: not a .nemo checkpoint (not a readable tar archive: {reason})"


# ---------------------------------------------------------------------------- wrong types and absurd sizes


@pytest.mark.parametrize(
    "section,key,value,named",
    [
        ("encoder", "d_model", 10**9, "encoder.d_model=1000000000 is out of range"),
        ("encoder", "n_layers", 10**9, "encoder.n_layers=1000000000 is out of range"),
        ("encoder", "n_heads", 0, "encoder.n_heads=0 is out of range"),
        ("encoder", "ff_expansion_factor", -5, "encoder.ff_expansion_factor=-5 is out of range"),
        ("encoder", "conv_kernel_size", 8, "conv_kernel_size=8 is not odd"),
        ("encoder", "d_model", "wide", "encoder.d_model should be a number, got 'wide'"),
        ("encoder", "att_context_size", 5, "att_context_size=5 is not [left, right]"),
        ("preprocessor", "n_fft", -5, "preprocessor.n_fft=-5 is out of range"),
        ("preprocessor", "window_stride", 0, "the hop at least 1"),
        ("preprocessor", "window_size", 10**9, "the window must be 1..n_fft"),
        ("preprocessor", "window_size", [1, 2], "preprocessor.window_size should be a number"),
        ("decoder", "prednet", "lstm", "decoder.prednet should be a section, got str"),
        ("decoder", "vocab_size", 10**9, "decoder.vocab_size=1000000000 is out of range"),
        ("joint", "jointnet", [640], "joint.jointnet should be a section, got list"),
        ("decoding", "greedy", 3, "decoding.greedy should be a section, got int"),
    ],
)
def test_wrong_types_and_absurd_sizes_are_named(section, key, value, named):
    config = _config()
    config[section][key] = value
    with pytest.raises(UnsupportedModelError) as err:
        model_config_from_nemo(config)
    assert named in str(err.value)


@pytest.mark.parametrize("value", [[1, 2], "bpe"], ids=["list", "string"])
def test_tokenizer_section_of_the_wrong_type(tmp_path, value):
    config = _config()
    config["tokenizer"] = value
    with pytest.raises(CheckpointError, match="tokenizer"):
        read_checkpoint(_nemo_with_config(tmp_path, yaml.safe_dump(config)))
