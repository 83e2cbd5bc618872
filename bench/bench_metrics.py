"""Benchmark hiercls.metrics against a straightforward per-sample Python implementation, printing JSON.

For the ImageNet-1K and ImageNet-21K trees (the shipped taxonomies when present, else WordNet built from
timm's synset lists and cut to a tree with ``to_tree("first")``, else a random tree of the same size) it
times each vectorised metric on a batch of samples against a per-sample Python version of the same metric
(ancestor sets built by walking parents, Python set arithmetic), in the same run, and reports the speed-up
and the largest difference between the two results. A second part scores a million samples.

Usage:
    python bench/bench_metrics.py            # 10k samples per batch, 1M-sample run (a few minutes, mostly
                                             # building WordNet and the Python baselines)
    python bench/bench_metrics.py --quick    # random trees, small batches: seconds
    python bench/bench_metrics.py --ratios [--quick]   # the ratio cases below

``cases(quick)`` returns the ratio cases (``Case`` of ``bench/_timing.py``), on ``imagenet1k_tree`` and
``imagenet21k_winter21`` with batches of B = 10,000 (``quick`` too: it only repeats less): each metric on node
names (a NumPy array, a list) against the same metric on node ids plus one plain dict look-up per name (target
1.5; names vs ids alone are references), and ``HierarchicalMetrics``: five ``update()`` calls of a batch and
``compute()`` against one call of each metric function on the five batches together (the same results, checked
when the case is set up).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import operator
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import hiercls.metrics as M
from hiercls.taxonomy import Taxonomy

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import Case


def random_tree(rng: np.random.Generator, n_nodes: int, height: int, name: str) -> Taxonomy:
    """A random tree of about ``height`` levels: each node picks a parent among the previous level's nodes."""
    sizes = np.maximum(1, np.round(np.geomspace(5, n_nodes / 3, height))).astype(int)
    levels: list[list[int]] = [[0]]
    edges, nxt = [], 1
    for s in sizes:
        if nxt >= n_nodes:
            break
        cur = list(range(nxt, min(n_nodes, nxt + int(s))))
        edges += [(f"n{int(rng.choice(levels[-1]))}", f"n{c}") for c in cur]
        levels.append(cur)
        nxt = cur[-1] + 1
    # the rest become children of random earlier nodes, making an unbalanced tree like WordNet's
    edges += [(f"n{int(rng.integers(0, c))}", f"n{c}") for c in range(nxt, n_nodes)]
    return Taxonomy(edges, nodes=[f"n{i}" for i in range(n_nodes)], name=name)


def load_tree(which: str, quick: bool, rng: np.random.Generator) -> tuple[Taxonomy, str]:
    sizes = {"imagenet1k": (1860, 17), "imagenet21k": (23547, 19)}
    if quick:
        n, h = sizes[which]
        return random_tree(rng, n // (1 if which == "imagenet1k" else 4), h, f"random-{which}"), "random (--quick)"
    try:
        from hiercls.taxonomy.registry import load_taxonomy

        tax = load_taxonomy(which)
        return (tax if tax.is_tree else tax.to_tree("first")), "shipped"
    except Exception:
        pass
    try:
        import timm.data

        from hiercls.taxonomy.wordnet import wordnet_taxonomy

        info = os.path.join(os.path.dirname(timm.data.__file__), "_info")
        fname = "imagenet_synsets.txt" if which == "imagenet1k" else "imagenet21k_goog_synsets.txt"
        with open(os.path.join(info, fname)) as f:
            wnids = f.read().split()
        dag = wordnet_taxonomy(wnids, include_instances=which != "imagenet1k", name=which)
        return dag.to_tree("first"), "wordnet + to_tree('first')"
    except Exception as err:
        print(f"WordNet unavailable ({err}); using a random tree", file=sys.stderr)
    n, h = sizes[which]
    return random_tree(rng, n, h, f"random-{which}"), "random"


# ----------------------------------------------------------------------------- per-sample Python baselines
class PyTaxonomy:
    """What a straightforward implementation has: parent lists and depths as Python lists."""

    def __init__(self, tax: Taxonomy) -> None:
        self.parents = [list(tax.parents(n)) for n in range(tax.num_nodes)]
        self.depth = [int(d) for d in tax.depth]
        self.height = tax.height
        self.n = tax.num_nodes

    def ancestors(self, n: int) -> set[int]:
        out, stack = {n}, [n]
        while stack:
            for q in self.parents[stack.pop()]:
                if q not in out:
                    out.add(q)
                    stack.append(q)
        return out

    def path(self, n: int) -> list[int]:
        out = [n]
        while self.parents[out[-1]]:
            out.append(self.parents[out[-1]][0])
        return out[::-1]

    def lca_depth(self, a: int, b: int) -> int:
        return max(self.depth[x] for x in self.ancestors(a) & self.ancestors(b))


def py_hf(py: PyTaxonomy, t: list[int], p: list[int], average: str) -> float:
    si = sp_ = st = 0
    fs = []
    for a, b in zip(t, p, strict=True):
        ta, pb = py.ancestors(a) - {0}, py.ancestors(b) - {0}
        i = len(ta & pb)
        si, sp_, st = si + i, sp_ + len(pb), st + len(ta)
        fs.append(2 * i / (len(ta) + len(pb)) if ta or pb else 0.0)
    return 2 * si / (st + sp_) if average == "micro" else sum(fs) / len(fs)


def py_hf_sets(py: PyTaxonomy, t: list[list[int]], p: list[list[int]]) -> float:
    si = tot = 0
    for a, b in zip(t, p, strict=True):
        ta = set().union(*[py.ancestors(x) for x in a]) - {0}
        pb = set().union(*[py.ancestors(x) for x in b]) - {0}
        si += len(ta & pb)
        tot += len(ta) + len(pb)
    return 2 * si / tot


def py_node_macro_f1(py: PyTaxonomy, t: list[int], p: list[int]) -> float:
    tp, fp, fn = [0] * py.n, [0] * py.n, [0] * py.n
    for a, b in zip(t, p, strict=True):
        ta, pb = py.ancestors(a), py.ancestors(b)
        for x in ta & pb:
            tp[x] += 1
        for x in pb - ta:
            fp[x] += 1
        for x in ta - pb:
            fn[x] += 1
    fs = [2 * tp[j] / (2 * tp[j] + fp[j] + fn[j]) if tp[j] + fp[j] + fn[j] else 0.0 for j in range(1, py.n)]
    return sum(fs) / len(fs)


def py_severity(py: PyTaxonomy, t: list[int], p: list[int]) -> float:
    d = [py.height - py.lca_depth(a, b) for a, b in zip(t, p, strict=True) if a != b]
    return sum(d) / len(d)


def py_per_level(py: PyTaxonomy, t: list[int], p: list[int]) -> list[float]:
    ok, n = [0] * py.height, [0] * py.height
    for a, b in zip(t, p, strict=True):
        pa, pb = py.path(a), py.path(b)
        for d in range(1, min(len(pa), len(pb))):
            n[d - 1] += 1
            ok[d - 1] += pa[d] == pb[d]
    return [o / c if c else math.nan for o, c in zip(ok, n, strict=True)]


def py_hdist_at_k(py: PyTaxonomy, t: list[int], scores: np.ndarray, leaves: list[int], k: int) -> float:
    total = 0.0
    for a, row in zip(t, scores.tolist(), strict=True):
        top = sorted(range(len(row)), key=row.__getitem__, reverse=True)[:k]
        total += sum(0 if leaves[j] == a else py.height - py.lca_depth(a, leaves[j]) for j in top) / k
    return total / len(t)


# ----------------------------------------------------------------------------- harness
def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[Any, float]:
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def diff(a: Any, b: Any) -> float:
    a, b = np.atleast_1d(np.asarray(a, dtype=float)), np.atleast_1d(np.asarray(b, dtype=float))
    both = ~(np.isnan(a) & np.isnan(b))
    return float(np.max(np.abs(a[both] - b[both]))) if both.any() else 0.0


def make_labels(rng: np.random.Generator, tax: Taxonomy, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Leaf targets; predictions right 60% of the time, else a random node (leaf or internal)."""
    t = rng.choice(tax.leaves, n)
    p = np.where(rng.random(n) < 0.6, t, rng.integers(1, tax.num_nodes, n))
    return t, p


def bench_tree(tax: Taxonomy, source: str, n: int, n_scores: int, rng: np.random.Generator) -> dict[str, Any]:
    t, p = make_labels(rng, tax, n)
    py = PyTaxonomy(tax)
    tl, pl = t.tolist(), p.tolist()
    kw = {"taxonomy": tax}
    # multi-label: 1-3 leaves per sample as ragged lists
    mt = [rng.choice(tax.leaves, int(rng.integers(1, 4))).tolist() for _ in range(n)]
    mp = [rng.choice(tax.leaves, int(rng.integers(1, 4))).tolist() for _ in range(n)]
    ts = rng.choice(tax.leaves, n_scores)
    scores = rng.random((n_scores, tax.num_leaves)).astype(np.float32)
    leaves = tax.leaves.tolist()
    cases = {
        "hF1_micro": (lambda: M.hierarchical_f1_score(t, p, **kw), lambda: py_hf(py, tl, pl, "micro")),
        "hF1_samples": (
            lambda: M.hierarchical_f1_score(t, p, average="samples", zero_division=0.0, **kw),
            lambda: py_hf(py, tl, pl, "samples"),
        ),
        "hF1_micro_multilabel_sets": (lambda: M.hierarchical_f1_score(mt, mp, **kw), lambda: py_hf_sets(py, mt, mp)),
        "node_macro_f1": (
            lambda: M.node_f1_score(t, p, average="macro", zero_division=0.0, **kw),
            lambda: py_node_macro_f1(py, tl, pl),
        ),
        "mistake_severity": (lambda: M.mistake_severity(t, p, **kw), lambda: py_severity(py, tl, pl)),
        "per_level_accuracy": (
            lambda: M.per_level_accuracy_score(t, p, **kw).tolist(),
            lambda: py_per_level(py, tl, pl),
        ),
        f"hdist@5 ({n_scores} samples)": (
            lambda: M.average_hierarchical_distance_at_k(ts, scores, k=5, **kw),
            lambda: py_hdist_at_k(py, ts.tolist(), scores, leaves, 5),
        ),
    }
    out: dict[str, Any] = {
        "taxonomy": tax.name,
        "source": source,
        "nodes": tax.num_nodes,
        "leaves": tax.num_leaves,
        "height": tax.height,
        "samples": n,
        "metrics": {},
    }
    for name, (vec, ref) in cases.items():
        vec()  # warm the per-taxonomy caches (paths, ancestor matrix), as a training loop would
        v, tv = timed(vec, repeat=3)
        r, tr = timed(ref)
        out["metrics"][name] = {
            "vectorised_s": round(tv, 5),
            "python_s": round(tr, 4),
            "speedup": round(tr / tv, 1),
            "max_abs_diff": diff(v, r),
        }
    return out


def bench_million(tax: Taxonomy, n: int, rng: np.random.Generator) -> dict[str, Any]:
    t, p = make_labels(rng, tax, n)
    kw = {"taxonomy": tax}
    runs = {
        "hF1_micro": lambda: M.hierarchical_f1_score(t, p, **kw),
        "hP_hR_hF1_samples": lambda: M.hierarchical_precision_recall_fscore(
            t, p, average="samples", zero_division=0.0, **kw
        ),
        "hF1_macro_nodes": lambda: M.hierarchical_f1_score(t, p, average="macro", zero_division=0.0, **kw),
        "mistake_severity": lambda: M.mistake_severity(t, p, **kw),
        "per_level_accuracy": lambda: M.per_level_accuracy_score(t, p, **kw),
        "HierarchicalMetrics.update+compute": lambda: _collection(tax, t, p),
    }
    out: dict[str, Any] = {"taxonomy": tax.name, "samples": n, "seconds": {}}
    for name, fn in runs.items():
        _, s = timed(fn)
        out["seconds"][name] = round(s, 3)
    return out


def _collection(tax: Taxonomy, t: np.ndarray, p: np.ndarray) -> dict[str, Any]:
    m = M.HierarchicalMetrics(tax, k=())
    for s in range(0, len(t), 1 << 17):
        m.update(p[s : s + (1 << 17)], t[s : s + (1 << 17)])
    return m.results()


def functional_report(t: Any, p: Any, tax: Taxonomy) -> dict[str, Any]:
    """What ``HierarchicalMetrics(tax, k=()).compute()`` returns, from one call of each metric function."""
    kw: dict[str, Any] = {"taxonomy": tax}
    zd = {"zero_division": 0.0}
    out: dict[str, Any] = {"accuracy": M.exact_match_score(t, p, **kw)}
    for avg in ("micro", "samples"):
        hp, hr, hf = M.hierarchical_precision_recall_fscore(t, p, average=avg, **zd, **kw)
        out.update({f"hP_{avg}": hp, f"hR_{avg}": hr, f"hF1_{avg}": hf})
    for avg in ("macro", "weighted", "micro"):
        out[f"node_{avg}_f1"] = M.node_precision_recall_fscore_support(t, p, average=avg, labels="present", **zd, **kw)[
            2
        ]
    out["hF1_macro"], out["hF1_weighted"] = out["node_macro_f1"], out["node_weighted_f1"]
    out["hamming_loss"] = M.hamming_loss(t, p, **kw)
    out["per_level_accuracy"] = M.per_level_accuracy_score(t, p, **kw).tolist()
    out["per_semantic_level_accuracy"] = M.per_level_accuracy_score(t, p, levels="semantic", **kw).tolist()
    out["semantic_accuracy"] = M.semantic_accuracy_score(t, p, **kw)
    out["mistake_severity"] = M.mistake_severity(t, p, **zd, **kw)
    out["mean_distance"] = M.hierarchical_distance_loss(t, p, distance="lca_height", **kw)
    out["wu_palmer_loss"] = M.wu_palmer_loss(t, p, **kw)
    out["zhao_loss"] = M.zhao_loss(t, p, **kw)
    return out


def _same_results(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    for key, value in want.items():
        a, b = np.asarray(got[key], dtype=float), np.asarray(value, dtype=float)
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True):
            raise AssertionError(f"{what}: {key} = {got[key]!r} from the stateful metric, {value!r} from the functions")


def _stateful_case(tree: str, b: int, updates: int, rng: np.random.Generator) -> Case:
    def setup() -> tuple[Callable[[], Any], Callable[[], Any]]:
        from hiercls.taxonomy import load_taxonomy

        tax = load_taxonomy(tree)
        t, p = make_labels(rng, tax, b * updates)
        metric = M.HierarchicalMetrics(tax, k=())

        def stateful() -> dict[str, Any]:
            metric.reset()
            for s in range(0, len(t), b):
                metric.update(p[s : s + b], t[s : s + b])
            return metric.results()

        def functional() -> dict[str, Any]:
            return functional_report(t, p, tax)

        _same_results(stateful(), functional(), f"HierarchicalMetrics on {tree}")
        return stateful, functional

    return Case(
        name=f"metrics/{tree}/HierarchicalMetrics/update_x{updates}_compute_vs_functions",
        target=2.0,
        setup=setup,
        note=f"{updates} update() of {b} samples + compute() vs one call of each metric function on all "
        f"{b * updates} samples, giving the same results",
    )


def cases(quick: bool) -> list[Case]:
    """The metric cases: name inputs against the same metric on ids plus one plain ``{name: id}`` dict look-up per
    label (numpy arrays and lists), names against ids alone (references), and the stateful collection's
    ``update`` + ``compute`` against the functions on the same data."""
    from hiercls.taxonomy import load_taxonomy

    rng = np.random.default_rng(0)
    b = 10_000  # quick mode too: a smaller batch would change the share of fixed costs, i.e. the ratio
    out: list[Case] = []
    for tree in ("imagenet1k_tree", "imagenet21k_winter21"):
        tax = load_taxonomy(tree)
        names = np.array(tax.names)
        yt, yp = rng.choice(tax.leaves, b), rng.choice(tax.leaves, b)
        for fn in (M.hierarchical_f1_score, M.mistake_severity):
            for kind, t, p in (("numpy", names[yt], names[yp]), ("list", names[yt].tolist(), names[yp].tolist())):
                out.append(_names_case(tree, tax, fn, kind, (t, p), (yt, yp)))
            out.append(
                Case(
                    name=f"metrics/{tree}/{fn.__name__}/names_list_vs_ids",
                    target=None,
                    candidate=functools.partial(fn, names[yt].tolist(), names[yp].tolist(), taxonomy=tax),
                    baseline=functools.partial(fn, yt, yp, taxonomy=tax),
                    note=f"reference, no target: {b} node names (list) vs the same {b} node ids",
                )
            )
        out.append(_stateful_case(tree, b, 5, rng))
    return out


def _names_case(tree: str, tax: Taxonomy, fn: Any, kind: str, names: tuple[Any, Any], ids: tuple[Any, Any]) -> Case:
    """``fn`` on node names against ``fn`` on their ids plus the floor of any name input: one look-up per label in
    a plain ``{name: id}`` dict (one C-level ``itemgetter`` call per side; NumPy arrays first become lists). Names
    are converted with such a dict; the target bounds what the conversion adds over the bare look-ups."""
    index = {name: i for i, name in enumerate(tax.names)}

    def floor() -> Any:
        for side in names:
            operator.itemgetter(*(side.tolist() if isinstance(side, np.ndarray) else side))(index)
        return fn(*ids, taxonomy=tax)

    return Case(
        name=f"metrics/{tree}/{fn.__name__}/names_{kind}_vs_ids_plus_dict_lookup",
        target=1.5,
        candidate=functools.partial(fn, *names, taxonomy=tax),
        baseline=floor,
        note=f"{len(ids[0])} node names ({kind}) vs the same node ids plus one dict look-up per name",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small random trees and batches (seconds)")
    ap.add_argument("--samples", type=int, default=None, help="batch size of the comparison (default 10000)")
    ap.add_argument("--million", type=int, default=None, help="size of the large run (default 1000000)")
    ap.add_argument("--ratios", action="store_true", help="the ratio cases (see cases())")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats of --ratios")
    args = ap.parse_args(argv)
    if args.ratios:
        from run_all import run_case

        results = [run_case(c, args.quick, args.repeats) for c in cases(args.quick)]
        print(json.dumps({"bench": "metrics_ratios", "quick": args.quick, "cases": results}, indent=1))
        return 0
    rng = np.random.default_rng(0)
    n = args.samples or (1000 if args.quick else 10_000)
    big = args.million or (50_000 if args.quick else 1_000_000)
    result: dict[str, Any] = {
        "benchmark": "hiercls.metrics vs per-sample Python",
        "quick": args.quick,
        "trees": [],
        "large": [],
    }
    for which in ("imagenet1k", "imagenet21k"):
        tax, source = load_tree(which, args.quick, rng)
        n_scores = n if which == "imagenet1k" else max(100, n // 10)  # [n, 17k] float32 scores are large
        result["trees"].append(bench_tree(tax, source, n, n_scores, rng))
        result["large"].append(bench_million(tax, big, rng))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
