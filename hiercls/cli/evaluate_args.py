"""``hiercls evaluate``: hierarchical metrics of a saved model, or of saved probabilities.

Examples::

    hiercls evaluate --model runs/quickstart                       # a study: its best run, the recipe's eval split
    hiercls evaluate --model runs/quickstart --data test --decoder argmax_leaf --decoder optimal_hf1 --out m.json
    hiercls evaluate --model runs/quickstart/runs/flat-seed0 --data test --table    # the model's probabilities
    hiercls evaluate --probs runs/x/eval_probs.npy --labels runs/x/eval_labels.npy --taxonomy imagenet1k_tree \\
        --decoder argmax_leaf --decoder optimal_hfbeta:beta=2                  # reports hF2 too
    hiercls evaluate --probs p.npy --labels y.npy --taxonomy tree.json --table --cost wu_palmer --out t.json
    hiercls evaluate --probs p.npy --labels y.npy --taxonomy tree.json --conformal 0.1 --calibration-split 0.5
    hiercls evaluate --model runs/quickstart --conformal 0.1 --calibration-data val --data test

``--model`` takes a run folder (its best checkpoint), a study folder (the folder of a recipe with ``study.seeds``,
e.g. runs/quickstart: its best run on the validation split, named on stderr) or a saved model folder. Both modes
decode with the same decoder specs (``name`` or ``name:key=value,...``) and print the same metrics as training
(``hiercls.evaluation.Evaluator``). ``--table`` prints instead the decoder x metric table of Plaud et al.
(``hiercls.evaluation.decoder_metric_table``): every decoder (default: every rule, and each column's Bayes-optimal
one) under every metric, realised against the labels and expected under the model's posterior; with ``--model``
the probabilities are the model's on the split, computed on the spot (``eval.save_probs: true`` in a recipe also
saves the eval split's as eval_probs.npy / eval_labels.npy for ``--probs``).
``--conformal ALPHA`` calibrates the conformal predictors of ``hiercls.conformal`` on part of the rows
(``--calibration-split``: a fraction, or a file of row indices) and prints their coverage, mean set size and mean
depth on the other rows (with ``--table``, the table is computed on those rows and gains the conformal rows).
"""

from __future__ import annotations

import argparse

from hiercls.cli.names import CONFORMAL_LOSSES, COST_KINDS

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
    src.add_argument(
        "--model",
        metavar="DIR",
        help="a run folder (uses checkpoints/best), a study folder (its best run) or a saved model folder",
    )
    src.add_argument("--probs", metavar="FILE", help="saved node probabilities (.npy, .npz, .pt)")
    parser.add_argument("--checkpoint", default="best", choices=["best", "last"], help="which checkpoint of a run")
    parser.add_argument(
        "--trust-edits",
        action="store_true",
        help="load a model folder whose files were edited since it was saved (a warning names them); without it "
        "such a folder is refused",
    )
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
        help="the decoder x metric table (realised and expected values, optimal decoders marked) of --probs, "
        "or of --model's probabilities on the split",
    )
    parser.add_argument(
        "--cost", default="lca_height", choices=COST_KINDS, help="with --table: the cost of its 'cost' column"
    )
    add_conformal_arguments(parser)
    parser.add_argument("--out", metavar="FILE.json", help="write the metrics as JSON")
    parser.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="with --probs: skip the probability checks (values in [0, 1], root 1, child <= parent, leaf sums 1)",
    )


def add_conformal_arguments(parser: argparse.ArgumentParser) -> None:
    """``--conformal`` and its options (``hiercls.conformal``; with ``--probs``)."""
    parser.add_argument(
        "--conformal",
        type=float,
        default=None,
        metavar="ALPHA",
        help="with --probs: calibrate conformal predictors for miscoverage ALPHA (e.g. 0.1) and report their "
        "coverage, mean set size and mean depth on the rows not used to calibrate",
    )
    parser.add_argument(
        "--calibration-split",
        default="0.5",
        metavar="FRACTION_OR_FILE",
        help="with --conformal: the calibration rows, a random fraction (default 0.5, --calibration-seed) or a file "
        "of row indices (.npy, or text with one index per line); the other rows are the test rows",
    )
    parser.add_argument(
        "--calibration-data",
        metavar="SPLIT",
        help="with --model and --conformal: the split that calibrates (default: the recipe's data.eval_split); "
        "--data is the split that checks (default: test); the calibration is stored in <model>/conformal.json",
    )
    parser.add_argument("--calibration-seed", type=int, default=0, help="with --conformal: seed of the random split")
    parser.add_argument("--conformal-r", type=int, default=2, help="with --conformal: most nodes per set (method set)")
    parser.add_argument(
        "--conformal-loss",
        default="overshoot",
        choices=CONFORMAL_LOSSES,
        help="with --conformal: the loss whose risk the risk method controls",
    )
