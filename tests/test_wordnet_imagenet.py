"""Offline WordNet 3.0 and the ImageNet taxonomies built from it, checked against nltk, the raw database and timm."""

from __future__ import annotations

import itertools
import random
import re
import threading
from pathlib import Path

import numpy as np
import pytest

from hiercls.taxonomy import TaxonomyError, load_taxonomy
from hiercls.taxonomy import wordnet as wnmod
from hiercls.taxonomy.imagenet import (
    IMAGENET21K_ROOT,
    imagenet1k_taxonomy,
    imagenet21k_taxonomy,
    imagenet_class_names,
    imagenet_class_nodes,
    imagenet_node_classes,
    imagenet_synsets,
)
from hiercls.taxonomy.wordnet import (
    LEXNAMES,
    WordNetUnavailableError,
    synset_to_wnid,
    wnid_to_synset,
    wordnet_available,
    wordnet_data_dir,
    wordnet_taxonomy,
)

needs_wordnet = pytest.mark.skipif(
    not wordnet_available(),
    reason="WordNet 3.0 files missing from /usr/share/wordnet: apt-get install wordnet-base wordnet-sense-index",
)


@pytest.fixture(scope="module")
def wn(tmp_path_factory: pytest.TempPathFactory):
    if not wordnet_available():
        pytest.skip("WordNet 3.0 files missing: apt-get install wordnet-base wordnet-sense-index")
    return wnmod.wordnet(cache_dir=tmp_path_factory.mktemp("nltk_data"))


@pytest.fixture(scope="module")
def raw_pointers() -> dict[str, tuple[list[str], list[str]]]:
    """wnid -> (hypernyms, instance hypernyms) parsed by a regex over data.noun: an independent reading."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    with open(wnmod.DEBIAN_WORDNET_DIR / "data.noun", encoding="utf-8") as f:
        for line in f:
            if line[:1].isdigit():
                body = line.split(" | ")[0]
                out["n" + line[:8]] = (re.findall(r" @ (\d{8}) n ", body), re.findall(r" @i (\d{8}) n ", body))
    return {w: (["n" + x for x in h], ["n" + x for x in i]) for w, (h, i) in out.items()}


# ---------------------------------------------------------------------------------------------- the reader
def test_lexnames_is_the_standard_list():
    assert len(LEXNAMES) == 45
    assert LEXNAMES[0] == ("adj.all", 3) and LEXNAMES[3] == ("noun.Tops", 1) and LEXNAMES[44] == ("adj.ppl", 3)
    assert LEXNAMES[28] == ("noun.time", 1) and LEXNAMES[29] == ("verb.body", 2)
    assert sum(cat == 1 for _, cat in LEXNAMES) == 26 and sum(cat == 2 for _, cat in LEXNAMES) == 15


@needs_wordnet
def test_reader_reads_known_synsets(wn):
    tench = wn.synset_from_pos_and_offset("n", 1440764)
    assert tench.name() == "tench.n.01"
    assert tench.lexname() == "noun.animal"  # needs the generated lexnames file
    assert wn.synset("dog.n.01").offset() == 2084071
    assert {s.name() for s in wn.synset("dog.n.01").hypernyms()} == {"canine.n.02", "domestic_animal.n.01"}
    # index.sense (wordnet-sense-index) and the exception lists are readable too.
    assert wn.lemma_from_key("dog%1:05:00::").synset().name() == "dog.n.01"
    assert wn.morphy("geese", "n") == "goose"
    assert wnmod.wordnet(cache_dir=Path(wn.root.path).parents[1]) is wn  # cached per folder


def _fake_source(folder: Path, skip: tuple[str, ...] = ()) -> Path:
    folder.mkdir()
    for name in wnmod._REQUIRED_FILES:
        if name not in skip:
            (folder / name).write_text(f"fake {name}\n")
    return folder


def test_missing_files_name_the_debian_packages(tmp_path):
    src = _fake_source(tmp_path / "wn", skip=("index.sense",))
    with pytest.raises(WordNetUnavailableError, match=r"index\.sense.*wordnet-sense-index.*apt-get install"):
        wordnet_data_dir(src, tmp_path / "cache")
    assert not wordnet_available(src)


def test_unwritable_cache_and_missing_database_are_explained(tmp_path, monkeypatch):
    src = _fake_source(tmp_path / "wn")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(WordNetUnavailableError, match=r"HIERCLS_CACHE"):
        wordnet_data_dir(src, blocker / "cache")
    monkeypatch.setenv("HIERCLS_WORDNET_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(WordNetUnavailableError, match="wordnet-base"):
        wordnet_taxonomy(["n01440764"])
    monkeypatch.setenv("HIERCLS_CACHE", str(tmp_path / "hc"))
    assert wnmod._cache_root(None) == tmp_path / "hc" / "nltk_data"


def test_data_dir_layout_is_built_once_and_rebuilt_when_stale(tmp_path):
    src = _fake_source(tmp_path / "wn")
    cache = tmp_path / "cache"
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(wordnet_data_dir(src, cache))
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=build) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    target = results[0]
    assert target == cache / "corpora" / "wordnet"
    lines = (target / "lexnames").read_text().splitlines()
    assert lines[5] == "05\tnoun.animal\t1" and len(lines) == 45
    assert (target / "data.noun").read_text() == "fake data.noun\n" and not (target / "data.noun").is_symlink()
    assert [p.name for p in (cache / "corpora").iterdir()] == ["wordnet"]  # no temporary folders left
    # A changed source file makes the copy stale: it is rebuilt.
    (src / "data.noun").write_text("new contents, longer than before\n")
    assert wordnet_data_dir(src, cache) == target
    assert (target / "data.noun").read_text() == "new contents, longer than before\n"
    # Another source folder: rebuilt from it.
    other = _fake_source(tmp_path / "other")
    (other / "index.noun").write_text("other index\n")
    wordnet_data_dir(other, cache)
    assert (target / "index.noun").read_text() == "other index\n"


# ---------------------------------------------------------------------------------------------- ids
@needs_wordnet
def test_wnid_round_trip_and_errors(wn):
    assert wnid_to_synset("n01440764", wn).name() == "tench.n.01"
    assert synset_to_wnid("tench.n.01", wn) == "n01440764"
    assert synset_to_wnid(wn.synset("entity.n.01")) == wnmod.WORDNET_ROOT_WNID
    for s in random.Random(0).sample(list(itertools.islice(wn.all_synsets("n"), 3000)), 50):
        assert wnid_to_synset(synset_to_wnid(s), wn) == s
    with pytest.raises(TaxonomyError, match="expected 'n' followed by 8 digits"):
        wnid_to_synset("01440764", wn)
    with pytest.raises(TaxonomyError, match=r"not a WordNet 3\.0 noun synset"):
        wnid_to_synset("n00000001", wn)
    with pytest.raises(TaxonomyError, match="not a noun"):
        synset_to_wnid("run.v.01", wn)
    with pytest.raises(TaxonomyError, match="unknown WordNet synset"):
        synset_to_wnid("no_such_word.n.01", wn)


# ---------------------------------------------------------------------------------------------- the DAG
@needs_wordnet
def test_restricted_dag_matches_nltk_hypernyms(wn, raw_pointers):
    wnids = ["n01440764", "n02084071", "n00007846", "n02123045", "n03792782"]  # tench, dog, person, tabby, bike
    tax = wordnet_taxonomy(wnids)
    assert tax.name_of(0) == "n00001740" and not tax.is_tree
    assert [tax.names[i] for i in tax.classes] == sorted(wnids, key=tax.index)
    # Nodes: exactly the seeds and their nltk hypernym closure; parent sets equal nltk's hypernyms().
    closure = set()
    for w in wnids:
        closure |= {synset_to_wnid(s) for s in wnid_to_synset(w, wn).closure(lambda s: s.hypernyms())}
    assert set(tax.names) == closure | set(wnids)
    for n in range(1, tax.num_nodes):
        parents = [tax.name_of(p) for p in tax.parents(n)]
        assert set(parents) == {synset_to_wnid(s) for s in wnid_to_synset(tax.name_of(n), wn).hypernyms()}
        assert parents == raw_pointers[tax.name_of(n)][0]  # WordNet's own order
    # person.n.01 has two hypernyms: organism (first in data.noun) and causal agent.
    assert [tax.name_of(p) for p in tax.parents(tax.index("n00007846"))] == ["n00004475", "n00007347"]
    assert tax.display_names[tax.index("n00007846")] == "person"
    assert tax.display_names[tax.lca(tax.index("n02084071"), tax.index("n02123045"))] == "carnivore"


@needs_wordnet
def test_first_hypernym_tree_follows_nltk_paths(wn, raw_pointers):
    wnids = random.Random(1).sample(imagenet_synsets("imagenet1k"), 120)
    tree = wordnet_taxonomy(wnids).to_tree("first")
    assert tree.is_tree
    for w in wnids:
        path = [tree.name_of(i) for i in tree.path(tree.index(w))]
        nltk_paths = [[synset_to_wnid(s) for s in p] for p in wnid_to_synset(w, wn).hypernym_paths()]
        assert path in nltk_paths
        chain, x = [w], w  # walk the first @ pointer of the raw database
        while raw_pointers[x][0]:
            x = raw_pointers[x][0][0]
            chain.append(x)
        assert path == chain[::-1]


@needs_wordnet
def test_full_noun_hierarchy_counts(raw_pointers):
    full = wordnet_taxonomy(include_instances=True)
    assert full.num_nodes == len(raw_pointers) == 82115
    assert full.name_of(0) == "n00001740" and full.height == 19
    nouns = wordnet_taxonomy()
    # Without instance edges: the 7,725 instance-only synsets, the 16 regular synsets whose only hypernym is an
    # instance (blighty.n.01 -> united_kingdom.n.01) and what hangs below them are left out.
    assert nouns.num_nodes == 74374
    assert "n08806897" in full and "n08806897" not in nouns  # rome.n.01 is an instance
    multi = int((np.diff(nouns.parent_ptr) > 1).sum())
    assert multi == sum(len(h) > 1 for w, (h, _) in raw_pointers.items() if w in nouns)
    assert nouns.stats()["edges"] == sum(len([p for p in raw_pointers[w][0] if p in nouns]) for w in nouns.names)


@needs_wordnet
def test_instances_need_include_instances(wn):
    rome = synset_to_wnid("rome.n.01", wn)
    with pytest.raises(TaxonomyError, match="include_instances=True") as err:
        wordnet_taxonomy([rome])
    assert err.value.label == rome
    tax = wordnet_taxonomy([rome], include_instances=True)
    assert tax.name_of(tax.primary_parent[tax.index(rome)]) == synset_to_wnid("national_capital.n.01", wn)


@needs_wordnet
def test_bad_wnids_are_named():
    with pytest.raises(TaxonomyError, match="listed twice"):
        wordnet_taxonomy(["n01440764", "n01440764"])
    with pytest.raises(TaxonomyError, match="'tench' is not a WordNet noun id"):
        wordnet_taxonomy(["tench"])
    with pytest.raises(TaxonomyError, match="n99999999"):
        wordnet_taxonomy(["n99999999"])


# ---------------------------------------------------------------------------------------------- ImageNet
def test_timm_class_tables():
    from timm.data import ImageNetInfo

    assert imagenet_synsets("imagenet1k") == list(ImageNetInfo("imagenet-1k").label_names())
    assert imagenet_synsets("fall11") == list(ImageNetInfo("imagenet-21k-miil").label_names())
    assert len(imagenet_synsets("imagenet21k_winter21")) == 10450
    assert set(imagenet_synsets("winter21")) <= set(imagenet_synsets("fall11")) | set(imagenet_synsets("22k"))
    names = imagenet_class_names(imagenet_synsets("imagenet1k"))
    assert names["n01440764"] == "tench" and names["n04592741"] == "wing" and len(names) == 1000
    with pytest.raises(ValueError, match="subset must be one of"):
        imagenet_synsets("imagenet5k")


@needs_wordnet
def test_imagenet1k_builders_equal_shipped_files():
    dag = imagenet1k_taxonomy("dag")
    assert dag.fingerprint == load_taxonomy("imagenet1k").fingerprint
    assert {dag.name_of(i) for i in dag.leaves} == set(imagenet_synsets("imagenet1k"))
    tree = imagenet1k_taxonomy("tree")
    assert tree.fingerprint == load_taxonomy("imagenet1k_tree").fingerprint
    assert tree.is_tree and tree.num_leaves == 1000
    dag_edges, tree_edges = set(dag.edge_list(names=True)), set(tree.edge_list(names=True))
    assert set(tree.dropped_edges) <= dag_edges and not set(tree.dropped_edges) & tree_edges
    assert {e for e in dag_edges if e[1] in tree} <= tree_edges | set(tree.dropped_edges)
    assert [list(e) for e in tree.dropped_edges] == tree.metadata["dropped_edges"]
    assert set(dag.names) - set(tree.names) == set(tree.metadata["pruned_nodes"])
    # Every kept edge is the child's first WordNet hypernym.
    for p, c in tree.edge_list(names=True):
        assert dag.name_of(dag.primary_parent[dag.index(c)]) == p
    with pytest.raises(ValueError, match="kind must be"):
        imagenet1k_taxonomy("forest")  # type: ignore[arg-type]


def test_class_nodes_follow_timm_order():
    tax = load_taxonomy("imagenet1k")
    nodes = imagenet_class_nodes(tax)
    assert [tax.name_of(n) for n in nodes] == imagenet_synsets("imagenet1k")
    assert tax.display_names[nodes[0]] == "tench"
    inverse = imagenet_node_classes(tax)
    assert (inverse[nodes] == np.arange(1000)).all() and (inverse >= 0).sum() == 1000
    t21 = load_taxonomy("imagenet21k_fall11")
    assert [t21.name_of(n) for n in imagenet_class_nodes(t21)] == imagenet_synsets("fall11")
    with pytest.raises(TaxonomyError):
        imagenet_class_nodes(tax, subset="fall11")  # 21K classes are not nodes of the 1K DAG
    from hiercls.taxonomy import Taxonomy

    with pytest.raises(ValueError, match="subset="):
        imagenet_class_nodes(Taxonomy([("r", "a")]))


def _semantic_levels_by_walking(wnids: list[str], sample: list[str], raw_pointers) -> dict[str, int]:
    classes = set(wnids)
    out = {}
    for w in sample:
        level, x = 0, w
        while True:
            hyper, inst = raw_pointers[x]
            if not hyper and not inst:
                break
            x = (hyper or inst)[0]
            level += x in classes
        out[w] = level
    return out


@needs_wordnet
@pytest.mark.parametrize("version", ["winter21", "fall11"])
def test_21k_semantic_levels_match_an_independent_walk(version, wn, raw_pointers):
    tax = load_taxonomy(f"imagenet21k_{version}")
    wnids = imagenet_synsets(version)
    sample = random.Random(2).sample(wnids, 300)
    expected = _semantic_levels_by_walking(wnids, sample, raw_pointers)
    assert {w: int(tax.semantic_level[tax.index(w)]) for w in sample} == expected
    # Each tree parent is a true WordNet ancestor (nltk closure over hypernyms and instance hypernyms).
    for w in sample[:60]:
        p = tax.name_of(tax.parent[tax.index(w)])
        if p != IMAGENET21K_ROOT:
            up = wnid_to_synset(w, wn).closure(lambda s: s.hypernyms() + s.instance_hypernyms())
            assert p in {synset_to_wnid(s) for s in up}


@needs_wordnet
def test_21k_builder_equals_shipped_file():
    built = imagenet21k_taxonomy("winter21")
    assert built.fingerprint == load_taxonomy("imagenet21k_winter21").fingerprint
    assert built.virtual_root == IMAGENET21K_ROOT
    with pytest.raises(ValueError, match="winter21"):
        imagenet21k_taxonomy("spring22")  # type: ignore[arg-type]
