"""Coverage and depth against alpha, for every conformal method and for the posterior ``threshold`` decoder.

:func:`conformal_curves` computes the numbers (averaged over random calibration / test splits of the same rows);
:func:`plot_conformal_curves` draws them into a PNG (matplotlib, imported when called).

Example:
    >>> import numpy as np
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> rng = np.random.default_rng(0)
    >>> leaf = rng.dirichlet([1.0, 1.0, 1.0], size=300)
    >>> labels = tax.leaves[[rng.choice(3, p=q) for q in leaf]]
    >>> curves = conformal_curves(tax.marginals(leaf), labels, tax, alphas=[0.1, 0.2], splits=2)
    >>> sorted(curves["methods"]), len(curves["methods"]["node"]["coverage"])
    (['node', 'risk:overshoot', 'set:r=2', 'threshold'], 2)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from hiercls.conformal.calibrators import NodeConformal, RiskConformal, SetConformal, coverage_summary
from hiercls.conformal.chain import conformal_quantile, greedy_chain
from hiercls.conformal.sets import refine_sequence, set_predictions
from hiercls.decode import threshold as threshold_decoder
from hiercls.decode.inputs import prepare
from hiercls.taxonomy import Taxonomy, check_taxonomy, node_id_array

__all__ = ["conformal_curves", "plot_conformal_curves"]

DEFAULT_ALPHAS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4)


def _split_rows(n: int, fraction: float, splits: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"calibration_fraction must be in (0, 1); got {fraction!r}")
    rng = np.random.default_rng(seed)
    k = max(1, min(n - 1, round(n * fraction)))
    return [(p[:k], p[k:]) for p in (rng.permutation(n) for _ in range(splits))]


def conformal_curves(
    node_probs: Any,
    labels: Any,
    taxonomy: Taxonomy,
    *,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    calibration_fraction: float = 0.5,
    splits: int = 20,
    r: int = 2,
    loss: str = "overshoot",
    seed: int = 0,
) -> dict[str, Any]:
    """Mean test coverage and mean depth at each ``alpha`` for ``node``, ``set:r=<r>``, ``risk:<loss>`` and the
    non-conformal ``threshold`` decoder at ``1 - alpha``, over ``splits`` random calibration / test splits.

    Each sample's greedy chain and refinement sequence are computed once; each split only recomputes thresholds.
    ``set`` is left out on a DAG (:class:`~hiercls.conformal.SetConformal` needs a tree).

    Returns:
        ``{"alphas": [...], "n_calibration": int, "n_test": int, "methods": {name: {"coverage": [...],
        "mean_depth": [...], "mean_set_size": [...]}}}``.
    """
    tax = check_taxonomy(taxonomy)
    node = prepare(node_probs, tax, name="node_probs").node
    y = node_id_array(labels, tax, name="labels", allow_ignore=True, rows=node.shape[0])
    node, y = node[y >= 0], y[y >= 0]
    rows = _split_rows(len(y), calibration_fraction, splits, seed)
    path, mass = greedy_chain(node, tax)
    node_scores = NodeConformal(tax).scores(node, y)
    set_cal = SetConformal(tax, r=r) if tax.is_tree else None
    drop, mu = refine_sequence(node, tax, r) if set_cal else (None, None)
    set_scores = set_cal.scores(node, y) if set_cal else None
    names = ["node", f"set:r={r}", f"risk:{loss}", "threshold"] if set_cal else ["node", f"risk:{loss}", "threshold"]
    keys = ("coverage", "mean_depth", "mean_set_size")
    out = {m: {k: np.zeros(len(alphas)) for k in keys} for m in names}
    for i, alpha in enumerate(alphas):
        for cal, test in rows:
            preds = {
                "node": _chain_pick(path, mass, test, conformal_quantile(node_scores[cal], alpha)),
                f"risk:{loss}": _chain_pick(path, mass, test, _risk_threshold(tax, alpha, loss, node, y, cal)),
                "threshold": threshold_decoder(node[test], tax, threshold=1.0 - alpha),
            }
            if set_cal:
                q = conformal_quantile(set_scores[cal], alpha)
                preds[f"set:r={r}"] = set_predictions(drop[test], mu[test], q, tax)
            for m, pred in preds.items():
                for k, v in coverage_summary(pred, y[test], tax).items():
                    out[m][k][i] += v / len(rows)
    return {
        "alphas": [float(a) for a in alphas],
        "n_calibration": len(rows[0][0]),
        "n_test": len(rows[0][1]),
        "methods": {m: {k: v.tolist() for k, v in d.items()} for m, d in out.items()},
    }


def _chain_pick(path: np.ndarray, mass: np.ndarray, rows: np.ndarray, q: float) -> np.ndarray:
    """The deepest chain node with mass above ``q`` for each of ``rows``."""
    k = (mass[rows, 1:] > q).sum(1)
    return path[rows, k]


def _risk_threshold(tax: Taxonomy, alpha: float, loss: str, node: np.ndarray, y: np.ndarray, cal: np.ndarray) -> float:
    return RiskConformal(tax, alpha, loss=loss).fit(node[cal], y[cal]).threshold_


def plot_conformal_curves(
    node_probs: Any,
    labels: Any,
    taxonomy: Taxonomy,
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Write a PNG with two panels, coverage vs alpha (with the ``1 - alpha`` target) and mean depth vs alpha,
    for every method of :func:`conformal_curves` (``options`` go there); returns the curves.

    Raises:
        ImportError: matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = conformal_curves(node_probs, labels, taxonomy, **options)
    a = np.asarray(curves["alphas"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    styles = {"node": "o-", "threshold": "k--"}
    for name, c in curves["methods"].items():
        style = styles.get(name, "s-" if name.startswith("set") else "^-")
        label = f"{name} (posterior, not conformal)" if name == "threshold" else name
        left.plot(a, c["coverage"], style, label=label)
        right.plot(a, c["mean_depth"], style, label=label)
    left.plot(a, 1 - a, color="grey", lw=3, alpha=0.4, label="target 1 - alpha")
    left.set(xlabel="alpha", ylabel="test coverage", title="coverage")
    right.set(xlabel="alpha", ylabel="mean depth of the prediction", title="specificity")
    left.legend(fontsize=8)
    n = f"{curves['n_calibration']} calibration / {curves['n_test']} test rows, mean of the splits"
    fig.suptitle(f"{title + ': ' if title else ''}{n}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return curves
