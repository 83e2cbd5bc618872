"""Data sets by name for recipes: ``data.dataset`` + ``data.options`` -> a ``(input, node_id)`` data set.

The kinds live in one registry, :data:`DATASETS` (add one with :func:`register_dataset`). Built-in kinds
(``data.options`` in brackets):

* ``wordnet_gloss`` — the WordNet-definitions text set (``hiercls.data.wordnet_gloss_dataset``;
  options ``include_lemma``, ``label``, ``classes_only``); splits ``train`` / ``val`` / ``test``.
* ``fashion_mnist`` — Fashion-MNIST from the Debian files (``root``); splits ``train`` / ``test``, and ``train_fit``
  / ``val`` (the first 50,000 / last 10,000 training images).
* ``image_folder`` — ``hiercls.data.HierImageFolder`` on ``<root>/<split>`` (``root``).
* ``shards`` — :class:`hiercls.data.shards.ShardDataset`, tar shards (``shards``: a folder of ``.tar`` files,
  or one with a sub-folder per split, or a brace range with ``{split}`` in it; ``buffer_size``); needs the
  recipe's taxonomy.
* ``hf_datasets`` — :func:`hiercls.data.hf_datasets.hf_text_dataset`, text from local Hugging Face ``datasets``
  files (``<split>_path`` or ``path`` with ``{split}``: a ``.parquet`` or ``.arrow`` file or a ``save_to_disk``
  folder; ``text_column``, ``label_column``, ``label_format``, ``separator``, ``multilabel``); needs the
  ``datasets`` package.
* ``text_csv`` / ``text_jsonl`` — ``HierTextDataset.from_csv/from_jsonl`` (``<split>_path`` or ``path`` with
  ``{split}`` in it, ``text_column``, ``label_column``, ``label_format``, ``separator``...).
* ``synthetic`` — :class:`hiercls.data.synthetic.SyntheticHierarchy` (``kind``, ``num_samples``,
  ``<split>_samples``, ``image_size``, ``dim``, ``noise``, ``labels``, ``seed``); the split changes the seed.
* ``nested_blobs_3d`` — :class:`hiercls.data.synthetic.NestedBlobs3D` (``num_samples``, ``<split>_samples``,
  ``size``, ``noise``, ``seed``); comes with its own region taxonomy (:func:`dataset_taxonomy`).

Example:
    >>> "wordnet_gloss" in list_datasets()
    True
    >>> ds = build_dataset("nested_blobs_3d", "val", None, {"num_samples": 2, "size": 8})
    >>> len(ds), ds.taxonomy.name == dataset_taxonomy("nested_blobs_3d").name
    (2, True)
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hiercls._registry import Registry
from hiercls.data.hf_datasets import hf_text_dataset
from hiercls.data.images import FashionMNIST, HierImageFolder
from hiercls.data.shards import ShardDataset
from hiercls.data.synthetic import NestedBlobs3D, SyntheticHierarchy, nested_blobs_taxonomy
from hiercls.data.text import HierTextDataset
from hiercls.data.wordnet_gloss import wordnet_gloss_dataset
from hiercls.taxonomy import Taxonomy, TaxonomyError

logger = logging.getLogger(__name__)

__all__ = [
    "DATASETS",
    "DatasetBuilder",
    "DatasetKind",
    "build_dataset",
    "dataset_taxonomy",
    "list_datasets",
    "register_dataset",
    "subsample",
]

#: ``builder(split, taxonomy or None, options, transform) -> dataset`` (``options`` is a fresh dict to consume).
DatasetBuilder = Callable[[str, Taxonomy | None, dict[str, Any], Any], Any]


@dataclass(frozen=True)
class DatasetKind:
    """One entry of :data:`DATASETS`.

    Attributes:
        build: makes the split's data set (raises ``ValueError`` naming ``data.options.<key>`` on bad options).
        taxonomy: the kind's own taxonomy, for kinds that come with one (``None``: the recipe names one, or
            the data set builds it, as nested image folders do).
    """

    build: DatasetBuilder
    taxonomy: Callable[[], Taxonomy] | None = None


#: Data set kind name -> :class:`DatasetKind`.
DATASETS: Registry[DatasetKind] = Registry("data set")


def register_dataset(
    name: str, build: DatasetBuilder, *, taxonomy: Callable[[], Taxonomy] | None = None, overwrite: bool = False
) -> DatasetKind:
    """Make ``data.dataset: <name>`` build data sets with ``build`` (see :data:`DatasetBuilder`).

    Raises:
        ValueError: ``name`` is taken (pass ``overwrite=True`` to replace it).

    Example:
        >>> kind = register_dataset("doc_example", lambda split, tax, opts, tf: [("text", 1)], overwrite=True)
        >>> build_dataset("doc_example", "train", None)
        [('text', 1)]
        >>> DATASETS.unregister("doc_example")
    """
    return DATASETS.register(name, DatasetKind(build, taxonomy), overwrite=overwrite)


_SPLIT_SEED = {"train": 0, "val": 1, "test": 2}


def _split_seed(split: str, kind: str) -> int:
    # Any other name would draw a made-up split (evaluate --data tset scored one without a word).
    if split not in _SPLIT_SEED:
        raise ValueError(f"split {split!r}: the {kind!r} data set has the splits {', '.join(map(repr, _SPLIT_SEED))}")
    return _SPLIT_SEED[split]


def _opts(options: dict[str, Any], allowed: set[str], kind: str) -> dict[str, Any]:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(
            f"data.options: unknown option(s) {', '.join(map(repr, unknown))} for data set {kind!r}; "
            f"valid options: {', '.join(sorted(allowed))}"
        )
    return dict(options)


def _split_count(opts: dict[str, Any], split: str, default: int) -> int:
    n = opts.get(f"{split}_samples", opts.get("num_samples", default))
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"data.options.{split}_samples: expected a positive integer, got {n!r}")
    return n


def _wordnet_gloss(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    opts = _opts(options, {"include_lemma", "label", "classes_only"}, "wordnet_gloss")
    if taxonomy is None:
        raise ValueError(
            "data.dataset 'wordnet_gloss' needs a WordNet taxonomy: set taxonomy: imagenet21k_winter21 "
            "(or another taxonomy whose node names are WordNet ids)"
        )
    return wordnet_gloss_dataset(split, taxonomy, **opts)


def _fashion_mnist(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    opts = _opts(options, {"root"}, "fashion_mnist")
    return FashionMNIST(split, taxonomy=taxonomy, transform=transform, **opts)


def _image_folder(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    opts = _opts(options, {"root", "name", "on_error"}, "image_folder")
    if "root" not in opts:
        raise ValueError(
            "data.options.root: the 'image_folder' data set needs root: <folder with one sub-folder per split>"
        )
    root = Path(opts["root"])
    if root.is_dir() and not (root / split).is_dir():
        have = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise FileNotFoundError(
            f"split {split!r}: data.options.root {str(root)!r} has no folder {split!r}; its splits (sub-folders): "
            f"{', '.join(map(repr, have)) or 'none'}"
        )
    return HierImageFolder(
        root / split, taxonomy, transform, name=opts.get("name"), on_error=opts.get("on_error", "fail")
    )


def _shards(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    opts = _opts(options, {"shards", "buffer_size"}, "shards")
    if "shards" not in opts:
        raise ValueError(
            "data.options.shards: the 'shards' data set needs shards: a folder of .tar files (with one sub-folder "
            "per split), a brace range such as data/{split}-{000000..000009}.tar, or a list"
        )
    if taxonomy is None:
        raise ValueError("taxonomy: the 'shards' data set needs the recipe's taxonomy (the labels' node names)")
    spec = opts["shards"]
    if isinstance(spec, str):
        spec = spec.replace("{split}", split)
        if (Path(spec) / split).is_dir():
            spec = str(Path(spec) / split)
    return ShardDataset(spec, taxonomy, transform, buffer_size=int(opts.get("buffer_size", 1000)))


def _hf_datasets(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    allowed = {"path", "train_path", "val_path", "test_path", "text_column", "label_column"}
    opts = _opts(options, allowed | {"label_format", "separator", "multilabel"}, "hf_datasets")
    path = opts.get(f"{split}_path") or (opts["path"].replace("{split}", split) if "path" in opts else None)
    if path is None:
        raise ValueError(
            f"data.options: the 'hf_datasets' data set needs {split}_path: <.parquet/.arrow file or save_to_disk "
            "folder> (or path: with '{split}' in it, or a DatasetDict folder)"
        )
    if taxonomy is None:
        raise ValueError("data.dataset 'hf_datasets' needs taxonomy: <name or file>")
    missing = [k for k in ("text_column", "label_column") if k not in opts]
    if missing:
        raise ValueError(f"data.options: the 'hf_datasets' data set needs {' and '.join(missing)}")
    extra = {k: v for k, v in opts.items() if k not in allowed}
    return hf_text_dataset(path, opts["text_column"], opts["label_column"], taxonomy, split=split, **extra)


def _text_file(fmt: str) -> Callable[..., Any]:
    def build(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
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
            given = [k[: -len("_path")] for k in ("train_path", "val_path", "test_path") if k in options]
            raise ValueError(
                f"split {split!r}: the 'text_{fmt}' data set needs {split}_path: <file> in data.options (or path: "
                f"with '{{split}}' in it); the recipe gives the splits {', '.join(map(repr, given)) or 'none'}"
            )
        if taxonomy is None:
            raise ValueError(f"data.dataset 'text_{fmt}' needs taxonomy: <name or file>")
        missing = [k for k in ("text_column", "label_column") if k not in opts]
        if missing:
            raise ValueError(f"data.options: the 'text_{fmt}' data set needs {' and '.join(missing)}")
        return reader(path, opts.pop("text_column"), opts.pop("label_column"), taxonomy, **opts)

    return build


def _synthetic(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    allowed = {
        "kind",
        "num_samples",
        "train_samples",
        "val_samples",
        "test_samples",
        "image_size",
        "dim",
        "noise",
        "labels",
        "seed",
    }
    opts = _opts(options, allowed, "synthetic")
    if taxonomy is None:
        raise ValueError("data.dataset 'synthetic' needs taxonomy: <name or file>")
    seed = int(opts.get("seed", 0)) * 10 + _split_seed(split, "synthetic")
    n = _split_count(opts, split, 64)
    # The prototypes must be shared by the splits, only the samples differ: draw the prototypes with the
    # base seed and the split's labels/noise with a split-specific seed.
    base = SyntheticHierarchy(
        taxonomy,
        1,
        kind=opts.get("kind", "image"),
        labels=opts.get("labels", "leaves"),
        image_size=opts.get("image_size", 16),
        dim=opts.get("dim", 16),
        noise=opts.get("noise", 0.5),
        seed=int(opts.get("seed", 0)),
    )
    return SyntheticHierarchy(
        taxonomy,
        n,
        kind=base.kind,
        labels=opts.get("labels", "leaves"),
        image_size=base.image_size,
        dim=base.dim,
        noise=base.noise,
        seed=seed,
        prototypes=base.prototypes,
    )


def _nested_blobs(split: str, taxonomy: Taxonomy | None, options: dict[str, Any], transform: Any) -> Any:
    opts = _opts(
        options,
        {"num_samples", "train_samples", "val_samples", "test_samples", "size", "noise", "seed"},
        "nested_blobs_3d",
    )
    split_seed, n = _split_seed(split, "nested_blobs_3d"), _split_count(opts, split, 32)
    ds = NestedBlobs3D(
        n,
        size=int(opts.get("size", 16)),
        noise=float(opts.get("noise", 0.3)),
        seed=int(opts.get("seed", 0)) * 10 + split_seed,
    )
    if taxonomy is not None and taxonomy.fingerprint != ds.taxonomy.fingerprint:
        if taxonomy.num_nodes != ds.taxonomy.num_nodes or not taxonomy.is_tree or taxonomy.height != 3:
            raise TaxonomyError(
                f"nested_blobs_3d has the region chain volume -> outer -> middle -> inner; "
                f"taxonomy {taxonomy.name!r} ({taxonomy.num_nodes} nodes) does not fit it (leave "
                "taxonomy unset)"
            )
        ds.taxonomy = taxonomy
    return ds


register_dataset("wordnet_gloss", _wordnet_gloss)
register_dataset("fashion_mnist", _fashion_mnist)
register_dataset("image_folder", _image_folder)
register_dataset("shards", _shards)
register_dataset("hf_datasets", _hf_datasets)
register_dataset("text_csv", _text_file("csv"))
register_dataset("text_jsonl", _text_file("jsonl"))
register_dataset("synthetic", _synthetic)
register_dataset("nested_blobs_3d", _nested_blobs, taxonomy=nested_blobs_taxonomy)


def list_datasets() -> list[str]:
    """Names accepted by ``data.dataset`` (the kinds of :data:`DATASETS`)."""
    return DATASETS.names()


def dataset_taxonomy(kind: str) -> Taxonomy | None:
    """The built-in taxonomy of data set ``kind`` (``nested_blobs_3d``'s region chain), else ``None``.

    Raises:
        ValueError: unknown kind (with close matches and the registered kinds).
    """
    own = DATASETS.get(kind).taxonomy
    return own() if own is not None else None


def build_dataset(
    kind: str, split: str, taxonomy: Taxonomy | None, options: dict[str, Any] | None = None, transform: Any = None
) -> Any:
    """The ``split`` of data set ``kind`` (``options``: the kind's ``data.options``; ``transform``: for images).

    Raises:
        ValueError: unknown kind (with close matches) or invalid options (naming ``data.options.<key>``).
        TaxonomyError: a taxonomy that does not fit the data set.
    """
    return DATASETS.get(kind).build(split, taxonomy, dict(options or {}), transform)


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
