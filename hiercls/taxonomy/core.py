"""The immutable, validated :class:`Taxonomy` every other part of hiercls stands on.

Node ids are integers ``0 .. N-1`` in a topological order (every parent has a smaller id than its
children, the root is ``0``). For a tree the order is the depth-first pre-order, so the descendants of
node ``n`` are exactly the id range ``[n, n + subtree_size[n])``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import operator
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal, get_args

import networkx as nx
import numpy as np
import scipy.sparse as sp

logger = logging.getLogger(__name__)

DistanceKind = Literal[
    "shortest_path", "lca_height", "wu_palmer", "wu_palmer_root1", "zhao", "ic_distance", "jiang_conrath"
]
DISTANCE_KINDS: tuple[str, ...] = get_args(DistanceKind)
"""Every ``kind`` of :meth:`Taxonomy.distance` (``jiang_conrath`` is another name for ``ic_distance``)."""
TreeStrategy = Literal["first", "shortest", "longest"]

__all__ = ["DISTANCE_KINDS", "DistanceKind", "Taxonomy", "TaxonomyError", "TreeStrategy", "check_taxonomy"]


class TaxonomyError(ValueError):
    """A taxonomy (or a label given against one) is invalid.

    The message names where the problem is (``source``, ``line``) and what (``label``) when known.

    Example:
        >>> err = TaxonomyError("cycle through 'b'", source="tree.tsv", line=3)
        >>> str(err)
        "tree.tsv:3: cycle through 'b'"
    """

    def __init__(
        self, message: str, *, source: str | None = None, line: int | None = None, label: str | None = None
    ) -> None:
        self.source, self.line, self.label, self.reason = source, line, label, message
        where = source or ""
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        super().__init__(f"{where}: {message}" if where else message)


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _csr(ptr_lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(ptr_lists) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in ptr_lists])
    idx = np.fromiter((i for x in ptr_lists for i in x), dtype=np.int64, count=int(ptr[-1]))
    return _readonly(ptr), _readonly(idx)


class Taxonomy:
    """An immutable rooted hierarchy (a tree or a multi-parent DAG) with integer node ids.

    Args:
        edges: ``(parent, child)`` pairs of node names.
        nodes: all node names, in the order that breaks ties between siblings (default: order of first
            appearance in ``edges``). Needed for a taxonomy that is a single node.
        display_names: optional human-readable name per node (default: the name itself).
        classes: names of the nodes a sample can be labelled with (default: every node but the root).
            Used by the semantic levels of ImageNet-21K pretraining.
        virtual_root: when the edges have several roots, join them under a new root of this name
            (without it, several roots are an error).
        name: a short name for the taxonomy (shown by ``repr`` and the CLI).
        metadata: free JSON-serialisable facts (source, version...). Not part of the fingerprint.
        locations: optional ``"file:line"`` string per edge, so that errors can say where an edge came from.

    Raises:
        TaxonomyError: empty input, self-loops, duplicate edges, cycles, several roots without
            ``virtual_root``, edges naming nodes missing from ``nodes``, unknown classes.

    Example:
        >>> tax = Taxonomy([("animal", "cat"), ("animal", "dog"), ("root", "animal"), ("root", "car")])
        >>> tax.names
        ('root', 'animal', 'cat', 'dog', 'car')
        >>> tax.depth.tolist(), tax.leaves.tolist()
        ([0, 1, 2, 2, 1], [2, 3, 4])
        >>> tax.name_of(tax.lca(tax.index("cat"), tax.index("dog")))
        'animal'
    """

    def __init__(
        self,
        edges: Iterable[tuple[str, str]],
        *,
        nodes: Iterable[str] | None = None,
        display_names: Mapping[str, str] | None = None,
        classes: Iterable[str] | None = None,
        virtual_root: str | None = None,
        name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        locations: Sequence[str | None] | None = None,
    ) -> None:
        edges = [(str(p), str(c)) for p, c in edges]
        locs = list(locations) if locations is not None else [None] * len(edges)
        if len(locs) != len(edges):
            raise ValueError(f"locations has {len(locs)} entries but edges has {len(edges)}")
        order, first_edge = _node_order(edges, nodes, locs)
        # Plain integer adjacency (positions in input order): networkx is only needed to explain a cycle.
        by_pos = list(order)
        kids: list[list[int]] = [[] for _ in by_pos]
        pars: list[list[int]] = [[] for _ in by_pos]
        for p, c in edges:
            kids[order[p]].append(order[c])
            pars[order[c]].append(order[p])
        roots = [by_pos[i] for i, ps in enumerate(pars) if not ps]
        self._virtual_root = _join_roots(roots, virtual_root, by_pos, kids, pars)
        topo = _topological_order(kids, pars)
        if not roots or len(topo) < len(by_pos):
            cycle = nx.find_cycle(nx.DiGraph(edges))
            text = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
            where = first_edge.get(cycle[0])
            raise _at(locs[where] if where is not None else None, f"cycle in taxonomy: {text}", cycle[0][0])
        new_id = np.empty(len(by_pos), dtype=np.int64)
        new_id[topo] = np.arange(len(topo))
        names = [by_pos[i] for i in topo]
        self._names = tuple(names)
        self._index = idx = {n: i for i, n in enumerate(names)}
        # Parents keep the order their edges were given in (WordNet: nltk's hypernym order), so that
        # to_tree("first") follows the first listed parent.
        nid = new_id.tolist()
        self._parent_lists = [[nid[p] for p in pars[i]] for i in topo]
        self._child_lists = [[nid[c] for c in kids[i]] for i in topo]
        joined = [(0, idx[r]) for r in roots] if self._virtual_root is not None else []
        self._edge_order = joined + [(idx[p], idx[c]) for p, c in edges]
        disp = dict(display_names or {})
        unknown = [k for k in disp if k not in idx]
        if unknown:
            raise TaxonomyError(f"display_names names unknown node {unknown[0]!r}", label=unknown[0])
        self._display = tuple(disp.get(n, n) for n in names)
        self._class_mask = _readonly(_class_mask(idx, classes))
        self._name = name or "taxonomy"
        self._metadata: dict[str, Any] = dict(metadata or {})
        self._dropped_edges: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        """The taxonomy's short name (not part of the fingerprint)."""
        return self._name

    @property
    def metadata(self) -> Mapping[str, Any]:
        """Free facts about the taxonomy (source, counts...), read-only; :meth:`replace` gives a changed copy."""
        return MappingProxyType(self._metadata)

    @property
    def dropped_edges(self) -> tuple[tuple[str, str], ...]:
        """The ``(parent, child)`` edges :meth:`to_tree` dropped to make this tree (empty otherwise)."""
        return self._dropped_edges

    def replace(self, *, name: str | None = None, metadata: Mapping[str, Any] | None = None) -> Taxonomy:
        """A copy with another name and/or metadata; the structure (and the fingerprint) is shared.

        Shipped taxonomies are cached and shared, so they cannot be changed in place.

        Example:
            >>> tax = Taxonomy([("r", "a")], name="toy")
            >>> other = tax.replace(name="renamed", metadata={"source": "hand-made"})
            >>> other.name, dict(other.metadata), tax.name, other == tax
            ('renamed', {'source': 'hand-made'}, 'toy', True)
        """
        out = object.__new__(Taxonomy)
        out.__dict__.update(self.__dict__)
        out._name = name if name is not None else self._name
        out._metadata = dict(metadata) if metadata is not None else self._metadata
        return out

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_parents(cls, parents: Mapping[str, str | Sequence[str] | None], **kwargs: Any) -> Taxonomy:
        """Build from a ``child -> parent`` (or ``child -> [parents]``) mapping; ``None`` marks a root.

        Example:
            >>> Taxonomy.from_parents({"root": None, "a": "root", "b": "root"}).num_nodes
            3
        """
        edges, nodes = [], []
        for child, ps in parents.items():
            nodes.append(child)
            if ps is None:
                continue
            for p in [ps] if isinstance(ps, str) else ps:
                edges.append((p, child))
        extra = [p for p, _ in edges if p not in parents]
        nodes = list(dict.fromkeys(extra + nodes))
        return cls(edges, nodes=nodes, **kwargs)

    @classmethod
    def from_children(cls, children: Mapping[str, Sequence[str] | None], **kwargs: Any) -> Taxonomy:
        """Build from a ``parent -> [children]`` mapping, the way many research repositories ship a hierarchy.

        A node listed under several parents makes a DAG; ``None`` or ``[]`` marks a node without children.
        Node order: the keys, then the children, in order of appearance.

        Raises:
            TaxonomyError: a value is not a list of names (the error names the key), or the edges do not form
                a taxonomy (cycle, several roots without ``virtual_root=``...).

        Example:
            >>> tax = Taxonomy.from_children({"root": ["animal", "car"], "animal": ["cat", "dog"]})
            >>> tax.names, tax.num_leaves
            (('root', 'animal', 'cat', 'dog', 'car'), 3)
        """
        if not isinstance(children, Mapping):
            raise TypeError(f"children must be a mapping parent -> [children]; got {type(children).__name__}")
        edges: list[tuple[str, str]] = []
        nodes: list[str] = []
        for parent, kids in children.items():
            if not isinstance(parent, str) or not parent.strip():
                raise TaxonomyError(f"parent names must be non-empty strings; got key {parent!r}", label=str(parent))
            nodes.append(parent)
            if kids is None:
                continue
            if isinstance(kids, str) or not isinstance(kids, Sequence):
                raise TaxonomyError(f"the children of {parent!r} must be a list of names; got {kids!r}", label=parent)
            for kid in kids:
                if not isinstance(kid, str) or not kid.strip():
                    raise TaxonomyError(
                        f"the children of {parent!r} must be non-empty names; got {kid!r}", label=parent
                    )
                edges.append((parent, kid))
        nodes = list(dict.fromkeys(nodes + [c for _, c in edges]))
        return cls(edges, nodes=nodes, **kwargs)

    @classmethod
    def from_networkx(cls, graph: nx.DiGraph, *, display_attr: str = "display_name", **kwargs: Any) -> Taxonomy:
        """Build from a ``networkx.DiGraph`` whose edges point parent -> child (node keys become names).

        Keys are converted with ``str``; two keys with the same string (``1`` and ``"1"``) are refused.

        Example:
            >>> g = nx.DiGraph([("r", "a"), ("r", "b")])
            >>> Taxonomy.from_networkx(g).leaves.tolist()
            [1, 2]
        """
        if not isinstance(graph, nx.Graph) or not graph.is_directed():
            raise TypeError(
                f"graph must be a networkx.DiGraph with parent -> child edges; got {type(graph).__name__}"
                + (" (undirected: the edge directions are unknown)" if isinstance(graph, nx.Graph) else "")
            )
        names: dict[str, Any] = {}
        for n in graph.nodes:
            first = names.setdefault(str(n), n)
            if first is not n and first != n:
                raise TaxonomyError(f"nodes {first!r} and {n!r} have the same name {str(n)!r}", label=str(n))
        display = {str(n): str(d[display_attr]) for n, d in graph.nodes(data=True) if display_attr in d}
        kwargs.setdefault("display_names", display or None)
        return cls([(str(u), str(v)) for u, v in graph.edges()], nodes=list(names), **kwargs)

    def to_networkx(self) -> nx.DiGraph:
        """A fresh ``DiGraph`` (parent -> child) keyed by node name, with ``id`` and ``display_name`` attributes."""
        g = nx.DiGraph()
        for i, n in enumerate(self._names):
            g.add_node(n, id=i, display_name=self._display[i], is_class=bool(self._class_mask[i]))
        g.add_edges_from(self.edge_list(names=True))
        return g

    # ------------------------------------------------------------------ names and ids
    @property
    def names(self) -> tuple[str, ...]:
        """Node names in id order."""
        return self._names

    @property
    def display_names(self) -> tuple[str, ...]:
        """Human-readable node names in id order."""
        return self._display

    @property
    def num_nodes(self) -> int:
        return len(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def root(self) -> int:
        """Id of the root (always ``0``)."""
        return 0

    @property
    def virtual_root(self) -> str | None:
        """Name of the root added to join several roots, or ``None``."""
        return self._virtual_root

    def index(self, name: str) -> int:
        """Id of the node called ``name``.

        Raises:
            TaxonomyError: the name is not a node (the message suggests close names).
        """
        try:
            return self._index[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), self._names, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise TaxonomyError(f"unknown label {name!r} for taxonomy {self.name!r}{hint}", label=str(name)) from None

    def ids(self, names: Iterable[str]) -> np.ndarray:
        """Ids of several names, as an ``int64`` array (one dict look-up each); an unknown name raises as :meth:`index`.

        Example:
            >>> Taxonomy([("r", "a"), ("r", "b")]).ids(["b", "a"]).tolist()
            [2, 1]
        """
        seq = names if isinstance(names, list) else list(names)
        try:  # itemgetter looks several keys up in one C call; of one key it returns the value itself
            found = operator.itemgetter(*seq)(self._index) if len(seq) > 1 else [self._index[n] for n in seq]
        except (KeyError, TypeError):
            found = [self.index(n) for n in seq]  # raises, naming the first unknown name
        return np.fromiter(found, dtype=np.int64, count=len(seq))

    def name_of(self, node: int) -> str:
        """Name of node id ``node``."""
        return self._names[int(node)]

    def edge_list(self, names: bool = False) -> list[tuple[Any, Any]]:
        """``(parent, child)`` pairs in the order the taxonomy was given (ids, or names with ``names=True``)."""
        if names:
            return [(self._names[p], self._names[c]) for p, c in self._edge_order]
        return list(self._edge_order)

    # ------------------------------------------------------------------ structure
    @cached_property
    def is_tree(self) -> bool:
        """Every node but the root has exactly one parent."""
        return all(len(p) == 1 for p in self._parent_lists[1:])

    @cached_property
    def _parents_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self._parent_lists)

    @cached_property
    def _children_csr(self) -> tuple[np.ndarray, np.ndarray]:
        return _csr(self._child_lists)

    @property
    def parent_ptr(self) -> np.ndarray:
        """CSR pointer: the parents of ``n`` are ``parent_idx[parent_ptr[n]:parent_ptr[n+1]]``."""
        return self._parents_csr[0]

    @property
    def parent_idx(self) -> np.ndarray:
        return self._parents_csr[1]

    @property
    def child_ptr(self) -> np.ndarray:
        """CSR pointer into :attr:`child_idx`, as :attr:`parent_ptr`."""
        return self._children_csr[0]

    @property
    def child_idx(self) -> np.ndarray:
        return self._children_csr[1]

    def parents(self, node: int) -> tuple[int, ...]:
        return tuple(self._parent_lists[int(node)])

    def children(self, node: int) -> tuple[int, ...]:
        return tuple(self._child_lists[int(node)])

    @cached_property
    def primary_parent(self) -> np.ndarray:
        """The first parent of every node in input order (``-1`` for the root); the tree parent for trees."""
        return _readonly(np.array([p[0] if p else -1 for p in self._parent_lists], dtype=np.int64))

    @property
    def parent(self) -> np.ndarray:
        """Parent of every node (``-1`` for the root).

        Raises:
            TaxonomyError: the taxonomy is a DAG; use :meth:`to_tree` first or :attr:`primary_parent`.
        """
        if not self.is_tree:
            raise TaxonomyError(f"taxonomy {self.name!r} has multi-parent nodes; call to_tree() first")
        return self.primary_parent

    @cached_property
    def num_children(self) -> np.ndarray:
        return _readonly(np.diff(self.child_ptr))

    @cached_property
    def depth(self) -> np.ndarray:
        """Length of the shortest path from the root (root = 0)."""
        return self._path_lengths(min)

    @cached_property
    def max_depth(self) -> np.ndarray:
        """Length of the longest path from the root (equals :attr:`depth` on a tree)."""
        return self.depth if self.is_tree else self._path_lengths(max)

    def _path_lengths(self, pick: Any) -> np.ndarray:
        d = [0] * self.num_nodes
        for n in range(1, self.num_nodes):  # parents have smaller ids: final before their children
            d[n] = pick(d[p] for p in self._parent_lists[n]) + 1
        return _readonly(np.array(d, dtype=np.int64))

    @property
    def height(self) -> int:
        """Depth of the deepest node (a single-node taxonomy has height 0)."""
        return int(self.max_depth.max())

    @cached_property
    def levels(self) -> tuple[np.ndarray, ...]:
        """Node ids at each depth: ``levels[d]`` holds the nodes with ``depth == d``."""
        order = np.argsort(self.depth, kind="stable")
        cuts = np.searchsorted(self.depth[order], np.arange(1, self.depth.max() + 1))
        return tuple(_readonly(a) for a in np.split(order, cuts))

    @cached_property
    def is_leaf(self) -> np.ndarray:
        return _readonly(self.num_children == 0)

    @cached_property
    def leaves(self) -> np.ndarray:
        """Ids of nodes without children, ascending."""
        return _readonly(np.flatnonzero(self.is_leaf))

    @property
    def num_leaves(self) -> int:
        return len(self.leaves)

    @cached_property
    def leaf_index(self) -> np.ndarray:
        """Position of each node in :attr:`leaves` (``-1`` for internal nodes)."""
        li = np.full(self.num_nodes, -1, dtype=np.int64)
        li[self.leaves] = np.arange(self.num_leaves)
        return _readonly(li)

    @property
    def class_mask(self) -> np.ndarray:
        """``True`` for the nodes a sample can be labelled with."""
        return self._class_mask

    @cached_property
    def classes(self) -> np.ndarray:
        return _readonly(np.flatnonzero(self._class_mask))

    @cached_property
    def subtree_size(self) -> np.ndarray:
        """Number of descendants of each node, itself included."""
        if self.is_tree:  # bottom-up: O(N), where the ancestor matrix has N * depth entries
            return _readonly(self._tree_subtree_sum(np.ones(self.num_nodes, dtype=np.int64)))
        return _readonly(np.asarray(self.ancestors_sparse.sum(axis=0)).ravel().astype(np.int64))

    def _tree_subtree_sum(self, x: np.ndarray) -> np.ndarray:
        """``x`` (node-major ``[N, ...]``, changed in place) plus, at each node of a tree, the sum over its
        descendants."""
        for children, starts, parents in self._bottom_up_levels:
            x[parents] += np.add.reduceat(x[children], starts, axis=0)
        return x

    @cached_property
    def num_leaves_under(self) -> np.ndarray:
        """Number of leaves among each node's descendants (a leaf counts itself)."""
        if self.is_tree:
            return _readonly(self._tree_subtree_sum(self.is_leaf.astype(np.int64)))
        return _readonly(np.asarray(self.ancestors_sparse[self.leaves].sum(axis=0)).ravel().astype(np.int64))

    # ------------------------------------------------------------------ ancestors and paths
    @cached_property
    def ancestors_sparse(self) -> sp.csr_matrix:
        """``A[i, j] = 1`` iff ``j`` is an ancestor of ``i`` or ``i`` itself (scipy CSR, ``int8``)."""
        n = self.num_nodes
        if self.is_tree:
            p = self.paths
            rows = np.repeat(np.arange(n), (p >= 0).sum(1))
            cols = p[p >= 0]
        else:
            sets: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * n
            sets[0] = np.array([0], dtype=np.int64)
            for i in range(1, n):
                ps = self._parent_lists[i]
                merged = sets[ps[0]] if len(ps) == 1 else np.unique(np.concatenate([sets[q] for q in ps]))
                sets[i] = np.append(merged, i)
            rows = np.repeat(np.arange(n), [len(s) for s in sets])
            cols = np.concatenate(sets)
        m = sp.csr_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(n, n))
        m.sort_indices()
        return m

    @cached_property
    def ancestor_table(self) -> np.ndarray:
        """Ancestors-or-self of every node as sorted rows: ``[N, K]`` int64 (``K`` the largest such set), ids in
        ascending order, ``-1`` padding in front, so that every row is sorted (binary search tests membership).

        Example:
            >>> Taxonomy([("r", "a"), ("a", "x"), ("r", "b")]).ancestor_table.tolist()
            [[-1, -1, 0], [-1, 0, 1], [0, 1, 2], [-1, 0, 3]]
        """
        anc = self.ancestors_sparse  # sorted indices
        counts = np.diff(anc.indptr)
        k = int(counts.max(initial=1))
        out = np.full((self.num_nodes, k), -1, dtype=np.int64)
        rows = np.repeat(np.arange(self.num_nodes), counts)
        out[rows, k - counts[rows] + (np.arange(anc.nnz) - anc.indptr[rows])] = anc.indices  # right-aligned
        return _readonly(out)

    def ancestor_matrix(self, nodes: np.ndarray | None = None, *, include_self: bool = True) -> np.ndarray:
        """Dense boolean ancestor matrix ``[len(nodes), N]`` (rows: ``nodes``, default all nodes).

        ``M[i, j]`` is ``True`` iff node ``j`` is an ancestor of ``nodes[i]`` (or the node itself when
        ``include_self``). Dense means ``N * len(nodes)`` bytes: pass ``nodes`` (e.g. :attr:`leaves`) on big trees.
        """
        rows = np.arange(self.num_nodes) if nodes is None else np.asarray(nodes, dtype=np.int64)
        m = self.ancestors_sparse[rows].toarray().astype(bool)
        if not include_self:
            m[np.arange(len(rows)), rows] = False
        return m

    def ancestors(self, node: int, *, include_self: bool = False) -> np.ndarray:
        """Ids of the ancestors of ``node`` (ascending, i.e. root first on a tree)."""
        a = self.ancestors_sparse
        row = a.indices[a.indptr[node] : a.indptr[node + 1]]
        return row if include_self else row[row != node]

    def descendants(self, node: int, *, include_self: bool = False) -> np.ndarray:
        """Ids of the descendants of ``node`` (ascending)."""
        col = self.descendants_sparse
        d = col.indices[col.indptr[node] : col.indptr[node + 1]]
        return d if include_self else d[d != node]

    @cached_property
    def descendants_sparse(self) -> sp.csr_matrix:
        """``D[i, j] = 1`` iff ``j`` is a descendant of ``i`` or ``i`` itself (transpose of the ancestors)."""
        m = self.ancestors_sparse.T.tocsr()
        m.sort_indices()
        return m

    @cached_property
    def paths(self) -> np.ndarray:
        """Root-to-node path of every node: ``paths[n, d]`` is the ancestor at depth ``d`` (``-1`` past the node).

        Shape ``[N, height + 1]``. Trees only.
        """
        par = self.parent
        depth = self.depth
        p = np.full((self.num_nodes, self.height + 1), -1, dtype=np.int64)
        p[0, 0] = 0
        for lvl in self.levels[1:]:
            p[lvl] = p[par[lvl]]
            p[lvl, depth[lvl]] = lvl
        return _readonly(p)

    @cached_property
    def leaf_paths(self) -> np.ndarray:
        """:attr:`paths` of the leaves, ``[num_leaves, height + 1]``. Trees only."""
        return _readonly(self.paths[self.leaves])

    def path(self, node: int) -> list[int]:
        """Ids from the root down to ``node`` (trees: the unique path; DAGs: a shortest path)."""
        out = [int(node)]
        while out[-1] != 0:
            ps = self._parent_lists[out[-1]]
            out.append(min(ps, key=lambda q: (self.depth[q], q)))
        return out[::-1]

    @cached_property
    def semantic_level(self) -> np.ndarray:
        """Semantic-softmax level (ImageNet-21K pretraining): number of a class's ancestors that are classes.

        ``-1`` for nodes that are not classes.
        """
        mask = self._class_mask.astype(np.int64)
        if self.is_tree:  # top-down, one level at a time: O(N), where the ancestor matrix has N * depth entries
            counts = np.zeros(self.num_nodes, dtype=np.int64)
            for lvl in self.levels[1:]:
                counts[lvl] = counts[self.parent[lvl]] + mask[self.parent[lvl]]
        else:
            counts = np.asarray(self.ancestors_sparse @ mask).ravel() - mask
        return _readonly(np.where(self._class_mask, counts, -1).astype(np.int64))

    # ------------------------------------------------------------------ LCA and distances
    def lca(self, a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray | int:
        """Lowest common ancestor, vectorised over broadcastable id arrays.

        On a DAG this is the deepest common ancestor (by :attr:`depth`, ties to the smaller id).

        Example:
            >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
            >>> tax.lca(np.array([2, 2]), np.array([3, 4])).tolist()
            [1, 0]
        """
        scalar = np.isscalar(a) and np.isscalar(b)
        a_arr, b_arr = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        if self.is_tree:
            out = self._tree_lca(a_arr.ravel(), b_arr.ravel())
        else:
            out = self._dag_lca(a_arr.ravel(), b_arr.ravel())
        out = out.reshape(a_arr.shape)
        return int(out) if scalar else out

    def _dag_lca(self, a: np.ndarray, b: np.ndarray, chunk: int = 1 << 12) -> np.ndarray:
        # The shared entries of the two ancestor rows, compared all against all ([chunk, K, K]); among them the
        # deepest, ties to the smaller id.
        tab, n = self.ancestor_table, self.num_nodes
        out = np.empty(len(a), dtype=np.int64)
        for s in range(0, len(a), chunk):
            ta, tb = tab[a[s : s + chunk]], tab[b[s : s + chunk]]
            shared = (ta[:, :, None] == tb[:, None, :]).any(2) & (ta >= 0)
            rank = np.where(shared, self.depth[np.maximum(ta, 0)] * (n + 1) + (n - ta), -1)
            out[s : s + chunk] = ta[np.arange(len(ta)), rank.argmax(1)]
        return out

    def _tree_lca(self, a: np.ndarray, b: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
        p = self.paths
        out = np.empty(len(a), dtype=np.int64)
        for s in range(0, len(a), chunk):
            pa, pb = p[a[s : s + chunk]], p[b[s : s + chunk]]
            # Equal entries at depth d mean the same ancestor at d and so at every shallower depth: the
            # matches form a prefix whose length is the LCA's depth + 1 (the -1 padding never matches).
            k = ((pa == pb) & (pa >= 0)).sum(1) - 1
            out[s : s + chunk] = pa[np.arange(len(pa)), k]
        return out

    @cached_property
    def information_content(self) -> np.ndarray:
        """Leaf-count information content ``-log(leaves under n / all leaves)``; 0 at the root.

        An intrinsic IC (no corpus counts), in the family of Seco et al. (2004) and Sánchez et al. (2011):
        the probability of a node is the share of the leaves (outcomes) it covers.
        """
        return _readonly(-np.log(self.num_leaves_under / self.num_leaves))

    def distance(
        self, a: np.ndarray | int, b: np.ndarray | int, kind: DistanceKind = "shortest_path"
    ) -> np.ndarray | float:
        """Distance between nodes, vectorised over broadcastable id arrays; zero when ``a == b``.

        Kinds (``lca = lca(a, b)``, ``d`` = depth, ``H`` = :attr:`height`, ``IC`` = :attr:`information_content`):

        * ``"shortest_path"``: edges between ``a`` and ``b`` through their LCA, ``d(a) + d(b) - 2 d(lca)``.
        * ``"lca_height"``: ``H - d(lca)``, the mistake severity of Bertinetto et al. "Making better mistakes"
          (2020) (height of the LCA in a tree whose leaves all sit at depth ``H``).
        * ``"wu_palmer"``: ``1 - 2 d(lca) / (d(a) + d(b))`` with the root at depth 0, one minus the Wu-Palmer
          similarity in the form of Plaud et al., "To Each Metric Its Decoding" (ICML 2025).
        * ``"wu_palmer_root1"``: ``1 - 2 (d(lca) + 1) / (d(a) + d(b) + 2)``, the same with WordNet's (NLTK's)
          convention that the root has depth 1 (hiercls's ``"wu_palmer"`` before the paper form became it).
        * ``"zhao"``: ``1 - 2 IC(lca) / (IC(a) + IC(b))``, the normalised information-content cost of Plaud
          et al. (after Zhao et al.), with ``IC(n) = log2(L / leaves under n)`` (the base cancels in the ratio).
        * ``"ic_distance"``: ``IC(a) + IC(b) - 2 IC(lca)`` in nats, the Jiang-Conrath information-content
          distance (hiercls's ``"zhao"`` before the paper form became it); ``"jiang_conrath"`` is the same.

        Every kind is 0 when ``a == b``. The ratios are 0/0 only there for ``wu_palmer`` (``a == b`` = root)
        and, for ``zhao``, also between distinct nodes that both cover every leaf (the root and a chain of
        single children below it, all with ``IC = 0``): such nodes cannot be told apart by their leaves, so
        their ``zhao`` distance is defined as 0.

        Example:
            >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
            >>> tax.distance(2, np.array([2, 3, 4])).tolist()
            [0.0, 2.0, 3.0]
        """
        a_arr, b_arr = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        lca = np.asarray(self.lca(a_arr, b_arr))
        if kind == "shortest_path":
            d = self.depth
            out = (d[a_arr] + d[b_arr] - 2 * d[lca]).astype(np.float64)
        elif kind == "lca_height":
            out = (self.height - self.depth[lca]).astype(np.float64)
        elif kind in ("wu_palmer", "wu_palmer_root1"):
            d = self.depth + (1.0 if kind == "wu_palmer_root1" else 0.0)
            den = d[a_arr] + d[b_arr]
            out = 1.0 - 2.0 * d[lca] / np.where(den > 0, den, 1.0)  # den = 0 only for a == b == root
        elif kind == "zhao":
            ic = self.information_content
            den = ic[a_arr] + ic[b_arr]
            out = np.where(den > 0, 1.0 - 2.0 * ic[lca] / np.where(den > 0, den, 1.0), 0.0)
        elif kind in ("ic_distance", "jiang_conrath"):
            ic = self.information_content
            out = ic[a_arr] + ic[b_arr] - 2.0 * ic[lca]
        else:
            raise ValueError(f"kind must be one of {', '.join(DISTANCE_KINDS)}; got {kind!r}")
        out = np.where(a_arr == b_arr, 0.0, out)
        return out[()] if out.ndim == 0 else out  # a numpy scalar for scalar inputs, like lca

    def distance_matrix(
        self, kind: DistanceKind = "shortest_path", nodes: np.ndarray | None = None, targets: np.ndarray | None = None
    ) -> np.ndarray:
        """Pairwise :meth:`distance` ``[len(nodes), len(targets)]`` (defaults: all nodes x leaves)."""
        rows = np.arange(self.num_nodes) if nodes is None else np.asarray(nodes, dtype=np.int64)
        cols = self.leaves if targets is None else np.asarray(targets, dtype=np.int64)
        return self.distance(rows[:, None], cols[None, :], kind)

    # ------------------------------------------------------------------ probabilities
    def marginals(self, leaf_probs: Any) -> Any:
        """Node probabilities ``[..., N]`` from leaf probabilities ``[..., num_leaves]`` (``leaves`` order).

        A node's probability is the sum over the leaves below it, with ``P(parent) >= P(child)`` exactly for
        non-negative input: on a tree each parent is a float sum of its children's rounded values (rounding is
        monotone); on a DAG, where that would count shared leaves twice, the leaf sums get a max pass up the edges.
        NumPy in, NumPy out (``np.result_type(leaf_probs, np.float32)``); a torch tensor goes to the host and back
        to its device, float32 (float64 stays float64), without gradient (heads use ``hiercls.taxonomy.tensors``).

        Example:
            >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
            >>> tax.marginals(np.array([0.5, 0.2, 0.3])).round(3).tolist()
            [1.0, 0.7, 0.5, 0.2, 0.3]
        """
        if hasattr(leaf_probs, "new_tensor"):  # a torch tensor (duck-typed: the taxonomy core never imports torch)
            x = leaf_probs.detach()
            x = x.double() if str(x.dtype) == "torch.float64" else x.float()
            return x.new_tensor(self.marginals(x.cpu().numpy()))
        arr = np.asarray(leaf_probs)
        if arr.ndim < 1 or arr.shape[-1] != self.num_leaves:
            raise ValueError(
                f"leaf_probs must have shape [..., {self.num_leaves}] (one entry per leaf of taxonomy "
                f"{self.name!r}, in taxonomy.leaves order); got {list(arr.shape)}"
            )
        dtype = np.result_type(arr, np.float32)
        leaf = arr.reshape(-1, self.num_leaves).T  # node-major [L, B]: the level steps add or compare whole rows
        if self.is_tree:
            out = np.zeros((self.num_nodes, leaf.shape[1]), dtype=dtype)
            out[self.leaves] = leaf
            out = self._tree_subtree_sum(out)
        else:
            out = np.asarray(self._leaf_to_node @ leaf, dtype=dtype)
            for children, starts, parents in self._bottom_up_levels:
                out[parents] = np.maximum(out[parents], np.maximum.reduceat(out[children], starts, axis=0))
        return out.T.reshape(*arr.shape[:-1], self.num_nodes)

    @cached_property
    def _leaf_to_node(self) -> sp.csr_matrix:
        return self.ancestors_sparse[self.leaves].T.astype(np.float64).tocsr()

    @cached_property
    def _bottom_up_levels(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The edges by decreasing longest-path depth of the child (a node is final before it is pushed to its
        parents), each level as ``(children sorted by parent, start of each parent's run, the parents)``."""
        children = np.repeat(np.arange(self.num_nodes), np.diff(self.parent_ptr))
        parents, depth = self.parent_idx, self.max_depth[children]
        levels = []
        for d in range(int(depth.max(initial=0)), 0, -1):
            sel = np.flatnonzero(depth == d)
            sel = sel[np.argsort(parents[sel], kind="stable")]
            starts = np.flatnonzero(np.r_[True, np.diff(parents[sel]) != 0])
            levels.append((children[sel], starts, parents[sel][starts]))
        return levels

    def namespace_cache(self, namespace: str) -> dict[Any, Any]:
        """One module's own scratch dict for arrays it derives from this taxonomy (pass ``__name__``): the taxonomy is
        immutable, so entries never go stale; they are not pickled.

        Example:
            >>> tax = Taxonomy([("r", "a"), ("r", "b")])
            >>> tax.namespace_cache("my.module")["table"] = 1
            >>> tax.namespace_cache("my.module")
            {'table': 1}
        """
        return self.__dict__.setdefault("_derived_cache", {}).setdefault(namespace, {})

    # ------------------------------------------------------------------ derived taxonomies
    def to_tree(self, strategy: TreeStrategy = "first") -> Taxonomy:
        """A tree keeping one parent per node; the edges dropped are on the result's :attr:`dropped_edges`.

        Args:
            strategy: ``"first"`` keeps the first parent in input order (WordNet's first hypernym);
                ``"shortest"`` keeps a parent on a shortest root path (min depth, ties by input order);
                ``"longest"`` keeps a parent on a longest root path.

        Example:
            >>> dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x")])
            >>> tree = dag.to_tree("first")
            >>> tree.is_tree, tree.dropped_edges
            (True, (('b', 'x'),))
        """
        if strategy not in ("first", "shortest", "longest"):
            raise ValueError(f"strategy must be 'first', 'shortest' or 'longest'; got {strategy!r}")
        if self.is_tree:
            return self
        keep: list[tuple[str, str]] = []
        dropped: list[tuple[str, str]] = []
        pos = {e: i for i, e in enumerate(self._edge_order)}
        for n in range(1, self.num_nodes):
            ps = self._parent_lists[n]
            if strategy == "first":
                chosen = ps[0]
            elif strategy == "shortest":
                chosen = min(ps, key=lambda q: self.depth[q])
            else:
                chosen = max(ps, key=lambda q: self.max_depth[q])
            for q in ps:
                (keep if q == chosen else dropped).append((q, n))
        keep.sort(key=pos.__getitem__)
        out = self._derive([(self._names[p], self._names[c]) for p, c in keep], self._names)
        out._dropped_edges = tuple((self._names[p], self._names[c]) for p, c in sorted(dropped, key=pos.__getitem__))
        logger.info("to_tree(%r) on %r dropped %d of %d edges", strategy, self.name, len(dropped), len(pos))
        return out

    def restrict(self, nodes: Iterable[str | int], *, classes: Iterable[str] | None = None) -> Taxonomy:
        """The sub-taxonomy of ``nodes`` and all their ancestors (e.g. WordNet restricted to 1,000 classes).

        A virtual root is kept only while it still joins several roots; under a single original root the
        result is rooted there.

        Example:
            >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
            >>> tax.restrict(["x"]).names
            ('r', 'a', 'x')
        """
        ids = [self.index(n) if isinstance(n, str) else int(n) for n in nodes]
        keep = np.zeros(self.num_nodes, dtype=bool)
        keep[np.unique(self.ancestors_sparse[ids].indices)] = True
        edges = [(self._names[p], self._names[c]) for p, c in self._edge_order if keep[p] and keep[c]]
        kept_names = [self._names[i] for i in np.flatnonzero(keep)]
        if classes is None:
            classes = [self._names[i] for i in np.flatnonzero(keep & self._class_mask)]
        return self._derive(edges, kept_names, classes=classes)

    def _derive(self, edges: list[tuple[str, str]], nodes: Sequence[str], **overrides: Any) -> Taxonomy:
        kwargs: dict[str, Any] = {
            "display_names": {n: self._display[self._index[n]] for n in nodes},
            "classes": [n for n in nodes if self._class_mask[self._index[n]]],
            "name": self.name,
            "metadata": self.metadata,
            **overrides,
        }
        vr = self._virtual_root if self._virtual_root in nodes else None
        if vr is not None:  # the core adds the virtual root again, when it still joins several roots
            edges = [e for e in edges if e[0] != vr]
            nodes = [n for n in nodes if n != vr]
            kwargs["classes"] = [c for c in kwargs["classes"] if c != vr]
            kwargs["display_names"].pop(vr, None)
        return Taxonomy(edges, nodes=nodes, virtual_root=vr, **kwargs)

    # ------------------------------------------------------------------ identity
    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the node names in id order, the edges and the classes: equal iff the same taxonomy.

        Display names and metadata are not part of it; node ids, and so every head's output layout, are.
        """
        payload = json.dumps(
            {
                "names": self._names,
                "edges": sorted((p, c) for p, c in self._edge_order),
                "classes": self.classes.tolist(),
                "virtual_root": self._virtual_root,
            },
            separators=(",", ":"),
            ensure_ascii=False,
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Taxonomy) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        kind = "tree" if self.is_tree else "DAG"
        return (
            f"Taxonomy({self.name!r}, {kind}, nodes={self.num_nodes}, leaves={self.num_leaves}, "
            f"height={self.height}, fingerprint={self.fingerprint[:12]})"
        )

    def stats(self) -> dict[str, Any]:
        """Counts that describe the taxonomy (used by ``hiercls taxonomy stats``)."""
        nc = self.num_children[~self.is_leaf]
        sl = self.semantic_level[self._class_mask]
        return {
            "name": self.name,
            "kind": "tree" if self.is_tree else "dag",
            "nodes": self.num_nodes,
            "edges": len(self._edge_order),
            "leaves": self.num_leaves,
            "classes": int(self._class_mask.sum()),
            "height": self.height,
            "nodes_per_depth": [len(lv) for lv in self.levels],
            "semantic_levels": int(sl.max()) + 1 if len(sl) else 0,
            "classes_per_semantic_level": np.bincount(sl).tolist() if len(sl) else [],
            "max_children": int(nc.max()) if len(nc) else 0,
            "mean_children": float(nc.mean()) if len(nc) else 0.0,
            "multi_parent_nodes": int((np.diff(self.parent_ptr) > 1).sum()),
            "virtual_root": self._virtual_root,
            "fingerprint": self.fingerprint,
        }

    def __getstate__(self) -> dict[str, Any]:
        # Cached properties and the derived cache are rebuilt on demand; keep pickles small.
        cached = {k for k, v in vars(Taxonomy).items() if isinstance(v, cached_property)} | {"_derived_cache"}
        return {k: v for k, v in self.__dict__.items() if k not in cached}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


def _at(location: str | None, msg: str, label: str | None = None) -> TaxonomyError:
    """A :class:`TaxonomyError` located at an edge's ``"file:line"`` (when the caller gave one)."""
    source, line = location.rsplit(":", 1) if location and ":" in location else (location, None)
    return TaxonomyError(msg, source=source, line=int(line) if line and line.isdigit() else None, label=label)


def _node_order(
    edges: Sequence[tuple[str, str]], nodes: Iterable[str] | None, locs: Sequence[str | None]
) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Each node's position (``nodes`` order, else first appearance in ``edges``) and each edge's index; refuses
    duplicate nodes, self-loops, duplicate edges and edges naming undeclared nodes."""
    order: dict[str, int] = {}
    for n in map(str, nodes if nodes is not None else ()):
        if n in order:
            raise TaxonomyError(f"duplicate node {n!r}", label=n)
        order[n] = len(order)
    first_edge: dict[tuple[str, str], int] = {}
    for i, (p, c) in enumerate(edges):
        if p == c:
            raise _at(locs[i], f"self-loop on {p!r} (a node cannot be its own parent)", p)
        first = first_edge.setdefault((p, c), i)
        if first != i:
            where = f" (first at {locs[first]})" if locs[first] else ""
            raise _at(locs[i], f"duplicate edge {p!r} -> {c!r}{where}", c)
        for n in (p, c):
            if n not in order and nodes is not None:
                raise _at(locs[i], f"edge {p!r} -> {c!r} names unknown node {n!r}", n)
            order.setdefault(n, len(order))
    if not order:
        raise TaxonomyError("empty taxonomy: no nodes and no edges")
    return order, first_edge


def _join_roots(
    roots: list[str], virtual_root: str | None, by_pos: list[str], kids: list[list[int]], pars: list[list[int]]
) -> str | None:
    """With several roots, add ``virtual_root`` above them (in place) and return it; one root needs none."""
    if len(roots) <= 1:
        return None
    if virtual_root is None:
        shown = ", ".join(repr(r) for r in roots[:10]) + (" ..." if len(roots) > 10 else "")
        raise TaxonomyError(
            f"taxonomy has {len(roots)} roots ({shown}); pass virtual_root='<name>' to join them under a new root"
        )
    if virtual_root in by_pos:
        raise TaxonomyError(f"virtual_root {virtual_root!r} is already a node name", label=virtual_root)
    position = {n: i for i, n in enumerate(by_pos)}
    by_pos.append(virtual_root)
    kids.append([position[r] for r in roots])
    pars.append([])
    for r in roots:
        pars[position[r]].append(len(by_pos) - 1)
    return virtual_root


def _topological_order(kids: list[list[int]], pars: list[list[int]]) -> list[int]:
    """Kahn's algorithm taking the most recently freed node first, siblings in input order: for a tree this is
    exactly the depth-first pre-order (contiguous subtrees). Shorter than the node count when there is a cycle."""
    for k in kids:
        k.sort()
    indeg = [len(ps) for ps in pars]
    stack = [i for i, d in enumerate(indeg) if d == 0]
    topo: list[int] = []
    while stack:
        i = stack.pop()
        topo.append(i)
        for c in reversed(kids[i]):
            indeg[c] -= 1
            if indeg[c] == 0:
                stack.append(c)
    return topo


def _class_mask(index: Mapping[str, int], classes: Iterable[str] | None) -> np.ndarray:
    if classes is None:  # the root is on every label's path, so it carries no information as a class
        return (np.arange(len(index)) > 0) | (len(index) == 1)
    mask = np.zeros(len(index), dtype=bool)
    for c in classes:
        if c not in index:
            raise TaxonomyError(f"class {c!r} is not a node of the taxonomy", label=str(c))
        mask[index[c]] = True
    return mask


def check_taxonomy(taxonomy: Any, name: str = "taxonomy") -> Taxonomy:
    """``taxonomy`` if it is a :class:`Taxonomy`.

    Raises:
        TypeError: naming the type received.
    """
    if not isinstance(taxonomy, Taxonomy):
        raise TypeError(f"{name} must be a hiercls.taxonomy.Taxonomy; got {type(taxonomy).__name__}")
    return taxonomy
