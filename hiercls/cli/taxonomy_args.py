"""``hiercls taxonomy``: show, inspect, validate and convert taxonomies.

Examples::

    hiercls taxonomy list
    hiercls taxonomy show cifar100 --depth 2 --max-children 5
    hiercls taxonomy stats imagenet1k --json
    hiercls taxonomy convert rcv1.taxonomy rcv1.json.gz
    hiercls taxonomy validate my_tree.tsv
"""

from __future__ import annotations

import argparse

from hiercls.cli.names import TAXONOMY_FORMATS

HELP = "show, inspect, validate and convert taxonomies"


def _add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        "--from",
        dest="src_format",
        choices=TAXONOMY_FORMATS,
        default=None,
        help="input format (default: from the extension and content)",
    )
    p.add_argument(
        "--virtual-root", default=None, metavar="NAME", help="join several roots under a new root called NAME"
    )
    p.add_argument("--separator", default=None, help="label-path separator (format 'paths'; default '/')")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = sub.add_parser("show", help="tree view with per-node leaf counts")
    p.add_argument("taxonomy", help="a shipped name (see 'list') or a file / folder")
    p.add_argument("--depth", type=int, default=3, metavar="K", help="levels below the root to show (default 3)")
    p.add_argument(
        "--max-children",
        type=int,
        default=10,
        metavar="M",
        help="children shown per node before '... N more' (default 10)",
    )
    p.add_argument("--names", action="store_true", help="show node names next to display names")
    _add_read_options(p)

    p = sub.add_parser("stats", help="counts: nodes, leaves, height, nodes per depth, semantic levels...")
    p.add_argument("taxonomy")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _add_read_options(p)

    p = sub.add_parser("convert", help="convert between formats")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument(
        "--to",
        dest="dst_format",
        choices=TAXONOMY_FORMATS,
        default=None,
        help="output format (default: from the extension of DST)",
    )
    p.add_argument(
        "--tree",
        choices=("first", "shortest", "longest"),
        default=None,
        help="turn a DAG into a tree with this strategy before writing",
    )
    _add_read_options(p)

    p = sub.add_parser("validate", help="check a taxonomy file; exit 0 with a summary or 1 with the error")
    p.add_argument("taxonomy")
    _add_read_options(p)

    sub.add_parser("list", help="the shipped taxonomies")
