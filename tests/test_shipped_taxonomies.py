"""The taxonomies shipped in taxonomies/: they load, and their counts are the published facts."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from hiercls.taxonomy import brats_regions, display_names_sha256, load_taxonomy, read_json, write_json

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "taxonomies").glob("*.json.gz"))
EXPECTED = {
    "imagenet1k",
    "imagenet1k_tree",
    "imagenet21k_winter21",
    "imagenet21k_fall11",
    "fashion_mnist",
    "cifar100",
    "brats",
    "wordnet_nouns",
}


def _build_script():
    spec = importlib.util.spec_from_file_location("build_taxonomies", ROOT / "scripts" / "build_taxonomies.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timm_list(filename: str) -> list[str]:
    import timm.data

    return (Path(timm.data.__file__).parent / "_info" / filename).read_text().split()


def test_every_expected_file_is_shipped_and_small():
    assert {p.name[: -len(".json.gz")] for p in SHIPPED} == EXPECTED
    assert sum(p.stat().st_size for p in SHIPPED) < 4_000_000


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_file_loads_and_metadata_is_consistent(path: Path):
    name = path.name[: -len(".json.gz")]
    tax = load_taxonomy(name)
    assert tax.name == name
    with gzip.open(path, "rt", encoding="utf-8") as f:
        stored = json.load(f)
    assert stored["fingerprint"] == tax.fingerprint == read_json(path).fingerprint
    assert stored["display_names_sha256"] == display_names_sha256(tax)  # a hand edit of a display name is caught
    meta = tax.metadata
    for key in ("source", "description", "license", "build_command", "counts"):
        assert meta.get(key), f"{name}: metadata lacks {key}"
    assert meta["build_command"] == f"python scripts/build_taxonomies.py --only {name}"
    stats = tax.stats()
    assert meta["counts"]["nodes"] == tax.num_nodes and meta["counts"]["leaves"] == tax.num_leaves
    assert meta["counts"]["nodes_per_depth"] == stats["nodes_per_depth"]
    assert meta["counts"]["classes_per_semantic_level"] == stats["classes_per_semantic_level"]


def test_imagenet1k():
    dag = load_taxonomy("imagenet1k")
    timm_1k = _timm_list("imagenet_synsets.txt")
    assert len(timm_1k) == 1000
    assert sorted(dag.name_of(i) for i in dag.leaves) == sorted(timm_1k)
    assert sorted(dag.names[i] for i in dag.classes) == sorted(timm_1k)
    assert dag.name_of(0) == "n00001740" and dag.display_names[0] == "entity"
    assert not dag.is_tree and dag.stats()["multi_parent_nodes"] == 75
    assert dag.num_nodes == 1860 and dag.height == 18
    tree = load_taxonomy("imagenet1k_tree")
    assert tree.is_tree and sorted(tree.name_of(i) for i in tree.leaves) == sorted(timm_1k)
    assert set(tree.edge_list(names=True)) <= set(dag.edge_list(names=True))
    assert tree.num_nodes == dag.num_nodes - len(tree.metadata["pruned_nodes"])
    # Familiar facts: tabby and tiger cat are domestic cats; tench and goldfish are cyprinids.
    assert tree.display_names[tree.lca(tree.index("n02123045"), tree.index("n02123159"))] == "domestic cat"
    assert tree.display_names[tree.lca(tree.index("n01440764"), tree.index("n01443537"))] == "cyprinid"


@pytest.mark.parametrize(
    ("version", "n", "per_level"),
    [
        ("winter21", 10450, [293, 1040, 1767, 2419, 2116, 1331, 710, 341, 212, 155, 60, 6]),
        ("fall11", 11221, [293, 1320, 2056, 2549, 2163, 1349, 716, 342, 212, 155, 60, 6]),
    ],
)
def test_imagenet21k_semantic_trees(version: str, n: int, per_level: list[int]):
    tax = load_taxonomy(f"imagenet21k_{version}")
    table = _timm_list("imagenet21k_miil_w21_synsets.txt" if version == "winter21" else "imagenet21k_miil_synsets.txt")
    assert len(table) == n
    assert tax.is_tree and tax.num_nodes == n + 1 and tax.virtual_root == "imagenet21k_root"
    assert sorted(tax.names[i] for i in tax.classes) == sorted(table)  # every node but the virtual root
    level = tax.semantic_level
    # Every node but the root is a class, so the semantic level is the depth minus one.
    assert (level[1:] == tax.depth[1:] - 1).all()
    assert np.bincount(level[1:]).tolist() == per_level and sum(per_level) == n
    # 12 levels 0..11; MIIL's semantic softmax uses levels 0..10 (range(max_depth)): the paper's 11 hierarchies.
    assert len(per_level) == 12


def test_cifar100():
    tax = load_taxonomy("cifar100")
    meta = tax.metadata
    fine = sorted(meta["fine_label_index"], key=meta["fine_label_index"].get)
    coarse = sorted(meta["coarse_label_index"], key=meta["coarse_label_index"].get)
    # CIFAR-100's label names are in alphabetical order, fine and coarse alike.
    assert fine == sorted(fine) and len(fine) == 100 and fine[0] == "apple" and fine[99] == "worm"
    assert coarse == sorted(coarse) and len(coarse) == 20
    assert tax.is_tree and tax.height == 2 and tax.num_leaves == 100
    assert [tax.name_of(c) for c in tax.children(0)] == coarse
    assert all(tax.num_children[tax.index(c)] == 5 for c in coarse)
    assert {tax.name_of(i) for i in tax.leaves} == set(fine)
    f2c = meta["fine_to_coarse_label"]
    for i, f in enumerate(fine):
        assert tax.name_of(tax.parent[tax.index(f)]) == coarse[f2c[i]]
    # The first training image is fine label 19 (cattle), coarse 11 (large omnivores and herbivores).
    assert fine[19] == "cattle" and f2c[19] == 11 and coarse[11] == "large_omnivores_and_herbivores"
    assert coarse[f2c[fine.index("beaver")]] == "aquatic_mammals"
    assert coarse[f2c[fine.index("lawn_mower")]] == "vehicles_2"


def test_fashion_mnist():
    tax = load_taxonomy("fashion_mnist")
    meta = tax.metadata
    assert meta["label_names"] == [
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
    ]
    index = meta["label_index"]
    assert sorted(index.values()) == list(range(10))
    assert {tax.name_of(i) for i in tax.leaves} == set(index)
    for name, label in index.items():
        assert tax.display_names[tax.index(name)] == meta["label_names"][label]
    groups = {tax.name_of(tax.path(tax.index(n))[1]) for n in index}
    assert groups == {"clothing", "footwear", "bags"}
    assert tax.name_of(tax.lca(tax.index("sandal"), tax.index("ankle_boot"))) == "footwear"
    assert tax.name_of(tax.lca(tax.index("coat"), tax.index("shirt"))) == "tops"
    assert tax.name_of(tax.lca(tax.index("trouser"), tax.index("dress"))) == "clothing"


def test_brats_chain():
    tax = load_taxonomy("brats")
    assert tax.names == ("root", "WT", "TC", "ET") and tax.is_tree and tax.height == 3
    assert tax.fingerprint == brats_regions().taxonomy.fingerprint
    assert tax.metadata["label_sets"] == [[1, 2, 4], [1, 4], [4]]


@pytest.mark.parametrize("name", ["cifar100", "fashion_mnist", "brats"])
def test_build_script_reproduces_small_files_byte_for_byte(name: str, tmp_path: Path):
    script = _build_script()
    path = tmp_path / f"{name}.json.gz"
    write_json(script.BUILDERS[name](), path)
    assert path.read_bytes() == (ROOT / "taxonomies" / f"{name}.json.gz").read_bytes()
