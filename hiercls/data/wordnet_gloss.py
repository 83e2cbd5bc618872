"""A real hierarchical text set from offline files: WordNet glosses of ImageNet-21K synsets, labelled by synset.

timm ships ``imagenet_synset_to_definition.txt`` and ``imagenet_synset_to_lemma.txt`` (WordNet 3.0 glosses
and lemmas of the ImageNet-21K synsets, about 21.8k lines). Each gloss becomes one sample whose label is its
synset's node in the chosen taxonomy. The split is fixed by a stable hash of the WordNet id, so it does not
depend on the taxonomy, the Python version or the machine.
"""

from __future__ import annotations

import hashlib
import logging
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

from hiercls.data.text import HierTextDataset
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.registry import load_taxonomy

logger = logging.getLogger(__name__)

__all__ = ["gloss_split_of", "load_timm_glosses", "wordnet_gloss_dataset"]

GlossSplit = Literal["train", "val", "test", "all"]
#: Percent of WordNet ids in each split (by ``sha256(wnid) % 100``).
SPLIT_PERCENT = {"train": (0, 80), "val": (80, 90), "test": (90, 100)}


def _timm_info_dir() -> Path:
    import timm.data

    return Path(timm.data.__file__).resolve().parent / "_info"


def _read_tsv(path: Path) -> dict[str, str]:
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(path)!r} not found: the WordNet gloss set needs timm's bundled class info "
            "(timm>=0.9, 'pip install timm')"
        )
    out: dict[str, str] = {}
    for line_no, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        wnid, sep, text = raw.partition("\t")
        if not sep or not wnid.startswith("n"):
            raise ValueError(f"{path}:{line_no}: expected '<wnid>\\t<text>', got {raw[:60]!r}")
        out[wnid.strip()] = text.strip()
    return out


@lru_cache(maxsize=1)
def load_timm_glosses() -> tuple[dict[str, str], dict[str, str]]:
    """``(wnid -> gloss, wnid -> lemmas)`` from timm's ``data/_info`` files.

    Example:
        >>> glosses, lemmas = load_timm_glosses()
        >>> lemmas["n02084071"], glosses["n02084071"][:26]
        ('dog, domestic dog, Canis familiaris', 'a member of the genus Cani')
    """
    info = _timm_info_dir()
    return (_read_tsv(info / "imagenet_synset_to_definition.txt"), _read_tsv(info / "imagenet_synset_to_lemma.txt"))


def gloss_split_of(wnid: str) -> str:
    """The fixed split (``"train"``/``"val"``/``"test"``, 80/10/10) of a WordNet id: ``sha256(wnid) % 100``.

    Example:
        >>> gloss_split_of("n02084071") in ("train", "val", "test")
        True
    """
    bucket = int.from_bytes(hashlib.sha256(wnid.encode("utf-8")).digest()[:8], "big") % 100
    return next(s for s, (lo, hi) in SPLIT_PERCENT.items() if lo <= bucket < hi)


def _resolve_taxonomy(taxonomy: Taxonomy | str) -> Taxonomy:
    if isinstance(taxonomy, Taxonomy):
        return taxonomy
    if not isinstance(taxonomy, str):
        raise TypeError(f"taxonomy must be a Taxonomy or the name of a shipped taxonomy; got {type(taxonomy).__name__}")
    return load_taxonomy(taxonomy)


def wordnet_gloss_dataset(
    split: GlossSplit = "train",
    taxonomy: Taxonomy | str = "imagenet21k_winter21",
    *,
    include_lemma: bool = False,
    label: Literal["synset", "parent"] = "synset",
    classes_only: bool = True,
) -> HierTextDataset:
    """The WordNet-definitions text set: gloss -> synset node, restricted to the synsets of ``taxonomy``.

    Args:
        split: ``"train"`` (80 % of WordNet ids), ``"val"`` (10 %), ``"test"`` (10 %) or ``"all"``.
        taxonomy: a taxonomy whose node names are WordNet ids, or the name of a shipped one.
        include_lemma: prefix the gloss with the synset's lemmas (``"dog, domestic dog: a member of ..."``).
            Off by default: the lemma names the label, which makes the task a lookup.
        label: ``"synset"`` labels a gloss with its own synset; ``"parent"`` with the synset's (first) parent
            (glosses whose parent is the root are then left out: the root is no label).
            Every synset has exactly one gloss and the split is by synset, so with ``"synset"`` the val/test
            labels never occur in training (a hierarchical, zero-shot-like task: credit comes from predicting
            close nodes); with ``"parent"`` most test labels are seen in training through siblings.
        classes_only: keep only synsets that are classes of the taxonomy (``taxonomy.class_mask``).

    Samples are ordered by node id. Synsets of the taxonomy that have no gloss in timm's file are skipped
    (logged).

    Raises:
        ValueError: an unknown split or label mode.
        TaxonomyError: the taxonomy has no WordNet-id nodes with a gloss.

    Example:
        >>> tax = Taxonomy([("entity", "n00021939"), ("n00021939", "n03563967"), ("entity", "n02084071")])
        >>> ds = wordnet_gloss_dataset("all", tax)
        >>> len(ds), ds[0][0][:30]
        (3, 'a man-made object taken as a w')
    """
    if split not in (*SPLIT_PERCENT, "all"):
        raise ValueError(f"split must be 'train', 'val', 'test' or 'all'; got {split!r}")
    if label not in ("synset", "parent"):
        raise ValueError(f"label must be 'synset' or 'parent'; got {label!r}")
    tax = _resolve_taxonomy(taxonomy)
    glosses, lemmas = load_timm_glosses()
    texts: list[str] = []
    targets: list[int] = []
    missing = 0
    parent = tax.primary_parent.tolist()
    is_class = tax.class_mask.tolist()  # plain lists: per-element numpy indexing dominates on 21k nodes
    for node, wnid in enumerate(tax.names):
        if node == tax.root or (classes_only and not is_class[node]):
            continue
        gloss = glosses.get(wnid)
        if gloss is None:
            missing += 1
            continue
        if split != "all" and gloss_split_of(wnid) != split:
            continue
        target = node if label == "synset" else parent[node]
        if label == "parent" and target == tax.root:
            continue  # the root is no label
        texts.append(f"{lemmas[wnid]}: {gloss}" if include_lemma and wnid in lemmas else gloss)
        targets.append(target)
    if missing:
        logger.info("wordnet_gloss_dataset: %d synsets of %r have no gloss in timm's file", missing, tax.name)
    if not texts and split == "all":
        raise TaxonomyError(
            f"taxonomy {tax.name!r} has no nodes named by a WordNet id with a gloss in timm's "
            "imagenet_synset_to_definition.txt"
        )
    return HierTextDataset(texts, np.asarray(targets, dtype=np.int64), tax, source=f"wordnet_glosses:{split}")
