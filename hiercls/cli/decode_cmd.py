"""``hiercls decode``: the work, once the arguments parsed (:mod:`hiercls.cli.decode_args`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hiercls._textio import atomic_write, check_writable
from hiercls.decode import RULES, DecoderSpec, check_probabilities, parse_decoder, probabilities_named, rule_options
from hiercls.evaluation import Evaluator, format_results, load_labels, load_probabilities
from hiercls.taxonomy.registry import load_taxonomy


def _specs(args: argparse.Namespace, is_tree: bool) -> list[DecoderSpec]:
    """The decoder specs of ``--rule``, with the option flags filled in where the spec leaves them open."""
    names = args.rule or ["argmax_leaf"]
    if "all" in names:
        names = [r for r in RULES if not (r == "hie" and not is_tree)]
    flags = {
        "beta": args.beta,
        "cost": args.cost,
        "threshold": args.threshold,
        "lam": args.lam,
        "include_root": args.include_root or None,
    }
    specs = []
    for name in names:
        spec = parse_decoder(name)
        extra = {
            k: v for k, v in flags.items() if v is not None and k in rule_options(spec.rule) and k not in spec.options
        }
        specs.append(parse_decoder(spec, **extra))
    return specs


def run(args: argparse.Namespace) -> int:
    if args.out:
        check_writable(args.out)
    tax = load_taxonomy(args.taxonomy)
    probs = load_probabilities(args.probs, key=args.key)
    labels = load_labels(args.labels, tax) if args.labels else None
    if labels is not None and len(labels) != probs.shape[0]:
        raise ValueError(f"{args.labels}: {len(labels)} labels for {probs.shape[0]} rows of {args.probs}")
    if args.rule and "all" in args.rule and labels is None:
        raise ValueError("--rule all compares rules on labelled data: pass --labels")
    if labels is not None and not (labels >= 0).any():
        raise ValueError(f"{args.labels}: every one of the {len(labels)} labels is -1 (ignored): nothing to score")
    specs = _specs(args, tax.is_tree)
    if args.check:  # up front, so that the message names the file
        check_probabilities(probs, tax, kind="leaf" if args.leaf_probs else "node", name=str(args.probs))

    payload: dict[str, Any] = {
        "taxonomy": tax.name,
        "fingerprint": tax.fingerprint,
        "probs": str(args.probs),
        "rules": {},
    }
    if labels is not None:
        evaluator = Evaluator(
            tax,
            specs,
            betas=() if args.beta is None else (args.beta,),
            leaf_probs=args.leaf_probs,
            check=args.check,
            sync_on_compute=False,
        )
        with probabilities_named(str(args.probs)):
            preds = evaluator.update(probs, labels)
    else:
        with probabilities_named(str(args.probs)):
            preds = {s.label: np.asarray(s(probs, tax, leaf_probs=args.leaf_probs, check=args.check)) for s in specs}
    names = tax.names
    for spec in specs:
        pred = preds[spec.label]
        if spec.is_set:
            rows = [np.flatnonzero(s) for s in pred]
            out = [{"ids": r.tolist(), "names": [names[i] for i in r]} for r in rows]
            sizes = [len(r) - 1 for r in rows]
            summary = (
                f"{spec.label}: {len(rows)} node sets, mean size {np.mean(sizes) if sizes else 0:.2f} (root excluded)"
            )
        else:
            out = [{"id": int(i), "name": names[int(i)]} for i in pred]
            depth = tax.depth[pred] if len(pred) else np.zeros(0)
            summary = f"{spec.label}: {len(pred)} predictions, mean depth {depth.mean() if len(depth) else 0:.2f}"
        payload["rules"][spec.label] = {"rule": spec.rule, "options": spec.options, "predictions": out}
        if labels is None:
            print(summary)
            for row in out[:10]:
                print("  " + (", ".join(row["names"]) if "names" in row else row["name"]))
            if len(out) > 10:
                print(f"  ... {len(out) - 10} more")
    if labels is not None:
        metrics = {"samples": int((labels >= 0).sum()), "ignored": int((labels < 0).sum()), **evaluator.compute()}
        payload["metrics"] = metrics
        print(format_results({Path(args.probs).name: metrics}, name="probs"))
    if args.out:
        with atomic_write(args.out, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1, allow_nan=True)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0
