"""Tar shards (the webdataset layout): write them from an image folder, stream them split over DDP ranks.

A shard is a plain tar file whose members come in groups of one sample: ``<key>.<image ext>`` (``.jpg``, ``.png``
...) and ``<key>.cls`` (the label as text: a node name such as a WordNet id ``n02084071``, or a label path
``animal/cat``) or ``<key>.json`` (``{"label": ...}``), consecutive in the tar. :func:`write_shards` (the
``hiercls data shard`` command) writes them, with an ``index.json`` of sample counts beside them (without it the
reader counts the samples of each shard from its tar headers).

Semantics of :class:`ShardDataset` (one epoch):

* **Shard order:** with ``shuffle`` the shards are permuted by ``(seed, epoch)``, the same on every rank; shard
  ``order[i]`` goes to rank ``i % world_size``, and within a rank to DataLoader worker ``j % num_workers`` (``j``
  its position among the rank's shards). Each worker reads its shards in order through a shuffle buffer of
  ``buffer_size`` samples seeded by ``(seed, epoch, rank, worker)``; the loader takes the workers' samples
  round-robin (one each in turn, a finished worker dropping out) and batches them.
* **Every sample once:** when every rank holds the same number of samples (e.g. equal shards, their number a
  multiple of ``world_size``) each sample is seen exactly once per epoch over all ranks. Otherwise every rank
  stops after the smallest rank's number of samples (so that all ranks take the same number of steps); the
  samples past it are not seen that epoch (a warning gives their number; the next epoch's order differs).
* **Resume granularity: the sample.** :meth:`ShardLoader.state_dict` counts the samples delivered in the epoch;
  after :meth:`ShardLoader.load_state_dict` each worker skips (reading, not decoding) exactly the samples it had
  delivered, so the resumed epoch continues with the next sample the interrupted one would have given. This needs
  the same seed, shards, ``world_size`` and ``num_workers`` (checked).

Random access (``dataset[i]``, used by evaluation) reads an index of member offsets built on first use.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import tarfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from hiercls._textio import atomic_write
from hiercls.data.images import IMAGE_ERRORS, IMAGE_EXTENSIONS, HierImageFolder, image_to_tensor
from hiercls.data.labels import LabelEncoder
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.io import write_taxonomy

logger = logging.getLogger(__name__)

__all__ = ["ShardDataset", "ShardLoader", "expand_shards", "write_shards"]

INDEX_FILE = "index.json"
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def expand_shards(spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The shard files of ``spec``: a folder (its ``*.tar``, sorted), a brace range (``a/{000..009}.tar``, its
    digits zero-padded to the width given), one file, or a list of these.

    Raises:
        FileNotFoundError: a named shard or folder does not exist, or a folder holds no ``.tar`` file.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> for i in range(3):
        ...     _ = (d / f"s-{i:03d}.tar").write_bytes(b"")
        >>> [p.name for p in expand_shards(f"{d}/s-{{000..001}}.tar")], len(expand_shards(d))
        (['s-000.tar', 's-001.tar'], 3)
    """
    if isinstance(spec, (list, tuple)):
        return [p for s in spec for p in expand_shards(s)]
    text = str(spec)
    match = _BRACES.search(text)
    if match:
        lo, hi = match.group(1), match.group(2)
        names = [text[: match.start()] + f"{i:0{len(lo)}d}" + text[match.end() :] for i in range(int(lo), int(hi) + 1)]
        return [p for name in names for p in expand_shards(name)]
    path = Path(text)
    if path.is_dir():
        found = sorted(path.glob("*.tar"))
        if not found:
            raise FileNotFoundError(f"shard folder {text!r} holds no .tar file")
        return found
    if not path.is_file():
        raise FileNotFoundError(f"shard {text!r} does not exist")
    return [path]


def _split_name(name: str) -> tuple[str, str]:
    """``dir/key.ext`` -> ``(dir/key, ext)``; the key ends at the first dot of the file name (webdataset's rule)."""
    head, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{head}/{stem}" if head else stem), ext.lower()


def _label_text(ext: str, data: bytes, where: str) -> str:
    text = data.decode("utf-8").strip()
    if ext == "cls":
        return text
    try:
        label = json.loads(text)["label"]
    except (ValueError, KeyError, TypeError) as err:
        raise TaxonomyError(f"{where}: a .json member must be an object with a 'label' key ({err})") from None
    return str(label)


def read_shard(path: str | os.PathLike[str]) -> Iterator[tuple[str, str, bytes, str]]:
    """The samples of one shard in tar order: ``(key, image ext, image bytes, label text)``.

    Raises:
        TaxonomyError: a sample without an image or without a label (naming the shard and key).
    """
    with tarfile.open(path, mode="r|") as tar:  # a stream: one sequential read
        key, parts = None, {}
        for member in tar:
            if not member.isfile():
                continue
            k, ext = _split_name(member.name)
            if k != key and key is not None:
                yield _sample(path, key, parts)
                parts = {}
            key = k
            parts[ext] = tar.extractfile(member).read()  # type: ignore[union-attr]
        if key is not None:
            yield _sample(path, key, parts)


def _sample(path: Any, key: str, parts: dict[str, bytes]) -> tuple[str, str, bytes, str]:
    where = f"shard {str(path)!r}, sample {key!r}"
    image = next((e for e in parts if "." + e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS), None)
    label = next((e for e in ("cls", "json") if e in parts), None)
    if image is None or label is None:
        missing = "an image member" if image is None else "a .cls or .json label member"
        raise TaxonomyError(f"{where} has no {missing} (members: {', '.join(sorted(parts))})")
    return key, image, parts[image], _label_text(label, parts[label], where)


def _count(path: Path) -> int:
    """Samples of one shard, from its tar headers (no data is read)."""
    with tarfile.open(path, mode="r:") as tar:
        return len({_split_name(m.name)[0] for m in tar.getmembers() if m.isfile()})


def _counts(shards: list[Path]) -> list[int]:
    """Sample counts of the shards: from the ``index.json`` beside them where it lists them, else their headers."""
    known: dict[str, int] = {}
    for folder in {p.parent for p in shards}:
        index = folder / INDEX_FILE
        if index.is_file():
            entries = json.loads(index.read_text(encoding="utf-8"))["shards"]
            known.update({str(folder / e["name"]): int(e["samples"]) for e in entries})
    return [known[str(p)] if str(p) in known else _count(p) for p in shards]


def _shuffled(items: Iterator[Any], size: int, rng: np.random.Generator) -> Iterator[Any]:
    """A shuffle buffer: keep ``size`` items, give a random one of them for each new item, then the rest."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = int(rng.integers(len(buffer)))
        buffer[i], item = item, buffer[i]
        yield item
    rng.shuffle(buffer)
    yield from buffer


def merged_counts(lengths: Sequence[int], taken: int) -> list[int]:
    """How many samples of each worker the first ``taken`` samples of their round-robin merge hold.

    Example:
        >>> merged_counts([3, 1, 2], 5)  # order: w0 w1 w2 w0 w2 | w0
        [2, 1, 2]
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if taken > int(lengths.sum()):
        raise ValueError(f"taken={taken} is past the {int(lengths.sum())} samples of the workers")
    # Complete rounds (every worker with more than r samples gives one in round r): the most rounds that fit in
    # ``taken``, by bisection, since the samples of R rounds, sum(min(lengths, R)), grow with R.
    rounds, hi = 0, int(lengths.max(initial=0))
    while rounds < hi:
        mid = (rounds + hi + 1) // 2
        if int(np.minimum(lengths, mid).sum()) <= taken:
            rounds = mid
        else:
            hi = mid - 1
    done = np.minimum(lengths, rounds)
    rest = taken - int(done.sum())
    for w in np.flatnonzero(lengths > rounds)[:rest]:
        done[w] += 1
    return done.tolist()


class ShardDataset(IterableDataset):
    """Samples of tar shards, ``(image, node_id)`` (see the module notes for order, DDP split and resume).

    Args:
        shards: the shard files (:func:`expand_shards` forms: a folder, a brace range, a list).
        taxonomy: the taxonomy the labels name (node names such as WordNet ids, or label paths).
        transform: applied to the RGB ``PIL.Image``; without it images become ``[3, H, W]`` float tensors.
        shuffle: permute the shards per epoch and pass samples through the shuffle buffer.
        buffer_size: samples in the shuffle buffer of each worker.
        seed: seed of the shard order and the buffers.
        rank, world_size: this process's rank and the number of ranks (set by :func:`make_loader`).

    Raises:
        FileNotFoundError: a shard does not exist.
        ValueError: no shards, or fewer shards than ranks.
    """

    def __init__(
        self,
        shards: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        taxonomy: Taxonomy,
        transform: Callable[[Any], Any] | None = None,
        *,
        shuffle: bool = False,
        buffer_size: int = 1000,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not isinstance(taxonomy, Taxonomy):
            raise TypeError(f"taxonomy must be a hiercls Taxonomy; got {type(taxonomy).__name__}")
        self.shards = expand_shards(shards)
        if not self.shards:
            raise ValueError("shards: no shard files given")
        self.counts = _counts(self.shards)
        self.taxonomy, self.transform = taxonomy, transform
        self.encoder = LabelEncoder(taxonomy)
        self.buffer_size, self.epoch = int(buffer_size), 0
        self.configure(shuffle=shuffle, seed=seed, rank=rank, world_size=world_size)
        #: Samples each worker skips at the start of the next iteration (set by :class:`ShardLoader` on resume).
        self.resume_skip: list[int] | None = None
        self._index: list[tuple[int, int, int, str]] | None = None

    def configure(self, *, shuffle: bool, seed: int, rank: int, world_size: int, num_workers: int = 0) -> None:
        """Set the order and the DDP split (what :func:`make_loader` passes)."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}); got {rank}")
        if len(self.shards) < world_size:
            raise ValueError(f"shards: {len(self.shards)} shard(s) for {world_size} ranks; every rank needs one")
        self.shuffle, self.seed, self.rank, self.world_size = bool(shuffle), int(seed), rank, world_size
        self.num_workers = max(1, int(num_workers))

    def __len__(self) -> int:
        return sum(self.counts)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def shard_order(self, epoch: int | None = None) -> np.ndarray:
        """The shard indices of ``epoch`` in order (all ranks)."""
        epoch = self.epoch if epoch is None else epoch
        n = len(self.shards)
        return np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)

    def _split(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This epoch's shard order and, per position, its rank (``i % world_size``) and worker."""
        order, pos = self.shard_order(), np.arange(len(self.shards))
        return order, pos % self.world_size, (pos // self.world_size) % self.num_workers

    def worker_shards(self, rank: int, worker: int) -> list[int]:
        """The shards worker ``worker`` of rank ``rank`` reads this epoch, in order."""
        order, ranks, workers = self._split()
        return order[(ranks == rank) & (workers == worker)].tolist()

    def worker_lengths(self, rank: int | None = None) -> list[int]:
        """Samples each worker of ``rank`` (default: this one) gives this epoch."""
        order, ranks, workers = self._split()
        mine = ranks == (self.rank if rank is None else rank)
        counts = np.asarray(self.counts, dtype=np.int64)[order]
        return np.bincount(workers[mine], weights=counts[mine], minlength=self.num_workers).astype(np.int64).tolist()

    def rank_lengths(self) -> list[int]:
        """Samples each rank holds this epoch."""
        order, ranks, _ = self._split()
        counts = np.asarray(self.counts, dtype=np.int64)[order]
        return np.bincount(ranks, weights=counts, minlength=self.world_size).astype(np.int64).tolist()

    def samples_per_rank(self) -> int:
        """Samples every rank takes this epoch: the smallest rank's count."""
        return min(self.rank_lengths())

    def _raw(self, worker: int) -> Iterator[tuple[str, str, bytes, str]]:
        for s in self.worker_shards(self.rank, worker):
            for key, *rest in read_shard(self.shards[s]):
                yield (f"{self.shards[s].name}:{key}", *rest)

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        if info is not None and info.num_workers != self.num_workers:
            raise ValueError(
                f"the DataLoader has {info.num_workers} workers but the shards were split for "
                f"{self.num_workers}; build the loader with make_loader"
            )
        stream: Iterator[Any] = self._raw(worker)
        if self.shuffle:
            rng = np.random.default_rng([self.seed, self.epoch, self.rank, worker])
            stream = _shuffled(stream, self.buffer_size, rng)
        skip = self.resume_skip[worker] if self.resume_skip is not None else 0
        for i, (key, ext, data, label) in enumerate(stream):
            if i >= skip:
                yield self._decode(key, ext, data, label)

    def _decode(self, key: str, ext: str, data: bytes, label: str) -> tuple[Any, int]:
        node = self.encoder.encode(label, "auto", source=f"sample {key!r}")
        try:
            with Image.open(io.BytesIO(data)) as im:
                img = im.convert("RGB")
        except IMAGE_ERRORS as err:
            raise OSError(f"cannot decode image of sample {key!r} ({ext}): {err}") from err
        return (self.transform(img) if self.transform is not None else image_to_tensor(img)), node

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if self._index is None:
            self._index = [entry for s in range(len(self.shards)) for entry in self._members(s)]
        shard, offset, size, label = self._index[index]
        with open(self.shards[shard], "rb") as f:
            f.seek(offset)
            data = f.read(size)
        return self._decode(f"{self.shards[shard].name}#{index}", "", data, label)

    def _members(self, s: int) -> list[tuple[int, int, int, str]]:
        """``(shard, image offset, image size, label)`` of the samples of shard ``s``, in tar order."""
        with tarfile.open(self.shards[s], mode="r:") as tar:
            where = {_split_name(m.name): (m.offset_data, m.size) for m in tar.getmembers() if m.isfile()}
        return [(s, *where[(key, ext)], label) for key, ext, _, label in read_shard(self.shards[s])]


class ShardLoader:
    """Batches of a :class:`ShardDataset` for one rank, with an exact, resumable position (see the module notes).

    Built by :func:`hiercls.data.make_loader`; the same interface as :class:`ResumableDataLoader`. Workers are
    started afresh every epoch (no persistent workers): they carry the epoch and the resume position.
    """

    def __init__(
        self,
        dataset: ShardDataset,
        batch_size: int,
        *,
        collate_fn: Callable[[list[Any]], Any] | None,
        drop_last: bool,
        num_workers: int,
        pin_memory: bool,
        generator: torch.Generator,
    ) -> None:
        self.dataset, self.batch_size, self.drop_last = dataset, int(batch_size), bool(drop_last)
        self.collate_fn = collate_fn or torch.utils.data.default_collate
        # One sample per worker fetch, so the rank's stream is the workers' round-robin merge, batched here.
        self.loader = DataLoader(
            dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, generator=generator
        )
        self._start = 0  # samples of the epoch delivered before this iteration
        self._done = 0

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.dataset.epoch:
            self._start = 0
        self.dataset.set_epoch(epoch)
        self._done = 0

    def _total(self) -> int:
        return self.dataset.samples_per_rank()

    def __len__(self) -> int:
        rest = self._total() - self._start
        return rest // self.batch_size if self.drop_last else -(-rest // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        d = self.dataset
        total, lengths = self._total(), d.worker_lengths()
        per_rank = d.rank_lengths()
        if d.rank == 0 and max(per_rank) > total:
            logger.warning(
                "shards: the ranks hold %s samples this epoch; each stops after %d, leaving %d unseen",
                per_rank,
                total,
                sum(per_rank) - total * d.world_size,
            )
        self.dataset.resume_skip = merged_counts(lengths, self._start)
        self._done, batch = 0, []
        left = total - self._start
        try:
            for sample in self.loader:
                if left == 0:
                    break
                batch.append(sample)
                left -= 1
                if len(batch) == self.batch_size or (left == 0 and not self.drop_last):
                    self._done += len(batch)
                    yield self.collate_fn(batch)
                    batch = []
        finally:
            self.dataset.resume_skip = None
        self._start = 0

    @property
    def position(self) -> int:
        return self._start + self._done

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "index" (samples delivered over all ranks), "seed", "shards", "world_size", "num_workers"}``."""
        d = self.dataset
        return {
            "epoch": d.epoch,
            "index": self.position * d.world_size,
            "seed": d.seed,
            "shuffle": d.shuffle,
            "shards": len(d.shards),
            "world_size": d.world_size,
            "num_workers": d.num_workers,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the saved epoch and sample.

        Raises:
            ValueError: the state was saved with another seed, shuffle, number of shards, ranks or workers.
        """
        d = self.dataset
        for key, mine in (
            ("seed", d.seed),
            ("shuffle", d.shuffle),
            ("shards", len(d.shards)),
            ("world_size", d.world_size),
            ("num_workers", d.num_workers),
        ):
            if key in state and state[key] != mine:
                raise ValueError(
                    f"shard loader state has {key}={state[key]!r} but this loader has {key}={mine!r}; "
                    "resuming a shard stream needs the same seed, shards, ranks and data.num_workers"
                )
        d.set_epoch(int(state.get("epoch", 0)))
        self._start, self._done = int(state.get("index", 0)) // d.world_size, 0


def write_shards(
    src: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    taxonomy: Taxonomy | None = None,
    *,
    shard_size: int = 1000,
    prefix: str = "shard",
    shuffle_seed: int | None = 0,
) -> list[Path]:
    """Write the images of a folder tree as tar shards of ``shard_size`` samples (``<prefix>-000000.tar`` ...).

    The samples go in a random order drawn from ``shuffle_seed``, so that every shard mixes the labels: the reader's
    shuffle buffer only mixes samples within ``buffer_size`` of each other, which in the folder's order (sorted by
    folder, one or a few labels per shard; ``shuffle_seed=None``) would mean batches of one or two labels.

    The folders are the labels as :class:`~hiercls.data.HierImageFolder` reads them (nested folders = the
    taxonomy, or flat/nested folders matched to ``taxonomy`` by path or name); each sample's ``.cls`` member holds
    its node's name. Without ``taxonomy`` the folder tree's taxonomy is written beside the shards as
    ``taxonomy.json`` (what recipes name as ``taxonomy:``). Each shard is written under a temporary name and then
    linked into place, which fails rather than replace a shard; ``index.json`` lists the shards and their sample counts.

    Raises:
        FileExistsError: a shard (or ``index.json``) of that name exists in ``out_dir`` (naming it).
    """
    folder = HierImageFolder(src, taxonomy)
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1; got {shard_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples = folder.samples
    n = len(samples)
    if shuffle_seed is not None:
        samples = [samples[i] for i in np.random.default_rng(shuffle_seed).permutation(n)]
    names = [f"{prefix}-{i:06d}.tar" for i in range(-(-n // shard_size))]
    written = [INDEX_FILE] if taxonomy is not None else [INDEX_FILE, "taxonomy.json"]
    for name in [*names, *written]:
        if (out / name).exists():
            raise FileExistsError(f"{out / name} exists; 'hiercls data shard' never overwrites a shard")
    for i, name in enumerate(names):
        tmp = out / f".{name}.tmp"
        with tarfile.open(tmp, mode="w") as tar:
            for j, (path, node) in enumerate(samples[i * shard_size : (i + 1) * shard_size]):
                key = f"{i * shard_size + j:09d}"
                _add(tar, f"{key}{Path(path).suffix.lower()}", Path(path).read_bytes())
                _add(tar, f"{key}.cls", folder.taxonomy.name_of(node).encode("utf-8"))
        os.link(tmp, out / name)  # fails if the name appeared meanwhile: never replaces a shard
        tmp.unlink()
    if taxonomy is None:
        write_taxonomy(folder.taxonomy, out / "taxonomy.json")
    with atomic_write(out / INDEX_FILE, encoding="utf-8") as f:
        counts = [min(shard_size, n - i * shard_size) for i in range(len(names))]
        json.dump({"shards": [{"name": m, "samples": c} for m, c in zip(names, counts, strict=True)]}, f, indent=1)
    return [out / name for name in names]


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))
