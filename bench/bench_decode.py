"""Throughput of every decoder on the ImageNet-1K and ImageNet-21K trees against per-sample Python baselines.

For each tree, a batch of realistic posteriors (softmax of hierarchically correlated logits with a random
temperature, so the mass concentrates on a few branches to a varying degree) is decoded by the vectorised
decoders; a straightforward per-sample implementation of the same rule runs on a subset in the same process
and its throughput is extrapolated. Output: one JSON document on stdout (ratios = vectorised / baseline).
The baselines' answers are checked against the vectorised ones on that subset (``agree``).

Trees: ``hiercls.taxonomy.registry.load_taxonomy("imagenet1k_tree")`` / ``("imagenet21k_winter21")`` when
shipped, else the WordNet 3.0 trees built from timm's synset lists, else random trees with the same node
count and height.

Usage::

    python bench/bench_decode.py            # 10k samples per tree
    python bench/bench_decode.py --quick    # seconds
    python bench/bench_decode.py --ratios [--quick]   # issue 25 targets: decoder / argmax, interleaved repeats

``cases(quick)`` returns the ratio cases (issue 25) for ``bench/run_all.py``: every decoder on the same float32
``[B, N]`` array as ``probs.argmax(1)`` (B = 10,000, quick mode too, with fewer repeats), on ``imagenet1k_tree``
and ``imagenet21k_winter21``, node-major (what ``Taxonomy.marginals`` returns) and row-major (what a head
returns); targets 40x for ``optimal_hfbeta``, 10x for ``bayes_node`` and ``crm``, 5x for the rest (issue 25); and
every decoder's peak extra memory over the input's size, target 4. Beside them, without targets, the
:data:`FLOORS`: the input check alone and one gather of the parent column, the least any rule does.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import math
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from hiercls.decode import RULES, SET_RULES, decode
from hiercls.taxonomy import Taxonomy

logger = logging.getLogger("bench_decode")

TREES = {
    "imagenet1k": ("imagenet1k_tree", "imagenet_synsets.txt", 1860, 18),
    "imagenet21k": ("imagenet21k_winter21", "imagenet21k_goog_synsets.txt", 23547, 19),
}


# ---------------------------------------------------------------------------------------------- trees
def random_tree(num_nodes: int, height: int, rng: np.random.Generator) -> Taxonomy:
    """A random tree with ``num_nodes`` nodes and height ``height`` (a spine guarantees the height)."""
    parents: dict[str, str | None] = {"n0": None}
    depth = [0]
    for i in range(1, num_nodes):
        if i <= height:
            p = i - 1
        else:
            # Prefer recent nodes so the tree is deep and bushy like WordNet, never past the height.
            while True:
                p = int(rng.integers(max(0, i - 200), i)) if rng.random() < 0.8 else int(rng.integers(0, i))
                if depth[p] < height:
                    break
        parents[f"n{i}"] = f"n{p}"
        depth.append(depth[p] + 1)
    return Taxonomy.from_parents(parents, name=f"random_{num_nodes}")


def load_tree(key: str, rng: np.random.Generator, quick: bool) -> tuple[Taxonomy, str]:
    registry_name, synsets, n, h = TREES[key]
    try:
        from hiercls.taxonomy.registry import load_taxonomy

        tax = load_taxonomy(registry_name)
        return (tax if tax.is_tree else tax.to_tree("first")), f"registry:{registry_name}"
    except Exception as err:  # any failure falls back to the next source
        logger.info("registry %s unavailable (%s)", registry_name, err)
    if not quick:
        try:
            import timm

            from hiercls.taxonomy.wordnet import wordnet_taxonomy

            path = Path(timm.__file__).parent / "data" / "_info" / synsets
            wnids = [w.strip() for w in path.read_text().splitlines() if w.strip()]
            tax = wordnet_taxonomy(wnids, include_instances=True, name=key).to_tree("first")
            return tax, f"wordnet:{synsets}"
        except Exception as err:  # any failure falls back to the next source
            logger.info("WordNet tree for %s unavailable (%s)", key, err)
    if quick:
        n = min(n, 3000)
    return random_tree(n, h, rng), f"random(n={n}, height={h})"


def posteriors(tax: Taxonomy, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Leaf probabilities ``[batch, L]`` float32: softmax(hierarchical logits / temperature)."""
    leaves = tax.leaves
    paths = tax.paths[leaves]  # [L, H+1], -1 padded
    valid = paths >= 0
    out = np.empty((batch, len(leaves)), dtype=np.float32)
    for s in range(0, batch, 256):
        b = min(256, batch - s)
        field = rng.normal(size=(b, tax.num_nodes)).astype(np.float32)  # one shock per node, shared below it
        true = rng.integers(0, len(leaves), size=b)
        logits = np.where(valid[None], field[:, np.maximum(paths, 0)], 0).sum(2) * 0.5
        logits[np.arange(b), true] += rng.uniform(2, 12, size=b)
        temp = rng.choice([0.5, 1.0, 2.0], size=(b, 1))
        z = logits / temp
        z -= z.max(1, keepdims=True)
        e = np.exp(z)
        out[s : s + b] = e / e.sum(1, keepdims=True)
    return out


# ---------------------------------------------------------------------------------------------- baselines
class Baselines:
    """Straightforward per-sample implementations: Python loops over nodes, NumPy only for per-sample algebra."""

    def __init__(self, tax: Taxonomy) -> None:
        self.tax = tax
        self.children = [list(tax.children(n)) for n in range(tax.num_nodes)]
        self.leaves = tax.leaves.tolist()
        self.depth = tax.depth.tolist()
        self.ic = tax.information_content.tolist()
        self.parent = tax.parent.tolist()
        self.paths = [tax.path(n) for n in range(tax.num_nodes)]
        self._cost: dict[str, np.ndarray] = {}

    def cost(self, kind: str) -> np.ndarray | None:
        if kind not in self._cost:
            if self.tax.num_nodes * self.tax.num_leaves > 3e7:
                return None
            self._cost[kind] = self.tax.distance_matrix(kind)  # [N, L]
        return self._cost[kind]

    def argmax_leaf(self, row: list[float]) -> int:
        return max(self.leaves, key=lambda n: (row[n], -n))

    def top_down(self, row: list[float]) -> int:
        cur = 0
        while self.children[cur]:
            c = max(self.children[cur], key=lambda k: (row[k], -k))
            if row[c] <= 0:
                break
            cur = c
        return cur

    def majority(self, row: list[float]) -> int:
        best = 0
        for n in range(len(row)):
            if row[n] > 0.5 and (self.depth[n], row[n]) > (self.depth[best], row[best]):
                best = n
        return best

    def info_gain(self, row: list[float]) -> int:
        return max(range(len(row)), key=lambda n: (self.ic[n] * row[n], -n))

    def hie(self, row: list[float]) -> int:
        return max(self.leaves, key=lambda n: (row[n] * row[self.parent[n]], -n))

    def _bayes(self, row: list[float], kind: str, leaves_only: bool) -> int | None:
        c = self.cost(kind)
        if c is None:
            return None
        leaf_p = np.asarray(row)[self.tax.leaves]
        exp = c @ leaf_p
        if leaves_only:
            return int(self.tax.leaves[np.argmin(exp[self.tax.leaves])])
        return int(np.argmin(exp))

    def crm(self, row: list[float]) -> int | None:
        return self._bayes(row, "lca_height", True)

    def bayes_node(self, row: list[float]) -> int | None:
        return self._bayes(row, "shortest_path", False)

    def optimal_hfbeta(self, row: list[float], beta: float = 1.0) -> float:
        """Per sample, no candidate pruning: q_m(n) for every node, then every k up to the safe bound."""
        tax = self.tax
        p = np.asarray(row, dtype=np.float64)
        stop = p.copy()
        for n in range(1, tax.num_nodes):
            stop[self.parent[n]] -= p[n]
        stop = np.clip(stop, 0, None)
        h = tax.height
        q = np.zeros((tax.num_nodes, h + 1))
        for y in np.flatnonzero(stop > 0):
            q[self.paths[y], self.depth[y]] += stop[y]
        q[0] = 0
        b2 = beta * beta
        m = np.arange(h + 1, dtype=np.float64)
        r = np.bincount(tax.depth, weights=stop, minlength=h + 1)
        best = r[0]
        for k in range(1, tax.num_nodes):
            w = (q * ((1 + b2) / (b2 * m + k))[None, :]).sum(1)
            w[0] = -1
            best = max(best, float(np.sort(w)[::-1][:k].sum()))
            ub = (1 + b2) * float((r[1:] * m[1:] / (b2 * m[1:] + np.maximum(k + 1, m[1:]))).sum())
            if ub <= best:
                break
        return best


# ---------------------------------------------------------------------------------------------- timing
def bench_tree(key: str, args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    t0 = time.perf_counter()
    tax, source = load_tree(key, rng, args.quick)
    build_s = time.perf_counter() - t0
    base = Baselines(tax)
    out: dict[str, Any] = {
        "source": source,
        "nodes": tax.num_nodes,
        "leaves": tax.num_leaves,
        "height": tax.height,
        "batch": args.batch,
        "tree_build_s": round(build_s, 2),
        "rules": {},
    }
    rules = [r for r in RULES if r not in ("threshold", "max_info", "plurality")]  # same profiles as majority
    seconds = dict.fromkeys(rules, 0.0)
    first: dict[str, Any] = {}
    block = 1000
    node0 = None
    for s in range(0, args.batch, block):
        b = min(block, args.batch - s)
        node = np.asarray(tax.marginals(posteriors(tax, b, rng)), dtype=np.float32)  # what a head would output
        if node0 is None:
            node0 = node
            for rule in rules:
                decode(node[:8], tax, rule)  # build the per-taxonomy tables outside the timing
        for rule in rules:
            t = time.perf_counter()
            res = decode(node, tax, rule, return_value=True) if rule in SET_RULES else decode(node, tax, rule)
            seconds[rule] += time.perf_counter() - t
            if s == 0:
                first[rule] = res
    n_base = min(args.baseline_samples, len(node0))
    rows = node0[:n_base].astype(np.float64).tolist()
    for rule in rules:
        entry: dict[str, Any] = {
            "samples_per_s": round(args.batch / seconds[rule], 1),
            "seconds": round(seconds[rule], 3),
        }
        fn = getattr(base, rule, None)
        if rule in ("crm", "bayes_node"):
            base.cost("lca_height" if rule == "crm" else "shortest_path")  # build the matrix outside the timing
        if fn is not None:
            m = n_base if rule not in ("optimal_hfbeta", "bayes_node", "crm") else max(2, n_base // 10)
            t = time.perf_counter()
            answers = [fn(r) for r in rows[:m]]
            bdt = time.perf_counter() - t
            if any(a is None for a in answers):
                entry["baseline"] = "skipped: needs an N x L cost matrix too large for this tree"
            else:
                entry["baseline_samples_per_s"] = round(m / bdt, 2)
                entry["speedup"] = round(entry["samples_per_s"] / (m / bdt), 1)
                if rule in SET_RULES:
                    pred, value = first[rule]
                    entry["agree"] = bool(np.allclose(np.asarray(answers), value[:m], atol=1e-6))
                    entry["mean_set_size"] = round(float(np.asarray(pred).sum(1).mean() - 1), 2)
                else:
                    entry["agree"] = bool(np.array_equal(np.asarray(answers), np.asarray(first[rule])[:m]))
        out["rules"][rule] = entry
        print(f"{key} {rule}: {entry}", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------- ratio cases
RATIO_TREES = ("imagenet1k_tree", "imagenet21k_winter21")
SLOW_TARGET = {"optimal_hfbeta": 40.0, "bayes_node": 10.0, "crm": 10.0}
RATIO_BATCH = 10_000
MEMORY_TARGET = 4.0


LAYOUTS = ("node_major", "row_major")


def _parent_gather(node: np.ndarray, tax: Taxonomy) -> Any:
    parent = np.maximum(np.asarray(tax.parent), 0)
    return lambda: np.take(node, parent, axis=1)


def _input_check(node: np.ndarray, tax: Taxonomy) -> Any:
    from hiercls.decode import check_probabilities

    return lambda: check_probabilities(node, tax)


FLOORS = {
    "floor_input_check": (_input_check, "check_probabilities alone, the row check every rule's kernel makes"),
    "floor_parent_gather": (_parent_gather, "one gather of every node's parent, the cheapest pass reading the tree"),
}
"""Reference ratios measured beside the decoders, without a target: the row check alone
(:func:`hiercls.decode.checks.check_row`, which every rule runs on each row before its rule) and one NumPy
gather of each node's parent."""


@functools.cache
def ratio_arrays(tree: str, layout: str = "node_major") -> tuple[Taxonomy, np.ndarray]:
    """The taxonomy and its float32 ``[B, N]`` node probabilities (``B = RATIO_BATCH``), built once per process.

    ``layout="node_major"``: :meth:`Taxonomy.marginals` of :func:`posteriors` as it comes, the array a user
    computing node probabilities from leaf probabilities with NumPy gets (node-major memory, i.e. Fortran order).
    ``"row_major"``: the same values in C order, as a head's ``[B, N]`` output gives them (``tensor.numpy()``).
    The two differ in what argmax costs: along rows of a row-major array it is one streaming SIMD pass at memory
    speed (about 0.25 us per sample on the 1K tree here), on a node-major array a strided one (about 3 us).
    Every rule decodes a few rows first, so that its per-taxonomy tables are built outside any timing.
    """
    from hiercls.taxonomy import load_taxonomy

    if layout == "row_major":
        tax, node = ratio_arrays(tree, "node_major")
        return tax, np.ascontiguousarray(node)
    if layout != "node_major":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    tax = load_taxonomy(tree)
    rng = np.random.default_rng(0)
    node = np.asarray(tax.marginals(posteriors(tax, RATIO_BATCH, rng)), dtype=np.float32)
    for rule in RULES:
        decode(node[:8], tax, rule)
    return tax, node


def peak_extra_ratio(fn: Any, input_bytes: int) -> float:
    """Peak memory allocated while ``fn()`` runs (NumPy reports its buffers to tracemalloc) over ``input_bytes``."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = fn()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del out
    return (peak - before) / input_bytes


def cases(quick: bool) -> list[Any]:
    """Issue-25 decoder cases against ``probs.argmax(1)`` on the same array, with the default settings (checks on).

    Every rule on the float32 ``[10000, N]`` arrays of :func:`ratio_arrays`, on ``imagenet1k_tree`` and
    ``imagenet21k_winter21``, in both memory layouts (quick mode: the same arrays, fewer repeats):
    ``decode/<tree>/<rule>/<layout>``, time / argmax time on that array, target 40 for ``optimal_hfbeta``, 10 for
    ``bayes_node`` and ``crm``, 5 for the rest; where the argmax takes seconds (the 21K node-major array) the rules
    share its timings (``group``). ``decode/<tree>/<rule>/<layout>/memory``: peak extra memory of one call / the
    input's bytes, target 4. Arrays are built lazily, once per tree and layout, by the first case needing them.
    """
    from _timing import Case

    out: list[Any] = []
    for tree in RATIO_TREES:
        for layout in LAYOUTS:
            slow_base = tree != RATIO_TREES[0] and layout == "node_major"  # a 0.8-2 s argmax over 400 MB
            big = tree != RATIO_TREES[0]  # 400 MB arrays: one call per timing, no extra warm-up

            def base_of(tree: str = tree, layout: str = layout) -> Any:
                node = ratio_arrays(tree, layout)[1]
                return lambda: node.argmax(1)

            timing: dict[str, Any] = {
                "group": f"decode/{tree}/{layout}" if slow_base else None,
                "repeats": (2 if quick else 5) if big else (5 if quick else 9),
                "number": 1 if big else None,
                "warmup": 0 if big else 1,
            }
            for floor, (make, what) in FLOORS.items():

                def floor_setup(tree: str = tree, layout: str = layout, make: Any = make) -> tuple[Any, Any]:
                    tax, node = ratio_arrays(tree, layout)
                    return make(node, tax), base_of(tree, layout)

                out.append(
                    Case(
                        name=f"decode/{tree}/{floor}/{layout}",
                        target=None,
                        setup=floor_setup,
                        **timing,
                        note=f"reference, no target: {what} / probs.argmax(1), float32 [{RATIO_BATCH}, N] {layout}",
                    )
                )
            for rule in RULES:

                def setup(tree: str = tree, layout: str = layout, rule: str = rule) -> tuple[Any, Any]:
                    tax, node = ratio_arrays(tree, layout)
                    return (lambda: decode(node, tax, rule)), base_of(tree, layout)

                out.append(
                    Case(
                        name=f"decode/{tree}/{rule}/{layout}",
                        target=SLOW_TARGET.get(rule, 5.0),
                        setup=setup,
                        **timing,
                        note=f"decode(probs, '{rule}') / probs.argmax(1), float32 [{RATIO_BATCH}, N] {layout}, "
                        "checks on",
                    )
                )
            for rule in RULES:

                def measure(tree: str = tree, layout: str = layout, rule: str = rule) -> float:
                    tax, node = ratio_arrays(tree, layout)
                    return peak_extra_ratio(lambda: decode(node, tax, rule), node.nbytes)

                out.append(
                    Case(
                        name=f"decode/{tree}/{rule}/{layout}/memory",
                        target=MEMORY_TARGET,
                        measure=measure,
                        note="peak extra bytes (tracemalloc) / input bytes",
                    )
                )
    return out


def run_cases(case_list: list[Any], repeats: int) -> dict[str, Any]:
    """The cases through ``bench/run_all.py``'s runner (grouped timings, memory ratios)."""
    import run_all

    result = {}
    for batch in run_all.batches(case_list):
        for r in run_all.run_batch(batch, True, repeats):
            result[r["name"]] = {k: r[k] for k in ("ratio", "target", "pass") if k in r}
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small batch, small trees: runs in seconds")
    ap.add_argument("--batch", type=int, default=None, help="samples per tree (default 10000; --quick 500)")
    ap.add_argument("--baseline-samples", type=int, default=None, help="samples for the per-sample baselines")
    ap.add_argument("--trees", default="imagenet1k,imagenet21k", help="comma-separated: imagenet1k, imagenet21k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ratios", action="store_true", help="issue-25 ratios to argmax (see cases())")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved repeats of --ratios")
    ap.add_argument("--only", default="", help="with --ratios: substring filter on case names")
    args = ap.parse_args(argv)
    if args.ratios:
        selected = [c for c in cases(args.quick) if args.only in c.name]
        json.dump(
            {"bench": "decode_ratios", "quick": args.quick, "cases": run_cases(selected, args.repeats)},
            sys.stdout,
            indent=1,
        )
        print()
        return 0
    args.batch = args.batch or (500 if args.quick else 10000)
    args.baseline_samples = args.baseline_samples or (20 if args.quick else 100)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rng = np.random.default_rng(args.seed)
    result = {"bench": "decode", "quick": args.quick, "trees": {}}
    for key in [k.strip() for k in args.trees.split(",") if k.strip()]:
        if key not in TREES:
            ap.error(f"unknown tree {key!r}; choose from {', '.join(TREES)}")
        result["trees"][key] = bench_tree(key, args, rng)
    json.dump(result, sys.stdout, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
