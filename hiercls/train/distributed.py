"""Process-group setup for single-process and ``torchrun`` (DDP) training.

``torchrun --nproc_per_node 2 -m hiercls train recipe.yaml`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_distributed` reads them, picks gloo on CPU and nccl on CUDA,
and binds each process to its local GPU. Without those variables everything runs in one process.

Example:
    >>> info = init_distributed(device="cpu")
    >>> info.world_size, info.rank, info.is_main
    (1, 0, True)
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hiercls.train.config import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "DistInfo",
    "all_gather_object",
    "all_reduce_sum",
    "barrier",
    "cleanup_distributed",
    "die_with_launcher",
    "eval_loader",
    "init_distributed",
    "is_main_process",
    "rank_local_layers",
    "resolve_device",
]


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: rank, world size, local rank and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the process that logs, shows progress and writes files)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer (set by torchrun)") from None


def resolve_device(device: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto`` -> the local rank's GPU when CUDA is available, else CPU; ``cuda`` -> ``cuda:<local_rank>``.

    Raises:
        ValueError: CUDA requested but not available, or a GPU index out of range.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if not device.startswith("cuda"):
        raise ValueError(f"device must be auto, cpu, cuda or cuda:<index>, got {device!r}")
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r} requested but CUDA is not available on this machine")
    index = int(device.split(":", 1)[1]) if ":" in device else local_rank
    if index >= torch.cuda.device_count():
        raise ValueError(f"device cuda:{index} requested but only {torch.cuda.device_count()} GPU(s) are visible")
    return torch.device("cuda", index)


def init_distributed(device: str = "auto", backend: str | None = None) -> DistInfo:
    """Join the process group described by the torchrun environment (or run alone without one).

    Args:
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:<i>``; under torchrun ``cuda``/``auto`` use the local rank.
        backend: ``gloo`` / ``nccl``; default nccl on CUDA, gloo on CPU.

    Returns:
        A :class:`DistInfo`. When the process group was already initialised (by a caller), it is reused.

    Raises:
        ValueError: inconsistent environment (rank outside the world size) or an unavailable device.
    """
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = _env_int("LOCAL_RANK", rank)
        dev = resolve_device(device, local_rank)
        return DistInfo(rank, world, local_rank, dev, initialized_here=False)
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", rank)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"invalid torchrun environment: RANK={rank} WORLD_SIZE={world} (need 0 <= RANK < WORLD_SIZE)")
    dev = resolve_device(device, local_rank)
    if world == 1:
        return DistInfo(0, 1, 0, dev)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # a torchrun worker: never outlive the launcher
        die_with_launcher()
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
    dist.init_process_group(backend=backend, rank=rank, world_size=world, device_id=dev if dev.type == "cuda" else None)
    logger.info("joined process group: rank %d of %d (%s, %s)", rank, world, backend, dev)
    return DistInfo(rank, world, local_rank, dev, initialized_here=True)


#: ``prctl`` option: the signal the kernel sends this process when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def die_with_launcher() -> bool:
    """Ask the kernel to SIGKILL this process when its parent (the torchrun launcher) dies; ``True`` if armed.

    Without it, the workers of a killed launcher train on (and write) while a new run starts in their folder.
    Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere ``False``.
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        armed = ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        armed = False
    if not armed:
        logger.warning("cannot arrange to stop with the launcher (prctl failed): kill the workers yourself if it dies")
    elif os.getppid() != parent:  # pragma: no cover - the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)
    return armed


def cleanup_distributed(info: DistInfo) -> None:
    """Leave the process group if :func:`init_distributed` created it."""
    if info.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def rank_local_layers(model: torch.nn.Module) -> str | None:
    """Why DDP training of ``model`` cannot equal one process beyond float rounding, or ``None`` when it can.

    A 2-process run of a model without such layers ends within float summation order of one process (about
    2e-5 in the weights of the tests' tiny ViT after 6 steps). Batch normalisation makes each rank normalise by
    its own ``batch_size / world_size`` samples (and DDP keeps rank 0's running statistics); dropout draws
    each rank's masks from that rank's stream (``seed + rank``). Both change the result by far more (measured
    on timm's test_resnet: running statistics 0.7 apart after 6 steps).

    Example:
        >>> rank_local_layers(torch.nn.Sequential(torch.nn.Linear(2, 2))) is None
        True
        >>> print(rank_local_layers(torch.nn.Sequential(torch.nn.BatchNorm1d(2), torch.nn.Dropout(0.1))))
        1 batch-norm layer(s) (each rank normalises by its own share of the batch), 1 dropout layer(s) (masks ...
    """
    norms = sum(
        isinstance(m, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)) for m in model.modules()
    )
    drops = sum(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
    parts = [f"{norms} batch-norm layer(s) (each rank normalises by its own share of the batch)"] if norms else []
    parts += [f"{drops} dropout layer(s) (masks drawn per rank)"] if drops else []
    return ", ".join(parts) or None


def is_main_process() -> bool:
    """True unless this is a non-zero rank: of an initialised process group, or of a torchrun launch.

    The launcher's ``RANK`` still counts after the group is destroyed, so that only rank 0 prints the
    results at the end of ``hiercls train``.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    """Wait for every rank (no-op in a single process)."""
    if _active():
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks in place and return it (no-op in a single process)."""
    if _active():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (``[obj]`` in a single process)."""
    if not _active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def eval_loader(
    dataset: Any, batch_size: int, info: DistInfo, collate: Callable[..., Any] | None = None, num_workers: int = 0
) -> torch.utils.data.DataLoader:
    """This rank's evaluation loader: samples ``rank, rank + world_size, ...`` in order, unpadded.

    The shards are disjoint and cover the data once, so metrics whose states are sums (the
    :class:`hiercls.evaluation.Evaluator`) add up over ranks to the single-process result exactly.

    Raises:
        ConfigError: fewer samples than processes (every rank needs at least one).
    """
    if len(dataset) < info.world_size:
        raise ConfigError(
            f"data.max_eval_samples: {len(dataset)} evaluation samples for {info.world_size} processes; "
            "every rank needs at least one"
        )
    shard = torch.utils.data.Subset(dataset, list(range(info.rank, len(dataset), info.world_size)))
    per_rank = max(1, batch_size // info.world_size)
    return torch.utils.data.DataLoader(
        shard, batch_size=per_rank, shuffle=False, collate_fn=collate, num_workers=num_workers
    )
