#!/usr/bin/env python
"""Time Taxonomy construction and its index structures on big real hierarchies, against networkx in the same run.

Taxonomies: the ImageNet-21K-P fall11 semantic tree (11,222 nodes) and the full WordNet 3.0 noun DAG
(82,115 synsets, instance hypernyms included), both from the shipped files. ``--quick`` uses the ImageNet-1K
DAG instead of WordNet and fewer pairs, and runs in seconds.

Every cached index is timed on a fresh copy (so a timing includes the indexes it is built from). Baselines
compute the same result with networkx (ancestor sets, depths, LCAs) on a sample and are scaled to the same
count; ``speedup`` = baseline time / hiercls time. Prints one JSON object.

    python bench/bench_taxonomy.py [--quick] [--pairs 1000000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from collections.abc import Callable
from typing import Any

import networkx as nx
import numpy as np

from hiercls.taxonomy import Taxonomy, load_taxonomy


def timed(fn: Callable[[], Any], repeat: int = 1) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def fresh(tax: Taxonomy) -> Taxonomy:
    return pickle.loads(pickle.dumps(tax))  # __getstate__ drops every cached index


def bench_one(tax: Taxonomy, pairs: int, dag_pairs: int, baseline_sample: int, rng: np.random.Generator) -> dict:
    out: dict[str, Any] = {
        "name": tax.name,
        "nodes": tax.num_nodes,
        "edges": len(tax.edge_list()),
        "is_tree": tax.is_tree,
    }
    edges, nodes = tax.edge_list(names=True), list(tax.names)
    vr = tax.virtual_root
    if vr is not None:
        edges = [e for e in edges if e[0] != vr]
        nodes = [n for n in nodes if n != vr]
    t, _ = timed(lambda: Taxonomy(edges, nodes=nodes, virtual_root=vr))
    t_nx, graph = timed(lambda: nx.DiGraph(tax.edge_list()))
    out["construct_s"] = t
    out["construct_networkx_digraph_s"] = t_nx
    for attr in (
        "depth",
        "levels",
        "leaves",
        "ancestors_sparse",
        "descendants_sparse",
        "subtree_size",
        "semantic_level",
        "fingerprint",
        *(("paths",) if tax.is_tree else ()),
    ):
        times = []
        for _ in range(3):
            copy = fresh(tax)  # outside the timing
            t0 = time.perf_counter()
            getattr(copy, attr)
            times.append(time.perf_counter() - t0)
        out[f"{attr}_s"] = min(times)

    # Baseline: networkx ancestor sets for a sample of nodes, scaled to all nodes.
    sample = rng.choice(tax.num_nodes, size=min(baseline_sample, tax.num_nodes), replace=False)
    t_nx, _ = timed(lambda: [nx.ancestors(graph, int(n)) for n in sample])
    out["ancestors_networkx_all_nodes_est_s"] = t_nx * tax.num_nodes / len(sample)
    out["ancestors_speedup"] = out["ancestors_networkx_all_nodes_est_s"] / out["ancestors_sparse_s"]
    t_nx, _ = timed(lambda: nx.single_source_shortest_path_length(graph, 0))
    out["depth_networkx_bfs_s"] = t_nx
    out["depth_speedup"] = t_nx / out["depth_s"]

    # LCA on random pairs (trees: vectorised over `pairs`; DAGs: per pair, over `dag_pairs`).
    n_pairs = pairs if tax.is_tree else dag_pairs
    a = rng.integers(0, tax.num_nodes, n_pairs)
    b = rng.integers(0, tax.num_nodes, n_pairs)
    warm = fresh(tax)
    _ = warm.paths if tax.is_tree else warm.ancestors_sparse
    _ = warm.depth
    t, got = timed(lambda: warm.lca(a, b))
    out["lca_pairs"] = n_pairs
    out["lca_s"] = t
    out["lca_per_pair_us"] = t / n_pairs * 1e6
    m = min(2000, n_pairs)
    pair_list = [(int(x), int(y)) for x, y in zip(a[:m], b[:m], strict=True)]
    if tax.is_tree:
        t_nx, ref = timed(lambda: dict(nx.tree_all_pairs_lowest_common_ancestor(graph, root=0, pairs=pair_list)))
        out["lca_agrees_with_networkx"] = bool(all(ref[p] == got[i] for i, p in enumerate(pair_list)))
    else:
        t_nx, ref = timed(lambda: dict(nx.all_pairs_lowest_common_ancestor(graph, pairs=pair_list[:200])))
        m = 200
        # networkx picks *a* lowest common ancestor; on a DAG several may tie, so compare depths.
        d = warm.depth
        out["lca_depth_agrees_with_networkx"] = bool(all(d[ref[p]] <= d[got[i]] for i, p in enumerate(pair_list[:200])))
    out["lca_networkx_per_pair_us"] = t_nx / m * 1e6
    out["lca_speedup"] = out["lca_networkx_per_pair_us"] / out["lca_per_pair_us"]

    leaves = warm.leaves
    k = min(1000, len(leaves)) if tax.is_tree else min(100, len(leaves))
    sub = rng.choice(leaves, size=k, replace=False)
    t, _ = timed(lambda: warm.distance_matrix("shortest_path", nodes=sub, targets=sub))
    out["distance_matrix_leaves"] = k
    out["distance_matrix_s"] = t

    # Leaf -> node marginals of 256 rows against the plain leaves-by-nodes sparse product (same sums, any order).
    leaf = rng.dirichlet(np.ones(tax.num_leaves), size=256).astype(np.float32)
    tax.marginals(leaf[:1])  # builds the level tables once, outside the timing
    t, node = timed(lambda: tax.marginals(leaf), repeat=3)
    to_nodes = tax.ancestors_sparse[tax.leaves].astype(np.float32).T.tocsr()
    t_ref, ref = timed(lambda: (to_nodes @ leaf.T).T, repeat=3)
    out["marginals_b256_s"], out["marginals_sparse_product_s"] = t, t_ref
    out["marginals_speedup"] = t_ref / t
    out["marginals_agree"] = bool(np.allclose(node, ref, atol=1e-5))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, seconds")
    parser.add_argument("--pairs", type=int, default=None, help="LCA pairs on trees (default 1,000,000; quick 100,000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    pairs = args.pairs or (100_000 if args.quick else 1_000_000)
    dag_pairs = 2_000 if args.quick else 100_000
    names = ["imagenet21k_fall11", "imagenet1k"] if args.quick else ["imagenet21k_fall11", "wordnet_nouns"]
    results = []
    for name in names:
        t_load, tax = timed(lambda n=name: load_taxonomy(n))
        r = bench_one(tax, pairs, dag_pairs, 300 if args.quick else 2000, rng)
        r["load_shipped_file_s"] = t_load
        results.append(r)
    print(json.dumps({"bench": "taxonomy", "quick": args.quick, "seed": args.seed, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
