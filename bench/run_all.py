"""Run every registered benchmark ratio and print ONE JSON: each ratio, its target and pass/fail.

Registration: any ``bench/bench_*.py`` module that defines ::

    def cases(quick: bool) -> list[Case]: ...

(``Case`` from ``bench/_timing.py``: ``name``, ``target``, and either ``candidate`` / ``baseline`` callables or a
lazy ``setup() -> (candidate, baseline)``; or plain ``(name, target, candidate, baseline)`` tuples) is picked up;
modules without ``cases`` are not imported. Names are
``area/what``; each case's ``ratio`` (by default the median of the per-repeat ratios ``candidate time /
baseline time`` over interleaved repeats, same process, ABBA order; ``statistic="min"``: the fastest timings'
ratio) must be ``<= target`` (a case with ``target=None`` is a reference, reported without a verdict and
listed under ``references``); cases sharing a ``group`` share one
baseline timing per repeat, and a case with ``measure`` reports a non-timing ratio (peak memory / input size).
``quick`` must measure the same configurations as the full run with fewer repeats (and may shrink only what does
not change the ratio), so that both give the same verdict.

Usage::

    python bench/run_all.py --quick            # < 5 minutes on 2 cores
    python bench/run_all.py                    # more repeats
    python bench/run_all.py --only heads/ --json-out results.json

Exits 0 when every case passes, 1 when one fails, 2 when a case errors. Timing runs on one thread by default
(``--threads``): on a shared machine one thread gives the most stable ratios; and with the C allocator held in its
warm steady state (``_timing.steady_allocator``, reported as ``allocator``), so that whether a large tensor is paid
in fresh pages does not depend on what the process allocated before.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _timing import Case, compare, compare_group, steady_allocator  # noqa: E402


def discover(names: list[str] | None = None) -> list[str]:
    """Module names ``bench_*`` under ``bench/`` that define ``cases`` (optionally only ``names``)."""
    found = []
    for path in sorted(HERE.glob("bench_*.py")):
        if names and path.stem not in names:
            continue
        if "def cases(" in path.read_text(encoding="utf-8"):
            found.append(path.stem)
    return found


def _result(case: Case, res: dict[str, Any], seconds: float) -> dict[str, Any]:
    value = res["ratio_of_min"] if case.statistic == "min" else res["ratio_median"]
    out = {"name": case.name, "target": case.target, "statistic": case.statistic, "ratio": value}
    out["pass"] = None if case.target is None else bool(value <= case.target)
    out.update({k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items() if k != "ratios"})
    if "ratios" in res:
        out["ratios"] = [round(r, 4) for r in res["ratios"]]
    out["seconds"] = round(seconds, 2)
    if case.note:
        out["note"] = case.note
    if case.extra:
        out.update(case.extra)
    return out


def _callables(case: Case) -> tuple[Any, Any]:
    if case.setup is not None:
        candidate, baseline = case.setup()
    else:
        candidate, baseline = case.candidate, case.baseline
    if candidate is None or baseline is None:
        raise ValueError(f"case {case.name!r} has neither candidate/baseline callables nor a setup")
    return candidate, baseline


def verdicts(results: list[dict[str, Any]], errors: list[dict[str, str]]) -> dict[str, Any]:
    """``all_pass`` (every case with a target passes, nothing errored), the ``failed`` names and the
    ``references`` (cases without a target, whose ``pass`` is ``None``)."""
    return {
        "all_pass": bool(results) and not errors and all(r["pass"] is not False for r in results),
        "failed": [r["name"] for r in results if r["pass"] is False],
        "references": [r["name"] for r in results if r["pass"] is None],
    }


def run_case(case: Case, quick: bool, repeats: int | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    if case.measure is not None:  # a ratio that is not a timing (memory)
        value = float(case.measure())
        return _result(case, {"ratio_median": value, "kind": "measure"}, time.perf_counter() - t0)
    candidate, baseline = _callables(case)
    reps = repeats or case.repeats or (5 if quick else 9)
    res = compare(
        candidate,
        baseline,
        repeats=reps,
        number=case.number,
        min_time=case.min_time,
        device=case.device,
        warmup=case.warmup,
    )
    del candidate, baseline
    return _result(case, res, time.perf_counter() - t0)


def run_group(group: list[Case], quick: bool, repeats: int | None) -> list[dict[str, Any]]:
    """Timing cases of one ``group``: one shared baseline (the first case's), see ``compare_group``."""
    t0 = time.perf_counter()
    pairs = [_callables(c) for c in group]
    first = group[0]
    reps = repeats or first.repeats or (5 if quick else 9)
    res = compare_group(
        [p[0] for p in pairs],
        pairs[0][1],
        repeats=reps,
        numbers=[c.number for c in group],
        number_baseline=first.number,
        min_time=first.min_time,
        device=first.device,
        warmup=first.warmup,
    )
    del pairs
    seconds = (time.perf_counter() - t0) / len(group)
    return [_result(c, dict(r, group=c.group), seconds) for c, r in zip(group, res, strict=True)]


def batches(cases: list[Case]) -> Iterator[list[Case]]:
    """``cases`` in their order, each consecutive run of timing cases of one ``group`` as one batch (they share a
    baseline); every other case is a batch of its own."""
    i = 0
    while i < len(cases):
        batch = [cases[i]]
        if batch[0].group is not None and batch[0].measure is None:
            while (
                i + len(batch) < len(cases)
                and cases[i + len(batch)].group == batch[0].group
                and cases[i + len(batch)].measure is None
            ):
                batch.append(cases[i + len(batch)])
        i += len(batch)
        yield batch


def run_batch(batch: list[Case], quick: bool, repeats: int | None) -> list[dict[str, Any]]:
    """One batch of :func:`batches`: a group against its shared baseline, or a single case."""
    return run_group(batch, quick, repeats) if len(batch) > 1 else [run_case(batch[0], quick, repeats)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats: under 5 minutes on 2 cores")
    ap.add_argument("--only", nargs="*", default=None, help="run the cases whose name contains one of these")
    ap.add_argument("--modules", nargs="*", default=None, help="bench modules to load (default: all with cases)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved repeats per case (overrides)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: stable ratios)")
    ap.add_argument("--json-out", default=None, help="also write the JSON to this file")
    ap.add_argument(
        "--default-allocator", action="store_true", help="leave the C allocator as it is (see steady_allocator)"
    )
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    allocator = "unchanged (--default-allocator)" if args.default_allocator else steady_allocator()
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    errors: list[dict[str, str]] = []
    for mod_name in discover(args.modules):
        try:
            module = importlib.import_module(mod_name)
            cases = module.cases(args.quick)
        except Exception as err:  # a broken module is reported, the others still run
            errors.append(
                {"module": mod_name, "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
            )
            continue
        selected = []
        for case in cases:
            if isinstance(case, tuple):  # (name, target, candidate, baseline), the decoder/metric modules' form
                name, target, candidate, baseline = case
                case = Case(name=name, target=target, candidate=candidate, baseline=baseline)
            if args.only and not any(s in case.name for s in args.only):
                continue
            selected.append(case)
        for batch in batches(selected):
            case = batch[0]
            try:
                results.extend({"module": mod_name, **r} for r in run_batch(batch, args.quick, args.repeats))
            except Exception as err:
                errors.extend(
                    {"case": c.name, "error": f"{type(err).__name__}: {err}", "trace": traceback.format_exc()}
                    for c in batch
                )
            names = case.name if len(batch) == 1 else f"{case.group} ({len(batch)} cases)"
            print(f"[run_all] {names}: {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    report = {
        "bench": "run_all",
        "quick": args.quick,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "allocator": allocator,
        "elapsed_s": round(time.perf_counter() - started, 1),
        **verdicts(results, errors),
        "errors": errors,
        "cases": results,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        Path(args.json_out).write_text(text + "\n", encoding="utf-8")
    if errors:
        return 2
    return 0 if report["all_pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
