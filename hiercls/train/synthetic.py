"""Synthetic data sets with known structure: hierarchical toy classification and nested 3-D blobs.

* :class:`SyntheticHierarchy` — images (``[3, H, W]``), feature vectors or short texts whose content is a
  sum of per-ancestor prototypes, so that coarse levels are easier than fine ones. Used by tests,
  benchmarks and smoke recipes.
* :class:`NestedBlobs3D` — volumes with nested blobs (an outer blob containing a middle one containing an
  inner one, like the BraTS whole tumour ⊃ tumour core ⊃ enhancing tumour), with raw label maps
  ``0 = background, 1 = outer only, 2 = middle only, 3 = inner`` and a region chain taxonomy.
* :class:`TinySegNet3D` — a small fully convolutional 3-D network producing dense features
  ``[B, C, D, H, W]`` for dense heads.

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

import os
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from hiercls.taxonomy import Taxonomy

__all__ = ["DenseConvClassifier", "NestedBlobs3D", "SyntheticHierarchy", "TinySegNet3D", "nested_blobs_taxonomy"]


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
    """

    def __init__(self, taxonomy: Taxonomy, num_samples: int, *, kind: Literal["image", "features", "text"] = "image",
                 labels: Literal["leaves", "classes"] = "leaves", image_size: int = 16, dim: int = 16,
                 noise: float = 0.5, seed: int = 0) -> None:
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
        # Deeper prototypes are weaker, so that coarse decisions are easier than fine ones.
        scale = 1.0 / (1.0 + taxonomy.depth.astype(np.float32))
        self._protos = (rng.standard_normal((taxonomy.num_nodes, *shape)).astype(np.float32)
                        * scale.reshape(-1, *([1] * len(shape))))
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
        x = self._protos[path].sum(axis=0) + self.noise * rng.standard_normal(self._protos.shape[1:]).astype(np.float32)
        return torch.from_numpy(x.astype(np.float32)), y


def nested_blobs_taxonomy() -> Taxonomy:
    """The region chain of :class:`NestedBlobs3D`: ``volume -> outer -> middle -> inner``."""
    return Taxonomy([("volume", "outer"), ("outer", "middle"), ("middle", "inner")], name="nested_blobs",
                    metadata={"raw_labels": {"outer": [1, 2, 3], "middle": [2, 3], "inner": [3]}})


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


class TinySegNet3D(nn.Module):
    """A small same-resolution 3-D conv net: ``[B, in_channels, D, H, W] -> [B, width, D, H, W]``.

    Two stride-1 conv blocks, a stride-2 block and an upsampling path with a skip connection give a
    receptive field large enough for blobs of a few voxels.

    Example:
        >>> TinySegNet3D(1, 8)(torch.zeros(2, 1, 8, 8, 8)).shape
        torch.Size([2, 8, 8, 8, 8])
    """

    def __init__(self, in_channels: int = 1, width: int = 16) -> None:
        super().__init__()
        if width < 1 or in_channels < 1:
            raise ValueError(f"in_channels and width must be >= 1, got {in_channels}, {width}")
        self.num_features = width

        def block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
            return nn.Sequential(nn.Conv3d(cin, cout, 3, stride=stride, padding=1), nn.GroupNorm(1, cout), nn.GELU())

        self.stem = nn.Sequential(block(in_channels, width), block(width, width))
        self.down = nn.Sequential(block(width, 2 * width, stride=2), block(2 * width, 2 * width))
        self.up = nn.ConvTranspose3d(2 * width, width, 2, stride=2)
        self.fuse = block(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = self.stem(x)
        deep = self.up(self.down(skip))
        # Odd sizes: the transposed conv can come out one voxel short or long; match the skip.
        deep = nn.functional.interpolate(deep, size=skip.shape[2:]) if deep.shape[2:] != skip.shape[2:] else deep
        return self.fuse(torch.cat([skip, deep], dim=1))


class DenseConvClassifier(nn.Module):
    """:class:`TinySegNet3D` + a dense hierarchical head: per-voxel node probabilities ``[B, N, D, H, W]``.

    It follows the model contract of the training loop (``forward``, ``loss``, ``node_probs``, ``collate``,
    ``save_pretrained`` / ``from_pretrained``); targets are per-voxel node ids ``[B, D, H, W]`` (the innermost
    region of each voxel, ``0`` = the root = background).

    Args:
        taxonomy: the region hierarchy (for nested regions a chain).
        head: a head name whose class supports dense features (``nested_sigmoid``...).
        head_options: options of the head.
        width: feature channels of the backbone.
        in_channels: input channels of the volumes.
    """

    def __init__(self, taxonomy: Taxonomy, *, head: str = "nested_sigmoid", head_options: dict | None = None,
                 width: int = 16, in_channels: int = 1) -> None:
        super().__init__()
        from hiercls.heads import create_head, get_head_class

        if not getattr(get_head_class(head), "supports_dense", False):
            raise ValueError(f"model.head: head {head!r} does not support dense (per-voxel) features; the conv3d "
                             "backbone needs a dense head such as 'nested_sigmoid'")
        self.taxonomy, self.head_name = taxonomy, head
        self.head_options = dict(head_options or {})
        self.width, self.in_channels = int(width), int(in_channels)
        self.backbone = TinySegNet3D(in_channels, width)
        self.head = create_head(head, taxonomy, width, **self.head_options)

    @classmethod
    def from_spec(cls, spec: str, taxonomy: Taxonomy, *, head: str, head_options: dict | None = None,
                  **options: int) -> DenseConvClassifier:
        """Build from ``"conv3d"`` or ``"conv3d:<width>"`` (``in_channels`` via options)."""
        _, _, width = spec.partition(":")
        if width and not width.isdigit():
            raise ValueError(f"model.backbone: expected 'conv3d' or 'conv3d:<width>', got {spec!r}")
        unknown = set(options) - {"in_channels"}
        if unknown:
            raise ValueError(f"model.backbone_options: unknown option(s) {sorted(unknown)} for conv3d; valid: "
                             "in_channels")
        return cls(taxonomy, head=head, head_options=head_options, width=int(width or 16), **options)

    def forward(self, volumes: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        return self.head(self.backbone(volumes))

    def loss(self, output: torch.Tensor | dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        return self.head.loss(output, targets)

    def node_probs(self, output: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        return self.head.node_probs(output)

    @staticmethod
    def collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack volumes ``[B, C, D, H, W]`` and label maps ``[B, D, H, W]``."""
        return torch.stack([v for v, _ in batch]), torch.stack([torch.as_tensor(t) for _, t in batch])

    def save_pretrained(self, directory: str | os.PathLike[str]) -> None:
        """Write ``model.safetensors``, ``config.json`` and ``taxonomy.json.gz`` into ``directory``."""
        import json

        from safetensors.torch import save_model

        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_model(self, str(d / "model.safetensors"))
        config = {"format": "hiercls.model", "model_class": "hiercls.train.synthetic.DenseConvClassifier",
                  "backbone": f"conv3d:{self.width}", "in_channels": self.in_channels, "head": self.head_name,
                  "head_options": self.head_options, "taxonomy_name": self.taxonomy.name,
                  "taxonomy_fingerprint": self.taxonomy.fingerprint}
        (d / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        from hiercls.taxonomy.io import write_json

        write_json(self.taxonomy, d / "taxonomy.json.gz")

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike[str], taxonomy: Taxonomy | None = None
                        ) -> DenseConvClassifier:
        """Load a model written by :meth:`save_pretrained` (refusing a taxonomy with another fingerprint)."""
        import json

        from safetensors.torch import load_model

        from hiercls.taxonomy import TaxonomyError
        from hiercls.taxonomy.io import read_json

        d = Path(directory)
        config = json.loads((d / "config.json").read_text(encoding="utf-8"))
        saved = read_json(d / "taxonomy.json.gz")
        if taxonomy is not None and taxonomy.fingerprint != config["taxonomy_fingerprint"]:
            raise TaxonomyError(f"model in {str(d)!r} was trained on taxonomy {config['taxonomy_name']!r} "
                                f"({config['taxonomy_fingerprint']}), not {taxonomy.name!r} ({taxonomy.fingerprint})")
        model = cls.from_spec(config["backbone"], taxonomy or saved, head=config["head"],
                              head_options=config["head_options"], in_channels=config["in_channels"])
        load_model(model, str(d / "model.safetensors"))
        return model
