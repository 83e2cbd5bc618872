"""Input handling shared by every decoder: array conversion, validation and per-taxonomy caches.

On the CPU the decoders compute in NumPy, with float64 wherever sums decide (float64 keeps the optimal decoders'
comparisons exact enough to be deterministic); row-major tree inputs go to compiled per-row kernels that make the
same comparisons and sums (:mod:`hiercls.decode._rows`); tensors on other devices stay there (the ``*_torch``
paths). Results come back in the input's framework: NumPy in, NumPy out; torch in, torch out on the input's device.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from hiercls._checks import (
    PROBABILITY_ATOL,
    _scan_probabilities,
    check_label_mass,
    check_probabilities,
    probability_checks_enabled,
)
from hiercls.taxonomy import Taxonomy, check_taxonomy

__all__ = [
    "Batch",
    "chunked",
    "first_max_t",
    "first_true_t",
    "index_tensor",
    "label_distribution",
    "label_distribution_torch",
    "leaf_rows_torch",
    "prefix_sums_t",
    "prepare",
    "prepare_torch",
    "restore_ids",
    "restore_sets",
    "restore_values",
    "segment_reduce_t",
    "sorted_children",
    "subtree_ends",
    "subtree_ends_tensor",
    "torch_kernels",
    "value_dtype_torch",
]

ROW_CHUNK = 2048
"""Most rows decoded at a time; fewer on wide taxonomies (see ``CHUNK_ELEMENTS``)."""
CHUNK_ELEMENTS = 1 << 19
"""Rows x nodes per block: keeps the float64 working copies near 4 MB, in cache (a 21k-node row is ~170 KB).
Rules with a Python loop per block (the descents, ``optimal_hfbeta``) take bigger blocks, see :func:`chunked`."""

NODE_MAJOR_ROWS = 1024
"""Fewest rows per block for node-major (Fortran-order) input, whose blocks are read column by column."""

F = TypeVar("F", bound=Callable[..., Any])


def _node_major_layout(probs: Any) -> bool:
    """``probs [B, N]`` is a NumPy array laid out node by node (e.g. :meth:`Taxonomy.marginals`' output)."""
    return (
        isinstance(probs, np.ndarray)
        and probs.ndim == 2
        and min(probs.shape) > 1
        and (probs.strides[0] < probs.strides[1])
    )


# First row of the block being decoded, so that probability errors name the caller's row, not the block's.
_ROW_OFFSET: contextvars.ContextVar[int] = contextvars.ContextVar("hiercls_decode_row_offset", default=0)


def _concat(parts: list[Any]) -> Any:
    if isinstance(parts[0], tuple):
        return tuple(_concat([p[i] for p in parts]) for i in range(len(parts[0])))
    if hasattr(parts[0], "detach"):
        import torch

        return torch.cat(parts)
    return np.concatenate(parts)


def chunked(fn: F | None = None, *, scale: int = 1) -> Any:
    """Run ``fn(probs, taxonomy, ...)`` on row blocks of ``ROW_CHUNK`` and concatenate the results.

    Decoders are row-wise, so this changes nothing but the peak memory and the speed. ``scale`` multiplies
    ``CHUNK_ELEMENTS`` for rules whose cost per block has a Python loop (``@chunked(scale=8)``).
    """
    if fn is None:
        return functools.partial(chunked, scale=scale)

    @functools.wraps(fn)
    def wrapper(probs: Any, *args: Any, **kwargs: Any) -> Any:
        shape = tuple(probs.shape) if hasattr(probs, "shape") else ()
        rows = shape[0] if len(shape) == 2 else 0
        step = max(16, min(ROW_CHUNK, CHUNK_ELEMENTS * scale // max(1, shape[1]))) if rows else ROW_CHUNK
        if rows and _node_major_layout(probs):
            # Node-major memory (Fortran order): a block's rows of the transpose are contiguous runs of ``step``
            # values; short runs would make every pass stride through memory, so blocks are wide.
            step = max(step, NODE_MAJOR_ROWS)
        if rows <= step:
            return fn(probs, *args, **kwargs)
        parts = []
        for s in range(0, rows, step):
            token = _ROW_OFFSET.set(_ROW_OFFSET.get() + s)
            try:
                parts.append(fn(probs[s : s + step], *args, **kwargs))
            finally:
                _ROW_OFFSET.reset(token)
        return _concat(parts)

    return wrapper


@dataclass
class Batch:
    """Decoder input as float64 NumPy plus what is needed to hand results back.

    ``node`` is ``[B, N]`` node probabilities; ``label`` (lazy, see :func:`label_distribution`) the probability
    that the label is exactly each node.
    """

    node: np.ndarray
    taxonomy: Taxonomy
    torch_device: Any = None  # a torch.device when the input was a tensor
    torch_dtype: Any = None
    leaf: np.ndarray | None = None  # the leaf probabilities, when given as such
    _label: np.ndarray | None = None
    _node_t: np.ndarray | None = None

    @property
    def is_torch(self) -> bool:
        return self.torch_device is not None

    @property
    def node_t(self) -> np.ndarray:
        """``node`` node-major, ``[N, B]`` with contiguous rows: a view for Fortran-order input, else a copy.

        Tree operations become row gathers and reductions down axis 0, vectorised across the samples.
        """
        if self._node_t is None:
            x = self.node.T
            self._node_t = x if x.shape[1] <= 1 or x.strides[1] == x.itemsize else np.ascontiguousarray(x)
        return self._node_t

    @property
    def row_major(self) -> bool:
        """Whether ``node`` has contiguous rows (a head's ``[B, N]`` output) and no node-major copy exists yet.

        Rules that score every column on its own and take a row maximum then work along axis 1 (``np.take`` of
        their columns, ``argmax(1)``), which skips the transpose :attr:`node_t` would make.
        """
        x = self.node
        return self._node_t is None and x.shape[0] > 1 and x.shape[1] > 1 and x.strides[1] == x.itemsize

    @property
    def label(self) -> np.ndarray:
        if self._label is None:
            self._label = label_distribution(self.node, self.taxonomy, leaf=self.leaf)
        return self._label


def _check_shape(shape: tuple[int, ...], taxonomy: Taxonomy, leaf_probs: bool, name: str, given: list[int]) -> None:
    """Refuse a ``[B, width]`` array of the wrong width (``given``: the caller's shape, for the message)."""
    width = taxonomy.num_leaves if leaf_probs else taxonomy.num_nodes
    if len(shape) == 2 and shape[1] == width:
        return
    what = "leaf probabilities [B, num_leaves]" if leaf_probs else "node probabilities [B, num_nodes]"
    hint = ""
    if not leaf_probs and len(shape) == 2 and shape[1] == taxonomy.num_leaves:
        hint = "; it matches the number of leaves: pass leaf_probs=True"
    raise ValueError(f"{name} must be {what} = [B, {width}] for taxonomy {taxonomy.name!r}; got shape {given}{hint}")


def prepare(
    probs: Any,
    taxonomy: Taxonomy,
    *,
    leaf_probs: bool = False,
    name: str = "probs",
    exact: bool = True,
    scores: bool = False,
) -> Batch:
    """Validate ``probs`` against ``taxonomy`` and convert it to a float64 NumPy :class:`Batch`.

    Args:
        probs: node probabilities ``[B, N]`` (or ``[N]`` for one sample), or leaf probabilities ``[B, L]``
            with ``leaf_probs=True`` (in the order of ``taxonomy.leaves``). NumPy array, torch tensor or
            nested lists.
        taxonomy: the taxonomy the probabilities are indexed by.
        leaf_probs: ``probs`` holds leaf probabilities, to be marginalised up the taxonomy.
        name: parameter name used in error messages.
        exact: convert to float64 (the optimal decoders); ``False`` keeps float32 input as is, for rules that
            only compare and multiply probabilities.
        scores: ``probs`` may be independent per-node scores in ``[0, 1]`` (a child may exceed its parent), for
            the label-set rules that make them coherent.

    Raises:
        TypeError: ``taxonomy`` is not a Taxonomy, or ``probs`` is not numeric.
        ValueError: wrong shape, NaN/inf or negative probabilities.
        ProbabilityError: not probabilities of ``taxonomy`` (see :func:`hiercls._checks.check_probabilities`);
            skipped inside ``probability_checks(False)`` (``decode(..., check=False)``).
    """
    taxonomy = check_taxonomy(taxonomy)
    device = dtype = None
    torch = sys.modules.get("torch")  # a tensor implies torch is imported; never pay its import otherwise
    if torch is not None and isinstance(probs, torch.Tensor):
        device, dtype = probs.device, probs.dtype
        if not dtype.is_floating_point:
            dtype = torch.float32
        keep = not exact and dtype == torch.float32
        probs = probs.detach().to("cpu", torch.float32 if keep else torch.float64).numpy()
    arr = np.asarray(probs)
    if arr.dtype == object or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool
    ):
        raise TypeError(f"{name} must be a numeric array or tensor; got dtype {arr.dtype}")
    arr = arr.astype(np.float32 if (not exact and arr.dtype == np.float32) else np.float64, copy=False)
    if arr.ndim == 1:
        arr = arr[None, :]
    _check_shape(tuple(arr.shape), taxonomy, leaf_probs, name, list(np.shape(probs)))
    _validate(arr, taxonomy, leaf_probs, scores, name)
    leaf = None
    if leaf_probs:
        leaf = np.clip(arr, 0.0, None)
        node = np.asarray(taxonomy.marginals(leaf), dtype=arr.dtype)
    else:
        node = arr
    return Batch(node=node, taxonomy=taxonomy, torch_device=device, torch_dtype=dtype, leaf=leaf)


def _validate(arr: np.ndarray, taxonomy: Taxonomy, leaf_probs: bool, scores: bool, name: str) -> None:
    """The probability check (when on), then the refusals that stay with the checks off: NaN/inf, negatives."""
    if not arr.size:
        return
    if probability_checks_enabled():
        kind = "leaf" if leaf_probs else ("scores" if scores else "node")
        # Passing the check means finite values >= -atol; its minimum serves the negativity test below.
        low = _scan_probabilities(arr, taxonomy, kind, PROBABILITY_ATOL, name, _ROW_OFFSET.get())
    else:
        low, high = arr.min(), arr.max()  # both propagate NaN
        if not (np.isfinite(low) and np.isfinite(high)):
            raise ValueError(f"{name} contains NaN or infinite values")
    if low < -1e-6:
        raise ValueError(f"{name} contains negative probabilities (min {float(low):.3g})")


TORCH_KERNELS_ON_CPU = False
"""Decode CPU tensors with the torch kernels too. Off (the default): a CPU tensor is read as a NumPy array and
decoded by the NumPy path, 2-16x faster there than the same rule as many small torch operations; the result still
comes back as a tensor. Tensors on any other device always stay there. The tests switch it on to compare the torch
kernels (what CUDA tensors run) with the NumPy path on CPU tensors."""


def torch_kernels(probs: Any) -> bool:
    """Whether ``probs`` is decoded by the torch kernels on its own device: a tensor on any device but the CPU
    (unless :data:`TORCH_KERNELS_ON_CPU`). Never imports torch when it is not loaded."""
    torch = sys.modules.get("torch")
    return (
        torch is not None and isinstance(probs, torch.Tensor) and (TORCH_KERNELS_ON_CPU or probs.device.type != "cpu")
    )


def prepare_torch(
    probs: Any, taxonomy: Taxonomy, *, leaf_probs: bool = False, name: str = "probs", scores: bool = False
) -> Any:
    """:func:`prepare` for the rules that run on the tensor's own device: validated node probabilities ``[B, N]``.

    float32 stays float32 and other dtypes become float64, as :func:`prepare` with ``exact=False`` does, so
    results equal the NumPy path's. Only the validation's verdicts (three booleans, one sync) leave the device.
    """
    import torch

    from hiercls.taxonomy.ops import leaf_marginals  # torch, on the tensor's device (Taxonomy.marginals is NumPy)

    taxonomy = check_taxonomy(taxonomy)
    x = probs.detach()
    x = x.float() if (x.dtype == torch.float32 or not x.dtype.is_floating_point) else x.double()
    if x.ndim == 1:
        x = x[None, :]
    _check_shape(tuple(x.shape), taxonomy, leaf_probs, name, list(probs.shape))
    if x.numel():
        low, high = x.amin(), x.amax()  # both propagate NaN
        checks = probability_checks_enabled()
        verdicts = [torch.isfinite(low) & torch.isfinite(high), low >= -1e-6]
        if checks:
            verdicts.append(_plausible_torch(x, taxonomy, leaf_probs, scores, low, high))
        finite, nonneg, *plausible = torch.stack(verdicts).tolist()  # the one sync: three verdicts
        if checks and not plausible[0]:
            # Something is off: the NumPy check decides (its summation order is the reference for leaf sums)
            # and names the row and node. Only this error path copies to the host.
            kind = "leaf" if leaf_probs else ("scores" if scores else "node")
            check_probabilities(x.cpu().numpy(), taxonomy, kind=kind, name=name, row_offset=_ROW_OFFSET.get())
        if not finite:
            raise ValueError(f"{name} contains NaN or infinite values")
        if not nonneg:
            raise ValueError(f"{name} contains negative probabilities (min {float(low):.3g})")
    if leaf_probs:
        x = leaf_marginals(taxonomy, x.clamp_min(0.0)).to(x.dtype)
    return x


def _plausible_torch(
    x: Any, taxonomy: Taxonomy, leaf_probs: bool, scores: bool, low: Any, high: Any, atol: float = PROBABILITY_ATOL
) -> Any:
    """:func:`check_probabilities` on the device, as a 0-dim bool tensor (no sync): the same comparisons in the
    same precision (range, root, every edge), so it refuses what the NumPy check refuses; leaf sums get a margin of
    ``1e-12`` because their summation order differs, so only a borderline sum asks the NumPy check."""
    import torch

    ok = (low >= -atol) & (high <= 1.0 + atol)
    if leaf_probs:
        tol = atol + 2.0**-23 * taxonomy.num_leaves - 1e-12
        ok = ok & ((x.sum(1, dtype=torch.float64) - 1.0).abs() <= tol).all()
    elif not scores:
        root_tol = atol + 2.0**-23 * taxonomy.num_leaves
        ok = ok & ((x[:, 0].double() - 1.0).abs() <= root_tol).all()
        if taxonomy.num_nodes > 1 and taxonomy.is_tree:  # ids are a pre-order: node n's parent is below n
            parent = index_tensor(taxonomy, "tree_parent", np.asarray(taxonomy.parent[1:]), x.device)
            ok = ok & ((x[:, 1:] - x[:, parent]).amax() <= atol)
        elif taxonomy.num_nodes > 1:
            child = index_tensor(
                taxonomy,
                "edge_child",
                np.repeat(np.arange(taxonomy.num_nodes), np.diff(taxonomy.parent_ptr)),
                x.device,
            )
            parent = index_tensor(taxonomy, "edge_parent", np.asarray(taxonomy.parent_idx), x.device)
            ok = ok & ((x[:, child] - x[:, parent]).amax() <= atol)
    return ok


def _descending(k: int) -> np.ndarray:
    """``[k, 1]`` weights ``k, k-1, ..., 1`` in the smallest integer type that holds them."""
    return np.arange(k, 0, -1, dtype=np.int16 if k < 2**15 else np.int32)[:, None]


def first_true_t(mask: np.ndarray) -> np.ndarray:
    """Per column of a node-major ``mask [K, b]``: the first row that is set, ``K`` where none is (int64 ``[b]``).

    A max of descending weights is a vectorised reduction down axis 0; NumPy's argmax there would transpose.
    """
    k = mask.shape[0]
    return k - np.where(mask, _descending(k), 0).max(0).astype(np.int64) if k else np.zeros(mask.shape[1], np.int64)


def segment_reduce_t(ufunc: np.ufunc, x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``ufunc.reduceat(x, starts, axis=0)`` for node-major ``x [K, b]`` and non-empty segments, one slice at a time.

    NumPy's ``reduceat`` down axis 0 walks the columns one by one (25-45x slower here); a loop of vectorised
    row reductions is fast while the segments are not tiny.
    """
    ends = np.append(starts[1:], x.shape[0])
    out = np.empty((len(starts), x.shape[1]), dtype=x.dtype)
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if b - a == 1:
            out[i] = x[a]
        else:
            ufunc.reduce(x[a:b], axis=0, out=out[i])
    return out


def first_max_t(x: np.ndarray) -> np.ndarray:
    """Per column of a node-major ``x [K, b]`` (no NaN): the first row holding the column's maximum, int64 ``[b]``.

    Equals ``x.T.argmax(1)`` (NumPy's argmax returns the first maximum too).
    """
    return first_true_t(x == x.max(0))


def index_tensor(taxonomy: Taxonomy, key: str, values: np.ndarray, device: Any) -> Any:
    """A cached torch copy of a per-taxonomy index/weight array on ``device``."""
    import torch

    cache = taxonomy.namespace_cache(__name__)
    k = ("tensor", key, str(device))
    if k not in cache:
        cache[k] = torch.as_tensor(np.array(values), device=device)
    return cache[k]


def subtree_ends(taxonomy: Taxonomy) -> np.ndarray:
    """``n + subtree_size[n]`` for every node of a tree: its descendants-or-self are the ids ``[n, end[n])``."""
    cache = taxonomy.namespace_cache(__name__)
    if "subtree_ends" not in cache:
        cache["subtree_ends"] = (np.arange(taxonomy.num_nodes) + taxonomy.subtree_size).astype(np.intp)
    return cache["subtree_ends"]


def subtree_ends_tensor(taxonomy: Taxonomy, device: Any) -> Any:
    """:func:`subtree_ends` as an int64 tensor on ``device`` (cached)."""
    return index_tensor(taxonomy, "subtree_ends", subtree_ends(taxonomy).astype(np.int64), device)


def prefix_sums_t(a: np.ndarray, *, block: int | None = None, dtype: Any = None) -> np.ndarray:
    """``cs[j] = sum(a[:j])`` down the rows of node-major ``a [R, G]``: ``[R + 1, G]`` (``dtype``: ``a``'s).

    NumPy's cumsum down axis 0 walks each column separately (some 15x slower on these arrays); this adds whole
    rows, ``block`` steps within blocks of ``block`` rows (default about ``sqrt(R)``) and one step per block over
    the block totals, so ``R`` rows cost about ``2 sqrt(R)`` vectorised additions. ``a`` is padded with zero rows
    to whole blocks (a copy, unless it already has whole blocks). Still monotone in floating point for ``a >= 0``:
    within a block the partial sums only grow; across a boundary ``cs`` at the last row of a block is
    ``fl(off + part)``, at most ``fl(off + part + a) =`` the next block's offset, since rounding is monotone.
    """
    r, g = a.shape
    bs = block or max(8, int(np.sqrt(r)))
    nb = max(1, -(-r // bs))
    if r != nb * bs:
        padded = np.zeros((nb * bs, g), dtype=a.dtype)
        padded[:r] = a
        a = padded
    a3 = a.reshape(nb, bs, g)
    cs = np.empty((nb * bs + 1, g), dtype=a.dtype if dtype is None else dtype)
    c3 = cs[: nb * bs].reshape(nb, bs, g)
    c3[:, 0] = 0
    for i in range(1, bs):
        np.add(c3[:, i - 1], a3[:, i - 1], out=c3[:, i])
    tot = c3[:, bs - 1] + a3[:, bs - 1]
    off = np.empty((nb + 1, g), dtype=cs.dtype)
    off[0] = 0
    for b in range(nb):
        np.add(off[b], tot[b], out=off[b + 1])
    c3 += off[:nb, None, :]
    cs[nb * bs] = off[nb]
    return cs[: r + 1]


def sorted_children(taxonomy: Taxonomy) -> tuple[np.ndarray, np.ndarray]:
    """CSR children ``(ptr, idx)`` with each node's children sorted by id (the first maximum is the smallest id)."""
    cache = taxonomy.namespace_cache(__name__)
    if "sorted_children" not in cache:
        ptr = np.asarray(taxonomy.child_ptr, dtype=np.int64)
        idx = np.asarray(taxonomy.child_idx, dtype=np.int64)
        owner = np.repeat(np.arange(taxonomy.num_nodes), np.diff(ptr))
        cache["sorted_children"] = (ptr, idx[np.lexsort((idx, owner))])
    return cache["sorted_children"]


def _child_csr(taxonomy: Taxonomy) -> sp.csr_matrix:
    """``C[u, c] = 1`` for every child ``c`` of ``u``: ``C @ P`` sums each node's children (node-major ``P``)."""
    cache = taxonomy.namespace_cache(__name__)
    if "child_csr" not in cache:
        n = taxonomy.num_nodes
        par = taxonomy.primary_parent
        cache["child_csr"] = sp.csr_matrix((np.ones(n - 1), (par[1:], np.arange(1, n))), shape=(n, n))
    return cache["child_csr"]


def label_distribution_t(node_probs: np.ndarray, taxonomy: Taxonomy, *, leaf: np.ndarray | None = None) -> np.ndarray:
    """:func:`label_distribution` of a tree in node-major layout ``[N, B]`` (C-contiguous).

    Node-major makes the tree operations row gathers and contiguous sums, several times faster than
    column gathers on ``[B, N]``.
    """
    if leaf is not None:
        out = np.zeros((taxonomy.num_nodes, leaf.shape[0]))
        out[taxonomy.leaves] = leaf.T
        return out
    # A copy always (for a single row, ``.T`` is already contiguous and would alias the caller's array).
    out = np.array(node_probs.T, dtype=np.float64, order="C", copy=True)
    if taxonomy.num_nodes > 1:
        out -= _child_csr(taxonomy) @ out
    check_label_mass(out, taxonomy, node_probs, node_major=True, row_offset=_ROW_OFFSET.get())
    return np.maximum(out, 0.0, out=out)


def label_distribution(node_probs: np.ndarray, taxonomy: Taxonomy, *, leaf: np.ndarray | None = None) -> np.ndarray:
    """Probability that the label is exactly each node, ``[B, N]``, from node probabilities.

    On a tree ``p(n) = P(n) - sum of P(children)``; on a DAG the unit-triangular system ``P = p @ A`` (``A`` the
    ancestor matrix) is solved. Round-off negatives are clipped to 0. Given leaf probabilities, they are the
    label distribution directly.
    """
    if leaf is not None:
        out = np.zeros((leaf.shape[0], taxonomy.num_nodes))
        out[:, taxonomy.leaves] = leaf
        return out
    if node_probs.shape[0] == 0:
        return node_probs.copy()
    if taxonomy.is_tree:
        return label_distribution_t(node_probs, taxonomy).T
    else:
        a_t = taxonomy.ancestors_sparse.T.tocsr().astype(np.float64)
        out = spla.spsolve_triangular(a_t, node_probs.T, lower=False).T
        out = np.asarray(out)
        check_label_mass(out, taxonomy, node_probs, row_offset=_ROW_OFFSET.get())
    return np.maximum(out, 0.0, out=out)


def leaf_rows_torch(probs: Any) -> Any:
    """Leaf-probability tensor rows ``[B, L]`` in the working dtype of :func:`prepare_torch` (already validated)."""
    import torch

    leaf = probs.detach()
    leaf = leaf.float() if leaf.dtype == torch.float32 or not leaf.dtype.is_floating_point else leaf.double()
    return leaf.reshape(-1, leaf.shape[-1])


def value_dtype_torch(probs: Any) -> Any:
    """The dtype of values handed back for a tensor input (as :func:`restore_values`): its own float dtype."""
    import torch

    return probs.dtype if probs.dtype.is_floating_point else torch.float32


def label_distribution_torch(x: Any, taxonomy: Taxonomy, *, leaf: Any = None) -> Any:
    """:func:`label_distribution` on the tensor's device: float64 ``[B, N]`` from validated node probabilities
    ``x`` (:func:`prepare_torch`), or from the leaf probabilities ``leaf`` ``[B, L]`` when given.

    Trees: ``P(n)`` minus the sum of its children's ``P`` (one ``index_add_``). DAGs: ``P(n)`` minus the label mass
    of its strict descendants, one level of ``max_depth`` at a time from the deepest up (each reads only finished
    levels), the triangular solve of the NumPy path as one sparse product per level. Round-off negatives are
    clipped to 0; a
    negative beyond round-off is named by the NumPy check (the error path is the only host copy).
    """
    import torch

    b, n = x.shape
    dev = x.device
    if leaf is not None:
        out = torch.zeros(b, n, dtype=torch.float64, device=dev)
        out[:, index_tensor(taxonomy, "leaves", taxonomy.leaves, dev)] = leaf.double().clamp_min(0.0)
        return out
    out = x.to(torch.float64, copy=True)
    if n > 1 and taxonomy.is_tree:
        parent = index_tensor(taxonomy, "tree_parent", np.asarray(taxonomy.parent[1:]), dev)
        out -= torch.zeros_like(out).index_add_(1, parent, out[:, 1:])
    elif n > 1:
        for nodes, below in _descendant_levels_torch(taxonomy, dev):
            out[:, nodes] -= torch.sparse.mm(below, out.T).T
    if probability_checks_enabled() and b and bool(out.amin() < -PROBABILITY_ATOL):
        label_distribution(x.cpu().numpy().astype(np.float64), taxonomy)  # names the row and node, or passes
    return out.clamp_min_(0.0)


def _descendant_levels_torch(taxonomy: Taxonomy, device: Any) -> list[tuple[Any, Any]]:
    """Per level of ``max_depth`` of a DAG, deepest first: (its nodes, the float64 sparse ``[len(nodes), N]``
    matrix marking each one's strict descendants), cached on ``device``. A strict descendant is deeper by the
    longest root path, so each level reads only finished ones."""
    import torch

    cache = taxonomy.namespace_cache(__name__)
    key = ("descendant_levels", str(device))
    if key not in cache:
        anc = taxonomy.ancestors_sparse.tocoo()
        strict = anc.row != anc.col
        desc, node = anc.row[strict], anc.col[strict]  # node is a strict ancestor of desc
        depth = np.asarray(taxonomy.max_depth)
        n, levels = taxonomy.num_nodes, []
        for h in range(int(depth.max(initial=0)) - 1, -1, -1):
            nodes = np.flatnonzero(depth == h)
            pos = np.full(n, -1, dtype=np.int64)
            pos[nodes] = np.arange(len(nodes))
            sel = pos[node] >= 0
            idx = torch.as_tensor(np.stack([pos[node[sel]], desc[sel]]).astype(np.int64), device=device)
            values = torch.ones(idx.shape[1], dtype=torch.float64, device=device)
            mat = torch.sparse_coo_tensor(idx, values, (len(nodes), n), check_invariants=False).coalesce()
            levels.append((torch.as_tensor(nodes, device=device), mat))
        cache[key] = levels
    return cache[key]


def restore_ids(ids: np.ndarray, batch: Batch) -> Any:
    """Node ids ``[B]`` as int64 in the input's framework/device."""
    ids = np.asarray(ids, dtype=np.int64)
    if batch.is_torch:
        import torch

        return torch.from_numpy(ids).to(batch.torch_device)
    return ids


def restore_sets(sets: np.ndarray, batch: Batch) -> Any:
    """Boolean node sets ``[B, N]`` in the input's framework/device."""
    sets = np.asarray(sets, dtype=bool)
    if batch.is_torch:
        import torch

        return torch.from_numpy(sets).to(batch.torch_device)
    return sets


def restore_values(values: np.ndarray, batch: Batch) -> Any:
    """Float values ``[B, ...]`` in the input's framework (torch: the input's float dtype and device)."""
    if batch.is_torch:
        import torch

        return torch.from_numpy(np.ascontiguousarray(values)).to(batch.torch_device, batch.torch_dtype)
    return values
