"""``hiercls decode``: decode saved node probabilities with a (metric-optimal) rule.

Examples::

    hiercls decode --probs val_probs.npy --taxonomy imagenet1k_tree --rule crm --out preds.json
    hiercls decode --probs p.pt --taxonomy tree.tsv --labels val.txt --rule optimal_hfbeta --beta 2 --out s.json
    hiercls decode --probs p.npy --taxonomy tree.json --labels y.npy --rule all --out report.json

The table goes to stdout (with metrics when ``--labels`` is given); ``--out`` gets JSON with the predicted
node per sample (``{"id", "name"}``) or node set (``{"ids", "names"}``) and the metrics.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "decode saved node probabilities with a metric-optimal rule"

_COSTS = ("shortest_path", "lca_height", "wu_palmer", "zhao")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hiercls.decode import RULES

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1]
    parser.add_argument("--probs", required=True, metavar="FILE", help="saved probabilities (.npy, .npz or .pt)")
    parser.add_argument("--key", default=None, help="array name inside an .npz / .pt dict")
    parser.add_argument("--taxonomy", required=True, metavar="NAME_OR_PATH",
                        help="a shipped taxonomy name or a taxonomy file")
    parser.add_argument("--leaf-probs", action="store_true",
                        help="the file holds leaf probabilities [B, num_leaves] (default: node probabilities)")
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="true labels: .npy node ids, or a text/CSV file of node names or label paths")
    parser.add_argument("--rule", default="argmax_leaf", choices=[*RULES, "all"],
                        help="decision rule (default argmax_leaf; 'all' scores every rule, needs --labels)")
    parser.add_argument("--beta", type=float, default=1.0, help="F-beta weight for optimal_hfbeta and hF (default 1)")
    parser.add_argument("--cost", default=None, choices=_COSTS,
                        help="cost for bayes_node (default shortest_path) and crm (default lca_height)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="threshold for the threshold / max_info / top_down rules")
    parser.add_argument("--lam", type=float, default=None, help="Lagrange multiplier of info_gain (default 0)")
    parser.add_argument("--include-root", action="store_true",
                        help="optimal_hfbeta: count the root in every set")
    parser.add_argument("--out", default=None, metavar="FILE.json", help="write predictions and metrics as JSON")


def _rule_options(rule: str, args: argparse.Namespace) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if rule == "optimal_hfbeta":
        opts["beta"] = args.beta
        opts["include_root"] = args.include_root
    if rule in ("bayes_node", "crm") and args.cost:
        opts["cost"] = args.cost
    if rule in ("threshold", "max_info", "top_down") and args.threshold is not None:
        opts["threshold"] = args.threshold
    if rule == "info_gain" and args.lam is not None:
        opts["lam"] = args.lam
    return opts


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from hiercls.decode import RULES, SET_RULES, decode
    from hiercls.decode.saved import format_table, load_labels, load_probabilities, score_predictions
    from hiercls.taxonomy.registry import load_taxonomy

    tax = load_taxonomy(args.taxonomy)
    probs = load_probabilities(args.probs, key=args.key)
    labels = load_labels(args.labels, tax) if args.labels else None
    if labels is not None and len(labels) != probs.shape[0]:
        raise ValueError(f"{args.labels}: {len(labels)} labels for {probs.shape[0]} rows of {args.probs}")
    rules = [r for r in RULES if not (r == "hie" and not tax.is_tree)] if args.rule == "all" else [args.rule]
    if args.rule == "all" and labels is None:
        raise ValueError("--rule all compares rules on labelled data: pass --labels")

    payload: dict[str, Any] = {"taxonomy": tax.name, "fingerprint": tax.fingerprint, "probs": str(args.probs),
                               "rules": {}}
    names = tax.names
    metrics: dict[str, Any] = {}
    for rule in rules:
        opts = _rule_options(rule, args)
        pred = np.asarray(decode(probs, tax, rule, leaf_probs=args.leaf_probs, **opts))
        if labels is not None:
            metrics[rule] = {**score_predictions(pred, labels, tax, beta=args.beta),
                             "kind": "set" if rule in SET_RULES else "node"}
        if rule in SET_RULES:
            rows = [np.flatnonzero(s) for s in pred]
            out = [{"ids": r.tolist(), "names": [names[i] for i in r]} for r in rows]
            sizes = [len(r) - 1 for r in rows]
            summary = f"{rule}: {len(rows)} node sets, mean size {np.mean(sizes) if sizes else 0:.2f} (root excluded)"
        else:
            out = [{"id": int(i), "name": names[int(i)]} for i in pred]
            depth = tax.depth[pred] if len(pred) else np.zeros(0)
            summary = f"{rule}: {len(pred)} predictions, mean depth {depth.mean() if len(depth) else 0:.2f}"
        payload["rules"][rule] = {"options": opts, "predictions": out}
        if labels is None:
            print(summary)
            for row in out[:10]:
                print("  " + (", ".join(row["names"]) if "names" in row else row["name"]))
            if len(out) > 10:
                print(f"  ... {len(out) - 10} more")
    if labels is not None:
        payload["metrics"] = metrics
        payload["samples"], payload["ignored"] = int((labels >= 0).sum()), int((labels < 0).sum())
        print(format_table({"rules": metrics}))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1, allow_nan=True)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
