"""``hiercls taxonomy``: the work, once the arguments parsed (:mod:`hiercls.cli.taxonomy_args`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from hiercls.taxonomy import Taxonomy, TaxonomyError, list_taxonomies, load_taxonomy, write_taxonomy


def _load(args: argparse.Namespace, spec: str) -> Taxonomy:
    kwargs: dict[str, Any] = {}
    if args.src_format:
        kwargs["format"] = args.src_format
    if args.virtual_root:
        kwargs["virtual_root"] = args.virtual_root
    if args.separator is not None:
        kwargs["separator"] = args.separator
    return load_taxonomy(spec, **kwargs)


def _summary(tax: Taxonomy) -> str:
    kind = "tree" if tax.is_tree else "DAG"
    leaves = _plural(tax.num_leaves, "leaf", "leaves")
    return (
        f"{tax.name}: {kind}, {tax.num_nodes} nodes, {leaves}, {len(tax.classes)} classes, "
        f"height {tax.height}, fingerprint {tax.fingerprint[:12]}"
    )


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def render_tree(tax: Taxonomy, *, depth: int = 3, max_children: int = 10, show_names: bool = False) -> list[str]:
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
    # Depth-first with an explicit stack of lines to print and (node, prefix, level) to expand: a deep chain shown
    # to any --depth is no RecursionError.
    stack: list[Any] = [(0, "", 0)] if depth > 0 else []
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            lines.append(item)
            continue
        n, prefix, level = item
        todo: list[Any] = []
        kids = list(tax.children(n))
        shown, hidden = kids[:max_children], kids[max_children:]
        for k, c in enumerate(shown):
            last = k == len(shown) - 1 and not hidden
            todo.append(prefix + ("└── " if last else "├── ") + label(c, n))
            inner = prefix + ("    " if last else "│   ")
            expand = primary[c] == n and not tax.is_leaf[c]
            if expand and level + 1 < depth:
                todo.append((c, inner, level + 1))
            elif expand:
                todo.append(inner + f"└── ... {_plural(len(tax.children(c)), 'child', 'children')}")
        if hidden:
            more_leaves = sum(int(leaves_under[c]) for c in hidden)
            todo.append(prefix + f"└── ... {len(hidden)} more ({_plural(more_leaves, 'leaf', 'leaves')})")
        stack.extend(reversed(todo))
    return lines


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run(args: argparse.Namespace) -> int:
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
