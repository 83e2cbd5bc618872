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

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hiercls.heads.pooling import TextPooling, masked_mean
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.tensors import TreeOps, leaf_ranges

logger = logging.getLogger(__name__)

AbsorbMode = Literal["attention", "soft_token"]

__all__ = [
    "AbsorbMode",
    "HierarchicalPromptPool",
    "PromptedTextEncoder",
    "TextPooling",
    "TransHPViT",
    "create_prompt_model",
    "default_prompt_positions",
]


# ---------------------------------------------------------------------------------------------- configuration
#: Default bound on the prompting cost: at most this many prompted levels ...
DEFAULT_MAX_PROMPT_LEVELS = 2
#: ... holding at most this many prompt tokens in all (one per coarse class of each prompted level).
DEFAULT_MAX_PROMPT_TOKENS = 320


def default_prompt_positions(
    taxonomy: Taxonomy,
    num_blocks: int,
    *,
    max_levels: int = DEFAULT_MAX_PROMPT_LEVELS,
    max_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
) -> dict[int, int]:
    """Default prompting blocks: a few coarse levels, coarsest first, at consecutive blocks ending one before the last.

    TransHP prompts a few coarse levels in late intermediate blocks (the reference ViT-B/12 setting prompts
    block index 10 for its coarse level). Each prompted level adds one token per coarse class to its block, so
    the default is bounded: levels ``1, 2, ...`` are taken while there are at most ``max_levels`` of them and
    their prompt tokens total at most ``max_tokens`` (e.g. ``imagenet21k_winter21``: level 1 only, 293 tokens;
    level 2 would add 1,040). Pass ``prompt_blocks={block: level}`` to prompt other or wider levels.

    Args:
        taxonomy: a tree.
        num_blocks: number of transformer blocks / layers of the backbone.
        max_levels: most prompted levels (default 2).
        max_tokens: most prompt tokens over all prompted levels (default 320).

    Returns:
        ``{block index: level}``.

    Raises:
        ValueError: the taxonomy has no coarse level (height < 2), its coarsest level alone has more than
            ``max_tokens`` classes, or the backbone has too few blocks.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("a", "x"), ("x", "x1"), ("r", "b"), ("b", "y"), ("y", "y1")])
        >>> default_prompt_positions(tax, 12)
        {9: 1, 10: 2}
        >>> default_prompt_positions(tax, 12, max_tokens=3)  # level 2 would bring the total to 4 tokens
        {10: 1}
    """
    coarse = list(range(1, taxonomy.height))
    if not coarse:
        raise ValueError(
            f"taxonomy {taxonomy.name!r} has height {taxonomy.height}: it has no coarse level to prompt; "
            "pass prompt_blocks={} for a plain fine classifier"
        )
    levels: list[int] = []
    total = 0
    for lvl in coarse[: max(0, int(max_levels))]:
        width = len(taxonomy.levels[lvl])
        if total + width > max_tokens:
            break
        levels.append(lvl)
        total += width
    if not levels:
        raise ValueError(
            f"taxonomy {taxonomy.name!r}: its coarsest level (depth 1) has {len(taxonomy.levels[1])} classes, more "
            f"than the default budget of {max_tokens} prompt tokens (one per coarse class); pass "
            "prompt_blocks={block: level} explicitly to accept that cost"
        )
    if len(levels) > num_blocks - 1:
        raise ValueError(
            f"taxonomy {taxonomy.name!r} has {len(levels)} coarse levels to prompt but the backbone has only "
            f"{num_blocks} blocks; pass prompt_blocks={{block: level}} explicitly"
        )
    first = num_blocks - 1 - len(levels)
    return {first + i: lvl for i, lvl in enumerate(levels)}


def _resolve_positions(
    positions: Mapping[int, int] | Sequence[int] | None, taxonomy: Taxonomy, num_blocks: int, param: str
) -> dict[int, int]:
    """Validate ``{block: level}`` (or a list of blocks for levels 1, 2, ...) into a block-sorted dict."""
    if positions is None:
        return default_prompt_positions(taxonomy, num_blocks)
    if isinstance(positions, Mapping):
        pairs = list(positions.items())
    elif isinstance(positions, Sequence) and not isinstance(positions, str):
        pairs = [(b, i + 1) for i, b in enumerate(positions)]
    else:
        raise TypeError(
            f"{param} must be a dict {{block index: hierarchy level}} or a list of block indices; "
            f"got {type(positions).__name__}"
        )
    out: dict[int, int] = {}
    seen_levels: dict[int, int] = {}
    for block, level in pairs:
        block, level = _int_key(block), _int_key(level)
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)):
            raise TypeError(f"{param}: block index must be an int, got {block!r}")
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
            raise TypeError(f"{param}: level of block {block} must be an int, got {level!r}")
        block, level = int(block), int(level)
        if not 0 <= block < num_blocks:
            raise ValueError(f"{param}: block index {block} is outside the backbone's blocks 0..{num_blocks - 1}")
        if not 1 <= level < taxonomy.height:
            raise ValueError(
                f"{param}: level {level} (block {block}) is not a coarse level of taxonomy "
                f"{taxonomy.name!r}; coarse levels are depths 1..{taxonomy.height - 1} (the leaves "
                "are the fine classes)"
            )
        if block in out:
            raise ValueError(f"{param}: block {block} is given twice")
        if level in seen_levels:
            raise ValueError(
                f"{param}: level {level} is prompted at blocks {seen_levels[level]} and {block}; each "
                "level has one prompting block"
            )
        out[block] = level
        seen_levels[level] = block
    return dict(sorted(out.items()))


def _int_key(value: Any) -> Any:
    """``"3"`` -> ``3``: dict keys come back as strings from a JSON-saved config."""
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


def _resolve_weights(weight: float | Mapping[int, float] | Sequence[float], levels: Sequence[int]) -> dict[int, float]:
    """Coarse loss weight per level from a scalar, a ``{level: weight}`` dict or a list aligned with ``levels``."""
    if isinstance(weight, Mapping):
        weight = {_int_key(k): w for k, w in weight.items()}
        missing = [lvl for lvl in levels if lvl not in weight]
        extra = [k for k in weight if k not in levels]
        if missing or extra:
            raise ValueError(
                f"coarse_loss_weight keys must be the prompted levels {list(levels)}; "
                f"missing {missing}, unknown {extra}"
            )
        out = {lvl: float(weight[lvl]) for lvl in levels}
    elif isinstance(weight, Sequence) and not isinstance(weight, str):
        if len(weight) != len(levels):
            raise ValueError(
                f"coarse_loss_weight has {len(weight)} entries but {len(levels)} levels are prompted "
                f"({list(levels)}, in block order)"
            )
        out = {lvl: float(w) for lvl, w in zip(levels, weight, strict=True)}
    elif isinstance(weight, (int, float)) and not isinstance(weight, bool):
        out = dict.fromkeys(levels, float(weight))
    else:
        raise TypeError(f"coarse_loss_weight must be a number, a dict or a list; got {type(weight).__name__}")
    bad = {k: w for k, w in out.items() if not (math.isfinite(w) and w >= 0)}
    if bad:
        raise ValueError(f"coarse_loss_weight must be finite and >= 0; got {bad}")
    return out


def _at_least_f32(x: torch.Tensor) -> torch.Tensor:
    """Half / bfloat16 / float32 become float32 (stable softmax and loss); float64 stays (gradcheck)."""
    return x if x.dtype == torch.float64 else x.float()


# ---------------------------------------------------------------------------------------------- prompt pool
class HierarchicalPromptPool(nn.Module):
    """Prompt tokens and coarse prototypes per hierarchy level, plus the taxonomy tables of the TransHP loss.

    Holds, for each prompted level ``l`` with ``M_l`` coarse classes (``taxonomy.levels[l]``, ascending ids),
    ``prompts[l]`` ``[M_l, D]`` and ``prototypes[l]`` ``[M_l, D]``, and the fine classifier ``fine_head``
    (``D -> num_leaves``). Shared by :class:`TransHPViT` and :class:`PromptedTextEncoder`.

    Args:
        taxonomy: a tree (use ``taxonomy.to_tree()`` for a DAG).
        embed_dim: token width ``D``.
        levels: the prompted levels (depths ``1 .. height-1``).
        coarse_loss_weight: ``lambda`` per level.
        init_std: standard deviation of the truncated-normal init of prompts, prototypes and the fine head.

    Example:
        >>> tax = Taxonomy([("r", "a"), ("r", "b"), ("a", "a1"), ("b", "b1"), ("b", "b2")])
        >>> pool = HierarchicalPromptPool(tax, 8, levels=[1])
        >>> pool.prompts["1"].shape, pool.fine_head.out_features
        (torch.Size([2, 8]), 3)
    """

    def __init__(
        self,
        taxonomy: Taxonomy,
        embed_dim: int,
        levels: Sequence[int],
        coarse_loss_weight: float | Mapping[int, float] | Sequence[float] = 1.0,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        if not isinstance(taxonomy, Taxonomy):
            raise TypeError(f"taxonomy must be a hiercls Taxonomy, got {type(taxonomy).__name__}")
        if not taxonomy.is_tree:
            raise TaxonomyError(
                f"TransHP needs a tree, but taxonomy {taxonomy.name!r} has multi-parent nodes; "
                "call taxonomy.to_tree() first"
            )
        if taxonomy.num_leaves < 2:
            raise TaxonomyError(f"taxonomy {taxonomy.name!r} has {taxonomy.num_leaves} leaf; a classifier needs >= 2")
        if not (isinstance(embed_dim, int) and embed_dim > 0):
            raise ValueError(f"embed_dim must be a positive int, got {embed_dim!r}")
        if not (init_std > 0 and math.isfinite(init_std)):
            raise ValueError(f"init_std must be positive, got {init_std!r}")
        for lvl in levels:
            if not 1 <= lvl < taxonomy.height:
                raise ValueError(f"levels: {lvl} is not a coarse level (1..{taxonomy.height - 1})")
        self.taxonomy = taxonomy
        self.embed_dim = embed_dim
        self.levels = tuple(int(lvl) for lvl in levels)
        self.coarse_loss_weight = _resolve_weights(coarse_loss_weight, self.levels)
        self.init_std = float(init_std)
        self.prompts = nn.ParameterDict(
            {str(lvl): nn.Parameter(torch.empty(len(taxonomy.levels[lvl]), embed_dim)) for lvl in self.levels}
        )
        self.prototypes = nn.ParameterDict(
            {str(lvl): nn.Parameter(torch.empty(len(taxonomy.levels[lvl]), embed_dim)) for lvl in self.levels}
        )
        self.fine_head = nn.Linear(embed_dim, taxonomy.num_leaves)

        n = taxonomy.num_nodes
        # Coarse target of every node at every prompted level: the position of its depth-l ancestor in
        # levels[l], or -1 when the node is shallower than l (ignored at that level).
        paths = taxonomy.paths
        for lvl in self.levels:
            pos = np.full(n, -1, dtype=np.int64)
            pos[taxonomy.levels[lvl]] = np.arange(len(taxonomy.levels[lvl]))
            anc = paths[:, lvl]
            table = np.where(anc >= 0, pos[np.maximum(anc, 0)], -1)
            self.register_buffer(f"coarse_target_{lvl}", torch.from_numpy(table), persistent=False)
        lo, hi = leaf_ranges(taxonomy)  # the leaves under node t are the leaf positions [lo[t], hi[t])
        self.register_buffer("leaf_lo", torch.from_numpy(lo), persistent=False)
        self.register_buffer("leaf_hi", torch.from_numpy(hi), persistent=False)
        self.tree_ops = TreeOps(taxonomy)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Truncated-normal prompts, prototypes and fine-head weights (std ``init_std``), zero fine-head bias."""
        for p in [*self.prompts.values(), *self.prototypes.values(), self.fine_head.weight]:
            nn.init.trunc_normal_(p, std=self.init_std, a=-2 * self.init_std, b=2 * self.init_std)
        nn.init.zeros_(self.fine_head.bias)

    def prompt_tokens(self, level: int, batch_size: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The prompt pool of ``level`` broadcast to ``[batch_size, M_l, D]``."""
        p = self.prompts[str(level)]
        return p.to(dtype).expand(batch_size, -1, -1) if dtype is not None else p.expand(batch_size, -1, -1)

    def coarse_logits(self, level: int, prompt_outputs: torch.Tensor) -> torch.Tensor:
        """``s_m = <w_m, p'_m>``: each prompt's block output scored by its own prototype, ``[B, M_l]``."""
        w = self.prototypes[str(level)]
        return torch.einsum("bmd,md->bm", prompt_outputs, w.to(prompt_outputs.dtype))

    def soft_prompt(self, level: int, coarse_logits: torch.Tensor) -> torch.Tensor:
        """The probability-weighted prompt ``sum_m softmax(s)_m p_m`` as one token, ``[B, 1, D]``."""
        q = torch.softmax(_at_least_f32(coarse_logits), dim=-1)
        return (q @ _at_least_f32(self.prompts[str(level)]).to(q.dtype)).unsqueeze(1)

    # ------------------------------------------------------------------ targets, loss, probabilities
    def check_targets(self, targets: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Validate single-label node-id targets ``[B]`` (``-1`` = ignore)."""
        if not isinstance(targets, torch.Tensor):
            raise TypeError(f"targets must be a LongTensor of node ids [B], got {type(targets).__name__}")
        if targets.dim() == 2 and targets.shape[1] == self.taxonomy.num_nodes:
            raise TypeError("targets: TransHP is single-label; got [B, N] multi-label targets, expected node ids [B]")
        if targets.dtype.is_floating_point or targets.dtype == torch.bool or targets.dim() != 1:
            raise TypeError(
                f"targets must be integer node ids of shape [B]; got dtype {targets.dtype} and shape "
                f"{tuple(targets.shape)}"
            )
        if targets.shape[0] != batch_size:
            raise ValueError(f"targets has {targets.shape[0]} entries but the output has batch size {batch_size}")
        if targets.numel():
            lo, hi = int(targets.min()), int(targets.max())
            if lo < -1 or hi >= self.taxonomy.num_nodes:
                bad = lo if lo < -1 else hi
                raise ValueError(
                    f"targets: node id {bad} is outside 0..{self.taxonomy.num_nodes - 1} "
                    f"(taxonomy {self.taxonomy.name!r}; -1 marks an ignored sample)"
                )
        return targets.long()

    def fine_loss(self, fine_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean over non-ignored samples of ``-log sum_{leaves under target} softmax(fine_logits)``."""
        logits = _at_least_f32(fine_logits)
        valid = targets >= 0
        t = targets.clamp(min=0)
        lo, hi = self.leaf_lo[t], self.leaf_hi[t]
        pos = torch.arange(logits.shape[1], device=logits.device)
        inside = (pos >= lo[:, None]) & (pos < hi[:, None])
        log_norm = torch.logsumexp(logits, dim=1)
        log_num = torch.logsumexp(logits.masked_fill(~inside, float("-inf")), dim=1)
        nll = (log_norm - log_num).masked_fill(~valid, 0.0)
        return nll.sum() / valid.sum().clamp(min=1)

    def coarse_loss(self, level: int, coarse_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of ``coarse_logits`` against the targets' ancestors at ``level`` (shallower labels ignored)."""
        ct = getattr(self, f"coarse_target_{level}")[targets.clamp(min=0)]
        ct = torch.where(targets >= 0, ct, torch.full_like(ct, -1))
        valid = ct >= 0
        logp = torch.log_softmax(_at_least_f32(coarse_logits), dim=1)
        nll = -logp.gather(1, ct.clamp(min=0)[:, None]).squeeze(1).masked_fill(~valid, 0.0)
        return nll.sum() / valid.sum().clamp(min=1)

    def loss_terms(self, output: Mapping[str, Any], targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The loss and its parts: ``{"loss", "fine", "coarse_<level>" ...}`` (unweighted parts, float32)."""
        fine_logits = output["fine_logits"]
        targets = self.check_targets(targets, fine_logits.shape[0]).to(fine_logits.device)
        terms = {"fine": self.fine_loss(fine_logits, targets)}
        total = terms["fine"]
        coarse = output.get("coarse_logits", {})
        for lvl in self.levels:
            if lvl not in coarse:
                raise KeyError(f"output has no coarse logits for prompted level {lvl}")
            terms[f"coarse_{lvl}"] = self.coarse_loss(lvl, coarse[lvl], targets)
            total = total + self.coarse_loss_weight[lvl] * terms[f"coarse_{lvl}"]
        terms["loss"] = total
        return terms

    def node_probs(self, fine_logits: torch.Tensor) -> torch.Tensor:
        """Leaf softmax summed bottom-up into ``[B, N]`` float32 node probabilities (root exactly 1).

        Float64 logits give float64 probabilities (for gradient checks); every other dtype gives float32.

        ``parent >= child`` holds exactly in floating point (:meth:`hiercls.taxonomy.tensors.TreeOps.node_probs`).
        """
        return self.tree_ops.node_probs(torch.softmax(_at_least_f32(fine_logits), dim=-1))


# ---------------------------------------------------------------------------------------------- shared model base
class _PromptedModel(nn.Module):
    """``loss`` / ``node_probs`` / ``reset_head`` shared by the prompted backbones (see :class:`TransHPViT`)."""

    pool: HierarchicalPromptPool
    positions: dict[int, int]

    def _build_pool(
        self, taxonomy: Taxonomy, positions: Any, num_blocks: int, weight: Any, init_std: float, param: str
    ) -> None:
        # Everything is built before anything is assigned, so a bad option leaves the model as it was.
        resolved = _resolve_positions(positions, taxonomy, num_blocks, param)
        pool = HierarchicalPromptPool(
            taxonomy, self.in_features, list(resolved.values()), coarse_loss_weight=weight, init_std=init_std
        )
        ref = next(self._backbone_parameters(), None)
        if ref is not None:  # follow the backbone's device and (floating) dtype, e.g. a bf16 checkpoint
            pool.to(device=ref.device, dtype=ref.dtype if ref.dtype.is_floating_point else None)
        self.positions = resolved
        self._positions_spec = None if positions is None else resolved
        self._weight_spec = weight
        self.pool = pool

    def _backbone_parameters(self) -> Any:  # pragma: no cover - overridden
        return iter(())

    @property
    def taxonomy(self) -> Taxonomy:
        return self.pool.taxonomy

    @property
    def num_outputs(self) -> int:
        """Number of fine logits (the taxonomy's leaves)."""
        return self.pool.taxonomy.num_leaves

    @property
    def prompt_levels(self) -> tuple[int, ...]:
        """Prompted hierarchy levels in block order."""
        return self.pool.levels

    def loss(self, output: Mapping[str, Any], targets: torch.Tensor) -> torch.Tensor:
        """TransHP loss ``CE(fine) + sum_l lambda_l CE(coarse_l)`` (float32 scalar); see the module docstring.

        Args:
            output: the dict returned by ``forward``.
            targets: node ids ``[B]`` (``-1`` = ignore; internal-node labels allowed).
        """
        return self.pool.loss_terms(output, targets)["loss"]

    def loss_terms(self, output: Mapping[str, Any], targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The loss and its unweighted parts ``{"loss", "fine", "coarse_<level>"}``, for logging."""
        return self.pool.loss_terms(output, targets)

    def node_probs(self, output: Mapping[str, Any] | torch.Tensor) -> torch.Tensor:
        """``[B, N]`` float32 node probabilities from the fine logits (leaf softmax marginalised up the tree)."""
        logits = output["fine_logits"] if isinstance(output, Mapping) else output
        return self.pool.node_probs(logits)

    #: Constructor name of the prompt-position option (``prompt_blocks`` / ``prompt_layers``).
    _positions_param = "prompt_positions"

    def reset_head(self, taxonomy: Taxonomy | None = None, **options: Any) -> None:
        """Re-initialise the taxonomy-dependent parameters (prompts, prototypes, fine head), or rebuild them.

        With no arguments the parameters are re-initialised in place. With a new ``taxonomy`` and/or
        constructor options they are rebuilt; options not given keep their current setting, except prompt
        positions that were defaulted at construction, which are re-defaulted for the new taxonomy.

        Args:
            taxonomy: a new taxonomy (default: the current one).
            **options: ``prompt_positions`` (or ``prompt_blocks`` / ``prompt_layers``), ``coarse_loss_weight``,
                ``absorb``, ``condition``, ``init_std`` (and ``pooling`` for text encoders).

        Raises:
            TypeError: an unknown option.
        """
        if taxonomy is None and not options:
            self.pool.reset_parameters()
            return
        taxonomy = self.taxonomy if taxonomy is None else taxonomy
        names = {"prompt_positions", self._positions_param}
        given = [k for k in options if k in names]
        if len(given) > 1:
            raise TypeError(f"reset_head: pass only one of {sorted(names)}")
        positions = options.pop(given[0]) if given else self._positions_spec
        weight = options.pop("coarse_loss_weight", self._weight_spec)
        init_std = options.pop("init_std", self.pool.init_std)
        absorb = options.pop("absorb", self.absorb)
        condition = options.pop("condition", self.condition)
        pooling = options.pop("pooling", getattr(self, "pooling", None))
        if options:
            raise TypeError(f"reset_head got unknown options {sorted(options)}")
        _check_absorb(absorb, condition)
        old_pooling = getattr(self, "pooling", None)
        if pooling is not None and old_pooling is not None:
            self._set_pooling(pooling)  # validates
        try:
            self._build_pool(taxonomy, positions, self.num_blocks, weight, init_std, self._positions_param)
        except Exception:
            if old_pooling is not None:
                self.pooling = old_pooling
            raise
        self.absorb, self.condition = absorb, bool(condition)


def _check_absorb(absorb: str, condition: bool) -> str:
    if absorb not in ("attention", "soft_token"):
        raise ValueError(
            f"absorb must be 'attention' (the paper: prompts discarded after the prompting block) or "
            f"'soft_token' (keep the probability-weighted prompt); got {absorb!r}"
        )
    if absorb == "soft_token" and not condition:
        raise ValueError(
            "absorb='soft_token' keeps a prompt token to condition later blocks, which condition=False "
            "forbids; use absorb='attention' for the unconditioned ablation"
        )
    return absorb


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
    from torch.nn.modules import module as module_globals

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


class TransHPViT(_PromptedModel):
    """TransHP around a timm ``VisionTransformer``: prompt pools injected at chosen blocks (see the module doc).

    The module runs the ViT's own patch embedding, position embedding, blocks, final norm and pooling, so any
    pretrained timm ViT (class token or average pooling, register tokens) works. The ViT's classifier is removed
    (``reset_classifier(0)``); the fine classifier over the taxonomy's leaves lives in ``self.pool.fine_head``.

    Args:
        vit: a ``timm.models.vision_transformer.VisionTransformer`` (taken over: its head is removed).
        taxonomy: a tree; fine classes are its leaves, coarse classes the nodes at each prompted depth.
        prompt_blocks: ``{block index: level}`` or a list of block indices (levels 1, 2, ... in order);
            default :func:`default_prompt_positions`. ``{}`` gives a plain ViT with a leaf classifier.
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
        self.absorb = _check_absorb(absorb, condition)
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

    def forward_head(self, feats: Mapping[str, Any]) -> dict[str, Any]:
        """Fine logits over the leaves from :meth:`forward_features`' output."""
        return {
            "fine_logits": self.pool.fine_head(feats["features"]),
            "coarse_logits": feats["coarse_logits"],
            "features": feats["features"],
        }

    def forward(self, images: torch.Tensor) -> dict[str, Any]:
        """``{"fine_logits": [B, num_leaves], "coarse_logits": {level: [B, M_l]}, "features": [B, D]}``."""
        return self.forward_head(self.forward_features(images))


# ---------------------------------------------------------------------------------------------- HF text encoders
class PromptedTextEncoder(_PromptedModel):
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
            :func:`default_prompt_positions`.
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
        self.absorb = _check_absorb(absorb, condition)
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

    def forward_head(self, feats: Mapping[str, Any]) -> dict[str, Any]:
        """Fine logits over the leaves from :meth:`forward_features`' output."""
        return {
            "fine_logits": self.pool.fine_head(feats["features"]),
            "coarse_logits": feats["coarse_logits"],
            "features": feats["features"],
        }

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
