"""The benchmark harness (bench/_timing.py, bench/run_all.py): verdict statistics, and quick = full configurations.

No timing is asserted: the candidates are deterministic fake clocks, so the ratios are known exactly.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("_timing"), importlib.import_module("run_all")
    finally:
        sys.path.remove(str(BENCH))


CANDIDATE = [1.0, 1.1, 2.0, 1.1, 2.5, 1.3]  # warm-up, then one timing per repeat
BASELINE = [1.0, 1.0, 1.0, 1.9, 1.0, 1.0]


class FakeClock:
    """``time.perf_counter`` replacement: each call of a registered function advances it by that call's cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def work(self, costs: list[float]):
        it = iter(costs)

        def fn() -> None:
            self.now += next(it)

        return fn


def test_ratio_of_min_ignores_load_spikes(harness, monkeypatch):
    timing, _ = harness
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    # one warm-up call, then 5 repeats; candidate 1.1 s unloaded, baseline 1.0 s, load spikes on some repeats
    cand = clock.work(list(CANDIDATE))
    base = clock.work(list(BASELINE))
    res = timing.compare(cand, base, repeats=5, number=1, warmup=1)
    assert res["ratio_of_min"] == pytest.approx(1.1)
    assert res["ratios"] == pytest.approx([1.1, 2.0, 1.1 / 1.9, 2.5, 1.3])
    assert res["ratio_median"] == pytest.approx(1.3)


def test_verdict_uses_the_case_statistic(harness, monkeypatch):
    timing, run_all = harness
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)

    def case(statistic: str):
        return timing.Case(
            name=f"t/{statistic}",
            target=1.2,
            candidate=clock.work(list(CANDIDATE)),
            baseline=clock.work(list(BASELINE)),
            number=1,
            repeats=5,
            statistic=statistic,
        )

    by_median = run_all.run_case(case("median"), quick=True, repeats=None)
    by_min = run_all.run_case(case("min"), quick=True, repeats=None)
    assert by_median["ratio"] == pytest.approx(1.3) and by_median["pass"] is False
    assert by_min["ratio"] == pytest.approx(1.1) and by_min["pass"] is True
    with pytest.raises(ValueError, match="statistic must be"):
        timing.Case(name="t/bad", target=1.0, statistic="mean")


def test_quick_and_full_register_the_same_cases(harness):
    """``--quick`` may only change repeats, never what is measured, so both modes give the same verdicts."""
    for path in sorted(BENCH.glob("bench_*.py")):
        if "def cases(" not in path.read_text(encoding="utf-8"):
            continue
        module = importlib.import_module(path.stem)
        quick, full = module.cases(True), module.cases(False)
        assert [c.name for c in quick] == [c.name for c in full], path.name
        for q, f in zip(quick, full, strict=True):
            assert (q.target, q.statistic, q.group, q.note) == (f.target, f.statistic, f.group, f.note), q.name


def test_a_reference_case_has_no_verdict(harness, monkeypatch):
    """``target=None``: the ratio is reported with ``pass: None``, listed as a reference, never as a failure."""
    timing, run_all = harness
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    ref = timing.Case(
        name="t/floor",
        target=None,
        candidate=clock.work([3.0] * 6),
        baseline=clock.work([1.0] * 6),
        number=1,
        repeats=5,
    )
    row = run_all.run_case(ref, quick=True, repeats=None)
    assert row["ratio"] == pytest.approx(3.0) and row["pass"] is None
    failing = {"name": "t/slow", "pass": False}
    assert run_all.verdicts([row], []) == {"all_pass": True, "failed": [], "references": ["t/floor"]}
    assert run_all.verdicts([row, failing], []) == {"all_pass": False, "failed": ["t/slow"], "references": ["t/floor"]}
    assert run_all.verdicts([row], [{"case": "t/x", "error": "boom"}])["all_pass"] is False


def test_decode_runner_times_ungrouped_cases_against_their_own_baseline(harness, monkeypatch):
    """``bench_decode.py --ratios``: consecutive cases without a group each keep their own baseline (a filter
    that drops the memory cases between layouts must not make the row-major cases share a node-major argmax)."""
    timing, _ = harness
    bench_decode = importlib.import_module("bench_decode")
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    cases = [
        timing.Case(name=f"t/{k}", target=5.0, candidate=clock.work([c] * 6), baseline=clock.work([b] * 6), number=1)
        for k, c, b in (("slow_base", 2.0, 1.0), ("fast_base", 2.0, 0.1))
    ]
    out = bench_decode.run_cases(cases, repeats=5)
    assert out["t/slow_base"]["ratio"] == pytest.approx(2.0)
    assert out["t/fast_base"]["ratio"] == pytest.approx(20.0) and out["t/fast_base"]["pass"] is False


def test_calibration_is_not_fooled_by_one_slow_first_call(harness, monkeypatch):
    """A first call ten times slower than the rest (a cold cache) must not cut the calls per timing tenfold."""
    timing, _ = harness
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    fn = clock.work([0.01] + [0.001] * 1000)
    assert 95 <= timing.calibrate(fn, min_time=0.1) <= 101
    slow, start = clock.work([0.5] * 10), clock.now  # one call already lasts a whole timing: no second round
    assert timing.calibrate(slow, min_time=0.1) == 1 and clock.now - start == pytest.approx(0.5)


def test_steady_allocator_keeps_large_blocks_off_fresh_pages(tmp_path):
    """After ``steady_allocator`` a freed 64 MiB block is reused warm: refilling it costs no page faults, where
    glibc's default maps fresh pages for it every time (its dynamic mmap threshold stops at 32 MiB)."""
    import subprocess

    script = tmp_path / "faults.py"
    script.write_text(
        "import resource, sys\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "import numpy as np\n"
        "from _timing import steady_allocator\n"
        "state = steady_allocator() if sys.argv[1] == 'steady' else 'default'\n"
        "np.ones(1 << 23)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(5):\n"
        "    np.ones(1 << 23)  # 64 MiB, written then freed\n"
        "print(state, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)\n",
        encoding="utf-8",
    )
    runs = {
        mode: subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, check=True)
        for mode in ("steady", "default")
    }
    state, steady_faults = runs["steady"].stdout.rsplit(" ", 1)
    if not state.startswith("glibc"):
        pytest.skip(f"no glibc mallopt here: {state}")
    default_faults = int(runs["default"].stdout.rsplit(" ", 1)[1])
    assert int(steady_faults) < 100 < default_faults  # 64 MiB is 16,384 pages of 4 KiB


def test_train_bench_times_every_head_against_one_shared_flat_step(harness, monkeypatch, capsys):
    """``bench_train.py``: one flat step per repeat serves all heads; each head's verdict is its fastest step over
    flat's fastest, with its parameter count, and TransHP is held to its own target."""
    import json

    import torch

    timing, _ = harness
    bench_train = importlib.import_module("bench_train")
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    calls = {"flat": 0}
    cost = {"flat": 1.0, "hxe": 1.02, "transhp": 1.25}

    def fake_build_step(head, **_):
        def step():
            calls[head] = calls.get(head, 0) + 1
            clock.now += cost[head]

        step.model = torch.nn.Linear(2, 3 if head == "flat" else 4)
        return step

    monkeypatch.setattr(bench_train, "build_step", fake_build_step)
    monkeypatch.setattr(bench_train, "_CACHE", {})
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    assert bench_train.main(["--heads", "hxe", "transhp", "--repeats", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["heads"]) == {"hxe", "transhp_default"}
    hxe, transhp = out["heads"]["hxe"], out["heads"]["transhp_default"]
    assert hxe["ratio"] == pytest.approx(1.02) and hxe["pass"] is True and hxe["params"] == 2 * 4 + 4
    assert transhp["ratio"] == pytest.approx(1.25) and transhp["target"] == bench_train.TRANSHP_TARGET
    assert calls == {"flat": 1 + 3 + 1, "hxe": 1 + 3, "transhp": 1 + 3}  # warm-up, then one flat per repeat + 1


def test_first_use_bench_registers_every_decoder_loss_and_command(harness):
    """``bench_firstuse``: one seconds-over-1-s ``measure`` case per rule, per non-flat head's loss and per CLI call."""
    from hiercls.cli import ARGUMENTS
    from hiercls.decode import RULES
    from hiercls.heads import list_heads

    bench = importlib.import_module("bench_firstuse")
    by_name = {c.name: c for c in bench.cases(quick=True)}
    expected = {f"firstuse/decode_{r}": 3.0 for r in RULES}
    expected |= {f"firstuse/loss_{h}": 3.0 for h in list_heads() if h != "flat"}
    expected |= {f"firstuse/cli_{c}_help": 1.0 for c in ARGUMENTS}
    expected |= {"firstuse/cli_help": 1.0, "firstuse/cli_argument_error": 1.0}
    assert {n: c.target for n, c in by_name.items()} == expected
    assert all(callable(c.measure) and c.setup is None for c in by_name.values())


def test_first_use_children_report_their_first_call(harness, tmp_path):
    """The fresh processes run and report ``import_s``, ``first_s`` and ``second_s``; a wrong exit status raises."""
    bench = importlib.import_module("bench_firstuse")
    for script, args in ((bench._DECODE, ("argmax_leaf", "{}")), (bench._LOSS, ("hxe",))):
        res = bench.first_use(script, *args)
        assert sorted(res) == ["first_s", "import_s", "second_s"] and all(v >= 0 for v in res.values())
    with pytest.raises(RuntimeError, match="first-use child"):
        bench.first_use(bench._DECODE, "no_such_rule", "{}")
    assert bench.cli_seconds(["--help"], 0) > 0
    with pytest.raises(RuntimeError, match="exited 2, not 0"):
        bench.cli_seconds(["decode", "--cost", "nope"], 0)


def test_predict_bench_registers_nine_candidates_per_modality(harness):
    """``bench_predict``: every head x decoder per backbone, in one group per backbone against its flat baseline,
    built lazily (the 21K models only exist while their group runs)."""
    bench = importlib.import_module("bench_predict")
    quick = bench.cases(quick=True)
    assert len(quick) == 2 * len(bench.HEADS) * len(bench.DECODERS) == 18
    assert {c.group for c in quick} == {"predict/image_vs_flat", "predict/text_vs_flat"}
    assert all(c.setup is not None and c.number == 1 and c.warmup == 0 for c in quick)
    assert all(c.target == pytest.approx(1 / 0.9) and c.statistic == "min" for c in quick)
    assert bench._CACHE == {}
