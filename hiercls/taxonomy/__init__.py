"""Taxonomies: the validated hierarchy every head, decoder and metric is built on.

Example:
    >>> from hiercls.taxonomy import Taxonomy, taxonomy_from_label_paths
    >>> tax = taxonomy_from_label_paths(["animal/cat", "animal/dog", "vehicle"])
    >>> tax.names
    ('root', 'animal', 'animal/cat', 'animal/dog', 'vehicle')
"""

from __future__ import annotations

import importlib
from typing import Any

from hiercls.taxonomy import core, io, regions, registry
from hiercls.taxonomy.core import *  # noqa: F403
from hiercls.taxonomy.io import *  # noqa: F403
from hiercls.taxonomy.regions import *  # noqa: F403
from hiercls.taxonomy.registry import *  # noqa: F403

# WordNet / ImageNet builders are imported on first use: they pull in nltk (and timm's class tables).
# A public name equal to a submodule's name (the function ``wordnet.wordnet``) is not re-exported:
# ``hiercls.taxonomy.wordnet`` stays the module, as ``import hiercls.taxonomy.wordnet as wn`` expects.
_LAZY_MODULES = ("hiercls.taxonomy.wordnet", "hiercls.taxonomy.imagenet")
_SUBMODULES = frozenset(m.rsplit(".", 1)[1] for m in _LAZY_MODULES)
_WORDNET_NAMES = (
    "DEBIAN_WORDNET_DIR",
    "LEXNAMES",
    "WORDNET_ROOT_WNID",
    "WordNetUnavailableError",
    "is_wnid",
    "synset_to_wnid",
    "wnid_to_synset",
    "wordnet_available",
    "wordnet_data_dir",
    "wordnet_taxonomy",
)
_IMAGENET_NAMES = (
    "IMAGENET21K_ROOT",
    "IMAGENET_SUBSETS",
    "imagenet1k_taxonomy",
    "imagenet21k_taxonomy",
    "imagenet_class_names",
    "imagenet_class_nodes",
    "imagenet_node_classes",
    "imagenet_synsets",
)

__all__ = [*core.__all__, *io.__all__, *regions.__all__, *registry.__all__, *_WORDNET_NAMES, *_IMAGENET_NAMES]


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(name)
    if name in _SUBMODULES:
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'hiercls.taxonomy' has no attribute {name!r}") from None
    for module_name in _LAZY_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:  # that module is not there (yet); a missing dependency is a real error
                continue
            raise
        if name in getattr(module, "__all__", ()):
            value = getattr(module, name)
            globals()[name] = value
            return value
    raise AttributeError(f"module 'hiercls.taxonomy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
