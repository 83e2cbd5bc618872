"""Stateful metrics under torch.distributed: two gloo processes on CPU with uneven shards (7 and 3 samples)
must give exactly the single-process values (one spawn checks every class, since each process costs ~10 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import hiercls.metrics as M
from hiercls.taxonomy import Taxonomy

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="torch.distributed with gloo is needed",
)

# Shared by the workers and the single-process reference: the data and how every metric is built.
SETUP = textwrap.dedent("""
    import numpy as np
    import hiercls.metrics as M
    from hiercls.taxonomy import Taxonomy

    def make():
        rng = np.random.default_rng(1234)
        n = 40
        tree = Taxonomy([(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, n)],
                        nodes=[f"n{i}" for i in range(n)])
        dag_edges = {(f"n{int(rng.integers(0, i))}", f"n{i}") for i in range(1, 20)}
        dag_edges |= {("n1", "n9"), ("n2", "n9"), ("n3", "n15")}
        dag = Taxonomy(sorted(dag_edges), nodes=[f"n{i}" for i in range(20)])
        leaves = tree.leaves
        data = {
            "t": rng.choice(leaves, 10), "scores": rng.random((10, len(leaves))),
            "w": rng.integers(1, 4, 10).astype(float),
            "dt": rng.integers(0, 20, 10), "dp": rng.integers(0, 20, 10),
            "seg_t": rng.integers(-1, 40, (10, 6, 5)), "seg_p": rng.integers(0, 40, (10, 6, 5)),
            "mask_t": rng.random((10, 3, 16)) > 0.5, "mask_p": rng.random((10, 3, 16)) > 0.4,
        }
        data["p"] = leaves[data["scores"].argmax(1)]
        data["t"][4] = -1  # an ignored sample
        data["p"][[1, 8]] = [0, 3]  # internal predictions
        metrics = {
            "hier_micro": M.HierarchicalFBeta(tree, zero_division=0.0),
            "hier_samples": M.HierarchicalFBeta(tree, average="samples", zero_division=0.0),
            "hier_macro_dag": M.HierarchicalFBeta(dag, average="macro", zero_division=0.0),
            "node": M.NodeF1(tree, zero_division=0.0),
            "severity": M.MistakeSeverity(tree),
            "levels": M.LevelAccuracy(tree),
            "topk": M.TopKMetrics(tree, k=(1, 3)),
            "dice_map": M.NestedDice(tree),
            "dice_mask": M.NestedDice(num_regions=3),
            "collection": M.HierarchicalMetrics(tree, k=(1, 2)),
        }
        return metrics, data

    def make_collection(metrics):
        return M.HierarchicalMetrics.collection(metrics["collection"].taxonomy, k=(1, 2))

    def update(metrics, data, rows, coll):
        d = {k: v[rows] for k, v in data.items()}
        coll.update(d["p"], d["t"], y_score=d["scores"])
        for name in ("hier_micro", "hier_samples", "node", "severity", "levels"):
            metrics[name].update(d["p"], d["t"], sample_weight=d["w"])
        metrics["hier_macro_dag"].update(d["dp"], d["dt"])
        metrics["topk"].update(d["scores"], d["t"])
        metrics["dice_map"].update(d["seg_p"], d["seg_t"])
        metrics["dice_mask"].update(d["mask_p"], d["mask_t"])
        metrics["collection"].update(d["p"], d["t"], y_score=d["scores"])
""")

WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    exec(compile(open(sys.argv[1]).read(), "setup", "exec"))
    rank, init_file, out = int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    metrics, data = make()
    coll = make_collection(metrics)
    shards = [np.arange(0, 7), np.arange(7, 10)]  # uneven on purpose
    rows = shards[rank]
    if rank == 0:
        update(metrics, data, rows[:4], coll)  # several batches on one rank
        update(metrics, data, rows[4:], coll)
    else:
        update(metrics, data, rows, coll)
    first = {k: m.results() for k, m in metrics.items()}
    scalars = {k: m.compute().item() for k, m in metrics.items()}  # one tensor each, summed over the ranks
    collected = {k: v.item() for k, v in coll.compute().items()}
    second = {k: m.results() for k, m in metrics.items()}  # compute() must not double count
    with metrics["node"].sync_context():  # torchmetrics: the reduced states in place, restored on exit
        synced = {k: v.tolist() for k, v in metrics["node"].states().items()}
    json.dump(
        {"first": first, "second": second, "synced_node": synced, "scalars": scalars, "collected": collected},
        open(out, "w"),
    )
    dist.barrier()
    dist.destroy_process_group()
""")


# Results that are ratios of sums of non-integers (per-sample means, averaged distances): equal only up to
# the rounding of the summation order. Everything else is a ratio of integer sums, exact in float64.
FLOAT_SUMS = (
    "hier_samples",
    "dice_per_sample",
    "hdist@",
    "hP_samples",
    "hR_samples",
    "hF1_samples",
    "wu_palmer_loss",
    "zhao_loss",
)


def _same(a, b, path: str = ""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    elif isinstance(a, str):
        assert a == b, path
    elif any(f in path for f in FLOAT_SUMS):
        assert a == pytest.approx(b, rel=1e-12, abs=1e-15, nan_ok=True), path
    else:
        assert (np.isnan(a) and np.isnan(b)) or a == b, path


def test_two_gloo_ranks_with_uneven_shards_match_single_process(tmp_path):
    setup = tmp_path / "setup.py"
    setup.write_text(SETUP)
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(setup), str(r), str(tmp_path / "init"), str(tmp_path / f"out{r}.json")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("distributed workers timed out")
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log

    scope: dict = {}
    exec(compile(SETUP, "setup", "exec"), scope)
    metrics, data = scope["make"]()
    coll = scope["make_collection"](metrics)
    scope["update"](metrics, data, np.arange(10), coll)
    single = json.loads(json.dumps({k: m.results() for k, m in metrics.items()}))
    single_scalars = {k: m.compute().item() for k, m in metrics.items()}
    outs = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in range(2)]
    for out in outs:
        for run in ("first", "second"):
            for name, value in out[run].items():
                _same(value, single[name], f"{run}/{name}")
        _same(out["scalars"], single_scalars, "scalars")
        assert out["scalars"]["hier_micro"] == single["hier_micro"]["fbeta"]
        _same(out["collected"], M.flatten_results(single["collection"]), "collected")
        synced = dict(out["synced_node"])
        assert synced.pop("updates") == 3.0  # update() calls summed over ranks: 2 on rank 0, 1 on rank 1
        single_states = {k: v.tolist() for k, v in metrics["node"].states().items() if k != "updates"}
        _same(synced, single_states, "synced")
    # the functional API on the whole data agrees too
    t, p, w = data["t"], data["p"], data["w"]
    tree = metrics["hier_micro"].taxonomy
    assert outs[1]["first"]["hier_micro"]["fbeta"] == pytest.approx(
        M.hierarchical_fbeta_score(t, p, taxonomy=tree, sample_weight=w, zero_division=0.0)
    )
    assert outs[0]["first"]["dice_map"]["dice"] == pytest.approx(
        M.nested_dice_score(data["seg_t"], data["seg_p"], taxonomy=tree).tolist()
    )
    assert isinstance(tree, Taxonomy)
