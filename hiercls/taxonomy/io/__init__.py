r"""Reading and writing taxonomies in the formats hierarchical-classification projects use, one module per format.

``json`` (hiercls, lossless) in ``hiercls_json``; ``edges`` and ``tsv`` (HiAGM) in ``edges``; ``nested`` and
``children`` JSON in ``nested``; ``nodelink`` (networkx) in ``node_link``; ``paths`` in ``paths``; ``folders``
in ``folders``. ``formats`` registers them (:data:`TAXONOMY_FORMATS`) behind :func:`read_taxonomy` /
:func:`write_taxonomy`; ``common`` holds what they share. Every text file may be gzip-compressed (``.gz``), and
readers raise :class:`TaxonomyError` naming the file, the line and the label at fault.

Example:
    >>> import tempfile, os
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("root", "car")], name="toy")
    >>> d = tempfile.mkdtemp()
    >>> write_taxonomy(tax, os.path.join(d, "toy.json.gz"))
    >>> read_taxonomy(os.path.join(d, "toy.json.gz")) == tax
    True
    >>> write_taxonomy(tax, os.path.join(d, "toy.tsv"))
    >>> open(os.path.join(d, "toy.tsv")).read().splitlines()
    ['root\tanimal\tcar', 'animal\tcat']
"""

from __future__ import annotations

from hiercls.taxonomy.io import edges, folders, formats, hiercls_json, nested, node_link, paths
from hiercls.taxonomy.io.common import check_names
from hiercls.taxonomy.io.edges import *  # noqa: F403
from hiercls.taxonomy.io.folders import *  # noqa: F403
from hiercls.taxonomy.io.formats import *  # noqa: F403
from hiercls.taxonomy.io.hiercls_json import *  # noqa: F403
from hiercls.taxonomy.io.nested import *  # noqa: F403
from hiercls.taxonomy.io.node_link import *  # noqa: F403
from hiercls.taxonomy.io.paths import *  # noqa: F403

__all__ = [
    "check_names",
    *edges.__all__,
    *folders.__all__,
    *formats.__all__,
    *hiercls_json.__all__,
    *nested.__all__,
    *node_link.__all__,
    *paths.__all__,
]
