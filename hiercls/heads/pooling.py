"""Pooling of token states into one feature vector per text: the one masked mean every text model uses.

Example:
    >>> import torch
    >>> hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]])
    >>> masked_mean(hidden, torch.tensor([[1, 1, 0]]))  # the padding token (9, 9) is ignored
    tensor([[2., 3.]])
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["TEXT_POOLINGS", "TextPooling", "masked_mean"]

#: How a text encoder's token states become one vector: masked mean, first token, or the model's pooler.
TextPooling = Literal["mean", "cls", "pooler"]
TEXT_POOLINGS: tuple[str, ...] = ("mean", "cls", "pooler")


def masked_mean(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of the token states ``hidden [B, S, D]`` weighted by ``attention_mask [B, S]`` -> ``[B, D]``.

    This is sentence-transformers' mean pooling (all-MiniLM-L6-v2 and friends): padding tokens get weight 0,
    a fractional mask gives a weighted mean. A row whose mask is all zero pools to zeros (not NaN): the
    denominator is clamped at the smallest positive normal number of ``hidden``'s dtype, so the guard also
    holds under fp16 / bf16 autocast, where sentence-transformers' ``1e-9`` would underflow to zero.
    ``attention_mask=None`` averages every token.

    Raises:
        ValueError: ``hidden`` is not ``[B, S, D]`` or the mask is not ``[B, S]``.
    """
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be token states [B, S, D]; got shape {tuple(hidden.shape)}")
    if attention_mask is None:
        return hidden.mean(1)
    if tuple(attention_mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(
            f"attention_mask must be [B, S] = {tuple(hidden.shape[:2])}; got {tuple(attention_mask.shape)}"
        )
    w = attention_mask.to(device=hidden.device, dtype=hidden.dtype).unsqueeze(-1)
    return (hidden * w).sum(1) / w.sum(1).clamp(min=torch.finfo(hidden.dtype).tiny)
