"""The one result table: :func:`format_results`, printed by ``hiercls train``, ``evaluate`` and ``decode``.

Example:
    >>> res = {"argmax_leaf/accuracy": 0.5, "argmax_leaf/hF1_micro": 0.75,
    ...        "argmax_leaf/per_level_accuracy": [0.9, 0.5]}
    >>> print(format_results({"flat": res}, max_levels=2))
    head  decoder      accuracy  hF1    level 1  level 2
    ----  -----------  --------  -----  -------  -------
    flat  argmax_leaf  0.500     0.750  0.900    0.500
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["decoders_in", "format_results", "format_table"]

_HF_MICRO = re.compile(r"^hF(.+)_micro$")
_MULTILABEL_COLUMNS = ("node_micro_f1", "node_macro_f1", "C_micro_f1", "C_macro_f1", "P_micro_f1", "P_macro_f1")
_COLUMN_NAMES = {
    "node_micro_f1": "micro-F1",
    "node_macro_f1": "macro-F1",
    "C_micro_f1": "C-micro-F1",
    "C_macro_f1": "C-macro-F1",
    "P_micro_f1": "P-micro-F1",
    "P_macro_f1": "P-macro-F1",
}


def decoders_in(results: Mapping[str, Any]) -> list[str]:
    """Decoder labels present in a results dict (keys ``<decoder>/<metric>``), in first-seen order."""
    seen: dict[str, None] = {}
    for key in results:
        if "/" in key:
            seen.setdefault(key.rsplit("/", 1)[0], None)
    return list(seen)


def _fmt(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return "nan" if isinstance(v, float) and math.isnan(v) else f"{v:.3f}"
    return "-" if v is None else str(v)


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain aligned text table (a header, a rule, the rows).

    Example:
        >>> print(format_table(["a", "bb"], [["1", "2"]]))
        a  bb
        -  --
        1  2
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = [
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def format_results(
    runs: Mapping[str, Mapping[str, Any]], *, name: str = "head", max_levels: int = 6, extra: tuple[str, ...] = ()
) -> str:
    """One row per (run, decoder): accuracy (exact match), micro hF1 (and the micro hF-β of every other β in
    the results, e.g. ``hF2``), and the per-level accuracy of the first levels (``-`` where no prediction reaches
    the level, e.g. node sets that stop above it).

    Multi-label results (those with C-F1, from node-set labels) add the metrics of hierarchical text
    classification: the node Micro-F1 and Macro-F1 and the C-/P- Micro/Macro-F1.

    Args:
        runs: run label (a head name, a file name) -> results of :class:`hiercls.evaluation.Evaluator`
            (keys ``<decoder>/<metric>``; other keys are ignored).
        name: the header of the first column.
        max_levels: number of depth levels shown.
        extra: more metric keys to show (e.g. ``("mistake_severity",)``).
    """
    if any(isinstance(res.get(f"{d}/dice"), list) for res in runs.values() for d in decoders_in(res)):
        return _format_dense(runs, name)
    levels = 0
    betas: dict[str, None] = {}
    for res in runs.values():
        for key in res:
            m = _HF_MICRO.match(key.rsplit("/", 1)[-1]) if "/" in key else None
            if m and m.group(1) != "1":
                betas.setdefault(m.group(1), None)
        for d in decoders_in(res):
            per = res.get(f"{d}/per_level_accuracy")
            if isinstance(per, list):
                levels = max(levels, min(max_levels, len(per)))
    multilabel = any(f"{d}/C_micro_f1" in res for res in runs.values() for d in decoders_in(res))
    if multilabel:
        extra = (*_MULTILABEL_COLUMNS, *extra)
    header = [
        name,
        "decoder",
        "accuracy",
        "hF1",
        *[f"hF{b}" for b in betas],
        *[_COLUMN_NAMES.get(k, k) for k in extra],
        *[f"level {i + 1}" for i in range(levels)],
    ]
    rows = []
    for label, res in runs.items():
        for d in decoders_in(res):
            per = res.get(f"{d}/per_level_accuracy")
            per = per if isinstance(per, list) else []
            dice = res.get(f"{d}/mean_dice")
            row = [
                label,
                d,
                _fmt(res.get(f"{d}/accuracy", dice)),
                _fmt(res.get(f"{d}/hF1_micro")),
                *[_fmt(res.get(f"{d}/hF{b}_micro")) for b in betas],
                *[_fmt(res.get(f"{d}/{k}")) for k in extra],
                # nan: no prediction reaches that depth (hedged node sets stop above it), not a failed metric
                *[_fmt(per[i]) if i < len(per) and not _is_nan(per[i]) else "-" for i in range(levels)],
            ]
            rows.append(row)
    return format_table(header, rows)


def _format_dense(runs: Mapping[str, Mapping[str, Any]], name: str) -> str:
    """Segmentation results: mean Dice and Dice per nested region."""
    regions: list[str] = []
    for res in runs.values():
        for d in decoders_in(res):
            regions = regions or list(res.get(f"{d}/regions") or [])
            if not regions and isinstance(res.get(f"{d}/dice"), list):
                regions = [f"region {i + 1}" for i in range(len(res[f"{d}/dice"]))]
    header = [name, "decoder", "mean Dice", *[f"Dice {r}" for r in regions]]
    rows = []
    for label, res in runs.items():
        for d in decoders_in(res):
            dice = res.get(f"{d}/dice") or []
            rows.append(
                [
                    label,
                    d,
                    _fmt(res.get(f"{d}/mean_dice")),
                    *[_fmt(dice[i]) if i < len(dice) else "-" for i in range(len(regions))],
                ]
            )
    return format_table(header, rows)
