"""Split-conformal calibrators for hierarchical prediction: one node, a set of at most ``r`` nodes, risk control.

Each calibrator is fitted on held-out *calibration* node probabilities and labels, then turns new probabilities
into predictions with a finite-sample guarantee (``docs/conformal.md`` states it precisely):

* :class:`NodeConformal` (method ``"node"``): one node per input, the deepest node of the greedy chain whose
  probability exceeds the calibrated threshold ``q``. ``P(label under the node) >= 1 - alpha``.
* :class:`SetConformal` (method ``"set"``): a union of at most ``r`` subtrees, from a nested greedy refinement
  (:mod:`hiercls.conformal.sets`). ``P(label under one of the nodes) >= 1 - alpha``. Trees only.
* :class:`RiskConformal` (method ``"risk"``): conformal risk control of a bounded hierarchical loss of the
  one-node prediction (``"overshoot"``, ``"distance"`` or ``"miscoverage"``). ``E[loss] <= alpha``.

The API follows scikit-learn and MAPIE: ``fit(node_probs, labels)`` then ``predict(node_probs)``; for large
calibration sets ``update`` batch by batch, then ``calibrate()``. Under ``torch.distributed`` ``calibrate()``
gathers the per-sample calibration statistics of every rank (the scores; for risk control the chain masses and
label depths), so the threshold is exactly the single-process one. NumPy or torch input on any device; outputs
follow the input (a tensor on its device).

Example:
    >>> import numpy as np
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> rng = np.random.default_rng(0)
    >>> leaf = rng.dirichlet([1.0, 1.0, 1.0], size=200)  # x, y, b
    >>> probs = tax.marginals(leaf)
    >>> labels = tax.leaves[[rng.choice(3, p=q) for q in leaf]]  # drawn from the posterior itself
    >>> cal = NodeConformal(tax, alpha=0.2).fit(probs[:100], labels[:100])
    >>> pred = cal.predict(probs[100:])  # node ids [100]
    >>> s = coverage_summary(pred, labels[100:], tax)
    >>> sorted(s), 0.6 < s["coverage"] <= 1.0
    (['coverage', 'mean_depth', 'mean_set_size'], True)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from hiercls._checks import check_choice, to_numpy
from hiercls._textio import atomic_write
from hiercls.conformal.chain import (
    RANK_SLACK,
    chain_cover_depth,
    check_alpha,
    conformal_quantile,
    greedy_chain,
)
from hiercls.conformal.sets import refine_sequence, set_predictions
from hiercls.decode.inputs import Batch, prepare, restore_ids, restore_sets, restore_values
from hiercls.taxonomy import Taxonomy, TaxonomyError, check_taxonomy, node_id_array

__all__ = [
    "CONFORMAL_METHODS",
    "RISK_LOSSES",
    "ConformalCalibrator",
    "NodeConformal",
    "RiskConformal",
    "SetConformal",
    "coverage_summary",
    "create_conformal",
    "load_conformal",
    "save_conformal",
]

CONFORMAL_METHODS = ("node", "set", "risk")
RISK_LOSSES = ("overshoot", "distance", "miscoverage")


def _gather(parts: dict[str, np.ndarray], group: Any) -> dict[str, np.ndarray]:
    """Concatenate each array over the ranks of ``group`` (rank order); the local arrays without a process group.

    Per-sample values travel unchanged (``all_gather_object``), so the result is exactly what one process holding
    every sample would have: the thresholds are order statistics or sums taken after a deterministic sort.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return parts
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, parts, group=group)
    return {k: np.concatenate([o[k] for o in out]) for k in parts}


class ConformalCalibrator:
    """Base class: accumulates calibration statistics, then computes ``threshold_`` (see the subclasses).

    Attributes:
        taxonomy: the taxonomy.
        alpha: the target miscoverage (or risk) level in ``(0, 1)``.
        threshold_: the calibrated threshold (``inf``: too few calibration samples, every prediction is the root).
        n_calibration_: the number of calibration samples behind ``threshold_`` (all ranks).
    """

    method = ""
    returns = "ids"

    def __init__(self, taxonomy: Taxonomy, alpha: float = 0.1) -> None:
        self.taxonomy = check_taxonomy(taxonomy)
        self.alpha = check_alpha(alpha)
        self.threshold_: float | None = None
        self.n_calibration_ = 0
        self.reset()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.taxonomy.name!r}, alpha={self.alpha}{self._extra_repr()})"

    def _extra_repr(self) -> str:
        return ""

    def options(self) -> dict[str, Any]:
        """The constructor's options beyond ``taxonomy`` and ``alpha`` (``{"r": 2}``, ``{"loss": ...}``)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """The calibrated state, JSON-ready: method, alpha, options, threshold (``None`` for ``inf``), sample count
        and the taxonomy's fingerprint (:func:`load_conformal` refuses another taxonomy)."""
        q = self._check_fitted()
        return {
            "method": self.method,
            "alpha": self.alpha,
            "options": self.options(),
            "threshold": None if math.isinf(q) else q,
            "n_calibration": self.n_calibration_,
            "taxonomy": self.taxonomy.name,
            "taxonomy_fingerprint": self.taxonomy.fingerprint,
        }

    def as_decoder(self) -> Callable[[Any, Taxonomy], Any]:
        """The calibrated prediction as a decoder ``fn(node_probs, taxonomy)``, for code that takes one (e.g.
        :func:`hiercls.models.inference.predict`): node ids ``[B]``, or for :class:`SetConformal` the *closed* node
        sets ``[B, N]`` (the chosen nodes and their ancestors; the chosen nodes are the sets' tips).

        Raises:
            TaxonomyError: called with another taxonomy than the calibrator's.
        """
        self._check_fitted()

        def decode(node_probs: Any, taxonomy: Taxonomy) -> Any:
            if taxonomy is not self.taxonomy and taxonomy != self.taxonomy:
                raise TaxonomyError(
                    f"this calibrator was fitted on taxonomy {self.taxonomy.name!r}, not on {taxonomy.name!r}"
                )
            pred = self.predict(node_probs)
            if self.returns != "sets":
                return pred
            host = pred.cpu().numpy() if isinstance(pred, torch.Tensor) else pred
            closed = np.asarray((sp.csr_matrix(host.astype(np.int32)) @ self.taxonomy.ancestors_sparse).todense()) > 0
            return torch.from_numpy(closed).to(pred.device) if isinstance(pred, torch.Tensor) else closed

        return decode

    def reset(self) -> ConformalCalibrator:
        """Forget the accumulated calibration statistics (``threshold_`` stays until the next ``calibrate``)."""
        self._parts: list[dict[str, np.ndarray]] = []
        return self

    def _batch(self, node_probs: Any, name: str = "node_probs") -> Batch:
        return prepare(node_probs, self.taxonomy, name=name)

    def update(self, node_probs: Any, labels: Any) -> ConformalCalibrator:
        """Add a batch of calibration samples (rows labelled ``-1`` are left out)."""
        batch = self._batch(node_probs)
        y = node_id_array(labels, self.taxonomy, name="labels", allow_ignore=True, rows=batch.x.shape[0])
        keep = y >= 0
        self._parts.append(self._statistics(batch.node[keep], y[keep]))
        return self

    def fit(self, node_probs: Any, labels: Any, *, group: Any = None) -> ConformalCalibrator:
        """``reset()``, ``update(node_probs, labels)`` and ``calibrate(group)`` in one call."""
        return self.reset().update(node_probs, labels).calibrate(group)

    def calibrate(self, group: Any = None) -> ConformalCalibrator:
        """Compute ``threshold_`` from every sample given to ``update`` (on every rank of ``group``).

        Raises:
            ValueError: no calibration samples on any rank.
        """
        keys = self._statistic_keys()
        local = {k: np.concatenate([p[k] for p in self._parts]) if self._parts else self._empty(k) for k in keys}
        stats = _gather(local, group)
        n = len(stats[keys[0]])
        if n == 0:
            raise ValueError(f"{type(self).__name__}: no calibration samples (every label -1, or nothing given)")
        self.threshold_ = self._threshold(stats)
        self.n_calibration_ = n
        return self

    def _check_fitted(self) -> float:
        if self.threshold_ is None:
            raise RuntimeError(f"{type(self).__name__} is not calibrated: call fit(...) or update(...) + calibrate()")
        return self.threshold_

    def scores(self, node_probs: Any, labels: Any) -> Any:
        """The nonconformity score of each (row, label) pair: the label is covered iff ``score <= threshold_``.

        (For :class:`RiskConformal`, the score of the ``"miscoverage"`` construction, i.e. that of
        :class:`NodeConformal`.) Float64 ``[B]``, a tensor on the input's device for tensor input.
        """
        batch = self._batch(node_probs)
        y = node_id_array(labels, self.taxonomy, name="labels", allow_ignore=True, rows=batch.x.shape[0])
        if (y < 0).any():
            raise ValueError("labels: -1 (ignored rows) has no score; leave those rows out")
        return restore_values(self._scores(batch.node, y), batch)

    # -- to be defined by subclasses
    def _statistic_keys(self) -> tuple[str, ...]:
        return ("scores",)

    def _empty(self, key: str) -> np.ndarray:
        return np.zeros(0)

    def _statistics(self, node: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        return {"scores": self._scores(node, y)}

    def _threshold(self, stats: dict[str, np.ndarray]) -> float:
        return conformal_quantile(stats["scores"], self.alpha)

    def _scores(self, node: np.ndarray, y: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def predict(self, node_probs: Any) -> Any:
        raise NotImplementedError


class NodeConformal(ConformalCalibrator):
    """One node per input whose subtree holds the label with probability at least ``1 - alpha``.

    Score of a labelled sample: the chain mass ``m[d + 1]`` of the first greedy-chain node that is *not* above the
    label (``0`` when the whole chain is). Prediction: the deepest chain node with mass ``> threshold_`` (the root
    when none). The label is under that node iff its score is ``<= threshold_``, so split conformal gives
    ``P(covered) >= 1 - alpha`` for exchangeable data (``docs/conformal.md``). On a tree whose posterior is
    consistent (children add up to at most their parent) and for ``threshold_ >= 1/2`` the prediction is the
    ``threshold`` decoder's at ``threshold_``: the conformal step only picks the threshold.

    Works on trees and DAGs. ``predict`` returns node ids ``[B]``.

    Example:
        >>> import numpy as np
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.9, 0.6, 0.3, 0.1], [1.0, 0.3, 0.2, 0.1, 0.7]])
        >>> cal = NodeConformal(tax, alpha=0.5).fit(p, ["y", "b"])  # scores 0.6 and 0
        >>> cal.threshold_, cal.predict(p).tolist()  # rank ceil(3 * 0.5) = 2: q = 0.6; x (0.6) is not > 0.6
        (0.6, [1, 4])
    """

    method = "node"

    def _scores(self, node: np.ndarray, y: np.ndarray) -> np.ndarray:
        path, mass = greedy_chain(node, self.taxonomy)
        d = chain_cover_depth(path, y, self.taxonomy)
        padded = np.concatenate([mass, np.zeros((mass.shape[0], 1))], axis=1)
        return padded[np.arange(len(y)), d + 1]

    def predict(self, node_probs: Any) -> Any:
        """The calibrated node of each row, int64 ``[B]`` (NumPy, or a tensor on the input's device)."""
        q = self._check_fitted()
        batch = self._batch(node_probs)
        path, mass = greedy_chain(batch.node, self.taxonomy)
        k = (mass[:, 1:] > q).sum(1)  # the masses fall along the chain: the nodes above q are a prefix
        return restore_ids(path[np.arange(path.shape[0]), k], batch)


class SetConformal(ConformalCalibrator):
    """At most ``r`` nodes per input whose subtrees together hold the label with probability ``>= 1 - alpha``.

    The candidate sets of a sample form one nested sequence, from the root down to a single leaf, each a union of
    at most ``r`` disjoint subtrees (:func:`~hiercls.conformal.sets.refine_sequence`). Score: the probability mass
    of the largest set of the sequence that misses the label (``0`` when none does). Prediction: the smallest set
    whose mass exceeds ``threshold_``. With ``r = 1`` this is :class:`NodeConformal`; on a flat taxonomy with
    ``r >= K - 1`` (``K`` classes) it is APS (Romano et al. 2020) with ``u = 0``: the most probable classes until
    their mass exceeds the threshold.

    Trees only: the subtrees of a DAG overlap, so their masses do not add. ``predict`` returns boolean ``[B, N]``
    marking each row's (at most ``r``) nodes; :func:`coverage_summary` scores them.

    Example:
        >>> import numpy as np
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("r", "b"), ("r", "c")])  # flat: r=2 covers any two of three classes
        >>> p = np.array([[1.0, 0.5, 0.3, 0.2], [1.0, 0.1, 0.6, 0.3]])
        >>> cal = SetConformal(tax, alpha=0.5, r=2).fit(p, ["b", "c"])  # scores 0.5 ({a} misses b), 0.6 ({b})
        >>> round(cal.threshold_, 6), cal.predict(p).astype(int).tolist()  # rank 2 of 2; {a, b}: 0.8 > 0.6
        (0.6, [[0, 1, 1, 0], [0, 0, 1, 1]])
    """

    method = "set"
    returns = "sets"

    def __init__(self, taxonomy: Taxonomy, alpha: float = 0.1, *, r: int = 2) -> None:
        super().__init__(taxonomy, alpha)
        if not self.taxonomy.is_tree:
            raise TaxonomyError(
                f"SetConformal needs a tree: the subtrees of the DAG {self.taxonomy.name!r} overlap, so a set's "
                "mass is not the sum of its nodes' probabilities; use NodeConformal or RiskConformal, or "
                "taxonomy.to_tree()"
            )
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 1:
            raise ValueError(f"r must be a positive integer (the most nodes per prediction); got {r!r}")
        self.r = int(r)

    def _extra_repr(self) -> str:
        return f", r={self.r}"

    def options(self) -> dict[str, Any]:
        return {"r": self.r}

    def _scores(self, node: np.ndarray, y: np.ndarray) -> np.ndarray:
        drop, mu = refine_sequence(node, self.taxonomy, self.r)
        step = drop[np.arange(len(y)), y]
        never = step >= mu.shape[1]
        return np.where(never, 0.0, mu[np.arange(len(y)), np.minimum(step, mu.shape[1] - 1)])

    def predict(self, node_probs: Any) -> Any:
        """Boolean ``[B, N]`` (NumPy, or a tensor on the input's device): ``True`` at each row's nodes."""
        q = self._check_fitted()
        batch = self._batch(node_probs)
        drop, mu = refine_sequence(batch.node, self.taxonomy, self.r)
        return restore_sets(set_predictions(drop, mu, q, self.taxonomy), batch)


class RiskConformal(NodeConformal):
    """Conformal risk control (Angelopoulos et al., ICLR 2024) of a hierarchical loss of the one-node prediction.

    The prediction at level ``lam`` is :class:`NodeConformal`'s at threshold ``lam``: the deepest greedy-chain node
    with mass ``> lam``. Raising ``lam`` climbs the chain, so each loss below never increases with ``lam``:

    * ``"overshoot"``: the number of levels the prediction must climb to cover the label, over the height ``H``.
    * ``"distance"``: the shortest-path distance from the prediction to the label while it misses the label
      (``0`` once it covers it), over ``2 H``. Trees only.
    * ``"miscoverage"``: 1 when the prediction misses the label; risk control then equals :class:`NodeConformal`.

    ``threshold_ = inf{lam : n / (n + 1) R_n(lam) + B / (n + 1) <= alpha}`` with ``B = 1`` (the losses are
    normalised), computed exactly: ``R_n`` is a step function whose steps are the calibration chain masses, and
    the integer loss sums are accumulated in one sorted sweep. ``E[loss(test)] <= alpha``.

    Example:
        >>> import numpy as np
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.9, 0.6, 0.3, 0.1]] * 3)
        >>> cal = RiskConformal(tax, alpha=0.5, loss="overshoot").fit(p, ["y", "y", "x"])
        >>> cal.threshold_, cal.predict(p[:1]).tolist()  # x misses y twice by 1 level of 2: risk 1/3 at lam=0
        (0.0, [2])
    """

    method = "risk"

    def __init__(self, taxonomy: Taxonomy, alpha: float = 0.1, *, loss: str = "overshoot") -> None:
        super().__init__(taxonomy, alpha)
        self.loss = check_choice(loss, RISK_LOSSES, "loss")
        if self.loss == "distance" and not self.taxonomy.is_tree:
            raise TaxonomyError(
                f"RiskConformal(loss='distance') needs a tree; {self.taxonomy.name!r} is a DAG, where a missing "
                "prediction's distance to the label need not fall as it climbs the chain: use loss='overshoot'"
            )

    def _extra_repr(self) -> str:
        return f", loss={self.loss!r}"

    def options(self) -> dict[str, Any]:
        return {"loss": self.loss}

    def _statistic_keys(self) -> tuple[str, ...]:
        return ("mass", "cover", "label_depth")

    def _empty(self, key: str) -> np.ndarray:
        if key == "mass":
            return np.zeros((0, self.taxonomy.height))
        return np.zeros(0, dtype=np.int64)

    def _statistics(self, node: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        path, mass = greedy_chain(node, self.taxonomy)
        d = chain_cover_depth(path, y, self.taxonomy)
        return {"mass": mass[:, 1:], "cover": d, "label_depth": np.asarray(self.taxonomy.depth)[y]}

    def _losses(self, cover: np.ndarray, label_depth: np.ndarray) -> tuple[np.ndarray, int]:
        """Integer loss of the prediction at each chain position ``k = 0..H`` ``[n, H + 1]``, and its bound."""
        height = self.taxonomy.height
        over = np.maximum(np.arange(height + 1)[None, :] - cover[:, None], 0)
        if self.loss == "miscoverage":
            return (over > 0).astype(np.int64), 1
        if self.loss == "overshoot":
            return over, max(height, 1)
        return np.where(over > 0, over + (label_depth - cover)[:, None], 0), max(2 * height, 1)

    def _threshold(self, stats: dict[str, np.ndarray]) -> float:
        mass, cover = stats["mass"], stats["cover"]
        n, height = mass.shape
        loss, bound = self._losses(cover, stats["label_depth"])
        # The prediction at lam is chain position k(lam) = #{k >= 1: mass_k > lam}. Passing lam = mass_k moves it
        # from k to k - 1 (masses fall along the chain): an event that changes the loss by loss[k-1] - loss[k].
        length = (mass > 0).sum(1) if height else np.zeros(n, dtype=np.int64)
        total = int(loss[np.arange(n), length].sum())  # R at lam = 0, as an integer sum
        events = mass.ravel()
        delta = (loss[:, :-1] - loss[:, 1:]).ravel()
        live = (events > 0) & (delta != 0)
        events, delta = events[live], delta[live]
        order = np.lexsort((delta, events))
        events, sums = events[order], total + np.cumsum(delta[order])
        # Feasible: n/(n+1) R + B/(n+1) <= alpha, i.e. sum + bound <= alpha (n + 1) bound (same slack as the rank).
        limit = self.alpha * (n + 1) * bound - bound + RANK_SLACK * bound
        if total <= limit:
            return 0.0
        last = np.r_[events[1:] != events[:-1], True]  # the risk after all events of one value
        ok = np.flatnonzero(last & (sums <= limit))
        return float(events[ok[0]]) if ok.size else math.inf


def create_conformal(method: str, taxonomy: Taxonomy, alpha: float = 0.1, **options: Any) -> ConformalCalibrator:
    """A calibrator by name: ``"node"``, ``"set"`` (option ``r``) or ``"risk"`` (option ``loss``).

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> create_conformal("set", Taxonomy([("r", "a"), ("r", "b")]), 0.1, r=3)
        SetConformal('taxonomy', alpha=0.1, r=3)
    """
    kind = check_choice(method, CONFORMAL_METHODS, "method")
    cls = {"node": NodeConformal, "set": SetConformal, "risk": RiskConformal}[kind]
    return cls(taxonomy, alpha, **options)


def save_conformal(path: str | os.PathLike[str], calibrators: Sequence[ConformalCalibrator]) -> None:
    """Write calibrated calibrators to a JSON file (atomically), e.g. ``<run>/conformal.json``.

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.9, 0.6, 0.3, 0.1]] * 4)
        >>> cal = NodeConformal(tax, alpha=0.25).fit(p, ["x", "x", "x", "y"])
        >>> path = os.path.join(tempfile.mkdtemp(), "conformal.json")
        >>> save_conformal(path, [cal])
        >>> [again] = load_conformal(path, tax)
        >>> again.threshold_ == cal.threshold_, again.predict(p[:1]).tolist()
        (True, [1])
    """
    states = [c.to_dict() for c in calibrators]
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"format": "hiercls-conformal", "version": 1, "calibrators": states}, indent=2))


def load_conformal(path: str | os.PathLike[str], taxonomy: Taxonomy) -> list[ConformalCalibrator]:
    """The calibrators :func:`save_conformal` wrote, ready to ``predict``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a file of calibrators, or an entry that cannot be read (its index named).
        TaxonomyError: calibrated on another taxonomy (the fingerprints differ).
    """
    tax = check_taxonomy(taxonomy)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{os.fspath(path)}: not a JSON file of conformal calibrators ({e})") from None
    if not isinstance(data, dict) or data.get("format") != "hiercls-conformal":
        raise ValueError(f"{os.fspath(path)}: not a file of conformal calibrators (no format 'hiercls-conformal')")
    out = []
    for i, state in enumerate(data.get("calibrators", [])):
        where = f"{os.fspath(path)}: calibrators[{i}]"
        try:
            cal = create_conformal(state["method"], tax, state["alpha"], **state.get("options", {}))
            threshold, n = state["threshold"], int(state["n_calibration"])
            fingerprint = state["taxonomy_fingerprint"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: unreadable calibrator ({e})") from None
        if fingerprint != tax.fingerprint:
            raise TaxonomyError(f"{where} was calibrated on taxonomy {state.get('taxonomy')!r}, not on {tax.name!r}")
        cal.threshold_ = math.inf if threshold is None else float(threshold)
        cal.n_calibration_ = n
        out.append(cal)
    return out


def coverage_summary(predictions: Any, labels: Any, taxonomy: Taxonomy) -> dict[str, float]:
    """Empirical coverage, mean set size (leaves covered) and mean depth of node or node-set predictions.

    Args:
        predictions: node ids ``[B]`` or boolean node sets ``[B, N]`` (each ``True`` node covers its subtree).
        labels: true node ids or names ``[B]``.
        taxonomy: the taxonomy.

    Returns:
        ``{"coverage", "mean_set_size", "mean_depth"}``; a node set's depth is the mean depth of its nodes.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> coverage_summary([1, 4], ["x", "y"], tax)  # a covers x; b misses y
        {'coverage': 0.5, 'mean_set_size': 1.5, 'mean_depth': 1.0}
    """
    tax = check_taxonomy(taxonomy)
    pred = np.asarray(to_numpy(predictions, name="predictions"))
    y = node_id_array(labels, tax, name="labels", allow_ignore=True, rows=pred.shape[0])
    if (y < 0).any():
        raise ValueError("labels: -1 (ignored rows) cannot be scored; leave those rows out")
    anc = tax.ancestors_sparse  # anc[y, v] = 1: v is an ancestor of y, or y
    leaves, depth = np.asarray(tax.num_leaves_under, dtype=np.float64), np.asarray(tax.depth, dtype=np.float64)
    if pred.ndim == 1:
        ids = pred.astype(np.int64)
        covered = np.asarray(anc[y, ids]).ravel() > 0
        return _summary(covered, leaves[ids], depth[ids])
    sets = pred.astype(bool)
    if sets.shape != (len(y), tax.num_nodes):
        raise ValueError(f"predictions must be node ids [B] or node sets [B, {tax.num_nodes}]; got {list(sets.shape)}")
    covered = np.asarray((anc[y].multiply(sets)).sum(1)).ravel() > 0
    count = np.maximum(sets.sum(1), 1)
    return _summary(covered, sets @ leaves, (sets @ depth) / count)


def _summary(covered: np.ndarray, size: np.ndarray, depth: np.ndarray) -> dict[str, float]:
    return {"coverage": float(covered.mean()), "mean_set_size": float(size.mean()), "mean_depth": float(depth.mean())}
