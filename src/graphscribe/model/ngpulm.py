"""NeMo's binary NGPU-LM file: an `NGramGPULanguageModel` saved with NeMo's `save_to` (a `.nemo` tar of
model_config.yaml and model_weights.ckpt), read into the same tables as the ARPA file it was built from.

The file holds NeMo's built tables, so loading it skips the ARPA parse. Its tensors (`ngram_lm_batched.py`,
`NGramGPULanguageModel.__init__`): arcs `from_states`, `to_states`, `ilabels`, `arcs_weights` (num_arcs real ones,
then vocab_size of padding); states `backoff_to_states`, `backoff_weights`, `final_weights`, `start_end_arcs` (S, 2)
(each state's arcs are one run of the arc list), `state_order`. State ids are the ARPA reader's (`ngram.py` numbers
them as NeMo does), so only the arcs need sorting by from * V + token.

The file is untrusted: it is read as `io/checkpoint.py` reads a model (no extraction, tensors only, never
unpickled objects), and every index, shape and back-off chain is checked before a table is built from it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from graphscribe.io.checkpoint import CheckpointError, read_nemo_archive
from graphscribe.model.ngram import BOS, MAX_ORDER, START, ArpaError, Tables, TokenModel, read_arpa, resolve_finals

_ARC_TENSORS = ("from_states", "to_states", "ilabels", "arcs_weights")  # (num_arcs + vocab_size,)
_STATE_TENSORS = ("backoff_to_states", "backoff_weights", "final_weights", "state_order")  # (num_states,)
_FLOAT_TENSORS = {"arcs_weights", "backoff_weights", "final_weights"}
_TENSORS = {*_ARC_TENSORS, *_STATE_TENSORS, "start_end_arcs"}
_TAR_MAGIC_AT, _TAR_MAGIC = 257, b"ustar"  # POSIX and GNU tar headers (NeMo's tarfile writes PAX: ustar too)


def load_lm(path: str | os.PathLike, vocab_size: int, device: torch.device | str = "cpu") -> TokenModel:
    """A token-level LM file on `device`: NeMo's NGPU-LM `.nemo` or an ARPA file (`read_lm`). ArpaError (one line)
    for a malformed one."""
    return TokenModel(read_lm(path, vocab_size), device)


def read_lm(path: str | os.PathLike, vocab_size: int) -> Tables:
    """The tables of an LM file, by what the file is: a tar archive (or a `.nemo` name) is NeMo's NGPU-LM, anything
    else an ARPA file."""
    return read_ngpulm(path, vocab_size) if is_archive(path) else read_arpa(path, vocab_size)


def is_archive(path: str | os.PathLike) -> bool:
    """Whether `path` is a tar or named `.nemo` (a gzipped one too): what NeMo's `save_to` writes. A file that
    cannot be read is not one (the ARPA reader says why)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_TAR_MAGIC_AT + len(_TAR_MAGIC))
    except OSError:
        return False
    return Path(path).suffix == ".nemo" or head[_TAR_MAGIC_AT:] == _TAR_MAGIC


def read_ngpulm(path: str | os.PathLike, vocab_size: int) -> Tables:
    """The tables of NeMo's saved `NGramGPULanguageModel` over `vocab_size` tokens (the model's non-blank ones):
    equal to `read_arpa` of the ARPA file it was built from. ArpaError (one line) for what is not such a file."""
    try:
        config, tensors = read_nemo_archive(path)
    except CheckpointError as err:
        raise ArpaError(str(err)) from None
    return _Check(str(path), vocab_size).tables(config, tensors)


class _Check:
    """Checks NeMo's config and tensors, then builds the tables; each problem is one ArpaError naming the file."""

    def __init__(self, path: str, vocab_size: int):
        self.path, self.v = path, vocab_size

    def fail(self, problem: str) -> ArpaError:
        return ArpaError(f"{self.path}: {problem}")

    def tables(self, config: dict, tensors: dict[str, torch.Tensor]) -> Tables:
        num_states, num_arcs, max_order, start = self._config(config)
        missing, unexpected = sorted(_TENSORS - set(tensors)), sorted(set(tensors) - _TENSORS)
        if missing or unexpected:
            what = f"no tensor {missing[0]}" if missing else f"an unexpected tensor {unexpected[0]}"
            raise self.fail(f"model_weights.ckpt has {what}: not NeMo's NGPU-LM")
        a = {name: self._array(tensors[name], name, (num_arcs + self.v,))[:num_arcs] for name in _ARC_TENSORS}
        s = {name: self._array(tensors[name], name, (num_states,)) for name in _STATE_TENSORS}
        spans = self._array(tensors["start_end_arcs"], "start_end_arcs", (num_states, 2))
        for name, values, end in (
            ("from_states", a["from_states"], num_states),
            ("to_states", a["to_states"], num_states),
            ("ilabels", a["ilabels"], self.v),
            ("backoff_to_states", s["backoff_to_states"], num_states),
            ("start_end_arcs", spans, num_arcs + 1),
        ):
            self._in_range(name, values, end)
        key = a["from_states"] * self.v + a["ilabels"]
        sort = np.argsort(key, kind="stable")
        self._check_arcs(a["from_states"], key[sort], spans, num_states)
        order = max(max_order, 2)  # as read_arpa: <s> and the unigram states back off once
        backoff_to, backoff_weight = s["backoff_to_states"], s["backoff_weights"]
        self._check_chains(backoff_to, order)
        final = resolve_finals(s["final_weights"], backoff_to, backoff_weight)  # as NeMo's from_nemo does
        return Tables(self.v, order, key[sort], a["to_states"][sort], a["arcs_weights"][sort], backoff_to,
                      backoff_weight, final, start)  # fmt: skip

    def _config(self, config: dict) -> tuple[int, int, int, int]:
        """num_states, num_arcs, max_order and the start state of NeMo's NGramLMConfig, whose vocab_size must be the
        model's."""
        values = {}
        for name in ("vocab_size", "num_states", "num_arcs", "max_order"):
            value = config.get(name)
            if type(value) is not int or value < 1:
                raise self.fail(f"model_config.yaml has no {name} (a positive integer): not NeMo's NGPU-LM")
            values[name] = value
        if values["vocab_size"] != self.v:
            raise self.fail(
                f"an LM over {values['vocab_size']} tokens, the model has {self.v}: the LM is made for another "
                "vocabulary (scripts/build_lm.py makes one)"
            )
        if values["max_order"] > MAX_ORDER:
            raise self.fail(f"max_order {values['max_order']}: orders up to {MAX_ORDER} are read")
        separate_bos = config.get("separate_bos_state", True)
        if not isinstance(separate_bos, bool):
            raise self.fail(f"separate_bos_state {separate_bos!r} in model_config.yaml: true or false")
        start = BOS if separate_bos else START
        if values["num_states"] <= start:
            raise self.fail(f"{values['num_states']} state(s): no <s> state")
        return values["num_states"], values["num_arcs"], values["max_order"], start

    def _array(self, tensor: torch.Tensor, name: str, shape: tuple[int, ...]) -> np.ndarray:
        """The tensor as a NumPy array (float32 weights, int64 indices), its shape and dtype checked."""
        if tuple(tensor.shape) != shape:
            raise self.fail(f"{name} has shape {tuple(tensor.shape)}, the config's sizes give {shape}")
        floating = name in _FLOAT_TENSORS
        if tensor.dtype.is_floating_point != floating or tensor.dtype.is_complex or tensor.dtype == torch.bool:
            raise self.fail(f"{name} is {tensor.dtype}, not {'floating point' if floating else 'integer'}")
        array = tensor.to(torch.float32 if floating else torch.int64).numpy()
        if floating and not np.isfinite(array).all():
            raise self.fail(f"{name} holds numbers that are not finite")
        return array

    def _in_range(self, name: str, values: np.ndarray, end: int) -> None:
        if values.size and (values.min() < 0 or values.max() >= end):
            bad = values[(values < 0) | (values >= end)][0]
            raise self.fail(f"{name} holds {bad}, outside 0..{end - 1}")

    def _check_arcs(self, source: np.ndarray, sorted_key: np.ndarray, spans: np.ndarray, num_states: int) -> None:
        """Each state's arcs are the run start_end_arcs gives (what NeMo's advance reads), one per token at most, and
        the start state has one for every token (back-offs end there)."""
        first, end = spans[:, 0], spans[:, 1]
        index = np.arange(len(source))
        counts = np.bincount(source, minlength=num_states)
        if (end - first != counts).any() or (first[source] > index).any() or (end[source] <= index).any():
            raise self.fail("start_end_arcs does not match from_states (the arcs of a state are not one run)")
        if (np.diff(sorted_key) == 0).any():
            raise self.fail("a state has two arcs for one token")
        if counts[START] != self.v:
            raise self.fail(f"the start state has arcs for {counts[START]} of the {self.v} tokens, not all")

    def _check_chains(self, backoff_to: np.ndarray, order: int) -> None:
        """Every state's back-off chain reaches the start state within order - 1 steps (no cycles)."""
        if backoff_to[START] != START:
            raise self.fail(f"the start state backs off to state {backoff_to[START]}")
        current = np.arange(len(backoff_to))
        for _ in range(order - 1):
            current = backoff_to[current]
        if (current != START).any():
            state = int(np.flatnonzero(current != START)[0])
            raise self.fail(f"state {state}'s back-offs do not reach the start state in {order - 1} steps")
