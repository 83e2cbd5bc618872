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
import json
import sys
from typing import Any

HELP = "show, inspect, validate and convert taxonomies"

_FORMATS = ("json", "edges", "tsv", "nested", "nodelink", "paths", "folders")


def _add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        "--from",
        dest="src_format",
        choices=_FORMATS,
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
        choices=_FORMATS,
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


def _load(args: argparse.Namespace, spec: str) -> Any:
    from hiercls.taxonomy import load_taxonomy

    kwargs: dict[str, Any] = {}
    if args.src_format:
        kwargs["format"] = args.src_format
    if args.virtual_root:
        kwargs["virtual_root"] = args.virtual_root
    if args.separator is not None:
        kwargs["separator"] = args.separator
    return load_taxonomy(spec, **kwargs)


def _summary(tax: Any) -> str:
    kind = "tree" if tax.is_tree else "DAG"
    leaves = _plural(tax.num_leaves, "leaf", "leaves")
    return (
        f"{tax.name}: {kind}, {tax.num_nodes} nodes, {leaves}, {len(tax.classes)} classes, "
        f"height {tax.height}, fingerprint {tax.fingerprint[:12]}"
    )


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def render_tree(tax: Any, *, depth: int = 3, max_children: int = 10, show_names: bool = False) -> list[str]:
    """Lines of a tree view: each node with its leaf count; DAG nodes are expanded under their first parent.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> print("\\n".join(render_tree(tax)))
        r  (3 leaves)
        ├── a  (2 leaves)
        │   ├── x
        │   └── y
        └── b
    """
    if depth < 0 or max_children < 1:
        raise ValueError("--depth must be >= 0 and --max-children >= 1")
    leaves_under = tax.num_leaves_under
    primary = tax.primary_parent

    def label(n: int, parent: int | None) -> str:
        text = tax.display_names[n]
        if show_names and tax.names[n] != text:
            text += f" [{tax.names[n]}]"
        if not tax.is_leaf[n]:
            text += f"  ({_plural(int(leaves_under[n]), 'leaf', 'leaves')})"
        if parent is not None and primary[n] != parent:
            text += f"  (also under {tax.display_names[primary[n]]!r}, expanded there)"
        return text

    lines = [label(0, None)]

    def walk(n: int, prefix: str, level: int) -> None:
        kids = list(tax.children(n))
        shown = kids[:max_children]
        hidden = kids[max_children:]
        for k, c in enumerate(shown):
            last = k == len(shown) - 1 and not hidden
            lines.append(prefix + ("└── " if last else "├── ") + label(c, n))
            expand = primary[c] == n and not tax.is_leaf[c]
            if expand and level + 1 < depth:
                walk(c, prefix + ("    " if last else "│   "), level + 1)
            elif expand and tax.children(c):
                more = _plural(len(tax.children(c)), "child", "children")
                lines.append(prefix + ("    " if last else "│   ") + f"└── ... {more}")
        if hidden:
            more_leaves = sum(int(leaves_under[c]) for c in hidden)
            lines.append(prefix + f"└── ... {len(hidden)} more ({_plural(more_leaves, 'leaf', 'leaves')})")

    if depth > 0:
        walk(0, "", 0)
    return lines


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
    from hiercls.taxonomy import TaxonomyError, list_taxonomies, write_taxonomy

    out = sys.stdout
    if args.action == "list":
        entries = list_taxonomies()
        if not entries:
            print("no shipped taxonomies found", file=out)
            return 0
        rows = [["name", "kind", "nodes", "leaves", "description"]]
        rows += [
            [e["name"], str(e.get("kind", "")), str(e["nodes"]), str(e.get("leaves", "")), e["description"]]
            for e in entries
        ]
        print(_table(rows), file=out)
        return 0
    if args.action == "validate":
        try:
            tax = _load(args, args.taxonomy)
        except (TaxonomyError, FileNotFoundError, ValueError) as err:
            print(f"INVALID {args.taxonomy}: {err}", file=sys.stderr)
            return 1
        print(f"OK {args.taxonomy}: {_summary(tax)}", file=out)
        return 0
    if args.action == "show":
        tax = _load(args, args.taxonomy)
        print(_summary(tax), file=out)
        print(
            "\n".join(render_tree(tax, depth=args.depth, max_children=args.max_children, show_names=args.names)),
            file=out,
        )
        return 0
    if args.action == "stats":
        stats = _load(args, args.taxonomy).stats()
        if args.json:
            print(json.dumps(stats, indent=2), file=out)
        else:
            print(
                _table([[k, json.dumps(v) if isinstance(v, list | dict) else str(v)] for k, v in stats.items()]),
                file=out,
            )
        return 0
    if args.action == "convert":
        tax = _load(args, args.src)
        if args.tree:
            tax = tax.to_tree(args.tree)
        write_taxonomy(tax, args.dst, format=args.dst_format)
        print(f"wrote {args.dst}: {_summary(tax)}", file=out)
        return 0
    raise ValueError(f"unknown action {args.action!r}")
