"""Data sets by name for recipes: ``data.dataset`` + ``data.options`` -> a ``(input, node_id)`` data set.

Kinds (``data.options`` in brackets):

* ``wordnet_gloss`` — the WordNet-definitions text set (``hiercls.data.wordnet_gloss_dataset``;
  options ``include_lemma``, ``label``, ``classes_only``); splits ``train`` / ``val`` / ``test``.
* ``fashion_mnist`` — Fashion-MNIST from the Debian files (``root``); splits ``train`` / ``test``.
* ``image_folder`` — ``hiercls.data.HierImageFolder`` on ``<root>/<split>`` (``root``).
* ``text_csv`` / ``text_jsonl`` — ``HierTextDataset.from_csv/from_jsonl`` (``<split>_path`` or ``path`` with
  ``{split}`` in it, ``text_column``, ``label_column``, ``label_format``, ``separator``...).
* ``synthetic`` — :class:`hiercls.train.synthetic.SyntheticHierarchy` (``kind``, ``num_samples``,
  ``<split>_samples``, ``image_size``, ``dim``, ``noise``, ``labels``); the split changes the seed.
* ``nested_blobs_3d`` — :class:`hiercls.train.synthetic.NestedBlobs3D` (``num_samples``, ``<split>_samples``,
  ``size``, ``noise``); comes with its own region taxonomy.

Example:
    >>> "wordnet_gloss" in list_datasets()
    True
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.train.config import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["ImageModeTransform", "build_dataset", "dataset_taxonomy", "image_transform", "list_datasets", "subsample"]

_SPLIT_SEED = {"train": 0, "val": 1, "test": 2}


def _opts(options: dict[str, Any], allowed: set[str], kind: str) -> dict[str, Any]:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"data.options: unknown option(s) {', '.join(map(repr, unknown))} for data set {kind!r}; "
                          f"valid options: {', '.join(sorted(allowed))}")
    return dict(options)


def _split_count(opts: dict[str, Any], split: str, default: int) -> int:
    n = opts.get(f"{split}_samples", opts.get("num_samples", default))
    if not isinstance(n, int) or n < 1:
        raise ConfigError(f"data.options.{split}_samples: expected a positive integer, got {n!r}")
    return n


def _wordnet_gloss(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    from hiercls.data import wordnet_gloss_dataset

    opts = _opts(options, {"include_lemma", "label", "classes_only"}, "wordnet_gloss")
    if taxonomy is None:
        raise ConfigError("data.dataset 'wordnet_gloss' needs a WordNet taxonomy: set taxonomy: imagenet21k_winter21 "
                          "(or another taxonomy whose node names are WordNet ids)")
    return wordnet_gloss_dataset(split, taxonomy, **opts)


def _fashion_mnist(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    from hiercls.data import FashionMNIST

    opts = _opts(options, {"root"}, "fashion_mnist")
    return FashionMNIST(split, taxonomy=taxonomy, transform=transform, **opts)


def _image_folder(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    from pathlib import Path

    from hiercls.data import HierImageFolder

    opts = _opts(options, {"root", "name"}, "image_folder")
    if "root" not in opts:
        raise ConfigError("data.options.root: the 'image_folder' data set needs root: <folder with one sub-folder "
                          "per split>")
    return HierImageFolder(Path(opts["root"]) / split, taxonomy, transform, name=opts.get("name"))


def _text_file(fmt: str) -> Callable[..., Any]:
    def build(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
        from hiercls.data import HierTextDataset

        reader = HierTextDataset.from_csv if fmt == "csv" else HierTextDataset.from_jsonl
        params = set(inspect.signature(reader).parameters) - {"path", "taxonomy", "cls"}
        opts = _opts(options, params | {"path", "train_path", "val_path", "test_path"}, f"text_{fmt}")
        path = opts.pop(f"{split}_path", None)
        template = opts.pop("path", None)
        for s in ("train", "val", "test"):
            opts.pop(f"{s}_path", None)
        if path is None and template is not None:
            path = template.replace("{split}", split)
        if path is None:
            raise ConfigError(f"data.options: the 'text_{fmt}' data set needs {split}_path: <file> (or path: with "
                              "'{split}' in it)")
        if taxonomy is None:
            raise ConfigError(f"data.dataset 'text_{fmt}' needs taxonomy: <name or file>")
        missing = [k for k in ("text_column", "label_column") if k not in opts]
        if missing:
            raise ConfigError(f"data.options: the 'text_{fmt}' data set needs {' and '.join(missing)}")
        return reader(path, opts.pop("text_column"), opts.pop("label_column"), taxonomy, **opts)

    return build


def _synthetic(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    from hiercls.train.synthetic import SyntheticHierarchy

    allowed = {"kind", "num_samples", "train_samples", "val_samples", "test_samples", "image_size", "dim", "noise",
               "labels", "seed"}
    opts = _opts(options, allowed, "synthetic")
    if taxonomy is None:
        raise ConfigError("data.dataset 'synthetic' needs taxonomy: <name or file>")
    n = _split_count(opts, split, 64)
    seed = int(opts.get("seed", 0)) * 10 + _SPLIT_SEED.get(split, 3)
    # The prototypes must be shared by the splits, only the samples differ: seed the prototypes with the
    # base seed and draw the split's labels/noise from a dataset with a split-specific seed.
    base = SyntheticHierarchy(taxonomy, 1, kind=opts.get("kind", "image"), labels=opts.get("labels", "leaves"),
                              image_size=opts.get("image_size", 16), dim=opts.get("dim", 16),
                              noise=opts.get("noise", 0.5), seed=int(opts.get("seed", 0)))
    ds = SyntheticHierarchy(taxonomy, n, kind=base.kind, labels=opts.get("labels", "leaves"),
                            image_size=base.image_size, dim=base.dim, noise=base.noise, seed=seed)
    ds._protos = base._protos
    return ds


def _nested_blobs(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    from hiercls.train.synthetic import NestedBlobs3D

    opts = _opts(options, {"num_samples", "train_samples", "val_samples", "test_samples", "size", "noise", "seed"},
                 "nested_blobs_3d")
    n = _split_count(opts, split, 32)
    ds = NestedBlobs3D(n, size=int(opts.get("size", 16)), noise=float(opts.get("noise", 0.3)),
                       seed=int(opts.get("seed", 0)) * 10 + _SPLIT_SEED.get(split, 3))
    if taxonomy is not None and taxonomy.fingerprint != ds.taxonomy.fingerprint:
        if taxonomy.num_nodes != ds.taxonomy.num_nodes or not taxonomy.is_tree or taxonomy.height != 3:
            raise TaxonomyError(f"nested_blobs_3d has the region chain volume -> outer -> middle -> inner; "
                                f"taxonomy {taxonomy.name!r} ({taxonomy.num_nodes} nodes) does not fit it (leave "
                                "taxonomy unset)")
        ds.taxonomy = taxonomy
    return ds


_DATASETS: dict[str, Callable[..., Any]] = {
    "wordnet_gloss": _wordnet_gloss,
    "fashion_mnist": _fashion_mnist,
    "image_folder": _image_folder,
    "text_csv": _text_file("csv"),
    "text_jsonl": _text_file("jsonl"),
    "synthetic": _synthetic,
    "nested_blobs_3d": _nested_blobs,
}


class ImageModeTransform:
    """Convert PIL images to the colour mode the backbone expects before its transform (grey -> RGB).

    Fashion-MNIST images are greyscale while ImageNet backbones take 3 channels; timm's transforms do not
    convert modes. A module-level class, so that DataLoader workers can pickle it.
    """

    def __init__(self, transform: Callable[[Any], Any], mode: str = "RGB") -> None:
        self.transform, self.mode = transform, mode

    def __call__(self, image: Any) -> Any:
        if hasattr(image, "mode") and image.mode != self.mode:
            image = image.convert(self.mode)
        return self.transform(image)

    def __repr__(self) -> str:
        return f"ImageModeTransform({self.mode}, {self.transform!r})"


def image_transform(model: Any, *, train: bool, image_size: int | None) -> Any:
    """The model's timm transform for ``train``/eval at ``image_size``, preceded by a colour-mode conversion.

    Returns ``None`` for models without image preprocessing (text models, the 3-D conv net).
    """
    if getattr(model, "modality", None) != "image" or not hasattr(model, "transform"):
        return None
    transform = model.transform(train=train, image_size=image_size)
    channels = 3
    with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
        channels = int(model.data_config(image_size)["input_size"][0])
    return ImageModeTransform(transform, "RGB" if channels == 3 else "L")


def list_datasets() -> list[str]:
    """Names accepted by ``data.dataset``."""
    return sorted(_DATASETS)


def dataset_taxonomy(kind: str) -> Taxonomy | None:
    """The built-in taxonomy of a data set kind that has one (``nested_blobs_3d``), else ``None``."""
    if kind == "nested_blobs_3d":
        from hiercls.train.synthetic import nested_blobs_taxonomy

        return nested_blobs_taxonomy()
    return None


def build_dataset(kind: str, split: str, taxonomy: Taxonomy | None, options: dict[str, Any] | None = None,
                  transform: Any = None) -> Any:
    """The ``split`` of data set ``kind``.

    Raises:
        ConfigError: unknown kind (with a suggestion) or invalid options.
    """
    if kind not in _DATASETS:
        import difflib

        close = difflib.get_close_matches(kind, list(_DATASETS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"data.dataset: unknown data set {kind!r}{hint}; valid: {', '.join(list_datasets())}")
    return _DATASETS[kind](split, taxonomy, dict(options or {}), transform)


def subsample(dataset: Any, max_samples: int | None, seed: int = 0) -> Any:
    """A fixed random subset of ``max_samples`` samples (in their original order), or the data set itself.

    The subset depends only on ``seed`` and the data set length, not on the run seed, so that runs with
    different seeds or heads train on the same samples.
    """
    n = len(dataset)
    if max_samples is None or max_samples >= n:
        return dataset
    idx = np.sort(np.random.default_rng(seed).choice(n, size=max_samples, replace=False))
    sub = torch.utils.data.Subset(dataset, idx.tolist())
    sub.taxonomy = getattr(dataset, "taxonomy", None)  # type: ignore[attr-defined]
    return sub
