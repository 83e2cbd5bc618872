"""``hiercls predict``: predictions of a saved model on new inputs (texts, a text file, image files).

Examples::

    hiercls predict --model runs/quickstart "a small domesticated feline" "a vehicle with two wheels"
    hiercls predict --model runs/quickstart sentences.txt --decoder optimal_hf1 --out preds.json
    hiercls predict --model runs/fashion_mnist_efficientnet shoe.png shirt.jpg --top-k 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hiercls._textio import atomic_write, check_writable
from hiercls.evaluation import format_table
from hiercls.train.distributed import resolve_device
from hiercls.train.inference import load_trained_model, predict, read_inputs

HELP = "predictions of a saved model on new inputs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = __doc__.split("Examples::", 1)[1]
    parser.add_argument("--model", required=True, metavar="DIR", help="a run folder or a saved model folder")
    parser.add_argument("inputs", nargs="+", help="texts, a .txt file (one text per line) or image files")
    parser.add_argument("--checkpoint", default="best", choices=["best", "last"], help="which checkpoint of a run")
    parser.add_argument(
        "--decoder",
        default="argmax_leaf",
        metavar="SPEC",
        help="decoder spec (default argmax_leaf; optimal_hf1 or optimal_hfbeta:beta=2 give node sets)",
    )
    parser.add_argument("--top-k", type=int, default=5, help="also list the k most probable leaves (default 5)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:<i>")
    parser.add_argument("--out", metavar="FILE.json", help="write the predictions as JSON")


def run(args: argparse.Namespace) -> int:
    if args.out:
        check_writable(args.out)
    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    device = resolve_device(args.device)
    model, taxonomy, cfg = load_trained_model(args.model, which=args.checkpoint, device=device)
    inputs, shown, kind = read_inputs(args.inputs)
    preds = predict(
        model,
        taxonomy,
        inputs,
        decoder=args.decoder,
        top_k=args.top_k,
        batch_size=args.batch_size,
        device=device,
        image_size=cfg.data.image_size if cfg is not None else None,
    )
    rows = []
    for text, p in zip(shown, preds, strict=True):
        pr = p["prediction"]
        label = pr.get("display_name") or ", ".join(pr.get("display_names", [])[-3:]) or "(root)"
        prob = f"{pr['prob']:.3f}" if "prob" in pr else "set"
        top = ", ".join(f"{t['display_name']} {t['prob']:.2f}" for t in p["top_k"][:3])
        text = Path(text).name if kind == "image" else text
        rows.append([text if len(text) <= 48 else text[:45] + "...", label, prob, " > ".join(p["path"][1:][-4:]), top])
    print(format_table(["input", "prediction", "prob", "path (last 4)", "top leaves"], rows))
    if args.out:
        payload = [{"input": s, **p} for s, p in zip(shown, preds, strict=True)]
        with atomic_write(args.out, "w", encoding="utf-8") as f:
            f.write(json.dumps({"model": str(args.model), "decoder": args.decoder, "predictions": payload}, indent=2))
        print(f"wrote {args.out}")
    return 0
