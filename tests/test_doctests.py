"""Every docstring example in the package and every code example in docs/ runs as written.

docs/*.md: ``>>>`` examples run as doctests, every other ```python block runs (a file's blocks in order, in one
namespace), a block that deliberately cannot run here carries ``<!-- not run: reason -->`` on the line before its
fence, and every ``hiercls ...`` command of a shell block must parse.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import re
import shlex
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


#: A fenced block of a doc: its language, first line number and text (the fences left out).
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", flags=re.S | re.M)
#: The marker put on the line before a fence that deliberately cannot run here, with its reason:
#: ``<!-- not run: needs a CUDA GPU -->``.
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->\s*$")


def doc_blocks(path: Path, languages: tuple[str, ...]) -> list[tuple[int, str, str | None]]:
    """``(line, code, reason not run or None)`` of the fenced blocks of ``path`` in ``languages``."""
    text = path.read_text(encoding="utf-8")
    blocks = []
    for m in FENCE.finditer(text):
        if m.group(1) not in languages:
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        blocks.append((line, m.group(2), marker.group(1) if marker else None))
    return blocks


def _link_repository_folders(tmp_path: Path) -> None:
    """Examples run in a scratch folder where the repository's recipes/ and data/ are where the docs say."""
    for name in ("recipes", "data"):
        if (ROOT / name).is_dir():
            (tmp_path / name).symlink_to(ROOT / name)


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_docs_python_blocks_run(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block without ``>>>`` (those run as doctests above) runs, the blocks of a file in order in
    one namespace (they build on each other); a block marked ``<!-- not run: reason -->`` is skipped, and the
    reason must be given."""
    monkeypatch.chdir(tmp_path)
    _link_repository_folders(tmp_path)
    namespace: dict[str, object] = {"__name__": f"docs.{path.stem}"}
    for line, code, reason in doc_blocks(path, ("python", "py")):
        if ">>>" in code:
            continue  # a doctest block: test_docs_examples runs it
        if reason is not None:
            assert reason, f"docs/{path.name}:{line}: a 'not run' block must say why"
            continue
        # Line numbers in a traceback are the doc's: the block is compiled at its place in the file.
        exec(compile("\n" * line + code, f"docs/{path.name}", "exec"), namespace)


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_docs_shell_commands_parse(path: Path) -> None:
    """Every ``hiercls ...`` command in a shell block of the docs is a valid command line (parsed, not run)."""
    from hiercls.cli import build_parser

    parser = build_parser()
    for line, code, _ in doc_blocks(path, ("bash", "sh", "shell", "console", "", "text")):
        transcript = not code.startswith(("hiercls", ".venv", "python", "torchrun", "bash", "#"))
        for i, raw in enumerate(code.replace("\\\n", " ").splitlines()):
            if transcript and not raw.startswith("$ "):
                continue  # a transcript: commands after "$ ", the rest is their output
            cmd = raw.strip().removeprefix("$ ")
            for prefix in (".venv/bin/", "python -m ", "torchrun --nproc_per_node 2 -m "):
                cmd = cmd.removeprefix(prefix)
            if not cmd.startswith("hiercls "):
                continue
            argv = shlex.split(cmd.split(" #", 1)[0].split(" | ", 1)[0])[1:]
            try:
                parser.parse_args(argv)
            except SystemExit as err:
                pytest.fail(f"docs/{path.name}:{line + 1 + i}: {cmd!r} does not parse (exit {err.code})")


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README.md has no python block"
    namespace: dict[str, object] = {}
    exec(compile("\n".join(blocks), "README.md", "exec"), namespace)  # the blocks build on each other


def test_cli_help_examples_parse() -> None:
    """The example command lines that ``hiercls <command> --help`` shows (its epilog) are valid command lines."""
    from hiercls.cli import ARGUMENTS, build_parser

    parser = build_parser()
    for name, module in ARGUMENTS.items():
        text = (module.__doc__ or "").split("Examples::", 1)
        for raw in text[1].replace("\\\n", " ").splitlines() if len(text) == 2 else []:
            cmd = raw.strip()
            if cmd.startswith("hiercls "):
                try:
                    parser.parse_args(shlex.split(cmd.split(" #", 1)[0])[1:])
                except SystemExit as err:
                    pytest.fail(f"hiercls {name} --help example {cmd!r} does not parse (exit {err.code})")
