"""NeMo's binary NGPU-LM file as `--lm`: tests/fixtures/nemo-ngpulm/lm.nemo, the nemo-beam fixture's lm.arpa built and
saved by NeMo 3.0 itself (scripts/fixtures/make_nemo_ngpulm_fixture.py), reads into the ARPA file's tables, table for
table; decoding with it gives NeMo's tokens; a malformed file (built here from the fixture) gets one clear line.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from test_cli import _error_lines, in_process
from test_fusion import ARRAYS, LM, REFERENCE, V, _assert_advance

from graphscribe.model.ngpulm import is_archive, load_lm, read_lm, read_ngpulm
from graphscribe.model.ngram import ArpaError, Tables, read_arpa

ROOT = Path(__file__).resolve().parents[1]
NGPULM = ROOT / "tests/fixtures/nemo-ngpulm/lm.nemo"
TABLES = [name for name in Tables.__dataclass_fields__]


def _members() -> tuple[dict, dict[str, torch.Tensor]]:
    """The fixture's config and tensors, as NeMo saved them."""
    with tarfile.open(NGPULM) as tar:
        names = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
        config = yaml.safe_load(tar.extractfile(names["model_config.yaml"]).read())
        tensors = torch.load(io.BytesIO(tar.extractfile(names["model_weights.ckpt"]).read()), weights_only=True)
    return config, tensors


def _write(path: Path, config: dict | None, tensors: dict | None) -> Path:
    """A `.nemo` tar as NeMo's save_to writes one, of these members (None: left out)."""
    with tarfile.open(path, "w:") as tar:
        for name, data in (("model_config.yaml", config), ("model_weights.ckpt", tensors)):
            if data is None:
                continue
            buffer = io.BytesIO()
            if name.endswith(".yaml"):
                buffer.write(yaml.safe_dump(data).encode())
            else:
                torch.save(data, buffer)
            info = tarfile.TarInfo(f"./{name}")
            info.size = buffer.tell()
            buffer.seek(0)
            tar.addfile(info, buffer)
    return path


# ----------------------------------------------------------------------------- NeMo's file is the ARPA file


def test_the_nemo_file_reads_into_the_arpa_files_tables():
    """Same state ids, arcs, weights, back-offs, finals, start and order, bit for bit."""
    ours, arpa = read_ngpulm(NGPULM, V), read_arpa(LM, V)
    for name in TABLES:
        np.testing.assert_array_equal(getattr(ours, name), getattr(arpa, name), err_msg=name)
        assert np.asarray(getattr(ours, name)).dtype == np.asarray(getattr(arpa, name)).dtype, name


def test_a_states_arcs_in_another_order_read_the_same(tmp_path):
    """NeMo's advance reads a state's run of arcs in any order; the tables sort them (NeMo writes them sorted)."""
    config, tensors = _members()
    run = torch.arange(*tensors["start_end_arcs"][2].tolist())  # the arcs of a unigram's state
    assert len(run) > 1
    for name in ("from_states", "to_states", "ilabels", "arcs_weights"):
        tensors[name].data[run] = tensors[name].data[run.flip(0)].clone()
    shuffled, arpa = read_ngpulm(_write(tmp_path / "shuffled.nemo", config, tensors), V), read_arpa(LM, V)
    for name in TABLES:
        np.testing.assert_array_equal(getattr(shuffled, name), getattr(arpa, name), err_msg=name)


def test_its_advance_is_nemos_from_every_state():
    _assert_advance(load_lm(NGPULM, V), "tdt-tiny/lm_")
    assert ARRAYS["tdt-tiny/lm_scores"].shape[0] == len(read_ngpulm(NGPULM, V).backoff_to)


def test_the_reader_is_chosen_by_what_the_file_is(tmp_path):
    """A tar is NeMo's file whatever its name; a `.nemo` name that is no tar says so; the rest is ARPA."""
    renamed = shutil.copy(NGPULM, tmp_path / "lm.bin")
    assert is_archive(NGPULM) and is_archive(renamed) and not is_archive(LM)
    np.testing.assert_array_equal(read_lm(renamed, V).key, read_arpa(LM, V).key)
    np.testing.assert_array_equal(read_lm(LM, V).weight, read_arpa(LM, V).weight)
    assert not is_archive(tmp_path / "nope.arpa")
    with pytest.raises(ArpaError, match="cannot read the LM"):
        read_lm(tmp_path / "nope.arpa", V)


def test_cli_with_the_nemo_lm_gives_nemos_text(capsys):
    clip = ROOT / REFERENCE["clips"]["noise_3s"]
    done = in_process(capsys, clip, "-f", "json", "--lm", NGPULM, "--lm-weight", "0.5")
    assert done.returncode == 0, done.stderr
    expected = REFERENCE["models"]["tdt-tiny"]["runs"]["lm0.5"]["noise_3s"]["token_ids"]
    assert [t["id"] for t in json.loads(done.stdout)["tokens"]] == expected


# ----------------------------------------------------------------------------- errors


def _broken(case: str, tmp_path: Path) -> Path:
    config, tensors = _members()
    path = tmp_path / f"{case}.nemo"
    if case == "not_a_tar":
        path.write_text("\\data\\\nngram 1=3\n")
        return path
    if case == "no_weights":
        return _write(path, config, None)
    if case == "not_an_lm":
        return _write(path, {"encoder": {}}, tensors)
    if case == "config_vocab":
        config["vocab_size"] = 64  # the tensors stay sized for 128
    elif case == "tensor_sizes":
        config["num_arcs"] -= 5  # the tensors stay sized for 985 arcs
    elif case == "missing_tensor":
        del tensors["backoff_to_states"]
    elif case == "pickled_object":
        tensors["extra"] = Path("x")  # an object, not a tensor: weights_only refuses to build it
    elif case == "to_out_of_range":
        tensors["to_states"][7] = config["num_states"]
    elif case == "ilabel_out_of_range":
        tensors["ilabels"][300] = -1
    elif case == "backoff_cycle":
        tensors["backoff_to_states"][2] = 2
    elif case == "spans_mismatch":
        tensors["start_end_arcs"][[1, 2]] = tensors["start_end_arcs"][[2, 1]].clone()
    elif case == "duplicate_arc":
        tensors["ilabels"][129] = tensors["ilabels"][128]
    elif case == "not_finite":
        tensors["arcs_weights"].data[5] = float("nan")
    elif case == "float_indices":
        tensors["from_states"] = tensors["from_states"].float()
    return _write(path, config, tensors)


CASES = {
    "not_a_tar": "not a readable tar archive",
    "no_weights": "no model_weights.ckpt inside",
    "not_an_lm": "no vocab_size",
    "vocab": "another vocabulary",
    "config_vocab": "another vocabulary",
    "tensor_sizes": "from_states has shape (1113,), the config's sizes give (1108,)",
    "missing_tensor": "no tensor backoff_to_states",
    "pickled_object": "pickled code is never run",
    "to_out_of_range": "to_states holds",
    "ilabel_out_of_range": "ilabels holds -1, outside 0..127",
    "backoff_cycle": "state 2's back-offs do not reach the start state",
    "spans_mismatch": "start_end_arcs does not match from_states",
    "duplicate_arc": "two arcs for one token",
    "not_finite": "arcs_weights holds numbers that are not finite",
    "float_indices": "from_states is torch.float32, not integer",
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_nemo_lm_gets_one_clear_line(tmp_path, case):
    path, vocab = (NGPULM, 64) if case == "vocab" else (_broken(case, tmp_path), V)
    with pytest.raises(ArpaError) as err:
        read_lm(path, vocab)
    message = str(err.value)
    assert message.startswith(str(path)) and "\n" not in message and CASES[case] in message, message


def test_cli_bad_nemo_lm_is_one_line_exit_2(tmp_path, capsys):
    bad = _broken("backoff_cycle", tmp_path)
    done = in_process(capsys, ROOT / REFERENCE["clips"]["espeak_fox"], "--lm", bad)
    assert done.returncode == 2 and len(_error_lines(done.stderr)) == 1, done.stderr
    assert done.stdout == ""
