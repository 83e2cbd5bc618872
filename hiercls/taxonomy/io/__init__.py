r"""Reading and writing taxonomies in the formats hierarchical-classification projects use, one module per format.

Formats (``format=`` names for :func:`read_taxonomy` / :func:`write_taxonomy`):

* ``"json"``: the hiercls format (lossless: node order, display names, classes, virtual root, metadata).
* ``"edges"``: an edge list, one ``parent<TAB|comma|spaces>child`` per line, ``#`` comments.
* ``"tsv"``: HiAGM-style ``parent<TAB>child1<TAB>child2...`` lines (HiAGM names its root ``Root``).
* ``"children"``: a JSON ``{parent: [children]}`` mapping (:meth:`Taxonomy.from_children`).
* ``"nested"``: a nested JSON object ``{"root": {"a": {"x": {}}, "b": ["leaf1", "leaf2"]}}``.
* ``"nodelink"``: networkx node-link JSON (``networkx.node_link_data(g, edges="edges")``, or ``"links"``).
* ``"paths"``: label paths such as ``Science/Physics/Optics``, one per line (or a JSON list of paths).
* ``"folders"``: a directory tree (an ``ImageFolder``-style dataset): the folders are the nodes.

Every text file may be gzip-compressed (``.gz``). Readers raise :class:`TaxonomyError` naming the file,
the line and the label at fault. A new format is one module here with its reader and writer, registered in
:data:`TAXONOMY_FORMATS` (``formats.py``).

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
