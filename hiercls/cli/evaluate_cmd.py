"""``hiercls evaluate``: the work, once the arguments parsed (:mod:`hiercls.cli.evaluate_args`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hiercls._textio import atomic_write, check_writable
from hiercls.conformal import save_conformal
from hiercls.decode import check_probabilities
from hiercls.evaluation import (
    DEFAULT_DECODERS,
    decoder_metric_table,
    evaluate_model,
    evaluate_probabilities,
    evaluate_run,
    format_results,
    load_labels,
    load_probabilities,
    run_probabilities,
)
from hiercls.evaluation.model import split_loader
from hiercls.evaluation.table import conformal_rows
from hiercls.models.inference import study_best_run
from hiercls.taxonomy import Taxonomy, load_taxonomy
from hiercls.train.config import apply_overrides, load_config
from hiercls.train.distributed import resolve_device
from hiercls.train.inference import load_trained_model


def _print_table(args: argparse.Namespace, probs: Any, labels: Any, taxonomy: Taxonomy, source: str) -> int:
    """The decoder x metric table of probabilities and labels (``--table``), printed and written to ``--out``."""
    table = decoder_metric_table(probs, labels, taxonomy, args.decoder, cost=args.cost, leaf_probs=args.leaf_probs)
    print(f"{source}: {table.samples} samples ({int((np.asarray(labels) < 0).sum())} ignored)")
    print(table.format())
    _write_json(args.out, table.to_dict())
    return 0


def _write_json(out: str | None, data: Any) -> None:
    if out:
        with atomic_write(out, "w", encoding="utf-8") as f:
            f.write(json.dumps(data, indent=2))
        print(f"wrote {out}")


def _evaluate_probs(args: argparse.Namespace) -> int:
    if not args.labels or not args.taxonomy:
        raise ValueError("--probs needs --labels FILE and --taxonomy NAME_OR_PATH")
    taxonomy = load_taxonomy(args.taxonomy)
    if args.conformal is not None:
        return _evaluate_conformal(args, taxonomy)
    if args.table:
        probs = load_probabilities(args.probs)
        labels = load_labels(args.labels, taxonomy)
        if args.check:
            check_probabilities(probs, taxonomy, kind="leaf" if args.leaf_probs else "node", name=args.probs)
        return _print_table(args, probs, labels, taxonomy, args.probs)
    results = evaluate_probabilities(
        args.probs,
        args.labels,
        taxonomy,
        args.decoder or DEFAULT_DECODERS,
        leaf_probs=args.leaf_probs,
        check=args.check,
    )
    print(f"{args.probs}: {results['samples']} samples ({results['ignored']} ignored)")
    print(format_results({Path(args.probs).name: results}, name="probs"))
    _write_json(args.out, results)
    return 0


def _evaluate_conformal(args: argparse.Namespace, taxonomy: Taxonomy) -> int:
    """``--conformal``: calibrate on the calibration rows, report on the others (and the table on them)."""
    probs = load_probabilities(args.probs)
    labels = load_labels(args.labels, taxonomy)
    if args.check:
        check_probabilities(probs, taxonomy, kind="leaf" if args.leaf_probs else "node", name=args.probs)
    rows, test = conformal_rows(
        probs,
        labels,
        taxonomy,
        args.conformal,
        calibration=args.calibration_split,
        r=args.conformal_r,
        loss=args.conformal_loss,
        seed=args.calibration_seed,
        leaf_probs=args.leaf_probs,
    )
    print(f"{args.probs}: {len(labels)} samples ({int((labels < 0).sum())} ignored)")
    out = {"conformal": rows.to_dict()}
    if args.table:
        kept = labels >= 0
        table = decoder_metric_table(
            probs[kept][test], labels[kept][test], taxonomy, args.decoder, cost=args.cost, leaf_probs=args.leaf_probs
        )
        table.conformal = rows
        print(table.format())
        out = table.to_dict()
    else:
        print(rows.format())
    if args.out:
        with atomic_write(args.out, "w", encoding="utf-8") as f:
            f.write(json.dumps(out, indent=2))
        print(f"wrote {args.out}")
    return 0


def _split_probs(args: argparse.Namespace, model: Any, taxonomy: Taxonomy, cfg: Any, split: str, device: Any) -> Any:
    """Node probabilities and labels of the labelled samples of one split of the recipe's data set."""
    limit = cfg.data.max_eval_samples if args.max_samples is None else (args.max_samples or None)
    _, loader = split_loader(model, taxonomy, cfg, split, limit, args.batch_size)
    _, probs, labels = evaluate_model(model, loader, taxonomy, ["argmax_leaf"], device=device, keep_probs=True)
    return probs[labels >= 0], labels[labels >= 0]


def _evaluate_model_conformal(args: argparse.Namespace, model: Any, taxonomy: Taxonomy, cfg: Any, device: Any) -> int:
    """``--model --conformal``: calibrate on one split, check on another, store the calibration in the model folder."""
    cal_split, test_split = args.calibration_data or cfg.data.eval_split or "val", args.data or "test"
    if cal_split == test_split:
        raise ValueError(
            f"--conformal: the calibration split and the checked split are both {cal_split!r}; "
            "give --calibration-data SPLIT and --data SPLIT"
        )
    cal_p, cal_y = _split_probs(args, model, taxonomy, cfg, cal_split, device)
    test_p, test_y = _split_probs(args, model, taxonomy, cfg, test_split, device)
    rows, _ = conformal_rows(
        np.concatenate([cal_p, test_p]),
        np.concatenate([cal_y, test_y]),
        taxonomy,
        args.conformal,
        calibration=np.arange(len(cal_y)),
        r=args.conformal_r,
        loss=args.conformal_loss,
    )
    print(f"{args.model}: calibrated on split {cal_split!r}, checked on split {test_split!r}")
    print(rows.format())
    stored = Path(args.model) / "conformal.json"
    save_conformal(stored, list(rows.calibrators.values()))
    print(f"wrote {stored}")
    if args.out:
        with atomic_write(args.out, "w", encoding="utf-8") as f:
            f.write(json.dumps({"conformal": rows.to_dict(), "splits": [cal_split, test_split]}, indent=2))
        print(f"wrote {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.out:
        check_writable(args.out)
    if args.probs:
        return _evaluate_probs(args)
    if args.leaf_probs or args.labels or args.taxonomy:
        raise ValueError("--leaf-probs, --labels and --taxonomy go with --probs; --model brings its own")
    best = study_best_run(args.model)  # a study folder stands for its best run: say which
    if best is not None:
        print(best[1], file=sys.stderr)
    device = resolve_device(args.device)
    model, taxonomy, cfg = load_trained_model(
        best[0] if best else args.model, which=args.checkpoint, device=device, trust_edits=args.trust_edits
    )
    if args.recipe:
        cfg = load_config(args.recipe)
    if cfg is None:
        raise ValueError(
            f"{args.model!r} is a bare model folder: give --recipe RECIPE.yaml to say which data set to evaluate on"
        )
    cfg = apply_overrides(cfg, args.overrides)
    if args.conformal is not None:
        return _evaluate_model_conformal(args, model, taxonomy, cfg, device)
    if args.table:
        probs, labels, split = run_probabilities(
            model,
            taxonomy,
            cfg,
            split=args.data,
            max_samples=args.max_samples,
            batch_size=args.batch_size,
            device=device,
        )
        return _print_table(args, probs, labels, taxonomy, f"{args.model} (split {split!r})")
    results = evaluate_run(
        model,
        taxonomy,
        cfg,
        split=args.data,
        decoders=args.decoder,
        max_samples=args.max_samples,
        batch_size=args.batch_size,
        device=device,
    )
    head = getattr(model, "head_name", cfg.model.head)
    print(f"{args.model}: {results['samples']} samples of split {results['split']!r}")
    print(format_results({head: results}))
    _write_json(args.out, results)
    return 0
