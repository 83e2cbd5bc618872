"""The package's import structure: layers you can see (docs/architecture.md, "Layers").

Reads every module's imports with :mod:`ast` (nothing is imported) and fails on an import circle, an import of a
higher layer, a private name (or a private module) taken from another package, and an import inside a function,
except of the optional heavy dependencies named in :data:`LAZY_OK` (loaded only by the features that need them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "hiercls"

LAYERS: list[set[str]] = [
    {"_textio", "_registry", "_checks", "_autoregister"},
    {"taxonomy"},
    {"losses", "decode", "metrics", "data"},
    {"conformal"},
    {"heads"},
    {"models"},
    {"evaluation"},
    {"train"},
    {"cli", "__main__", "__init__"},
]
"""Bottom-up; a module may import its own layer's packages and the layers below."""

LAZY_OK = {
    "timm",
    "transformers",
    "matplotlib",
    "PIL",
    "nltk",
    "torchvision",
    "sklearn",
    "lightning",
    "tensorboard",
    "wandb",
    "mlflow",
    "torch.utils.tensorboard",
    "datasets",
    "pyarrow",
}
"""Third-party packages that may be imported inside a function: heavy to import, needed by one feature only."""


def _module_name(path: Path) -> str:
    parts = ["hiercls", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, group in enumerate(LAYERS) if top in group)


def _package(module: str) -> str:
    """``hiercls.decode`` for ``hiercls.decode.rules``; the module itself for a top-level shared module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if MODULES[module].name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _own(target: str) -> str | None:
    """The hiercls module that ``target`` (a dotted import path) lives in, or None for another package."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


class _Imports(ast.NodeVisitor):
    """Collects (target module, imported name, inside a function, line) for every import of one module."""

    def __init__(self, module: str) -> None:
        self.module, self.depth, self.found = module, 0, []

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_If(self, node: ast.If) -> None:
        if getattr(node.test, "id", getattr(node.test, "attr", "")) != "TYPE_CHECKING":
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, None, self.depth > 0, node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve(self.module, node)
        for alias in node.names:
            full = f"{base}.{alias.name}"
            self.found.append((full if full in MODULES else base, alias.name, self.depth > 0, node.lineno))


def _imports() -> dict[str, list[tuple[str, str | None, bool, int]]]:
    out = {}
    for module, path in MODULES.items():
        visitor = _Imports(module)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        out[module] = visitor.found
    return out


IMPORTS = _imports()


def _edges() -> dict[str, set[str]]:
    """Module -> the hiercls modules it imports (a package's ``__init__`` re-exporting its children excluded)."""
    edges: dict[str, set[str]] = {}
    for module, found in IMPORTS.items():
        for target, _, _, _ in found:
            own = _own(target)
            is_init = MODULES[module].name == "__init__.py"
            if own and own != module and not (is_init and own.startswith(module + ".")):
                edges.setdefault(module, set()).add(own)
    return edges


def _circles(edges: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_the_walker_sees_the_package():
    assert len(MODULES) > 50
    assert "hiercls.decode" in MODULES and "hiercls.taxonomy.core" in MODULES
    # every module belongs to a layer
    assert all(_layer(m) >= 0 for m in MODULES)


def test_no_import_circles():
    assert _circles(_edges(), list(MODULES)) == []


def test_no_upward_imports():
    upward = [
        f"{module} -> {target}"
        for module, targets in _edges().items()
        for target in targets
        if _layer(target) > _layer(module)
    ]
    assert upward == []


def test_no_private_names_across_packages():
    private = []
    for module, found in IMPORTS.items():
        for target, name, _, line in found:
            own = _own(target)
            if own is None or _package(own) == _package(module):
                continue
            hidden_module = any(part.startswith("_") for part in own.split(".")[2:])
            if hidden_module or (name and name.startswith("_") and not name.startswith("__")):
                private.append(f"{module}:{line} takes {name or own} from {own}")
    assert private == []


def test_imports_inside_functions_are_only_optional_heavy_dependencies():
    inside = [
        f"{module}:{line} imports {target}"
        for module, found in IMPORTS.items()
        for target, _, in_function, line in found
        if in_function and target.split(".")[0] not in LAZY_OK and target not in LAZY_OK
    ]
    assert inside == []


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": {"c"}}, []),
    ],
)
def test_circle_finder_on_known_graphs(edges, expected):
    assert _circles(edges, ["a", "b", "c"]) == expected
