"""``hiercls predict``: the work, once the arguments parsed (:mod:`hiercls.cli.predict_args`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hiercls._textio import check_writable
from hiercls.conformal import load_conformal
from hiercls.evaluation import format_table
from hiercls.models.inference import (
    check_prediction_path,
    predict,
    read_input_rows,
    study_best_run,
    write_predictions,
)
from hiercls.taxonomy import Taxonomy
from hiercls.train.distributed import resolve_device
from hiercls.train.inference import load_trained_model

#: Rows printed to the terminal when the predictions also go to a file.
SHOWN_WITH_OUT = 10


def _label(prediction: dict) -> tuple[str, str]:
    """``(prediction column, prob column)`` of a table row."""
    if "ids" in prediction:
        tips = " | ".join(t["display_name"] for t in prediction["tips"]) or "(root)"
        return f"{tips} ({prediction['size']}-node set, depth {prediction['depth']})", "set"
    return prediction["display_name"], f"{prediction['prob']:.3f}"


def _conformal(args: argparse.Namespace, taxonomy: Taxonomy) -> tuple[Any, str]:
    """``--conformal METHOD``: the stored calibrator of that method as a decoder, and its name for the output."""
    path = Path(args.model) / "conformal.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"--conformal: {path} does not exist; calibrate first with "
            f"'hiercls evaluate --model {args.model} --conformal ALPHA'"
        )
    found = [c for c in load_conformal(path, taxonomy) if c.method == args.conformal]
    if not found:
        raise ValueError(f"--conformal {args.conformal}: {path} holds no calibrator of that method")
    cal = found[0]
    return cal.as_decoder(), f"conformal:{cal.method} alpha={cal.alpha:g} threshold={cal.threshold_:.6g}"


def _report_skipped(skipped: list[tuple[str, str]], total: int) -> None:
    """One line on stderr per skipped row (``--on-error skip``), then the count: nothing is left out unsaid."""
    for row, problem in skipped:
        print(f"skipped {row}: {problem}", file=sys.stderr)
    if skipped:
        print(f"skipped {len(skipped)} of {total} rows (--on-error skip)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.out:  # before any work: a mistyped --out fails at once
        check_prediction_path(args.out)
        check_writable(args.out)
    if args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    best = study_best_run(args.model)  # a study folder stands for its best run: say which
    if best is not None:
        print(best[1], file=sys.stderr)
    device = resolve_device(args.device)
    model, taxonomy, cfg = load_trained_model(
        best[0] if best else args.model, which=args.checkpoint, device=device, trust_edits=args.trust_edits
    )
    decoder, decoder_name = (args.decoder, args.decoder) if not args.conformal else _conformal(args, taxonomy)
    read = read_input_rows(args.inputs, text_column=args.text_column, on_error=args.on_error)
    _report_skipped(read.skipped, read.total)
    inputs, shown, kind = read.inputs, read.shown, read.kind
    preds = predict(
        model,
        taxonomy,
        inputs,
        decoder=decoder,
        top_k=args.top_k,
        batch_size=args.batch_size,
        device=device,
        image_size=cfg.data.image_size if cfg is not None else None,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    rows = []
    limit = SHOWN_WITH_OUT if args.out else len(preds)
    for row, text, p in list(zip(read.rows, shown, preds, strict=True))[:limit]:
        label, prob = _label(p["prediction"])
        top = ", ".join(f"{t['display_name']} {t['prob']:.2f}" for t in p["top_k"][:3])
        text = Path(text).name if kind == "image" else text
        path = " > ".join(p["path"][1:][-4:]) or "(root)"
        rows.append([row, text if len(text) <= 48 else text[:45] + "...", label, prob, path, top])
    print(format_table(["row", "input", "prediction", "prob", "path (last 4)", "top leaves"], rows))
    if args.out:
        if len(preds) > limit:
            print(f"... {len(preds) - limit} more")
        write_predictions(args.out, shown, preds, rows=read.rows, model=str(args.model), decoder=decoder_name)
        print(f"wrote {len(preds)} predictions to {args.out}")
    return 0
