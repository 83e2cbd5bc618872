#!/usr/bin/env python
"""Rebuild every taxonomy shipped in ``taxonomies/`` (deterministic: a re-run gives byte-identical files).

Usage::

    python scripts/build_taxonomies.py                 # all of them into taxonomies/
    python scripts/build_taxonomies.py --only cifar100 fashion_mnist
    python scripts/build_taxonomies.py --check         # rebuild in memory, fail if a shipped file differs

ImageNet and WordNet builds need the WordNet 3.0 Debian files (``apt-get install wordnet-base
wordnet-sense-index``); CIFAR-100, Fashion-MNIST and BraTS need nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hiercls.taxonomy import Taxonomy, brats_regions, write_json

logger = logging.getLogger("build_taxonomies")

ROOT = Path(__file__).resolve().parents[1]
BUILD_COMMAND = "python scripts/build_taxonomies.py"
WORDNET_LICENSE = (
    "WordNet 3.0 (c) 2006 Princeton University, WordNet license (BSD-style, attribution required: "
    "https://wordnet.princeton.edu/license-and-commercial-use)"
)

# CIFAR-100 fine labels in label order 0..99 and the 20 coarse labels 0..19 with their 5 fine classes each
# (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny Images"; the dataset's meta file).
CIFAR100_FINE = (
    "apple",
    "aquarium_fish",
    "baby",
    "bear",
    "beaver",
    "bed",
    "bee",
    "beetle",
    "bicycle",
    "bottle",
    "bowl",
    "boy",
    "bridge",
    "bus",
    "butterfly",
    "camel",
    "can",
    "castle",
    "caterpillar",
    "cattle",
    "chair",
    "chimpanzee",
    "clock",
    "cloud",
    "cockroach",
    "couch",
    "crab",
    "crocodile",
    "cup",
    "dinosaur",
    "dolphin",
    "elephant",
    "flatfish",
    "forest",
    "fox",
    "girl",
    "hamster",
    "house",
    "kangaroo",
    "keyboard",
    "lamp",
    "lawn_mower",
    "leopard",
    "lion",
    "lizard",
    "lobster",
    "man",
    "maple_tree",
    "motorcycle",
    "mountain",
    "mouse",
    "mushroom",
    "oak_tree",
    "orange",
    "orchid",
    "otter",
    "palm_tree",
    "pear",
    "pickup_truck",
    "pine_tree",
    "plain",
    "plate",
    "poppy",
    "porcupine",
    "possum",
    "rabbit",
    "raccoon",
    "ray",
    "road",
    "rocket",
    "rose",
    "sea",
    "seal",
    "shark",
    "shrew",
    "skunk",
    "skyscraper",
    "snail",
    "snake",
    "spider",
    "squirrel",
    "streetcar",
    "sunflower",
    "sweet_pepper",
    "table",
    "tank",
    "telephone",
    "television",
    "tiger",
    "tractor",
    "train",
    "trout",
    "tulip",
    "turtle",
    "wardrobe",
    "whale",
    "willow_tree",
    "wolf",
    "woman",
    "worm",
)
CIFAR100_COARSE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("aquatic_mammals", ("beaver", "dolphin", "otter", "seal", "whale")),
    ("fish", ("aquarium_fish", "flatfish", "ray", "shark", "trout")),
    ("flowers", ("orchid", "poppy", "rose", "sunflower", "tulip")),
    ("food_containers", ("bottle", "bowl", "can", "cup", "plate")),
    ("fruit_and_vegetables", ("apple", "mushroom", "orange", "pear", "sweet_pepper")),
    ("household_electrical_devices", ("clock", "keyboard", "lamp", "telephone", "television")),
    ("household_furniture", ("bed", "chair", "couch", "table", "wardrobe")),
    ("insects", ("bee", "beetle", "butterfly", "caterpillar", "cockroach")),
    ("large_carnivores", ("bear", "leopard", "lion", "tiger", "wolf")),
    ("large_man-made_outdoor_things", ("bridge", "castle", "house", "road", "skyscraper")),
    ("large_natural_outdoor_scenes", ("cloud", "forest", "mountain", "plain", "sea")),
    ("large_omnivores_and_herbivores", ("camel", "cattle", "chimpanzee", "elephant", "kangaroo")),
    ("medium_mammals", ("fox", "porcupine", "possum", "raccoon", "skunk")),
    ("non-insect_invertebrates", ("crab", "lobster", "snail", "spider", "worm")),
    ("people", ("baby", "boy", "girl", "man", "woman")),
    ("reptiles", ("crocodile", "dinosaur", "lizard", "snake", "turtle")),
    ("small_mammals", ("hamster", "mouse", "rabbit", "shrew", "squirrel")),
    ("trees", ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree")),
    ("vehicles_1", ("bicycle", "bus", "motorcycle", "pickup_truck", "train")),
    ("vehicles_2", ("lawn_mower", "rocket", "streetcar", "tank", "tractor")),
)

# Fashion-MNIST (Xiao et al. 2017) labels 0..9: (node name, the dataset's class name).
FASHION_MNIST_LABELS = (
    ("t-shirt_top", "T-shirt/top"),
    ("trouser", "Trouser"),
    ("pullover", "Pullover"),
    ("dress", "Dress"),
    ("coat", "Coat"),
    ("sandal", "Sandal"),
    ("shirt", "Shirt"),
    ("sneaker", "Sneaker"),
    ("bag", "Bag"),
    ("ankle_boot", "Ankle boot"),
)
# A 3-level grouping: clothing by body part, footwear, bags.
FASHION_MNIST_GROUPS: tuple[tuple[str, str], ...] = (
    ("root", "clothing"),
    ("clothing", "tops"),
    ("tops", "t-shirt_top"),
    ("tops", "pullover"),
    ("tops", "shirt"),
    ("tops", "coat"),
    ("clothing", "bottoms"),
    ("bottoms", "trouser"),
    ("clothing", "dresses"),
    ("dresses", "dress"),
    ("root", "footwear"),
    ("footwear", "sandal"),
    ("footwear", "sneaker"),
    ("footwear", "ankle_boot"),
    ("root", "bags"),
    ("bags", "bag"),
)


def counts(tax: Taxonomy) -> dict[str, Any]:
    """The counts recorded in each file's metadata (and in taxonomies/README.md)."""
    s = tax.stats()
    return {
        "nodes": s["nodes"],
        "edges": s["edges"],
        "leaves": s["leaves"],
        "classes": s["classes"],
        "height": s["height"],
        "nodes_per_depth": s["nodes_per_depth"],
        "multi_parent_nodes": s["multi_parent_nodes"],
        "semantic_levels": s["semantic_levels"],
        "classes_per_semantic_level": s["classes_per_semantic_level"],
    }


def finish(
    tax: Taxonomy, name: str, description: str, source: str, license_note: str, extra: dict[str, Any] | None = None
) -> Taxonomy:
    return tax.replace(
        name=name,
        metadata={
            **tax.metadata,
            **(extra or {}),
            "name": name,
            "description": description,
            "source": source,
            "license": license_note,
            "build_command": f"{BUILD_COMMAND} --only {name}",
            "counts": counts(tax),
        },
    )


def build_cifar100() -> Taxonomy:
    fine_index = {n: i for i, n in enumerate(CIFAR100_FINE)}
    edges = [("root", coarse) for coarse, _ in CIFAR100_COARSE]
    edges += [(coarse, fine) for coarse, fines in CIFAR100_COARSE for fine in fines]
    nodes = ["root", *(c for c, _ in CIFAR100_COARSE), *CIFAR100_FINE]
    tax = Taxonomy(edges, nodes=nodes, display_names={n: n.replace("_", " ") for n in nodes if n != "root"})
    fine_to_coarse = {fine: i for i, (_, fines) in enumerate(CIFAR100_COARSE) for fine in fines}
    return finish(
        tax,
        "cifar100",
        "CIFAR-100: 20 superclasses x 5 classes (the dataset's coarse/fine labels)",
        "CIFAR-100 (Krizhevsky 2009), label names and coarse grouping from the dataset's meta file",
        "label names are facts of the CIFAR-100 dataset (no images are shipped)",
        {
            "fine_label_index": fine_index,
            "coarse_label_index": {c: i for i, (c, _) in enumerate(CIFAR100_COARSE)},
            "fine_to_coarse_label": [fine_to_coarse[f] for f in CIFAR100_FINE],
        },
    )


def build_fashion_mnist() -> Taxonomy:
    names = [n for n, _ in FASHION_MNIST_LABELS]
    nodes = ["root", "clothing", "tops", "bottoms", "dresses", "footwear", "bags"]
    disp = {n: label for n, label in FASHION_MNIST_LABELS}
    disp.update({"tops": "tops", "bottoms": "bottoms", "dresses": "dresses"})
    order = {n: i for i, n in enumerate(nodes + names)}
    edges = sorted(FASHION_MNIST_GROUPS, key=lambda e: (order[e[0]], order[e[1]]))
    tax = Taxonomy(edges, nodes=nodes + names, display_names=disp)
    return finish(
        tax,
        "fashion_mnist",
        "Fashion-MNIST's 10 classes grouped into clothing (tops / bottoms / dresses), footwear and bags",
        "Fashion-MNIST (Xiao, Rasul, Vollgraf 2017) label indices 0..9; grouping by hiercls",
        "label names are facts of the Fashion-MNIST dataset (MIT license)",
        {
            "label_index": {n: i for i, n in enumerate(names)},
            "label_names": [label for _, label in FASHION_MNIST_LABELS],
        },
    )


def build_brats() -> Taxonomy:
    regions = brats_regions()
    tax = regions.taxonomy() if callable(regions.taxonomy) else regions.taxonomy
    return finish(
        tax,
        "brats",
        "BraTS nested tumour regions: whole tumour > tumour core > enhancing tumour (2021 labels: ET = 4)",
        "BraTS challenge region definitions (Menze et al. 2015; Baid et al. 2021)",
        "region definitions are facts of the BraTS challenge",
    )


def build_imagenet1k() -> Taxonomy:
    from hiercls.taxonomy.imagenet import imagenet1k_taxonomy

    tax = imagenet1k_taxonomy("dag")
    return finish(
        tax,
        "imagenet1k",
        "WordNet 3.0 hypernym DAG above the 1,000 ImageNet-1K classes (all hypernyms "
        "kept, WordNet order); leaves = the 1,000 classes",
        tax.metadata["source"],
        WORDNET_LICENSE,
    )


def build_imagenet1k_tree() -> Taxonomy:
    from hiercls.taxonomy.imagenet import imagenet1k_taxonomy

    tax = imagenet1k_taxonomy("tree")
    return finish(
        tax,
        "imagenet1k_tree",
        "Tree form of imagenet1k: each synset keeps its first WordNet hypernym "
        "(to_tree('first')); synsets left without classes pruned (metadata: dropped_edges, pruned_nodes)",
        tax.metadata["source"],
        WORDNET_LICENSE,
    )


def _build_21k(version: str) -> Taxonomy:
    from hiercls.taxonomy.imagenet import imagenet21k_taxonomy

    tax = imagenet21k_taxonomy(version)  # type: ignore[arg-type]
    n = len(tax.classes)
    return finish(
        tax,
        f"imagenet21k_{version}",
        f"ImageNet-21K-P {version} semantic tree ({n:,} classes; Ridnik et "
        "al. 2021): parent = nearest class on the WordNet first-hypernym chain, virtual root above; "
        "semantic_level = MIIL hierarchy level",
        tax.metadata["source"],
        WORDNET_LICENSE,
    )


def build_wordnet_nouns() -> Taxonomy:
    from hiercls.taxonomy.wordnet import wordnet_taxonomy

    tax = wordnet_taxonomy(include_instances=True)
    return finish(
        tax,
        "wordnet_nouns",
        "All 82,115 WordNet 3.0 noun synsets: hypernym and instance-hypernym DAG rooted at entity.n.01 (n00001740)",
        tax.metadata["source"],
        WORDNET_LICENSE,
    )


BUILDERS: dict[str, Callable[[], Taxonomy]] = {
    "cifar100": build_cifar100,
    "fashion_mnist": build_fashion_mnist,
    "brats": build_brats,
    "imagenet1k": build_imagenet1k,
    "imagenet1k_tree": build_imagenet1k_tree,
    "imagenet21k_winter21": lambda: _build_21k("winter21"),
    "imagenet21k_fall11": lambda: _build_21k("fall11"),
    "wordnet_nouns": build_wordnet_nouns,
}
MAX_BYTES = 3_000_000  # the brief for shipping: a taxonomy over this stays on-demand


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(BUILDERS), help="build only these")
    parser.add_argument("--out", type=Path, default=ROOT / "taxonomies", help="output folder (default: taxonomies/)")
    parser.add_argument("--check", action="store_true", help="build into a temporary folder and compare with --out")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = args.only or list(BUILDERS)
    out = Path(tempfile.mkdtemp()) if args.check else args.out
    out.mkdir(parents=True, exist_ok=True)
    failures = 0
    for name in names:
        tax = BUILDERS[name]()
        path = out / f"{name}.json.gz"
        write_json(tax, path)
        size = path.stat().st_size
        if size > MAX_BYTES:
            logger.warning("%s: %d bytes > %d, not shipped (build it with wordnet_taxonomy())", name, size, MAX_BYTES)
            path.unlink()
            continue
        c = tax.metadata["counts"]
        logger.info(
            "%s: %d nodes, %d leaves, height %d, %d bytes, fingerprint %s",
            name,
            c["nodes"],
            c["leaves"],
            c["height"],
            size,
            tax.fingerprint[:12],
        )
        if args.check:
            shipped = args.out / path.name
            if not shipped.exists() or shipped.read_bytes() != path.read_bytes():
                logger.error("%s differs from the shipped %s", path.name, shipped)
                failures += 1
    return 1 if failures else 0


def load_counts(path: Path) -> dict[str, Any]:
    """Counts stored in a shipped file's metadata (used to write taxonomies/README.md by hand)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["metadata"]["counts"]


if __name__ == "__main__":
    sys.exit(main())
