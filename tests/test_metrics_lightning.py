"""Lightning logs the stateful metrics as it logs torchmetrics' own (issue 29, findings 1-2): ``self.log(name,
metric)`` of one metric object (``update`` or ``forward`` in the step) and ``self.log_dict(collection)`` of a
``Metric.collection``, on a tiny CPU ``Trainer``. The logged values must equal hiercls's functions on the same data
(scikit-learn order), so precision and recall cannot come back swapped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _generators import random_tree
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

import hiercls.metrics as M
from hiercls.taxonomy import Taxonomy

L = pytest.importorskip("lightning")

BATCH = 8


def _data(seed: int, n: int, tax):
    rng = np.random.default_rng(seed)
    leaves = np.asarray(tax.leaves)
    target = rng.choice(leaves, n)
    scores = rng.random((n, len(leaves)))
    preds = leaves[scores.argmax(1)]
    preds[::3] = tax.parent[target[::3]]  # a parent predicted for its leaf: hP 1, hR < 1 on those samples
    return torch.as_tensor(preds), torch.as_tensor(target), torch.as_tensor(scores)


class Scorer(L.LightningModule):
    """Scores given predictions; the one parameter only gives the optimizer something to step."""

    def __init__(self, tax) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.train_hf1 = M.HierarchicalFBeta(tax)
        self.val_hp = M.HierarchicalPrecision(tax)
        self.val_hr = M.HierarchicalRecall(tax)
        self.val_all = M.HierarchicalMetrics.collection(tax, k=(1, 2), prefix="val/")

    def training_step(self, batch, batch_idx):
        preds, target, _ = batch
        self.train_hf1(preds, target)  # forward: the batch value on step, the accumulated one on epoch
        self.log("train/hF1", self.train_hf1, on_step=True, on_epoch=True)
        return (self.weight - 1.0) ** 2

    def validation_step(self, batch, batch_idx):
        preds, target, scores = batch
        self.val_hp.update(preds, target)
        self.val_hr.update(preds, target)
        self.log("val/hP", self.val_hp)
        self.log("val/hR", self.val_hr)
        self.val_all.update(preds, target, y_score=scores)
        self.log_dict(self.val_all)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(data):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data), batch_size=BATCH, shuffle=False)


def test_self_log_and_log_dict_equal_the_functions(tmp_path) -> None:
    tax = random_tree(30, np.random.default_rng(0))
    train, val = _data(1, 3 * BATCH, tax), _data(2, 3 * BATCH - 3, tax)  # an uneven last batch
    module = Scorer(tax)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, _loader(train), _loader(val))
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    p, t, s = (x.numpy() for x in val)
    kw = {"taxonomy": tax}
    # the second epoch's values: the metrics were reset between epochs
    assert logged["val/hP"] == pytest.approx(M.hierarchical_precision_score(t, p, **kw), rel=1e-12)
    assert logged["val/hR"] == pytest.approx(M.hierarchical_recall_score(t, p, **kw), rel=1e-12)
    assert logged["val/hP"] > logged["val/hR"]  # parents predicted for leaves: the precision is the higher
    tp, tt = train[0].numpy(), train[1].numpy()
    assert logged["train/hF1_epoch"] == pytest.approx(M.hierarchical_f1_score(tt, tp, **kw), rel=1e-12)
    last = slice(2 * BATCH, 3 * BATCH)
    assert logged["train/hF1_step"] == pytest.approx(M.hierarchical_f1_score(tt[last], tp[last], **kw), rel=1e-12)
    report = M.flatten_results(M.hierarchical_report(t, p, y_score=s, k=(1, 2), output_dict=True, **kw), "val/")
    assert set(report) <= set(logged)
    for key, want in report.items():
        assert logged[key] == pytest.approx(want, rel=1e-12, nan_ok=True), key


def test_parent_for_its_leaf_the_torchmetrics_way() -> None:
    """The issue's case: the parent predicted for its leaf gives hP 1.0 and hR 0.5, called as torchmetrics'
    metrics are (also inside a MetricCollection beside MulticlassAccuracy); the old keywords are refused."""
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    preds, target = torch.tensor([tax.index("a")]), torch.tensor([tax.index("x")])
    coll = MetricCollection(
        {
            "hP": M.HierarchicalPrecision(tax),
            "hR": M.HierarchicalRecall(tax),
            "hF": M.HierarchicalFBeta(tax),
            "acc": MulticlassAccuracy(num_classes=tax.num_nodes, average="micro"),
        }
    )
    coll.update(preds, target)
    res = {k: v.item() for k, v in coll.compute().items()}
    assert res == pytest.approx({"hP": 1.0, "hR": 0.5, "hF": 2 / 3, "acc": 0.0})
    assert [g for g in coll.compute_groups.values() if len(g) > 1] == [["hF", "hP", "hR"]]  # one shared state
    assert M.hierarchical_precision_score(target, preds, taxonomy=tax) == 1.0  # the functions: scikit-learn order
    with pytest.raises(TypeError, match=r"update\(preds, target\)"):
        M.HierarchicalFBeta(tax).update(y_true=target, y_pred=preds)
    with pytest.raises(TypeError, match="old one"):
        M.TopKMetrics(tax, k=(1,)).update(["x"], np.array([[0.2, 0.5, 0.3]]))  # (y_true, y_score)
    with pytest.raises(ValueError, match=r"preds\[0\] = -1 .*update\(\) takes \(preds, target\)"):
        M.HierarchicalFBeta(tax).update(torch.tensor([-1]), preds)  # the old order: an ignored truth first
    with pytest.raises(ValueError, match=r"preds\[0, 1\] = 0\.5.*only 0/1"):
        M.HierarchicalFBeta(tax).update(np.array([[1.0, 0.5, 0.5, 0.0, 0.5]]), target)  # probabilities as preds
