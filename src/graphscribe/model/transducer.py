"""The transducer's modules and their weights: NeMo's EncDecRNNTBPEModel layout built on the meta device and
loaded strictly from a checkpoint's state dict; where it runs (device, dtype) is chosen here, once."""

from __future__ import annotations

import contextlib
import logging
import os

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from graphscribe.io.checkpoint import CheckpointError
from graphscribe.io.config import ModelConfig
from graphscribe.model.encoder import FastConformer
from graphscribe.model.features import LogMel
from graphscribe.model.heads import Joint, PredictionNet

log = logging.getLogger(__name__)

_MODULES = ("preprocessor", "encoder", "decoder", "joint")  # state-dict prefixes we load; others are ignored
_DERIVED = ("encoder.pos_enc.pe",)  # buffers older NeMo versions saved; recomputed here
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class _Preprocessor(nn.Module):
    def __init__(self, model_cfg: ModelConfig):
        super().__init__()
        self.featurizer = LogMel(model_cfg.features)


class Transducer(nn.Module):
    """NeMo's EncDecRNNTBPEModel layout: preprocessor, encoder, decoder (prediction net), joint."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.preprocessor = _Preprocessor(cfg)
        self.encoder = FastConformer(cfg.encoder)
        self.decoder = PredictionNet(cfg.prediction)
        self.joint = Joint(cfg.joint)

    def to_inference(self, device: torch.device, dtype: torch.dtype) -> "Transducer":
        """Eval mode on `device`: encoder and joint in `dtype`; features and the prediction net stay float32.

        The prediction net is tiny, and cuDNN takes no bfloat16 LSTM weights in one chunk: it would copy
        them at every step (slower, and impossible inside graph capture).
        """
        self.eval().to(device)
        self.encoder.to(dtype)
        self.joint.to(dtype)
        return self


class _EmptyOnMeta(TorchFunctionMode):
    """Tensors made from nothing (empty, zeros, ones, full) land on the meta device; their initialisation is skipped.

    A module built inside gets its parameters' shapes and dtypes without memory or random
    initialisation (600 M parameters take seconds to initialise). Anything else stays real:
    tensors made from data (`torch.tensor`), for code that reads them while building, and small
    ones (the window). Initialisers run on meta tensors would be no-ops, but some (normal_, on a
    window) go through torch._refs, whose first use imports torch._dynamo: 1.5 s.
    """

    _FACTORIES = frozenset({torch.empty, torch.zeros, torch.ones, torch.full})
    _INITIALISERS = frozenset({torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.fill_, torch.Tensor.zero_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._FACTORIES and kwargs.get("device") is None:
            kwargs["device"] = "meta"
        elif func in self._INITIALISERS or getattr(func, "__module__", None) == "torch.nn.init":
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def empty_transducer(cfg: ModelConfig, dtype: torch.dtype) -> Transducer:
    """A Transducer on the meta device whose tensors have their inference dtypes (see `to_inference`)."""
    with _EmptyOnMeta():
        module = Transducer(cfg)
    return module.to_inference(torch.device("meta"), dtype)


def load_state(
    module: Transducer, state_dict: dict[str, torch.Tensor], source: str, device: torch.device | None = None
) -> None:
    """Strict loading of our modules' weights, with one line naming what is missing or misshapen.

    With `device`, the module is an `empty_transducer`: it takes the given tensors themselves, each
    moved to `device` in the dtype of the module's tensor (no copy where it is there already).
    Without, the weights are copied into the module's own tensors.
    """
    wanted = module.state_dict()
    given = {k: v for k, v in state_dict.items() if k.split(".", 1)[0] in _MODULES and k not in _DERIVED}
    missing = [k for k in wanted if k not in given]
    unexpected = [k for k in given if k not in wanted]
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} weights, e.g. {', '.join(missing[:3])}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} weights, e.g. {', '.join(unexpected[:3])}")
        raise CheckpointError(f"{source}: weights do not match the config: {'; '.join(parts)}")
    for key, tensor in given.items():
        if tuple(tensor.shape) != tuple(wanted[key].shape):
            raise CheckpointError(
                f"{source}: weight {key} has shape {tuple(tensor.shape)}, the config implies {tuple(wanted[key].shape)}"
            )
    if device is None:
        module.load_state_dict(given, strict=True)
        return
    placed = {key: tensor.to(device=device, dtype=wanted[key].dtype) for key, tensor in given.items()}
    module.load_state_dict(placed, strict=True, assign=True)
    unset = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if unset:  # a tensor that is not in the state dict must be made from data, not from nothing
        raise RuntimeError(f"{', '.join(unset)}: not in the state dict, left on the meta device")


def resolve_device(requested: str) -> torch.device:
    """auto: CUDA when present, else CPU. An explicit CUDA request without CUDA is a ValueError (one line): it would
    run on the CPU, hundreds of times slower, where its asker expected a GPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind, colon, index = requested.partition(":")
    # checked here: torch.device's own complaint about "gpu" or "cuda:x" is a RuntimeError listing 20 device types
    if kind not in ("cpu", "cuda") or (colon and not (index.isascii() and index.isdigit())):
        raise ValueError(f"--device {requested}: use auto, cpu, cuda or cuda:N")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {requested}: CUDA is not available on this machine (--device cpu or auto)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"--device {requested}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve_dtype(requested: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA GPUs that support it, float32 elsewhere. float32 gives NeMo's exact token ids; the
    word error rate is the same in both (the bundled demo model's on 400 held-out utterances: 5.26% and 5.28%),
    and bfloat16 transcribes folders about twice as fast. float16 on the CPU degrades to float32."""
    if requested == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
            return torch.bfloat16
        return torch.float32
    if requested not in _DTYPES:
        raise ValueError(f"--dtype {requested}: use auto, float32, bfloat16 or float16")
    if requested == "float16" and device.type == "cpu":
        log.warning("float16 is not supported on the CPU; using float32")
        return torch.float32
    return _DTYPES[requested]


@contextlib.contextmanager
def cudnn_without_tf32():
    cudnn = torch.backends.cudnn
    before = cudnn.allow_tf32
    cudnn.allow_tf32 = False
    try:
        yield
    finally:
        cudnn.allow_tf32 = before


def available_memory(device: torch.device) -> int:
    """Bytes free for new tensors: CUDA's free memory plus PyTorch's unused cache, or the host's available memory."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
