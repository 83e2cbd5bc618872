"""The front door: ``decode(probs, taxonomy, rule=..., **options)`` and the registry of rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hiercls.decode import bayes, hfbeta, rules
from hiercls.taxonomy import Taxonomy

__all__ = ["RULES", "SET_RULES", "decode"]

RULES: dict[str, Callable[..., Any]] = {
    "argmax_leaf": rules.argmax_leaf,
    "top_down": rules.top_down,
    "threshold": rules.threshold,
    "majority": rules.majority,
    "plurality": rules.plurality,
    "max_info": rules.max_info,
    "info_gain": rules.info_gain,
    "hie": rules.hie,
    "bayes_node": bayes.bayes_node,
    "crm": bayes.crm,
    "optimal_hfbeta": hfbeta.optimal_hfbeta,
}
"""Every rule by name; each is also importable from :mod:`hiercls.decode` under the same name."""

SET_RULES = frozenset({"optimal_hfbeta"})
"""Rules that return boolean node sets ``[B, N]`` instead of node ids ``[B]``."""


def decode(probs: Any, taxonomy: Taxonomy, rule: str = "argmax_leaf", **options: Any) -> Any:
    """Decode node probabilities with the rule called ``rule``.

    Args:
        probs: node probabilities ``[B, N]`` (NumPy or torch), or leaf probabilities ``[B, L]`` with
            ``leaf_probs=True``.
        taxonomy: the taxonomy the probabilities are indexed by.
        rule: one of :data:`RULES` (``argmax_leaf``, ``top_down``, ``threshold``, ``majority``, ``plurality``,
            ``max_info``, ``info_gain``, ``hie``, ``bayes_node``, ``crm``, ``optimal_hfbeta``).
        **options: the rule's keyword options (``threshold=``, ``lam=``, ``cost=``, ``beta=``, ...).

    Returns:
        Node ids ``[B]``, or boolean node sets ``[B, N]`` for the rules in :data:`SET_RULES`.

    Example:
        >>> import numpy as np
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4]])
        >>> decode(p, tax).tolist(), decode(p, tax, "crm").tolist(), decode(p, tax, "threshold").tolist()
        ([4], [2], [1])
        >>> decode(p, tax, "optimal_hfbeta", beta=1.0).astype(int).tolist()
        [[1, 1, 0, 0, 1]]
    """
    try:
        fn = RULES[rule]
    except (KeyError, TypeError):
        raise ValueError(f"rule must be one of {', '.join(RULES)}; got {rule!r}") from None
    args = dict(options)
    if rule in ("bayes_node", "crm") and "cost" in args:
        return fn(probs, taxonomy, args.pop("cost"), **args)
    if rule == "optimal_hfbeta" and "beta" in args:
        return fn(probs, taxonomy, args.pop("beta"), **args)
    return fn(probs, taxonomy, **args)
