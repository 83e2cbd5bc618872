"""Random taxonomies shared by the property tests: see ``tests/_generators.py`` (kept for the modules that import
this name)."""

from _generators import random_tree

__all__ = ["random_tree"]
