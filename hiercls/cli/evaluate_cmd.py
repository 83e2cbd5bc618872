"""``hiercls evaluate``: hierarchical metrics of a saved model, or of saved probabilities.

Examples::

    hiercls evaluate --model runs/quickstart                       # best checkpoint, the recipe's eval split
    hiercls evaluate --model runs/quickstart --data test --decoder argmax_leaf --decoder optimal_hf1 --out m.json
    hiercls evaluate --probs runs/x/eval_probs.npy --labels runs/x/eval_labels.npy --taxonomy imagenet1k_tree \\
        --decoder argmax_leaf --decoder optimal_hfbeta:beta=2                  # reports hF2 too
    hiercls evaluate --probs p.npy --labels y.npy --taxonomy tree.json --table --cost wu_palmer --out t.json

Both modes decode with the same decoder specs (``name`` or ``name:key=value,...``) and print the same metrics
as training (``hiercls.evaluation.Evaluator``). ``--table`` prints instead the decoder x metric table of Plaud et
al. (``hiercls.evaluation.decoder_metric_table``): every decoder (default: every rule, and each column's
Bayes-optimal one) under every metric, realised against the labels and expected under the model's posterior.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hiercls._textio import atomic_write, check_writable
from hiercls.decode import COST_KINDS, check_probabilities
from hiercls.evaluation import (
    DEFAULT_DECODERS,
    decoder_metric_table,
    evaluate_probabilities,
    evaluate_run,
    format_results,
    load_labels,
    load_probabilities,
)
from hiercls.taxonomy import load_taxonomy
from hiercls.train.config import apply_overrides, load_config
from hiercls.train.distributed import resolve_device
from hiercls.train.inference import load_trained_model

HELP = "hierarchical metrics for a saved model or saved probabilities"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1]
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="DIR", help="a run folder (uses checkpoints/best) or a saved model folder")
    src.add_argument("--probs", metavar="FILE", help="saved node probabilities (.npy, .npz, .pt)")
    parser.add_argument("--checkpoint", default="best", choices=["best", "last"], help="which checkpoint of a run")
    parser.add_argument("--recipe", metavar="YAML", help="recipe giving the data set (default: the run's config.yaml)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the recipe's config (e.g. data.options.root=...)",
    )
    parser.add_argument("--data", metavar="SPLIT", help="split to evaluate (default: the recipe's data.eval_split)")
    parser.add_argument(
        "--decoder",
        action="append",
        default=None,
        metavar="SPEC",
        help="decoder spec, e.g. optimal_hfbeta:beta=2 (repeatable; default: the recipe's "
        "eval.decoders, with --probs argmax_leaf and optimal_hfbeta; optimal_hf1 = beta 1)",
    )
    parser.add_argument(
        "--max-samples",
        type=int,
        default=None,
        help="evaluate a fixed subset of N samples (0 = all; default: the recipe's max_eval_samples)",
    )
    parser.add_argument("--batch-size", type=int, default=None, help="evaluation batch size")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<i>")
    parser.add_argument("--labels", metavar="FILE", help="with --probs: true labels (.npy node ids or a text file)")
    parser.add_argument("--taxonomy", metavar="NAME_OR_PATH", help="with --probs: the taxonomy")
    parser.add_argument("--leaf-probs", action="store_true", help="with --probs: the file holds leaf probabilities")
    parser.add_argument(
        "--table",
        action="store_true",
        help="with --probs: the decoder x metric table (realised and expected values, optimal decoders marked)",
    )
    parser.add_argument(
        "--cost", default="lca_height", choices=COST_KINDS, help="with --table: the cost of its 'cost' column"
    )
    parser.add_argument("--out", metavar="FILE.json", help="write the metrics as JSON")
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="with --probs: skip the probability checks (values in [0, 1], root 1, child <= parent, leaf sums 1)",
    )


def _evaluate_probs(args: argparse.Namespace) -> int:
    if not args.labels or not args.taxonomy:
        raise ValueError("--probs needs --labels FILE and --taxonomy NAME_OR_PATH")
    taxonomy = load_taxonomy(args.taxonomy)
    if args.table:
        probs = load_probabilities(args.probs)
        labels = load_labels(args.labels, taxonomy)
        if args.check:
            check_probabilities(probs, taxonomy, kind="leaf" if args.leaf_probs else "node", name=args.probs)
        table = decoder_metric_table(probs, labels, taxonomy, args.decoder, cost=args.cost, leaf_probs=args.leaf_probs)
        print(f"{args.probs}: {table.samples} samples ({int((labels < 0).sum())} ignored)")
        print(table.format())
        if args.out:
            with atomic_write(args.out, "w", encoding="utf-8") as f:
                f.write(json.dumps(table.to_dict(), indent=2))
            print(f"wrote {args.out}")
        return 0
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
    if args.out:
        with atomic_write(args.out, "w", encoding="utf-8") as f:
            f.write(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.out:
        check_writable(args.out)
    if args.probs:
        return _evaluate_probs(args)
    if args.table:
        raise ValueError("--table scores saved probabilities: use it with --probs FILE --labels FILE --taxonomy T")
    device = resolve_device(args.device)
    model, taxonomy, cfg = load_trained_model(args.model, which=args.checkpoint, device=device)
    if args.recipe:
        cfg = load_config(args.recipe)
    if cfg is None:
        raise ValueError(
            f"{args.model!r} is a bare model folder: give --recipe RECIPE.yaml to say which data set to evaluate on"
        )
    cfg = apply_overrides(cfg, args.overrides)
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
    if args.out:
        with atomic_write(args.out, "w", encoding="utf-8") as f:
            f.write(json.dumps(results, indent=2))
        print(f"wrote {args.out}")
    return 0
