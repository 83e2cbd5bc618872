"""``hiercls train RECIPE.yaml [--set key=value ...]``: train from a YAML recipe and print the results.

Multi-GPU / multi-node: ``torchrun --nproc_per_node 8 -m hiercls train RECIPE.yaml`` (every rank runs the
same command; rank 0 logs, shows progress and writes files).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import yaml

from hiercls.evaluation import format_calibration, format_results
from hiercls.train.config import config_to_dict, load_config
from hiercls.train.distributed import is_main_process
from hiercls.train.report import run_recipe
from hiercls.train.study import format_study, run_study

HELP = "train a hierarchical classifier from a YAML recipe"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "recipe", help="YAML recipe (keys = hiercls.train.TrainConfig fields), e.g. recipes/quickstart.yaml"
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


def run(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.out_dir:
        overrides.append(f"run.out_dir={args.out_dir}")
    if args.no_compare:
        overrides += ["compare_heads=[]", "study.seeds=[]"]
    cfg = load_config(args.recipe, overrides)
    if args.print_config:
        sys.stdout.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        return 0
    if args.verbose == 0:
        # Progress and evaluation summaries are the point of a training command: show hiercls.train's INFO.
        logging.getLogger("hiercls.train").setLevel(logging.INFO)
    if cfg.study.seeds:
        report = run_study(cfg, quick=args.quick)
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(f"\n{format_study(report)}")
            print(f"\nstudy folder: {cfg.out_dir} (study.txt, study.json, study.png, runs/<head>-seed<k>/)")
        return 0
    runs = run_recipe(cfg)
    if not is_main_process():
        return 0
    if any(r.get("interrupted") for r in runs.values()):
        print(f"stopped early (schedule.max_steps_this_run); resume with the same command. Run folder: {cfg.out_dir}")
        return 0
    if args.json:
        print(json.dumps(runs, indent=2))
    else:
        print(f"\n{cfg.name}: {cfg.description}".rstrip(": ") if cfg.description else f"\n{cfg.name}")
        print(format_results(runs))
        calibration = format_calibration(runs)
        if calibration:
            print(f"\ncalibration (temperature fitted on the {cfg.data.eval_split} split):\n{calibration}")
        print(f"\nrun folder: {cfg.out_dir} (config.yaml, metrics.jsonl, results.json, curves.png, checkpoints/)")
    return 0
