"""The :class:`HierarchicalHead` interface every head implements (see ``docs/architecture.md``).

A head maps backbone features ``[B, D]`` (dense heads: ``[B, D, *spatial]``) to an output (logits, or a
dict of tensors), trains with :meth:`HierarchicalHead.loss` and reports node probabilities ``[B, N]``
(float32, root = 1, parent >= child) with :meth:`HierarchicalHead.node_probs`.
"""

from __future__ import annotations

import abc
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from hiercls.losses.validation import check_features, check_node_targets
from hiercls.taxonomy import Taxonomy, TaxonomyError

__all__ = ["HeadOutput", "HierarchicalHead", "check_features", "check_node_targets"]

HeadOutput = torch.Tensor | dict[str, torch.Tensor]


class HierarchicalHead(nn.Module, abc.ABC):
    """Base class of hierarchical heads: features -> output -> (loss, node probabilities).

    Subclasses set :attr:`num_outputs` before calling :meth:`_build_linear` (or build their own layers), register
    taxonomy index arrays with :meth:`register_index` (non-persistent buffers: ``.to(device)`` moves them,
    checkpoints do not store them because the taxonomy rebuilds them), and implement :meth:`forward`,
    :meth:`loss` and :meth:`node_probs`.

    Args:
        taxonomy: the :class:`~hiercls.taxonomy.Taxonomy` whose node ids index every output.
        in_features: feature dimension ``D`` of the backbone.
        **options: head-specific options (each subclass documents its own; unknown ones are an error).

    Attributes:
        taxonomy: the taxonomy.
        in_features: ``D``.
        num_outputs: number of logits the head produces per sample (per pixel for dense heads).
        supports_dense: whether :meth:`forward` accepts ``[B, D, *spatial]`` features.
    """

    supports_dense: bool = False
    #: Registry name, set by :func:`hiercls.heads.register_head`.
    head_name: str = ""

    def __init__(self, taxonomy: Taxonomy, in_features: int, **options: Any) -> None:
        super().__init__()
        if not isinstance(taxonomy, Taxonomy):
            raise TypeError(f"taxonomy must be a hiercls Taxonomy; got {type(taxonomy).__name__}")
        if isinstance(in_features, bool) or not isinstance(in_features, int | np.integer) or in_features < 1:
            raise ValueError(f"in_features must be a positive int; got {in_features!r}")
        if options:
            raise TypeError(f"{type(self).__name__} got unknown option(s): {', '.join(sorted(options))}")
        self.taxonomy = taxonomy
        self.in_features = int(in_features)
        self.num_outputs = 0

    # ------------------------------------------------------------------ helpers for subclasses
    def register_index(self, name: str, array: np.ndarray | torch.Tensor, dtype: torch.dtype = torch.long) -> None:
        """Register a taxonomy-derived array as a non-persistent buffer (moves with ``.to(device)``)."""
        tensor = array.detach().clone() if isinstance(array, torch.Tensor) else torch.from_numpy(np.array(array))
        self.register_buffer(name, tensor.to(dtype), persistent=False)

    def _build_linear(self, bias: bool = True) -> None:
        """Create ``self.fc``: one linear map ``in_features -> num_outputs`` (used per pixel for dense heads)."""
        if self.num_outputs < 1:
            raise TaxonomyError(f"taxonomy {self.taxonomy.name!r} leaves {type(self).__name__} with no outputs")
        self.fc = nn.Linear(self.in_features, self.num_outputs, bias=bias)
        self.reset_parameters()

    def _linear(self, features: torch.Tensor) -> torch.Tensor:
        """Apply ``self.fc`` to ``[B, D]`` or, for dense heads, channel-wise to ``[B, D, *spatial]`` (a 1x1 conv)."""
        features = check_features(features, self.in_features, dense=self.supports_dense)
        if features.dim() == 2:
            return self.fc(features)
        out = torch.nn.functional.linear(features.movedim(1, -1), self.fc.weight, self.fc.bias)
        return out.movedim(-1, 1)

    def _check_targets(self, targets: Any, batch: int) -> torch.Tensor:
        return check_node_targets(targets, self.taxonomy.num_nodes, batch=batch)

    # ------------------------------------------------------------------ the interface
    def reset_parameters(self) -> None:
        """Re-initialise the head's parameters (linear layer: PyTorch's default weights, zero bias)."""
        fc = getattr(self, "fc", None)
        if isinstance(fc, nn.Linear):
            nn.init.kaiming_uniform_(fc.weight, a=math.sqrt(5))
            if fc.bias is not None:
                nn.init.zeros_(fc.bias)

    @abc.abstractmethod
    def forward(self, features: torch.Tensor) -> HeadOutput:
        """Map features ``[B, D]`` (dense heads: ``[B, D, *spatial]``) to the head's output."""

    @abc.abstractmethod
    def loss(self, output: HeadOutput, targets: torch.Tensor) -> torch.Tensor:
        """The head's training loss, a scalar tensor (mean over non-ignored samples).

        ``targets``: node ids ``[B]`` (``-1`` = ignore), or soft targets: a distribution over the leaves
        ``[B, num_leaves]`` (float, ``taxonomy.leaves`` order, a row with a negative entry ignored; see
        :func:`hiercls.losses.validation.check_leaf_distribution`), and node marginals ``[B, N]`` for node-based
        heads. On a one-hot row the soft loss must equal the hard one (``tests/test_soft_targets.py``).
        """

    @abc.abstractmethod
    def node_probs(self, output: HeadOutput) -> torch.Tensor:
        """Node probabilities ``[B, N]`` float32 (dense: ``[B, N, *spatial]``), consistent with the taxonomy."""

    def extra_repr(self) -> str:
        return (
            f"taxonomy={self.taxonomy.name!r}, nodes={self.taxonomy.num_nodes}, in_features={self.in_features}, "
            f"num_outputs={self.num_outputs}"
        )
