"""Mixup + EMA + torch.compile + tar shards against today's loop, on the Fashion-MNIST image recipe, over seeds.

Issue 26 asks that "mixup + EMA + compile + shards train the quickstart-size problem to the same metric as today
within its seed spread". The problem is ``recipes/fashion_mnist_efficientnet.yaml`` (efficientnet_lite0 with the
offline package weights, conditional softmax head, a fixed 6,000-image subset of Fashion-MNIST's ``train_fit``
split at 64 px, one epoch, the checkpoint chosen on 2,000 ``val`` images). What the script does:

1. **Shards.** It exports the recipe's training subset (``hiercls.data.subsample`` of ``train_fit``, the samples
   the plain runs train on) and its ``val`` subset as PNG image folders, one folder per label (the node's name,
   as :class:`hiercls.data.HierImageFolder` reads them), and writes each as tar shards with the documented
   command ``hiercls data shard <folder> <shards>/<split> --taxonomy fashion_mnist --shard-size 500
   --shuffle-seed 0`` (``<out>/shards-<n train>-<n val>/{train_fit,val}``; kept and reused when they exist).
2. **Two arms per seed.** ``plain`` is the shipped recipe as it is (only ``run.seed`` and ``run.out_dir`` set,
   its compare/study runs off). ``featured`` reads the same images from the shards (``data.dataset: shards``,
   the default shuffle buffer of 1,000 samples), mixes batches with timm's Mixup/CutMix
   (``data.mixup``), keeps an EMA of the weights (``model.ema``; the EMA weights are the model),
   trains through ``torch.compile`` (``model.compile: true``; ``--compile-seeds`` limits it to some seeds,
   the others run eager) in ``channels_last``. Its settings are :data:`FEATURED` (chosen on ``val``; see
   docs/training.md).
3. **Scoring.** Every run's best checkpoint is scored on the recipe's study split (``test``, the same fixed
   subsample of ``study.max_samples`` = 2,000 images for every run) with the recipe's decoders: accuracy and
   micro hF1 (``hiercls.evaluation.model.evaluate_model`` once, its probabilities cached in the run folder,
   then :class:`hiercls.evaluation.Evaluator`). A finished run folder is reused, not trained again.
4. **Report.** Per run the metrics (``val`` as the run reported them, ``test``) and training seconds; per arm
   mean and std over seeds; the paired difference featured - plain with a 95% t-interval over the seeds and a
   paired bootstrap interval over the test samples (the two arms' per-sample counts pooled over seeds,
   ``hiercls.train.study.paired_bootstrap``; accuracy as the hF1 of counts ``(correct, 1, 1)``). Printed, and
   written to ``--out``/``compare<tag>.json`` and to ``--json``.

Usage (the run in docs/training.md: 2,000 training images, since a run of the recipe's 6,000 would take about 17
minutes on the shared 2-core CPU at the speed of its first steps; 2-7 minutes a run):

    python scripts/compare_training_features.py --seeds 0 1 2 3 4 5 --max-train-samples 2000 \\
        --max-eval-samples 1000 --compile-seeds 1 --out runs/compare_features \\
        --json bench/results/compare_training_features.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.stats
import torch
from PIL import Image

from hiercls.cli import main as hiercls_main
from hiercls.data import FashionMNIST, subsample
from hiercls.decode import parse_decoder
from hiercls.evaluation import Evaluator
from hiercls.evaluation.model import evaluate_model, split_loader
from hiercls.train import TrainConfig, apply_overrides, load_config, train
from hiercls.train.inference import load_trained_model
from hiercls.train.study import paired_bootstrap, score_predictions

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "fashion_mnist_efficientnet.yaml"

#: The featured arm's settings beyond the data source (chosen on the val split, seed 0; docs/training.md).
FEATURED = {
    "data.mixup.mixup_alpha": 0.2,
    "data.mixup.cutmix_alpha": 0.0,
    "data.mixup.prob": 1.0,
    "model.ema.decay": 0.9,
    "model.ema.warmup": True,
    "model.channels_last": True,
}


def export_split(split: str, limit: int | None, folder: Path) -> int:
    """PNG files of the recipe's subset of ``split`` under ``folder/<node name>/<index>.png``; its size."""
    ds = FashionMNIST(split)
    sub = subsample(ds, limit)
    indices = sub.indices if isinstance(sub, torch.utils.data.Subset) else range(len(ds))
    for i in indices:
        target = folder / ds.taxonomy.name_of(int(ds.targets[i]))  # "T-shirt/top" nests: the path is the name
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(ds.images[i]).save(target / f"{i:05d}.png")
    return len(indices)


def write_split_shards(cfg: TrainConfig, out: Path, shard_size: int) -> Path:
    """``out/shards-<n train>-<n val>/{train_fit,val}``: the recipe's training and val subsets as tar shards
    (reused if present)."""
    d = cfg.data
    shards = out / f"shards-{d.max_train_samples}-{d.max_eval_samples}-shuffled"
    for split, limit in ((d.train_split, d.max_train_samples), (d.eval_split, d.max_eval_samples)):
        if (shards / split / "index.json").is_file():
            continue
        images = out / f"images-{d.max_train_samples}-{d.max_eval_samples}" / split
        n = export_split(split, limit, images)
        args = ["data", "shard", str(images), str(shards / split), "--taxonomy", "fashion_mnist", "--shuffle-seed", "0"]
        if hiercls_main([*args, "--shard-size", str(shard_size)]) != 0:
            raise RuntimeError(f"hiercls data shard failed for split {split!r}")
        print(f"shards: {n} {split} images -> {shards / split}", flush=True)
    return shards


def arm_config(
    base: TrainConfig, arm: str, seed: int, out: Path, shards: Path, compiled: bool, tag: str = ""
) -> TrainConfig:
    """The run config of ``arm`` (``plain``: the recipe itself; ``featured``) for ``seed``."""
    name = f"{arm}{tag if arm == 'featured' else ''}-n{base.data.max_train_samples}-seed{seed}"
    sets = [f"run.seed={seed}", f"run.out_dir={out / 'runs' / name}", "run.progress=false"]
    if arm == "featured":
        sets += [
            "taxonomy=fashion_mnist",
            "data.dataset=shards",
            f"data.options={json.dumps({'shards': str(shards)})}",
            "data.max_train_samples=null",  # the shards hold exactly the recipe's subset
            f"model.compile={str(compiled).lower()}",
            *(f"{k}={json.dumps(v)}" for k, v in FEATURED.items()),
        ]
    return apply_overrides(base, sets)


def score_run(run_dir: str, base: TrainConfig) -> dict[str, Any]:
    """The run's best checkpoint on the recipe's study split: per decoder accuracy, micro hF1, per-sample counts."""
    model, taxonomy, _ = load_trained_model(run_dir, which="best")
    specs = [parse_decoder(d) for d in base.eval.decoders]
    cache = Path(run_dir) / f"scored-{base.study.split}-{base.study.max_samples}.npz"  # a rerun reuses it
    if cache.is_file():
        saved = np.load(cache)
        probs, y = saved["probs"], saved["labels"]
    else:
        _, loader = split_loader(model, taxonomy, base, base.study.split, base.study.max_samples, None)
        _, probs, y = evaluate_model(model, loader, taxonomy, specs, device=torch.device("cpu"), keep_probs=True)
        assert probs is not None and y is not None
        np.savez(cache, probs=probs, labels=y)
    evaluator = Evaluator(taxonomy, specs, k=())  # the metrics evaluate_model reports, from the probabilities
    evaluator.update(probs, y)
    res = evaluator.compute()
    scores: dict[str, Any] = {"labels": y}
    for spec in specs:
        pred = np.asarray(spec(probs, taxonomy))
        sc = score_predictions(pred, y, taxonomy)
        scores[spec.label] = {
            "accuracy": float(res[f"{spec.label}/accuracy"]),
            "hF1_micro": float(res[f"{spec.label}/hF1_micro"]),
            "counts": sc["counts"],
            "correct": (pred == y).astype(np.float64) if pred.ndim == 1 else None,
        }
    return scores


def t_interval(diffs: list[float], confidence: float = 0.95) -> dict[str, float]:
    """Mean of the per-seed paired differences with a Student-t interval (``nan`` bounds for one seed)."""
    d = np.asarray(diffs, dtype=np.float64)
    mean = float(d.mean())
    if len(d) < 2:
        return {"difference": mean, "low": math.nan, "high": math.nan, "seeds": len(d)}
    half = float(scipy.stats.t.ppf(0.5 + confidence / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return {"difference": mean, "low": mean - half, "high": mean + half, "seeds": len(d)}


def _pooled(runs: list[dict[str, Any]], label: str, metric: str) -> tuple[np.ndarray, ...]:
    if metric == "hF1_micro":
        return tuple(np.sum([r[label]["counts"][i] for r in runs], axis=0) for i in range(3))
    correct = np.sum([r[label]["correct"] for r in runs], axis=0)
    ones = np.full_like(correct, float(len(runs)))
    return correct, ones, ones  # hF1 of (correct, 1, 1) per sample is the accuracy


def summarise(scores: dict[str, dict[int, dict[str, Any]]], labels: list[str], seeds: list[int]) -> dict[str, Any]:
    """Per-arm mean/std over seeds and the paired featured - plain differences of every decoder and metric."""
    out: dict[str, Any] = {}
    for label in labels:
        for metric in ("accuracy", "hF1_micro"):
            per = {arm: [scores[arm][s][label][metric] for s in seeds] for arm in ("plain", "featured")}
            row: dict[str, Any] = {
                arm: {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, "runs": v}
                for arm, v in per.items()
            }
            row["t_interval"] = t_interval([f - p for f, p in zip(per["featured"], per["plain"], strict=True)])
            if metric == "accuracy" and scores["plain"][seeds[0]][label]["correct"] is None:
                out[f"{label}/{metric}"] = row  # a node-set decoder: no per-sample exact match to resample
                continue
            runs = {arm: [scores[arm][s] for s in seeds] for arm in ("plain", "featured")}
            row["bootstrap"] = paired_bootstrap(
                _pooled(runs["featured"], label, metric), _pooled(runs["plain"], label, metric)
            )
            out[f"{label}/{metric}"] = row
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"{'decoder/metric':28s} {'plain':>15s} {'featured':>15s}  diff [95% t over seeds] [bootstrap]"]
    for key, row in summary.items():
        p, f, t = row["plain"], row["featured"], row["t_interval"]
        boot = row.get("bootstrap")
        b = f" [{boot['low']:+.4f}, {boot['high']:+.4f}]" if boot else ""
        lines.append(
            f"{key:28s} {p['mean']:.4f}±{p['std']:.4f} {f['mean']:.4f}±{f['std']:.4f}  "
            f"{t['difference']:+.4f} [{t['low']:+.4f}, {t['high']:+.4f}]{b}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--out", default="runs/compare_features", help="folder for shards, runs and compare.json")
    parser.add_argument("--json", default=None, help="also write the results JSON here")
    parser.add_argument("--max-train-samples", type=int, default=None, help="default: the recipe's (6000)")
    parser.add_argument("--max-eval-samples", type=int, default=None, help="val images (default: the recipe's)")
    parser.add_argument("--test-samples", type=int, default=None, help="test images (default: study.max_samples)")
    parser.add_argument("--compile-seeds", nargs="*", type=int, default=None, help="default: every seed")
    parser.add_argument("--arms", nargs="+", default=["plain", "featured"], choices=["plain", "featured"])
    parser.add_argument("--shard-size", type=int, default=500)
    parser.add_argument("--set", action="append", default=[], help="extra override for the featured arm")
    parser.add_argument("--tag", default="", help="suffix of the featured runs' folder names (for tuning)")
    args = parser.parse_args()
    base = load_config(RECIPE, ["compare_heads=[]", "run.plot=false"])
    sizes = {
        "data.max_train_samples": args.max_train_samples,
        "data.max_eval_samples": args.max_eval_samples,
        "study.max_samples": args.test_samples,
    }
    base = apply_overrides(base, [f"{k}={v}" for k, v in sizes.items() if v is not None])
    out = Path(args.out)
    shards = write_split_shards(base, out, args.shard_size)
    compile_seeds = args.seeds if args.compile_seeds is None else args.compile_seeds
    scores: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in args.arms}
    runs = []
    for seed in args.seeds:
        for arm in args.arms:
            cfg = arm_config(base, arm, seed, out, shards, seed in compile_seeds, args.tag)
            if arm == "featured" and args.set:
                cfg = apply_overrides(cfg, args.set)
            cfg.study.seeds = []
            timing = Path(cfg.run.out_dir) / "seconds.json"  # the training time of a run this script trained
            t0 = time.perf_counter()
            result = train(cfg)  # a finished run folder gives its saved results
            if not timing.is_file():
                timing.write_text(json.dumps(time.perf_counter() - t0) + "\n", encoding="utf-8")
            seconds = json.loads(timing.read_text(encoding="utf-8"))
            scores[arm][seed] = sc = score_run(cfg.run.out_dir, base)
            val = {k: v for k, v in result.items() if k.endswith(("/accuracy", "/hF1_micro"))}
            test = {f"{k}/{m}": v[m] for k, v in sc.items() if k != "labels" for m in ("accuracy", "hF1_micro")}
            compiled = arm == "featured" and cfg.model.compile
            runs.append({"arm": arm, "seed": seed, "compiled": compiled, "seconds": seconds, "val": val, "test": test})
            print(json.dumps(runs[-1]), flush=True)
    report: dict[str, Any] = {
        "recipe": str(RECIPE.relative_to(ROOT)),
        "max_train_samples": base.data.max_train_samples,
        "max_eval_samples": base.data.max_eval_samples,
        "test_split": base.study.split,
        "test_samples": len(next(iter(next(iter(scores.values())).values()))["labels"]),
        "seeds": args.seeds,
        "featured_settings": {**FEATURED, **dict(s.split("=", 1) for s in args.set)},
        "compile_seeds": compile_seeds,
        "runs": runs,
    }
    if set(args.arms) == {"plain", "featured"}:
        labels = [k for k in scores["plain"][args.seeds[0]] if k != "labels"]
        for seed in args.seeds:
            if not np.array_equal(scores["plain"][seed]["labels"], scores["featured"][seed]["labels"]):
                raise ValueError(f"seed {seed}: the two arms scored different test samples")
        report["summary"] = summarise(scores, labels, args.seeds)
        print(format_summary(report["summary"]))
    text = json.dumps(report, indent=1)
    (out / f"compare{args.tag}.json").write_text(text + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
