"""The model contract: what the training loop, evaluation, prediction and the CLI need from a model.

:class:`HierarchicalModel` is the whole interface between a network and the rest of hiercls; every model that
:func:`hiercls.models.create_model` builds (any backbone, any head, prompting heads included) satisfies it,
and so may a model written elsewhere. :class:`Backbone` is what a class registered in
:data:`hiercls.models.BACKBONES` provides.

Data flow of one batch::

    inputs, targets = model.collate([(input, target), ...])   # dataset items -> a batch
    output = model(inputs)                                     # forward: opaque to the caller
    loss = model.loss(output, targets)                         # training
    probs = model.node_probs(output)                           # [B, N] (dense: [B, N, *spatial]), root = 1

Targets are node ids ``[B]`` (``-1`` = ignore), multi-hot ``[B, N]`` node sets, or per-voxel node ids
``[B, *spatial]`` for dense models. ``node_probs`` are float32 with parents at least as likely as their
children. ``save_pretrained(dir)`` writes a self-contained folder (weights in ``model.safetensors``,
``config.json`` with the backbone and head identity and the taxonomy fingerprint, the taxonomy itself);
``from_pretrained(dir)`` rebuilds the model from it and refuses a taxonomy with another fingerprint.

Example:
    >>> from hiercls.models import create_model
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("volume", "outer"), ("outer", "inner")])
    >>> model = create_model("conv3d:4", tax, head="nested_sigmoid")
    >>> isinstance(model, HierarchicalModel), isinstance(model.backbone, Backbone)
    (True, True)
    >>> isinstance(torch.nn.Linear(2, 2), HierarchicalModel)
    False
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from hiercls.taxonomy import Taxonomy

__all__ = ["Backbone", "HierarchicalModel"]


@runtime_checkable
class HierarchicalModel(Protocol):
    """A network over one taxonomy that hiercls can train, evaluate, save and load.

    ``isinstance(obj, HierarchicalModel)`` checks that every member below exists (not their signatures).

    Attributes:
        taxonomy: the taxonomy whose node ids index every target and every output column.
        modality: what ``collate`` takes: ``"image"`` (tensors ``[C, H, W]``, see ``transform``), ``"text"``
            (strings, tokenised in ``collate``) or ``"volume"`` (tensors ``[C, D, H, W]``).
    """

    taxonomy: Taxonomy
    modality: str

    def forward(self, inputs: Any) -> Any:
        """The head's output for a batch from :meth:`collate` (opaque: pass it to ``loss`` / ``node_probs``)."""
        ...

    def loss(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """The scalar training loss of ``output`` against ``targets`` (node ids, ``-1`` = ignore)."""
        ...

    def node_probs(self, output: Any) -> torch.Tensor:
        """Node probabilities ``[B, N]`` (dense: ``[B, N, *spatial]``), float32, root = 1, parent >= child."""
        ...

    def collate(self, batch: Sequence[tuple[Any, Any]]) -> tuple[Any, torch.Tensor]:
        """``(inputs, targets)`` for a list of dataset items ``(input, target)``."""
        ...

    def save_pretrained(self, directory: str | os.PathLike[str]) -> Path:
        """Write the self-contained model folder; returns its path."""
        ...

    @classmethod
    def from_pretrained(
        cls,
        directory: str | os.PathLike[str],
        taxonomy: Taxonomy | None = None,
        *,
        map_location: str | torch.device = "cpu",
    ) -> HierarchicalModel:
        """Rebuild a model from :meth:`save_pretrained`'s folder (``taxonomy``: refused unless the same)."""
        ...


@runtime_checkable
class Backbone(Protocol):
    """A feature extractor registered in :data:`hiercls.models.BACKBONES` under its ``kind``.

    Attributes:
        kind: the spec prefix (``"timm"``, ``"hf"``, ``"conv3d"``).
        modality: the inputs it takes (see :class:`HierarchicalModel`).
        needs_name: whether a spec must name a model after the colon (``conv3d`` alone is valid).
        supports_dense: whether ``forward_dense`` gives feature maps ``[B, D, *spatial]`` for dense heads.
        always_dense: whether ``forward`` itself gives feature maps (the model is then always dense).
        num_features: ``D``, the feature size the head is built on.
    """

    kind: ClassVar[str]
    modality: ClassVar[str]
    needs_name: ClassVar[bool]
    supports_dense: ClassVar[bool]
    always_dense: ClassVar[bool]
    num_features: int

    def forward(self, inputs: Any) -> torch.Tensor:
        """Features ``[B, D]`` (``always_dense``: ``[B, D, *spatial]``)."""
        ...

    @classmethod
    def create(cls, name: str, *, weights: str | os.PathLike[str] | None = None, **options: Any) -> Backbone:
        """Build from the spec's name part (``"resnet18"`` of ``"timm:resnet18"``), weights and options."""
        ...

    def spec(self) -> dict[str, Any]:
        """JSON facts for ``config.json``: at least ``{"backbone": "<kind>:<name>"}``."""
        ...

    @classmethod
    def rebuild(cls, spec: Mapping[str, Any], directory: Path) -> Backbone:
        """The architecture of a saved ``config.json`` (``spec``) in ``directory``, with random weights."""
        ...
