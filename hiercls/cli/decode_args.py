"""``hiercls decode``: decode saved node probabilities with a (metric-optimal) rule.

Examples::

    hiercls decode --probs val_probs.npy --taxonomy imagenet1k_tree --rule crm --out preds.json
    hiercls decode --probs p.pt --taxonomy tree.tsv --labels val.txt --rule optimal_hfbeta:beta=2 --out s.json
    hiercls decode --probs p.pt --taxonomy tree.tsv --labels val.txt --rule optimal_hfbeta --beta 2
    hiercls decode --probs p.npy --taxonomy tree.json --labels y.npy --rule all --out report.json

A rule is a decoder spec (``name`` or ``name:key=value,...``, see ``hiercls.decode.parse_decoder``); the
flags ``--beta``, ``--cost``, ``--threshold``, ``--lam`` and ``--include-root`` fill in the options of the rules
that take them. With ``--labels`` the metrics table of ``hiercls evaluate`` is printed (``--beta`` also adds
its hF-beta for every rule); ``--out`` gets JSON with the predicted node per sample (``{"id", "name"}``) or
node set (``{"ids", "names"}``) and the metrics.
"""

from __future__ import annotations

import argparse

from hiercls.cli.names import COST_KINDS, RULES

HELP = "decode saved node probabilities with a metric-optimal rule"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1]
    parser.add_argument("--probs", required=True, metavar="FILE", help="saved probabilities (.npy, .npz or .pt)")
    parser.add_argument("--key", default=None, help="array name inside an .npz / .pt dict")
    parser.add_argument(
        "--taxonomy", required=True, metavar="NAME_OR_PATH", help="a shipped taxonomy name or a taxonomy file"
    )
    parser.add_argument(
        "--leaf-probs",
        action="store_true",
        help="the file holds leaf probabilities [B, num_leaves] (default: node probabilities)",
    )
    parser.add_argument(
        "--labels",
        default=None,
        metavar="FILE",
        help="true labels: .npy node ids, or a text/CSV file of node names or label paths",
    )
    parser.add_argument(
        "--rule",
        action="append",
        default=None,
        metavar="SPEC",
        help=f"decoder spec, repeatable (default argmax_leaf; rules: {', '.join(RULES)}; "
        "'all' scores every rule, needs --labels)",
    )
    parser.add_argument(
        "--beta",
        type=float,
        default=None,
        help="beta of optimal_hfbeta (default 1), also reported as hF<beta> for every rule",
    )
    parser.add_argument(
        "--cost",
        default=None,
        choices=COST_KINDS,
        help="cost for bayes_node (default shortest_path) and crm (default lca_height)",
    )
    parser.add_argument(
        "--threshold", type=float, default=None, help="threshold for the threshold / max_info / top_down rules"
    )
    parser.add_argument("--lam", type=float, default=None, help="Lagrange multiplier of info_gain (default 0)")
    parser.add_argument("--include-root", action="store_true", help="optimal_hfbeta: count the root in every set")
    parser.add_argument("--out", default=None, metavar="FILE.json", help="write predictions and metrics as JSON")
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="skip the probability checks (values in [0, 1], root 1, child <= parent, leaf rows summing to 1)",
    )
