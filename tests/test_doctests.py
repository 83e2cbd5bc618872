"""Every docstring example in the package and every ``>>>`` example in docs/ runs as written."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import hiercls

ROOT = Path(__file__).resolve().parents[1]


def _import_error(name: str) -> None:
    raise ImportError(f"cannot import {name} while collecting the docstring examples")  # never skip a package


# Every module of the package, found by walking it (a module added later is collected without editing this
# file); each module's docstrings run once, here and nowhere else. A failing import is a failure, not a skip.
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(hiercls.__path__, "hiercls.", onerror=_import_error)
    if not m.name.endswith("__main__")
)
DOCS = sorted((ROOT / "docs").glob("*.md"))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@pytest.mark.parametrize("module_name", MODULES)
def test_module_docstring_examples(module_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=FLAGS, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {module_name}"


def test_walk_finds_every_module_file() -> None:
    """The walk misses no ``.py`` file of the package (e.g. one in a folder without ``__init__.py``)."""
    pkg = Path(hiercls.__file__).parent
    files = {
        ".".join(("hiercls", *p.relative_to(pkg).with_suffix("").parts)).removesuffix(".__init__")
        for p in pkg.rglob("*.py")
        if p.name != "__main__.py"
    }
    assert files - {"hiercls"} == set(MODULES)
    assert {"hiercls._checks", "hiercls._registry"} <= set(MODULES)


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_docs_examples(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    result = doctest.testfile(str(path), module_relative=False, optionflags=FLAGS, verbose=False)
    assert result.failed == 0, f"{result.failed} example(s) failed in docs/{path.name}"


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README.md has no python block"
    namespace: dict[str, object] = {}
    exec(compile("\n".join(blocks), "README.md", "exec"), namespace)  # the blocks build on each other
