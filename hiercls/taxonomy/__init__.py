"""Taxonomies: the validated hierarchy every head, decoder and metric is built on.

Example:
    >>> from hiercls.taxonomy import Taxonomy, taxonomy_from_label_paths
    >>> tax = taxonomy_from_label_paths(["animal/cat", "animal/dog", "vehicle"])
    >>> tax.names
    ('root', 'animal', 'animal/cat', 'animal/dog', 'vehicle')
"""

from __future__ import annotations

from hiercls.taxonomy import core, imagenet, io, regions, registry
from hiercls.taxonomy.core import *  # noqa: F403
from hiercls.taxonomy.imagenet import *  # noqa: F403
from hiercls.taxonomy.io import *  # noqa: F403
from hiercls.taxonomy.labels import node_id_array
from hiercls.taxonomy.regions import *  # noqa: F403
from hiercls.taxonomy.registry import *  # noqa: F403
from hiercls.taxonomy.wordnet import (  # not the function ``wordnet``: ``hiercls.taxonomy.wordnet`` is the module
    DEBIAN_WORDNET_DIR,
    LEXNAMES,
    WORDNET_ROOT_WNID,
    WordNetUnavailableError,
    is_wnid,
    noun_glosses,
    synset_to_wnid,
    wnid_to_synset,
    wordnet_available,
    wordnet_data_dir,
    wordnet_taxonomy,
)

__all__ = [
    *core.__all__,
    *imagenet.__all__,
    *io.__all__,
    *regions.__all__,
    *registry.__all__,
    "DEBIAN_WORDNET_DIR",
    "LEXNAMES",
    "WORDNET_ROOT_WNID",
    "WordNetUnavailableError",
    "is_wnid",
    "node_id_array",
    "noun_glosses",
    "synset_to_wnid",
    "wnid_to_synset",
    "wordnet_available",
    "wordnet_data_dir",
    "wordnet_taxonomy",
]
