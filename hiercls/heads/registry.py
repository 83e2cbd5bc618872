"""Registry of heads by name: :func:`register_head`, :func:`create_head`, :func:`list_heads`.

The table is a :class:`hiercls._registry.Registry` (``HEADS``): one message form for unknown names, with close
matches and the full list.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from hiercls._checks import did_you_mean
from hiercls._registry import Registry
from hiercls.heads.base import HierarchicalHead
from hiercls.taxonomy import Taxonomy

__all__ = [
    "HEADS",
    "HeadOptionError",
    "create_head",
    "get_head_class",
    "head_option_names",
    "list_heads",
    "register_head",
    "unregister_head",
]

HEADS: Registry[type[HierarchicalHead]] = Registry("head", populate=lambda: importlib.import_module("hiercls.heads"))
"""Every registered head class by name (importing :mod:`hiercls.heads` registers the built-in ones)."""
H = TypeVar("H", bound=type[HierarchicalHead])


class HeadOptionError(ValueError, TypeError):
    """An option a head does not take. A ``TypeError`` as Python's own for an unknown keyword, and a ``ValueError``
    because it is a user's mistake in a recipe (the command line prints it as one line)."""


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
        old = HEADS.find(name)
        if old is not None and old is not cls and not overwrite and old.__qualname__ != cls.__qualname__:
            raise ValueError(f"head name {name!r} is already registered to {old.__module__}.{old.__qualname__}")
        HEADS.register(name, cls, overwrite=True)  # same qualified name: a reloaded module replaces its class
        if not cls.__dict__.get("head_name"):
            cls.head_name = name
        return cls

    return deco


def unregister_head(name: str) -> None:
    """Remove ``name`` from the registry (for heads registered by experiments or tests).

    Raises:
        ValueError: ``name`` is not registered.
    """
    HEADS.unregister(name)


def list_heads() -> list[str]:
    """Registered head names, sorted.

    Example:
        >>> {"flat", "hxe", "soft_labels"} <= set(list_heads())
        True
    """
    return HEADS.names()


def get_head_class(name: str) -> type[HierarchicalHead]:
    """The class registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists close names and all registered ones).
    """
    return HEADS.get(name)


def create_head(name: str, taxonomy: Taxonomy, in_features: int, **options: Any) -> HierarchicalHead:
    """Build the head registered as ``name`` for ``taxonomy`` on ``in_features``-dimensional features.

    Example:
        >>> import torch
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> head = create_head("flat", tax, 8)
        >>> head.node_probs(head(torch.zeros(2, 8))).shape
        torch.Size([2, 5])
        >>> create_head("flat", tax, 8, bais=False)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hiercls.heads.registry.HeadOptionError: head 'flat': unknown option 'bais' (did you mean 'bias'?); ...

    Raises:
        ValueError: unknown head name.
        HeadOptionError: (a ``ValueError`` and a ``TypeError``) an option the head does not take; close matches
            and all its options are named.
    """
    cls = get_head_class(name)
    valid = head_option_names(cls)
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise HeadOptionError(
            f"head {name!r}: unknown option {unknown[0]!r}{did_you_mean(unknown[0], valid)}; valid options: "
            f"{', '.join(valid) if valid else 'none'}"
        )
    return cls(taxonomy, in_features, **options)


def head_option_names(cls: type[HierarchicalHead]) -> list[str]:
    """The keyword options a head class accepts: the parameters of its ``__init__`` chain up to the base class.

    Example:
        >>> head_option_names(get_head_class("flat"))
        ['bias', 'label_smoothing']
    """
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is HierarchicalHead or not issubclass(klass, HierarchicalHead):
            break
        params = inspect.signature(init).parameters.values()
        names += [
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in ("self", "taxonomy", "in_features")
            and p.name not in names
        ]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break  # this __init__ passes nothing further up
    return sorted(names)
