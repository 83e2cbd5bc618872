"""The decoder registry: each rule registers itself where it is defined, with :func:`register_decoder`.

A registration carries the rule's name, the aliases that stand for it with options (``optimal_hf1`` is
``optimal_hfbeta`` with ``beta=1``), what it returns (one node per sample, or a node set) and the metric it is
judged on. :data:`RULES`, :data:`SET_RULES`, :data:`MULTILABEL_RULES` and :data:`DECODER_ALIASES` are views of it.

Example:
    >>> import numpy as np
    >>> @register_decoder("first_node", optimal_for="nothing (an example)")
    ... def first_node(probs, taxonomy):
    ...     return np.zeros(len(probs), dtype=np.int64)
    >>> DECODERS["first_node"].returns, "first_node" in RULES
    ('node', True)
    >>> unregister_decoder("first_node")
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hiercls._registry import Registry

__all__ = [
    "DECODERS",
    "DECODER_ALIASES",
    "MULTILABEL_RULES",
    "RULES",
    "SET_RULES",
    "DecoderInfo",
    "register_decoder",
    "unregister_decoder",
]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class DecoderInfo:
    """What a registration records about one decoder.

    Attributes:
        name: the rule name.
        fn: the rule function ``fn(probs, taxonomy, **options)``.
        returns: ``"node"`` (node ids ``[B]``) or ``"set"`` (boolean node sets ``[B, N]``).
        optimal_for: the objective the rule optimises, in words (for docs and listings).
        judged_on: the metric key its results are judged on (``{beta}`` stands for the rule's β).
        aliases: names that stand for the rule with options.
        multilabel: the rule is meant for multi-label (label-set) probabilities.
    """

    name: str
    fn: Callable[..., Any]
    returns: str = "node"
    optimal_for: str = ""
    judged_on: str = "hF1_micro"
    aliases: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    multilabel: bool = False


RULES: Registry[Callable[..., Any]] = Registry("decoder")
"""Every rule function by name (iterable of names, ``RULES[name]``); each is also importable from
:mod:`hiercls.decode`."""

DECODERS: dict[str, DecoderInfo] = {}
"""Every rule's :class:`DecoderInfo` by name."""

DECODER_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {}
"""Names that stand for a rule with options (``optimal_hf1`` = ``optimal_hfbeta`` with ``beta=1``)."""


class _RuleSet(Set[str]):
    """The registered rules whose :class:`DecoderInfo` satisfies a predicate, read live from the registry."""

    def __init__(self, keep: Callable[[DecoderInfo], bool], doc: str) -> None:
        self._keep = keep
        self.__doc__ = doc

    def __contains__(self, name: object) -> bool:
        info = DECODERS.get(name) if isinstance(name, str) else None
        return info is not None and self._keep(info)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, info in DECODERS.items() if self._keep(info)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{{{', '.join(map(repr, sorted(self)))}}}"

    def issubset(self, other: Any) -> bool:
        return all(n in other for n in self)


SET_RULES: Set[str] = _RuleSet(lambda i: i.returns == "set", "Rules that return boolean node sets [B, N].")
"""Rules that return boolean node sets ``[B, N]`` instead of node ids ``[B]``."""

MULTILABEL_RULES: Set[str] = _RuleSet(lambda i: i.multilabel, "Rules for multi-label probabilities.")
"""Rules meant for multi-label (label-set) probabilities, judged on the node Micro-F1."""


def register_decoder(
    name: str,
    *,
    returns: str = "node",
    optimal_for: str = "",
    judged_on: str | None = None,
    aliases: Mapping[str, Mapping[str, Any]] | None = None,
    multilabel: bool = False,
) -> Callable[[F], F]:
    """Register the decorated function as the decoder ``name`` (see :class:`DecoderInfo` for the fields).

    ``judged_on`` defaults to ``node_micro_f1`` for multi-label rules and ``hF1_micro`` for the others.

    Raises:
        ValueError: ``returns`` is not ``"node"`` or ``"set"``, or ``name`` or an alias is taken.
    """
    if returns not in ("node", "set"):
        raise ValueError(f"returns must be 'node' or 'set'; got {returns!r}")
    judged = judged_on or ("node_micro_f1" if multilabel else "hF1_micro")
    alias_map = {a: dict(opts) for a, opts in (aliases or {}).items()}

    def add(fn: F) -> F:
        old = DECODERS.get(name)
        again = old is not None and (old.fn.__module__, old.fn.__qualname__) == (fn.__module__, fn.__qualname__)
        if again:  # the defining module imported again (a reload): the new function replaces the old one
            unregister_decoder(name)
        taken = [a for a in alias_map if a in DECODER_ALIASES or a in DECODERS]
        if taken:
            raise ValueError(f"decoder alias {taken[0]!r} is already registered")
        RULES.register(name, fn)
        DECODERS[name] = DecoderInfo(name, fn, returns, optimal_for, judged, alias_map, multilabel)
        for alias, opts in alias_map.items():
            DECODER_ALIASES[alias] = (name, opts)
        return fn

    return add


def unregister_decoder(name: str) -> None:
    """Remove the decoder ``name`` and its aliases (for tests and plug-ins that replace a rule)."""
    info = DECODERS.pop(name)
    RULES.unregister(name)
    for alias in info.aliases:
        DECODER_ALIASES.pop(alias, None)
