"""The stateful metrics as torchmetrics metrics: MetricCollection, state_dict inside a module, merge, device moves,
forward, the never-updated error. References are the functional API on the same (concatenated) data."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
import torchmetrics
from _generators import random_tree

import hiercls.metrics as M
from hiercls.metrics import stateful


def _data(seed: int = 0, n: int = 30):
    rng = np.random.default_rng(seed)
    tax = random_tree(25, rng)
    leaves = np.asarray(tax.leaves)
    t = rng.choice(leaves, n)
    scores = rng.random((n, len(leaves)))
    p = leaves[scores.argmax(1)]
    p[::4] = rng.integers(1, tax.num_nodes, len(p[::4]))  # some internal predictions
    return tax, t, p, scores


def test_every_class_is_a_torchmetrics_metric_with_sum_states():
    tax = random_tree(6, 0)
    for m in (
        M.HierarchicalFBeta(tax),
        M.NodeF1(tax),
        M.MistakeSeverity(tax),
        M.TopKMetrics(tax, k=(1,)),
        M.LevelAccuracy(tax),
        M.NestedDice(num_regions=2),
        M.HierarchicalMetrics(tax),
    ):
        assert isinstance(m, torchmetrics.Metric) and isinstance(m, torch.nn.Module)
        assert all(v.dtype == torch.float64 for v in m.states().values())  # summed over ranks: see test_metrics_ddp
        assert set(m.state_dict()) == set(m.state_names())


def test_metric_collection_matches_the_functions_and_keeps_other_configurations_apart():
    tax, t, p, _ = _data()
    coll = torchmetrics.MetricCollection(
        {
            "all": M.HierarchicalMetrics(tax, k=(1, 2)),
            "same": M.HierarchicalMetrics(tax, k=(1, 2)),  # may share the state of "all" (compute groups)
            "lca": M.MistakeSeverity(tax),
            "zhao": M.MistakeSeverity(tax, distance="zhao"),
            "hf2": M.HierarchicalFBeta(tax, beta=2.0, zero_division=0.0),
            "hf1": M.HierarchicalFBeta(tax, zero_division=0.0),
        },
        compute_groups=True,
    )
    # the first batch has no mistakes: every MistakeSeverity state is equal, whatever the distance, so only the
    # configuration marker keeps torchmetrics from merging "lca" and "zhao" into one compute group
    right = slice(0, 4)
    coll.update(t[right], t[right])
    coll.update(p, t)
    res = coll.compute()
    both_t, both_p = np.concatenate([t[right], t]), np.concatenate([t[right], p])
    kw = {"taxonomy": tax}
    # one scalar tensor per metric, under the metric's name
    assert res["all"].item() == pytest.approx(M.hierarchical_f1_score(both_t, both_p, **kw))
    assert res["lca"].item() == pytest.approx(M.mistake_severity(both_t, both_p, **kw))
    zhao_mean = M.zhao_loss(both_t, both_p, **kw)
    assert coll["zhao"].results()["mean_distance"] == pytest.approx(zhao_mean)
    assert coll["lca"].results()["mean_distance"] != pytest.approx(zhao_mean)
    assert coll["hf2"].results()["fbeta"] == pytest.approx(
        M.hierarchical_fbeta_score(both_t, both_p, beta=2.0, zero_division=0.0, **kw)
    )
    assert coll["hf1"].results()["fbeta"] == pytest.approx(M.hierarchical_f1_score(both_t, both_p, **kw))
    assert coll["same"].results()["hF1_micro"] == pytest.approx(M.hierarchical_f1_score(both_t, both_p, **kw))
    groups = [sorted(g) for g in coll.compute_groups.values()]
    assert ["lca"] in groups and ["zhao"] in groups and ["hf1"] in groups and ["hf2"] in groups
    assert ["all", "same"] in groups


def test_hf1_equals_the_functional_call_over_batches():
    tax, t, p, _ = _data(1)
    m = M.HierarchicalFBeta(tax)
    for chunk in np.array_split(np.arange(len(t)), 4):
        m.update(torch.as_tensor(p[chunk]), torch.as_tensor(t[chunk]))
    assert m.results()["fbeta"] == pytest.approx(M.hierarchical_f1_score(t, p, taxonomy=tax), rel=1e-12)


def test_merge_of_two_equals_one_over_concatenated_data():
    tax, t, p, scores = _data(2)
    a, b, whole = (M.HierarchicalMetrics(tax, k=(1, 3)) for _ in range(3))
    a.update(p[:11], t[:11], y_score=scores[:11])
    b.update(p[11:], t[11:], y_score=scores[11:])
    whole.update(p, t, y_score=scores)
    merged = a.merge(b).results()
    ref = whole.results()
    assert merged.keys() == ref.keys()
    for k, v in ref.items():
        assert merged[k] == (v if isinstance(v, str) else pytest.approx(v, rel=1e-12, nan_ok=True)), k
    with pytest.raises(ValueError, match="different configurations"):
        M.MistakeSeverity(tax).merge_state(M.MistakeSeverity(tax, distance="zhao"))
    with pytest.raises(TypeError, match="NodeF1"):
        M.NodeF1(tax).merge(M.MistakeSeverity(tax))


def test_state_dict_round_trip_inside_a_module():
    tax, t, p, scores = _data(3)

    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(2, 2)
            self.metrics = M.HierarchicalMetrics(tax, k=(1,))

    src = Holder()
    src.metrics.update(p, t, y_score=scores)
    sd = src.state_dict()
    assert "metrics.hier.inter" in sd and "metrics.updates" in sd and "head.weight" in sd
    dst = Holder()
    dst.load_state_dict(sd)
    assert dst.metrics.results() == src.metrics.results()
    dst.metrics.update(p[:5], t[:5], y_score=scores[:5])  # accumulation goes on from the loaded sums
    again = M.HierarchicalMetrics(tax, k=(1,))
    again.update(np.concatenate([p, p[:5]]), np.concatenate([t, t[:5]]), y_score=np.concatenate([scores, scores[:5]]))
    assert dst.metrics.results()["hF1_micro"] == pytest.approx(again.results()["hF1_micro"])
    lean = Holder()
    lean.metrics.persistent(False)  # torchmetrics's switch: the sums stay out of the module's state_dict
    assert not any(k.startswith("metrics.") for k in lean.state_dict())
    lean.load_state_dict({k: v for k, v in sd.items() if not k.startswith("metrics.")})
    bad = dict(sd)
    bad["metrics.node.tp"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"node.tp.*shape \(3,\)"):
        Holder().load_state_dict(bad)
    with pytest.raises(ValueError, match=r"missing \['hier\.inter'\]"):
        M.HierarchicalMetrics(tax, k=(1,)).load_state_dict(
            {k[8:]: v for k, v in sd.items() if k != "metrics.hier.inter" and k.startswith("metrics.")}
        )


def test_states_follow_the_module_device_and_stay_float64():
    tax, t, p, _ = _data(4)
    moved = torch.nn.ModuleDict({"m": M.NodeF1(tax, zero_division=0.0)}).to("meta")
    assert all(v.device.type == "meta" for v in moved["m"].states().values())  # a device move without a GPU
    holder = torch.nn.ModuleDict({"m": M.NodeF1(tax, zero_division=0.0)})
    holder.float()  # torchmetrics keeps the float64 sums through dtype casts
    m = holder["m"]
    assert all(v.device.type == "cpu" and v.dtype == torch.float64 for v in m.states().values())
    m.update(p, t)
    assert m.results()["macro_f1"] == pytest.approx(
        M.node_f1_score(t, p, taxonomy=tax, average="macro", zero_division=0.0)
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_update_and_compute_on_the_gpu():
    tax, t, p, scores = _data(5)
    m = M.HierarchicalMetrics(tax, k=(1,)).to("cuda")
    m.update(
        torch.as_tensor(p, device="cuda"), torch.as_tensor(t, device="cuda"), y_score=torch.as_tensor(scores).cuda()
    )
    assert m.exact.device.type == "cuda"
    ref = M.hierarchical_report(t, p, taxonomy=tax, y_score=scores, k=(1,), output_dict=True)
    assert m.results()["hF1_micro"] == pytest.approx(ref["hF1_micro"])


def test_compute_before_update_raises_and_forward_gives_the_batch_value():
    tax, t, p, _ = _data(6)
    m = M.MistakeSeverity(tax)
    with pytest.raises(RuntimeError, match=r"MistakeSeverity.compute\(\) was called before any update\(\)"):
        m.compute()
    m.update([], [])  # an empty batch is an update: the ratios are then undefined (NaN), not an error
    assert np.isnan(m.results()["mistake_severity"])
    batch = m(p[:10], t[:10])  # forward: the batch's value, and the batch is added
    assert batch.item() == pytest.approx(M.mistake_severity(t[:10], p[:10], taxonomy=tax))
    m.update(p[10:], t[10:])
    assert m.results()["mistake_severity"] == pytest.approx(M.mistake_severity(t, p, taxonomy=tax))
    m.reset()
    with pytest.raises(RuntimeError, match="before any update"):
        m.compute()
    m.update(p, t)  # the failed compute left the metric usable
    assert m.update_count == 1


def test_flatten_results_for_loggers():
    tax, t, p, scores = _data(7)
    res = M.hierarchical_report(t, p, taxonomy=tax, y_score=scores, k=(1,), output_dict=True)
    flat = M.flatten_results(res, prefix="val/")
    assert flat["val/hF1_micro"] == res["hF1_micro"]
    assert [flat[f"val/per_level_accuracy/{i + 1}"] for i in range(len(res["per_level_accuracy"]))] == pytest.approx(
        res["per_level_accuracy"], nan_ok=True
    )
    assert all(isinstance(v, float) for v in flat.values())
    assert "val/mistake_severity_distance" not in flat
    assert stateful.flatten_results is M.flatten_results


def test_higher_is_better_follows_the_output_and_the_collection_plots():
    tax, t, p, scores = _data(8)
    coll = M.HierarchicalMetrics.collection(tax, k=(1, 2))
    for name, m in coll.items():
        want = None if "support" in name else not any(s in name for s in ("loss", "hdist", "severity", "error_"))
        if name == "mean_distance":
            want = False
        assert m.higher_is_better is want, name
        assert m.output == name
    coll.update(p, t, y_score=scores)
    fig, ax = coll["hF1_micro"].plot()
    assert ax.get_ylim()[1] >= 1.0  # a ratio: plotted up to 1
    plt.close(fig)
    small = M.HierarchicalFBeta.collection(tax)
    small.update(p, t)
    fig, _ = small.plot(together=True)  # the collection's own plot: hP, hR and hF in one figure
    plt.close(fig)
