"""The parts of hierarchical prompting (TransHP) that do not depend on the backbone.

:func:`default_prompt_positions` (which blocks prompt which levels), :class:`HierarchicalPromptPool` (prompt
tokens, coarse prototypes, the fine classifier and the TransHP loss) and :class:`PromptedModel`, the base of
:class:`hiercls.models.prompt.TransHPViT` and :class:`hiercls.models.prompt.PromptedTextEncoder` (loss, node
probabilities, ``reset_head``). ``hiercls.models.prompt`` describes the method.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from hiercls.losses.validation import check_leaf_distribution, is_soft_targets
from hiercls.taxonomy import Taxonomy, TaxonomyError
from hiercls.taxonomy.tensors import TreeOps, leaf_ranges

AbsorbMode = Literal["attention", "soft_token"]

__all__ = [
    "DEFAULT_MAX_PROMPT_LEVELS",
    "DEFAULT_MAX_PROMPT_TOKENS",
    "AbsorbMode",
    "HierarchicalPromptPool",
    "PromptedModel",
    "check_absorb",
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
    (``D -> num_leaves``). Shared by the prompted models (:mod:`hiercls.models.prompt`).

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
            nodes = torch.from_numpy(np.array(taxonomy.levels[lvl], dtype=np.int64))
            self.register_buffer(f"coarse_nodes_{lvl}", nodes, persistent=False)
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

    def soft_loss(self, level: int | None, logits: torch.Tensor, q: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Cross-entropy against soft targets: ``q [B, num_leaves]`` itself (``level=None``, the fine logits) or
        its mass on each depth-``level`` node (the coarse logits), over the mass that reaches that level.

        Both losses are linear in a one-hot target and this is the expectation of the hard loss (mean over the
        samples whose label reaches the level, which for a distribution is the summed mass there).
        """
        logp = torch.log_softmax(_at_least_f32(logits), dim=1)
        q = q.to(logp.dtype) * keep[:, None]
        if level is not None:
            q = self.tree_ops.marginals(q).index_select(1, getattr(self, f"coarse_nodes_{level}"))
        return -(q * logp).sum() / q.sum().clamp(min=1)

    def loss_terms(self, output: Mapping[str, Any], targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The loss and its parts: ``{"loss", "fine", "coarse_<level>" ...}`` (unweighted parts, float32).

        ``targets``: node ids ``[B]`` (``-1`` = ignore) or a leaf distribution ``[B, num_leaves]`` (float).
        """
        fine_logits = output["fine_logits"]
        soft = is_soft_targets(targets)
        if soft:
            q, keep = check_leaf_distribution(targets, self.taxonomy.num_leaves, batch=fine_logits.shape[0])
            terms = {"fine": self.soft_loss(None, fine_logits, q, keep)}
        else:
            targets = self.check_targets(targets, fine_logits.shape[0]).to(fine_logits.device)
            terms = {"fine": self.fine_loss(fine_logits, targets)}
        total = terms["fine"]
        coarse = output.get("coarse_logits", {})
        for lvl in self.levels:
            if lvl not in coarse:
                raise KeyError(f"output has no coarse logits for prompted level {lvl}")
            if soft:
                terms[f"coarse_{lvl}"] = self.soft_loss(lvl, coarse[lvl], q, keep)
            else:
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
class PromptedModel(nn.Module):
    """``loss`` / ``node_probs`` / ``reset_head`` shared by the prompted backbones (:mod:`hiercls.models.prompt`).

    A subclass sets ``in_features``, ``num_blocks``, ``absorb`` and ``condition``, calls :meth:`_build_pool` and
    names its backbone's parameters in :meth:`_backbone_parameters`.
    """

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

    def forward_head(self, feats: Mapping[str, Any]) -> dict[str, Any]:
        """Fine logits over the leaves from :meth:`forward_features`' output."""
        return {
            "fine_logits": self.pool.fine_head(feats["features"]),
            "coarse_logits": feats["coarse_logits"],
            "features": feats["features"],
        }

    def loss(self, output: Mapping[str, Any], targets: torch.Tensor) -> torch.Tensor:
        """TransHP loss ``CE(fine) + sum_l lambda_l CE(coarse_l)`` (float32 scalar); see the module docstring.

        Args:
            output: the dict returned by ``forward``.
            targets: node ids ``[B]`` (``-1`` = ignore; internal-node labels allowed) or a leaf distribution
                ``[B, num_leaves]`` (float; mixup / cutmix).
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
        check_absorb(absorb, condition)
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


def check_absorb(absorb: str, condition: bool) -> str:
    """``absorb`` if it is a known mode that ``condition`` allows.

    Raises:
        ValueError: an unknown mode, or ``"soft_token"`` with ``condition=False``.

    Example:
        >>> check_absorb("attention", condition=False)
        'attention'
    """
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
