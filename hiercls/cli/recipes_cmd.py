"""``hiercls recipes``: the work, once the arguments parsed (:mod:`hiercls.cli.recipes_args`).

The recipes are the checkout's ``recipes/*.yaml``, installed as the data package ``hiercls.recipes`` (one copy of
each file, mapped by pyproject.toml like ``taxonomies/``), so a wheel user has them too. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hiercls._checks import did_you_mean
from hiercls._textio import load_yaml, package_data_dirs, read_text

__all__ = ["recipe_description", "resolve_recipe", "run", "shipped_recipe", "shipped_recipes"]


def shipped_recipes() -> dict[str, Path]:
    """The shipped recipes by name (the file name without ``.yaml``), sorted.

    Example:
        >>> recipes = shipped_recipes()
        >>> "quickstart" in recipes and recipes["quickstart"].name
        'quickstart.yaml'
    """
    found: dict[str, Path] = {}
    for folder in package_data_dirs("hiercls.recipes", "recipes"):
        for path in sorted(folder.glob("*.yaml")):
            found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def shipped_recipe(name: str) -> Path:
    """The file of the shipped recipe ``name`` (``"quickstart"`` or ``"quickstart.yaml"``).

    Raises:
        ValueError: no shipped recipe has that name (the message lists those shipped).

    Example:
        >>> shipped_recipe("quickstart.yaml") == shipped_recipe("quickstart")
        True
        >>> shipped_recipe("quikstart")
        Traceback (most recent call last):
        ...
        ValueError: unknown recipe 'quikstart' (did you mean 'quickstart'?); shipped recipes: ...
    """
    recipes = shipped_recipes()
    key = name.removesuffix(".yaml")
    if key in recipes:
        return recipes[key]
    listed = ", ".join(recipes) or "none are installed"
    raise ValueError(f"unknown recipe {name!r}{did_you_mean(key, recipes)}; shipped recipes: {listed}")


def resolve_recipe(recipe: str | os.PathLike[str]) -> Path:
    """The recipe file ``hiercls train RECIPE`` reads: ``recipe`` itself when that file exists; else, for a bare
    name (``quickstart``, ``quickstart.yaml``) or the documented ``recipes/<name>.yaml``, the shipped recipe of that
    name (so the docs' commands work from a wheel install too); else ``recipe``, for the reader's not-found error.

    Example:
        >>> resolve_recipe("quickstart") == shipped_recipe("quickstart")
        True
        >>> str(resolve_recipe("runs/my_recipe.yaml"))
        'runs/my_recipe.yaml'
    """
    path = Path(recipe)
    if path.exists() or path.parts[:-1] not in ((), ("recipes",)):
        return path
    return shipped_recipes().get(path.name.removesuffix(".yaml"), path)


def recipe_description(path: str | os.PathLike[str]) -> str:
    """The ``description`` of a recipe file (``""`` when it has none).

    Example:
        >>> recipe_description(shipped_recipe("quickstart")).startswith("MiniLM on WordNet glosses")
        True
    """
    data = load_yaml(read_text(path, "recipe"), str(path))
    return str(data.get("description") or "") if isinstance(data, dict) else ""


def _copy(name: str, dest: str) -> Path:
    source = shipped_recipe(name)
    target = Path(dest)
    if target.is_dir():
        target = target / source.name
    try:
        with open(target, "xb") as f:  # "x": an existing file is never replaced, not even in a race
            f.write(source.read_bytes())
    except FileExistsError:
        raise FileExistsError(
            f"{target} exists; 'hiercls recipes copy' never overwrites a file: name another DEST or remove it"
        ) from None
    return target


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        recipes = shipped_recipes()
        width = max(map(len, recipes), default=0)
        for name, path in recipes.items():
            print(f"{name:<{width}}  {recipe_description(path)}")
        if recipes:
            print(f"\nfiles: {next(iter(recipes.values())).parent}/; copy one to edit it: hiercls recipes copy NAME")
        return 0
    if args.action == "show":
        sys.stdout.write(read_text(shipped_recipe(args.name), "recipe"))
        return 0
    target = _copy(args.name, args.dest)
    print(f"wrote {target}; train it with: hiercls train {target}")
    return 0
