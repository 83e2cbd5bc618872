"""The front door: ``decode(probs, taxonomy, rule=..., **options)`` (the rules are in :data:`RULES`)."""

from __future__ import annotations

from typing import Any

from hiercls.decode.checks import ProbabilityError, check_probabilities, probability_checks
from hiercls.decode.spec import RULES, SET_RULES, parse_decoder
from hiercls.taxonomy import Taxonomy

__all__ = ["RULES", "SET_RULES", "ProbabilityError", "check_probabilities", "decode", "probability_checks"]


def decode(probs: Any, taxonomy: Taxonomy, rule: Any = "argmax_leaf", *, check: bool = True, **options: Any) -> Any:
    """Decode node probabilities with the rule called ``rule``.

    Args:
        probs: node probabilities ``[B, N]`` (NumPy or torch), or leaf probabilities ``[B, L]`` with
            ``leaf_probs=True``.
        taxonomy: the taxonomy the probabilities are indexed by.
        rule: one of :data:`RULES` (``argmax_leaf``, ``top_down``, ``threshold``, ``majority``, ``plurality``,
            ``max_info``, ``info_gain``, ``hie``, ``bayes_node``, ``crm``, ``optimal_hfbeta``), an alias such as
            ``optimal_hf1``, a spec string ``"rule:key=value,..."`` or a
            :class:`~hiercls.decode.spec.DecoderSpec` (see :func:`~hiercls.decode.spec.parse_decoder`).
        check: refuse inputs that are not probabilities of ``taxonomy`` (:func:`check_probabilities`: NaN, values
            outside [0, 1], root != 1, a child above its parent, leaf rows not summing to 1, and for the rules that
            need single-label probabilities children summing to more than their parent). ``False`` skips these
            checks (NaN and negative values are still refused); every rule function checks the same way, and
            ``with probability_checks(False):`` turns the checks off for a block of calls.
        **options: the rule's keyword options (``threshold=``, ``lam=``, ``cost=``, ``beta=``, ...).

    Returns:
        Node ids ``[B]``, or boolean node sets ``[B, N]`` for the rules in :data:`SET_RULES`.

    Raises:
        ProbabilityError: ``probs`` are not probabilities (a ``ValueError`` naming the row and the node).

    Example:
        >>> import numpy as np
        >>> from hiercls.taxonomy import Taxonomy
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("a", "y"), ("r", "b")])
        >>> p = np.array([[1.0, 0.6, 0.3, 0.3, 0.4]])
        >>> decode(p, tax).tolist(), decode(p, tax, "crm").tolist(), decode(p, tax, "threshold").tolist()
        ([4], [2], [1])
        >>> decode(p, tax, "optimal_hfbeta", beta=1.0).astype(int).tolist()
        [[1, 1, 0, 0, 1]]
        >>> decode([[1.0, 0.6, 0.7, 0.3, 0.4]], tax)  # x above its parent a
        Traceback (most recent call last):
        ...
        hiercls.decode.checks.ProbabilityError: probs: row 0: node 'x' (id 2) has P = 0.7 > 0.6 = P of its parent
        node 'a' (id 1) (a node is never more likely than its parent); pass check=False (CLI: --no-check) to skip
        this check
        >>> decode([[1.0, 0.6, 0.7, 0.3, 0.4]], tax, check=False).tolist()
        [2]
    """
    return parse_decoder(rule)(probs, taxonomy, check=check, **options)
