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

from hiercls.taxonomy.io.common import check_names
from hiercls.taxonomy.io.edges import read_edge_list, read_tsv, write_edge_list, write_tsv
from hiercls.taxonomy.io.folders import read_folders, write_folders
from hiercls.taxonomy.io.formats import (
    FORMATS,
    TAXONOMY_FORMATS,
    TaxonomyFormat,
    detect_format,
    read_taxonomy,
    write_taxonomy,
)
from hiercls.taxonomy.io.hiercls_json import (
    JSON_FORMAT_ID,
    JSON_FORMAT_VERSION,
    read_json,
    taxonomy_from_dict,
    taxonomy_to_dict,
    write_json,
)
from hiercls.taxonomy.io.nested import (
    read_children_json,
    read_nested_json,
    taxonomy_from_nested,
    taxonomy_to_nested,
    write_children_json,
    write_nested_json,
)
from hiercls.taxonomy.io.node_link import (
    read_node_link,
    taxonomy_from_node_link,
    taxonomy_to_node_link,
    write_node_link,
)
from hiercls.taxonomy.io.paths import label_paths, read_label_paths, taxonomy_from_label_paths, write_label_paths

__all__ = [
    "FORMATS",
    "JSON_FORMAT_ID",
    "JSON_FORMAT_VERSION",
    "TAXONOMY_FORMATS",
    "TaxonomyFormat",
    "check_names",
    "detect_format",
    "label_paths",
    "read_children_json",
    "read_edge_list",
    "read_folders",
    "read_json",
    "read_label_paths",
    "read_nested_json",
    "read_node_link",
    "read_taxonomy",
    "read_tsv",
    "taxonomy_from_dict",
    "taxonomy_from_label_paths",
    "taxonomy_from_nested",
    "taxonomy_from_node_link",
    "taxonomy_to_dict",
    "taxonomy_to_nested",
    "taxonomy_to_node_link",
    "write_children_json",
    "write_edge_list",
    "write_folders",
    "write_json",
    "write_label_paths",
    "write_nested_json",
    "write_node_link",
    "write_taxonomy",
    "write_tsv",
]
