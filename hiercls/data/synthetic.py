"""Synthetic data sets with known structure: hierarchical toy classification and nested 3-D blobs.

The network for the volumes (``conv3d:<width>``) is :class:`hiercls.models.TinySegNet3D`.

* :class:`SyntheticHierarchy` — images (``[3, H, W]``), feature vectors or short texts whose content is a
  sum of per-ancestor prototypes, so that coarse levels are easier than fine ones. Used by tests,
  benchmarks and smoke recipes.
* :class:`NestedBlobs3D` — volumes with nested blobs (an outer blob containing a middle one containing an
  inner one, like the BraTS whole tumour ⊃ tumour core ⊃ enhancing tumour), with raw label maps
  ``0 = background, 1 = outer only, 2 = middle only, 3 = inner`` and a region chain taxonomy.

Example:
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("root", "a"), ("root", "b"), ("a", "a1"), ("a", "a2")])
    >>> ds = SyntheticHierarchy(tax, 8, kind="features", dim=4)
    >>> x, y = ds[0]
    >>> x.shape, bool(tax.is_leaf[y])
    (torch.Size([4]), True)
    >>> vol, labels = NestedBlobs3D(2, size=12)[0]
    >>> vol.shape, labels.shape, sorted(set(labels.unique().tolist())) <= [0, 1, 2, 3]
    (torch.Size([1, 12, 12, 12]), torch.Size([12, 12, 12]), True)
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch

from hiercls.taxonomy import Taxonomy

__all__ = ["NestedBlobs3D", "SyntheticHierarchy", "nested_blobs_taxonomy"]


class SyntheticHierarchy(torch.utils.data.Dataset):
    """Toy hierarchical classification: input = Σ over the label's path of a node prototype + noise.

    Args:
        taxonomy: the hierarchy (a tree or DAG; the primary parent path is used).
        num_samples: data set length.
        kind: ``"image"`` (``[3, image_size, image_size]``), ``"features"`` (``[dim]``) or ``"text"``
            (a string of words naming the path's nodes, shuffled with noise words).
        labels: ``"leaves"`` (labels are leaves) or ``"classes"`` (any class node, internal ones included).
        image_size: side of the images.
        dim: feature dimension.
        noise: standard deviation of the added noise (larger: harder).
        seed: fixes the prototypes, labels and noise (the data set is deterministic).
        prototypes: the :attr:`prototypes` of another instance (same taxonomy and kind), so that splits
            drawn with different seeds share one task; ``None`` draws them from ``seed``.

    Attributes:
        prototypes: ``[N, *input_shape]`` float32, the per-node prototypes (deeper nodes weaker).
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        num_samples: int,
        *,
        kind: Literal["image", "features", "text"] = "image",
        labels: Literal["leaves", "classes"] = "leaves",
        image_size: int = 16,
        dim: int = 16,
        noise: float = 0.5,
        seed: int = 0,
        prototypes: np.ndarray | None = None,
    ) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if kind not in ("image", "features", "text"):
            raise ValueError(f"kind must be 'image', 'features' or 'text', got {kind!r}")
        if labels not in ("leaves", "classes"):
            raise ValueError(f"labels must be 'leaves' or 'classes', got {labels!r}")
        self.taxonomy, self.kind, self.num_samples = taxonomy, kind, int(num_samples)
        self.image_size, self.dim, self.noise, self.seed = int(image_size), int(dim), float(noise), int(seed)
        rng = np.random.default_rng(seed)
        pool = taxonomy.leaves if labels == "leaves" else taxonomy.classes
        self.targets = rng.choice(np.asarray(pool), size=self.num_samples).astype(np.int64)
        shape = (3, self.image_size, self.image_size) if kind == "image" else (self.dim,)
        if prototypes is not None:
            if tuple(np.shape(prototypes)) != (taxonomy.num_nodes, *shape):
                raise ValueError(
                    f"prototypes must have shape {(taxonomy.num_nodes, *shape)} (nodes x input); got "
                    f"{tuple(np.shape(prototypes))}"
                )
            self.prototypes = np.asarray(prototypes, dtype=np.float32)
        else:
            # Deeper prototypes are weaker, so that coarse decisions are easier than fine ones.
            scale = 1.0 / (1.0 + taxonomy.depth.astype(np.float32))
            self.prototypes = rng.standard_normal((taxonomy.num_nodes, *shape)).astype(np.float32) * scale.reshape(
                -1, *([1] * len(shape))
            )
        self._paths = [self._path(int(t)) for t in range(taxonomy.num_nodes)]

    def _path(self, node: int) -> list[int]:
        parent = self.taxonomy.primary_parent
        out = [node]
        while out[-1] != 0:
            out.append(int(parent[out[-1]]))
        return out[::-1]

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor | str, int]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"index {i} out of range for {self.num_samples} samples")
        y = int(self.targets[i])
        rng = np.random.default_rng((self.seed, i))
        path = self._paths[y]
        if self.kind == "text":
            words = [f"node{n}" for n in path[1:]] + [f"noise{int(k)}" for k in rng.integers(0, 50, size=3)]
            rng.shuffle(words)
            return " ".join(words), y
        noise = rng.standard_normal(self.prototypes.shape[1:]).astype(np.float32)
        x = self.prototypes[path].sum(axis=0) + self.noise * noise
        return torch.from_numpy(x.astype(np.float32)), y


def nested_blobs_taxonomy() -> Taxonomy:
    """The region chain of :class:`NestedBlobs3D`: ``volume -> outer -> middle -> inner``."""
    return Taxonomy(
        [("volume", "outer"), ("outer", "middle"), ("middle", "inner")],
        name="nested_blobs",
        metadata={"raw_labels": {"outer": [1, 2, 3], "middle": [2, 3], "inner": [3]}},
    )


class NestedBlobs3D(torch.utils.data.Dataset):
    """Synthetic 3-D volumes with nested ellipsoidal blobs (outer ⊃ middle ⊃ inner).

    Each volume ``[1, size, size, size]`` has background noise; inside the outer blob the intensity is
    raised, the middle blob has a textured (checkerboard-modulated) intensity, the inner blob is brightest.
    The label map ``[size, size, size]`` (int64) holds the innermost region: ``0`` background,
    ``1`` outer only, ``2`` middle (not inner), ``3`` inner. The regions are nested by construction.

    Args:
        num_samples: number of volumes.
        size: side length of the cubic volumes.
        noise: standard deviation of the Gaussian noise.
        seed: fixes every volume (the data set is deterministic).
    """

    def __init__(self, num_samples: int, *, size: int = 16, noise: float = 0.3, seed: int = 0) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        if size < 8:
            raise ValueError(f"size must be >= 8 voxels, got {size}")
        self.num_samples, self.size, self.noise, self.seed = int(num_samples), int(size), float(noise), int(seed)
        self.taxonomy = nested_blobs_taxonomy()

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"index {i} out of range for {self.num_samples} samples")
        rng = np.random.default_rng((self.seed, i))
        s = self.size
        grid = np.stack(np.meshgrid(*[np.arange(s, dtype=np.float32)] * 3, indexing="ij"))
        centre = rng.uniform(0.35 * s, 0.65 * s, size=3).astype(np.float32)
        radii = rng.uniform(0.22 * s, 0.32 * s, size=3).astype(np.float32)
        labels = np.zeros((s, s, s), dtype=np.int64)
        for level, shrink in ((1, 1.0), (2, rng.uniform(0.5, 0.7)), (3, rng.uniform(0.2, 0.4))):
            # Inner blobs move off-centre but stay inside the enclosing one (shrink < 1, shift < margin).
            shift = (rng.uniform(-0.15, 0.15, size=3) * radii * (1 - shrink)).astype(np.float32)
            r = (radii * shrink).reshape(3, 1, 1, 1)
            c = (centre + shift).reshape(3, 1, 1, 1)
            inside = (((grid - c) / r) ** 2).sum(axis=0) <= 1.0
            labels[inside & (labels == level - 1)] = level
        checker = ((grid.astype(np.int64).sum(axis=0) % 2) * 2 - 1).astype(np.float32)
        intensity = np.select([labels == 3, labels == 2, labels == 1], [2.0, 1.0 + 0.5 * checker, 0.8], 0.0)
        vol = intensity + self.noise * rng.standard_normal((s, s, s))
        return torch.from_numpy(vol.astype(np.float32)).unsqueeze(0), torch.from_numpy(labels)
