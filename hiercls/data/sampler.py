"""Deterministic, resumable, DDP-aware sampling: the exact data position survives a restart.

The global order of an epoch depends only on ``(seed, epoch, dataset_len, shuffle)``. It is cut into global
batches of ``batch_size * world_size`` samples and rank ``r`` takes ``global_batch[r::world_size]``, so a run
on 2 processes with per-rank batch 16 sees exactly the global batches of a 1-process run with batch 32.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hiercls.data.shards import ShardDataset, ShardLoader

logger = logging.getLogger(__name__)

__all__ = ["ResumableDataLoader", "ResumableDistributedSampler", "make_loader"]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


class ResumableDistributedSampler(Sampler[int]):
    """Per-rank indices of a seeded global order, resumable at an exact position.

    Args:
        dataset_len: number of samples in the dataset.
        batch_size: samples per rank per step (the global batch is ``batch_size * world_size``).
        shuffle: permute the samples each epoch (with ``torch.Generator`` seeded by ``seed + epoch``).
        seed: base seed; the same seed gives the same order on every machine and world size.
        rank: this process' rank in ``[0, world_size)``.
        world_size: number of processes.
        drop_last: drop the final partial global batch. Otherwise the final global batch is padded, by
            repeating its own first samples, to a multiple of ``world_size`` so that every rank takes the
            same number of steps (as ``torch.utils.data.DistributedSampler`` does); a padded repeat only
            happens when ``world_size`` does not divide the remainder.

    Position: :meth:`state_dict` returns ``{"epoch": e, "index": i, ...}`` where ``i`` counts the samples of
    the epoch's (unpadded) global order already delivered, over all ranks. Each batch handed to the training
    loop advances it by the global batch size (:meth:`mark_batches_done`, called by
    :class:`ResumableDataLoader`, which counts on the consumer side so that prefetching does not skew it).
    After :meth:`load_state_dict` the next iteration of that epoch starts at ``index`` (the remainder of the
    order is cut into global batches of the *current* ``batch_size * world_size``, so resuming on another
    world size is allowed); every other iteration starts at the beginning of the epoch.

    Example:
        >>> s = ResumableDistributedSampler(10, batch_size=2, shuffle=False, rank=1, world_size=2)
        >>> list(s)
        [1, 3, 5, 7, 9]
        >>> s.load_state_dict({"epoch": 0, "index": 4})
        >>> list(s)
        [5, 7, 9]
    """

    def __init__(
        self,
        dataset_len: int,
        *,
        batch_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        self.dataset_len = _check_int("dataset_len", dataset_len, 0)
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}); got {rank}")
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._start = 0  # position the current/next iteration starts from
        self._resume: int | None = None  # pending position from load_state_dict
        self._done_batches = 0

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (its order) and point the position at its start (or at a loaded resume position of
        the same epoch); a position loaded for another epoch is discarded."""
        epoch = _check_int("epoch", epoch, 0)
        if epoch != self.epoch and self._resume is not None:
            logger.warning(
                "set_epoch(%d) discards the resume position %d loaded for epoch %d", epoch, self._resume, self.epoch
            )
            self._resume = None
        self.epoch = epoch
        # The position now refers to this epoch's next iteration (a checkpoint taken before its first batch
        # must not carry the previous epoch's count).
        self._start = self._next_start()
        self._done_batches = 0

    def global_order(self, epoch: int | None = None) -> np.ndarray:
        """The unpadded global order of ``epoch`` (default: the current one), shared by all ranks."""
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return np.arange(self.dataset_len, dtype=np.int64)
        g = torch.Generator()
        g.manual_seed(self.seed + epoch)
        return torch.randperm(self.dataset_len, generator=g).numpy()

    def _rest_batches(self, start: int) -> tuple[np.ndarray, int]:
        """Global order from ``start``, trimmed/padded; returns it and the number of global batches."""
        rest = self.global_order()[start:]
        g = self.global_batch_size
        if self.drop_last:
            rest = rest[: len(rest) // g * g]
        elif len(rest) % self.world_size:
            tail = len(rest) // g * g
            pad = self.world_size - len(rest) % self.world_size
            last = rest[tail:]
            rest = np.concatenate([rest, np.resize(last, pad)])
        return rest, -(-len(rest) // g)

    def _rank_indices(self, start: int) -> np.ndarray:
        rest, nb = self._rest_batches(start)
        g = self.global_batch_size
        return (
            np.concatenate([rest[k * g : (k + 1) * g][self.rank :: self.world_size] for k in range(nb)])
            if nb
            else np.zeros(0, dtype=np.int64)
        )

    def _next_start(self) -> int:
        return self._resume if self._resume is not None else 0

    def __iter__(self) -> Iterator[int]:
        self._start = self._next_start()
        self._resume = None
        self._done_batches = 0
        return iter(self._rank_indices(self._start).tolist())

    def __len__(self) -> int:
        return len(self._rank_indices(self._next_start()))

    def num_batches(self) -> int:
        """Steps of the next iteration (per rank, with the loader's ``batch_size``)."""
        return self._rest_batches(self._next_start())[1]

    def mark_batches_done(self, num_batches: int) -> None:
        """Record that ``num_batches`` batches of the current iteration reached the training loop."""
        self._done_batches = _check_int("num_batches", num_batches, 0)

    @property
    def position(self) -> int:
        """Samples of the epoch's global order delivered so far (all ranks)."""
        unpadded = self.dataset_len - self._start
        if self.drop_last:
            unpadded = unpadded // self.global_batch_size * self.global_batch_size
        return self._start + min(self._done_batches * self.global_batch_size, unpadded)

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "index", "seed", "dataset_len", "shuffle"}``: the exact data position."""
        return {
            "epoch": self.epoch,
            "index": self.position,
            "seed": self.seed,
            "dataset_len": self.dataset_len,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: select ``state["epoch"]`` and start its next iteration at ``state["index"]``.

        Raises:
            ValueError: the state was saved for a different dataset length, seed or shuffle setting (the
                position would point into a different order), or ``index`` is out of range.
        """
        for key in ("dataset_len", "seed", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"sampler state has {key}={state[key]!r} but this sampler has "
                    f"{key}={getattr(self, key)!r}; the saved position would point into another order"
                )
        index = _check_int("state['index']", state.get("index", 0), 0)
        if index > self.dataset_len:
            raise ValueError(f"state['index']={index} is past the end of the dataset ({self.dataset_len} samples)")
        self.epoch = _check_int("state['epoch']", state.get("epoch", 0), 0)
        self._resume = index
        self._start = index
        self._done_batches = 0


class ResumableDataLoader:
    """A ``DataLoader`` over a :class:`ResumableDistributedSampler` that knows its exact position.

    It counts the batches it hands out (after any worker prefetching), so :meth:`state_dict` taken inside
    the training loop, after the step on a batch, resumes with the next batch.
    """

    def __init__(self, loader: DataLoader, sampler: ResumableDistributedSampler) -> None:
        self.loader = loader
        self.sampler = sampler

    @property
    def dataset(self) -> Dataset:
        return self.loader.dataset

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)  # starts the sampler's iteration (and its resume position)
        for k, batch in enumerate(it, start=1):
            self.sampler.mark_batches_done(k)
            yield batch

    def __len__(self) -> int:
        return self.sampler.num_batches()

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def make_loader(
    dataset: Dataset | Sequence[Any],
    batch_size: int,
    *,
    shuffle: bool = True,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    drop_last: bool = False,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
) -> ResumableDataLoader | ShardLoader:
    """A resumable, DDP-aware loader: rank ``rank`` of ``world_size`` with ``batch_size`` samples per step.

    Usage in a training loop::

        loader = make_loader(ds, 32, seed=0, rank=rank, world_size=world, collate_fn=model.collate)
        loader.load_state_dict(ckpt["data"])          # optional: resume exactly
        for epoch in range(loader.state_dict()["epoch"], epochs):
            loader.set_epoch(epoch)
            for inputs, targets in loader:
                ...                                   # step
                ckpt["data"] = loader.state_dict()    # position after this batch

    A :class:`~hiercls.data.shards.ShardDataset` gets a :class:`~hiercls.data.shards.ShardLoader` (split by
    shards over ranks and workers; same interface).

    Example:
        >>> loader = make_loader(list(range(10)), 4, shuffle=False)
        >>> [b.tolist() for b in loader]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        >>> loader.state_dict()["index"]
        10
    """
    num_workers = _check_int("num_workers", num_workers, 0)
    # Worker RNGs (random augmentations) derive from this generator: same seed, same augmentations.
    gen = torch.Generator()
    gen.manual_seed(seed * 1000003 + rank)
    if isinstance(dataset, ShardDataset):  # a stream: split by shards, not by a sampler
        dataset.configure(shuffle=shuffle, seed=seed, rank=rank, world_size=world_size, num_workers=num_workers)
        return ShardLoader(
            dataset,
            batch_size,
            collate_fn=collate_fn,
            drop_last=drop_last,
            num_workers=num_workers,
            pin_memory=pin_memory,
            generator=gen,
        )
    n = len(dataset)  # type: ignore[arg-type]
    sampler = ResumableDistributedSampler(
        n, batch_size=batch_size, shuffle=shuffle, seed=seed, rank=rank, world_size=world_size, drop_last=drop_last
    )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collate_fn,  # type: ignore[arg-type]
        drop_last=False,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=gen,
        persistent_workers=persistent_workers and num_workers > 0,
    )
    return ResumableDataLoader(loader, sampler)
