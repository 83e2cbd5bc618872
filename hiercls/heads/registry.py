"""Registry of heads by name: :func:`register_head`, :func:`create_head`, :func:`list_heads`."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any, TypeVar

from hiercls.heads.base import HierarchicalHead
from hiercls.taxonomy import Taxonomy

__all__ = ["create_head", "get_head_class", "list_heads", "register_head"]

_HEADS: dict[str, type[HierarchicalHead]] = {}
H = TypeVar("H", bound=type[HierarchicalHead])


def register_head(name: str, *, overwrite: bool = False) -> Callable[[H], H]:
    """Class decorator registering a :class:`HierarchicalHead` subclass under ``name``.

    Raises:
        ValueError: ``name`` is already registered to another class (pass ``overwrite=True`` to replace it).

    Example:
        >>> from hiercls.heads import HierarchicalHead
        >>> @register_head("doc_example_head", overwrite=True)
        ... class MyHead(HierarchicalHead):
        ...     pass
        >>> "doc_example_head" in list_heads()
        True
        >>> unregister_head("doc_example_head")
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"head name must be a non-empty string; got {name!r}")

    def deco(cls: H) -> H:
        if not (isinstance(cls, type) and issubclass(cls, HierarchicalHead)):
            raise TypeError(f"register_head({name!r}) must decorate a HierarchicalHead subclass; got {cls!r}")
        old = _HEADS.get(name)
        if old is not None and old is not cls and not overwrite and old.__qualname__ != cls.__qualname__:
            raise ValueError(f"head name {name!r} is already registered to {old.__module__}.{old.__qualname__}")
        _HEADS[name] = cls
        if not cls.__dict__.get("head_name"):
            cls.head_name = name
        return cls

    return deco


def unregister_head(name: str) -> None:
    """Remove ``name`` from the registry (for heads registered by experiments or tests).

    Raises:
        ValueError: ``name`` is not registered.
    """
    if name not in _HEADS:
        raise ValueError(f"head {name!r} is not registered; registered: {', '.join(sorted(_HEADS))}")
    del _HEADS[name]


def list_heads() -> list[str]:
    """Registered head names, sorted.

    Example:
        >>> {"flat", "hxe", "soft_labels"} <= set(list_heads())
        True
    """
    import hiercls.heads  # noqa: F401  (importing the package registers the built-in heads)

    return sorted(_HEADS)


def get_head_class(name: str) -> type[HierarchicalHead]:
    """The class registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists close names and all registered ones).
    """
    import hiercls.heads  # noqa: F401

    try:
        return _HEADS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_HEADS), n=3)
        hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
        raise ValueError(f"unknown head {name!r}{hint}; registered heads: {', '.join(sorted(_HEADS))}") from None


def create_head(name: str, taxonomy: Taxonomy, in_features: int, **options: Any) -> HierarchicalHead:
    """Build the head registered as ``name`` for ``taxonomy`` on ``in_features``-dimensional features.

    Example:
        >>> import torch
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> head = create_head("flat", tax, 8)
        >>> head.node_probs(head(torch.zeros(2, 8))).shape
        torch.Size([2, 5])
    """
    return get_head_class(name)(taxonomy, in_features, **options)

