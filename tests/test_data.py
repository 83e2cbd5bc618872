"""Tests of hiercls.data: label encoding, image/text datasets, Fashion-MNIST, the WordNet gloss set, the sampler,
the dataset registry and the synthetic sets."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hiercls.data import (
    DATASETS,
    FASHION_MNIST_CLASSES,
    FashionMNIST,
    HierImageFolder,
    HierTextDataset,
    ImageModeTransform,
    LabelEncoder,
    NestedBlobs3D,
    ResumableDistributedSampler,
    SyntheticHierarchy,
    build_dataset,
    dataset_taxonomy,
    fashion_mnist_taxonomy,
    gloss_split_of,
    image_transform,
    list_datasets,
    load_timm_glosses,
    make_loader,
    nested_blobs_taxonomy,
    read_idx,
    register_dataset,
    subsample,
    wordnet_gloss_dataset,
)
from hiercls.taxonomy import Taxonomy, TaxonomyError

FASHION_ROOT = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture(scope="module")
def tax() -> Taxonomy:
    return Taxonomy(
        [
            ("root", "animal"),
            ("animal", "cat"),
            ("animal", "dog"),
            ("root", "vehicle"),
            ("vehicle", "car"),
            ("vehicle", "bike"),
        ],
        name="toy",
    )


# ---------------------------------------------------------------------------------------------- LabelEncoder
def test_label_encoder_formats(tax: Taxonomy) -> None:
    enc = LabelEncoder(tax)
    cat = tax.index("cat")
    assert enc.encode("cat") == cat
    for path in ("cat", "animal/cat", "root/animal/cat", "/animal/cat/", " animal / cat "):
        assert enc.encode(path, "path") == cat
    assert enc.encode(str(cat), "id") == cat and enc.encode(cat, "id") == cat
    assert enc.encode("vehicle", "path") == tax.index("vehicle")  # internal-node labels are allowed
    assert LabelEncoder(tax, separator=">").encode("vehicle>car", "path") == tax.index("car")
    assert [enc.encode(enc.path_of(n), "path") for n in range(1, tax.num_nodes)] == list(range(1, tax.num_nodes))


@pytest.mark.parametrize(
    ("label", "fmt", "needle"),
    [
        ("vehicle/cat", "path", "'cat' is not a child of 'vehicle'"),
        ("animal/kat", "path", "unknown label 'kat'"),
        ("animal//cat", "path", "empty component"),
        ("kitten", "name", "unknown label 'kitten'"),
        ("99", "id", "out of range"),
        ("x1", "id", "not an integer"),
        ("root", "name", "not a class"),
    ],
)
def test_label_encoder_errors_name_label_and_location(tax: Taxonomy, label: str, fmt: str, needle: str) -> None:
    with pytest.raises(TaxonomyError, match=needle) as err:
        LabelEncoder(tax).encode(label, fmt, source="data.csv", line=7)  # type: ignore[arg-type]
    assert str(err.value).startswith("data.csv:7: ")


def test_label_encoder_bad_format(tax: Taxonomy) -> None:
    with pytest.raises(ValueError, match="label_format"):
        LabelEncoder(tax).encode("cat", "slug")  # type: ignore[arg-type]


def test_multi_hot_is_ancestor_closed_brute_force() -> None:
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x"), ("x", "y"), ("b", "z")])
    enc = LabelEncoder(dag)
    sets = [[dag.index("y")], [dag.index("z"), dag.index("a")], []]
    got = enc.multi_hot(sets).numpy()
    # brute force: walk parents upwards
    want = np.zeros_like(got)
    for b, nodes in enumerate(sets):
        stack = list(nodes)
        while stack:
            n = stack.pop()
            want[b, n] = 1
            stack.extend(dag.parents(n))
    np.testing.assert_array_equal(got, want)
    assert got[0, dag.index("b")] == 1 and got[0, dag.index("z")] == 0  # both parents of x, not the sibling
    with pytest.raises(TaxonomyError, match="out of range"):
        enc.multi_hot([[17]])


# ---------------------------------------------------------------------------------------------- image folders
def _png(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (6, 5)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def test_nested_image_folder_builds_taxonomy(tmp_path: Path) -> None:
    _png(tmp_path / "animal" / "cat" / "a.png", (255, 0, 0))
    _png(tmp_path / "animal" / "cat" / "b.jpg", (0, 255, 0))
    _png(tmp_path / "animal" / "dog" / "c.png", (0, 0, 255))
    _png(tmp_path / "animal" / "generic.png", (9, 9, 9))  # labelled with the internal node
    _png(tmp_path / "plant" / "tree" / "oak" / "d.png", (1, 2, 3))
    (tmp_path / "animal" / "notes.txt").write_text("not an image")
    (tmp_path / ".hidden").mkdir()
    ds = HierImageFolder(tmp_path)
    tx = ds.taxonomy
    assert tx.names[1:] == ("animal", "animal/cat", "animal/dog", "plant", "plant/tree", "plant/tree/oak")
    assert tx.display_names[1:] == ("animal", "cat", "dog", "plant", "tree", "oak")
    assert tx.name_of(tx.parent[tx.index("plant/tree/oak")]) == "plant/tree"
    assert len(ds) == 5
    labels = {Path(p).name: tx.name_of(t) for p, t in ds.samples}
    assert labels == {
        "a.png": "animal/cat",
        "b.jpg": "animal/cat",
        "c.png": "animal/dog",
        "generic.png": "animal",
        "d.png": "plant/tree/oak",
    }
    img, node = ds[[Path(p).name for p, _ in ds.samples].index("a.png")]
    assert img.shape == (3, 5, 6) and img.dtype == torch.float32
    assert torch.allclose(img[0], torch.ones(5, 6)) and float(img[1:].abs().max()) == 0.0
    assert tx.name_of(node) == "animal/cat"
    ds2 = HierImageFolder(tmp_path, transform=lambda im: im.size)
    assert ds2[0][0] == (6, 5)
    # a validation split with fewer folders reuses the train split's taxonomy (matched by relative path)
    val = tmp_path.parent / (tmp_path.name + "_val")
    _png(val / "plant" / "tree" / "oak" / "e.png", (1, 1, 1))
    vds = HierImageFolder(val, taxonomy=tx)
    assert vds.taxonomy is tx and [tx.name_of(t) for t in vds.targets] == ["plant/tree/oak"]


def test_nested_image_folder_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        HierImageFolder(tmp_path / "nope")
    _png(tmp_path / "stray.png", (0, 0, 0))
    _png(tmp_path / "a" / "x.png", (0, 0, 0))
    with pytest.raises(TaxonomyError, match="directly in the root folder"):
        HierImageFolder(tmp_path)
    empty = tmp_path / "empty"
    (empty / "a").mkdir(parents=True)
    with pytest.raises(TaxonomyError, match="no images"):
        HierImageFolder(empty)


def test_flat_image_folder_with_taxonomy(tmp_path: Path, tax: Taxonomy) -> None:
    for i, name in enumerate(["cat", "dog", "car"]):
        _png(tmp_path / name / f"{i}.png", (i, i, i))
    ds = HierImageFolder(tmp_path, taxonomy=tax)
    assert ds.taxonomy is tax
    assert sorted(tax.name_of(t) for t in ds.targets) == ["car", "cat", "dog"]
    _png(tmp_path / "boat" / "z.png", (0, 0, 0))
    with pytest.raises(TaxonomyError, match="folder 'boat' holds 1 images but 'boat' is not a node"):
        HierImageFolder(tmp_path, taxonomy=tax)


# ---------------------------------------------------------------------------------------------- text files
def test_csv_reader_quotes_lines_and_formats(tmp_path: Path, tax: Taxonomy) -> None:
    p = tmp_path / "d.csv"
    p.write_text(
        'id,text,label\n1,"purrs, meows",animal/cat\n2,"two\nlines",vehicle\n\n3,barks,dog\n', encoding="utf-8"
    )
    ds = HierTextDataset.from_csv(p, "text", "label", tax)
    assert ds.texts == ["purrs, meows", "two\nlines", "barks"]
    assert [tax.name_of(t) for t in ds.targets] == ["cat", "vehicle", "dog"]
    assert ds[2] == ("barks", tax.index("dog"))
    ids = tmp_path / "ids.tsv"
    ids.write_text(f"text\tnode\nfoo\t{tax.index('car')}\n")
    assert HierTextDataset.from_csv(ids, "text", "node", tax, label_format="id", delimiter="\t").targets.tolist() == [
        tax.index("car")
    ]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('text,label\nok,cat\n"multi\nline",cat\nbad,vehicle/cat\n', r"d\.csv:5: .*'cat' is not a child of 'vehicle'"),
        ("text,label\nok,cat\nnope,kitten\n", r"d\.csv:3: unknown label 'kitten'"),
        ("text,label\nok,cat,extra\n", r"d\.csv:2: 3 fields but the header has 2"),
        ("text,label\n,cat\n", r"d\.csv:2: empty text"),
        ("text,label\nhello,\n", r"d\.csv:2: empty label"),
        ("words,label\nhello,cat\n", r"d\.csv:1: no column 'text'"),
        ("", r"d\.csv: empty file"),
        ("text,label\n", r"d\.csv: no samples"),
    ],
)
def test_csv_reader_errors(tmp_path: Path, tax: Taxonomy, body: str, needle: str) -> None:
    p = tmp_path / "d.csv"
    p.write_text(body)
    with pytest.raises(ValueError, match=needle):
        HierTextDataset.from_csv(p, "text", "label", tax, label_format="path")


def test_jsonl_reader(tmp_path: Path, tax: Taxonomy) -> None:
    p = tmp_path / "d.jsonl"
    rows = [{"t": "purrs", "y": ["animal", "cat"]}, {"t": "wheels", "y": "vehicle/bike"}]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    ds = HierTextDataset.from_jsonl(p, "t", "y", tax)
    assert [tax.name_of(t) for t in ds.targets] == ["cat", "bike"]
    q = tmp_path / "ids.jsonl.gz"
    with gzip.open(q, "wt") as f:
        f.write(json.dumps({"t": "x", "y": tax.index("dog")}) + "\n")
    assert HierTextDataset.from_jsonl(q, "t", "y", tax, label_format="id").targets.tolist() == [tax.index("dog")]


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (['{"t": "a", "y": "cat"}', '{"t": "b", "y": "cat"'], r"d\.jsonl:2: invalid JSON"),
        (['{"t": "a", "y": "cat"}', "[1, 2]"], r"d\.jsonl:2: expected a JSON object"),
        (['{"t": "a"}'], r"d\.jsonl:1: no key 'y'"),
        (['{"t": 5, "y": "cat"}'], r"d\.jsonl:1: 't' must be a string"),
        (
            ['{"t": "a", "y": "cat"}', '{"t": "b", "y": "animal/car"}'],
            r"d\.jsonl:2: .*'car' is not a child of 'animal'",
        ),
        (['{"t": "a", "y": null}'], r"d\.jsonl:1: 'y' must be a string or an integer"),
    ],
)
def test_jsonl_reader_errors(tmp_path: Path, tax: Taxonomy, lines: list[str], needle: str) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=needle):
        HierTextDataset.from_jsonl(p, "t", "y", tax)


def test_text_reader_missing_file(tmp_path: Path, tax: Taxonomy) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.csv"):
        HierTextDataset.from_csv(tmp_path / "missing.csv", "text", "label", tax)


# ---------------------------------------------------------------------------------------------- IDX / Fashion-MNIST
def test_read_idx_checks_magic_and_size(tmp_path: Path) -> None:
    good = tmp_path / "x-idx3-ubyte.gz"
    arr = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    header = bytes([0, 0, 8, 3]) + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    good.write_bytes(gzip.compress(header + arr.tobytes()))
    np.testing.assert_array_equal(read_idx(good, expected_dims=3), arr)
    with pytest.raises(ValueError, match=r"3 dimensions .* expected 1"):
        read_idx(good, expected_dims=1)
    bad = tmp_path / "bad"
    bad.write_bytes(bytes([0, 0, 9, 1, 0, 0, 0, 1, 5]))
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(bad)
    short = tmp_path / "short"
    short.write_bytes(header + arr.tobytes()[:-1])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(short)


def test_fashion_mnist_missing_names_debian_package(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        FashionMNIST("train", root=tmp_path)
    with pytest.raises(ValueError, match="split"):
        FashionMNIST("valid", root=tmp_path)


@pytest.mark.skipif(not FASHION_ROOT.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_counts_and_label_mapping() -> None:
    tx = fashion_mnist_taxonomy()
    train = FashionMNIST("train", taxonomy=tx)
    test = FashionMNIST("test", taxonomy=tx)
    assert (len(train), len(test)) == (60000, 10000)
    assert train.images.shape == (60000, 28, 28) and train.images.dtype == np.uint8
    # Published: the classes are balanced, 6,000 train and 1,000 test images each.
    assert np.bincount(train.labels).tolist() == [6000] * 10
    assert np.bincount(test.labels).tolist() == [1000] * 10
    names = [tx.name_of(n) for n in train.label_nodes]
    assert names == list(FASHION_MNIST_CLASSES)
    assert all(tx.name_of(train.targets[i]) == FASHION_MNIST_CLASSES[train.labels[i]] for i in range(0, 60000, 997))
    img, node = test[0]
    assert img.shape == (3, 28, 28) and float(img.min()) >= 0.0 and float(img.max()) <= 1.0
    assert torch.equal(img[0], img[2]) and torch.equal(img[0], torch.from_numpy(test.images[0] / 255.0).float())
    assert node == train.label_nodes[test.labels[0]]
    grey = FashionMNIST("test", taxonomy=tx, rgb=False)
    assert grey[0][0].shape == (1, 28, 28)
    assert FashionMNIST("test", taxonomy=tx, transform=lambda im: im.mode)[0][0] == "RGB"
    assert FashionMNIST("test", taxonomy=tx, transform=lambda im: im.mode, rgb=False)[0][0] == "L"
    # the first test image of Fashion-MNIST is an ankle boot (label 9)
    assert int(test.labels[0]) == 9


@pytest.mark.skipif(not FASHION_ROOT.is_dir(), reason="Debian package dataset-fashion-mnist not installed")
def test_fashion_mnist_label_index_metadata() -> None:
    # a taxonomy that maps label indices through metadata rather than by name
    edges = [("r", f"c{i}") for i in range(10)]
    tx = Taxonomy(edges, metadata={"label_index": {str(i): f"c{9 - i}" for i in range(10)}})
    ds = FashionMNIST("test", taxonomy=tx)
    assert [tx.name_of(n) for n in ds.label_nodes] == [f"c{9 - i}" for i in range(10)]
    with pytest.raises(TaxonomyError, match="no label-index mapping"):
        FashionMNIST("test", taxonomy=Taxonomy([("r", "x")]))


def test_shipped_fashion_taxonomy_if_present() -> None:
    try:
        from hiercls.taxonomy.registry import load_taxonomy

        tx = load_taxonomy("fashion_mnist")
    except (ImportError, TaxonomyError, FileNotFoundError):
        pytest.skip("shipped fashion_mnist taxonomy not built yet")
    from hiercls.data.images import _fashion_label_nodes

    nodes = _fashion_label_nodes(tx)
    assert len(set(nodes.tolist())) == 10 and all(tx.class_mask[n] for n in nodes)


# ---------------------------------------------------------------------------------------------- WordNet glosses
@pytest.fixture(scope="module")
def flat_gloss_taxonomy() -> Taxonomy:
    glosses, _ = load_timm_glosses()
    return Taxonomy([("root", w) for w in sorted(glosses)], name="flat_glosses")


def test_gloss_set_counts_split_and_determinism(flat_gloss_taxonomy: Taxonomy) -> None:
    glosses, lemmas = load_timm_glosses()
    assert len(glosses) == 21844 and set(lemmas) == set(glosses)
    splits = {s: wordnet_gloss_dataset(s, flat_gloss_taxonomy) for s in ("train", "val", "test")}
    sizes = {s: len(d) for s, d in splits.items()}
    assert sizes == {"train": 17574, "val": 2179, "test": 2091}  # the documented, fixed split
    assert sum(sizes.values()) == len(glosses)
    # sha256 buckets: within 1.5 points of 80/10/10 on 21k ids
    assert abs(sizes["train"] / len(glosses) - 0.8) < 0.015 and abs(sizes["val"] / len(glosses) - 0.1) < 0.015
    ids = {s: {flat_gloss_taxonomy.name_of(t) for t in d.targets} for s, d in splits.items()}
    assert not (ids["train"] & ids["val"]) and not (ids["train"] & ids["test"]) and not (ids["val"] & ids["test"])
    again = wordnet_gloss_dataset("val", flat_gloss_taxonomy)
    assert again.texts == splits["val"].texts and again.targets.tolist() == splits["val"].targets.tolist()
    for text, node in itertools.islice(iter(splits["test"]), 50):
        assert text == glosses[flat_gloss_taxonomy.name_of(node)]
    assert gloss_split_of("n02084071") == gloss_split_of("n02084071")
    with_lemma = wordnet_gloss_dataset("test", flat_gloss_taxonomy, include_lemma=True)
    wnid = flat_gloss_taxonomy.name_of(with_lemma.targets[0])
    assert with_lemma.texts[0] == f"{lemmas[wnid]}: {glosses[wnid]}"


def test_gloss_set_restricts_to_taxonomy_and_parent_labels() -> None:
    tx = Taxonomy(
        [("entity", "n00021939"), ("n00021939", "n03563967"), ("entity", "n02084071"), ("n02084071", "not_a_wnid")]
    )
    ds = wordnet_gloss_dataset("all", tx)
    assert [tx.name_of(t) for t in ds.targets] == ["n00021939", "n03563967", "n02084071"]
    par = wordnet_gloss_dataset("all", tx, label="parent")
    assert [tx.name_of(t) for t in par.targets] == ["n00021939"]  # the other two have the root as parent
    with pytest.raises(ValueError, match="split"):
        wordnet_gloss_dataset("dev", tx)  # type: ignore[arg-type]
    with pytest.raises(TaxonomyError, match="no nodes named by a WordNet id"):
        wordnet_gloss_dataset("all", Taxonomy([("a", "b")]))


def test_gloss_set_on_shipped_21k_taxonomy() -> None:
    try:
        from hiercls.taxonomy.registry import load_taxonomy

        tx = load_taxonomy("imagenet21k_winter21")
    except (ImportError, TaxonomyError, FileNotFoundError):
        pytest.skip("shipped imagenet21k_winter21 taxonomy not built yet")
    sizes = {s: len(wordnet_gloss_dataset(s, tx)) for s in ("train", "val", "test")}
    assert sizes == {"train": 8417, "val": 1031, "test": 1002}  # documented in docs/models_and_data.md
    assert sum(sizes.values()) == int(tx.class_mask.sum())  # every winter21 class has a gloss
    train = wordnet_gloss_dataset("train", tx)
    assert all(tx.class_mask[train.targets])


# ---------------------------------------------------------------------------------------------- sampler / loader
def _rank_batches(n: int, batch: int, world: int, **kw: object) -> list[list[list[int]]]:
    out = []
    for r in range(world):
        loader = make_loader(list(range(n)), batch, rank=r, world_size=world, **kw)  # type: ignore[arg-type]
        out.append([b.tolist() for b in loader])
    return out


@pytest.mark.parametrize(("n", "drop_last"), [(40, False), (37, False), (37, True)])
def test_ddp_order_equals_single_process(n: int, drop_last: bool) -> None:
    single = _rank_batches(n, 8, 1, seed=3, drop_last=drop_last)[0]
    ranks = _rank_batches(n, 4, 2, seed=3, drop_last=drop_last)
    assert len(ranks[0]) == len(ranks[1]) == len(single)  # every rank takes the same number of steps
    for k, glob in enumerate(single):
        merged = [None] * (len(ranks[0][k]) + len(ranks[1][k]))
        merged[0::2], merged[1::2] = ranks[0][k], ranks[1][k]
        if len(glob) % 2 == 0:
            assert merged == glob
        else:  # the last partial global batch is padded by repeating its own first sample
            assert merged[:-1] == glob and merged[-1] == glob[0]
    seen = sorted(i for b in single for i in b)
    if drop_last:
        assert len(seen) == len(set(seen)) == 32
    else:
        assert seen == list(range(n))


def test_sampler_epochs_seeds_and_validation() -> None:
    s = ResumableDistributedSampler(50, batch_size=5, seed=1)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert sorted(e0) == sorted(e1) == list(range(50)) and e0 != e1
    assert list(ResumableDistributedSampler(50, batch_size=5, seed=1)) == e0
    assert list(ResumableDistributedSampler(50, batch_size=5, seed=2)) != e0
    assert list(ResumableDistributedSampler(5, batch_size=2, shuffle=False)) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="rank"):
        ResumableDistributedSampler(10, rank=2, world_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        ResumableDistributedSampler(10, batch_size=0)
    with pytest.raises(ValueError, match="dataset_len=10 but this sampler has dataset_len=11"):
        ResumableDistributedSampler(11).load_state_dict(s.state_dict() | {"dataset_len": 10})


@pytest.mark.parametrize("num_workers", [0, 1])
def test_resume_gives_exact_remaining_batches(num_workers: int) -> None:
    data = list(range(45))
    full = make_loader(data, 4, seed=7, num_workers=num_workers)
    full.set_epoch(2)
    want = [b.tolist() for b in full]
    loader = make_loader(data, 4, seed=7, num_workers=num_workers)
    loader.set_epoch(2)
    got = []
    for k, b in enumerate(loader, start=1):
        got.append(b.tolist())
        if k == 5:
            state = loader.state_dict()
            break
    assert state["epoch"] == 2 and state["index"] == 20
    resumed = make_loader(data, 4, seed=7, num_workers=num_workers)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # the state survives JSON (a checkpoint)
    resumed.set_epoch(2)  # the same epoch keeps the position
    assert len(resumed) == len(want) - 5
    got += [b.tolist() for b in resumed]
    assert got == want
    assert resumed.state_dict()["index"] == 45
    assert [b.tolist() for b in resumed] == want  # a fresh iteration starts the epoch again


def test_resume_on_another_world_size() -> None:
    data = list(range(30))
    one = make_loader(data, 6, seed=5)
    it = iter(one)
    first = [next(it).tolist() for _ in range(2)]
    state = one.state_dict()
    assert state["index"] == 12
    rest = []
    for r in range(2):
        ld = make_loader(data, 3, seed=5, rank=r, world_size=2)
        ld.load_state_dict(state)
        rest.append([b.tolist() for b in ld])
    order = one.sampler.global_order()
    merged = [i for a, b in zip(*rest, strict=True) for pair in zip(a, b, strict=True) for i in pair]
    assert [i for b in first for i in b] + merged == order.tolist()


def test_set_epoch_discards_other_epoch_resume() -> None:
    s = ResumableDistributedSampler(10, batch_size=2, shuffle=False)
    s.load_state_dict({"epoch": 0, "index": 6})
    s.set_epoch(1)
    assert len(list(s)) == 10


def test_state_right_after_set_epoch_points_at_the_new_epoch_start() -> None:
    loader = make_loader(list(range(10)), 5, seed=1)
    assert sum(1 for _ in loader) == 2 and loader.state_dict()["index"] == 10
    loader.set_epoch(1)
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["index"] == 0
    loader.load_state_dict({"epoch": 1, "index": 5})
    loader.set_epoch(1)
    assert loader.state_dict()["index"] == 5 and len(loader) == 1


# ---------------------------------------------------------------------------------------------- dataset registry
def test_dataset_registry_names_and_errors(tax: Taxonomy) -> None:
    assert (
        list_datasets()
        == DATASETS.names()
        == sorted(
            [
                "fashion_mnist",
                "hf_datasets",
                "image_folder",
                "nested_blobs_3d",
                "shards",
                "synthetic",
                "text_csv",
                "text_jsonl",
                "wordnet_gloss",
            ]
        )
    )
    with pytest.raises(ValueError, match=r"unknown data set 'synthetik' \(did you mean 'synthetic'\?\); registered: "):
        build_dataset("synthetik", "train", tax)
    with pytest.raises(ValueError, match="unknown data set 'blobs'"):
        dataset_taxonomy("blobs")
    with pytest.raises(ValueError, match=r"data.options: unknown option\(s\) 'colour' for data set 'synthetic'"):
        build_dataset("synthetic", "train", tax, {"colour": "red"})
    with pytest.raises(ValueError, match=r"data.options.val_samples: expected a positive integer, got 0"):
        build_dataset("synthetic", "val", tax, {"val_samples": 0})
    with pytest.raises(ValueError, match="'synthetic' needs taxonomy"):
        build_dataset("synthetic", "train", None)
    with pytest.raises(ValueError, match=r"data.options.root: the 'image_folder' data set needs root"):
        build_dataset("image_folder", "train", tax)
    with pytest.raises(ValueError, match="needs train_path"):
        build_dataset("text_csv", "train", tax, {"text_column": "t", "label_column": "l"})


def test_register_dataset_and_its_taxonomy(tax: Taxonomy) -> None:
    seen = []

    def build(split: str, taxonomy: Taxonomy | None, options: dict, transform: object) -> list:
        seen.append((split, taxonomy, options, transform))
        return [("x", 1)] * options.get("n", 1)

    register_dataset("test_registry_kind", build, taxonomy=lambda: tax)
    try:
        assert "test_registry_kind" in list_datasets() and dataset_taxonomy("test_registry_kind") is tax
        opts = {"n": 3}
        assert build_dataset("test_registry_kind", "val", tax, opts, transform=str) == [("x", 1)] * 3
        assert seen == [("val", tax, {"n": 3}, str)] and seen[0][2] is not opts  # the builder gets a copy
        with pytest.raises(ValueError, match="already registered"):
            register_dataset("test_registry_kind", build)
    finally:
        DATASETS.unregister("test_registry_kind")
    assert "test_registry_kind" not in list_datasets()
    assert dataset_taxonomy("synthetic") is None
    assert dataset_taxonomy("nested_blobs_3d") == nested_blobs_taxonomy()


def test_subsample_is_a_fixed_sorted_subset(tax: Taxonomy) -> None:
    ds = build_dataset("synthetic", "train", tax, {"num_samples": 20, "kind": "features", "dim": 3})
    sub = subsample(ds, 7, seed=1)
    assert len(sub) == 7 and sub.taxonomy is tax
    assert list(sub.indices) == sorted(sub.indices) and len(set(sub.indices)) == 7
    assert list(subsample(ds, 7, seed=1).indices) == list(sub.indices)
    assert subsample(ds, 20) is ds and subsample(ds, None) is ds
    torch.testing.assert_close(sub[0][0], ds[sub.indices[0]][0])


# ---------------------------------------------------------------------------------------------- synthetic sets
def test_synthetic_inputs_are_path_prototype_sums(tax: Taxonomy) -> None:
    ds = SyntheticHierarchy(tax, 12, kind="features", dim=5, noise=0.0, labels="classes", seed=3)
    assert ds.prototypes.shape == (tax.num_nodes, 5)
    for i in range(len(ds)):
        x, y = ds[i]
        want = sum(ds.prototypes[n] for n in tax.path(y))  # root .. label, root included
        np.testing.assert_allclose(x.numpy(), want, rtol=1e-6, atol=1e-6)
        assert tax.class_mask[y]
    # deeper prototypes are weaker: their scale is 1 / (1 + depth)
    stds = [
        float(np.std(SyntheticHierarchy(tax, 1, kind="image", image_size=32, seed=s).prototypes[n]))
        for s in range(3)
        for n in (tax.index("animal"), tax.index("cat"))
    ]
    assert all(a > b for a, b in zip(stds[::2], stds[1::2], strict=True))
    text, y = SyntheticHierarchy(tax, 2, kind="text")[1]
    assert {f"node{n}" for n in tax.path(y)[1:]} <= set(text.split())


def test_synthetic_splits_share_prototypes_not_samples(tax: Taxonomy) -> None:
    opts = {"kind": "features", "dim": 4, "num_samples": 30, "seed": 2}
    train, val = build_dataset("synthetic", "train", tax, opts), build_dataset("synthetic", "val", tax, opts)
    np.testing.assert_array_equal(train.prototypes, val.prototypes)
    assert not np.array_equal(train.targets, val.targets)
    again = build_dataset("synthetic", "train", tax, opts)
    assert all(torch.equal(again[i][0], train[i][0]) for i in range(len(train)))  # deterministic
    other = build_dataset("synthetic", "train", tax, {**opts, "seed": 3})
    assert not np.array_equal(other.prototypes, train.prototypes)
    with pytest.raises(ValueError, match=r"prototypes must have shape \(7, 4\)"):
        SyntheticHierarchy(tax, 2, kind="features", dim=4, prototypes=np.zeros((7, 5)))


def test_nested_blobs_are_nested_and_deterministic() -> None:
    ds = build_dataset("nested_blobs_3d", "train", None, {"num_samples": 3, "size": 12, "noise": 0.0})
    assert isinstance(ds, NestedBlobs3D) and ds.taxonomy == nested_blobs_taxonomy()
    chain = ds.taxonomy
    assert [chain.names[n] for n in chain.path(chain.index("inner"))] == ["volume", "outer", "middle", "inner"]
    for i in range(len(ds)):
        vol, labels = ds[i]
        assert vol.shape == (1, 12, 12, 12) and labels.dtype == torch.int64
        assert set(labels.unique().tolist()) == {0, 1, 2, 3}  # every region is present
        # noise 0: intensity identifies the region (inner 2.0, middle 1.0 +- 0.5, outer 0.8, background 0)
        v = vol[0]
        assert bool((v[labels == 3] == 2.0).all()) and bool((v[labels == 0] == 0.0).all())
        assert bool((v[labels == 1] == 0.8).all()) and set(v[labels == 2].unique().tolist()) <= {0.5, 1.5}
    val = build_dataset("nested_blobs_3d", "val", None, {"num_samples": 3, "size": 12, "noise": 0.0})
    assert not torch.equal(val[0][1], ds[0][1])
    assert torch.equal(NestedBlobs3D(1, size=12, noise=0.0)[0][1], NestedBlobs3D(1, size=12, noise=0.0)[0][1])
    with pytest.raises(TaxonomyError, match="does not fit"):
        build_dataset("nested_blobs_3d", "train", Taxonomy([("r", "a")]), {"num_samples": 1})


# ---------------------------------------------------------------------------------------------- model transforms
def test_image_transform_converts_modes_and_skips_other_modalities() -> None:
    class Model:
        modality = "image"

        def __init__(self, channels: int) -> None:
            self.channels = channels

        def transform(self, *, train: bool, image_size: int | None) -> object:
            return lambda im: (im.mode, im.size, train, image_size)

        def data_config(self, image_size: int | None) -> dict:
            return {"input_size": (self.channels, 8, 8)}

    grey = Image.new("L", (3, 2))
    assert image_transform(Model(3), train=True, image_size=8)(grey) == ("RGB", (3, 2), True, 8)
    assert image_transform(Model(1), train=False, image_size=None)(Image.new("RGB", (3, 2)))[0] == "L"
    assert isinstance(image_transform(Model(3), train=False, image_size=None), ImageModeTransform)
    for modality in ("text", "volume"):
        other = Model(3)
        other.modality = modality
        assert image_transform(other, train=False, image_size=None) is None


def test_fashion_mnist_validation_split_is_carved_from_train() -> None:
    from hiercls.data.images import FashionMNIST

    full, fit, val = FashionMNIST("train"), FashionMNIST("train_fit"), FashionMNIST("val")
    assert (len(fit), len(val)) == (50_000, 10_000)
    assert np.array_equal(np.concatenate([fit.labels, val.labels]), full.labels)
    assert np.array_equal(val.images[0], full.images[50_000])
    with pytest.raises(ValueError, match="'train', 'test', 'train_fit' or 'val'"):
        FashionMNIST("valid")


def test_augment_options_reach_timms_transform() -> None:
    """A recipe's ``data.augment`` options build timm's RandAugment / RandomErasing / bicubic transforms."""
    from hiercls.models.backbones import TimmBackbone
    from hiercls.train.config import ConfigError, config_from_dict

    class Model:
        modality = "image"

        def __init__(self) -> None:
            self.backbone = TimmBackbone("test_vit")

        def transform(self, **kwargs: object) -> object:
            return self.backbone.transform(**kwargs)

        def data_config(self, image_size: int | None) -> dict:
            return self.backbone.data_config(image_size)

    recipe = {"data": {"augment": {"auto_augment": "rand-m9-mstd0.5", "re_prob": 0.25, "interpolation": "nearest"}}}
    cfg = config_from_dict(recipe)
    model = Model()
    plain = repr(image_transform(model, train=True, image_size=32, augment=True))
    train = repr(image_transform(model, train=True, image_size=32, augment=cfg.data.augment))
    assert "RandAugment" not in plain and "RandomErasing" not in plain and "nearest" not in plain
    assert "RandAugment" in train and "RandomErasing(p=0.25" in train and "nearest" in train
    # The evaluation transform takes the inference options only; augment=False means no augmentation in training.
    evaluation = repr(image_transform(model, train=False, image_size=32, augment=cfg.data.augment))
    assert "nearest" in evaluation and "RandAugment" not in evaluation and "RandomErasing" not in evaluation
    off = repr(image_transform(model, train=True, image_size=32, augment=False))
    assert "RandomResizedCrop" not in off and "RandomHorizontalFlip" not in off
    crop = repr(image_transform(model, train=False, image_size=32, augment={"crop_pct": 0.5}))
    assert "Resize(size=64" in crop  # timm: resize to size / crop_pct, then crop the centre
    with pytest.raises(ConfigError, match=r"unknown option 'cutout'.*valid options.*re_prob"):
        config_from_dict({"data": {"augment": {"cutout": 16}}}, source="r.yaml")
    assert config_from_dict({"data": {"augment": True}}).data.augment is True


def test_hf_datasets_reads_local_parquet_and_arrow_as_jsonl_does(tmp_path: Path) -> None:
    """``data.dataset: hf_datasets``: Parquet (written by pyarrow) and a save_to_disk folder give the texts and
    labels that the same rows give as JSON lines; a missing column names the columns there."""
    datasets = pytest.importorskip("datasets")
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    tax = Taxonomy([("root", "animal"), ("animal", "cat"), ("animal", "dog"), ("root", "car")])
    rows = [{"t": "meows", "y": "animal/cat"}, {"t": "barks", "y": "dog"}, {"t": "honks", "y": "car"}]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    datasets.DatasetDict({"val": datasets.Dataset.from_list(rows[::-1])}).save_to_disk(str(tmp_path / "dd"))
    ref = HierTextDataset.from_jsonl(tmp_path / "train.jsonl", "t", "y", tax)
    opts = {"path": str(tmp_path / "{split}.parquet"), "text_column": "t", "label_column": "y"}
    got = build_dataset("hf_datasets", "train", tax, opts)
    assert (
        [got[i] for i in range(len(got))]
        == [ref[i] for i in range(len(ref))]
        == [
            ("meows", 2),
            ("barks", 3),
            ("honks", 4),
        ]
    )
    val = build_dataset("hf_datasets", "val", tax, {**opts, "path": str(tmp_path / "dd")})
    assert val.targets.tolist() == [4, 3, 2]
    with pytest.raises(ValueError, match=r"no column 'label'.*columns: t, y"):
        build_dataset("hf_datasets", "train", tax, {**opts, "label_column": "label"})
    pq.write_table(pa.Table.from_pylist([{"t": "purrs", "y": "animal/cow"}]), tmp_path / "bad.parquet")
    with pytest.raises(TaxonomyError, match=r"bad\.parquet:1"):
        build_dataset("hf_datasets", "train", tax, {**opts, "path": str(tmp_path / "bad.parquet")})
