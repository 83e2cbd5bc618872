"""The front door: ``decode(probs, taxonomy, rule=..., **options)`` (the rules are in :data:`RULES`)."""

from __future__ import annotations

from typing import Any

from hiercls.decode.spec import RULES, SET_RULES, parse_decoder
from hiercls.taxonomy import Taxonomy

__all__ = ["RULES", "SET_RULES", "decode"]


def decode(probs: Any, taxonomy: Taxonomy, rule: Any = "argmax_leaf", **options: Any) -> Any:
    """Decode node probabilities with the rule called ``rule``.

    Args:
        probs: node probabilities ``[B, N]`` (NumPy or torch), or leaf probabilities ``[B, L]`` with
            ``leaf_probs=True``.
        taxonomy: the taxonomy the probabilities are indexed by.
        rule: one of :data:`RULES` (``argmax_leaf``, ``top_down``, ``threshold``, ``majority``, ``plurality``,
            ``max_info``, ``info_gain``, ``hie``, ``bayes_node``, ``crm``, ``optimal_hfbeta``), an alias such as
            ``optimal_hf1``, a spec string ``"rule:key=value,..."`` or a
            :class:`~hiercls.decode.spec.DecoderSpec` (see :func:`~hiercls.decode.spec.parse_decoder`).
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
    return parse_decoder(rule)(probs, taxonomy, **options)
