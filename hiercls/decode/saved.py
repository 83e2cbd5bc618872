"""Decoding and scoring saved probabilities: the ``--probs`` mode of ``hiercls decode`` and ``hiercls evaluate``.

``load_probabilities`` reads ``.npy`` / ``.npz`` / ``.pt``; ``load_labels`` reads node ids (``.npy`` ...) or a
text/CSV file of node names or label paths; ``evaluate_saved`` decodes with several rules and scores each;
``format_table`` renders the result for a terminal.
"""

from __future__ import annotations

import csv
import io
import itertools
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hiercls.decode.api import RULES, SET_RULES, decode
from hiercls.taxonomy import Taxonomy, TaxonomyError

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_RULES", "evaluate_saved", "format_table", "load_labels", "load_probabilities", "score_predictions"]

DEFAULT_RULES: tuple[str, ...] = ("argmax_leaf", "top_down", "majority", "plurality", "info_gain", "hie", "crm",
                                  "bayes_node", "optimal_hfbeta")
_ARRAY_KEYS = ("probs", "node_probs", "probabilities", "leaf_probs", "scores", "arr_0")
_LABEL_KEYS = ("labels", "targets", "y", "y_true", "arr_0")
_PATH_SEPARATORS = ("/", ">", "|")


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        import torch

        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):  # numpy has no bfloat16
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _pick(obj: Mapping[str, Any], keys: Sequence[str], key: str | None, path: str, what: str) -> Any:
    names = list(obj.keys())
    if key is not None:
        if key not in obj:
            raise ValueError(f"{path}: no array named {key!r} (has: {', '.join(map(str, names)) or 'nothing'})")
        return obj[key]
    if len(names) == 1:
        return obj[names[0]]
    for k in keys:
        if k in obj:
            return obj[k]
    raise ValueError(f"{path}: holds several arrays ({', '.join(map(str, names))}); say which {what} with "
                     f"key= (one of the names)")


def _load_array(path: str | os.PathLike, key: str | None, keys: Sequence[str], what: str) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            return np.load(p, allow_pickle=False)
        if suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                return np.asarray(_pick(dict(z.items()), keys, key, str(p), what))
        if suffix in (".pt", ".pth"):
            import torch

            obj = torch.load(p, map_location="cpu", weights_only=True)
            if isinstance(obj, Mapping):
                obj = _pick(obj, keys, key, str(p), what)
            if isinstance(obj, (list, tuple)) and obj and hasattr(obj[0], "detach"):
                obj = torch.cat([o.reshape(-1, *o.shape[-1:]) if o.ndim else o.reshape(1) for o in obj])
            return _to_numpy(obj)
    except (ValueError, OSError, RuntimeError, EOFError) as err:
        if isinstance(err, ValueError) and str(err).startswith(str(p)):
            raise
        raise ValueError(f"{p}: cannot read {what} ({type(err).__name__}: {err})") from err
    raise ValueError(f"{p}: unsupported {what} file type {suffix or '(none)'!r}; expected .npy, .npz or .pt")


def load_probabilities(path: str | os.PathLike, *, key: str | None = None) -> np.ndarray:
    """Saved probabilities ``[B, N]`` (node or leaf) from ``.npy``, ``.npz`` or ``.pt`` (tensor or dict of tensors).

    Args:
        path: the file.
        key: the array to take from an ``.npz`` or a ``.pt`` dict (default: the only one, or the first of
            ``probs``, ``node_probs``, ``probabilities``, ``leaf_probs``, ``scores``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: unknown format, unreadable file, ambiguous key, or not a 2-D float array.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); f = os.path.join(d, "p.npy")
        >>> np.save(f, np.eye(2, dtype=np.float32))
        >>> load_probabilities(f).shape
        (2, 2)
    """
    arr = _load_array(path, key, _ARRAY_KEYS, "probabilities")
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{path}: probabilities must be numeric; got dtype {arr.dtype}")
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{path}: probabilities must be a 2-D array [samples, nodes]; got shape {list(arr.shape)}")
    return arr


def _resolve_label(text: str, taxonomy: Taxonomy) -> int:
    if text in taxonomy:
        return taxonomy.index(text)
    for sep in _PATH_SEPARATORS:
        if sep in text:
            parts = [t.strip() for t in text.strip(sep).split(sep) if t.strip()]
            if parts and all(t in taxonomy for t in parts):
                ids = [taxonomy.index(t) for t in parts]
                anc = taxonomy.ancestors_sparse
                for up, down in itertools.pairwise(ids):
                    if not anc[down, up]:
                        raise TaxonomyError(f"label path {text!r}: {parts[ids.index(up)]!r} is not an ancestor of "
                                            f"{parts[ids.index(down)]!r}", label=text)
                return ids[-1]
    stripped = text.strip()
    if stripped.lstrip("-").isdigit():
        v = int(stripped)
        if -1 <= v < taxonomy.num_nodes:
            return v
    return taxonomy.index(text)  # raises, with close-name suggestions


def load_labels(path: str | os.PathLike, taxonomy: Taxonomy, *, key: str | None = None,
                column: str | int | None = None) -> np.ndarray:
    """Labels as node ids ``[B]`` (``-1`` = ignore) from a saved array or a text file.

    * ``.npy`` / ``.npz`` / ``.pt``: integer node ids (or an array of node-name strings).
    * any other file: one label per line, as a node name, a label path (``animal/cat``, also ``>`` or ``|``
      separated; every step must be a parent-child chain) or a node id. ``.csv`` / ``.tsv`` files take the
      column named ``label`` (or ``column``), else the last one. Blank lines and lines starting with ``#`` are
      skipped.

    Raises:
        FileNotFoundError: no such file.
        TaxonomyError: an unknown label, naming the file and line.
        ValueError: an id out of range or a malformed array.

    Example:
        >>> import tempfile, os
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> f = os.path.join(tempfile.mkdtemp(), "labels.txt")
        >>> _ = open(f, "w").write("x\\na/y\\nb\\n")
        >>> load_labels(f, tax).tolist()
        [2, 3, 4]
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file")
    if p.suffix.lower() in (".npy", ".npz", ".pt", ".pth"):
        arr = _load_array(p, key, _LABEL_KEYS, "labels").ravel()
        if arr.dtype.kind in "US":
            out = np.empty(len(arr), dtype=np.int64)
            for i, name in enumerate(arr.tolist()):
                try:
                    out[i] = _resolve_label(str(name), taxonomy)
                except TaxonomyError as err:
                    raise TaxonomyError(err.reason, source=str(p), label=err.label) from None
            return out
        if not (np.issubdtype(arr.dtype, np.integer) or (np.issubdtype(arr.dtype, np.floating)
                                                          and np.all(arr == np.round(arr)))):
            raise ValueError(f"{p}: labels must be integer node ids; got dtype {arr.dtype}")
        ids = arr.astype(np.int64)
        bad = np.flatnonzero((ids < -1) | (ids >= taxonomy.num_nodes))
        if bad.size:
            raise ValueError(f"{p}: label {ids[bad[0]]} at index {bad[0]} is not a node id of taxonomy "
                             f"{taxonomy.name!r} (expected -1 or 0..{taxonomy.num_nodes - 1})")
        return ids
    text = p.read_text(encoding="utf-8-sig")
    rows: list[tuple[int, str]] = []
    if p.suffix.lower() in (".csv", ".tsv"):
        delim = "\t" if p.suffix.lower() == ".tsv" else ","
        reader = list(csv.reader(io.StringIO(text), delimiter=delim))
        col = -1
        start = 0
        if reader:
            header = [h.strip() for h in reader[0]]
            wanted = column if isinstance(column, str) else "label"
            if isinstance(column, int):
                col = column
            if wanted in header:
                col, start = header.index(wanted), 1
            elif isinstance(column, str):
                raise ValueError(f"{p}: no column {column!r} in header {header}")
        for i, fields in enumerate(reader[start:], start=start + 1):
            if not fields or not "".join(fields).strip() or fields[0].startswith("#"):
                continue
            try:
                rows.append((i, fields[col].strip()))
            except IndexError:
                raise TaxonomyError(f"row has {len(fields)} fields, no column {col}", source=str(p), line=i) from None
    else:
        for i, line in enumerate(text.splitlines(), start=1):
            s = line.strip()
            if s and not s.startswith("#"):
                rows.append((i, s))
    out = np.empty(len(rows), dtype=np.int64)
    for j, (line_no, label) in enumerate(rows):
        try:
            out[j] = _resolve_label(label, taxonomy)
        except TaxonomyError as err:
            raise TaxonomyError(err.reason, source=str(p), line=line_no, label=label) from None
    return out


# ---------------------------------------------------------------------------------------------- scoring
def score_predictions(pred: np.ndarray, labels: np.ndarray, taxonomy: Taxonomy, *,
                      beta: float = 1.0) -> dict[str, float]:
    """Scores of node-id predictions ``[B]`` or node sets ``[B, N]`` against node-id labels ``[B]``.

    All are means over the samples whose label is not ``-1``; sets exclude the root (the ``include_root=False``
    convention of :mod:`hiercls.metrics`), with hF = 1 when both the label and the prediction are the root.

    * ``hP``, ``hR``, ``hF``: hierarchical precision / recall / F-beta of each sample (ancestor sets).
    * ``accuracy`` (ids only): prediction equals the label.
    * ``correct``: the prediction is an ancestor-or-self of the label (sets: a subset of the label's path),
      the accuracy of hedged predictions (Deng et al. 2012).
    * ``mistake_severity`` (ids only): mean LCA height (:meth:`Taxonomy.distance` ``"lca_height"``) over
      samples with ``prediction != label``; ``nan`` when there is none.
    * ``depth``: mean depth of the prediction (sets: mean number of non-root nodes).
    """
    labels = np.asarray(labels, dtype=np.int64).ravel()
    keep = labels >= 0
    y = labels[keep]
    anc = taxonomy.ancestors_sparse
    b2 = float(beta) ** 2
    ly = (np.diff(anc.indptr)[y] - 1).astype(np.float64)
    out: dict[str, float] = {"samples": float(len(y))}
    if len(y) == 0:
        return out
    if pred.ndim == 1:
        pr = pred[keep].astype(np.int64)
        lca = np.asarray(taxonomy.lca(pr, y))
        inter = taxonomy.depth[lca].astype(np.float64)
        lp = taxonomy.depth[pr].astype(np.float64)
        out["accuracy"] = float((pr == y).mean())
        wrong = pr != y
        out["mistake_severity"] = float(taxonomy.distance(pr[wrong], y[wrong], "lca_height").mean()) \
            if wrong.any() else math.nan
        if not taxonomy.is_tree:  # depth(lca) undercounts shared ancestors on a DAG: count them
            sets = anc[pr].astype(bool)
            inter = np.asarray(sets.multiply(anc[y].astype(bool)).sum(1)).ravel().astype(np.float64) - 1
            lp = (np.diff(anc.indptr)[pr] - 1).astype(np.float64)
        correct = np.asarray(anc[y, pr]).ravel().astype(bool)
    else:
        s = np.asarray(pred, dtype=bool)[keep].copy()
        s[:, 0] = False
        inter = np.asarray(anc[y].multiply(s).sum(1)).ravel().astype(np.float64)
        lp = s.sum(1).astype(np.float64)
        correct = inter == lp
    with np.errstate(invalid="ignore", divide="ignore"):
        hp = np.where(lp > 0, inter / np.maximum(lp, 1), np.where(ly == 0, 1.0, 0.0))
        hr = np.where(ly > 0, inter / np.maximum(ly, 1), 1.0)
        den = b2 * ly + lp
        hf = np.where(den > 0, (1 + b2) * inter / np.maximum(den, 1e-300), np.where((ly == 0) & (lp == 0), 1.0, 0.0))
    out.update(hP=float(hp.mean()), hR=float(hr.mean()), hF=float(hf.mean()), correct=float(correct.mean()),
               depth=float(lp.mean()))
    return out


def evaluate_saved(probs: Any, labels: Any, taxonomy: Taxonomy, rules: Sequence[str] = DEFAULT_RULES, *,
                   leaf_probs: bool = False, beta: float = 1.0, rule_options: Mapping[str, Mapping[str, Any]] | None
                   = None) -> dict[str, Any]:
    """Decode saved probabilities with several rules and score each against the labels.

    Args:
        probs: node probabilities ``[B, N]`` (or leaf probabilities with ``leaf_probs=True``), or a path that
            :func:`load_probabilities` reads.
        labels: node ids ``[B]`` (``-1`` = ignore), or a path that :func:`load_labels` reads.
        taxonomy: the taxonomy.
        rules: names from :data:`hiercls.decode.RULES`.
        beta: the F-beta weight of the ``hF`` score, also passed to ``optimal_hfbeta`` unless
            ``rule_options`` says otherwise.
        rule_options: per-rule keyword options, e.g. ``{"bayes_node": {"cost": "wu_palmer"}}``.

    Returns:
        ``{"taxonomy", "fingerprint", "samples", "ignored", "beta", "rules": {rule: {metric: value}}}``.

    Example:
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4], [1.0, 0.9, 0.8, 0.1, 0.1]])
        >>> res = evaluate_saved(p, np.array([2, 2]), tax, rules=["argmax_leaf", "crm"])
        >>> res["rules"]["argmax_leaf"]["accuracy"], res["rules"]["crm"]["accuracy"]
        (0.5, 1.0)
    """
    if isinstance(probs, (str, os.PathLike)):
        probs = load_probabilities(probs)
    if isinstance(labels, (str, os.PathLike)):
        labels = load_labels(labels, taxonomy)
    y = np.asarray(_to_numpy(labels), dtype=np.int64).ravel()
    n_rows = int(np.shape(probs)[0]) if np.ndim(probs) == 2 else 1
    if len(y) != n_rows:
        raise ValueError(f"labels has {len(y)} entries but probs has {n_rows} rows")
    if len(y) and (y.min() < -1 or y.max() >= taxonomy.num_nodes):
        raise ValueError(f"labels must be node ids in [-1, {taxonomy.num_nodes}); got {y.min()}..{y.max()}")
    options = {k: dict(v) for k, v in (rule_options or {}).items()}
    unknown = [r for r in list(rules) + list(options) if r not in RULES]
    if unknown:
        raise ValueError(f"unknown rule {unknown[0]!r}; rules are {', '.join(RULES)}")
    results: dict[str, Any] = {}
    for rule in rules:
        opts = options.get(rule, {})
        if rule == "optimal_hfbeta":
            opts.setdefault("beta", beta)
        if rule == "hie" and not taxonomy.is_tree:
            logger.warning("skipping rule 'hie': taxonomy %r is a DAG", taxonomy.name)
            continue
        pred = _to_numpy(decode(probs, taxonomy, rule, leaf_probs=leaf_probs, **opts))
        results[rule] = score_predictions(pred, y, taxonomy, beta=beta)
        results[rule]["kind"] = "set" if rule in SET_RULES else "node"
    return {"taxonomy": taxonomy.name, "fingerprint": taxonomy.fingerprint, "samples": int((y >= 0).sum()),
            "ignored": int((y < 0).sum()), "beta": float(beta), "rules": results}


def format_table(results: Mapping[str, Any]) -> str:
    """A fixed-width text table of :func:`evaluate_saved` results (one row per rule).

    Example:
        >>> print(format_table({"rules": {"crm": {"hF": 0.5, "accuracy": 1.0, "kind": "node"}}}))
        rule  accuracy      hF
        crm     1.0000  0.5000
    """
    rules = results.get("rules", {})
    order = ["accuracy", "correct", "hP", "hR", "hF", "mistake_severity", "depth"]
    cols = [c for c in order if any(c in m for m in rules.values())]
    cols += sorted({k for m in rules.values() for k in m if k not in cols and k not in ("kind", "samples")})
    header = ["rule", *cols]
    body = []
    for rule, m in rules.items():
        row = [rule]
        for c in cols:
            v = m.get(c)
            row.append("-" if v is None else ("nan" if isinstance(v, float) and math.isnan(v) else
                                              f"{v:.4f}" if isinstance(v, (int, float)) else str(v)))
        body.append(row)
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(header)).rstrip()]
    for r in body:
        lines.append("  ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(r)))
    return "\n".join(lines)
