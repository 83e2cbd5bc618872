"""``hiercls train``: the work, once the arguments parsed (:mod:`hiercls.cli.train_args`)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

import yaml

from hiercls.cli.recipes_cmd import resolve_recipe
from hiercls.evaluation import format_calibration, format_results
from hiercls.train.config import TrainConfig, config_to_dict, load_config
from hiercls.train.distributed import is_main_process
from hiercls.train.report import format_conformal, run_recipe
from hiercls.train.study import format_study, run_study

#: The exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def run(args: argparse.Namespace) -> int:
    """``hiercls train``: Ctrl-C stops it with one line saying how to resume (exit status 130), no traceback."""
    cfg = load_config(resolve_recipe(args.recipe), _overrides(args))
    try:
        return _train(args, cfg)
    except KeyboardInterrupt:
        if is_main_process():
            again = "the same command again"
            if cfg.run.resume is False:  # the same command would start over
                again = "the command again with --set run.resume=auto"
            print(
                f"hiercls train: interrupted (Ctrl-C); run {again} to resume from the last checkpoint in "
                f"{str(cfg.out_dir)!r}",
                file=sys.stderr,
            )
        return INTERRUPTED


def _overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(args.overrides)
    if args.out_dir:
        overrides.append(f"run.out_dir={args.out_dir}")
    if args.no_compare:
        overrides += ["compare_heads=[]", "study.seeds=[]"]
    return overrides


def _train(args: argparse.Namespace, cfg: TrainConfig) -> int:
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
        if format_conformal(runs):
            print(f"\n{format_conformal(runs)}")
        print(f"\nrun folder: {cfg.out_dir} (config.yaml, metrics.jsonl, results.json, curves.png, checkpoints/)")
    return 0
