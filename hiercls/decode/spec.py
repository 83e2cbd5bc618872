"""Decoder specs: one parser for ``"rule:key=value,..."``, used by recipes, the CLI and the Python API.

The registry :data:`RULES` holds every rule (each registers itself with
:func:`~hiercls.decode.registry.register_decoder`); a spec names one of them and its options, e.g.
``optimal_hfbeta:beta=2`` or ``threshold:threshold=0.6``. Option names are checked against the rule function's
signature (each at most once), values are typed (numbers, booleans, names) and β goes through the one β check
(:func:`hiercls._checks.check_beta`). Aliases stand for a rule with options (``optimal_hf1`` is
``optimal_hfbeta:beta=1``). Every spelling of the same decoder gets the same :attr:`DecoderSpec.label`, the name
its results are reported under.

Example:
    >>> parse_decoder("optimal_hfbeta:beta=2")
    DecoderSpec(rule='optimal_hfbeta', options={'beta': 2.0}, label='optimal_hfbeta:beta=2')
    >>> parse_decoder("optimal_hfbeta:beta=1").label, parse_decoder("optimal_hf1").options
    ('optimal_hf1', {'beta': 1.0})
    >>> parse_decoder("crm:cost=wu_palmer").options
    {'cost': 'wu_palmer'}
    >>> parse_decoder("optimal_hfbeta:beta=-1")
    Traceback (most recent call last):
    ...
    ValueError: decoder 'optimal_hfbeta:beta=-1': beta must be a finite number > 0; got -1 ...
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hiercls._checks import check_beta, did_you_mean
from hiercls.decode import bayes, hfbeta, rules, sets  # noqa: F401  (importing a rule's module registers it)
from hiercls.decode.checks import probability_checks
from hiercls.decode.registry import DECODER_ALIASES, DECODERS, RULES, SET_RULES

__all__ = ["DECODER_ALIASES", "RULES", "SET_RULES", "DecoderSpec", "format_number", "parse_decoder", "rule_options"]

# Parameters of the rule functions that are not decoder options: the data, its layout, and return-type switches.
_NOT_OPTIONS = frozenset({"probs", "taxonomy", "leaf_probs"})


@dataclass(frozen=True)
class DecoderSpec:
    """A decoding rule with its options, and the label its results are reported under.

    Attributes:
        rule: the canonical rule name (a key of :data:`hiercls.decode.RULES`).
        options: the rule's keyword options, typed and validated.
        label: the display name: the alias when the spec is one (``optimal_hf1``), else
            ``rule`` or ``rule:key=value,...`` with the options sorted.
    """

    rule: str
    options: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def __hash__(self) -> int:  # the options dict is not hashable; the label names the decoder
        return hash((self.rule, self.label))

    @property
    def is_set(self) -> bool:
        """``True`` when the rule returns node sets ``[B, N]`` (:data:`hiercls.decode.SET_RULES`)."""
        return self.rule in SET_RULES

    @property
    def resolved_options(self) -> dict[str, Any]:
        """Every option of the rule, the spec's own over the rule's defaults: two specs name the same decoder
        exactly when their rules and resolved options agree (``bayes_node`` = ``bayes_node:cost=shortest_path``).

        Example:
            >>> parse_decoder("bayes_node").resolved_options
            {'cost': 'shortest_path', 'candidates': None}
        """
        return {**{n: p.default for n, p in _parameters(self.rule).items()}, **self.options}

    @property
    def beta(self) -> float | None:
        """The β of an hF-β decoder (its option, else the rule's default), ``None`` for other rules."""
        if "beta" not in _parameters(self.rule):
            return None
        return float(self.options.get("beta", _parameters(self.rule)["beta"].default))

    @property
    def judged_on(self) -> str:
        """The metric key this decoder is judged on, from its registration: ``hF{β}_samples`` for hF-β decoders,
        the node Micro-F1 of multi-label text classification (``node_micro_f1``) for the label-set thresholds,
        else ``hF1_micro``."""
        key = DECODERS[self.rule].judged_on
        beta = self.beta
        return key.format(beta=format_number(beta)) if beta is not None else key

    def __call__(self, probs: Any, taxonomy: Any, *, check: bool = True, **options: Any) -> Any:
        """Decode ``probs`` with this rule; ``options`` are added (rule options validated as in the spec, others
        such as ``leaf_probs=True`` passed on). ``check=False`` skips the probability checks
        (:func:`hiercls._checks.check_probabilities`)."""
        params = _parameters(self.rule)
        rule_options = {k: v for k, v in options.items() if k in params}
        spec = parse_decoder(self, **rule_options) if rule_options else self
        rest = {k: v for k, v in options.items() if k not in params}
        # check=True leaves an enclosing probability_checks(False) in force
        with probability_checks(False) if not check else contextlib.nullcontext():
            return RULES[spec.rule](probs, taxonomy, **spec.options, **rest)


def format_number(value: float) -> str:
    """``2.0 -> "2"``, ``0.5 -> "0.5"``: the short exact spelling used in labels and metric names."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


def rule_options(rule: str) -> list[str]:
    """The option names a rule takes in a spec (its keyword parameters, less the data and return switches).

    Example:
        >>> rule_options("optimal_hfbeta")
        ['beta', 'include_root', 'initial_candidates']
    """
    return list(_parameters(RULES.canonical(rule)))


def _parameters(rule: str) -> Mapping[str, inspect.Parameter]:
    return _function_parameters(RULES[rule])


@functools.cache
def _function_parameters(fn: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    # Keyed by the function, so a rule registered again under the same name is read afresh; signatures are
    # slow to build and every decoder call checks its options against them.
    params = inspect.signature(fn).parameters
    return types.MappingProxyType(
        {
            n: p
            for n, p in params.items()
            if n not in _NOT_OPTIONS
            and not n.startswith("return_")
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        }
    )


def _parse_value(text: str) -> Any:
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    return s


def _coerce(rule: str, name: str, value: Any, param: inspect.Parameter, where: str) -> Any:
    default = param.default
    if name == "beta":
        return check_beta(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {name} must be true or false; got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{where}: {name} must be a finite number; got {value!r}")
        return float(value)
    if isinstance(default, int) and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _label(rule: str, options: Mapping[str, Any]) -> str:
    for alias, (target, opts) in DECODER_ALIASES.items():
        if target == rule and dict(options) == opts:
            return alias
    if not options:
        return rule
    return rule + ":" + ",".join(f"{k}={format_number(v)}" for k, v in sorted(options.items()))


def parse_decoder(spec: str | DecoderSpec, **options: Any) -> DecoderSpec:
    """The :class:`DecoderSpec` of ``"rule"`` or ``"rule:key=value,..."`` (``options`` are added to the spec's).

    Args:
        spec: a rule name, an alias (``optimal_hf1``), ``rule:key=value,...``, or a :class:`DecoderSpec`
            (returned with ``options`` merged in).
        **options: more options, as Python values (they override the ones in the string).

    Raises:
        ValueError: an unknown rule or option (with close matches and the valid names), a malformed
            ``key=value`` or a bad value (β must be finite and ``>= 0``); the message names the spec.

    Example:
        >>> parse_decoder("threshold:threshold=0.6")
        DecoderSpec(rule='threshold', options={'threshold': 0.6}, label='threshold:threshold=0.6')
        >>> parse_decoder("optimal_hfbeta", beta=2).label
        'optimal_hfbeta:beta=2'
        >>> parse_decoder("argmax_leef")
        Traceback (most recent call last):
        ...
        ValueError: unknown decoder 'argmax_leef' (did you mean 'argmax_leaf'?); valid: argmax_leaf, bayes_node, \
chmcnn, crm, hie, info_gain, majority, max_info, optimal_hfbeta, plurality, threshold, threshold_set, top_down, \
optimal_hf1, optimal_hfbeta1
    """
    if isinstance(spec, DecoderSpec):
        if not options:
            return spec
        rule, given, where = spec.rule, dict(spec.options), spec.label
    else:
        if not isinstance(spec, str) or not spec.strip():
            raise ValueError(
                f"decoder must be a rule name such as 'argmax_leaf' or 'optimal_hfbeta:beta=2'; got {spec!r}"
            )
        where = spec.strip()
        name, _, rest = where.partition(":")
        name = name.strip()
        given = {}
        if name in DECODER_ALIASES:
            name, alias_opts = DECODER_ALIASES[name]
            given.update(alias_opts)
        if name not in RULES:
            known = [*RULES, *DECODER_ALIASES]
            raise ValueError(f"unknown decoder {name!r}{did_you_mean(name, known)}; valid: {', '.join(known)}")
        rule, seen = name, set()
        for item in filter(None, (s.strip() for s in rest.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(
                    f"decoder {where!r}: options must be key=value after ':' (e.g. "
                    f"'optimal_hfbeta:beta=2'); got {item!r}"
                )
            if key.strip() in seen:
                raise ValueError(f"decoder {where!r}: option {key.strip()!r} is given twice")
            seen.add(key.strip())
            given[key.strip()] = _parse_value(value)
    given.update(options)
    params = _parameters(rule)
    out: dict[str, Any] = {}
    for key, value in given.items():
        if key not in params:
            valid = ", ".join(params) or "none"
            raise ValueError(
                f"decoder {where!r}: unknown option {key!r} of rule {rule!r}"
                f"{did_you_mean(key, params)}; valid options: {valid}"
            )
        try:
            out[key] = _coerce(rule, key, value, params[key], f"decoder {where!r}")
        except ValueError as err:
            msg = str(err)
            raise ValueError(msg if msg.startswith("decoder ") else f"decoder {where!r}: {msg}") from None
    return DecoderSpec(rule, out, _label(rule, out))
