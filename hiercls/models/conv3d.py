"""``conv3d:<width>``: a small fully convolutional 3-D network for per-voxel (dense) heads.

Example:
    >>> net = TinySegNet3D.create("8")
    >>> net(torch.zeros(2, 1, 8, 8, 8)).shape
    torch.Size([2, 8, 8, 8, 8])
    >>> net.spec()["backbone"]
    'conv3d:8'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn

from hiercls.models.weights import load_by_name, read_state_dict

__all__ = ["TinySegNet3D"]

DEFAULT_WIDTH = 16


def _block(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv3d(cin, cout, 3, stride=stride, padding=1), nn.GroupNorm(1, cout), nn.GELU())


class TinySegNet3D(nn.Module):
    """A small same-resolution 3-D conv net: ``[B, in_channels, D, H, W] -> [B, width, D, H, W]``.

    Two stride-1 conv blocks, a stride-2 block and an upsampling path with a skip connection give a
    receptive field large enough for blobs of a few voxels. Its output is always a feature map, so a
    :class:`~hiercls.models.HierarchicalClassifier` on it feeds a dense head (``nested_sigmoid``...).

    Args:
        in_channels: channels of the input volumes.
        width: feature channels (``num_features``).

    Example:
        >>> TinySegNet3D(1, 8)(torch.zeros(2, 1, 8, 8, 8)).shape
        torch.Size([2, 8, 8, 8, 8])
    """

    kind: ClassVar[str] = "conv3d"
    modality: ClassVar[str] = "volume"
    needs_name: ClassVar[bool] = False
    supports_dense: ClassVar[bool] = True
    always_dense: ClassVar[bool] = True

    def __init__(self, in_channels: int = 1, width: int = DEFAULT_WIDTH) -> None:
        super().__init__()
        if isinstance(width, bool) or not isinstance(width, int) or width < 1:
            raise ValueError(f"conv3d width must be an integer >= 1; got {width!r}")
        if isinstance(in_channels, bool) or not isinstance(in_channels, int) or in_channels < 1:
            raise ValueError(f"conv3d in_channels must be an integer >= 1; got {in_channels!r}")
        self.in_channels, self.width = in_channels, width
        self.num_features = width
        self.weights_source: str | None = None
        self.stem = nn.Sequential(_block(in_channels, width), _block(width, width))
        self.down = nn.Sequential(_block(width, 2 * width, stride=2), _block(2 * width, 2 * width))
        self.up = nn.ConvTranspose3d(2 * width, width, 2, stride=2)
        self.fuse = _block(2 * width, width)

    @classmethod
    def create(cls, name: str, *, weights: str | os.PathLike[str] | None = None, **options: Any) -> TinySegNet3D:
        """Build from the spec name: ``""`` (width 16) or ``"<width>"``; options: ``in_channels``.

        ``weights`` may be a state-dict file of this network (loaded by name, shapes checked).

        Raises:
            ValueError: a width that is not a positive integer, an unknown option, ``weights="package"``.
        """
        if name and not name.isdigit():
            raise ValueError(f"backbone 'conv3d:{name}': expected 'conv3d' or 'conv3d:<width>' (a positive integer)")
        unknown = sorted(set(options) - {"in_channels"})
        if unknown:
            raise ValueError(f"conv3d backbone: unknown option(s) {', '.join(map(repr, unknown))}; valid: in_channels")
        net = cls(int(options.get("in_channels", 1)), int(name) if name else DEFAULT_WIDTH)
        if weights is not None:
            if isinstance(weights, str) and weights == "package":
                raise ValueError(
                    "weights='package': no offline weight package exists for the conv3d backbone; "
                    "give a .safetensors / .pth state dict or None"
                )
            load_by_name(net, read_state_dict(weights), source=str(weights))
            net.weights_source = str(weights)
        return net

    def forward(self, volumes: torch.Tensor) -> torch.Tensor:
        if not isinstance(volumes, torch.Tensor) or volumes.dim() != 5 or volumes.shape[1] != self.in_channels:
            got = tuple(volumes.shape) if isinstance(volumes, torch.Tensor) else type(volumes).__name__
            raise ValueError(f"conv3d backbone: volumes must be [B, {self.in_channels}, D, H, W]; got {got}")
        skip = self.stem(volumes)
        deep = self.up(self.down(skip))
        # Odd sizes: the transposed conv can come out one voxel short or long; match the skip.
        deep = nn.functional.interpolate(deep, size=skip.shape[2:]) if deep.shape[2:] != skip.shape[2:] else deep
        return self.fuse(torch.cat([skip, deep], dim=1))

    forward_dense = forward

    def spec(self) -> dict[str, Any]:
        """What :meth:`rebuild` needs (saved in ``config.json``)."""
        return {
            "backbone": f"conv3d:{self.width}",
            "backbone_kwargs": {"in_channels": self.in_channels},
            "weights_source": self.weights_source,
        }

    @classmethod
    def rebuild(cls, spec: Mapping[str, Any], directory: Path | None = None) -> TinySegNet3D:
        """The saved architecture with random weights (``from_pretrained`` then loads the saved ones).

        Also reads the config of the former ``hiercls.train.synthetic.DenseConvClassifier`` (``in_channels`` at
        the top level), whose weights have the same names.
        """
        kwargs = dict(spec.get("backbone_kwargs") or {"in_channels": spec.get("in_channels", 1)})
        net = cls.create(str(spec["backbone"]).partition(":")[2], **kwargs)
        net.weights_source = spec.get("weights_source")
        return net
