"""Input conversion and checks shared by every metric.

Labels arrive as node ids ``[B]``, node names, ragged collections of ids/names (multi-label), or 0/1 node
sets ``[B, N]`` (numpy, torch or scipy sparse). They become a :class:`Labels`: either one node id per sample
or an ancestor-closed boolean CSR matrix ``[B, N]``. The CSR form is what lets a million samples on a
21k-node taxonomy fit in memory (each row holds only the nodes of the sample's label paths).
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import chain
from typing import Any, TypeVar

import numpy as np
import scipy.sparse as sp

from hiercls._checks import check_choice, to_numpy
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.core import check_taxonomy

__all__ = ["Labels", "UndefinedMetricWarning", "to_labels"]

F = TypeVar("F", bound=Callable[..., Any])


class UndefinedMetricWarning(UserWarning):
    """A ratio was 0/0 and ``zero_division="warn"`` replaced it by 0 (as scikit-learn does)."""


def ancestors_int32(taxonomy: Taxonomy) -> sp.csr_matrix:
    """``ancestors_sparse`` as int32: products of int8 matrices overflow once 128 descendants are summed."""
    cache = taxonomy.namespace_cache(__name__)
    if "anc32" not in cache:
        cache["anc32"] = taxonomy.ancestors_sparse.astype(np.int32)
    return cache["anc32"]


@dataclass(frozen=True)
class Labels:
    """One batch of labels: ``ids`` (one node per sample) or ``sets`` (closed CSR ``[B, N]``), never both.

    ``ids`` is a torch tensor (int64, on the input's device) only where the caller asked for the device path
    (``to_labels(..., device=True)``): the metrics then run the kernels of ``hiercls.metrics._device``. Likewise
    ``sets`` is then a dense closed boolean tensor ``[B, N]`` for node sets given as tensors.
    """

    ids: Any  # np.ndarray | torch.Tensor | None
    sets: Any  # sp.csr_matrix | torch.Tensor (dense bool [B, N], closed, on the device) | None
    num_nodes: int

    def __len__(self) -> int:
        return len(self.ids) if self.ids is not None else self.sets.shape[0]

    @property
    def is_ids(self) -> bool:
        return self.ids is not None

    @property
    def is_torch(self) -> bool:
        """Node ids or node sets held as a torch tensor (scored on its device)."""
        x = self.ids if self.ids is not None else self.sets
        return not isinstance(x, np.ndarray) and not sp.issparse(x)

    @property
    def device(self) -> Any:
        """The torch device of :attr:`is_torch` labels."""
        return (self.ids if self.ids is not None else self.sets).device

    def as_sets(self, taxonomy: Taxonomy) -> sp.csr_matrix:
        """Ancestor-closed node sets (the rows of the ancestor matrix for id labels)."""
        if self.sets is not None:
            return self.sets
        return taxonomy.ancestors_sparse[self.ids].astype(bool)

    def select(self, mask: np.ndarray) -> Labels:
        if self.ids is not None:
            return Labels(self.ids[mask], None, self.num_nodes)
        if self.is_torch:
            return Labels(None, self.sets[mask], self.num_nodes)
        return Labels(None, self.sets[np.flatnonzero(mask)], self.num_nodes)


def close_sets(sets: sp.csr_matrix, taxonomy: Taxonomy) -> sp.csr_matrix:
    """Add every ancestor (through all parents on a DAG) of every node in each row."""
    closed = sets.astype(np.int32) @ ancestors_int32(taxonomy)
    closed = closed.astype(bool).tocsr()
    closed.sort_indices()
    return closed


def _name_index(taxonomy: Taxonomy) -> dict[str, bytes]:
    """Name -> node id as the 8 bytes of an int64: ``b"".join`` of the looked-up values is the id array, with no
    Python int made or converted per label."""
    cache = taxonomy.namespace_cache(__name__)
    if "name_index" not in cache:
        ids = np.arange(taxonomy.num_nodes, dtype=np.int64)
        cache["name_index"] = {n: ids[i : i + 1].tobytes() for i, n in enumerate(taxonomy.names)}
    return cache["name_index"]


@dataclass(frozen=True)
class _NameTable:
    """A perfect hash of the node names, for vectorised name -> id lookups (hash and displace).

    A name is its code points, zero padded to an even width and read as uint64 words (two code points each);
    its key is ``words @ coef`` (uint64, wrapping, random odd coefficients). The top ``bits`` bits of the key
    pick a bucket, the next ones a slot, and each bucket's displacement (XOR-ed into the slot) was chosen when
    the table was built so that no two names share a slot. A lookup is thus a few array operations and two
    small gathers, without a search; the words of the name found are then compared with the label's, so an
    unknown label is always detected.

    :func:`_byte_table` holds the names' UTF-8 bytes in the same structure (``points`` are then bytes, eight to
    a word, and ``point_coef`` is unused), for the lists of names of :func:`_lookup_fixed_width`.
    """

    points: np.ndarray  # [N, L] uint32 code points, zero padded; L = the longest name
    words: np.ndarray  # [N, ceil(L / 2)] uint64: the same, two code points per word
    lengths: np.ndarray  # [N] code points up to the last non-zero one
    coef: np.ndarray  # [W] uint64
    point_coef: np.ndarray  # [2W] uint64: the same key from code points (word j = cp[2j] + cp[2j + 1] * 2**32)
    bits: int  # log2 of the number of buckets; slots: 2 ** (bits + 1)
    disp: np.ndarray  # [2**bits] int32 displacement per bucket
    slots: np.ndarray  # [2**(bits+1)] int32 node id per slot (0 where empty: never a false match, see lookup)

    def find(self, keys: np.ndarray) -> np.ndarray:
        # One shift keeps the bucket bits and the slot bits below them (2 * bits + 1 bits: they fit an intp, so
        # the rest is integer arithmetic); np.take is the cheaper gather for 1-D tables.
        top = (keys >> np.uint64(63 - 2 * self.bits)).astype(np.intp)
        return np.take(self.slots, (top & ((2 << self.bits) - 1)) ^ np.take(self.disp, top >> (self.bits + 1)))


def _seeded_perfect_hash(points: np.ndarray, words: np.ndarray, lengths: np.ndarray) -> _NameTable | None:
    """:func:`_perfect_hash` with up to eight draws of its random coefficients (seeded: the same table every run),
    or ``None`` when none separates the names."""
    rng = np.random.default_rng(0)
    for _ in range(8):
        table = _perfect_hash(points, words, lengths, rng)
        if table is not None:
            return table
    return None


def _perfect_hash(
    points: np.ndarray, words: np.ndarray, lengths: np.ndarray, rng: np.random.Generator
) -> _NameTable | None:
    """Build a :class:`_NameTable` with random coefficients; ``None`` when these do not separate the names."""
    n, width = words.shape
    bits = max(1, int(np.ceil(np.log2(max(n, 2)))))  # ~1 name per bucket, at most half the slots taken
    if 64 - 2 * bits - 1 < 0:  # pragma: no cover - more than 2**31 names
        return None
    coef = rng.integers(1, 2**63, size=width, dtype=np.uint64) | np.uint64(1)
    point_coef = np.repeat(coef, 2)
    point_coef[1::2] <<= np.uint64(32)
    keys = words @ coef
    probe = _NameTable(
        points,
        words,
        lengths,
        coef,
        point_coef,
        bits,
        np.zeros(1 << bits, np.int32),
        np.arange(2 << bits, dtype=np.int32),
    )
    bucket = (keys >> np.uint64(64 - bits)).astype(np.intp)
    h2 = probe.find(keys).astype(np.intp)  # the slot before displacement (identity slots, zero displacements)
    n_slots = 2 << bits
    if len(np.unique(bucket * n_slots + h2)) < n:
        return None  # two names with the same bucket and slot: no displacement separates them
    disp = np.zeros(1 << bits, dtype=np.int32)
    slots = np.zeros(n_slots, dtype=np.int32)
    taken = np.zeros(n_slots, dtype=bool)
    order = np.argsort(bucket, kind="stable")
    starts = np.flatnonzero(np.r_[True, bucket[order][1:] != bucket[order][:-1]])
    sizes = np.diff(np.r_[starts, n])
    # Buckets of several names first, largest first, each trying displacements until its slots are all free.
    for k in np.argsort(-sizes, kind="stable")[: int((sizes > 1).sum())]:
        members = order[starts[k] : starts[k] + sizes[k]]
        for _ in range(16):  # 64 random displacements at a time; a free one is found within the first few
            cand = h2[members][None, :] ^ rng.integers(0, n_slots, size=(64, 1))
            ok = np.flatnonzero(~taken[cand].any(axis=1))
            if ok.size:
                s = cand[ok[0]]
                taken[s] = True
                slots[s] = members
                disp[bucket[members[0]]] = s[0] ^ h2[members[0]]
                break
        else:  # pragma: no cover - with at most half the slots taken, 1024 draws all fail with probability ~0
            return None
    # The single-name buckets take the free slots directly: d = h2 ^ the chosen slot.
    single = order[starts[sizes == 1]]
    free = np.flatnonzero(~taken)[: len(single)]
    slots[free] = single
    disp[bucket[single]] = h2[single] ^ free
    return _NameTable(points, words, lengths, coef, point_coef, bits, disp, slots)


def _name_table(taxonomy: Taxonomy) -> _NameTable | None:
    """The cached :class:`_NameTable` of ``taxonomy``; ``None`` if no hash separates the names (dicts are used)."""
    cache = taxonomy.namespace_cache(__name__)
    if "name_table" not in cache:
        arr = np.array(taxonomy.names, dtype=str)
        width = max(1, arr.dtype.itemsize // 4)
        points = np.ascontiguousarray(arr.astype(f"<U{width}")).view(np.uint32).reshape(len(arr), width)
        nonzero = points != 0
        lengths = np.where(nonzero.any(1), width - np.argmax(nonzero[:, ::-1], axis=1), 0)
        padded = np.zeros((len(arr), width + width % 2), dtype=np.uint32)
        padded[:, :width] = points
        words = padded.view(np.uint64)
        cache["name_table"] = _seeded_perfect_hash(points, words, lengths)
    return cache["name_table"]


def _lookup_name_array(values: np.ndarray, taxonomy: Taxonomy) -> np.ndarray | None:
    """Vectorised ids of a 1-D ``str`` array (no Python call per label); ``None`` when any is not a name."""
    table = _name_table(taxonomy)
    if table is None or values.dtype.kind != "U" or values.ndim != 1 or not values.size:
        return None
    width = table.points.shape[1]
    w_in = values.dtype.itemsize // 4
    points = np.ascontiguousarray(values).view(np.uint32).reshape(len(values), w_in)
    if w_in > width:
        if points[:, width:].any():
            return None  # a label longer than every name
        points, w_in = np.ascontiguousarray(points[:, :width]), width
    if w_in % 2 == 0:  # whole uint64 words: the key as the table computes it
        ids = table.find(points.view(np.uint64) @ table.coef[: w_in // 2])
    else:  # the same key from the code points
        ids = table.find(points.astype(np.uint64) @ table.point_coef[:w_in])
    # The hash only points at a candidate: every label must equal its candidate's name, code point for code point
    # (a label that is no name points at an arbitrary node, or at node 0 through an empty slot, and differs).
    # Labels as wide as the names (an array of the names' own dtype) compare whole rows, the fast case.
    known = np.take(table.points, ids, axis=0)
    if not np.array_equal(known if w_in == width else known[:, :w_in], points):
        return None
    if w_in < width and (table.lengths[ids] > w_in).any():
        return None
    return ids.astype(np.int64)


def _byte_table(taxonomy: Taxonomy) -> _NameTable | None:
    """The cached :class:`_NameTable` of the names' UTF-8 bytes, zero padded to ``8 * (longest // 8 + 1)`` bytes
    (room for a NUL after the longest name, as :func:`_lookup_fixed_width` lays labels out).

    ``None`` where a name holds a NUL or a lone surrogate (the lookup's layout relies on names without NUL
    bytes, and such a name has no UTF-8 bytes) or no hash separates the names: lists then take the dict.
    """
    cache = taxonomy.namespace_cache(__name__)
    if "byte_table" not in cache:
        table = None
        try:
            encoded = [name.encode() for name in taxonomy.names]
        except UnicodeEncodeError:
            encoded = []
        if encoded and not any(b"\0" in e for e in encoded):
            lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
            width = 8 * (int(lengths.max()) // 8 + 1)
            points = np.frombuffer(b"".join(e.ljust(width, b"\0") for e in encoded), dtype=np.uint8)
            points = points.reshape(len(encoded), width)
            table = _seeded_perfect_hash(points, points.view(np.uint64), lengths)
        cache["byte_table"] = table
    return cache["byte_table"]


#: Shortest list that :func:`_lookup_fixed_width` takes: below it the dict's per-label lookups cost less than the
#: fixed cost of its dozen array operations (about 10 us; they break even near 700 labels of a 1K or 21K tree).
_FIXED_WIDTH_MIN = 512


def _lookup_fixed_width(values: list[Any] | tuple[Any, ...], taxonomy: Taxonomy) -> np.ndarray | None:
    """Ids of a list of names that all have the UTF-8 length of the first one, without a Python step per label.

    The labels are joined (one C-level pass) with as many NULs after each as round it up to whole uint64 words,
    ``row = 8 * (w // 8 + 1)`` bytes, so the joined bytes read as a ``[B, row / 8]`` word matrix, one label per
    row: hashed like :func:`_lookup_name_array` through :func:`_byte_table`, then compared word for word with the
    name found. Only the rows' layout is assumed; the check proves it: a row that equals a name of ``w`` bytes
    (names hold no NUL) has ``w`` non-NUL bytes followed by NULs, so the joined bytes hold exactly the
    separators' NULs and every label is a run of ``w`` bytes between them, the row it was hashed from.

    Returns:
        The ids, or ``None`` when the labels are not all ``str`` of one length, or any is not a name (the caller
        then takes the dict, which names the label).
    """
    table = _byte_table(taxonomy)
    first, last = values[0], values[-1]
    if table is None or not isinstance(first, str) or not isinstance(last, str):
        return None
    try:
        w = len(first.encode())
        if len(last.encode()) != w:
            return None  # the last label's length tells most lists of several lengths before the join is paid
    except UnicodeEncodeError:
        return None
    row = 8 * (w // 8 + 1)  # at least one NUL after each label, so that labels cannot run into one another
    n_words = row // 8
    if not w or n_words > table.words.shape[1]:
        return None  # an empty label, or one longer than every name
    try:
        data = ("\0" * (row - w)).join(values).encode()
    except (TypeError, UnicodeEncodeError):
        return None  # a label that is no str, or has no UTF-8 bytes
    n = len(values)
    if len(data) != n * row - (row - w):
        return None  # labels of several lengths
    padded = data + bytes(row - w)
    words = np.frombuffer(padded, dtype=np.uint64).reshape(n, n_words)
    # The table's key (words @ coef, over its wider rows whose extra words are 0 here) as a few column products:
    # uint64 matmul is a generic loop, slower than these for one or two words.
    keys = words[:, 0] * table.coef[0]
    for j in range(1, n_words):
        keys += words[:, j] * table.coef[j]
    ids = table.find(keys)
    # The exact check, one memcmp: the rows of the names found (as laid out for w, see _byte_rows) are the labels.
    if np.take(_byte_rows(taxonomy, table, w), ids, axis=0).tobytes() != padded:
        return None
    return ids.astype(np.int64)


def _byte_rows(taxonomy: Taxonomy, table: _NameTable, w: int) -> np.ndarray:
    """Every name of :func:`_byte_table` as the row a label of ``w`` bytes makes in :func:`_lookup_fixed_width`:
    its bytes and NULs up to ``8 * (w // 8 + 1)`` bytes if it has ``w`` bytes, else bytes 0xFF (never in UTF-8,
    so no label row equals them: the comparison with the labels also checks the names' lengths).

    Cached per ``w``, for at most four widths at a time (the cache starts over past them), so that lists of many
    lengths cannot grow it without bound.
    """
    cache = taxonomy.namespace_cache(__name__).setdefault("byte_rows", {})
    rows = cache.get(w)  # one read: another thread may start the cache over between a test and a second read
    if rows is None:
        rows = np.array(table.words[:, : w // 8 + 1], order="C")  # a copy: the table itself stays as it is
        rows[table.lengths != w] = np.uint64(2**64 - 1)
        if len(cache) >= 4:
            cache.clear()
        cache[w] = rows
    return rows


def _lookup_names(values: list[Any] | tuple[Any, ...], taxonomy: Taxonomy) -> np.ndarray | None:
    """Ids of known names through the cached map; ``None`` when any value is not a known name."""
    if len(values) >= _FIXED_WIDTH_MIN:
        ids = _lookup_fixed_width(values, taxonomy)
        if ids is not None:
            return ids
    index = _name_index(taxonomy)
    try:
        # One C-level lookup per label; the values are the ids' bytes, joined into the int64 array.
        # (itemgetter of a single key returns the value itself, not a 1-tuple.)
        found = operator.itemgetter(*values)(index) if len(values) > 1 else [index[v] for v in values]
        return np.frombuffer(b"".join(found), dtype=np.int64).copy()
    except (KeyError, TypeError):
        return None


def _names_to_ids(values: Iterable[Any], taxonomy: Taxonomy, name: str) -> np.ndarray:
    # A vectorised lookup for str arrays, one C-level dict lookup per label otherwise; the loop below only runs
    # to name an unknown label.
    if isinstance(values, np.ndarray) and values.size:
        ids = _lookup_name_array(values, taxonomy)
        if ids is not None:
            return ids
    vals = values.tolist() if isinstance(values, np.ndarray) and values.dtype.kind in "USO" else values
    if isinstance(vals, list | tuple):
        ids = _lookup_names(vals, taxonomy)
        if ids is not None:
            return ids
    out = []
    for i, v in enumerate(values):
        try:
            out.append(taxonomy.index(str(v)))
        except TaxonomyError as err:
            raise TaxonomyError(f"{name}[{i}]: {err.reason}", label=str(v)) from None
    return np.asarray(out, dtype=np.int64)


def _ragged_to_sets(rows: list[Any], taxonomy: Taxonomy, name: str) -> sp.csr_matrix:
    n = taxonomy.num_nodes
    rows = [np.asarray(r).ravel().tolist() if isinstance(r, np.ndarray) else list(r) for r in rows]
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    flat = list(chain.from_iterable(rows))
    owner = np.repeat(np.arange(len(rows)), lengths)
    values = np.asarray(flat) if flat else np.zeros(0, dtype=np.int64)
    if values.dtype.kind in "US":
        uniq, inverse = np.unique(values, return_inverse=True)
        ids_u = np.empty(len(uniq), dtype=np.int64)
        for k, v in enumerate(uniq.tolist()):
            try:
                ids_u[k] = taxonomy.index(v)
            except TaxonomyError as err:
                i = int(owner[np.flatnonzero(inverse == k)[0]])
                raise TaxonomyError(f"{name}[{i}]: {err.reason}", label=v) from None
        ids = ids_u[inverse.ravel()]
    elif values.dtype.kind in "iu":
        ids = values.astype(np.int64)
        bad = (ids < 0) | (ids >= n)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(
                f"{name}[{int(owner[j])}] contains node id {int(ids[j])}; expected ids in [0, {n}) for "
                f"taxonomy {taxonomy.name!r}"
            )
    else:
        j = next(
            (j for j, v in enumerate(flat) if isinstance(v, bool | float) or not isinstance(v, numbers.Integral | str)),
            0,
        )
        raise TypeError(
            f"{name}[{int(owner[j])}] contains {flat[j]!r} ({type(flat[j]).__name__}); expected node "
            "names or ids (not a mix)"
        )
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    m = sp.csr_matrix((np.ones(len(ids), dtype=bool), ids, indptr), shape=(len(rows), n))
    m.sum_duplicates()
    return m


def _torch_ids(y: Any, taxonomy: Taxonomy, name: str, allow_ignore: bool) -> Any:
    """``y`` as int64 node ids on its own device if it is a 1-D integer tensor, else ``None``.

    The range check runs on the device; only its verdict (one boolean) and, to name the culprit, the first bad
    position come to the host.
    """
    if not _is_tensor(y) or y.ndim != 1 or y.dtype.is_floating_point or y.dtype.is_complex:
        return None
    if str(y.dtype) == "torch.bool":
        return None
    from hiercls.metrics import _device

    if not _device.wanted(y):
        return None
    ids = y.detach().long()
    n = taxonomy.num_nodes
    low = -1 if allow_ignore else 0
    bad = (ids < low) | (ids >= n)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        v = int(ids[i])
        hint = " (-1 marks ignored samples only in y_true)" if v == -1 else ""
        raise ValueError(
            f"{name}[{i}] = {v} is not a node id of taxonomy {taxonomy.name!r}; expected ids in [{low}, {n}){hint}"
        )
    return ids


def _torch_sets(y: Any, taxonomy: Taxonomy, name: str, close: bool) -> Any:
    """``y`` as boolean node sets ``[B, N]`` on its own device (closed under ancestors when ``close``) if it is a
    2-D tensor the kernels take, else ``None``. Only the verdict of the 0/1 check leaves the device (and, to name
    the culprit, the first bad position)."""
    if not _is_tensor(y) or y.ndim != 2:
        return None
    from hiercls.metrics import _device

    if not _device.wanted(y):
        return None
    n = taxonomy.num_nodes
    if y.shape[1] != n:
        raise ValueError(
            f"{name} has shape {tuple(y.shape)}; expected [B] node ids or [B, {n}] node sets for "
            f"taxonomy {taxonomy.name!r} ({n} nodes): is it the right taxonomy?"
        )
    if y.dtype.is_complex:
        raise TypeError(f"{name} node sets have dtype {y.dtype}; expected bool or 0/1 numbers")
    s = y.detach()
    if str(s.dtype) != "torch.bool":
        bad = (s != 0) & (s != 1)
        if bool(bad.any()):
            r, c = (int(v) for v in bad.nonzero()[0])
            raise ValueError(
                f"{name}[{r}, {c}] = {s[r, c].item()!r}; node sets must hold only 0/1 (threshold "
                "probabilities with a decoder first)"
            )
        s = s != 0
    if not close:
        return s
    from hiercls.decode.sets import ancestor_closure

    return ancestor_closure(s, taxonomy)


def to_labels(
    y: Any,
    taxonomy: Taxonomy,
    *,
    name: str,
    close: bool = True,
    allow_ignore: bool = False,
    device: bool = False,
) -> Labels:
    """Convert ``y`` to :class:`Labels`, validating shape, dtype, ids and names.

    Args:
        y: node ids ``[B]`` (int), node names ``[B]`` (str), a list of per-sample collections of ids or
            names (multi-label), or 0/1 node sets ``[B, N]`` (bool/int/float numpy or torch, or scipy sparse).
        taxonomy: the taxonomy the labels refer to.
        name: parameter name for error messages (``"y_true"``, ``"y_pred"``).
        close: add all ancestors to node sets (id labels are closed by construction).
        allow_ignore: accept ``-1`` ids (samples to ignore); the caller drops them.
        device: keep torch tensors on their device, 1-D integer ones as ids and 2-D ones as node sets (closed
            there when ``close``); the caller has a torch path.

    Raises:
        TaxonomyError: unknown label names.
        ValueError: wrong shape, out-of-range ids, values other than 0/1 in a node set.
        TypeError: unsupported input type or dtype.
    """
    n = taxonomy.num_nodes
    if device:
        ids = _torch_ids(y, taxonomy, name, allow_ignore)
        if ids is not None:
            return Labels(ids, None, n)
        dense = _torch_sets(y, taxonomy, name, close)
        if dense is not None:
            return Labels(None, dense, n)
    if isinstance(y, list | tuple) and y and type(y[0]) is str:
        ids = _lookup_names(y, taxonomy)  # names: no round trip through a numpy array
        if ids is not None:
            return Labels(ids, None, n)
    y = to_numpy(y, passthrough=True)
    if sp.issparse(y):
        m = sp.csr_matrix(y)
        if m.ndim != 2 or m.shape[1] != n:
            raise ValueError(
                f"{name} is a sparse matrix of shape {m.shape}; expected [B, {n}] node sets for "
                f"taxonomy {taxonomy.name!r} ({n} nodes)"
            )
        data = m.data
        if data.size and not np.isin(data, (0, 1)).all():
            bad = data[~np.isin(data, (0, 1))][0].item()
            raise ValueError(f"{name} node sets must hold only 0/1 values; found {bad!r}")
        m = m.astype(bool)
        m.eliminate_zeros()
        return Labels(None, close_sets(m, taxonomy) if close else _sorted(m), n)
    if isinstance(y, list | tuple):
        if len(y) and all(isinstance(r, list | tuple | set | frozenset | np.ndarray) or _is_tensor(r) for r in y):
            rows = [to_numpy(r, passthrough=True) for r in y]
            dense = None
            if all(not isinstance(r, set | frozenset) and len(r) == n for r in rows):
                # Every row has N entries: a [B, N] 0/1 node-set matrix written as nested lists.
                dense = np.asarray(rows)
                if dense.ndim != 2 or dense.dtype.kind not in "biuf":
                    dense = None
            if dense is None:
                m = _ragged_to_sets(rows, taxonomy, name)
                return Labels(None, close_sets(m, taxonomy) if close else m, n)
            y = dense
        else:
            y = np.asarray(y)
    if not isinstance(y, np.ndarray):
        raise TypeError(
            f"{name} must be node ids, node names or node sets (numpy, torch, list or scipy sparse); "
            f"got {type(y).__name__}"
        )
    if y.ndim == 1 and y.size == 0:
        y = y.astype(np.int64)  # an empty batch (np.asarray([]) is float)
    if y.ndim == 0:
        raise ValueError(f"{name} must have a batch dimension: [B] node ids or [B, {n}] node sets; got a scalar")
    if y.dtype.kind in "USO":
        if y.ndim != 1:
            raise ValueError(f"{name} holds names with shape {y.shape}; expected one name per sample, shape [B]")
        return Labels(_names_to_ids(y, taxonomy, name), None, n)
    if y.ndim == 1:
        if y.dtype.kind not in "iu":
            if y.dtype.kind == "f" and y.size and np.array_equal(y, np.round(y)):
                raise TypeError(
                    f"{name} has dtype {y.dtype}; node ids must be integers (cast with .long() / "
                    ".astype(int)), node sets must be 2-D [B, N]"
                )
            raise TypeError(
                f"{name} has dtype {y.dtype} and shape {y.shape}; expected integer node ids [B] or [B, {n}] node sets"
            )
        ids = y.astype(np.int64, copy=False)
        low = -1 if allow_ignore else 0
        bad = (ids < low) | (ids >= n)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            hint = " (-1 marks ignored samples only in y_true)" if ids[i] == -1 else ""
            raise ValueError(
                f"{name}[{i}] = {int(ids[i])} is not a node id of taxonomy {taxonomy.name!r}; expected "
                f"ids in [{low}, {n}){hint}"
            )
        return Labels(ids, None, n)
    if y.ndim == 2:
        if y.shape[1] != n:
            raise ValueError(
                f"{name} has shape {tuple(y.shape)}; expected [B] node ids or [B, {n}] node sets for "
                f"taxonomy {taxonomy.name!r} ({n} nodes): is it the right taxonomy?"
            )
        if y.dtype.kind not in "biuf":
            raise TypeError(f"{name} node sets have dtype {y.dtype}; expected bool or 0/1 numbers")
        m = _dense_to_csr(y, name)
        return Labels(None, close_sets(m, taxonomy) if close else m, n)
    raise ValueError(f"{name} has shape {tuple(y.shape)}; expected [B] node ids or [B, {n}] node sets")


def _dense_to_csr(y: np.ndarray, name: str) -> sp.csr_matrix:
    """Boolean CSR of a dense 0/1 ``[B, N]`` array, checking that the non-zeros are ones.

    ``flatnonzero`` is an order of magnitude faster than the 2-D ``nonzero`` behind
    ``scipy.sparse.csr_matrix(dense)``, and only the non-zeros need checking.
    """
    b, n = y.shape
    y = np.ascontiguousarray(y)
    flat = np.flatnonzero(y)
    if y.dtype.kind != "b":
        vals = y.ravel()[flat]
        bad = vals != 1
        if bad.any():
            r, c = divmod(int(flat[np.flatnonzero(bad)[0]]), n)
            raise ValueError(
                f"{name}[{r}, {c}] = {y[r, c].item()!r}; node sets must hold only 0/1 (threshold "
                "probabilities with a decoder first)"
            )
    rows, cols = np.divmod(flat, n)
    indptr = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=b), out=indptr[1:])
    return sp.csr_matrix((np.ones(len(cols), dtype=bool), cols, indptr), shape=(b, n))


def _sorted(m: sp.csr_matrix) -> sp.csr_matrix:
    m = m.tocsr()
    m.sort_indices()
    return m


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def check_weights(sample_weight: Any, n: int, device: Any = None) -> Any:
    """``None`` or a float64 ``[n]`` array of finite non-negative weights (a tensor on ``device`` if given)."""
    if sample_weight is None:
        return None
    if device is not None:
        import torch

        w = torch.as_tensor(sample_weight, dtype=torch.float64, device=device)
        if tuple(w.shape) != (n,):
            raise ValueError(f"sample_weight has shape {tuple(w.shape)}; expected ({n},), one weight per sample")
        if not bool((torch.isfinite(w) & (w >= 0)).all()):
            raise ValueError("sample_weight must be finite and non-negative")
        return w
    w = np.asarray(to_numpy(sample_weight), dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"sample_weight has shape {w.shape}; expected ({n},), one weight per sample")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("sample_weight must be finite and non-negative")
    return w


def prepare_pair(
    y_true: Any,
    y_pred: Any,
    taxonomy: Taxonomy,
    sample_weight: Any = None,
    *,
    close: bool = True,
    close_pred: bool | None = None,
    return_keep: bool = False,
    device: bool = False,
) -> Any:
    """Validate a ``(y_true, y_pred)`` pair, drop samples whose target is ``-1``, return weights aligned.

    With ``return_keep`` also returns the boolean mask of the samples kept (to align other per-sample inputs).
    With ``device`` (callers that have a torch path), labels given as torch tensors stay on their device (ids
    and node sets): the labels then hold tensors, and so do the weights and the mask; the other side of the pair
    is moved to the tensor's device (host node sets as dense ones).
    """
    check_taxonomy(taxonomy)
    t = to_labels(y_true, taxonomy, name="y_true", close=close, allow_ignore=True, device=device)
    p = to_labels(y_pred, taxonomy, name="y_pred", close=close if close_pred is None else close_pred, device=device)
    if len(t) != len(p):
        raise ValueError(f"y_true has {len(t)} samples but y_pred has {len(p)}")
    if t.is_torch or p.is_torch:
        t, p = _same_device(t, p)
    if t.is_torch:
        import torch

        w = check_weights(sample_weight, len(t), device=t.device)
        keep = t.ids >= 0 if t.is_ids else torch.ones(len(t), dtype=torch.bool, device=t.device)
        if not bool(keep.all()):
            t, p = t.select(keep), p.select(keep)
            w = None if w is None else w[keep]
        return (t, p, w, keep) if return_keep else (t, p, w)
    w = check_weights(sample_weight, len(t))
    keep = np.ones(len(t), dtype=bool)
    if t.is_ids and (t.ids < 0).any():
        keep = t.ids >= 0
        t, p = t.select(keep), p.select(keep)
        w = None if w is None else w[keep]
    return (t, p, w, keep) if return_keep else (t, p, w)


def _same_device(t: Labels, p: Labels) -> tuple[Labels, Labels]:
    """Both sides as tensors on one device (``y_pred``'s if both are tensors): ids stay ids (int64), node sets
    stay node sets (host CSR ones become dense boolean tensors there)."""
    import torch

    dev = p.device if p.is_torch else t.device

    def move(x: Labels) -> Labels:
        if x.is_ids:
            return Labels(torch.as_tensor(x.ids, dtype=torch.int64, device=dev), None, x.num_nodes)
        dense = x.sets if x.is_torch else torch.as_tensor(x.sets.toarray())
        return Labels(None, dense.to(dev), x.num_nodes)

    return move(t), move(p)


def check_zero_division(zero_division: Any) -> Any:
    if isinstance(zero_division, str):
        return check_choice(zero_division, ("warn",), "zero_division")
    if isinstance(zero_division, numbers.Real) and (math.isnan(zero_division) or zero_division in (0, 1)):
        return float(zero_division)
    raise ValueError(f"zero_division must be 'warn', 0.0, 1.0 or nan; got {zero_division!r}")


def divide(num: Any, den: Any, zero_division: Any) -> tuple[Any, Any]:
    """``(num / den with zero_division where den == 0, the 0/0 mask)``, never warning (``"warn"`` fills 0).

    Torch tensors stay tensors on their device.
    """
    if _is_tensor(num) or _is_tensor(den):
        from hiercls.metrics import _device

        return _device.divide(num, den, zero_division)
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    zero = den == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / np.where(zero, 1.0, den)
    if zero.any():
        out = np.where(zero, 0.0 if zero_division == "warn" else zero_division, out)
    return (out if out.ndim else float(out)), zero


def warn_undefined(what: str, zero_division: Any, stacklevel: int = 3) -> None:
    """The one :class:`UndefinedMetricWarning` of an undefined metric (only under ``zero_division="warn"``)."""
    if zero_division == "warn":
        warnings.warn(
            f"{what} is ill-defined (0/0) and set to 0.0; pass zero_division to choose the value",
            UndefinedMetricWarning,
            stacklevel=stacklevel + 1,
        )


def safe_divide(num: Any, den: Any, zero_division: Any, what: str, *, warn: bool = True) -> Any:
    """``num / den`` elementwise with ``zero_division`` where ``den == 0`` (``"warn"``: 0 and one warning, unless
    ``warn=False``: the caller warns once for the metric)."""
    out, zero = divide(num, den, zero_division)
    if warn and zero.any():
        warn_undefined(what, zero_division, stacklevel=3)
    return out


def renamed_keyword(old: str, new: str) -> Callable[[F], F]:
    """Accept the keyword ``old`` for ``new`` for one more release, with a :class:`FutureWarning`.

    Example:
        >>> @renamed_keyword("scores", "y_score")
        ... def f(y_true, y_score=None):
        ...     return y_score
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as w:
        ...     warnings.simplefilter("always")
        ...     f([1], scores=[2]), w[0].category.__name__
        ([2], 'FutureWarning')
    """

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if old in kwargs:
                if new in kwargs:
                    raise TypeError(f"{fn.__qualname__}() got both {new}= and its deprecated name {old}=; pass {new}=")
                warnings.warn(
                    f"{fn.__qualname__}(): {old}= is deprecated and will be removed in the next release; "
                    f"pass {new}= (scikit-learn's name)",
                    FutureWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return fn(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def weighted_sum(values: Any, w: Any) -> float:
    if _is_tensor(values):
        from hiercls.metrics import _device

        return float(_device.weighted_sum(values, w))
    values = np.asarray(values, dtype=np.float64)
    return float(values.sum() if w is None else values @ w)


def batch_sum(values: Any, w: Any) -> Any:
    """``Σ w·values`` without leaving the device: a 0-d tensor for tensors, a float64 for NumPy (the stateful
    metrics add it to their states as it is)."""
    if _is_tensor(values):
        from hiercls.metrics import _device

        return _device.weighted_sum(values, w)
    values = np.asarray(values, dtype=np.float64)
    return values.sum() if w is None else values @ w


def weight_total(n: int, w: Any) -> Any:
    """The number of samples, or the sum of their weights (a 0-d tensor for tensor weights)."""
    return float(n) if w is None else w.sum()


def atleast_1d(x: Any) -> Any:
    """``np.atleast_1d`` that leaves torch tensors as they are (on their device)."""
    return x.reshape(-1) if _is_tensor(x) and x.ndim == 0 else (x if _is_tensor(x) else np.atleast_1d(x))
