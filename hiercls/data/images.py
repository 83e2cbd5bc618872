"""Image datasets: folder trees (the folders are the taxonomy), flat folders + a taxonomy, Fashion-MNIST.

Every dataset yields ``(image, node_id)``. Without a ``transform`` the image is a float tensor ``[C, H, W]``
in ``[0, 1]``; with one, ``transform`` receives the RGB ``PIL.Image`` (Fashion-MNIST: ``L`` with ``rgb=False``).
:func:`image_transform` is the transform of a model (its timm preprocessing, after a colour-mode conversion).
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from hiercls._checks import check_choice
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.registry import load_taxonomy

logger = logging.getLogger(__name__)

__all__ = [
    "AUGMENT_OPTIONS",
    "FASHION_MNIST_CLASSES",
    "IMAGE_EXTENSIONS",
    "FashionMNIST",
    "HierImageFolder",
    "ImageModeTransform",
    "augment_options",
    "image_transform",
    "read_idx",
]

# What PIL raises for a corrupt file: OSError (UnidentifiedImageError, truncated data), and for some malformed
# headers ValueError, SyntaxError or a decompression-bomb error.
IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")

#: The ten Fashion-MNIST classes in label-index order (Xiao et al. 2017).
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"


def image_to_tensor(img: Any) -> torch.Tensor:
    """A PIL image (or ``[H, W(, C)]`` uint8 array) as a float ``[C, H, W]`` tensor in ``[0, 1]``."""
    arr = np.asarray(img)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))).float().div_(255.0)


def _is_image(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")


class HierImageFolder(Dataset):
    """Images in folders, labelled with the node of the folder they are in.

    Two layouts:

    * ``taxonomy=None`` (nested folders): the folder tree *is* the taxonomy. ``root`` is the root node, each
      sub-folder a node named by its path relative to ``root`` (``animal/cat``; display name ``cat``), and an
      image at any depth is labelled with its folder (an image in ``animal/`` is labelled ``animal``).
      The built taxonomy is :attr:`taxonomy`.
    * ``taxonomy`` given (flat or nested folders): every folder holding images must be a class of the taxonomy,
      matched by its path relative to ``root`` (so ``HierImageFolder(val_dir, train_set.taxonomy)`` reuses a
      nested train split's taxonomy) or else by its folder name; images are labelled with that node.

    Args:
        root: the top folder.
        taxonomy: the taxonomy for the second layout.
        transform: applied to the RGB ``PIL.Image``; without it images become ``[3, H, W]`` float tensors.
        name: name of the built taxonomy (default: the folder name).
        on_error: what a corrupt or unreadable image does: ``"fail"`` (default) raises an error naming the file
            when the image is loaded; ``"skip"`` checks every image up front (its header and structure, with
            ``PIL.Image.verify``), leaves out those that fail with one warning giving their number and the first
            of them, and replaces an image that still fails to decode later by the next readable one (warned once
            per process, with a count).

    Raises:
        FileNotFoundError: ``root`` is not a folder.
        TaxonomyError: a folder not in the taxonomy, images directly in ``root`` of a nested tree, no images.
        OSError: (``on_error="fail"``, on loading) a corrupt image, naming the file.

    Example:
        >>> import tempfile, PIL.Image
        >>> d = Path(tempfile.mkdtemp())
        >>> for sub in ("animal/cat", "animal/dog", "car"):
        ...     (d / sub).mkdir(parents=True)
        ...     PIL.Image.new("RGB", (4, 4)).save(d / sub / "x.png")
        >>> ds = HierImageFolder(d)
        >>> ds.taxonomy.names[1:]
        ('animal', 'animal/cat', 'animal/dog', 'car')
        >>> image, node = ds[0]
        >>> tuple(image.shape), ds.taxonomy.name_of(node)
        ((3, 4, 4), 'animal/cat')
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        taxonomy: Taxonomy | None = None,
        transform: Callable[[Any], Any] | None = None,
        *,
        name: str | None = None,
        on_error: str = "fail",
    ) -> None:
        self.on_error = check_choice(on_error, ("fail", "skip"), "on_error")
        self._skipped_at_load = 0
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder {str(self.root)!r} does not exist or is not a folder")
        self.transform = transform
        folders: dict[str, list[str]] = {}
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            rel = Path(dirpath).relative_to(self.root).as_posix()
            folders[rel] = sorted(f for f in filenames if _is_image(f))
        if taxonomy is None:
            self.taxonomy = self._folder_taxonomy(folders, name)
            label_of = {rel: self.taxonomy.index(rel) for rel in folders if rel != "."}
            if folders.get("."):
                raise TaxonomyError(
                    f"{len(folders['.'])} images (e.g. {folders['.'][0]!r}) sit directly in the "
                    "root folder, which is the taxonomy root and cannot be a label; move them into "
                    "a sub-folder",
                    source=str(self.root),
                )
        else:
            if not isinstance(taxonomy, Taxonomy):
                raise TypeError(f"taxonomy must be a hiercls Taxonomy or None; got {type(taxonomy).__name__}")
            self.taxonomy = taxonomy
            label_of = {}
            for rel, files in folders.items():
                if not files:
                    continue
                # A folder matches by its relative path (the names of a nested-folder taxonomy, so a val split can
                # reuse the train split's taxonomy) or else by its own name (flat folders).
                folder = rel if rel in taxonomy else (Path(rel).name if rel != "." else self.root.name)
                if folder not in taxonomy:
                    raise TaxonomyError(
                        f"folder {rel!r} holds {len(files)} images but {folder!r} is not a node of "
                        f"taxonomy {taxonomy.name!r}",
                        source=str(self.root / rel),
                        label=folder,
                    )
                node = taxonomy.index(folder)
                if not taxonomy.class_mask[node]:
                    raise TaxonomyError(
                        f"folder {rel!r}: node {folder!r} is not a class of taxonomy {taxonomy.name!r}",
                        source=str(self.root / rel),
                        label=folder,
                    )
                label_of[rel] = node
        self.samples: list[tuple[str, int]] = [
            (str(self.root / rel / f), label_of[rel]) for rel, files in folders.items() for f in files
        ]
        if self.on_error == "skip" and self.samples:
            self.samples = self._readable(self.samples)
        if not self.samples:
            raise TaxonomyError(
                f"no images ({', '.join(IMAGE_EXTENSIONS)}) found under {str(self.root)!r}", source=str(self.root)
            )
        self.targets = np.array([t for _, t in self.samples], dtype=np.int64)
        logger.info(
            "HierImageFolder %s: %d images, %d labels", self.root, len(self.samples), len(np.unique(self.targets))
        )

    def _folder_taxonomy(self, folders: Mapping[str, Sequence[str]], name: str | None) -> Taxonomy:
        root_name = self.root.resolve().name or "root"
        rels = [r for r in folders if r != "."]
        if not rels:
            raise TaxonomyError("a nested image folder needs sub-folders (the taxonomy nodes)", source=str(self.root))
        edges = [(root_name if "/" not in r else r.rsplit("/", 1)[0], r) for r in rels]
        if root_name in rels:  # a sub-folder path equal to the root's name would clash with it
            root_name = f"{root_name}:root"
            edges = [(root_name if "/" not in r else p, r) for (p, r) in edges]
        display = {r: r.rsplit("/", 1)[-1] for r in rels}
        return Taxonomy(
            edges,
            nodes=[root_name, *rels],
            display_names=display,
            name=name or self.root.name,
            metadata={"source": str(self.root), "kind": "image_folder"},
        )

    def __len__(self) -> int:
        return len(self.samples)

    def _readable(self, samples: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The samples whose image passes ``PIL.Image.verify``; one warning for those left out."""
        kept, bad = [], []
        for path, target in samples:
            try:
                with Image.open(path) as im:
                    im.verify()
            except IMAGE_ERRORS as err:
                bad.append((path, err))
                continue
            kept.append((path, target))
        if bad:
            logger.warning(
                "HierImageFolder %s: skipped %d unreadable image(s) of %d (on_error='skip'); first: %s (%s)",
                self.root,
                len(bad),
                len(samples),
                bad[0][0],
                bad[0][1],
            )
        return kept

    def _load(self, path: str) -> Any:
        try:
            with Image.open(path) as im:
                return im.convert("RGB")
        except IMAGE_ERRORS as err:
            raise OSError(f"cannot read image {path!r}: {type(err).__name__}: {err}") from err

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, target = self.samples[index]
        try:
            img = self._load(path)
        except OSError:
            if self.on_error == "fail":
                raise
            # Passed verify() but its pixel data is broken (e.g. truncated): the next readable image stands in.
            self._skipped_at_load += 1
            if self._skipped_at_load == 1:
                logger.warning("HierImageFolder %s: %s; using the next readable image instead", self.root, path)
            for step in range(1, len(self.samples)):
                path, target = self.samples[(index + step) % len(self.samples)]
                try:
                    img = self._load(path)
                    break
                except OSError:
                    self._skipped_at_load += 1
            else:
                raise OSError(f"no image under {str(self.root)!r} can be read") from None
        return (self.transform(img) if self.transform is not None else image_to_tensor(img)), target


def read_idx(path: str | os.PathLike[str], *, expected_dims: int | None = None) -> np.ndarray:
    """Read an IDX file (``.gz`` or plain) of unsigned bytes, checking its magic number and size.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "labels-idx1-ubyte"
        >>> _ = p.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
        >>> read_idx(p).tolist()
        [7, 8, 9]
    """
    path = Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(
            f"{str(path)!r} is not an IDX file of unsigned bytes (magic number "
            f"{raw[:4].hex() if len(raw) >= 4 else 'missing'}, expected 000008xx)"
        )
    ndim = raw[3]
    if expected_dims is not None and ndim != expected_dims:
        raise ValueError(f"{str(path)!r} has {ndim} dimensions (magic 0x{raw[:4].hex()}), expected {expected_dims}")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    offset = 4 + 4 * ndim
    if len(raw) - offset != int(np.prod(shape)):
        raise ValueError(
            f"{str(path)!r} is truncated or corrupt: header says shape {shape} "
            f"({int(np.prod(shape))} bytes) but {len(raw) - offset} bytes follow"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(shape)


def _fashion_label_nodes(taxonomy: Taxonomy) -> np.ndarray:
    """Node id of each Fashion-MNIST label index, from the taxonomy's metadata or its names."""
    meta = taxonomy.metadata
    for key in ("label_index", "label_indices", "labels", "classes", "class_index"):
        m = meta.get(key)
        if isinstance(m, Mapping) and len(m) == 10:
            items = list(m.items())
            # {"0": "t_shirt"} (index -> node) or {"t_shirt": 0} (node -> index)
            if all(str(k).isdigit() for k, _ in items):
                by_index = {int(k): str(v) for k, v in items}
            else:
                by_index = {int(v): str(k) for k, v in items}
            return np.array([taxonomy.index(by_index[i]) for i in range(10)], dtype=np.int64)
        if isinstance(m, Sequence) and not isinstance(m, str) and len(m) == 10:
            return np.array([taxonomy.index(str(v)) for v in m], dtype=np.int64)
    by_display = {d.lower(): i for i, d in enumerate(taxonomy.display_names)}
    by_name = {n.lower(): i for i, n in enumerate(taxonomy.names)}
    out = []
    for cls in FASHION_MNIST_CLASSES:
        node = by_name.get(cls.lower(), by_display.get(cls.lower()))
        if node is None:
            raise TaxonomyError(
                f"taxonomy {taxonomy.name!r} has no label-index mapping in its metadata "
                f"('label_index': {{'0': node, ...}}) and no node named {cls!r}",
                label=cls,
            )
        out.append(node)
    return np.array(out, dtype=np.int64)


def fashion_mnist_taxonomy() -> Taxonomy:
    """A small built-in Fashion-MNIST hierarchy (used when the shipped ``fashion_mnist`` taxonomy is absent).

    Example:
        >>> fashion_mnist_taxonomy().num_leaves
        10
    """
    edges = [
        ("fashion", "clothing"),
        ("clothing", "tops"),
        ("clothing", "bottoms"),
        ("fashion", "footwear"),
        ("fashion", "accessories"),
    ]
    edges += [("tops", c) for c in ("T-shirt/top", "Pullover", "Coat", "Shirt", "Dress")]
    edges += [("bottoms", "Trouser"), ("accessories", "Bag")]
    edges += [("footwear", c) for c in ("Sandal", "Sneaker", "Ankle boot")]
    return Taxonomy(
        edges,
        name="fashion_mnist_builtin",
        metadata={"label_index": {str(i): c for i, c in enumerate(FASHION_MNIST_CLASSES)}},
    )


def _default_fashion_taxonomy() -> Taxonomy:
    try:
        return load_taxonomy("fashion_mnist")
    except (FileNotFoundError, KeyError, TaxonomyError) as err:
        logger.warning("shipped fashion_mnist taxonomy unavailable (%s); using the built-in one", err)
    return fashion_mnist_taxonomy()


class FashionMNIST(Dataset):
    """Fashion-MNIST (60,000 train / 10,000 test 28x28 grey images) read from the Debian package's IDX files.

    Args:
        split: ``"train"`` or ``"test"``.
        root: folder of ``{train,t10k}-{images-idx3,labels-idx1}-ubyte(.gz)``.
        taxonomy: hierarchy over the 10 classes; label index ``i`` maps to a node through
            ``taxonomy.metadata["label_index"]`` (``{"0": node_name, ...}``) or, without it, the node whose
            name/display name is the class name. Default: the shipped ``fashion_mnist`` taxonomy
            (``hiercls.taxonomy.load_taxonomy``), else :func:`fashion_mnist_taxonomy`.
        transform: applied to the ``PIL.Image``; without it images are float tensors in ``[0, 1]``.
        rgb: give 3-channel images (RGB ``PIL.Image`` / ``[3, 28, 28]``), what ImageNet backbones and their
            timm transforms expect; ``False``: the grey ``L`` image / ``[1, 28, 28]``.

    Attributes:
        images: ``uint8 [n, 28, 28]``; labels: the raw label indices; targets: node ids.

    Raises:
        FileNotFoundError: the files are missing (install the Debian package ``dataset-fashion-mnist``).
        ValueError: a corrupt file (bad magic number or size) or mismatched image/label counts.
    """

    FILES: ClassVar[dict[str, tuple[str, str]]] = {
        "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
        "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    }
    #: A validation split carved from the training file, so that checkpoints are chosen without the test set:
    #: ``train_fit`` = its first 50,000 images, ``val`` = the last 10,000 (the file's order, fixed).
    HELD_OUT: ClassVar[dict[str, slice]] = {"train_fit": slice(0, 50_000), "val": slice(50_000, None)}

    def __init__(
        self,
        split: str = "train",
        root: str | os.PathLike[str] = FASHION_MNIST_ROOT,
        taxonomy: Taxonomy | None = None,
        transform: Callable[[Any], Any] | None = None,
        *,
        rgb: bool = True,
    ) -> None:
        if split not in (*self.FILES, *self.HELD_OUT):
            raise ValueError(f"split must be 'train', 'test', 'train_fit' or 'val'; got {split!r}")
        root = Path(root)
        paths = []
        for stem in self.FILES["train" if split in self.HELD_OUT else split]:
            cands = [root / (stem + ".gz"), root / stem]
            found = next((p for p in cands if p.is_file()), None)
            if found is None:
                raise FileNotFoundError(
                    f"Fashion-MNIST file {str(cands[0])!r} not found; install the Debian package "
                    f"'dataset-fashion-mnist' (apt-get install dataset-fashion-mnist) or pass "
                    f"root= the folder holding the IDX files"
                )
            paths.append(found)
        self.split, self.root, self.transform, self.rgb = split, root, transform, bool(rgb)
        self.images = read_idx(paths[0], expected_dims=3)
        self.labels = read_idx(paths[1], expected_dims=1).astype(np.int64)
        if len(self.images) != len(self.labels):
            raise ValueError(
                f"{str(paths[0])!r} has {len(self.images)} images but {str(paths[1])!r} has {len(self.labels)} labels"
            )
        if split in self.HELD_OUT:
            part = self.HELD_OUT[split]
            self.images, self.labels = self.images[part], self.labels[part]
        if self.labels.size and self.labels.max() > 9:
            raise ValueError(f"{str(paths[1])!r} has label {int(self.labels.max())}; Fashion-MNIST labels are 0..9")
        self.taxonomy = taxonomy if taxonomy is not None else _default_fashion_taxonomy()
        self.label_nodes = _fashion_label_nodes(self.taxonomy)
        self.targets = self.label_nodes[self.labels]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        arr = self.images[index]
        target = int(self.targets[index])
        if self.transform is not None:
            img = Image.fromarray(arr)  # 2-D uint8 -> mode "L"
            return self.transform(img.convert("RGB") if self.rgb else img), target
        x = torch.from_numpy(arr.astype(np.float32) / 255.0)[None]
        return (x.expand(3, -1, -1).contiguous() if self.rgb else x), target


class ImageModeTransform:
    """Convert PIL images to the colour mode the backbone expects before its transform (grey -> RGB).

    Fashion-MNIST images are greyscale while ImageNet backbones take 3 channels; timm's transforms do not
    convert modes. A module-level class, so that DataLoader workers can pickle it.
    """

    def __init__(self, transform: Callable[[Any], Any], mode: str = "RGB") -> None:
        self.transform, self.mode = transform, mode

    def __call__(self, image: Any) -> Any:
        if hasattr(image, "mode") and image.mode != self.mode:
            image = image.convert(self.mode)
        return self.transform(image)

    def __repr__(self) -> str:
        return f"ImageModeTransform({self.mode}, {self.transform!r})"


#: The options of ``data.augment``: keyword arguments of timm's ``create_transform`` (same names and meaning).
AUGMENT_OPTIONS = (
    "auto_augment",
    "re_prob",
    "re_mode",
    "re_count",
    "interpolation",
    "crop_pct",
    "crop_mode",
    "scale",
    "ratio",
    "hflip",
    "vflip",
    "color_jitter",
)
#: The options timm's evaluation transform reads (``crop_pct`` and ``crop_mode`` are inference settings in timm;
#: its train transform ignores them), applied to the evaluation transform as timm's ``train.py`` does.
EVAL_AUGMENT_OPTIONS = ("interpolation", "crop_pct", "crop_mode")


def augment_options(augment: bool | Mapping[str, Any] | None) -> dict[str, Any]:
    """The checked ``create_transform`` options of a ``data.augment`` value (``True``/``False``/``None``: none).

    Lists (``scale``, ``ratio``, ``color_jitter`` from YAML) become tuples.

    Raises:
        ValueError: an option not in :data:`AUGMENT_OPTIONS` (naming it and the valid ones), or a value that is
            neither a bool nor a mapping.

    Example:
        >>> augment_options({"re_prob": 0.25, "scale": [0.5, 1.0]})
        {'re_prob': 0.25, 'scale': (0.5, 1.0)}
        >>> try:
        ...     augment_options({"cutout": 1})
        ... except ValueError as err:
        ...     print(str(err)[:60])
        data.augment: unknown option 'cutout'; valid options (timm's
    """
    if augment is None or isinstance(augment, bool):
        return {}
    if not isinstance(augment, Mapping):
        raise ValueError(f"data.augment: expected true, false or a mapping of options, got {augment!r}")
    for key in augment:
        if key not in AUGMENT_OPTIONS:
            raise ValueError(
                f"data.augment: unknown option {key!r}; valid options (timm's create_transform): "
                + ", ".join(AUGMENT_OPTIONS)
            )
    return {k: tuple(v) if isinstance(v, list) else v for k, v in augment.items()}


def image_transform(
    model: Any, *, train: bool, image_size: int | None, augment: bool | Mapping[str, Any] | None = None
) -> Any:
    """The model's timm transform for ``train``/eval at ``image_size``, preceded by a colour-mode conversion.

    Args:
        model: a hiercls model (its ``transform``).
        train: build the augmenting train transform (unless ``augment`` is ``False``).
        image_size: the input size (default: the backbone's).
        augment: ``data.augment``: ``False`` (the eval transform even for training), ``True``/``None`` (timm's
            default train augmentation), or a mapping of :data:`AUGMENT_OPTIONS` passed to timm's
            ``create_transform``: all of them to the train transform, :data:`EVAL_AUGMENT_OPTIONS` also to the
            evaluation transform.

    Returns ``None`` for models without image preprocessing (``model.modality`` ``"text"`` or ``"volume"``).
    """
    if getattr(model, "modality", None) != "image" or not hasattr(model, "transform"):
        return None
    options = augment_options(augment)
    train = bool(train) and augment is not False
    if not train:
        options = {k: v for k, v in options.items() if k in EVAL_AUGMENT_OPTIONS}
    transform = model.transform(train=train, image_size=image_size, **options)
    channels = 3
    with contextlib.suppress(AttributeError, KeyError, TypeError, ValueError):
        channels = int(model.data_config(image_size)["input_size"][0])
    return ImageModeTransform(transform, "RGB" if channels == 3 else "L")
