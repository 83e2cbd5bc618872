"""``hiercls predict``: predictions of a saved model on new inputs (texts, files of texts, images, folders).

Examples::

    hiercls predict --model runs/quickstart "a small domesticated feline" "a vehicle with two wheels"   # best run
    hiercls predict --model runs/quickstart sentences.txt --decoder optimal_hf1 --out preds.jsonl
    hiercls predict --model runs/quickstart reviews.csv --text-column body --out preds.csv
    hiercls predict --model runs/fashion_mnist_efficientnet photos/ --out preds.csv
    hiercls predict --model runs/fashion_mnist_efficientnet shoe.png shirt.jpg --top-k 3
    hiercls predict --model runs/quickstart sentences.txt --conformal set   # after evaluate --model ... --conformal
"""

from __future__ import annotations

import argparse

from hiercls.cli.names import PREDICTION_FORMATS

HELP = "predictions of a saved model on new inputs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1]
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="a run folder, a study folder (its best run, named on stderr) or a saved model folder",
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        help="texts, .txt files (one text per line), .csv/.jsonl files (see --text-column), image files or folders; "
        "every prediction carries its row id (file:line, the image path, or arg:k for the k-th text argument)",
    )
    parser.add_argument("--text-column", default="text", help="column/key of the texts in .csv/.jsonl inputs")
    parser.add_argument(
        "--on-error",
        choices=("fail", "skip"),
        default="fail",
        help="a .csv/.jsonl row without a usable text (a short row, an empty text): stop naming it (default), or "
        "skip it and report its row",
    )
    parser.add_argument("--checkpoint", default="best", choices=["best", "last"], help="which checkpoint of a run")
    parser.add_argument(
        "--trust-edits",
        action="store_true",
        help="load a model folder whose files were edited since it was saved (a warning names them); without it "
        "such a folder is refused",
    )
    parser.add_argument(
        "--decoder",
        default="argmax_leaf",
        metavar="SPEC",
        help="decoder spec (default argmax_leaf; optimal_hf1 or optimal_hfbeta:beta=2 give node sets)",
    )
    add_conformal_argument(parser)
    parser.add_argument("--top-k", type=int, default=5, help="also list the k most probable leaves (default 5)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<i>")
    parser.add_argument(
        "--out", metavar="FILE", help=f"write the predictions to a file ({', '.join(PREDICTION_FORMATS)}, by suffix)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_conformal_argument(parser: argparse.ArgumentParser) -> None:
    """``--conformal [METHOD]``: the calibration ``hiercls evaluate --model ... --conformal`` stored."""
    parser.add_argument(
        "--conformal",
        nargs="?",
        const="node",
        choices=["node", "set", "risk"],
        default=None,
        metavar="METHOD",
        help="predict with the conformal calibration stored in <model>/conformal.json by 'hiercls evaluate --model "
        "... --conformal ALPHA' (node, set or risk; default node) instead of --decoder",
    )
