"""Validators shared by every public function: one message form for every parameter.

Each check returns the validated (and normalised) value or raises with the parameter's name, what was
expected and what was received, in the style of scikit-learn's parameter validation.

Example:
    >>> check_beta(2)
    2.0
    >>> check_beta(-1)
    Traceback (most recent call last):
    ...
    ValueError: beta must be a finite number > 0; got -1 (beta = 0 would score precision alone: use the precision
    score for that)
    >>> check_choice("micro", ("micro", "macro"), "average")
    'micro'
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "check_beta",
    "check_choice",
    "check_dense",
    "check_finite_number",
    "did_you_mean",
    "to_numpy",
]


def did_you_mean(name: Any, options: Iterable[str], n: int = 3) -> str:
    """``" (did you mean 'x'?)"`` for the close matches of ``name`` among ``options``, or ``""``."""
    close = difflib.get_close_matches(str(name), list(options), n=n)
    return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""


def check_choice(value: Any, choices: Iterable[Any], name: str) -> Any:
    """``value`` if it is one of ``choices``.

    Raises:
        ValueError: naming ``name``, the close matches and every allowed value.
    """
    choices = list(choices)
    if value in choices:
        return value
    hint = did_you_mean(value, [str(c) for c in choices]) if isinstance(value, str) else ""
    raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}{hint}")


def check_finite_number(value: Any, name: str, *, minimum: float | None = None, strict: bool = False) -> float:
    """``value`` as a float if it is a real, finite number (not a bool) ``>= minimum`` (``> minimum`` if strict).

    Raises:
        ValueError: naming ``name`` and the bound.
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        raise ValueError(f"{name} must be a finite number{bound}; got {value!r}")
    return float(value)


def check_beta(beta: Any, name: str = "beta") -> float:
    """The β of an F-β score or decoder: a finite number ``> 0`` (β = 0 drops recall from the score: the
    precision functions say that without an F)."""
    try:
        return check_finite_number(beta, name, minimum=0.0, strict=True)
    except ValueError as err:
        raise ValueError(f"{err} (beta = 0 would score precision alone: use the precision score for that)") from None


def check_dense(x: Any, name: str = "input") -> Any:
    """``x`` unless it is a tensor without values here: a meta tensor (shapes only) or a sparse torch tensor.

    Raises:
        TypeError: naming ``name``, the tensor's kind and what to pass instead.

    Example:
        >>> import torch
        >>> check_dense(torch.zeros(2, 3, device="meta"), "probs")
        Traceback (most recent call last):
        ...
        TypeError: probs is a meta tensor (a shape without values); pass a tensor that holds the values
    """
    if getattr(x, "is_meta", False):
        raise TypeError(f"{name} is a meta tensor (a shape without values); pass a tensor that holds the values")
    layout = getattr(x, "layout", None)
    if layout is not None and type(x).__module__.startswith("torch") and str(layout) != "torch.strided":
        raise TypeError(f"{name} is a sparse tensor ({layout}); pass a dense one ({name}.to_dense())")
    return x


def to_numpy(x: Any, *, passthrough: bool = False, name: str = "input") -> Any:
    """A NumPy array of ``x``: torch tensors detached and copied to the host (float16/bfloat16 as float32);
    NumPy arrays and scipy sparse matrices unchanged; anything else through ``np.asarray``, or returned as is
    with ``passthrough=True`` (ragged label lists, sets of names, which ``np.asarray`` would mangle). Meta and
    sparse tensors are refused naming ``name`` (:func:`check_dense`)."""
    if type(x).__module__.startswith("torch") and hasattr(x, "detach"):
        check_dense(x, name)
        x = x.detach().cpu()
        if x.dtype.is_floating_point and x.element_size() < 4:  # numpy has no bfloat16
            x = x.float()
        return x.numpy()
    if passthrough or isinstance(x, np.ndarray) or hasattr(x, "tocsr"):
        return x
    return np.asarray(x)
