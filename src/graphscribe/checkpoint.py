"""Reading `.nemo` checkpoints safely: a tar archive, an extracted folder, or a Hugging Face repo id.

Nothing is ever extracted to a path chosen by the archive: members are read into memory
(the weights are streamed to `torch.load(weights_only=True)`), names with `..`, absolute
names and links are ignored, and the YAML is read with `yaml.safe_load`.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
import yaml

DEMO_NAME = "demo"  # the small model shipped in the package (graphscribe/data/demo.nemo)
CONFIG_NAME = "model_config.yaml"
WEIGHTS_NAME = "model_weights.ckpt"
_HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message names the file and the problem."""


@dataclass
class Checkpoint:
    source: str
    config: dict
    state_dict: dict[str, torch.Tensor]
    tokenizer_model: bytes  # SentencePiece model proto


def _safe_member_name(name: str) -> str | None:
    """The member's name inside the archive, or None if it could escape a folder."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        return None
    parts = [p for p in path.parts if p not in (".", "")]
    return "/".join(parts) if parts else None


class _TarMembers:
    def __init__(self, path: Path):
        try:
            self._tar = tarfile.open(path, mode="r:*")
        except (tarfile.TarError, OSError) as err:
            raise CheckpointError(f"{path}: not a .nemo checkpoint (not a readable tar archive: {err})") from None
        self._path = path
        self._members: dict[str, tarfile.TarInfo] = {}
        # NeMo reads the archive's top level: the shallowest member of a name wins (stable within a depth).
        for member in sorted(self._tar.getmembers(), key=lambda m: (_safe_member_name(m.name) or "").count("/")):
            name = _safe_member_name(member.name)
            if name is None or not member.isfile():  # links, devices, folders, escaping names
                continue
            self._members.setdefault(PurePosixPath(name).name, member)

    def has(self, name: str) -> bool:
        return name in self._members

    def open(self, name: str):
        return self._tar.extractfile(self._members[name])

    def close(self) -> None:
        self._tar.close()


class _FolderMembers:
    def __init__(self, path: Path):
        self._root = path.resolve()

    def _file(self, name: str) -> Path | None:
        candidate = (self._root / name).resolve()
        if candidate.parent != self._root or candidate.is_symlink() or not candidate.is_file():
            return None
        return candidate

    def has(self, name: str) -> bool:
        return _safe_member_name(name) == name and self._file(name) is not None

    def open(self, name: str):
        return open(self._file(name), "rb")

    def close(self) -> None:
        pass


def resolve_model_path(source: str) -> Path:
    """A local `.nemo` file or folder for `source`; `demo` is the bundled model; Hugging Face ids go through its cache."""
    if source == DEMO_NAME:
        return demo_path()
    path = Path(os.path.expanduser(source))
    if path.exists():
        return path
    if not _HF_REPO_ID.match(source) or source.endswith(".nemo"):
        raise CheckpointError(f"{source}: no such file or folder")
    return _download_from_hub(source)


def demo_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("graphscribe") / "data" / "demo.nemo"))


def _download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import hf_hub_download, list_repo_files
        from huggingface_hub.errors import EntryNotFoundError, HFValidationError, LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - a declared dependency
        raise CheckpointError(f"{repo_id}: huggingface_hub is not installed; pass a .nemo file with --model") from None
    filename = f"{repo_id.split('/')[1]}.nemo"
    try:  # the cache first: works offline
        return Path(hf_hub_download(repo_id, filename, local_files_only=True))
    except (LocalEntryNotFoundError, EntryNotFoundError, HFValidationError, OSError):
        pass  # not cached (or under another name): ask the hub below
    try:
        names = [n for n in list_repo_files(repo_id) if n.endswith(".nemo")]
        if not names:
            raise CheckpointError(f"{repo_id}: the Hugging Face repo has no .nemo file")
        return Path(hf_hub_download(repo_id, filename if filename in names else names[0]))
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - network, auth, offline and hub errors all end the same way for a user
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CheckpointError(
            f"{repo_id}: could not fetch it from Hugging Face ({reason}); "
            "pass a downloaded .nemo file or an extracted checkpoint folder with --model"
        ) from None


def read_checkpoint(source: str | os.PathLike) -> Checkpoint:
    """Read config, weights and tokenizer of a `.nemo` archive, folder or Hugging Face repo id."""
    path = resolve_model_path(str(source))
    members = _FolderMembers(path) if path.is_dir() else _TarMembers(path)
    try:
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not members.has(name):
                raise CheckpointError(f"{path}: not a .nemo checkpoint (no {name} inside)")
        config = _read_config(path, members)
        state_dict = _read_weights(path, members)
        tokenizer_model = _read_tokenizer(path, members, config)
    finally:
        members.close()
    return Checkpoint(source=str(path), config=config, state_dict=state_dict, tokenizer_model=tokenizer_model)


def _read_config(path: Path, members) -> dict:
    with members.open(CONFIG_NAME) as f:
        try:
            config = yaml.safe_load(f.read())
        except yaml.YAMLError as err:
            raise CheckpointError(f"{path}: {CONFIG_NAME} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: {CONFIG_NAME} is not a mapping")
    return config


def _read_weights(path: Path, members) -> dict[str, torch.Tensor]:
    with members.open(WEIGHTS_NAME) as f:
        data = f if f.seekable() else io.BytesIO(f.read())
        try:
            state = torch.load(data, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - pickle/zip errors of many kinds: one message for the user
            raise CheckpointError(f"{path}: {WEIGHTS_NAME} cannot be loaded safely ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: {WEIGHTS_NAME} is not a state dict of tensors")
    return state


def _read_tokenizer(path: Path, members, config: dict) -> bytes:
    tokenizer = config.get("tokenizer") or {}
    reference = str(tokenizer.get("model_path") or "")
    if not reference:
        raise CheckpointError(f"{path}: the config names no tokenizer.model_path")
    name = reference.removeprefix("nemo:")
    name = PurePosixPath(name).name
    if not members.has(name):
        raise CheckpointError(f"{path}: tokenizer file {name} is missing from the checkpoint")
    with members.open(name) as f:
        return f.read()
