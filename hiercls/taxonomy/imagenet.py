"""ImageNet taxonomies from WordNet 3.0 and timm's class tables: ImageNet-1K and the ImageNet-21K-P trees.

* :func:`imagenet1k_taxonomy`: the WordNet hypernym DAG above the 1,000 ILSVRC-2012 classes (its leaves
  are exactly the 1,000 classes), or its tree form (first hypernym kept, dead branches pruned).
* :func:`imagenet21k_taxonomy`: the semantic trees of ImageNet-21K-P (Ridnik et al., "ImageNet-21K
  Pretraining for the Masses", NeurIPS 2021 datasets track) used by semantic-softmax pretraining. Nodes are the
  classes only (10,450 for winter21, 11,221 for fall11); a class's parent is its nearest WordNet ancestor
  that is itself a class, along the first-hypernym chain; classes with no class above them hang under a
  virtual root. ``Taxonomy.semantic_level`` is the MIIL hierarchy level (the number of class ancestors).

The authors built their tree from ImageNet's ``is_a.txt`` (WordNet 3.0 hypernym pairs), treating each
synset as having one parent (Alibaba-MIIL/ImageNet21K issues #7, #11); they did not publish which hypernym
wins for the ~2% of synsets that have several, so here the first WordNet hypernym (nltk order) does.

Class order (a model's output order) is timm's: ``timm/data/_info/imagenet_synsets.txt`` (1k, sorted by
wnid), ``imagenet21k_miil_synsets.txt`` (fall11) and ``imagenet21k_miil_w21_synsets.txt`` (winter21).
:func:`imagenet_class_nodes` maps class index to node id.

Example:
    >>> tax = imagenet1k_taxonomy()  # doctest: +SKIP
    >>> tax.num_leaves, tax.display_names[imagenet_class_nodes(tax)[0]]  # doctest: +SKIP
    (1000, 'tench')
"""

from __future__ import annotations

import importlib.resources
import logging
from collections.abc import Sequence
from functools import cache, lru_cache
from typing import Literal

import numpy as np

from hiercls.taxonomy.core import Taxonomy, TaxonomyError
from hiercls.taxonomy.wordnet import wordnet_taxonomy

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGENET21K_ROOT",
    "IMAGENET_SUBSETS",
    "imagenet1k_taxonomy",
    "imagenet21k_taxonomy",
    "imagenet_class_names",
    "imagenet_class_nodes",
    "imagenet_node_classes",
    "imagenet_synsets",
]

#: timm class tables (files in ``timm/data/_info/``) by subset name.
IMAGENET_SUBSETS: dict[str, str] = {
    "imagenet1k": "imagenet_synsets.txt",
    "imagenet21k_winter21": "imagenet21k_miil_w21_synsets.txt",
    "imagenet21k_fall11": "imagenet21k_miil_synsets.txt",
    "imagenet12k": "imagenet12k_synsets.txt",
    "imagenet21k_goog": "imagenet21k_goog_synsets.txt",
    "imagenet22k": "imagenet22k_synsets.txt",
}
_ALIASES = {
    "1k": "imagenet1k",
    "imagenet-1k": "imagenet1k",
    "winter21": "imagenet21k_winter21",
    "fall11": "imagenet21k_fall11",
    "imagenet21k_miil": "imagenet21k_fall11",
    "imagenet21k_miil_w21": "imagenet21k_winter21",
    "12k": "imagenet12k",
    "22k": "imagenet22k",
}

#: Name of the virtual root of the ImageNet-21K-P semantic trees.
IMAGENET21K_ROOT = "imagenet21k_root"
_LEMMA_FILE = "imagenet_synset_to_lemma.txt"


def _subset_key(subset: str) -> str:
    key = _ALIASES.get(subset, subset)
    if key not in IMAGENET_SUBSETS:
        choices = ", ".join(sorted({*IMAGENET_SUBSETS, *_ALIASES}))
        raise ValueError(f"subset must be one of {choices}; got {subset!r}")
    return key


@cache
def _timm_info_lines(filename: str) -> tuple[str, ...]:
    try:
        text = importlib.resources.files("timm.data").joinpath("_info", filename).read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError) as err:
        raise FileNotFoundError(
            f"timm's class table timm/data/_info/{filename} is missing ({err}); install timm>=1.0"
        ) from None
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def imagenet_synsets(subset: str = "imagenet1k") -> list[str]:
    """timm's class list (wnids in model output order) for an ImageNet subset.

    Args:
        subset: ``"imagenet1k"``, ``"imagenet21k_winter21"`` (10,450 classes), ``"imagenet21k_fall11"``
            (11,221), ``"imagenet12k"``, ``"imagenet21k_goog"`` or ``"imagenet22k"`` (aliases: ``"1k"``,
            ``"winter21"``, ``"fall11"``...).

    Example:
        >>> syn = imagenet_synsets("imagenet1k")
        >>> len(syn), syn[0]
        (1000, 'n01440764')
        >>> len(imagenet_synsets("winter21")), len(imagenet_synsets("fall11"))
        (10450, 11221)
    """
    return list(_timm_info_lines(IMAGENET_SUBSETS[_subset_key(subset)]))


@lru_cache(maxsize=1)
def _lemmas() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in _timm_info_lines(_LEMMA_FILE):
        wnid, _, lemma = line.partition("\t")
        out[wnid] = lemma
    return out


def imagenet_class_names(wnids: Sequence[str]) -> dict[str, str]:
    """ImageNet class names (the first lemma of timm's ``imagenet_synset_to_lemma.txt``) of the wnids that have one.

    Example:
        >>> imagenet_class_names(["n01440764", "n02084071"])
        {'n01440764': 'tench', 'n02084071': 'dog'}
    """
    lemmas = _lemmas()
    return {w: lemmas[w].split(",")[0].strip() for w in wnids if w in lemmas}


def _meta(subset: str, extra: dict[str, object]) -> dict[str, object]:
    return {
        "source": "WordNet 3.0 noun hypernyms (Princeton, via nltk) over timm's ImageNet class table "
        f"timm/data/_info/{IMAGENET_SUBSETS[subset]}",
        "timm_subset": subset,
        "wordnet_version": "3.0",
        "license": "WordNet 3.0 license (Princeton, BSD-style); class lists from timm (Apache-2.0)",
        **extra,
    }


def imagenet1k_taxonomy(kind: Literal["dag", "tree"] = "dag") -> Taxonomy:
    """The WordNet hierarchy of the 1,000 ImageNet-1K (ILSVRC-2012) classes.

    Args:
        kind: ``"dag"``: every WordNet hypernym above the classes (multi-parent synsets keep all their
            hypernyms, in WordNet order). ``"tree"``: the DAG's ``to_tree("first")`` (each synset keeps its
            first hypernym), with branches left without classes pruned; the dropped edges are in
            ``.dropped_edges`` and ``metadata["dropped_edges"]``.

    Returns:
        A :class:`Taxonomy` rooted at ``entity`` whose leaves (and classes) are exactly the 1,000 classes;
        class display names are ImageNet's (``tench``), other nodes show their first WordNet lemma.

    Example:
        >>> tree = imagenet1k_taxonomy("tree")  # doctest: +SKIP
        >>> tree.is_tree, tree.num_leaves  # doctest: +SKIP
        (True, 1000)
    """
    if kind not in ("dag", "tree"):
        raise ValueError(f"kind must be 'dag' or 'tree'; got {kind!r}")
    wnids = imagenet_synsets("imagenet1k")
    name = "imagenet1k" if kind == "dag" else "imagenet1k_tree"
    dag = wordnet_taxonomy(
        wnids, display_names=imagenet_class_names(wnids), name=name, metadata=_meta("imagenet1k", {"kind": kind})
    )
    if kind == "dag":
        return dag
    tree = dag.to_tree("first")
    dropped = tree.dropped_edges
    pruned = tree.restrict(wnids)  # a synset whose children all chose another parent becomes a dead end
    lost = sorted(set(tree.names) - set(pruned.names))
    pruned = pruned.replace(
        metadata={
            **pruned.metadata,
            "tree_strategy": "first",
            "dropped_edges": [list(e) for e in dropped],
            "pruned_nodes": lost,
        }
    )
    pruned._dropped_edges = dropped  # restrict() made a new tree; the edges dropped are still to_tree's
    logger.info(
        "imagenet1k tree: dropped %d non-first hypernym edges, pruned %d class-less synsets", len(dropped), len(lost)
    )
    return pruned


def imagenet21k_taxonomy(version: Literal["winter21", "fall11"] = "winter21") -> Taxonomy:
    """The ImageNet-21K-P semantic tree (Ridnik et al. 2021) of the winter21 (10,450) or fall11 (11,221) classes.

    Each class's parent is the nearest class on its first-hypernym chain in WordNet (instance hypernyms
    followed for the few classes that are WordNet instances); classes without one are children of the
    virtual root :data:`IMAGENET21K_ROOT`. Every node but the root is a class, so
    ``semantic_level[c]`` is the number of classes above ``c``: the semantic-softmax hierarchy level.

    Example:
        >>> tax = imagenet21k_taxonomy("fall11")  # doctest: +SKIP
        >>> len(tax.classes), int(tax.semantic_level.max()) + 1  # doctest: +SKIP
        (11221, 12)
    """
    subset = {"winter21": "imagenet21k_winter21", "fall11": "imagenet21k_fall11"}.get(version)
    if subset is None:
        raise ValueError(f"version must be 'winter21' (10,450 classes) or 'fall11' (11,221 classes); got {version!r}")
    wnids = imagenet_synsets(subset)
    dag = wordnet_taxonomy(wnids, include_instances=True)
    first = dag.primary_parent
    is_class = dag.class_mask
    names = dag.names
    # Nearest class above each node along first parents (ids are topological: parents are resolved first).
    class_above = np.full(dag.num_nodes, -1, dtype=np.int64)
    for n in range(1, dag.num_nodes):
        p = int(first[n])
        class_above[n] = p if is_class[p] else class_above[p]
    parent_of = {
        names[n]: (names[int(class_above[n])] if class_above[n] >= 0 else None)
        for n in range(dag.num_nodes)
        if is_class[n]
    }
    edges = [(p, c) for c, p in ((w, parent_of[w]) for w in wnids) if p is not None]
    tax = Taxonomy(
        edges,
        nodes=wnids,
        display_names=imagenet_class_names(wnids),
        classes=wnids,
        virtual_root=IMAGENET21K_ROOT,
        name=f"imagenet21k_{version}",
        metadata=_meta(
            subset,
            {
                "kind": "semantic_tree",
                "version": version,
                "tree_rule": "parent = nearest class on the first-hypernym chain (MIIL ImageNet-21K-P semantic tree)",
            },
        ),
    )
    return tax


def _subset_of(tax: Taxonomy, subset: str | None) -> str:
    if subset is not None:
        return _subset_key(subset)
    meta = tax.metadata.get("timm_subset")
    if isinstance(meta, str) and meta in IMAGENET_SUBSETS:
        return meta
    raise ValueError(
        f"taxonomy {tax.name!r} does not record its timm class table (metadata['timm_subset']); pass "
        "subset= (e.g. 'imagenet1k')"
    )


def imagenet_class_nodes(tax: Taxonomy, subset: str | None = None) -> np.ndarray:
    """Node id of every timm class index: ``nodes[k]`` is the node of output ``k`` of a timm model.

    Args:
        tax: a taxonomy whose node names are wnids.
        subset: the timm class table (default: ``tax.metadata["timm_subset"]``).

    Raises:
        TaxonomyError: a class of the table is not a node of ``tax``.

    Example:
        >>> tax = imagenet1k_taxonomy()  # doctest: +SKIP
        >>> tax.name_of(imagenet_class_nodes(tax)[0])  # doctest: +SKIP
        'n01440764'
    """
    return tax.ids(imagenet_synsets(_subset_of(tax, subset)))


def imagenet_node_classes(tax: Taxonomy, subset: str | None = None) -> np.ndarray:
    """Inverse of :func:`imagenet_class_nodes`: the timm class index of every node, ``-1`` for nodes that are none.

    Example:
        >>> tax = imagenet1k_taxonomy()  # doctest: +SKIP
        >>> int(imagenet_node_classes(tax)[tax.index("n01440764")])  # doctest: +SKIP
        0
    """
    nodes = imagenet_class_nodes(tax, subset)
    out = np.full(tax.num_nodes, -1, dtype=np.int64)
    if len(np.unique(nodes)) != len(nodes):
        raise TaxonomyError(f"the class table lists a node of {tax.name!r} twice")
    out[nodes] = np.arange(len(nodes))
    return out
