"""Nested segmentation regions (BraTS: whole tumour ⊃ tumour core ⊃ enhancing tumour) as a chain taxonomy.

BraTS annotates each voxel with a raw label: up to 2021 ``1`` = necrotic / non-enhancing tumour core,
``2`` = peritumoral edema, ``4`` = enhancing tumour (BraTS 2023 and later use ``3`` for enhancing tumour).
Models are trained and scored on nested regions: WT = {1, 2, 4} ⊃ TC = {1, 4} ⊃ ET = {4}. A
:class:`NestedRegions` converts label volumes to region masks and back; its :attr:`~NestedRegions.taxonomy`
is the chain ``root -> WT -> TC -> ET`` whose node id for a voxel is the number of regions containing it.

Example:
    >>> import numpy as np
    >>> spec = brats_regions()
    >>> vol = np.array([[0, 1], [2, 4]])
    >>> masks = spec.labels_to_regions(vol, spatial_dims=2)
    >>> masks.shape, masks[:, 1, 1].tolist()
    ((3, 2, 2), [True, True, True])
    >>> spec.regions_to_labels(masks, spatial_dims=2).tolist()
    [[0, 1], [2, 4]]
    >>> spec.taxonomy.names
    ('root', 'WT', 'TC', 'ET')
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from hiercls.taxonomy.core import Taxonomy, TaxonomyError

__all__ = ["NestedRegions", "brats_regions", "nested_regions"]

_BRATS_LONG_NAMES = {"WT": "whole tumour", "TC": "tumour core", "ET": "enhancing tumour"}


def _is_torch(x: Any) -> bool:
    # Tensors are handled through their own methods: the taxonomy package does not import torch.
    return type(x).__module__.startswith("torch")


def _is_bool(x: Any) -> bool:
    return str(x.dtype) in ("torch.bool", "bool")


def _take(table: np.ndarray, index: Any) -> Any:
    """``table[index]`` for an integer array or tensor (a tensor's result on its device)."""
    if not _is_torch(index):
        return table[index]
    values = index.new_tensor(table)
    return (values.bool() if table.dtype == bool else values.long())[index.long()]


@dataclass(frozen=True)
class NestedRegions:
    """Regions that nest (outermost first), each a set of raw labels.

    Args:
        names: region names, outer to inner (e.g. ``("WT", "TC", "ET")``).
        label_sets: the raw labels of each region; each set must strictly contain the next one.
        background: the label outside every region.
        label_mapping: raw label -> label of ``label_sets``, applied first (e.g. ``{3: 4}`` to read BraTS 2023
            volumes with the 2021 sets). Labels not in the mapping are used as they are.
        display_names: optional long name per region.
        name: the taxonomy's name.

    Raises:
        ValueError: the sets do not nest strictly, names repeat, or the background is inside a region.
    """

    names: tuple[str, ...]
    label_sets: tuple[frozenset[int], ...]
    background: int = 0
    label_mapping: Mapping[int, int] = field(default_factory=dict)
    display_names: tuple[str, ...] | None = None
    name: str = "regions"

    def __post_init__(self) -> None:
        object.__setattr__(self, "names", tuple(str(n) for n in self.names))
        object.__setattr__(self, "label_sets", tuple(frozenset(int(v) for v in s) for s in self.label_sets))
        object.__setattr__(self, "label_mapping", {int(k): int(v) for k, v in dict(self.label_mapping).items()})
        if not self.names or len(self.names) != len(self.label_sets):
            raise ValueError(
                f"names ({len(self.names)}) and label_sets ({len(self.label_sets)}) must have the same, non-zero length"
            )
        if len(set(self.names)) != len(self.names) or "root" in self.names:
            raise ValueError(f"region names must be unique and not 'root'; got {self.names}")
        for outer, inner, no, ni in zip(self.label_sets, self.label_sets[1:], self.names, self.names[1:], strict=False):
            if not inner < outer:
                raise ValueError(f"region {ni!r} {sorted(inner)} must be a strict subset of {no!r} {sorted(outer)}")
        if not self.label_sets[-1]:
            raise ValueError(f"innermost region {self.names[-1]!r} has no labels")
        if self.background in self.label_sets[0]:
            raise ValueError(f"background label {self.background} is inside region {self.names[0]!r}")
        if any(v < 0 for v in self.label_sets[0]) or self.background < 0:
            raise ValueError("labels must be non-negative integers")
        if self.display_names is not None and len(self.display_names) != len(self.names):
            raise ValueError(f"display_names needs {len(self.names)} entries, got {len(self.display_names)}")

    @property
    def num_regions(self) -> int:
        return len(self.names)

    @cached_property
    def ring_labels(self) -> tuple[frozenset[int], ...]:
        """The labels of each region that are in no inner region (BraTS: {2}, {1}, {4})."""
        sets = (*self.label_sets, frozenset())
        return tuple(sets[k] - sets[k + 1] for k in range(self.num_regions))

    @cached_property
    def output_labels(self) -> tuple[int, ...]:
        """The label :meth:`regions_to_labels` writes for voxels whose innermost region is each region.

        The smallest label of the ring, written back in the raw convention: when ``label_mapping`` sends
        raw labels to it, the smallest such raw label (BraTS 2023 via ``{3: 4}`` writes ``3``).
        """
        inverse: dict[int, int] = {}
        for raw, canon in sorted(self.label_mapping.items()):
            inverse.setdefault(canon, raw)
        return tuple(inverse.get(min(r), min(r)) for r in self.ring_labels)

    @cached_property
    def taxonomy(self) -> Taxonomy:
        """The chain ``root -> outer -> ... -> inner``; every node is a class (a voxel may be background = root)."""
        chain = ["root", *self.names]
        disp = dict(zip(self.names, self.display_names, strict=True)) if self.display_names else {}
        disp["root"] = "background"
        return Taxonomy(
            list(itertools.pairwise(chain)),
            nodes=chain,
            display_names=disp,
            classes=chain,
            name=self.name,
            metadata={
                "kind": "nested_regions",
                "regions": list(self.names),
                "label_sets": [sorted(s) for s in self.label_sets],
                "background": self.background,
            },
        )

    # ------------------------------------------------------------------ lookup tables
    def _member_table(self, max_label: int) -> np.ndarray:
        """``T[v, r]`` = raw label ``v`` is in region ``r``; plus a last column "known label"."""
        size = max(max_label, self.background, *self.label_sets[0], *self.label_mapping) + 1
        t = np.zeros((size, self.num_regions + 1), dtype=bool)
        for v in range(size):
            canon = self.label_mapping.get(v, v)
            for r, s in enumerate(self.label_sets):
                t[v, r] = canon in s
            t[v, -1] = canon == self.background or t[v, :-1].any()
        return t

    def _check_labels(self, label_map: Any) -> int:
        """Max label of ``label_map``; raises listing the labels that are neither background nor in a region."""
        if _is_torch(label_map):
            if label_map.dtype.is_floating_point or _is_bool(label_map) or label_map.is_complex():
                raise TypeError(f"label_map must be an integer tensor, got {label_map.dtype}")
            if label_map.numel() == 0:
                return 0
            lo, hi = int(label_map.min()), int(label_map.max())
        else:
            if not np.issubdtype(label_map.dtype, np.integer):
                raise TypeError(f"label_map must be an integer array, got {label_map.dtype}")
            if label_map.size == 0:
                return 0
            lo, hi = int(label_map.min()), int(label_map.max())
        known_max = max(self.background, *self.label_sets[0], *self.label_mapping)
        if lo < 0 or hi > known_max:
            values = label_map.unique().cpu().numpy() if _is_torch(label_map) else np.unique(label_map)
            table = self._member_table(0)
            bad = [int(v) for v in values if v < 0 or v >= len(table) or not table[v, -1]]
        else:
            table = self._member_table(hi)
            if _is_torch(label_map):
                present = label_map.reshape(-1).long().bincount(minlength=hi + 1).cpu().numpy() > 0
            else:
                present = np.bincount(label_map.reshape(-1).astype(np.int64, copy=False), minlength=hi + 1) > 0
            bad = [int(v) for v in np.flatnonzero(present & ~table[: hi + 1, -1])]
        if bad:
            known = sorted({self.background, *self.label_sets[0], *self.label_mapping})
            raise TaxonomyError(
                f"unknown labels {bad[:20]}{' ...' if len(bad) > 20 else ''} in label_map for "
                f"{self.name!r} (known: {known}; pass label_mapping= to map other labels)",
                label=str(bad[0]),
            )
        return hi

    @staticmethod
    def _region_axis(ndim_out: int, spatial_dims: int, channel_last: bool) -> int:
        return ndim_out - 1 if channel_last else ndim_out - 1 - spatial_dims

    # ------------------------------------------------------------------ conversions
    def labels_to_regions(
        self, label_map: Any, *, spatial_dims: int = 3, channel_last: bool = False, dtype: Any = None
    ) -> Any:
        """Region masks ``[..., R, *spatial]`` (or ``[..., *spatial, R]``) from an integer label volume.

        Args:
            label_map: numpy array or torch tensor of raw labels, ``[..., *spatial]``.
            spatial_dims: how many trailing axes are spatial (3 for volumes, 2 for slices).
            channel_last: put the region axis last instead of before the spatial axes.
            dtype: output dtype (default ``bool``; e.g. ``torch.float32`` for a loss).

        Raises:
            TaxonomyError: labels that are neither background nor in a region (listed).
            ValueError: ``label_map`` has fewer than ``spatial_dims`` axes.
        """
        if label_map.ndim < spatial_dims:
            raise ValueError(f"label_map has {label_map.ndim} axes, fewer than spatial_dims={spatial_dims}")
        hi = self._check_labels(label_map)
        table = self._member_table(hi)[:, :-1]
        out = _take(table, label_map)  # [..., *spatial, R]
        if _is_torch(label_map):
            if not channel_last:
                out = out.movedim(-1, self._region_axis(out.ndim, spatial_dims, False))
            return out if dtype is None else out.to(dtype)
        if not channel_last:
            out = np.moveaxis(out, -1, self._region_axis(out.ndim, spatial_dims, False))
        return out if dtype is None else out.astype(dtype)

    def _binarise(self, masks_or_probs: Any, threshold: float, spatial_dims: int, channel_last: bool) -> Any:
        """Boolean masks with the region axis last, made nested (a region only where all outer ones are)."""
        if masks_or_probs.ndim < spatial_dims + 1:
            raise ValueError(
                f"expected [..., R, *spatial] with spatial_dims={spatial_dims}; got {masks_or_probs.ndim} axes"
            )
        torch_in = _is_torch(masks_or_probs)
        axis = self._region_axis(masks_or_probs.ndim, spatial_dims, channel_last)
        if masks_or_probs.shape[axis] != self.num_regions:
            raise ValueError(
                f"axis {axis} has size {masks_or_probs.shape[axis]}, expected {self.num_regions} regions "
                f"{self.names} (check spatial_dims / channel_last)"
            )
        if torch_in:
            m = masks_or_probs.movedim(axis, -1)
            m = m if _is_bool(m) else m > threshold
            return m.byte().cummin(dim=-1).values.bool()
        m = np.moveaxis(np.asarray(masks_or_probs), axis, -1)
        m = m if m.dtype == bool else m > threshold
        return np.logical_and.accumulate(m, axis=-1)

    def regions_to_nodes(
        self, masks_or_probs: Any, *, threshold: float = 0.5, spatial_dims: int = 3, channel_last: bool = False
    ) -> Any:
        """Node ids of :attr:`taxonomy`, ``[..., *spatial]``: ``0`` background, ``k`` inside the first ``k`` regions.

        An inner region predicted outside its outer region is ignored there (nested by construction).
        """
        m = self._binarise(masks_or_probs, threshold, spatial_dims, channel_last)
        return m.sum(-1) if _is_torch(m) else m.sum(-1).astype(np.int64)

    def regions_to_labels(
        self, masks_or_probs: Any, *, threshold: float = 0.5, spatial_dims: int = 3, channel_last: bool = False
    ) -> Any:
        """Raw label volume ``[..., *spatial]`` from region masks or probabilities ``[..., R, *spatial]``.

        Probabilities are thresholded (``> threshold``); booleans are used as they are. A voxel gets the
        :attr:`output_labels` entry of its innermost region (nesting is enforced from the outside in), or
        the background. Inverts :meth:`labels_to_regions` exactly when every ring holds one label.
        """
        nodes = self.regions_to_nodes(
            masks_or_probs, threshold=threshold, spatial_dims=spatial_dims, channel_last=channel_last
        )
        lut = np.array([self.background, *self.output_labels], dtype=np.int64)
        return _take(lut, nodes)

    def labels_to_nodes(self, label_map: Any) -> Any:
        """Node ids of :attr:`taxonomy` for a raw label volume (number of regions containing each voxel)."""
        hi = self._check_labels(label_map)
        depth = self._member_table(hi)[:, :-1].sum(1).astype(np.int64)
        return _take(depth, label_map)


def brats_regions(version: str | int = "2021", *, label_mapping: Mapping[int, int] | None = None) -> NestedRegions:
    """The BraTS regions WT ⊃ TC ⊃ ET.

    Args:
        version: ``"2021"`` (and earlier, from 2017: enhancing tumour = label ``4``) or ``"2023"``/``"2024"``
            (enhancing tumour = label ``3``).
        label_mapping: raw -> canonical labels applied first, e.g. ``{3: 4}`` to read 2023 volumes with the
            2021 label sets.

    Example:
        >>> [sorted(s) for s in brats_regions().label_sets]
        [[1, 2, 4], [1, 4], [4]]
        >>> [sorted(s) for s in brats_regions("2023").label_sets]
        [[1, 2, 3], [1, 3], [3]]
    """
    v = str(version)
    if v in ("2017", "2018", "2019", "2020", "2021", "legacy"):
        et = 4
    elif v in ("2023", "2024", "2025"):
        et = 3
    else:
        raise ValueError(
            f"version must be a BraTS year 2017-2021 (enhancing tumour = 4) or 2023-2025 "
            f"(enhancing tumour = 3); got {version!r}"
        )
    return NestedRegions(
        names=("WT", "TC", "ET"),
        label_sets=(frozenset({1, 2, et}), frozenset({1, et}), frozenset({et})),
        background=0,
        label_mapping=dict(label_mapping or {}),
        display_names=tuple(_BRATS_LONG_NAMES.values()),
        name=f"brats{v}" if v != "2021" else "brats",
    )


def _as_sets(label_sets: Iterable[Iterable[int]]) -> tuple[frozenset[int], ...]:
    return tuple(frozenset(s) for s in label_sets)


def nested_regions(names: Sequence[str], label_sets: Iterable[Iterable[int]], **kwargs: Any) -> NestedRegions:
    """Shorthand for :class:`NestedRegions` with plain iterables."""
    return NestedRegions(names=tuple(names), label_sets=_as_sets(label_sets), **kwargs)
