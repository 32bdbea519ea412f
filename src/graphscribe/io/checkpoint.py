"""Reading `.nemo` checkpoints safely: a tar archive, an extracted folder, or a Hugging Face repo id.

Nothing is ever extracted: small members are read into memory, names with `..`, absolute
names and links are ignored, and the YAML is read with a safe loader.

The weights are memory-mapped where they lie in the file, not copied: `model_weights.ckpt` is
a `torch.save` zip whose tensor records are stored uncompressed, and an uncompressed tar keeps
a member's bytes in one piece. `torch.load(weights_only=True, map_location="meta")` reads only
the pickle and gives each tensor's record offset; each tensor is then a view of a private
(copy-on-write) map of the archive at that offset, checked against the zip's own record table.
A gzipped archive (or a member that is not such a zip) is read into memory instead, with one
warning. No cache, nothing written.
"""

from __future__ import annotations

import contextlib
import io
import logging
import mmap
import os
import pickle
import re
import struct
import sys
import tarfile
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import torch
import yaml

from graphscribe.io.config import DEMO_NAME, model_kind_problem

CONFIG_NAME = "model_config.yaml"
WEIGHTS_NAME = "model_weights.ckpt"
# org/name, @revision (a branch, tag or commit), :file.nemo (which file of the repo)
_HF_REFERENCE = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?(?::(?P<file>[\w.-]+))?$")
HUB_TIMEOUT = 5  # seconds per request to the Hugging Face hub before giving up
_ZIP_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., name length, extra length: 30 bytes
_ZIP_LOCAL_SIGNATURE = b"PK\x03\x04"
_UNSUPPORTED_GLOBAL = re.compile(
    r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)"
)  # torch names the refused object
MAX_CONFIG_BYTES = 4 << 20  # NeMo's model_config.yaml is < 100 KB; a bigger one is not a config
MAX_TOKENIZER_BYTES = 64 << 20  # SentencePiece models of 8192 pieces are < 1 MB
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's safe loader: 10x faster on 0.6b configs

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that cannot be read; the message names the file and the problem."""


@dataclass
class Checkpoint:
    source: str
    config: dict
    state_dict: dict[str, torch.Tensor]  # CPU tensors, memory-mapped from the file where it is uncompressed
    tokenizer_model: bytes  # SentencePiece model proto
    seconds: dict[str, float] = field(default_factory=dict)  # time per reading step: "config_tokenizer", "weights"


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
            self._tar, self._compressed = _open_tar(path)
        except (tarfile.TarError, OSError) as err:
            raise CheckpointError(f"{path}: not a .nemo checkpoint (not a readable tar archive: {err})") from None
        try:
            members = self._tar.getmembers()
        except (tarfile.TarError, OSError, EOFError) as err:
            self._tar.close()
            raise CheckpointError(f"{path}: not a .nemo checkpoint (not a readable tar archive: {err})") from None
        self._path = path
        self._members: dict[str, tarfile.TarInfo] = {}
        # NeMo reads the archive's top level: the shallowest member of a name wins (stable within a depth).
        for member in sorted(members, key=lambda m: (_safe_member_name(m.name) or "").count("/")):
            name = _safe_member_name(member.name)
            if name is None or not member.isfile():  # links, devices, folders, escaping names
                continue
            self._members.setdefault(PurePosixPath(name).name, member)

    def has(self, name: str) -> bool:
        return name in self._members

    def open(self, name: str):
        return self._tar.extractfile(self._members[name])

    def span(self, name: str) -> tuple[tuple[Path, int, int] | None, str]:
        """(file, offset, size) of a member's bytes in the file; None and why where they are not in one piece."""
        member = self._members[name]
        if self._compressed:
            return None, "the archive is compressed"
        if member.issparse():
            return None, "a sparse tar member"
        return (self._path, member.offset_data, member.size), ""

    def close(self) -> None:
        self._tar.close()


def _open_tar(path: Path) -> tuple[tarfile.TarFile, bool]:
    """The archive, and whether it is compressed (gzip, ...: then its members cannot be mapped). What is no archive
    at all raises the plain tar's one-line error, not the list of every compression tried."""
    try:
        return tarfile.open(path, mode="r:"), False
    except tarfile.ReadError as plain:
        try:
            return tarfile.open(path, mode="r:*"), True
        except tarfile.ReadError:
            raise plain from None


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

    def span(self, name: str) -> tuple[tuple[Path, int, int] | None, str]:
        file = self._file(name)
        return (file, 0, file.stat().st_size), ""

    def close(self) -> None:
        pass


def resolve_model_path(source: str) -> Path:
    """A local `.nemo` file or folder for `source`; `demo` is the bundled model.

    A Hugging Face reference `org/name[@revision][:file.nemo]` comes from the local Hugging Face
    cache without network, else from the hub (short timeouts, no retries; none with HF_HUB_OFFLINE=1).
    A source that looks like a path (`./`, `../`, `/`, `~`, a `.nemo` name, a first folder that exists
    here) and is not there is reported as missing, without asking the hub.
    """
    if source == DEMO_NAME:
        return demo_path()
    path = Path(os.path.expanduser(source))
    nemo_files = sorted(p.name for p in path.glob("*.nemo")) if path.is_dir() else []
    if nemo_files and not (path / CONFIG_NAME).exists():  # a folder of downloads, not an extracted checkpoint
        return path / _choose_nemo(source, nemo_files, path.name, f"{source.rstrip('/')}/")
    if path.exists():
        return path
    reference = _HF_REFERENCE.match(source)
    if reference is None or _looks_like_a_path(source, reference["repo"]):
        raise CheckpointError(f"{source}: no such file or folder")
    return _from_hub(source, reference["repo"], reference["revision"], reference["file"])


def _looks_like_a_path(source: str, repo: str) -> bool:
    first = source.split("/", 1)[0]
    return source.startswith(("./", "../", "/", "~")) or repo.endswith(".nemo") or Path(first).is_dir()


def _choose_nemo(source: str, names: list[str], preferred_stem: str, how: str) -> str:
    """The `.nemo` file of a repo or folder: the only one, or the one named after it; else one line listing them."""
    if not names:
        raise CheckpointError(f"{source}: the Hugging Face repo has no .nemo file")
    if len(names) == 1:
        return names[0]
    if f"{preferred_stem}.nemo" in names:
        return f"{preferred_stem}.nemo"
    raise CheckpointError(
        f"{source}: holds {len(names)} .nemo files ({', '.join(names)}): name one, e.g. {how}{names[0]}"
    )


def demo_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("graphscribe") / "data" / "demo.nemo"))


@contextlib.contextmanager
def _quiet_hub():
    """huggingface_hub's retry and connection warnings off: a failure ends in our one line."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _from_hub(source: str, repo_id: str, revision: str | None, filename: str | None) -> Path:
    try:
        from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
    except ImportError:  # pragma: no cover - a declared dependency
        raise CheckpointError(f"{source}: huggingface_hub is not installed; pass a .nemo file with --model") from None
    stem = repo_id.split("/")[1]
    with _quiet_hub():
        try:  # the cache first: no network at all
            if filename:
                return Path(hf_hub_download(repo_id, filename, revision=revision, local_files_only=True))
            folder = Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
            names = sorted(p.name for p in folder.glob("*.nemo"))
            if names:
                return folder / _choose_nemo(source, names, stem, f"{repo_id}:")
        except CheckpointError:
            raise
        except Exception:  # noqa: BLE001 - not in the cache (the hub's errors for that vary by version)
            pass
        if constants.is_offline_mode():
            raise CheckpointError(
                f"{source}: no such file or folder, and not in the Hugging Face cache (HF_HUB_OFFLINE is set); "
                "pass a downloaded .nemo file or an extracted checkpoint folder with --model"
            )
        try:
            # one request, no retries: an unreachable hub fails in seconds, not after huggingface_hub's backoff
            info = HfApi().model_info(repo_id, revision=revision, timeout=HUB_TIMEOUT)
            names = sorted(s.rfilename for s in info.siblings or [] if s.rfilename.endswith(".nemo"))
            if filename and filename not in names:
                raise CheckpointError(f"{source}: the Hugging Face repo has no file {filename}")
            chosen = filename or _choose_nemo(source, names, stem, f"{repo_id}:")
            return Path(hf_hub_download(repo_id, chosen, revision=info.sha or revision, etag_timeout=HUB_TIMEOUT))
        except CheckpointError:
            raise
        except Exception as err:  # noqa: BLE001 - network, auth and hub errors all end the same way for a user
            reason = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise CheckpointError(
                f"{source}: no such file or folder, and could not fetch it from Hugging Face ({reason}); "
                "pass a downloaded .nemo file or an extracted checkpoint folder with --model"
            ) from None


def read_checkpoint(source: str | os.PathLike) -> Checkpoint:
    """Read config, weights and tokenizer of a `.nemo` archive, folder or Hugging Face repo id."""
    start = time.perf_counter()
    path = resolve_model_path(str(source))
    members = _FolderMembers(path) if path.is_dir() else _TarMembers(path)
    try:
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not members.has(name):
                raise CheckpointError(f"{path}: not a .nemo checkpoint (no {name} inside)")
        config = _read_config(path, members)
        problem = model_kind_problem(config)  # before the tokenizer: a Canary model's is not where a Parakeet's is
        if problem is not None:
            raise CheckpointError(f"{path}: {problem}")
        tokenizer_model = _read_tokenizer(path, members, config)
        read = time.perf_counter()
        state_dict = _read_weights(path, members)
    finally:
        members.close()
    seconds = {"config_tokenizer": read - start, "weights": time.perf_counter() - read}
    return Checkpoint(
        source=str(path), config=config, state_dict=state_dict, tokenizer_model=tokenizer_model, seconds=seconds
    )


def read_nemo_archive(path: str | os.PathLike) -> tuple[dict, dict[str, torch.Tensor]]:
    """The config and the tensors of a `.nemo` tar that is no ASR model (NeMo's `save_to` of an NGPU-LM writes one),
    read as `read_checkpoint` reads a model's; CheckpointError (one line) for what is not such an archive."""
    path = Path(path)
    members = _TarMembers(path)
    try:
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not members.has(name):
                raise CheckpointError(f"{path}: not a .nemo archive (no {name} inside)")
        return _read_config(path, members), _read_weights(path, members)
    finally:
        members.close()


def _read_config(path: Path, members) -> dict:
    with members.open(CONFIG_NAME) as f:
        text = f.read(MAX_CONFIG_BYTES + 1)
    if len(text) > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{path}: {CONFIG_NAME} is larger than {MAX_CONFIG_BYTES >> 20} MB: not a NeMo config")
    try:
        # aliases stay shared objects here; config.resolve_interpolations bounds their expansion
        config = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as err:
        raise CheckpointError(f"{path}: {CONFIG_NAME} is not valid YAML ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: {CONFIG_NAME} is nested too deeply") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: {CONFIG_NAME} is not a mapping")
    return config


def _read_weights(path: Path, members) -> dict[str, torch.Tensor]:
    """The state dict: memory-mapped where the file allows it, else read into memory (with one warning why)."""
    span, reason = members.span(WEIGHTS_NAME)
    if span is not None:
        file, start, size = span
        if start + size > file.stat().st_size:
            raise CheckpointError(f"{path}: truncated: {WEIGHTS_NAME} runs past the end of the file")
        with members.open(WEIGHTS_NAME) as f:
            records, reason = _zip_records(f)
        if records is not None:
            index = _load_weights(path, members, "meta")  # names, shapes, dtypes, record offsets; no tensor data
            state, reason = _map_tensors(index, records, span)
            if state is not None:
                return state
    state = _load_weights(path, members, "cpu")
    log.warning(f"{path}: weights read into memory, not memory-mapped ({reason}): a slower start")
    return state


def _load_weights(path: Path, members, map_location: str) -> dict[str, torch.Tensor]:
    with members.open(WEIGHTS_NAME) as f, warnings.catch_warnings():
        data = f if f.seekable() else io.BytesIO(f.read())
        # a raw pickle (not torch.save's zip) of another protocol: torch warns in two lines before it fails or not;
        # our one line says what is wrong
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        try:
            state = torch.load(data, map_location=map_location, weights_only=True)
        except Exception as err:  # noqa: BLE001 - pickle/zip errors of many kinds: one message for the user
            raise CheckpointError(f"{path}: {WEIGHTS_NAME} cannot be read: {_weights_problem(err)}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: {WEIGHTS_NAME} is not a state dict of tensors")
    return state


def _weights_problem(err: Exception) -> str:
    """What is wrong with a weights file, without torch's advice to retry with weights_only=False (code could run)."""
    text = str(err)
    if isinstance(err, pickle.UnpicklingError):
        found = _UNSUPPORTED_GLOBAL.search(text)
        if found:
            return f"it holds {found.group(1)}, not only tensors (pickled code is never run)"
        return "it is corrupt or holds objects other than tensors (pickled code is never run)"
    first = text.splitlines()[0].split(". ")[0] if text else type(err).__name__  # torch appends hints after ". "
    return f"it is corrupt ({first})"


def _zip_records(f) -> tuple[dict[int, int] | None, str]:
    """Data offset -> size of every uncompressed record of a little-endian `torch.save` zip; else None and why."""
    try:
        with zipfile.ZipFile(f) as archive:
            records = {}
            for info in archive.infolist():
                f.seek(info.header_offset)
                signature, name_length, extra_length = _ZIP_LOCAL_HEADER.unpack(f.read(_ZIP_LOCAL_HEADER.size))
                if signature != _ZIP_LOCAL_SIGNATURE:
                    return None, f"bad zip header for {info.filename}"
                if info.compress_type != zipfile.ZIP_STORED:
                    return None, f"{info.filename} is compressed"
                records[info.header_offset + _ZIP_LOCAL_HEADER.size + name_length + extra_length] = info.file_size
                if info.filename.endswith("/byteorder") and (
                    info.file_size > 16 or archive.read(info).strip() != sys.byteorder.encode()
                ):
                    return None, "saved with the other byte order"
    except (zipfile.BadZipFile, struct.error, OSError, EOFError):
        return None, "not a zip archive: torch's format before 1.6"
    return records, ""


def _map_tensors(index: dict[str, torch.Tensor], records: dict[int, int], span: tuple[Path, int, int]):
    """Meta tensors -> views of a private map of the file, each inside its own uncompressed record."""
    file, start, size = span
    try:
        with open(file, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # copy-on-write: the file never changes
    except (OSError, ValueError, OverflowError) as err:  # a file system without mmap, a 32-bit address space
        return None, f"cannot map the file: {err}"
    state = {}
    for key, meta in index.items():
        storage = meta.untyped_storage()
        offset, nbytes = getattr(storage, "_checkpoint_offset", None), storage.nbytes()
        if offset is None or records.get(offset, -1) < nbytes or offset + nbytes > size or offset % meta.element_size():
            return None, f"{key}: no aligned record of {nbytes} bytes at offset {offset}"
        if nbytes == 0:
            state[key] = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=meta.dtype, offset=start + offset, count=nbytes // meta.element_size())
        state[key] = flat.as_strided(meta.shape, meta.stride(), meta.storage_offset())
    return state, ""


def _read_tokenizer(path: Path, members, config: dict) -> bytes:
    tokenizer = config.get("tokenizer") or {}
    reference = str(tokenizer.get("model_path") or "") if isinstance(tokenizer, dict) else ""
    if not reference:
        raise CheckpointError(f"{path}: the config names no tokenizer.model_path")
    name = reference.removeprefix("nemo:")
    name = PurePosixPath(name).name
    if not members.has(name):
        raise CheckpointError(f"{path}: tokenizer file {name} is missing from the checkpoint")
    with members.open(name) as f:
        data = f.read(MAX_TOKENIZER_BYTES + 1)
    if len(data) > MAX_TOKENIZER_BYTES:
        raise CheckpointError(f"{path}: tokenizer file {name} is larger than {MAX_TOKENIZER_BYTES >> 20} MB")
    return data
