"""The registry of shipped taxonomies and ``hiercls taxonomy`` (show, stats, convert, validate, list)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hiercls.cli import ARGUMENTS, main, names
from hiercls.taxonomy import (
    Taxonomy,
    TaxonomyError,
    list_taxonomies,
    load_taxonomy,
    read_taxonomy,
    registry,
    write_json,
)


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for the shipped taxonomies folder with two small taxonomies."""
    folder = tmp_path / "shipped"
    folder.mkdir()
    animals = Taxonomy(
        [("animal", "cat"), ("animal", "dog"), ("animal", "bird"), ("bird", "owl")],
        name="animals",
        metadata={"description": "Four animals\nsecond line", "source": "test"},
    )
    write_json(animals, folder / "animals.json.gz")
    dag = Taxonomy(
        [("r", "a"), ("r", "b"), ("a", "x"), ("b", "x")],
        name="tinydag",
        metadata={"description": "A diamond", "counts": {"leaves": 1, "edges": 4}, "kind": "diamond"},
    )
    write_json(dag, folder / "tinydag.json")
    (folder / "README.md").write_text("not a taxonomy")
    monkeypatch.setattr(registry, "shipped_taxonomy_dirs", lambda: [folder])
    return folder


def test_load_by_name_and_path(shipped: Path) -> None:
    tax = load_taxonomy("animals")
    assert tax.names == ("animal", "cat", "dog", "bird", "owl") and tax.name == "animals"
    assert load_taxonomy("animals") is tax  # shipped taxonomies are cached (they are immutable)
    assert registry.taxonomy_path("tinydag") == shipped / "tinydag.json"
    assert load_taxonomy(str(shipped / "tinydag.json")) == load_taxonomy("tinydag")
    assert load_taxonomy(shipped / "animals.json.gz") == tax


def test_unknown_name_lists_available(shipped: Path) -> None:
    with pytest.raises(TaxonomyError, match=r"unknown taxonomy 'animal'.*did you mean 'animals'.*animals, tinydag"):
        load_taxonomy("animal")
    with pytest.raises(FileNotFoundError, match="shipped taxonomies: animals, tinydag"):
        load_taxonomy("missing/tree.tsv")
    with pytest.raises(ValueError, match="only apply to files"):
        load_taxonomy("animals", virtual_root="x")


def test_list_taxonomies_reads_metadata(shipped: Path) -> None:
    entries = {e["name"]: e for e in list_taxonomies()}
    assert set(entries) == {"animals", "tinydag"}
    a = entries["animals"]
    assert a["description"] == "Four animals" and a["nodes"] == 5 and a["leaves"] == 3 and a["kind"] == "tree"
    assert a["classes"] == 4 and a["source"] == "test" and a["path"].endswith("animals.json.gz")
    d = entries["tinydag"]
    assert d["kind"] == "dag" and d["leaves"] == 1 and d["nodes"] == 4


def test_list_reads_hand_written_files(shipped: Path) -> None:
    # "edges" first and an "edges" key inside metadata: the quick header read must fall back to a full parse.
    (shipped / "handmade.json").write_text(
        json.dumps(
            {
                "edges": [["r", "a"]],
                "format": "hiercls.taxonomy",
                "version": 1,
                "nodes": ["r", "a"],
                "metadata": {"description": "by hand", "edges": 1},
            }
        )
    )
    entries = {e["name"]: e for e in list_taxonomies()}
    assert entries["handmade"]["description"] == "by hand" and entries["handmade"]["nodes"] == 2
    assert load_taxonomy("handmade").names == ("r", "a")


def test_real_shipped_taxonomies_load() -> None:
    entries = list_taxonomies()
    if not entries:
        pytest.skip("no shipped taxonomies in taxonomies/ yet")
    for e in entries:
        tax = load_taxonomy(e["name"])
        assert tax.num_nodes == e["nodes"] and tax.num_leaves == e["leaves"], e["name"]
        assert e["kind"] == ("tree" if tax.is_tree else "dag") and len(tax.classes) == e["classes"], e["name"]
        assert e["description"], e["name"]


# ---------------------------------------------------------------------------------------------- CLI
def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["taxonomy", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_show(shipped: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, "show", "animals")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("animals: tree, 5 nodes, 3 leaves")
    assert lines[1:] == ["animal  (3 leaves)", "├── cat", "├── dog", "└── bird  (1 leaf)", "    └── owl"]
    rc, out, _ = run_cli(capsys, "show", "animals", "--depth", "1", "--max-children", "2")
    assert out.splitlines()[1:] == ["animal  (3 leaves)", "├── cat", "├── dog", "└── ... 1 more (1 leaf)"]
    rc, out, _ = run_cli(capsys, "show", "animals", "--depth", "0")
    assert out.splitlines()[1:] == ["animal  (3 leaves)"]
    rc, out, _ = run_cli(capsys, "show", "tinydag")
    assert "x  (also under 'a', expanded there)" in out


def test_show_collapses_deep_levels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "deep.edges"
    p.write_text("r a\na b\nb c\nc d\n")
    rc, out, _ = run_cli(capsys, "show", str(p), "--depth", "2")
    assert rc == 0
    assert out.splitlines()[1:] == ["r  (1 leaf)", "└── a  (1 leaf)", "    └── b  (1 leaf)", "        └── ... 1 child"]


def test_stats_json_and_table(shipped: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, "stats", "animals", "--json")
    assert rc == 0
    stats = json.loads(out)
    assert stats == json.loads(json.dumps(load_taxonomy("animals").stats()))
    rc, out, _ = run_cli(capsys, "stats", "tinydag")
    assert rc == 0 and "multi_parent_nodes" in out and "dag" in out


def test_convert_and_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "rcv1.taxonomy"
    src.write_text("Root\tCCAT\tECAT\nCCAT\tC15\n")
    dst = tmp_path / "rcv1.json.gz"
    rc, out, _ = run_cli(capsys, "convert", str(src), str(dst))
    assert rc == 0 and out.startswith(f"wrote {dst}")
    assert read_taxonomy(dst) == read_taxonomy(src)
    rc, out, _ = run_cli(capsys, "convert", str(dst), str(tmp_path / "out.txt"), "--to", "paths")
    assert rc == 0 and (tmp_path / "out.txt").read_text().splitlines() == [
        "Root/CCAT",
        "Root/CCAT/C15",
        "Root/ECAT",
    ]  # internal classes get a line too, so the classes come back
    rc, out, _ = run_cli(capsys, "validate", str(dst))
    assert rc == 0 and out.startswith(f"OK {dst}: rcv1: tree, 4 nodes, 2 leaves")
    bad = tmp_path / "bad.tsv"
    bad.write_text("Root\tA\nA\tB\nB\tA\n")
    rc, out, err = run_cli(capsys, "validate", str(bad))
    assert rc == 1 and out == "" and f"INVALID {bad}: {bad}:" in err and "cycle" in err


def test_convert_dag_to_tree_and_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "dag.edges"
    src.write_text("r a\nr b\na x\nb x\n")
    rc, _, _ = run_cli(capsys, "convert", str(src), str(tmp_path / "tree.tsv"), "--tree", "first")
    assert rc == 0 and read_taxonomy(tmp_path / "tree.tsv").is_tree
    two = tmp_path / "two.edges"
    two.write_text("a x\nb y\n")
    rc, _, err = run_cli(capsys, "validate", str(two))
    assert rc == 1 and "virtual_root" in err
    rc, out, _ = run_cli(capsys, "validate", str(two), "--virtual-root", "ALL")
    assert rc == 0 and "5 nodes" in out
    paths = tmp_path / "p.txt"
    paths.write_text("a::b\na::c\n")
    rc, out, _ = run_cli(capsys, "validate", str(paths), "--format", "paths", "--separator", "::")
    assert rc == 0 and "3 nodes" in out  # a single top-level component is the root itself
    rc, _, err = run_cli(capsys, "show", str(two), "--separator", "::")
    assert rc == 2 and "takes no option 'separator'" in err


def test_list_and_errors(shipped: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(capsys, "list")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split() == ["name", "kind", "nodes", "leaves", "description"]
    assert lines[1].split()[:4] == ["animals", "tree", "5", "3"] and "Four animals" in lines[1]
    rc, _, err = run_cli(capsys, "show", "nope")
    assert rc == 2 and "unknown taxonomy 'nope'" in err and "animals" in err
    with pytest.raises(SystemExit):
        main(["taxonomy", "frobnicate"])


# The packages that take seconds to import; parsing must not need them.
HEAVY = ("torch", "timm", "transformers", "numba", "scipy")
PROBE = f"""
import sys
from hiercls.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(*[m for m in {HEAVY!r} if m in sys.modules])
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        [],
        *([cmd, "--help"] for cmd in ARGUMENTS),
        ["taxonomy", "show", "--help"],
        ["decode", "--cost", "x"],
    ],
    ids=lambda argv: " ".join(argv) or "(none)",
)
def test_help_and_argument_errors_import_nothing_heavy(argv: list[str]) -> None:
    """``--help`` and an argument error answer from the argument modules alone (a fresh interpreter each)."""
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines and lines[-1] == "", f"hiercls {' '.join(argv)} imported {lines[-1] if lines else '?'}"
    if argv[-1:] == ["--help"]:
        assert "usage: hiercls" in done.stdout
    elif argv:
        assert "invalid choice: 'x'" in done.stderr


def test_parser_names_match_their_owners() -> None:
    """The parsers' copies of the decoder, cost and format names (``hiercls.cli.names``) equal their registries."""
    from hiercls.decode import COST_KINDS, RULES
    from hiercls.models.inference import PREDICTION_FORMATS
    from hiercls.taxonomy import FORMATS

    owners = {
        "RULES": RULES,
        "COST_KINDS": COST_KINDS,
        "TAXONOMY_FORMATS": FORMATS,
        "PREDICTION_FORMATS": PREDICTION_FORMATS,
    }
    for name, owned in owners.items():
        assert getattr(names, name) == tuple(owned), f"hiercls/cli/names.py: {name} must be {tuple(owned)}"
