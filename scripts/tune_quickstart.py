"""The head-learning-rate sweep behind the main job's settings (recipes/quickstart.yaml, study.head_settings).

Every head gets the same sweep: ``optim.head_lr`` in a grid, seed 0, selected on the validation split by micro hF1
under the hF1-optimal decoder. The test split, which the main job reports on, is never looked at. Prints one JSON
and writes ``runs/tune_quickstart/sweep.json``; docs/main_job.md records the result.

    .venv/bin/python scripts/tune_quickstart.py [--grid 3e-3 1e-2 3e-2 1e-1 3e-1] [--heads semantic_softmax flat]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from hiercls.train import apply_overrides, load_config, train

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", nargs="+", type=float, default=[3e-3, 1e-2, 3e-2, 1e-1, 3e-1])
    parser.add_argument("--heads", nargs="+", default=["semantic_softmax", "flat"])
    parser.add_argument("--out", default="runs/tune_quickstart")
    parser.add_argument("--metric", default="optimal_hf1/hF1_micro")
    args = parser.parse_args()
    base = load_config(ROOT / "recipes" / "quickstart.yaml", ["compare_heads=[]", "study.seeds=[]"])
    results: dict[str, dict[str, float]] = {}
    for head in args.heads:
        for lr in args.grid:
            cfg = apply_overrides(
                base,
                [
                    f"model.head={head}",
                    f"optim.head_lr={lr}",
                    f"run.out_dir={args.out}/{head}-{lr:g}",
                    "run.plot=false",
                    "run.progress=false",
                ],
            )
            start = time.perf_counter()
            res = train(cfg)
            results.setdefault(head, {})[f"{lr:g}"] = res[args.metric]
            print(f"{head} head_lr={lr:g}: {args.metric}={res[args.metric]:.4f} ({time.perf_counter() - start:.0f} s)")
    best = {h: max(r, key=r.get) for h, r in results.items()}
    summary = {"metric": args.metric, "split": base.data.eval_split, "results": results, "best_head_lr": best}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "sweep.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
