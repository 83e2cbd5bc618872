"""One registry class for every "name -> thing" table in hiercls (heads, decoders, datasets, backbones, formats).

A :class:`Registry` maps names (and aliases) to objects, lists them, and answers an unknown name with one
message form: the kind of thing, close matches ("did you mean ...?") and every registered name.

Example:
    >>> colours = Registry("colour")
    >>> colours.register("red", 0xFF0000, aliases=("rouge",))
    16711680
    >>> colours.get("rouge") == colours["red"]
    True
    >>> colours.get("reed")
    Traceback (most recent call last):
    ...
    ValueError: unknown colour 'reed' (did you mean 'red'?); registered: red (aliases: rouge)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar, overload

from hiercls._checks import did_you_mean

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Names and aliases to objects, with did-you-mean errors.

    Args:
        kind: what the entries are, for messages (``"head"``, ``"decoder"``, ``"backbone"``...).
        populate: called once before the first lookup, to import the modules that register the built-in
            entries (lets a registry live in a module that its entries import).
        error: the exception class raised for unknown names (a ``ValueError`` subclass or ``KeyError``-free
            type that takes one message argument).
    """

    def __init__(
        self, kind: str, *, populate: Callable[[], Any] | None = None, error: type[Exception] = ValueError
    ) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._populate = populate
        self._error = error

    def _ready(self) -> None:
        if self._populate is not None:
            populate, self._populate = self._populate, None
            populate()

    @overload
    def register(
        self, name: str, obj: None = None, *, aliases: Iterable[str] = (), overwrite: bool = False
    ) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, obj: T, *, aliases: Iterable[str] = (), overwrite: bool = False) -> T: ...

    def register(self, name: str, obj: T | None = None, *, aliases: Iterable[str] = (), overwrite: bool = False) -> Any:
        """Register ``obj`` as ``name`` (and ``aliases``); without ``obj``, return a decorator that does.

        Raises:
            ValueError: ``name`` is empty, or already taken by another object (pass ``overwrite=True``).
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string; got {name!r}")
        aliases = tuple(aliases)

        def add(entry: T) -> T:
            for key in (name, *aliases):
                taken = self._entries.get(self._aliases.get(key, key))
                if taken is not None and taken is not entry and not overwrite:
                    raise ValueError(f"{self.kind} name {key!r} is already registered to {taken!r}")
            self._entries[name] = entry
            self._aliases.pop(name, None)
            for alias in aliases:
                self._aliases[alias] = name
            return entry

        return add if obj is None else add(obj)

    def unregister(self, name: str) -> None:
        """Remove ``name`` and its aliases.

        Raises:
            ValueError: ``name`` is not registered.
        """
        key = self.canonical(name)
        del self._entries[key]
        self._aliases = {a: n for a, n in self._aliases.items() if n != key}

    def canonical(self, name: str) -> str:
        """The registered name that ``name`` (a name or an alias) stands for.

        Raises:
            ValueError (or the registry's ``error``): unknown name, with close matches and the full list.
        """
        self._ready()
        if isinstance(name, str):
            key = self._aliases.get(name, name)
            if key in self._entries:
                return key
        known = [*self._entries, *self._aliases]
        raise self._error(f"unknown {self.kind} {name!r}{did_you_mean(name, known)}; registered: {self.describe()}")

    def find(self, name: str) -> T | None:
        """The object registered as ``name`` (or an alias) so far, or ``None``.

        Never runs ``populate``: for registration code that runs while the built-in entries are being imported.
        """
        return self._entries.get(self._aliases.get(name, name)) if isinstance(name, str) else None

    def get(self, name: str) -> T:
        """The object registered as ``name`` (or under an alias of it)."""
        return self._entries[self.canonical(name)]

    __getitem__ = get

    def describe(self) -> str:
        """Every name, sorted, with its aliases: ``"a, b (aliases: c)"``."""
        self._ready()
        aliases: dict[str, list[str]] = {}
        for alias, target in self._aliases.items():
            aliases.setdefault(target, []).append(alias)
        return ", ".join(
            n + (f" (aliases: {', '.join(sorted(aliases[n]))})" if n in aliases else "") for n in sorted(self._entries)
        )

    def names(self) -> list[str]:
        """Registered names (not aliases), sorted."""
        self._ready()
        return sorted(self._entries)

    def aliases(self) -> dict[str, str]:
        """``{alias: name}``."""
        self._ready()
        return dict(self._aliases)

    def items(self) -> list[tuple[str, T]]:
        """``(name, object)`` pairs in registration order."""
        self._ready()
        return list(self._entries.items())

    def __contains__(self, name: object) -> bool:
        self._ready()
        return isinstance(name, str) and self._aliases.get(name, name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        self._ready()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self)} entries)"
