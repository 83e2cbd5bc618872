"""Hierarchical prompting (TransHP) for timm Vision Transformers and Hugging Face BERT-like text encoders.

TransHP (Wang et al., "TransHP: Image Classification with Hierarchical Prompting", NeurIPS 2023) learns one
prompt token per coarse class of a hierarchy level and injects the whole pool of them into the token sequence
at a chosen intermediate *prompting block*:

1. the prompting block ``B_k`` runs on ``[feature tokens, p_1 .. p_M]`` (``M`` coarse classes at that level);
2. the coarse class is predicted from the block's prompt outputs ``p'_m``: ``s_m = <w_m, p'_m>`` with one
   learnable prototype ``w_m`` per prompt (a coarse cross-entropy on ``s`` supervises it; this scoring is the
   one of the authors' public implementation);
3. inside the block the feature tokens attend to the prompts, so they *absorb* them softly: the attention the
   tokens pay to ``p_m`` grows with how well the image matches coarse class ``m`` (the paper's analysis), and
   that absorbed prompt conditions every later block. The prompt tokens are then discarded (``absorb="attention"``,
   the paper's design). ``absorb="soft_token"`` additionally keeps the explicit mixture ``sum_m softmax(s)_m p_m``
   as one extra token for the later blocks (an option, not in the paper).

The training loss is ``CE(fine) + sum_l lambda_l CE(coarse_l)``. Fine classes are the taxonomy's leaves; a
sample labelled with an internal node contributes the marginal likelihood of its subtree (``-log sum`` of the
leaf probabilities under the label), which equals the ordinary cross-entropy for leaf labels. The coarse target
at level ``l`` is the label's ancestor at depth ``l`` (``taxonomy.paths``); a label shallower than ``l`` is
ignored at that level, and ``-1`` targets are ignored everywhere.

:meth:`node_probs` returns the fine softmax over leaves summed up the tree (the architecture contract: float32,
root 1, a parent equal to the sum of its children). The coarse predictions are auxiliary, as in the paper.
``docs/prompting.md`` lists where this differs from the reference implementation.

Example:
    >>> import timm, torch
    >>> from hiercls.taxonomy import Taxonomy
    >>> tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")])
    >>> vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=8, depth=2,
    ...                         embed_dim=16, num_heads=2)
    >>> model = TransHPViT(vit, tax, prompt_blocks={0: 1})
    >>> out = model(torch.randn(3, 3, 16, 16))
    >>> out["fine_logits"].shape, out["coarse_logits"][1].shape
    (torch.Size([3, 4]), torch.Size([3, 2]))
    >>> model.node_probs(out)[:, 0].tolist()
    [1.0, 1.0, 1.0]
    >>> bool(model.loss(out, torch.tensor([2, 5, 1])) > 0)
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as module_globals
from torch.utils.checkpoint import checkpoint

from hiercls.heads.pooling import TextPooling, masked_mean
from hiercls.models.prompt_pool import AbsorbMode, PromptedModel, check_absorb
from hiercls.taxonomy import Taxonomy

__all__ = ["PromptedTextEncoder", "TransHPViT", "create_prompt_model"]


# ---------------------------------------------------------------------------------------------- ViT
def _shares_prompt_projections(block: nn.Module) -> bool:
    """Whether ``block`` is timm's plain ``Block`` with fused ``Attention``, which :func:`_prompted_block_forward`
    reproduces (other block types run the concatenated sequence through their own forward)."""
    from timm.models.vision_transformer import Attention, Block

    attn = getattr(block, "attn", None)
    return (
        not _has_hooks(block)
        and not _has_hooks(attn)
        and type(block).forward is Block.forward
        and type(attn).forward is Attention.forward
        and bool(getattr(attn, "fused_attn", False))
        and all(hasattr(attn, a) for a in _ATTENTION_PARTS)
    )


def _has_hooks(module: nn.Module | None) -> bool:
    # Forward/backward hooks on the block or its attention expect their own forward to run (feature taps,
    # attention maps): such blocks keep it.
    if module is None:
        return False
    names = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    global_names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks")
    return any(getattr(module, n, None) for n in names) or any(getattr(module_globals, n, None) for n in global_names)


#: What :func:`_prompted_block_forward` uses of timm's ``Attention`` (older timm versions lack some).
_ATTENTION_PARTS = ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "gate", "proj", "proj_drop", "attn_dim", "scale")


def _prompt_queries_attention(
    qp: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, kx: torch.Tensor, vx: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention of the prompt queries over ``[image keys ; prompt keys]``: ``[B, H, M, d]``.

    ``qp, kp, vp [H, M, d]`` are the same for every sample, so the prompt-to-prompt part of the softmax
    (scores, their exponentials against their own row maximum, the weighted values and the weights' sums) is
    computed once per batch; per sample only the ``M x n`` prompt-to-image scores are, and the two parts are
    merged with the usual running-maximum rescaling. This is the same softmax, in another summation order: an
    ``[M, n + M]`` score matrix per sample becomes ``[M, n]`` (``M`` = 293 coarse classes against ``n`` = 65 image
    tokens at the ImageNet-21K default). Scores and sums are float32 (or float64) under AMP.
    """
    dtype = torch.promote_types(qp.dtype, torch.float32)
    qp = qp.to(dtype) * scale
    s_pp = qp @ kp.to(dtype).transpose(-2, -1)  # [H, M, M]
    max_pp = s_pp.amax(-1, keepdim=True)
    e_pp = torch.exp(s_pp - max_pp)
    num_pp, den_pp = e_pp @ vp.to(dtype), e_pp.sum(-1, keepdim=True)  # [H, M, d], [H, M, 1]
    s_px = qp @ kx.to(dtype).transpose(-2, -1)  # [B, H, M, n]
    top = torch.maximum(s_px.amax(-1, keepdim=True), max_pp)
    e_px = torch.exp(s_px - top)
    rescale = torch.exp(max_pp - top)  # [B, H, M, 1]
    out = (e_px @ vx.to(dtype) + rescale * num_pp) / (e_px.sum(-1, keepdim=True) + rescale * den_pp)
    return out.to(vx.dtype)


def _prompted_block_forward(
    block: nn.Module, x: torch.Tensor, prompts: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """timm ``Block.forward`` on ``[x ; prompts]`` (``x [B, n, D]``, ``prompts [M, D]``), the prompts projected once.

    The prompt tokens enter the block identical for every sample, so their ``norm1`` and query/key/value
    projections (a quarter of the block's per-token matmuls, for ``M`` tokens that can outnumber the image's)
    are computed once and broadcast, and so is the prompt-to-prompt part of their attention
    (:func:`_prompt_queries_attention`; with a mask or attention dropout the plain attention runs); everything
    after attention depends on the sample and runs per token, as in the block itself. The result equals
    ``block(torch.cat([x, prompts.expand(B, -1, -1)], 1), attn_mask=mask)`` up to float round-off.
    """
    b, n, _ = x.shape
    m = prompts.shape[0]
    attn = block.attn
    tokens = torch.cat([x, prompts.expand(b, -1, -1)], 1)
    hx, hp = block.norm1(x), block.norm1(prompts)

    def heads(qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [..., T, 3D] -> q, k, v [..., H, T, D/H]
        q, k, v = qkv.unflatten(-1, (3, attn.num_heads, attn.head_dim)).movedim(-3, 0).transpose(-3, -2).unbind(0)
        return attn.q_norm(q), attn.k_norm(k), v

    qx, kx, vx = heads(attn.qkv(hx))  # [B, H, n, d]
    qp, kp, vp = heads(attn.qkv(hp))  # [H, M, d], the same for every sample
    dropout = attn.attn_drop.p if attn.training else 0.0
    keys = torch.cat([kx, kp.expand(b, -1, -1, -1)], 2)
    values = torch.cat([vx, vp.expand(b, -1, -1, -1)], 2)
    if mask is not None or dropout > 0:  # the plain attention over the whole sequence
        q = torch.cat([qx, qp.expand(b, -1, -1, -1)], 2)
        out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=dropout)
    else:
        out_x = torch.nn.functional.scaled_dot_product_attention(qx, keys, values)
        out = torch.cat([out_x, _prompt_queries_attention(qp, kp, vp, kx, vx, attn.scale)], 2)
    out = attn.norm(out.transpose(1, 2).reshape(b, n + m, attn.attn_dim))
    if attn.gate is not None:
        out = out * torch.cat([attn.gate(hx), attn.gate(hp).expand(b, -1, -1)], 1).sigmoid()
    out = attn.proj_drop(attn.proj(out))
    y = tokens + block.drop_path1(block.ls1(out))
    return y + block.drop_path2(block.ls2(block.mlp(block.norm2(y))))


class TransHPViT(PromptedModel):
    """TransHP around a timm ``VisionTransformer``: prompt pools injected at chosen blocks (see the module doc).

    The module runs the ViT's own patch embedding, position embedding, blocks, final norm and pooling, so any
    pretrained timm ViT (class token or average pooling, register tokens) works. The ViT's classifier is removed
    (``reset_classifier(0)``); the fine classifier over the taxonomy's leaves lives in ``self.pool.fine_head``.

    Args:
        vit: a ``timm.models.vision_transformer.VisionTransformer`` (taken over: its head is removed).
        taxonomy: a tree; fine classes are its leaves, coarse classes the nodes at each prompted depth.
        prompt_blocks: ``{block index: level}`` or a list of block indices (levels 1, 2, ... in order);
            default :func:`~hiercls.models.prompt_pool.default_prompt_positions`. ``{}`` gives a plain ViT with a
            leaf classifier.
        coarse_loss_weight: ``lambda`` per level: a number, ``{level: weight}`` or a list in block order.
        absorb: ``"attention"`` (paper) or ``"soft_token"`` (also keep ``sum_m softmax(s)_m p_m`` as a token).
        condition: ``False`` blocks the feature tokens from attending to the prompts (an ablation: coarse
            supervision at intermediate blocks without conditioning; the fine path is then the plain ViT's).
        init_std: init scale of prompts, prototypes and the fine head.

    Example:
        >>> import timm, torch
        >>> tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1")])
        >>> vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=8,
        ...                         depth=3, embed_dim=16, num_heads=2)
        >>> model = TransHPViT(vit, tax, prompt_blocks=[1], coarse_loss_weight=0.5)
        >>> model.positions, model.num_outputs
        ({1: 1}, 3)
        >>> out = model(torch.randn(2, 3, 16, 16))
        >>> sorted(out), tuple(model.node_probs(out).shape)
        (['coarse_logits', 'features', 'fine_logits'], (2, 6))
    """

    _positions_param = "prompt_blocks"

    def __init__(
        self,
        vit: nn.Module,
        taxonomy: Taxonomy,
        prompt_blocks: Mapping[int, int] | Sequence[int] | None = None,
        coarse_loss_weight: float | Mapping[int, float] | Sequence[float] = 1.0,
        absorb: AbsorbMode = "attention",
        condition: bool = True,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        from timm.models.vision_transformer import VisionTransformer

        if not isinstance(vit, VisionTransformer):
            raise TypeError(f"vit must be a timm VisionTransformer, got {type(vit).__name__}")
        if getattr(vit, "attn_pool", None) is not None:
            raise ValueError("vit: attention-pool ViTs (global_pool='map') are not supported; use 'token' or 'avg'")
        self.absorb = check_absorb(absorb, condition)
        self.condition = bool(condition)
        vit.reset_classifier(0)
        self.vit = vit
        self.in_features = int(vit.embed_dim)
        self.num_blocks = len(vit.blocks)
        self._build_pool(taxonomy, prompt_blocks, self.num_blocks, coarse_loss_weight, init_std, "prompt_blocks")

    def _backbone_parameters(self) -> Any:
        return self.vit.parameters()

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block in the backward pass to save activation memory."""
        self.vit.grad_checkpointing = bool(enable)

    def _block(self, index: int, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        blk = self.vit.blocks[index]
        if self.vit.grad_checkpointing and self.training and torch.is_grad_enabled():
            if mask is None:
                return checkpoint(blk, x, use_reentrant=False)
            return checkpoint(blk, x, mask, use_reentrant=False)
        return blk(x) if mask is None else blk(x, attn_mask=mask)

    def _prompt_block(
        self, index: int, x: torch.Tensor, prompts: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        blk = self.vit.blocks[index]
        if self.vit.grad_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(_prompted_block_forward, blk, x, prompts, mask, use_reentrant=False)
        return _prompted_block_forward(blk, x, prompts, mask)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Patch + position embedding (with class/register tokens), as the ViT does before its blocks."""
        if not isinstance(images, torch.Tensor) or images.dim() != 4:
            shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
            raise ValueError(f"images must be a [B, C, H, W] tensor, got {shape}")
        vit = self.vit
        x = vit.patch_embed(images)
        x = vit._pos_embed(x)
        x = vit.patch_drop(x)
        return vit.norm_pre(x)

    def forward_features(self, images: torch.Tensor) -> dict[str, Any]:
        """Run the prompted blocks: ``{"features": pooled [B, D], "coarse_logits": {level: [B, M_l]}}``."""
        x = self.embed(images)
        b, n_base = x.shape[0], x.shape[1]
        coarse: dict[int, torch.Tensor] = {}
        for i in range(self.num_blocks):
            level = self.positions.get(i)
            if level is None:
                x = self._block(i, x)
                continue
            prompts = self.pool.prompt_tokens(level, b, x.dtype)
            n_keep = x.shape[1]
            mask = None
            if not self.condition:
                # Rows = queries: tokens before the prompts must not see them (the prompts see everything).
                total = n_keep + prompts.shape[1]
                mask = torch.ones(total, total, dtype=torch.bool, device=x.device)
                mask[:n_keep, n_keep:] = False
            if _shares_prompt_projections(self.vit.blocks[i]):
                y = self._prompt_block(i, x, prompts[0], mask)
            else:
                y = self._block(i, torch.cat([x, prompts], dim=1), mask)
            x, prompt_out = y[:, :n_keep], y[:, n_keep:]
            coarse[level] = self.pool.coarse_logits(level, prompt_out)
            if self.absorb == "soft_token":
                x = torch.cat([x, self.pool.soft_prompt(level, coarse[level]).to(x.dtype)], dim=1)
        x = self.vit.norm(x[:, :n_base])
        return {"features": self.vit.forward_head(x, pre_logits=True), "coarse_logits": coarse}

    def forward(self, images: torch.Tensor) -> dict[str, Any]:
        """``{"fine_logits": [B, num_leaves], "coarse_logits": {level: [B, M_l]}, "features": [B, D]}``."""
        return self.forward_head(self.forward_features(images))


# ---------------------------------------------------------------------------------------------- HF text encoders
class PromptedTextEncoder(PromptedModel):
    """TransHP for a Hugging Face BERT-like encoder: prompt tokens inserted into the sequence at chosen layers.

    At prompting layer ``k`` the level's prompt pool is appended after the (padded) tokens, the attention mask
    is extended with ones for them, the layer runs, the coarse class is scored from the prompt outputs and the
    prompts are dropped (``absorb="attention"``) or replaced by their probability-weighted mixture
    (``"soft_token"``). Prompts get no position embedding: they enter after the embedding layer. The pooled
    text representation (``pooling``) feeds the fine classifier over the leaves.

    Works with encoders exposing ``embeddings`` and ``encoder.layer`` (BERT, RoBERTa, MiniLM, ELECTRA...),
    with the eager or SDPA attention implementation.

    Args:
        encoder: e.g. a ``transformers.BertModel`` (not a decoder).
        taxonomy: a tree.
        prompt_layers: ``{layer index: level}`` or a list of layer indices; default
            :func:`~hiercls.models.prompt_pool.default_prompt_positions`.
        coarse_loss_weight: ``lambda`` per level.
        pooling: ``"mean"`` (masked mean of the real tokens, as sentence-transformers), ``"cls"`` (first token)
            or ``"pooler"`` (the model's tanh pooler).
        absorb: ``"attention"`` or ``"soft_token"`` (see :class:`TransHPViT`).
        condition: ``False`` stops the text tokens from attending to the prompts (ablation).
        init_std: init scale of prompts, prototypes and the fine head.

    Example:
        >>> import torch
        >>> from transformers import BertConfig, BertModel
        >>> cfg = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        ...                  intermediate_size=32, max_position_embeddings=32)
        >>> tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1")])
        >>> model = PromptedTextEncoder(BertModel(cfg), tax, prompt_layers={0: 1})
        >>> out = model(input_ids=torch.randint(1, 50, (2, 7)), attention_mask=torch.ones(2, 7, dtype=torch.long))
        >>> out["fine_logits"].shape, out["coarse_logits"][1].shape
        (torch.Size([2, 3]), torch.Size([2, 2]))
    """

    _positions_param = "prompt_layers"

    def __init__(
        self,
        encoder: nn.Module,
        taxonomy: Taxonomy,
        prompt_layers: Mapping[int, int] | Sequence[int] | None = None,
        coarse_loss_weight: float | Mapping[int, float] | Sequence[float] = 1.0,
        pooling: TextPooling = "mean",
        absorb: AbsorbMode = "attention",
        condition: bool = True,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        layers = getattr(getattr(encoder, "encoder", None), "layer", None)
        if not (hasattr(encoder, "embeddings") and isinstance(layers, nn.ModuleList) and hasattr(encoder, "config")):
            raise TypeError(
                f"encoder must be a BERT-like Hugging Face model with .embeddings and .encoder.layer "
                f"(e.g. BertModel); got {type(encoder).__name__}"
            )
        config = encoder.config
        if getattr(config, "is_decoder", False):
            raise ValueError("encoder: decoder (causal) configurations are not supported; use a bidirectional encoder")
        self.encoder = encoder
        self.pooling: str = "mean"
        self._set_pooling(pooling)
        self.absorb = check_absorb(absorb, condition)
        self.condition = bool(condition)
        self.in_features = int(config.hidden_size)
        self.num_blocks = len(layers)
        self._build_pool(taxonomy, prompt_layers, self.num_blocks, coarse_loss_weight, init_std, "prompt_layers")

    def _backbone_parameters(self) -> Any:
        return self.encoder.parameters()

    def _set_pooling(self, pooling: str) -> None:
        if pooling not in ("mean", "cls", "pooler"):
            raise ValueError(f"pooling must be 'mean', 'cls' or 'pooler', got {pooling!r}")
        if pooling == "pooler" and getattr(self.encoder, "pooler", None) is None:
            raise ValueError("pooling='pooler' but the encoder has no pooler (built with add_pooling_layer=False)")
        self.pooling = pooling

    def _mask(self, hidden: torch.Tensor, mask2d: torch.Tensor, n_text: int | None) -> torch.Tensor | None:
        """The layer's attention mask for a 2D key mask; ``n_text`` set = text rows may not see columns >= n_text."""
        config = self.encoder.config
        impl = getattr(config, "_attn_implementation", "eager") or "eager"
        if n_text is None:
            from transformers.masking_utils import create_bidirectional_mask

            return create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=mask2d)
        if impl not in ("eager", "sdpa"):
            raise ValueError(f"condition=False needs the eager or sdpa attention implementation, not {impl!r}")
        b, s = mask2d.shape
        allowed = mask2d.bool()[:, None, None, :].expand(b, 1, s, s).clone()
        allowed[:, :, :n_text, n_text:] = False
        neg = torch.finfo(hidden.dtype).min
        return torch.zeros(b, 1, s, s, dtype=hidden.dtype, device=hidden.device).masked_fill(~allowed, neg)

    def _layer(self, index: int, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        out = self.encoder.encoder.layer[index](hidden, attention_mask=mask)
        return out[0] if isinstance(out, tuple) else out

    def forward_features(
        self,
        input_ids: torch.Tensor | Mapping[str, Any] | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """``{"features": pooled [B, D], "coarse_logits": {level: [B, M_l]}, "hidden_states": [B, S, D]}``.

        ``input_ids`` may also be a tokenizer batch (a mapping with ``input_ids``, ``attention_mask``...).
        """
        if isinstance(input_ids, Mapping):
            batch = dict(input_ids)
            unknown = set(batch) - {"input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds"}
            if unknown:
                raise ValueError(f"input batch has unexpected keys {sorted(unknown)}")
            return self.forward_features(**batch)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids [B, S] and inputs_embeds [B, S, D]")
        ref = input_ids if input_ids is not None else inputs_embeds[..., 0]
        if ref.dim() != 2:
            raise ValueError(f"input_ids must be [B, S], got shape {tuple(ref.shape)}")
        b, s = ref.shape
        if attention_mask is None:
            attention_mask = torch.ones(b, s, dtype=torch.long, device=ref.device)
        elif tuple(attention_mask.shape) != (b, s):
            raise ValueError(f"attention_mask must be [B, S] = {(b, s)}, got {tuple(attention_mask.shape)}")
        hidden = self.encoder.embeddings(
            input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids, inputs_embeds=inputs_embeds
        )
        mask2d = attention_mask.to(hidden.device).long()
        base_mask = self._mask(hidden, mask2d, None)
        coarse: dict[int, torch.Tensor] = {}
        n_soft = 0
        for i in range(self.num_blocks):
            level = self.positions.get(i)
            cur_mask2d = torch.cat([mask2d, mask2d.new_ones(b, n_soft)], dim=1) if n_soft else mask2d
            if level is None:
                mask = base_mask if not n_soft else self._mask(hidden, cur_mask2d, None)
                hidden = self._layer(i, hidden, mask)
                continue
            prompts = self.pool.prompt_tokens(level, b, hidden.dtype)
            n_keep = hidden.shape[1]
            full2d = torch.cat([cur_mask2d, mask2d.new_ones(b, prompts.shape[1])], dim=1)
            extended = torch.cat([hidden, prompts], dim=1)
            out = self._layer(i, extended, self._mask(extended, full2d, None if self.condition else n_keep))
            hidden, prompt_out = out[:, :n_keep], out[:, n_keep:]
            coarse[level] = self.pool.coarse_logits(level, prompt_out)
            if self.absorb == "soft_token":
                hidden = torch.cat([hidden, self.pool.soft_prompt(level, coarse[level]).to(hidden.dtype)], dim=1)
                n_soft += 1
        hidden = hidden[:, :s]
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "pooler":
            pooled = self.encoder.pooler(hidden)
        else:
            pooled = masked_mean(hidden, mask2d)
        return {"features": pooled, "coarse_logits": coarse, "hidden_states": hidden}

    def forward(
        self,
        input_ids: torch.Tensor | Mapping[str, Any] | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """``{"fine_logits": [B, num_leaves], "coarse_logits": {level: [B, M_l]}, "features": [B, D]}``."""
        return self.forward_head(
            self.forward_features(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        )


# ---------------------------------------------------------------------------------------------- builder
def create_prompt_model(backbone: nn.Module, taxonomy: Taxonomy, **options: Any) -> TransHPViT | PromptedTextEncoder:
    """Wrap a backbone with hierarchical prompting: :class:`TransHPViT` for a timm ViT, else a text encoder.

    Args:
        backbone: a timm ``VisionTransformer`` or a BERT-like Hugging Face encoder.
        taxonomy: a tree.
        **options: constructor options; ``prompt_positions`` is accepted for either (as ``prompt_blocks`` /
            ``prompt_layers``).

    Raises:
        TypeError: the backbone is neither (e.g. a CNN: prompting needs a token sequence).

    Example:
        >>> import timm
        >>> tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "a1"), ("a", "a2"), ("b", "b1")])
        >>> vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=8, depth=2,
        ...                         embed_dim=16, num_heads=2)
        >>> type(create_prompt_model(vit, tax, prompt_positions={0: 1})).__name__
        'TransHPViT'
    """
    from timm.models.vision_transformer import VisionTransformer

    positions = options.pop("prompt_positions", None)
    if isinstance(backbone, VisionTransformer):
        if positions is not None:
            options.setdefault("prompt_blocks", positions)
        return TransHPViT(backbone, taxonomy, **options)
    if hasattr(backbone, "embeddings") and hasattr(getattr(backbone, "encoder", None), "layer"):
        if positions is not None:
            options.setdefault("prompt_layers", positions)
        return PromptedTextEncoder(backbone, taxonomy, **options)
    raise TypeError(
        f"hierarchical prompting needs a timm VisionTransformer or a BERT-like Hugging Face encoder; got "
        f"{type(backbone).__name__}"
    )
