"""The decoder x metric table of Plaud et al., "To Each Metric Its Decoding" (ICML 2025).

Rows are decoders (specs of :func:`hiercls.decode.parse_decoder`), columns are metrics, and every cell holds two
numbers: the *realised* value against the true labels, and the *expected* value under the model's posterior (the
label distribution implied by the probabilities, taken as the true distribution of the label). Each column names
the decoder that is Bayes-optimal for it by theory; its expected value is the best of the column (up to ties), the
realised one need not be. Every value comes from the existing metrics (:mod:`hiercls.metrics`) and expected
scores (:func:`hiercls.decode.expected_hfbeta`, :func:`hiercls.decode.prediction_expected_cost`).

Columns (:data:`TABLE_METRICS`; ``hF<β>`` for any ``β > 0`` is accepted too):

* ``accuracy``: exact match (node sets: the closed sets agree, root aside). Optimal: ``argmax_leaf`` when the
  labels are leaves (Plaud et al.'s setting); with probability mass on internal labels no column mark is given.
* ``hF0.5``, ``hF1``, ``hF2``: per-sample hF-β (``average="samples"``, root left out). Optimal:
  ``optimal_hfbeta:beta=β`` (Plaud et al., Sec. 4).
* ``mistake_severity_lca``: Bertinetto et al. (CVPR 2020), the LCA height ``H - depth(lca)`` averaged over the
  mistakes only (its expectation: the summed expected LCA height over the summed mistake probability). A ratio
  over mistakes has no per-sample Bayes decision, so no decoder is marked.
* ``mistake_severity_path``: Plaud et al.'s mistake severity, the shortest-path distance averaged over all
  samples. Optimal: ``bayes_node:cost=shortest_path``.
* ``wu_palmer``, ``zhao``: the cost forms of Plaud et al. (:meth:`hiercls.taxonomy.Taxonomy.distance`).
  Optimal: ``bayes_node`` with that cost.
* ``hamming``: :func:`hiercls.metrics.hamming_loss` on the closed node sets. Optimal over all node sets:
  ``majority``, the set ``{n: P(n) > 1/2}`` (one chain on a tree).
* ``cost``: any cost, a name of :data:`hiercls.decode.COST_KINDS` or a matrix ``[N, L]`` / ``[N, N]``
  (``cost=``, default ``"lca_height"``, the objective of CRM), averaged over all samples
  (:func:`hiercls.metrics.realized_cost`). Optimal: ``bayes_node`` with that cost.

Distances are between two nodes: they are ``None`` (``-`` in the text) for decoders that return node sets.

Example:
    >>> import numpy as np
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
    >>> leaf = np.array([[0.3, 0.3, 0.4], [0.7, 0.2, 0.1]])  # leaves x, y, b
    >>> t = decoder_metric_table(leaf, ["x", "x"], tax, ["argmax_leaf", "crm"], ["accuracy", "cost"],
    ...                          leaf_probs=True)
    >>> t.expected["argmax_leaf"]["accuracy"], t.realised["crm"]["accuracy"]
    (0.55, 1.0)
    >>> t.optimal  # crm looks at the leaves only; the optimal decoder of the cost column is added
    {'accuracy': 'argmax_leaf', 'cost': 'bayes_node:cost=lca_height'}
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from hiercls._checks import check_beta, did_you_mean, to_numpy
from hiercls._textio import read_bytes, read_text
from hiercls.conformal import ConformalCalibrator, create_conformal
from hiercls.conformal import coverage_summary as conformal_coverage
from hiercls.decode import (
    COST_KINDS,
    DecoderSpec,
    check_probabilities,
    expected_cost,
    expected_hfbeta,
    parse_decoder,
    probability_checks,
)
from hiercls.decode.checks import probability_checks_enabled
from hiercls.decode.inputs import label_distribution
from hiercls.decode.spec import format_number
from hiercls.evaluation.files import label_ids, load_labels, load_probabilities
from hiercls.evaluation.report import format_table
from hiercls.metrics import (
    exact_match_score,
    hamming_loss,
    hierarchical_fbeta_score,
    mistake_severity,
    realized_cost,
)
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.core import check_taxonomy

__all__ = [
    "TABLE_DECODERS",
    "TABLE_METRICS",
    "ConformalRows",
    "DecoderMetricTable",
    "calibration_rows",
    "conformal_rows",
    "decoder_metric_table",
]

TABLE_METRICS: tuple[str, ...] = (
    "accuracy",
    "hF0.5",
    "hF1",
    "hF2",
    "mistake_severity_lca",
    "mistake_severity_path",
    "wu_palmer",
    "zhao",
    "hamming",
    "cost",
)
"""The columns of :func:`decoder_metric_table` by default, in order."""

TABLE_DECODERS: tuple[str, ...] = (
    "argmax_leaf",
    "top_down",
    "majority",
    "plurality",
    "max_info",
    "info_gain",
    "hie",
    "crm",
    "bayes_node:cost=shortest_path",
    "bayes_node:cost=lca_height",
    "bayes_node:cost=wu_palmer",
    "bayes_node:cost=zhao",
    "optimal_hfbeta:beta=0.5",
    "optimal_hf1",
    "optimal_hfbeta:beta=2",
)
"""The rows of :func:`decoder_metric_table` by default: every rule of :data:`hiercls.decode.RULES` at its default
options (``threshold`` at its default 0.5 is ``majority`` and is left out), ``bayes_node`` with each named cost of
the columns, and the hF-β decoders of the columns. Each column's optimal decoder is added when missing."""

_INTERNAL_TOL = 1e-6
#: Entries of one block of stacked closed sets in the expected values (bounds their memory).
_BLOCK_ELEMENTS = 1 << 19
_HEADERS = {"mistake_severity_lca": "MS(lca)", "mistake_severity_path": "MS(path)"}


@dataclass(frozen=True)
class _Column:
    key: str
    higher_is_better: bool
    optimal: DecoderSpec | None
    kind: str  # how the column is computed
    beta: float | None = None
    cost: Any = None


_FIXED: dict[str, tuple[bool, str | None, str, str | None]] = {
    # key: (higher is better, optimal decoder, how it is computed, cost)
    "accuracy": (True, "argmax_leaf", "accuracy", None),
    "mistake_severity_lca": (False, None, "severity", "lca_height"),
    "mistake_severity_path": (False, "bayes_node:cost=shortest_path", "cost", "shortest_path"),
    "wu_palmer": (False, "bayes_node:cost=wu_palmer", "cost", "wu_palmer"),
    "zhao": (False, "bayes_node:cost=zhao", "cost", "zhao"),
    "hamming": (False, "majority", "hamming", None),
}


def _column(key: str, cost: Any, cost_spec: DecoderSpec) -> _Column:
    if key in _FIXED:
        up, opt, kind, kind_cost = _FIXED[key]
        return _Column(key, up, None if opt is None else parse_decoder(opt), kind, cost=kind_cost)
    if key == "cost":
        return _Column("cost", False, cost_spec, "cost", cost=cost)
    if key.startswith("hF"):
        try:
            beta = float(key[2:])
        except ValueError:
            beta = None
        if beta == 0:
            raise ValueError(f"metric {key!r}: hF0 is hierarchical precision, 0/0 for a root prediction; pick beta > 0")
        if beta is not None:
            beta = check_beta(beta)
            return _Column(f"hF{format_number(beta)}", True, parse_decoder("optimal_hfbeta", beta=beta), "hf", beta)
    known = [*_FIXED, "cost"]
    hint = did_you_mean(key, [*known, "hF1", "hF2"])
    raise ValueError(f"unknown table metric {key!r}{hint}; valid: {', '.join(known)}, hF<beta>")


def _option_equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if hasattr(a, "shape") or hasattr(b, "shape"):
        try:
            return bool(np.array_equal(np.asarray(to_numpy(a)), np.asarray(to_numpy(b))))
        except (TypeError, ValueError):
            return False
    return a == b


def _same_decoder(a: DecoderSpec, b: DecoderSpec) -> bool:
    """The same rule with the same options once the rule's defaults are filled in (``bayes_node`` and
    ``bayes_node:cost=shortest_path`` are one decoder)."""
    if a.rule != b.rule:
        return False
    oa, ob = a.resolved_options, b.resolved_options
    return oa.keys() == ob.keys() and all(_option_equal(oa[k], ob[k]) for k in oa)


def _cost_spec(cost: Any) -> tuple[Any, DecoderSpec, str]:
    """``(cost as given or as a float64 matrix, bayes_node spec for it, its display name)``."""
    if isinstance(cost, str):
        if cost not in COST_KINDS:
            raise ValueError(
                f"cost must be one of {', '.join(COST_KINDS)}{did_you_mean(cost, COST_KINDS)} or a cost matrix; "
                f"got {cost!r}"
            )
        return cost, parse_decoder("bayes_node", cost=cost), cost
    mat = np.asarray(to_numpy(cost), dtype=np.float64)
    spec = parse_decoder("bayes_node", cost=mat)
    name = f"matrix {list(mat.shape)}"
    return mat, dataclasses.replace(spec, label=f"bayes_node:cost=<{name}>"), name


@dataclass
class DecoderMetricTable:
    """The result of :func:`decoder_metric_table`.

    Attributes:
        decoders: row labels (decoder spec labels), in order.
        metrics: column keys, in order.
        realised: ``realised[decoder][metric]`` against the labels (``None``: not defined for that decoder, or
            no labels were given; ``nan``: undefined, e.g. a mistake severity without mistakes).
        expected: ``expected[decoder][metric]`` under the posterior (``None`` where not defined).
        optimal: ``optimal[metric]``: the label of the column's Bayes-optimal decoder, or ``None``.
        higher_is_better: ``higher_is_better[metric]``.
        samples: the number of samples scored (rows whose label is ``-1`` are left out of both values).
        cost: the display name of the ``cost`` column's cost.
        taxonomy: the taxonomy's name.
        notes: remarks on the marks (e.g. why a column has none).
        predictions: ``predictions[decoder]``: node ids ``[B]`` or boolean node sets ``[B, N]`` of the scored rows.
        conformal: the conformal rows (:func:`conformal_rows`), when the table was computed on their test rows.
    """

    decoders: list[str]
    metrics: list[str]
    realised: dict[str, dict[str, float | None]]
    expected: dict[str, dict[str, float | None]]
    optimal: dict[str, str | None]
    higher_is_better: dict[str, bool]
    samples: int
    cost: str
    taxonomy: str
    notes: list[str] = field(default_factory=list)
    predictions: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    conformal: ConformalRows | None = None

    def best(self, metric: str, which: str = "expected") -> list[str]:
        """The decoders with the best ``which`` (``"expected"`` or ``"realised"``) value of ``metric``
        (several on ties; values within 1e-9 count as equal)."""
        values = {"expected": self.expected, "realised": self.realised}[which]
        col = {d: values[d][metric] for d in self.decoders}
        col = {d: v for d, v in col.items() if v is not None and not math.isnan(v)}
        if not col:
            return []
        top = max(col.values()) if self.higher_is_better[metric] else min(col.values())
        return [d for d, v in col.items() if abs(v - top) <= 1e-9]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (no predictions; ``nan`` stays a float)."""
        return {
            "taxonomy": self.taxonomy,
            "samples": self.samples,
            "cost": self.cost,
            "decoders": list(self.decoders),
            "metrics": list(self.metrics),
            "optimal": dict(self.optimal),
            "higher_is_better": dict(self.higher_is_better),
            "realised": {d: dict(v) for d, v in self.realised.items()},
            "expected": {d: dict(v) for d, v in self.expected.items()},
            "notes": list(self.notes),
            **({"conformal": self.conformal.to_dict()} if self.conformal is not None else {}),
        }

    def format(self, digits: int = 3) -> str:
        """Two aligned text tables, realised then expected; ``*`` marks each column's Bayes-optimal decoder."""

        def cell(v: float | None, star: bool) -> str:
            text = "-" if v is None else ("nan" if math.isnan(v) else f"{v:.{digits}f}")
            return text + ("*" if star else "")

        header = ["decoder", *[_HEADERS.get(m, m) for m in self.metrics]]
        up = [_HEADERS.get(m, m) for m in self.metrics if self.higher_is_better[m]]
        down = [_HEADERS.get(m, m) for m in self.metrics if not self.higher_is_better[m]]
        blocks = [
            f"decoder x metric table: {self.samples} samples, taxonomy {self.taxonomy!r}, cost = {self.cost}\n"
            f"* = the column's Bayes-optimal decoder; higher is better: {', '.join(up) or '-'}; "
            f"lower is better: {', '.join(down) or '-'}\n"
            "MS(lca) = mistake severity of Bertinetto et al. (LCA height over mistakes), MS(path) = that of "
            "Plaud et al. (shortest path over all samples)"
        ]
        for title, values in (
            ("realised (against the labels)", self.realised),
            ("expected (under the model's posterior)", self.expected),
        ):
            if values is self.realised and all(v is None for r in values.values() for v in r.values()):
                blocks.append(f"{title}: no labels given")
                continue
            rows = [[d, *[cell(values[d][m], self.optimal[m] == d) for m in self.metrics]] for d in self.decoders]
            blocks.append(f"{title}\n{format_table(header, rows)}")
        if self.conformal is not None:
            blocks.append(self.conformal.format(digits))
        blocks += [f"note: {n}" for n in self.notes]
        return "\n\n".join(blocks)

    def __str__(self) -> str:
        return self.format()


def decoder_metric_table(
    probs: Any,
    labels: Any,
    taxonomy: Taxonomy,
    decoders: Sequence[str | DecoderSpec] | None = None,
    metrics: Sequence[str] | None = None,
    *,
    cost: Any = "lca_height",
    leaf_probs: bool = False,
) -> DecoderMetricTable:
    """Every decoder scored under every metric, realised against the labels and expected under the posterior.

    Args:
        probs: node probabilities ``[B, N]`` (leaf ``[B, L]`` with ``leaf_probs``), or a file
            :func:`~hiercls.evaluation.load_probabilities` reads.
        labels: true node ids or names ``[B]`` (``-1`` = leave the row out), a file
            :func:`~hiercls.evaluation.load_labels` reads, or ``None`` for the expected values only.
        taxonomy: the taxonomy (a tree; convert a DAG with ``to_tree()``).
        decoders: decoder specs (default :data:`TABLE_DECODERS`); each column's optimal decoder is added at the
            end when none of them is that decoder.
        metrics: column keys (default :data:`TABLE_METRICS`; also ``hF<β>`` for any ``β > 0``).
        cost: the cost of the ``cost`` column: a name of :data:`hiercls.decode.COST_KINDS` or a matrix
            ``cost[n, y]``, ``[N, L]`` (leaf labels) or ``[N, N]``.
        leaf_probs: ``probs`` holds leaf probabilities.

    Returns:
        A :class:`DecoderMetricTable` (``.format()`` for text, ``.to_dict()`` for JSON).

    Raises:
        ValueError: a DAG, no rows to score, an unknown metric, decoder or cost, or labels that do not match.

    Example:
        >>> import numpy as np
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> leaf = np.array([[0.3, 0.3, 0.4]])  # x, y, b: b is the argmax, but a holds 0.6
        >>> t = decoder_metric_table(leaf, ["x"], tax, ["argmax_leaf"], ["mistake_severity_path"], leaf_probs=True)
        >>> t.decoders, t.optimal  # the optimal decoder of the column is added
        (['argmax_leaf', 'bayes_node:cost=shortest_path'], {'mistake_severity_path': 'bayes_node:cost=shortest_path'})
        >>> round(t.expected["argmax_leaf"]["mistake_severity_path"], 3)  # 0.6 * 3 edges from b to x or y
        1.8
        >>> t.predictions["bayes_node:cost=shortest_path"].tolist()  # a: 0.6 * 1 + 0.4 * 2
        [1]
    """
    tax = check_taxonomy(taxonomy)
    if not tax.is_tree:
        raise TaxonomyError(f"decoder_metric_table needs a tree; taxonomy {tax.name!r} is a DAG (use to_tree())")
    if tax.num_nodes < 2:
        raise ValueError(f"taxonomy {tax.name!r} has a single node: there is nothing to decode")
    node, y = _scored_rows(probs, labels, tax, leaf_probs)
    cost, cost_spec, cost_name = _cost_spec(cost)
    columns = [_column(str(m), cost, cost_spec) for m in (TABLE_METRICS if metrics is None else metrics)]
    if not columns:
        raise ValueError("metrics: needs at least one metric, e.g. ['accuracy']")
    if len({c.key for c in columns}) != len(columns):
        raise ValueError(f"metrics: a column is given twice ({[c.key for c in columns]})")
    notes: list[str] = []
    internal = 0.0 if leaf_probs else float(_label_mass(node, tax)[:, ~tax.is_leaf].sum(1).max())
    if internal > _INTERNAL_TOL:
        columns = [dataclasses.replace(c, optimal=None) if c.key == "accuracy" else c for c in columns]
        notes.append(
            f"accuracy: up to {internal:.3g} of a row's label mass is on internal nodes, so argmax_leaf is not "
            "Bayes-optimal for it; no decoder is marked"
        )
    if any(c.key == "mistake_severity_lca" for c in columns):
        notes.append(
            "mistake_severity_lca (Bertinetto et al. 2020) averages over the mistakes only: no decoder is "
            "Bayes-optimal for such a ratio, so none is marked"
        )
    specs, optimal = _table_decoders(TABLE_DECODERS if decoders is None else decoders, columns)

    # Decode once from node probabilities, so no rule or expectation marginalises the leaves again.
    predictions = {s.label: np.asarray(to_numpy(s(node, tax))) for s in specs}
    expected = _expected_values(columns, specs, predictions, node, tax)
    realised = {s.label: {c.key: _realised(c, s, predictions[s.label], y, tax) for c in columns} for s in specs}
    return DecoderMetricTable(
        decoders=[s.label for s in specs],
        metrics=[c.key for c in columns],
        realised=realised,
        expected=expected,
        optimal=optimal,
        higher_is_better={c.key: c.higher_is_better for c in columns},
        samples=int(node.shape[0]),
        cost=cost_name,
        taxonomy=tax.name,
        notes=notes,
        predictions=predictions,
    )


def _scored_rows(probs: Any, labels: Any, tax: Taxonomy, leaf_probs: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Float64 node probabilities ``[B, N]`` and node-id labels of the rows to score (labelled ``-1`` left out)."""
    if isinstance(probs, (str, os.PathLike)):
        probs = load_probabilities(probs)
    if isinstance(labels, (str, os.PathLike)):
        labels = load_labels(labels, tax)
    arr = np.asarray(to_numpy(probs), dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    y = None
    if labels is not None:
        y = label_ids(labels, tax)
        if len(y) != arr.shape[0]:
            raise ValueError(f"labels has {len(y)} entries but probs has {arr.shape[0]} rows")
        arr, y = arr[y >= 0], y[y >= 0]
    if arr.shape[0] == 0:
        raise ValueError("no samples to score (empty probs, or every label is -1)")
    if probability_checks_enabled():
        check_probabilities(arr, tax, kind="leaf" if leaf_probs else "node", name="probs")
    elif not (np.isfinite(arr).all() and arr.min() >= 0):
        raise ValueError("probs holds NaN, infinite or negative values")
    return (np.asarray(tax.marginals(np.clip(arr, 0.0, None)), dtype=np.float64) if leaf_probs else arr), y


def _label_mass(node: np.ndarray, tax: Taxonomy) -> np.ndarray:
    """Probability that the label is exactly each node, ``[B, N]``, round-off negatives clipped to 0: the decoders'
    :func:`~hiercls.decode.inputs.label_distribution`, without its label-mass check (the table has always clipped;
    the decoders it runs check their own input)."""
    with probability_checks(False):
        return label_distribution(node, tax)


def _table_decoders(
    names: Sequence[str | DecoderSpec], columns: list[_Column]
) -> tuple[list[DecoderSpec], dict[str, str | None]]:
    """The rows' decoder specs (each column's optimal decoder added when absent) and the optimal row of each column."""
    specs: list[DecoderSpec] = []
    for d in names:
        spec = parse_decoder(d)
        if any(s.label == spec.label for s in specs):
            raise ValueError(f"decoders: {spec.label!r} is given twice")
        specs.append(spec)
    if not specs and not any(c.optimal for c in columns):
        raise ValueError("decoders: needs at least one decoder, e.g. ['argmax_leaf']")
    optimal: dict[str, str | None] = {}
    for col in columns:
        if col.optimal is None:
            optimal[col.key] = None
            continue
        match = next((s for s in specs if _same_decoder(s, col.optimal)), None)
        if match is None:
            specs.append(col.optimal)
            match = col.optimal
        optimal[col.key] = match.label
    return specs, optimal


def _realised(col: _Column, spec: DecoderSpec, pred: np.ndarray, y: np.ndarray | None, tax: Taxonomy) -> Any:
    """The metric against the labels, from the metric functions (``None`` without labels or where undefined)."""
    if y is None or (spec.is_set and col.kind in ("severity", "cost")):
        return None
    if col.kind == "accuracy":
        return exact_match_score(y, pred, taxonomy=tax)
    if col.kind == "hf":
        # 0/0 only for a root label predicted as the root: right, 1, as in expected_hfbeta
        return hierarchical_fbeta_score(y, pred, taxonomy=tax, beta=col.beta, average="samples", zero_division=1.0)
    if col.kind == "hamming":
        return hamming_loss(y, pred, taxonomy=tax)
    if col.kind == "severity":
        return mistake_severity(y, pred, taxonomy=tax, distance=col.cost, zero_division=float("nan"))
    return realized_cost(y, pred, taxonomy=tax, cost=col.cost)


def _expected_values(
    columns: list[_Column],
    specs: list[DecoderSpec],
    predictions: dict[str, np.ndarray],
    node: np.ndarray,
    tax: Taxonomy,
) -> dict[str, dict[str, float | None]]:
    """``expected[decoder][column]`` under the label distribution of ``node``.

    Rows go in blocks. Within a block the closed sets to score are stacked ``[M, N]`` so that each set column
    is one vectorised call: one row per *distinct* (sample, node) among the single-node decoders (they agree
    often) and one per sample and set decoder; the block size keeps the stack near ``_BLOCK_ELEMENTS`` entries.
    """
    n, rows_total, d = tax.num_nodes, node.shape[0], len(specs)
    anc = tax.ancestors_sparse.astype(np.float64).tocsr()  # anc[m, a] = 1: a is an ancestor-or-self of m
    sums = np.zeros((d, len(columns)))
    wrong = np.zeros(d)  # summed mistake probability, the denominator of Bertinetto's ratio
    singles = [i for i, s in enumerate(specs) if not s.is_set]
    sets = [i for i, s in enumerate(specs) if s.is_set]
    step = max(1, _BLOCK_ELEMENTS // (n * d))
    for lo in range(0, rows_total, step):
        nb = node[lo : lo + step]
        b = np.arange(nb.shape[0])
        pl = _label_mass(nb, tax)  # [b, N]: probability that the label is exactly each node
        ids = np.stack([predictions[specs[i].label][lo : lo + step] for i in singles]) if singles else None
        parts, row_of = [], []
        if ids is not None:
            pairs, inverse = np.unique(b[None, :] * n + ids, return_inverse=True)
            parts.append(anc[pairs % n].toarray() > 0)
            row_of.append(pairs // n)
        for i in sets:
            pred = predictions[specs[i].label][lo : lo + step]
            parts.append((sp.csr_matrix(np.asarray(pred, dtype=np.float64)) @ anc).toarray() > 0)
            row_of.append(b)
        stack, row_of = np.concatenate(parts), np.concatenate(row_of)
        stack[:, 0] = True  # the root is in every closed set; the metrics leave it out
        n_pairs = len(stack) - len(sets) * len(b)

        for j, col in enumerate(columns):
            if col.kind in ("severity", "cost"):  # a node-to-label cost: single-node decoders only
                if ids is not None:
                    costs = np.asarray(expected_cost(nb, tax, col.cost))  # [b, N]: E[cost(n, y)] for every node
                    sums[singles, j] += costs[b[None, :], ids].sum(1)
                continue
            per = _expected_per_set(col, stack, row_of, nb, pl, anc, tax)
            if ids is not None:
                sums[singles, j] += per[:n_pairs][inverse.reshape(ids.shape)].sum(1)
            if sets:
                sums[sets, j] += per[n_pairs:].reshape(len(sets), -1).sum(1)
        if ids is not None and any(c.kind == "severity" for c in columns):
            wrong[singles] += (1.0 - pl[b[None, :], ids]).sum(1)
    out: dict[str, dict[str, float | None]] = {}
    for i, spec in enumerate(specs):
        row: dict[str, float | None] = {}
        for j, col in enumerate(columns):
            if spec.is_set and col.kind in ("severity", "cost"):
                row[col.key] = None
            elif col.kind == "severity":
                row[col.key] = float(sums[i, j] / wrong[i]) if wrong[i] > _INTERNAL_TOL * rows_total else math.nan
            else:
                row[col.key] = float(sums[i, j] / rows_total)
        out[spec.label] = row
    return out


def _expected_per_set(
    col: _Column,
    stack: np.ndarray,
    row_of: np.ndarray,
    nb: np.ndarray,
    pl: np.ndarray,
    anc: sp.csr_matrix,
    tax: Taxonomy,
) -> np.ndarray:
    """The expected value of a set column for each closed set of ``stack`` ``[M, N]`` (of sample ``row_of``)."""
    if col.kind == "accuracy":
        # A closed set equals anc(m) iff it is the chain down to its deepest node m.
        depth = tax.depth
        deepest = np.where(stack, depth[None, :], -1).argmax(1)
        chain = stack[:, 1:].sum(1) == depth[deepest]
        return np.where(chain, pl[row_of, deepest], 0.0)
    if col.kind == "hf":
        return np.asarray(expected_hfbeta(stack, nb[row_of], tax, col.beta))
    # hamming: E|S Δ Y| = sum of P(n) over the nodes, plus 1 - 2 P(n) over the nodes of S (root aside).
    marg = np.asarray(anc.T @ pl.T).T[:, 1:][row_of]  # P(n in the closed label set)
    return (marg.sum(1) + (stack[:, 1:] * (1.0 - 2.0 * marg)).sum(1)) / (tax.num_nodes - 1)


# ------------------------------------------------------------------------------------------------ conformal rows
CONFORMAL_COLUMNS = ("threshold", "coverage", "mean_set_size", "mean_depth")


@dataclass
class ConformalRows:
    """The conformal rows of the table (:func:`conformal_rows`): each method calibrated on the calibration rows and
    scored on the test rows, beside the non-conformal ``threshold`` decoder at ``1 - alpha`` on the same rows.

    Attributes:
        alpha: the target miscoverage (for ``risk:<loss>``: the target risk).
        rows: ``rows[method] = {"threshold", "coverage", "mean_set_size", "mean_depth"}`` (set size in leaves
            covered; a node set's depth is the mean depth of its nodes).
        n_calibration, n_test: rows behind the thresholds and behind the scores.
        predictions: ``predictions[method]``: node ids ``[n_test]`` or node sets ``[n_test, N]``.
        calibrators: ``calibrators[method]``: the fitted calibrator (:func:`hiercls.conformal.save_conformal`
            stores them).
    """

    alpha: float
    rows: dict[str, dict[str, float]]
    n_calibration: int
    n_test: int
    predictions: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    calibrators: dict[str, ConformalCalibrator] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "n_calibration": self.n_calibration, "n_test": self.n_test, "rows": self.rows}

    def format(self, digits: int = 3) -> str:
        header = ["conformal", "threshold", "coverage", "mean set size", "mean depth"]
        rows = [[m, *[f"{v[c]:.{digits}f}" for c in CONFORMAL_COLUMNS]] for m, v in self.rows.items()]
        return (
            f"conformal rows: alpha = {self.alpha:g} (target coverage {1 - self.alpha:g}; risk:<loss> targets "
            f"E[loss] <= {self.alpha:g}), calibrated on {self.n_calibration} rows, scored on {self.n_test} other "
            f"rows; threshold = the posterior rule at 1 - alpha, not conformal\n{format_table(header, rows)}"
        )


def calibration_rows(spec: Any, n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Calibration and test row indices from a fraction in ``(0, 1)`` (a random split, ``seed``), a file or an array.

    A file (``.npy`` or text, one index per line) or an integer array lists the calibration rows; booleans ``[n]``
    (a ``.npy`` file or an array) mark them. Every other row is a test row.

    Raises:
        ValueError: a fraction outside ``(0, 1)``, an index outside ``0..n-1``, or no calibration / test rows.

    Example:
        >>> cal, test = calibration_rows(0.5, 10)
        >>> len(cal), len(test), sorted([*cal, *test]) == list(range(10))
        (5, 5, True)
    """
    try:
        fraction = None if isinstance(spec, np.ndarray) else float(spec)
    except (TypeError, ValueError):
        fraction = None
    if fraction is not None:
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"calibration split: a fraction must be in (0, 1); got {spec!r}")
        order = np.random.default_rng(seed).permutation(n)
        k = round(n * fraction)
        cal = np.sort(order[:k])
    else:
        path = "array" if isinstance(spec, np.ndarray) else os.fspath(spec)
        arr = spec if isinstance(spec, np.ndarray) else _read_rows_file(path)
        cal = np.flatnonzero(arr) if arr.dtype == bool else np.unique(arr.astype(np.int64))
        if arr.dtype == bool and arr.shape != (n,):
            raise ValueError(f"calibration split {path}: a boolean mask must have {n} entries; got {arr.shape}")
        if cal.size and (cal.min() < 0 or cal.max() >= n):
            raise ValueError(f"calibration split {path}: row indices must be in 0..{n - 1}")
    test = np.setdiff1d(np.arange(n), cal)
    if cal.size == 0 or test.size == 0:
        raise ValueError(
            f"calibration split {spec!r}: needs both calibration and test rows (got {cal.size} / {test.size} of {n})"
        )
    return cal, test


def _read_rows_file(path: str) -> np.ndarray:
    """A calibration-split file (``.npy`` or one index per line), read within the read limit, regular files only."""
    if path.endswith(".npy"):  # uncompressed: the file's size bounds what np.load builds
        return np.load(io.BytesIO(read_bytes(path, "calibration split", gunzip=False)), allow_pickle=False)
    text = read_text(path, "calibration split")
    return np.loadtxt(io.StringIO(text), dtype=np.int64, ndmin=1, comments="#")


def conformal_rows(
    probs: Any,
    labels: Any,
    taxonomy: Taxonomy,
    alpha: float,
    *,
    calibration: Any = 0.5,
    methods: Sequence[str] = ("node", "set", "risk"),
    r: int = 2,
    loss: str = "overshoot",
    seed: int = 0,
    leaf_probs: bool = False,
) -> tuple[ConformalRows, np.ndarray]:
    """Calibrate each conformal method (:mod:`hiercls.conformal`) on part of the rows and score it on the rest.

    Args:
        probs, labels: as :func:`decoder_metric_table` (rows labelled ``-1`` are left out first).
        taxonomy: the taxonomy (``set`` is skipped on a DAG).
        alpha: the target miscoverage.
        calibration: a fraction of the rows (random, ``seed``) or a file of calibration row indices
            (:func:`calibration_rows`).
        methods: ``"node"``, ``"set"`` (``r`` nodes at most), ``"risk"`` (conformal risk control of ``loss``).

    Returns:
        The :class:`ConformalRows` and the test rows' indices (among the labelled rows), so that the decoder x
        metric table can be computed on the same rows.

    Example:
        >>> import numpy as np
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> rng = np.random.default_rng(0)
        >>> leaf = rng.dirichlet([1.0, 1.0, 1.0], size=400)
        >>> y = tax.leaves[[rng.choice(3, p=q) for q in leaf]]
        >>> rows, test = conformal_rows(leaf, y, tax, 0.1, leaf_probs=True)
        >>> list(rows.rows), len(test), rows.rows["node"]["coverage"] > 0.8
        (['node', 'set:r=2', 'risk:overshoot', 'threshold'], 200, True)
    """
    tax = check_taxonomy(taxonomy)
    node, y = _scored_rows(probs, labels, tax, leaf_probs)
    if y is None:
        raise ValueError("conformal rows need labels: the calibration rows calibrate, the test rows check")
    cal, test = calibration_rows(calibration, len(y), seed=seed)
    options = {"set": {"r": r}, "risk": {"loss": loss}}
    names = {"node": "node", "set": f"set:r={r}", "risk": f"risk:{loss}"}
    rows: dict[str, dict[str, float]] = {}
    predictions: dict[str, np.ndarray] = {}
    fitted: dict[str, ConformalCalibrator] = {}
    for method in methods:
        if method == "set" and not tax.is_tree:
            continue
        fitted[names[method]] = model = create_conformal(method, tax, alpha, **options.get(method, {}))
        model.fit(node[cal], y[cal])
        predictions[names[method]] = pred = np.asarray(model.predict(node[test]))
        rows[names[method]] = {"threshold": float(model.threshold_), **conformal_coverage(pred, y[test], tax)}
    base = parse_decoder("threshold", threshold=1.0 - float(alpha))
    predictions["threshold"] = pred = np.asarray(to_numpy(base(node[test], tax)))
    rows["threshold"] = {"threshold": 1.0 - float(alpha), **conformal_coverage(pred, y[test], tax)}
    return ConformalRows(float(alpha), rows, len(cal), len(test), predictions, fitted), test
