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

from hiercls.cli.names import COST_KINDS

HELP = "hierarchical metrics for a saved model or saved probabilities"


def _sample_count(text: str) -> int:
    """``--max-samples``: a whole number >= 1, or 0 for every sample."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1 (or 0 for every sample); got {text!r}")
    return n


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
        type=_sample_count,
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
