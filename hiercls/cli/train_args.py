"""``hiercls train RECIPE.yaml [--set key=value ...]``: train from a YAML recipe and print the results.

RECIPE is a file or the name of a shipped recipe (``hiercls train quickstart``; ``hiercls recipes list``).

Multi-GPU / multi-node: ``torchrun --nproc_per_node 8 -m hiercls train RECIPE.yaml`` (every rank runs the
same command; rank 0 logs, shows progress and writes files).
"""

from __future__ import annotations

import argparse

HELP = "train a hierarchical classifier from a YAML recipe"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "recipe",
        help="YAML recipe (keys = hiercls.train.TrainConfig fields), e.g. recipes/quickstart.yaml, or the name of a "
        "shipped recipe (hiercls recipes list), e.g. quickstart",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key, e.g. --set optim.lr=1e-4 --set run.out_dir=runs/x (repeatable)",
    )
    parser.add_argument("--out-dir", help="shortcut for --set run.out_dir=DIR")
    parser.add_argument(
        "--no-compare", action="store_true", help="skip the compare_heads runs and the study of the recipe"
    )
    parser.add_argument("--quick", action="store_true", help="a study with its first seed only")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
