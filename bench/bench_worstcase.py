"""Worst-case trees for every decoder: a chain of 10,000 nodes and a star of 100,000 children.

Issue 13 asks every rule of :data:`hiercls.decode.RULES` to decode these in under a second per 100 samples.
Each case decodes one float32 ``[100, N]`` node-probability array (the default probability check on) and is
timed against ``time.sleep(0.1)``: the reported ratio is ``seconds per 100 samples / 0.1 s``, so the target 10
is exactly "under a second per 100 samples". A sleep is the one baseline whose time does not depend on the
machine's load, which makes this ratio an absolute bound (a noisy machine can only make it fail, never pass).

Inputs, two per tree (both reported):

* ``realistic``: posteriors in the style of ``bench_decode.posteriors``: softmax of hierarchically correlated
  logits (one normal shock per node, summed along the path) plus a boost of 2-12 at a true label, at
  temperatures 0.5, 1 or 2. On the star the labels are the children (``bench_decode.posteriors`` itself); on the
  chain every node is a possible label (a chain has one leaf) and the path sums are scaled by
  ``1/sqrt(depth)`` so that the mass spreads over a band of depths instead of sitting on one node.
* ``adversarial``: a near-uniform label distribution over every depth of the chain (Dirichlet(50)) and the
  exactly uniform distribution over the star's children (a model that learnt nothing). Both put the hF-optimal
  set deep or wide (every child, on the star) with a flat objective around it: the worst case of the pruning in
  :func:`hiercls.decode.optimal_hfbeta`. The other rules' cost hardly depends on the values.

On the star, the adversarial input is timed for ``optimal_hfbeta`` only: every other rule's time there is the
O(N) pass over the input (and its probability check), the same for any values, and leaving those cases out
keeps ``run_all --quick`` short. The chain runs both inputs for every rule.

Each case: one warm-up call, then 3 interleaved repeats of one call each (``number=1``), so about 0.4 s of
sleep plus 4 decodes. Targets: 10 (one second per 100 samples) for every case.

Memory (issue 28), ``worstcase/memory/...``: a 1,000,000-node star and a 100,000-deep chain, written as edge
lists, through ``hiercls taxonomy validate / stats / show / convert`` (to hiercls JSON) in-process, and every rule
decoding 4 rows of each. The ratio is the peak memory allocated while the command or decode runs (``tracemalloc``:
Python objects and NumPy buffers) over a linear budget of ``BYTES_PER_NODE`` (4 KiB) per node; target 1. An
``N x N`` array (what ``taxonomy stats`` once built on a deep chain: 18.6 GiB at 50,000 levels) or a path per node
(``N x depth``) is a ratio in the thousands. ``--quick`` shrinks the star to 100,000 nodes (a per-node ratio of
linear work does not depend on ``N``) and the chain to 30,000 levels (an ``N x N`` byte array there is still 7
times the budget).

Run ``python bench/run_all.py --quick --only worstcase`` or ``python bench/bench_worstcase.py`` (one JSON line
per timing case).
"""

from __future__ import annotations

import contextlib
import gc
import io
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _timing import Case  # noqa: E402
from bench_decode import posteriors  # noqa: E402

from hiercls.cli import main as cli_main  # noqa: E402
from hiercls.decode import RULES, decode  # noqa: E402
from hiercls.taxonomy import Taxonomy  # noqa: E402

BATCH = 100
CHAIN = 10_000
STAR = 100_000
SLEEP = 0.1
TARGET = 1.0 / SLEEP  # one second per 100 samples
VALUE_DEPENDENT = ("optimal_hfbeta",)  # rules whose work on the star grows with a flat input
BIG_CHAIN = 100_000
BIG_STAR = 1_000_000
QUICK_CHAIN = 30_000  # an N x N int8 array here is 0.9 GB: a ratio of 7, still a failure
BYTES_PER_NODE = 4096
COMMANDS = {
    "validate": ["taxonomy", "validate", "{src}"],
    "stats": ["taxonomy", "stats", "{src}", "--json"],
    "show": ["taxonomy", "show", "{src}"],
    "convert": ["taxonomy", "convert", "{src}", "{dst}"],
}


def chain_tree(n: int = CHAIN) -> Taxonomy:
    """A chain ``n0 -> n1 -> ... -> n{n-1}``: height ``n - 1``, one leaf."""
    return Taxonomy.from_parents({"n0": None, **{f"n{i}": f"n{i - 1}" for i in range(1, n)}}, name=f"chain_{n}")


def star_tree(children: int = STAR) -> Taxonomy:
    """A root with ``children`` leaf children."""
    return Taxonomy.from_parents({"r": None, **{f"c{i}": "r" for i in range(children)}}, name=f"star_{children}")


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def chain_labels(n: int, batch: int, rng: np.random.Generator, adversarial: bool) -> np.ndarray:
    """Label distributions ``[batch, n]`` over the nodes of a chain (node ``i`` at depth ``i``)."""
    if adversarial:
        return rng.dirichlet(np.full(n, 50.0), size=batch)
    walk = np.cumsum(rng.normal(size=(batch, n)), axis=1) * (3.0 / np.sqrt(n))  # correlated along the path
    true = rng.integers(1, n, size=batch)
    walk[np.arange(batch), true] += rng.uniform(2, 12, size=batch)
    temp = rng.choice([0.5, 1.0, 2.0], size=(batch, 1))
    return _softmax(walk / temp)


def node_probs(tax: Taxonomy, kind: str, adversarial: bool, rng: np.random.Generator, batch: int = BATCH) -> np.ndarray:
    """float32 node probabilities ``[batch, N]`` of the chain or the star (what a head would output)."""
    if kind == "chain":
        label = chain_labels(tax.num_nodes, batch, rng, adversarial)
        # Node i's probability is the label mass at depth >= i: a reversed cumulative sum, in float64 first.
        node = np.cumsum(label[:, ::-1], axis=1)[:, ::-1]
        node[:, 0] = 1.0
        return np.minimum(node, 1.0).astype(np.float32)
    leaf = np.full((batch, tax.num_leaves), 1.0 / tax.num_leaves) if adversarial else posteriors(tax, batch, rng)
    return np.asarray(tax.marginals(leaf), dtype=np.float32)


def _sleep() -> None:
    time.sleep(SLEEP)


def cases(quick: bool) -> list[Case]:
    """One case per (tree, input, rule); the trees and arrays are built lazily, once per tree."""
    built: dict[str, Any] = {}

    def inputs(kind: str, adversarial: bool) -> tuple[Taxonomy, np.ndarray]:
        if kind not in built:
            built[kind] = chain_tree() if kind == "chain" else star_tree()
        key = (kind, adversarial)
        if key not in built:
            built[key] = node_probs(built[kind], kind, adversarial, np.random.default_rng(13 + adversarial))
        return built[kind], built[key]

    out = []
    for kind in ("chain", "star"):
        for adversarial in (False, True):
            label = "adversarial" if adversarial else "realistic"
            for rule in RULES:
                if kind == "star" and adversarial and rule not in VALUE_DEPENDENT:
                    continue  # the input pass dominates these on the star, whatever the values (run time)

                def setup(kind: str = kind, adversarial: bool = adversarial, rule: str = rule) -> Any:
                    tax, node = inputs(kind, adversarial)
                    decode(node[:2], tax, rule)  # per-taxonomy tables outside the timing

                    def cand() -> Any:
                        return decode(node, tax, rule)

                    return cand, _sleep

                out.append(
                    Case(
                        name=f"worstcase/{kind}/{label}/{rule}",
                        target=TARGET,
                        setup=setup,
                        repeats=3,
                        number=1,
                        note=f"seconds per {BATCH} samples / {SLEEP} s (target {TARGET:g} = 1 s per {BATCH} samples)",
                    )
                )
    return out + memory_cases(quick)


def peak_per_node_ratio(fn: Any, num_nodes: int) -> float:
    """Peak bytes allocated while ``fn()`` runs (tracemalloc) over ``BYTES_PER_NODE * num_nodes``."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return (peak - before) / (BYTES_PER_NODE * num_nodes)


def write_edges(kind: str, n: int, folder: Path) -> Path:
    """The chain or the star as an edge list file (the users' large-taxonomy format)."""
    path = folder / f"{kind}_{n}.edges"
    with path.open("w", encoding="utf-8") as f:
        if kind == "chain":
            f.writelines(f"n{i}\tn{i + 1}\n" for i in range(n - 1))
        else:
            f.writelines(f"r\tc{i}\n" for i in range(n - 1))
    return path


def memory_cases(quick: bool) -> list[Case]:
    """Peak memory per node of each taxonomy command and of every rule's decode on the big chain and star."""
    sizes = {"chain": QUICK_CHAIN if quick else BIG_CHAIN, "star": STAR if quick else BIG_STAR}
    folder = Path(tempfile.mkdtemp(prefix="hiercls_worstcase_"))
    out = []
    for kind, n in sizes.items():
        for command, argv in COMMANDS.items():

            def run_command(kind: str = kind, n: int = n, argv: list[str] = argv) -> float:
                src = write_edges(kind, n, folder)
                args = [a.format(src=src, dst=folder / f"{kind}_{n}.json") for a in argv]
                with contextlib.redirect_stdout(io.StringIO()):
                    measured = peak_per_node_ratio(lambda: cli_main(args), n)
                src.unlink()
                return measured

            out.append(_memory_case(f"worstcase/memory/{kind}/taxonomy_{command}", run_command, n))

        def run_decode(kind: str = kind, n: int = n) -> float:
            tax = chain_tree(n) if kind == "chain" else star_tree(n - 1)
            node = node_probs(tax, kind, False, np.random.default_rng(28), batch=4)

            def every_rule() -> None:
                for rule in RULES:
                    decode(node, tax, rule, **({"cost": "lca_height"} if rule == "bayes_node" else {}))

            return peak_per_node_ratio(every_rule, n)

        out.append(_memory_case(f"worstcase/memory/{kind}/decode_every_rule_b4", run_decode, n))
    return out


def _memory_case(name: str, measure: Any, nodes: int) -> Case:
    note = f"peak allocated bytes (tracemalloc) / ({BYTES_PER_NODE} bytes x nodes); target 1: linear memory"
    return Case(name=name, target=1.0, measure=measure, note=note, extra={"nodes": nodes})


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="substring filter on case names")
    args = ap.parse_args(argv)
    for case in cases(True):
        if args.only not in case.name:
            continue
        assert case.setup is not None
        cand, _ = case.setup()
        t = []
        for _ in range(2):
            t0 = time.perf_counter()
            cand()
            t.append(time.perf_counter() - t0)
        print(json.dumps({"name": case.name, "seconds_per_100": round(min(t), 4), "pass": min(t) < 1.0}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
