"""The names the argument parsers offer, held here so that parsing imports no heavy package.

The packages that own these names (``hiercls.decode``, ``hiercls.taxonomy``, the prediction writer) import torch,
which takes seconds; ``hiercls <command> --help`` and an argument error must answer at once. Each tuple equals its
owner's list, in the owner's order: ``tests/test_taxonomy_cli.py`` compares them and names what to add here when a
decoder, a cost or a format is added there.
"""

from __future__ import annotations

__all__ = ["CONFORMAL_LOSSES", "COST_KINDS", "PREDICTION_FORMATS", "RULES", "TAXONOMY_FORMATS"]

#: The decoder rules, sorted (:data:`hiercls.decode.RULES`).
RULES = (
    "argmax_leaf",
    "bayes_node",
    "chmcnn",
    "crm",
    "hie",
    "info_gain",
    "majority",
    "max_info",
    "optimal_hfbeta",
    "plurality",
    "threshold",
    "threshold_set",
    "top_down",
)
#: The costs of ``bayes_node`` / ``crm`` (:data:`hiercls.decode.COST_KINDS`).
COST_KINDS = ("shortest_path", "lca_height", "wu_palmer", "wu_palmer_root1", "zhao", "ic_distance", "jiang_conrath")
#: The taxonomy file formats (:data:`hiercls.taxonomy.FORMATS`).
TAXONOMY_FORMATS = ("json", "edges", "tsv", "children", "nested", "nodelink", "paths", "folders")
#: The suffixes ``hiercls predict --out`` writes (``PREDICTION_FORMATS`` of the prediction writer).
PREDICTION_FORMATS = (".json", ".jsonl", ".csv")
#: The losses of ``evaluate --conformal-loss`` (:data:`hiercls.conformal.RISK_LOSSES`; tests/test_conformal.py).
CONFORMAL_LOSSES = ("overshoot", "distance", "miscoverage")
