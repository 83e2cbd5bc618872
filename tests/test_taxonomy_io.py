"""Readers and writers: round trips, format detection, and errors that name the file and line."""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from _generators import unicode_taxonomy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hiercls._textio import TextFileError, parse_json
from hiercls.taxonomy import (
    Taxonomy,
    TaxonomyError,
    detect_format,
    read_edge_list,
    read_folders,
    read_json,
    read_label_paths,
    read_nested_json,
    read_node_link,
    read_taxonomy,
    read_tsv,
    taxonomy_from_label_paths,
    taxonomy_from_nested,
    write_edge_list,
    write_folders,
    write_json,
    write_label_paths,
    write_nested_json,
    write_node_link,
    write_taxonomy,
    write_tsv,
)
from hiercls.taxonomy.io import FORMATS, check_names


def random_taxonomy(seed: int, *, dag: bool = False, virtual_root: bool = False) -> Taxonomy:
    rng = random.Random(seed)
    n = rng.randint(2, 25)
    names = [f"{rng.choice(['cat', 'dog', 'Ünï', 'a b'])}-{i}" for i in range(n)]
    rng.shuffle(names)
    edges = []
    roots = [0] + ([k for k in range(1, min(n, 4)) if rng.random() < 0.5] if virtual_root else [])
    for i in range(1, n):
        if i in roots:
            continue
        ps = {rng.randrange(i)}
        if dag and i > 2 and rng.random() < 0.4:
            ps.add(rng.randrange(i))
        edges += [(names[p], names[i]) for p in ps]
    rng.shuffle(edges)
    classes = [nm for nm in names if rng.random() < 0.7] or None
    display = {nm: nm.upper() for nm in names if rng.random() < 0.3}
    try:
        return Taxonomy(
            edges,
            nodes=names,
            classes=classes,
            display_names=display,
            virtual_root="VROOT" if virtual_root else None,
            name=f"rand{seed}",
            metadata={"seed": seed, "source": "test"},
        )
    except TaxonomyError:  # a class list that happened to include only the virtual root, etc.
        return Taxonomy(edges, nodes=names, virtual_root="VROOT" if virtual_root else None, name=f"rand{seed}")


def same_structure(a: Taxonomy, b: Taxonomy) -> None:
    assert a.names == b.names
    assert sorted(a.edge_list(names=True)) == sorted(b.edge_list(names=True))


def isomorphic_by_display(a: Taxonomy, b: Taxonomy) -> None:
    """Same shape in the same id order with the same display names (names may differ)."""
    assert a.display_names == b.display_names
    assert [a.parents(i) for i in range(a.num_nodes)] == [b.parents(i) for i in range(b.num_nodes)]


# ---------------------------------------------------------------------------------------------- hiercls JSON
@pytest.mark.parametrize("seed", range(25))
@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_json_round_trip_is_lossless(tmp_path: Path, seed: int, suffix: str) -> None:
    tax = random_taxonomy(seed, dag=seed % 2 == 1, virtual_root=seed % 3 == 0)
    path = tmp_path / f"t{suffix}"
    write_json(tax, path)
    back = read_json(path)
    assert back.fingerprint == tax.fingerprint
    assert back.names == tax.names and back.display_names == tax.display_names
    assert back.classes.tolist() == tax.classes.tolist()
    assert back.virtual_root == tax.virtual_root and back.name == tax.name and back.metadata == tax.metadata
    assert back.edge_list() == tax.edge_list()  # edge order, and so parent order (to_tree("first")), kept
    assert [back.parents(i) for i in range(back.num_nodes)] == [tax.parents(i) for i in range(tax.num_nodes)]
    assert read_taxonomy(path) == tax


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(_JSON, st.sampled_from([None, 1]))
def test_parse_json_reads_what_json_loads_reads(value: object, indent: int | None) -> None:
    text = json.dumps(value, indent=indent)
    assert parse_json(text) == json.loads(text)
    assert parse_json(text, lines=True) == json.loads(text)  # the line-tagged parse gives the same values


def test_parse_json_duplicate_keys_and_lines() -> None:
    text = '{"a": {"a": 1},\n "b": [{"a": 2},\n  {"a": 3}]}'  # equal keys in different objects are fine
    tagged = parse_json(text, lines=True)
    assert tagged == json.loads(text) and tagged.line == 1 and [o.line for o in tagged["b"]] == [2, 3]
    with pytest.raises(TextFileError, match=r"t.json:3: duplicate key 'ab' .*first at line 2"):
        parse_json('{"x": {"a": 1},\n "ab": 2,\n "a\\u0062": 3}', "t.json")  # an escape spells the same key
    with pytest.raises(TextFileError, match=r"t.json:2: invalid JSON: Expecting ':' delimiter \(column 7\)"):
        parse_json('{"a":\n {"b" }', "t.json")
    deep = '{"a": ' * 3000 + "{}" + "}" * 3000  # deeper than json's recursion allows in one thread
    for lines in (False, True):
        node, depth = parse_json(deep, lines=lines), 0
        while node:
            node, depth = node["a"], depth + 1
        assert depth == 3000
    with pytest.raises(TextFileError, match="nesting deeper than 10000 levels"):
        parse_json("[" * 20_000 + "]" * 20_000)


def test_json_layout_and_determinism(tmp_path: Path) -> None:
    tax = Taxonomy([("r", "a"), ("r", "b")], display_names={"a": "Alpha"}, name="ab", metadata={"v": 1})
    write_json(tax, tmp_path / "a.json.gz")
    os.utime(tmp_path / "a.json.gz", (0, 0))
    write_json(tax, tmp_path / "b.json.gz")
    assert (tmp_path / "a.json.gz").read_bytes() == (tmp_path / "b.json.gz").read_bytes()
    obj = json.loads(gzip.decompress((tmp_path / "a.json.gz").read_bytes()))
    assert obj["format"] == "hiercls.taxonomy" and obj["version"] == 1
    assert obj["nodes"] == ["r", "a", "b"] and obj["display_names"] == ["r", "Alpha", "b"]
    assert obj["edges"] == [["r", "a"], ["r", "b"]] and obj["classes"] == ["a", "b"]
    assert obj["virtual_root"] is None and obj["name"] == "ab" and obj["metadata"] == {"v": 1}
    write_json(Taxonomy([("r", "a")]), tmp_path / "plain.json")
    assert "display_names" not in json.loads((tmp_path / "plain.json").read_text())


def test_json_errors(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text(
        '{"format": "hiercls.taxonomy", "version": 1, "nodes": ["a", "b"],\n'
        ' "edges": [["a", "b"],\n            ["b", "a"]]}'
    )
    with pytest.raises(TaxonomyError, match="cycle") as err:
        read_json(p)
    assert err.value.source == str(p) and err.value.line in (2, 3)
    p.write_text(
        '{"format": "hiercls.taxonomy", "version": 1, "nodes": ["a", "b"],\n "edges": [["a", "b"],\n            ["b"]]}'
    )
    with pytest.raises(TaxonomyError, match=r"edges\[1\] must be a \[parent, child\]") as err:
        read_json(p)
    assert err.value.line == 3
    p.write_text('{"format": "hiercls.taxonomy", "version": 99, "nodes": ["a"], "edges": []}')
    with pytest.raises(TaxonomyError, match="version 99"):
        read_json(p)
    p.write_text('{"format": "other", "nodes": []}')
    with pytest.raises(TaxonomyError, match="not a hiercls taxonomy"):
        read_json(p)
    p.write_text('{"format": "hiercls.taxonomy", "version": 1,\n "nodes": ["a", "b"], "edges": [["a", "b"]')
    with pytest.raises(TaxonomyError, match="invalid JSON") as err:
        read_json(p)
    assert err.value.line == 2
    p.write_text('{"format": "hiercls.taxonomy", "version": 1, "nodes": ["a", "b", "a"], "edges": [["a", "b"]]}')
    with pytest.raises(TaxonomyError, match="duplicate node 'a'") as err:
        read_json(p)
    assert err.value.source == str(p)  # core errors without a location still name the file
    p.write_text(
        '{"format": "hiercls.taxonomy", "version": 1, "nodes": ["a", "b"], "edges": [["a", "b"]], "classes": ["zz"]}'
    )
    with pytest.raises(TaxonomyError, match="class 'zz'") as err:
        read_json(p)
    assert str(err.value).startswith(f"{p}: ")
    tax = Taxonomy([("r", "a"), ("r", "b")])
    write_json(tax, p)
    obj = json.loads(p.read_text())
    obj["nodes"] = ["r", "b", "a"]  # a different sibling order is a different taxonomy
    p.write_text(json.dumps(obj))
    with pytest.raises(TaxonomyError, match="fingerprint mismatch"):
        read_json(p)
    del obj["fingerprint"]
    p.write_text(json.dumps(obj))
    assert read_json(p).names == ("r", "b", "a")


def test_metadata_must_be_json(tmp_path: Path) -> None:
    tax = Taxonomy([("r", "a")], metadata={"bad": object()})
    with pytest.raises(TypeError, match="metadata"):
        write_json(tax, tmp_path / "x.json")


NAME = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1, max_size=8)


@st.composite
def taxonomies(draw: st.DrawFn) -> Taxonomy:
    """Random DAGs with arbitrary (non-control, non-space) unicode names."""
    names = draw(st.lists(NAME, min_size=1, max_size=12, unique=True))
    edges = []
    for i in range(1, len(names)):
        ps = draw(st.sets(st.integers(0, i - 1), min_size=1, max_size=min(2, i)))
        edges += [(names[p], names[i]) for p in sorted(ps)]
    order = draw(st.permutations(edges))
    return Taxonomy(order, nodes=draw(st.permutations(names)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tax=taxonomies())
def test_lossless_formats_property(tmp_path: Path, tax: Taxonomy) -> None:
    for fmt, name in (("json", "p.json.gz"), ("nodelink", "p.nl.json"), ("edges", "p.edges"), ("tsv", "p.tsv")):
        if fmt == "tsv" and tax.num_nodes == 1:
            continue
        bad_for_text = any(n.startswith("#") for n in tax.names)  # read back as a comment
        if fmt in ("edges", "tsv") and bad_for_text:
            with pytest.raises(TaxonomyError, match="cannot be written"):
                write_taxonomy(tax, tmp_path / name, format=fmt)
            continue
        try:
            write_taxonomy(tax, tmp_path / name, format=fmt)
        except TaxonomyError as err:  # names a reader refuses (invisible only, look-alike twins) are not written
            assert "reading the file back would refuse it" in str(err), fmt
            with pytest.raises(TaxonomyError):
                check_names(tax.names, "names")
            continue
        back = read_taxonomy(tmp_path / name, format=fmt)
        assert back.fingerprint == tax.fingerprint, fmt
        if fmt != "tsv":
            assert [back.parents(i) for i in range(back.num_nodes)] == [tax.parents(i) for i in range(tax.num_nodes)]


# ---------------------------------------------------------------------------------------------- edge list
@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(("suffix", "delimiter"), [(".edges", "\t"), (".csv", ","), (".txt.gz", " ")])
def test_edge_list_round_trip(tmp_path: Path, seed: int, suffix: str, delimiter: str) -> None:
    tax = random_taxonomy(seed, dag=seed % 2 == 1, virtual_root=seed % 4 == 0)
    if delimiter == " ":
        tax = Taxonomy(
            [(p.replace(" ", "_"), c.replace(" ", "_")) for p, c in tax.edge_list(names=True) if p != tax.virtual_root],
            virtual_root=tax.virtual_root,
        )
    path = tmp_path / f"t{suffix}"
    write_edge_list(tax, path, delimiter=delimiter)
    back = read_edge_list(path, virtual_root=tax.virtual_root)
    # Edge lists keep names, id order and each child's parent order; display names and classes are not
    # stored, so the fingerprint matches the same taxonomy with default classes.
    same_structure(back, tax)
    assert [back.parents(i) for i in range(back.num_nodes)] == [tax.parents(i) for i in range(tax.num_nodes)]
    plain = [e for e in tax.edge_list(names=True) if e[0] != tax.virtual_root]
    assert back == Taxonomy(plain, nodes=[n for n in tax.names if n != tax.virtual_root], virtual_root=tax.virtual_root)


def test_edge_list_parsing(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text("Parent,Child\n# comment\n\nroot, animal \nanimal,cat\r\nroot,car\n")
    tax = read_taxonomy(p)
    assert tax.names == ("root", "animal", "cat", "car") and tax.name == "t"
    p = tmp_path / "spaces.txt"
    p.write_text("root   animal\nanimal\tbig cat\n")  # a tab anywhere makes tab the delimiter
    with pytest.raises(TaxonomyError, match="delimiter of this line wrong") as err:
        read_edge_list(p)
    assert err.value.line == 1
    p.write_text("root\tanimal\nanimal\tbig cat\n")
    assert read_edge_list(p).names == ("root", "animal", "big cat")
    p.write_text("only\n")
    assert read_edge_list(p).names == ("only",)
    p.write_text("\ufeffroot\ta\n")  # a byte-order mark is not part of the name
    assert read_edge_list(p).names == ("root", "a")


@pytest.mark.parametrize(
    ("content", "pattern", "line"),
    [
        ("r\ta\na\tb\tc\n", "3 fields", 2),
        ("r,a\na,\n", "empty field", 2),
        ("r\ta\na\ta\n", "self-loop", 2),
        ("r\ta\nr\tb\nr\ta\n", r"duplicate edge .*first at .*:1\)", 3),
        ("r\ta\na\tb\nb\ta\n", "cycle", None),
        ("root\tanimal\nanimal\tcat\nanimall\tdog\n", r"'animall' \(did you mean 'animal'\?\).*virtual_root=", 3),
    ],
)
def test_edge_list_errors_name_file_and_line(tmp_path: Path, content: str, pattern: str, line: int | None) -> None:
    p = tmp_path / "bad.edges"
    p.write_text(content)
    with pytest.raises(TaxonomyError, match=pattern) as err:
        read_edge_list(p)
    assert err.value.source == str(p)
    if line is not None:
        assert err.value.line == line
        assert str(err.value).startswith(f"{p}:{line}:")
    else:
        assert err.value.line is not None


def test_empty_and_non_utf8_files(tmp_path: Path) -> None:
    p = tmp_path / "empty.edges"
    p.write_text("# nothing\n\n")
    with pytest.raises(TaxonomyError, match="empty") as err:
        read_edge_list(p)
    assert err.value.source == str(p)
    p = tmp_path / "latin1.tsv"
    p.write_bytes("Root\tA\nA\tcaf\u00e9\n".encode("latin-1"))
    for reader in (read_tsv, read_edge_list, read_taxonomy):
        with pytest.raises(TaxonomyError, match=r"not UTF-8.*offset 12") as err:
            reader(p)
        assert err.value.line == 2 and err.value.source == str(p)
    g = tmp_path / "latin1.tsv.gz"
    g.write_bytes(gzip.compress(p.read_bytes()))
    with pytest.raises(TaxonomyError, match="not UTF-8") as err:
        read_taxonomy(g)
    assert err.value.line == 2
    with pytest.raises(FileNotFoundError):
        read_taxonomy(tmp_path / "missing.tsv")


# ---------------------------------------------------------------------------------------------- TSV (HiAGM)
@pytest.mark.parametrize("seed", range(20))
def test_tsv_round_trip(tmp_path: Path, seed: int) -> None:
    tax = random_taxonomy(seed, dag=seed % 2 == 1)
    path = tmp_path / "t.tsv"
    write_tsv(tax, path)
    back = read_tsv(path)
    # TSV groups the edges by parent (so the edge order changes) and drops display names and classes:
    # names, id order and edge set are kept, so the default-class fingerprint matches.
    same_structure(back, tax)
    assert back == Taxonomy(tax.edge_list(names=True), nodes=tax.names)


def test_tsv_virtual_root_becomes_real(tmp_path: Path) -> None:
    tax = Taxonomy([("a", "x"), ("b", "y")], virtual_root="Root")
    write_tsv(tax, tmp_path / "t.tsv")
    back = read_tsv(tmp_path / "t.tsv")
    same_structure(back, tax)
    assert back.virtual_root is None  # a TSV line cannot say that a root is virtual: only the flag differs


def test_hiagm_layout(tmp_path: Path) -> None:
    p = tmp_path / "rcv1.taxonomy"
    p.write_text("Root\tCCAT\tECAT\tGCAT\nCCAT\tC15\tC17\nC15\tC151\nECAT\tE11\n")
    tax = read_taxonomy(p)
    assert detect_format(p) == "tsv"
    assert tax.names == ("Root", "CCAT", "C15", "C151", "C17", "ECAT", "E11", "GCAT")
    assert tax.name == "rcv1" and tax.root == 0 and 0 not in tax.classes.tolist()
    write_tsv(tax, tmp_path / "out.tsv")
    assert (tmp_path / "out.tsv").read_text() == p.read_text()


@pytest.mark.parametrize(
    ("content", "pattern", "line"),
    [
        ("Root\tA\nA\n", "only a parent", 2),
        ("Root\tA B\nA B C\n", "only a parent.*spaces instead of tabs", 2),
        ("Root\tA\t\tB\n", "empty field 3", 1),
        ("Root\tA\nA\tx\tx\n", "duplicate edge", 2),
        ("Root\tA\nA\tB\nB\tRoot\n", "cycle", None),
        ("Root\tA\nA\ta1\nB\tb1\n", r"'B' is never connected.*2 roots", 3),
    ],
)
def test_tsv_errors(tmp_path: Path, content: str, pattern: str, line: int | None) -> None:
    p = tmp_path / "bad.tsv"
    p.write_text(content)
    with pytest.raises(TaxonomyError, match=pattern) as err:
        read_tsv(p)
    assert err.value.source == str(p)
    if line is not None:
        assert err.value.line == line
    else:
        assert err.value.line is not None


@pytest.mark.parametrize(
    ("names", "culprit"),
    [
        (["r", "\u200b"], "\u200b"),
        (["r", "\xad\u200d"], "\xad\u200d"),
        (["r", "caf\u00e9", "cafe\u0301"], "cafe\u0301"),
    ],
)
def test_writers_refuse_names_their_readers_refuse(tmp_path: Path, names: list[str], culprit: str) -> None:
    # Taxonomy() takes any string; a file is only written when it reads back, else the label is named.
    tax = Taxonomy([("r", n) for n in names[1:]], nodes=names)
    for fmt, file in (
        ("json", "t.json"),
        ("nested", "t.nested.json"),
        ("nodelink", "t.nl.json"),
        ("edges", "t.edges"),
        ("tsv", "t.tsv"),
        ("children", "t.children.json"),
    ):
        with pytest.raises(TaxonomyError, match=r"cannot be written .*reading the file back would refuse it") as err:
            write_taxonomy(tax, tmp_path / file, format=fmt)
        assert err.value.label == culprit and err.value.source == str(tmp_path / file), fmt
        assert not (tmp_path / file).exists(), fmt


def test_tsv_rejects_unwritable_names(tmp_path: Path) -> None:
    with pytest.raises(TaxonomyError, match="cannot be written"):
        write_tsv(Taxonomy([("r", "a\tb")]), tmp_path / "x.tsv")
    with pytest.raises(TaxonomyError, match="starts with '#'"):
        write_edge_list(Taxonomy([("r", "#a")]), tmp_path / "x.edges")
    with pytest.raises(TaxonomyError, match="leading/trailing"):
        write_edge_list(Taxonomy([("r", " a")]), tmp_path / "x.edges")
    with pytest.raises(TaxonomyError, match="single node"):
        write_tsv(Taxonomy([], nodes=["r"]), tmp_path / "x.tsv")


# ---------------------------------------------------------------------------------------------- nested JSON
@pytest.mark.parametrize("seed", range(20))
def test_nested_round_trip(tmp_path: Path, seed: int) -> None:
    tax = random_taxonomy(seed, dag=seed % 2 == 1, virtual_root=seed % 3 == 0)
    path = tmp_path / "t.json"
    write_nested_json(tax, path)
    back = read_nested_json(path, virtual_root=tax.virtual_root)
    # Nested JSON stores the shape only (display names and classes are lost). A tree comes back with the
    # same names and ids; a DAG's repeated subtrees merge again into the same nodes and edges, but a shared
    # node is met first under its first parent in depth-first order, so DAG ids may differ.
    if tax.is_tree:
        same_structure(back, tax)
        assert back == Taxonomy(
            tax.edge_list(names=True)[len(tax.children(0)) if tax.virtual_root else 0 :],
            nodes=[n for n in tax.names if n != tax.virtual_root],
            virtual_root=tax.virtual_root,
        )
    else:
        assert set(back.names) == set(tax.names)
        assert set(back.edge_list(names=True)) == set(tax.edge_list(names=True))
    assert read_taxonomy(path, virtual_root=tax.virtual_root) == back
    assert detect_format(path) == "nested"


def test_nested_forms() -> None:
    tax = taxonomy_from_nested({"r": {"a": ["x", {"y": ["z"]}], "b": None, "c": []}})
    assert tax.names == ("r", "a", "x", "y", "z", "b", "c")
    dag = taxonomy_from_nested({"r": {"a": {"x": {}}, "b": {"x": {}}}})
    assert not dag.is_tree and dag.parents(dag.index("x")) == (dag.index("a"), dag.index("b"))
    joined = taxonomy_from_nested({"a": {}, "b": {}}, virtual_root="top")
    assert joined.names == ("top", "a", "b")


@pytest.mark.parametrize(
    ("content", "pattern", "line"),
    [
        ('{"r": {\n  "a": 3}}', "expected an object, a list", 1),  # the line where the object holding "a" opens
        ('{"r": {"a": {}},\n "s": {}}', r"2 keys .*virtual_root=", 1),
        ('{"r": {\n "a": {\n  "r": {}}}}', "cycle", 1),  # the cycle's first edge r -> a
        ('{"r": {"a": {}}', "invalid JSON", 1),
        ("{}", "empty", None),
        ('{"r": [\n 1, 2]}', "a list may hold names", 1),
    ],
)
def test_nested_errors(tmp_path: Path, content: str, pattern: str, line: int | None) -> None:
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(TaxonomyError, match=pattern) as err:
        read_nested_json(p)
    assert err.value.source == str(p)
    if line is not None:
        assert err.value.line == line


# ---------------------------------------------------------------------------------------------- node-link
@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("key", ["edges", "links"])
def test_node_link_round_trip_is_lossless(tmp_path: Path, seed: int, key: str) -> None:
    tax = random_taxonomy(seed, dag=seed % 2 == 1, virtual_root=seed % 3 == 0)
    path = tmp_path / "t.json"
    write_node_link(tax, path, edges_key=key)  # type: ignore[arg-type]
    back = read_node_link(path)
    assert back.fingerprint == tax.fingerprint and back.display_names == tax.display_names
    assert back.virtual_root == tax.virtual_root and back.metadata == tax.metadata and back.name == tax.name
    assert read_taxonomy(path) == tax and detect_format(path) == "nodelink"
    # networkx reads it as the same graph
    g = nx.node_link_graph(json.loads(path.read_text()), edges=key)
    assert set(g.edges) == set(tax.edge_list(names=True))


def test_node_link_from_networkx(tmp_path: Path) -> None:
    g = nx.DiGraph([("root", "animal"), ("animal", "cat"), ("root", "car")])
    g.nodes["cat"]["label"] = "Cat"
    for key in ("edges", "links"):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(nx.node_link_data(g, edges=key)))
        tax = read_taxonomy(path)
        assert tax == Taxonomy(g.edges, nodes=list(g.nodes))
        assert tax.display_names[tax.index("cat")] == "Cat"


@pytest.mark.parametrize(
    ("data", "pattern", "line"),
    [
        (
            {
                "directed": True,
                "nodes": [{"id": "r"}, {"id": "a"}],
                "edges": [{"source": "r", "target": "a"}, {"source": "a", "target": "b"}],
            },
            r"edges\[1\] target 'b' is not in \"nodes\"",
            16,
        ),  # lines of json.dumps(indent=1): the edge's "{"
        ({"directed": True, "nodes": [{"id": "r"}, {"id": "r"}], "edges": []}, "duplicate node id 'r'", 7),
        ({"directed": True, "multigraph": True, "nodes": [{"id": "r"}], "edges": []}, "multigraph", 1),
        (
            {
                "directed": True,
                "nodes": [{"id": "r"}, {"id": "a"}, {"id": "b"}],
                "edges": [
                    {"source": "r", "target": "a"},
                    {"source": "a", "target": "b"},
                    {"source": "b", "target": "a"},
                ],
            },
            "cycle",
            None,
        ),
        (
            {
                "directed": True,
                "nodes": [{"id": "r"}, {"id": "a"}, {"id": "s"}],
                "edges": [{"source": "r", "target": "a"}],
            },
            "virtual_root=",
            None,
        ),
        ({"directed": True, "nodes": [{"id": "r"}], "links": [{"source": "r", "target": "r"}]}, "self-loop", 9),
    ],
)
def test_node_link_errors(tmp_path: Path, data: dict, pattern: str, line: int | None) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data, indent=1))
    with pytest.raises(TaxonomyError, match=pattern) as err:
        read_node_link(p)
    assert err.value.source == str(p)
    if line is not None:
        assert err.value.line == line


# ---------------------------------------------------------------------------------------------- label paths
def test_label_paths_names_and_classes() -> None:
    tax = taxonomy_from_label_paths(["Science/Physics/Optics", "Science/Biology", "Arts/Physics", "Science"])
    assert tax.names == (
        "root",
        "Science",
        "Science/Physics",
        "Science/Physics/Optics",
        "Science/Biology",
        "Arts",
        "Arts/Physics",
    )
    assert tax.display_names[tax.index("Arts/Physics")] == "Physics"
    assert {tax.names[c] for c in tax.classes} == {
        "Science/Physics/Optics",
        "Science/Biology",
        "Arts/Physics",
        "Science",
    }
    assert tax.virtual_root == "root"
    lists = taxonomy_from_label_paths([["Science", "Physics", ""], ["Arts", "nan", ""]], separator="::")
    assert lists.names == ("root", "Science", "Science::Physics", "Arts")
    single = taxonomy_from_label_paths(["A.b.c", "A.d"], separator=".")
    assert single.names == ("A", "A.b", "A.b.c", "A.d") and single.virtual_root is None


@pytest.mark.parametrize("seed", range(20))
def test_label_paths_round_trip(tmp_path: Path, seed: int) -> None:
    tax = random_taxonomy(seed, virtual_root=seed % 2 == 0)
    path = tmp_path / "t.paths"
    write_label_paths(tax, path)
    back = read_label_paths(path, root=tax.virtual_root or "root")  # a virtual root's name is not written
    # Label paths name nodes by their full display-name path: same shape and display names, new names.
    isomorphic_by_display(back, tax)
    # From then on the round trip is exact.
    write_label_paths(back, tmp_path / "again.paths")
    again = read_taxonomy(tmp_path / "again.paths", root=tax.virtual_root or "root")
    assert again.fingerprint == back.fingerprint
    assert (tmp_path / "again.paths").read_text() == path.read_text()


def test_label_paths_json_list(tmp_path: Path) -> None:
    p = tmp_path / "paths.json"
    p.write_text(json.dumps([["A", "B"], ["A", "C"], "D/E"]))
    tax = read_taxonomy(p)
    assert detect_format(p) == "paths"
    assert tax.names == ("root", "A", "A/B", "A/C", "D", "D/E")


@pytest.mark.parametrize(
    ("content", "pattern", "line"),
    [
        ("a/b\na//c\n", "empty component", 2),
        ("root/x\nother\n", "root name 'root'", None),
    ],
)
def test_label_path_errors(tmp_path: Path, content: str, pattern: str, line: int | None) -> None:
    p = tmp_path / "bad.paths"
    p.write_text(content)
    with pytest.raises(TaxonomyError, match=pattern) as err:
        read_label_paths(p)
    assert err.value.source == str(p)
    if line is not None:
        assert err.value.line == line
    p = tmp_path / "bad.json"
    p.write_text('[["a", "b"],\n ["a", 3.5]]')
    with pytest.raises(TaxonomyError, match="must be a string or a list") as err:
        read_label_paths(p)
    assert err.value.line == 2


def test_label_paths_need_a_tree(tmp_path: Path) -> None:
    dag = Taxonomy([("r", "a"), ("r", "b"), ("a", "x"), ("b", "x")])
    for writer in (write_label_paths, write_folders):
        with pytest.raises(TaxonomyError, match="DAG"):
            writer(dag, tmp_path / "x.paths")


# ---------------------------------------------------------------------------------------------- folders
def test_read_folders(tmp_path: Path) -> None:
    root = tmp_path / "train"
    for sub in ("animal/cat", "animal/dog", "plant/cat", ".hidden/x", "vehicle"):
        (root / sub).mkdir(parents=True)
    (root / "animal/cat/1.jpg").write_bytes(b"")
    (root / "plant/cat/2.jpg").write_bytes(b"")
    (root / "animal/.DS_Store").write_bytes(b"")
    (root / "vehicle/3.jpg").write_bytes(b"")
    tax = read_taxonomy(root)
    assert detect_format(root) == "folders"
    assert tax.names == ("root", "animal", "animal/cat", "animal/dog", "plant", "plant/cat", "vehicle")
    assert tax.display_names[tax.index("plant/cat")] == "cat" and tax.display_names[0] == "train"
    assert [tax.names[c] for c in tax.classes] == ["animal/cat", "plant/cat", "vehicle"]
    assert read_folders(root, classes="all").classes.tolist() == list(range(1, 7))
    assert tax.name == "train"


def test_folders_round_trip_and_symlink_loop(tmp_path: Path) -> None:
    tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")], display_names={"x": "Ex"})
    write_taxonomy(tax, tmp_path / "tree")
    assert (tmp_path / "tree/a/Ex").is_dir()
    back = read_folders(tmp_path / "tree")
    assert [back.parents(i) for i in range(back.num_nodes)] == [tax.parents(i) for i in range(tax.num_nodes)]
    assert back.display_names[1:] == tax.display_names[1:]
    assert back.classes.tolist() == list(range(1, 5))  # no files: every folder is a class
    os.symlink(tmp_path / "tree", tmp_path / "tree/a/loop")
    with pytest.raises(TaxonomyError, match="loops back"):
        read_folders(tmp_path / "tree")
    assert read_folders(tmp_path / "tree", follow_symlinks=False).num_nodes == 5
    with pytest.raises(FileNotFoundError):
        read_folders(tmp_path / "nope")


# ---------------------------------------------------------------------------------------------- front door
def test_detect_format_and_write_by_extension(tmp_path: Path) -> None:
    tax = Taxonomy([("root", "a"), ("a", "b"), ("root", "c")])
    expected = {
        "t.json": "json",
        "t.json.gz": "json",
        "t.tsv": "tsv",
        "t.csv": "edges",
        "t.edges": "edges",
        "t.txt": "edges",
        "t.paths": "paths",
        "t.tsv.gz": "tsv",
    }
    for name, fmt in expected.items():
        write_taxonomy(tax, tmp_path / name)
        assert detect_format(tmp_path / name) == fmt, name
        back = read_taxonomy(tmp_path / name)
        if fmt == "paths":
            isomorphic_by_display(back, tax)
        else:
            assert back == tax, name
    assert "," in (tmp_path / "t.csv").read_text()
    (tmp_path / "sniff.txt").write_text("root\ta\tb\na\tc\n")
    assert detect_format(tmp_path / "sniff.txt") == "tsv"
    (tmp_path / "sniff2.txt").write_text("a/b\na/c\n")
    assert detect_format(tmp_path / "sniff2.txt") == "paths"
    for fmt in ("nested", "nodelink"):
        write_taxonomy(tax, tmp_path / f"{fmt}.json", format=fmt)
        assert detect_format(tmp_path / f"{fmt}.json") == fmt
        assert read_taxonomy(tmp_path / f"{fmt}.json") == tax
    with pytest.raises(ValueError, match=r"unknown taxonomy format 'xml'; registered: children, edges .*json .*tsv"):
        read_taxonomy(tmp_path / "t.tsv", format="xml")
    with pytest.raises(ValueError, match=r"unknown taxonomy format 'nestd' \(did you mean 'nested'"):
        write_taxonomy(tax, tmp_path / "t.json", format="nestd")
    assert read_taxonomy(tmp_path / "nested.json", format="nested") == tax
    with pytest.raises(ValueError, match="cannot tell the format"):
        write_taxonomy(tax, tmp_path / "t.xml")
    with pytest.raises(ValueError, match="takes no options"):
        read_taxonomy(tmp_path / "t.json", virtual_root="x")


def test_reader_options_are_checked(tmp_path: Path) -> None:
    p = tmp_path / "t.tsv"
    p.write_text("R\ta\n")
    with pytest.raises(ValueError, match="format 'tsv' takes no option 'separator'"):
        read_taxonomy(p, separator="/")
    q = tmp_path / "t.paths"
    q.write_text("a/b\nc\n")
    assert read_taxonomy(q, virtual_root="TOP").names == ("TOP", "a", "a/b", "c")
    assert read_taxonomy(p, name="custom", metadata={"k": 1}).name == "custom"


def test_large_round_trip_is_fast_enough(tmp_path: Path) -> None:
    # 20k nodes through every lossless format (the shipped ImageNet-21K trees are this size).
    rng = np.random.default_rng(0)
    n = 20000
    parents = [int(rng.integers(0, max(1, i // 3 + 1))) for i in range(1, n)]
    tax = Taxonomy([(f"n{p}", f"n{i}") for i, p in enumerate(parents, 1)], name="big")
    for name in ("big.json.gz", "big.tsv.gz", "big.edges"):
        write_taxonomy(tax, tmp_path / name)
        assert read_taxonomy(tmp_path / name) == tax
    write_node_link(tax, tmp_path / "nl.json")
    assert read_node_link(tmp_path / "nl.json") == tax


# ---------------------------------------------------------------------------------------------- docs
DOC = Path(__file__).resolve().parents[1] / "docs" / "taxonomy.md"


def doc_blocks() -> list[str]:
    import re

    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S) if DOC.exists() else []


@pytest.mark.parametrize("k", range(len(doc_blocks())))
def test_docs_examples(k: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(doc_blocks()[k], f"{DOC}:block{k}", "exec"), {"__name__": "__doc_example__"})


def test_package_exports() -> None:
    import hiercls.taxonomy as pkg

    for name in pkg.__all__:
        assert getattr(pkg, name) is not None, name
    # Every public name of the submodules is reachable from the package, and no name shadows a submodule.
    for module in (pkg.core, pkg.imagenet, pkg.io, pkg.regions, pkg.registry, pkg.wordnet):
        assert getattr(pkg, module.__name__.rsplit(".", 1)[1]) is module
        for name in module.__all__:
            if name != "wordnet":
                assert getattr(pkg, name) is getattr(module, name), name
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = pkg.not_a_name


# ---------------------------------------------------------------------------------------------- every writer
DAG_FORMATS = ("json", "edges", "tsv", "children", "nested", "nodelink")  # paths and folders hold trees only
SUFFIX = {"json": ".json.gz", "nested": ".nested.json", "children": ".ch.json", "nodelink": ".nl.json"}


def _paths_of(tax: Taxonomy, skip_root: bool) -> list[tuple[str, ...]]:
    """Every node as its display-name path from the root: what label paths and folder trees hold."""
    return sorted(tuple(tax.display_names[i] for i in tax.path(n)[skip_root:]) for n in range(skip_root, tax.num_nodes))


def _assert_read_back(fmt: str, tax: Taxonomy, back: Taxonomy) -> None:
    if fmt in ("paths", "folders"):  # nodes named by their display-name paths: same paths, same display names
        skip = fmt == "folders"  # the root is the folder written into, named by the path
        assert _paths_of(back, skip or back.virtual_root is not None) == _paths_of(
            tax, skip or tax.virtual_root is not None
        )
        return
    assert set(back.names) == set(tax.names)
    assert set(back.edge_list(names=True)) == set(tax.edge_list(names=True))
    if fmt in ("json", "nodelink"):  # the formats that hold display names
        assert back.display_names == tax.display_names


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_writer_round_trips_or_refuses(fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 28: 1,000 random taxonomies per format (any Unicode, tab/newline/CR and other controls, deep chains,
    wide stars; tests/_generators.unicode_taxonomy) read back with the same nodes, edges and display names, or
    the writer refuses, naming the label, and leaves no file."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not under test: 1,000 files in seconds
    rng, written = np.random.default_rng(28), 0
    for k in range(1000):
        tax = unicode_taxonomy(rng, dag=fmt in DAG_FORMATS)
        path = tmp_path / f"t{k}{SUFFIX.get(fmt, '.' + fmt)}"
        note = f"example {k}: names {tax.names!a}, display names {tax.display_names!a}"
        try:
            write_taxonomy(tax, path, format=fmt)
        except TaxonomyError as err:
            assert err.label in (*tax.names, *tax.display_names), f"{err}; {note}"
            assert repr(err.label) in str(err) or ascii(err.label) in str(err), f"{err}; {note}"
            assert not path.exists(), note
            continue
        try:
            _assert_read_back(fmt, tax, read_taxonomy(path, format=fmt))
        except (TaxonomyError, AssertionError) as err:
            raise AssertionError(f"{fmt} did not read back what it wrote ({err!r}); {note}") from None
        written += 1
    assert written >= 500, written  # most examples are written: the round trip itself is what is tested
