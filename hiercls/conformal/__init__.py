"""Conformal hierarchical prediction: predictions with a finite-sample coverage (or risk) guarantee.

Calibrate on held-out node probabilities and labels, then predict: one node (:class:`NodeConformal`), at most
``r`` nodes (:class:`SetConformal`), or conformal risk control of a hierarchical loss (:class:`RiskConformal`).
``docs/conformal.md`` states the guarantee and shows the trade-off between coverage and depth
(:func:`plot_conformal_curves`).

Example:
    >>> import numpy as np
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> p = np.array([[1.0, 0.9, 0.6, 0.3, 0.1]] * 4)
    >>> NodeConformal(tax, alpha=0.25).fit(p, ["x", "x", "x", "y"]).predict(p[:1]).tolist()  # q = 0.6
    [1]
"""

from __future__ import annotations

from hiercls.conformal import calibrators, chain, plot, sets
from hiercls.conformal.calibrators import *  # noqa: F403
from hiercls.conformal.chain import conformal_quantile, conformal_rank, greedy_chain
from hiercls.conformal.plot import *  # noqa: F403

__all__ = [
    *calibrators.__all__,
    *plot.__all__,
    "chain",
    "conformal_quantile",
    "conformal_rank",
    "greedy_chain",
    "sets",
]
