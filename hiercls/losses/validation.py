"""Input checks shared by heads and losses: clear errors naming the parameter and the expected shape."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_features", "check_leaf_distribution", "check_node_targets", "is_soft_targets", "upcast"]


def check_features(features: Any, in_features: int, *, dense: bool = False, name: str = "features") -> torch.Tensor:
    """Validate backbone features: a float tensor ``[B, in_features]`` (``dense``: ``[B, in_features, *spatial]``).

    Raises:
        TypeError: ``features`` is not a floating-point tensor.
        ValueError: wrong number of dimensions or channels.

    Example:
        >>> check_features(torch.zeros(2, 3), 3).shape
        torch.Size([2, 3])
    """
    if not isinstance(features, torch.Tensor) or not features.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point torch.Tensor; got "
            f"{type(features).__name__ if not isinstance(features, torch.Tensor) else features.dtype}"
        )
    ok_dims = features.dim() >= 2 if dense else features.dim() == 2
    if not ok_dims or features.shape[1] != in_features:
        want = f"[B, {in_features}" + (", *spatial]" if dense else "]")
        raise ValueError(f"{name} must have shape {want}; got {list(features.shape)}")
    return features


def check_node_targets(
    targets: Any, num_nodes: int, *, batch: int | None = None, name: str = "targets"
) -> torch.Tensor:
    """Validate single-label targets: integer node ids ``[B]`` in ``[0, num_nodes)``, ``-1`` = ignore.

    Raises:
        TypeError: not an integer tensor.
        ValueError: wrong shape or an id out of range (the message shows the first offender).

    Example:
        >>> check_node_targets(torch.tensor([0, 2, -1]), 3).tolist()
        [0, 2, -1]
    """
    if not isinstance(targets, torch.Tensor):
        targets = torch.as_tensor(targets)
    if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.is_complex():
        raise TypeError(f"{name} must be an integer tensor of node ids; got dtype {targets.dtype}")
    if targets.dim() != 1 or (batch is not None and targets.shape[0] != batch):
        want = f"[{batch}]" if batch is not None else "[B]"
        raise ValueError(f"{name} must be node ids of shape {want}; got shape {list(targets.shape)}")
    targets = targets.long()
    if targets.numel():
        bad = (targets < -1) | (targets >= num_nodes)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"{name}[{i}] = {int(targets[i])} is not a node id: expected -1 (ignore) or an id in [0, {num_nodes})"
            )
    return targets


def is_soft_targets(targets: Any) -> bool:
    """Whether ``targets`` are soft: a floating-point tensor ``[B, K]`` (a leaf distribution or node marginals).

    Hard targets are integer node ids ``[B]`` (or, for node-based heads, integer / boolean multi-hot rows).

    Example:
        >>> is_soft_targets(torch.tensor([2, 1])), is_soft_targets(torch.tensor([[0.5, 0.5, 0.0]]))
        (False, True)
    """
    return isinstance(targets, torch.Tensor) and targets.is_floating_point() and targets.dim() == 2


def check_leaf_distribution(
    targets: Any, num_leaves: int, *, batch: int | None = None, name: str = "targets", atol: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate soft targets given as a distribution over the leaves ``[B, num_leaves]`` (``taxonomy.leaves`` order).

    A row with a negative entry is ignored (as ``-1`` for node ids); every other row must be non-negative and
    sum to 1 within ``atol`` (mixup / cutmix and label smoothing keep rows normalised).

    Returns:
        ``(q, keep)``: ``q`` the distribution (ignored rows zeroed, floating dtype kept) and ``keep`` ``[B]`` bool.

    Raises:
        ValueError: wrong shape, a non-finite entry, or a kept row that does not sum to 1 (the first is named).

    Example:
        >>> q, keep = check_leaf_distribution(torch.tensor([[0.25, 0.75], [-1.0, -1.0]]), 2)
        >>> q.tolist(), keep.tolist()
        ([[0.25, 0.75], [0.0, 0.0]], [True, False])
    """
    if not is_soft_targets(targets) or targets.shape[1] != num_leaves or (batch is not None and len(targets) != batch):
        shape = list(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__
        b = "B" if batch is None else batch
        raise ValueError(
            f"{name} as a leaf distribution must be a float tensor of shape [{b}, {num_leaves}]; got {shape}"
        )
    if not bool(torch.isfinite(targets).all()):
        raise ValueError(f"{name}: a leaf distribution must be finite")
    keep = (targets >= 0).all(1)
    q = targets.masked_fill(~keep[:, None], 0.0)
    bad = keep & ((q.sum(1) - 1).abs() > atol)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"{name}[{i}] sums to {float(q[i].sum()):.6g}: a leaf distribution row must sum to 1 "
            f"(or have a negative entry to be ignored)"
        )
    return q, keep


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when it is half / bfloat16 (autocast outputs), else unchanged (float64 stays float64).

    Example:
        >>> upcast(torch.zeros(1, dtype=torch.bfloat16)).dtype, upcast(torch.zeros(1, dtype=torch.float64)).dtype
        (torch.float32, torch.float64)
    """
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) or not x.is_floating_point() else x
