"""The one timing method of the benchmarks: interleaved repeats of a candidate and its baseline, same process.

A *repeat* times the candidate and the baseline back to back (ABBA order across repeats, so that a drift in
machine load hits both alike), each as ``number`` calls in a row; the result is the per-repeat ratios
``candidate / baseline`` summarised by their median, min, max and quartiles. On a shared machine the median
ratio is stable where absolute times are not.

``Case`` is the registration record of ``bench/run_all.py``: a bench module exposes ``cases(quick) -> list[Case]``.
Cases of one ``group`` share their baseline (``compare_group``: one baseline timing per repeat for all of them, so
a slow baseline such as an argmax over a 400 MB array is not paid once per candidate); a case with ``measure``
reports a ratio that is not a timing (e.g. peak extra memory / input size).

Example:
    >>> r = compare(lambda: sum(range(2000)), lambda: sum(range(1000)), repeats=3, min_time=0.001)
    >>> sorted(r) == sorted(["ratio_median", "ratio_min", "ratio_max", "ratio_q1", "ratio_q3", "ratios",
    ...                      "ratio_of_min", "candidate_s", "baseline_s", "repeats", "number"])
    True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Case", "calibrate", "compare", "compare_group", "steady_allocator", "sync", "time_calls"]


@dataclass
class Case:
    """One ratio to measure: ``candidate`` time / ``baseline`` time must stay at or below ``target``.

    A case with ``target=None`` is a *reference*: a ratio measured in the same run to put the verdicts beside
    it (e.g. the cheapest pass any decoder must make over its input, the floor under a target), reported with
    ``"pass": null`` and left out of ``all_pass``.

    Either give ``candidate`` and ``baseline`` (callables without arguments, one unit of work each) or
    ``setup``, called right before the measurement and returning ``(candidate, baseline)``: the runner drops
    them afterwards, so large models or inputs live only while their case runs.

    Attributes:
        name: unique, ``area/what`` (e.g. ``"heads/node_probs_semantic_21k_b256"``).
        target: the largest passing median ratio; ``None`` for a reference measurement without a verdict.
        candidate, baseline: the two callables (or ``None`` with ``setup``).
        setup: builds ``(candidate, baseline)`` lazily.
        repeats: interleaved repeats (default: the runner's, 5 quick / 9 full).
        number: calls per timing (default: calibrated so that one timing lasts at least ``min_time``).
        min_time: seconds one timing should last when ``number`` is calibrated.
        note: what is compared, printed with the result.
        device: ``"cpu"`` or a CUDA device, synchronised around every timing.
        group: cases with the same group, registered one after the other, are timed together against one
            shared baseline (the first case's) by :func:`compare_group`.
        measure: instead of a timing, a callable returning the ratio itself (e.g. peak extra memory / input
            bytes); ``candidate``, ``baseline`` and ``setup`` are then unused.
        warmup: untimed calls of each callable before the timing.
        statistic: the ratio the verdict is on. ``"median"``: the median of the per-repeat ratios.
            ``"min"``: the fastest candidate timing over the fastest baseline timing (``ratio_of_min``), for
            slow steps (a training step) where repeats are few: machine load only ever adds time, so the
            minimum over repeats estimates the unloaded time of each side, and its ratio scatters less than a
            median of a few noisy ratios.
    """

    name: str
    target: float | None
    candidate: Callable[[], Any] | None = None
    baseline: Callable[[], Any] | None = None
    setup: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]] | None = None
    repeats: int | None = None
    number: int | None = None
    min_time: float = 0.05
    note: str = ""
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)
    group: str | None = None
    measure: Callable[[], float] | None = None
    warmup: int = 1
    statistic: str = "median"

    def __post_init__(self) -> None:
        if self.statistic not in ("median", "min"):
            raise ValueError(f"Case {self.name!r}: statistic must be 'median' or 'min', got {self.statistic!r}")


#: glibc ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def steady_allocator() -> str:
    """Fix the C allocator's regime for this process, so that a timing does not depend on the allocation history.

    glibc serves a block above its mmap threshold (128 KiB at start) with fresh pages from the kernel, each one
    zero-filled on first touch, and moves that threshold as blocks are freed; a ``[256, 10450]`` float tensor is
    paid in page faults in one process or phase and served warm from the heap in the next, which moved a loss's
    ratio to ``F.cross_entropy`` between 1.1 and 1.6 across runs of the same code. With the threshold fixed high
    and trimming off, every timing sees the warm steady state of a long training or inference loop (what a caching
    allocator such as jemalloc gives always). That removes the allocator's share of the swing, not the host's:
    the same ratio still moves by about 10% between processes. Peak-memory cases are unaffected: they count
    allocations with ``tracemalloc``, not resident pages.

    Returns:
        What was set, for the report (``"glibc: mmap threshold 1 GiB, no trim"``, or why nothing was set).
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return f"unchanged (no glibc mallopt in {name!r})"
    if mallopt(_M_MMAP_THRESHOLD, 1 << 30) != 1 or mallopt(_M_TRIM_THRESHOLD, (1 << 31) - 1) != 1:
        return "unchanged (mallopt refused)"
    return "glibc: mmap threshold 1 GiB, no trim"


def sync(device: str = "cpu") -> None:
    """Wait for queued device work (CUDA) so that a timing covers it."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], Any], number: int, device: str = "cpu") -> float:
    """Seconds per call of ``fn`` over ``number`` calls in a row."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / number


def calibrate(fn: Callable[[], Any], min_time: float, device: str = "cpu", max_number: int = 10_000) -> int:
    """Calls per timing so that one timing lasts at least ``min_time`` seconds.

    A single call is too short to time on its own (one page fault or cache miss doubles it, and the count taken
    from it halves), so the call count doubles until a timing lasts a tenth of ``min_time`` (or one call lasts
    all of it), and the count comes from the fastest per-call time of those rounds.
    """
    number, best = 1, float("inf")
    while True:
        per_call = time_calls(fn, number, device)
        best = min(best, per_call)
        spent = per_call * number
        if spent >= min_time or (spent >= 0.1 * min_time and number > 1) or number >= max_number:
            break
        number *= 2
    return max(1, min(max_number, int(min_time / max(best, 1e-9)) + 1))


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def compare(
    candidate: Callable[[], Any],
    baseline: Callable[[], Any],
    *,
    repeats: int = 5,
    number: int | None = None,
    min_time: float = 0.05,
    warmup: int = 1,
    device: str = "cpu",
) -> dict[str, Any]:
    """Interleaved timing of ``candidate`` against ``baseline``: per-repeat ratios and their spread.

    Returns:
        ``ratio_median``, ``ratio_min``, ``ratio_max``, ``ratio_q1``, ``ratio_q3`` and ``ratios`` (per repeat),
        ``ratio_of_min`` (fastest candidate timing / fastest baseline timing), ``candidate_s`` / ``baseline_s``
        (median seconds per call), ``repeats`` and ``number`` (calls per timing, candidate and baseline).
    """
    for _ in range(warmup):
        candidate()
        baseline()
    sync(device)
    # Each side gets its own call count, so that each timing lasts about min_time.
    n_cand = number or calibrate(candidate, min_time, device)
    n_base = number or calibrate(baseline, min_time, device)
    gc.collect()
    cand: list[float] = []
    base: list[float] = []
    ratios = []
    for r in range(repeats):
        pair = [(candidate, cand, n_cand), (baseline, base, n_base)]
        for fn, out, n in pair if r % 2 == 0 else pair[::-1]:
            out.append(time_calls(fn, n, device))
        ratios.append(cand[-1] / base[-1])
    return {
        **_summary(ratios),
        "ratio_of_min": min(cand) / min(base),
        "candidate_s": statistics.median(cand),
        "baseline_s": statistics.median(base),
        "repeats": repeats,
        "number": [n_cand, n_base],
    }


def _summary(ratios: list[float]) -> dict[str, Any]:
    return {
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_q1": _quantile(ratios, 0.25),
        "ratio_q3": _quantile(ratios, 0.75),
        "ratios": ratios,
    }


def compare_group(
    candidates: list[Callable[[], Any]],
    baseline: Callable[[], Any],
    *,
    repeats: int = 5,
    numbers: list[int | None] | None = None,
    number_baseline: int | None = None,
    min_time: float = 0.05,
    warmup: int = 1,
    device: str = "cpu",
) -> list[dict[str, Any]]:
    """:func:`compare` for several candidates against one baseline, timed once per repeat for all of them.

    A repeat times the baseline, then every candidate (forward order on even repeats, backward on odd ones);
    the baseline is timed once more at the end, and each candidate's ratio in a repeat is its time over the mean
    of the baseline timings just before and just after that repeat.

    Example:
        >>> res = compare_group([lambda: sum(range(2000)), lambda: sum(range(500))], lambda: sum(range(1000)),
        ...                     repeats=3, min_time=0.001)
        >>> len(res), sorted(res[0]) == sorted(["ratio_median", "ratio_min", "ratio_max", "ratio_q1", "ratio_q3",
        ...                                     "ratios", "ratio_of_min", "candidate_s", "baseline_s", "repeats",
        ...                                     "number"])
        (2, True)
    """
    numbers = numbers or [None] * len(candidates)
    for _ in range(warmup):
        baseline()
        for fn in candidates:
            fn()
    sync(device)
    n_base = number_baseline or calibrate(baseline, min_time, device)
    n_cand = [n or calibrate(fn, min_time, device) for fn, n in zip(candidates, numbers, strict=True)]
    gc.collect()
    base = [time_calls(baseline, n_base, device)]
    cand: list[list[float]] = [[] for _ in candidates]
    order = list(range(len(candidates)))
    for r in range(repeats):
        for i in order if r % 2 == 0 else order[::-1]:
            cand[i].append(time_calls(candidates[i], n_cand[i], device))
        base.append(time_calls(baseline, n_base, device))
    out = []
    for i in order:
        ratios = [c / (0.5 * (base[r] + base[r + 1])) for r, c in enumerate(cand[i])]
        res = _summary(ratios)
        res.update(
            ratio_of_min=min(cand[i]) / min(base),
            candidate_s=statistics.median(cand[i]),
            baseline_s=statistics.median(base),
            repeats=repeats,
            number=[n_cand[i], n_base],
        )
        out.append(res)
    return out
