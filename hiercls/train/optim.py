"""Optimizer, learning-rate schedule and weight EMA of a run, built from ``optim``, ``sched`` and ``model.ema``.

The optimizer is any name of timm's ``create_optimizer_v2`` (``adamw`` by default, ``sgd``, ``lamb``, ``lars``,
``adam``...) that trains and resumes exactly here (:func:`check_optimizer` refuses the others, naming why), over
hiercls's parameter groups: weight decay on tensors with >= 2 dimensions only, ``optim.head_lr`` for the
parameters under ``head.``, and with ``optim.layer_decay`` timm's layer-wise lr decay (its
``param_groups_layer_decay``; each group's scale is folded into the group's ``lr``, so that every schedule,
hiercls's or timm's, scales the same per-group base lr). The schedule is stepped once per optimizer step:
``cosine`` is hiercls's linear warmup + cosine (:func:`cosine_schedule`), ``constant`` hiercls's warmup then a
flat lr, ``onecycle`` torch's ``OneCycleLR``, any other name timm's ``create_scheduler_v2`` (``step``,
``multistep``, ``tanh``, ``poly``, ``wsd``, ``rsqrt``; ``timm_cosine`` is timm's cosine), counted in optimizer
steps. Every one of them saves and loads its whole state as tensors and plain values (``resume.pt`` is read with
``weights_only=True``).

Example:
    >>> from hiercls.train.config import TrainConfig
    >>> cfg = TrainConfig()
    >>> cfg.optim.name, cfg.optim.momentum, cfg.sched.name = "sgd", 0.9, "step"
    >>> opt = build_optimizer(nn.Linear(2, 2), cfg)
    >>> type(opt).__name__, [g["weight_decay"] for g in opt.param_groups]
    ('SGD', [0.01, 0.0])
    >>> sched = build_scheduler(opt, cfg, total_steps=10, steps_per_epoch=5)
    >>> round(sched.get_last_lr()[0], 6)
    0.001
"""

from __future__ import annotations

import importlib.util
import inspect
import math
from typing import Any

import timm.optim
import timm.scheduler
import torch
from timm.utils import ModelEmaV3
from torch import nn

from hiercls.train.config import ConfigError, TrainConfig

__all__ = [
    "StepScheduler",
    "build_ema",
    "build_optimizer",
    "build_scheduler",
    "check_optimizer",
    "cosine_schedule",
]

#: The package each family of timm's optimizers imports (by the module path timm names its class with).
OPTIONAL_PACKAGES = {"apex.": "apex (NVIDIA Apex)", "bitsandbytes.": "bitsandbytes"}


def _param_groups(model: nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """hiercls's groups: (head?, decay?) as always; with ``layer_decay`` timm's layer groups split by head."""
    o = cfg.optim
    head_lr = o.head_lr if o.head_lr is not None else o.lr
    is_head = {id(p): name.startswith("head.") and head_lr != o.lr for name, p in model.named_parameters()}
    if o.layer_decay is None:
        groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
        for p in model.parameters():
            if p.requires_grad:
                groups.setdefault((is_head[id(p)], p.dim() >= 2), []).append(p)
        return [
            {
                "params": groups[head, decay],
                "weight_decay": o.weight_decay if decay else 0.0,
                "lr": head_lr if head else o.lr,
            }
            for head in (False, True)
            for decay in (True, False)
            if groups.get((head, decay))
        ]
    no_decay = getattr(model, "no_weight_decay", lambda: set())()
    layered = timm.optim.param_groups_layer_decay(
        model, weight_decay=o.weight_decay, no_weight_decay_list=no_decay, layer_decay=o.layer_decay
    )
    out = []
    for group in layered:
        scale = group.pop("lr_scale")
        for head in (False, True):
            params = [p for p in group["params"] if is_head[id(p)] == head]
            if params:
                out.append({**group, "params": params, "lr": (head_lr if head else o.lr) * scale})
    return out


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """timm's optimizer ``optim.name`` over hiercls's parameter groups (see the module docstring).

    Raises:
        ConfigError: an optimizer name timm does not know (the message lists the valid ones), one that cannot
            train or resume exactly here (:func:`check_optimizer`), or options it refuses.

    Example:
        >>> from hiercls.train.config import TrainConfig
        >>> opt = build_optimizer(nn.Sequential(nn.Linear(2, 2)), TrainConfig())
        >>> type(opt).__name__, [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups]
        ('AdamW', [(1, 0.01), (1, 0.0)])
    """
    o = cfg.optim
    kwargs = check_optimizer(cfg)
    try:
        return timm.optim.create_optimizer_v2(
            _param_groups(model, cfg), opt=o.name, lr=o.lr, weight_decay=o.weight_decay, **kwargs
        )
    except (TypeError, ValueError, ImportError) as err:
        raise ConfigError(
            f"optim: timm's {o.name!r} optimizer refused the settings ({err}); see optim.options",
        ) from None


def check_optimizer(cfg: TrainConfig) -> dict[str, Any]:
    """The keyword arguments of ``optim.name`` (``betas``, ``eps``, ``momentum``, ``options``), refusing every
    choice a run could not train and resume exactly (called before anything is built).

    Refused: unknown names and prefixes other than ``lookahead_`` (timm drops them silently); second-order
    optimizers (``adahessian``: its step needs ``loss.backward(create_graph=True)``, which the loop does not do);
    optimizers of a package that is not installed (``bnb*``: bitsandbytes, ``fused*``: NVIDIA Apex) or that
    need CUDA where there is none; betas of another length than the optimizer's (``adan`` takes three:
    ``optim.options.betas``); Kron drawing its noise from the global random stream (``options.deterministic:
    false``: DDP ranks are seeded apart and would drift apart; hiercls sets ``true``).

    Raises:
        ConfigError: naming ``optim.name`` (or the option), the optimizer and why.

    Example:
        >>> from hiercls.train.config import TrainConfig, apply_overrides
        >>> check_optimizer(apply_overrides(TrainConfig(), ["optim.name=lookahead_adamw"]))
        {'betas': (0.9, 0.999), 'eps': 1e-08}
        >>> check_optimizer(apply_overrides(TrainConfig(), ["optim.name=sgd", "optim.momentum=0.8"]))
        {'momentum': 0.8}
        >>> check_optimizer(apply_overrides(TrainConfig(), ["optim.name=adahessian"]))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hiercls.train.config.ConfigError: optim.name: 'adahessian' is a second-order optimizer: ...
    """
    o = cfg.optim
    info = _optimizer_info(o.name)
    takes = {} if isinstance(info.opt_class, str) else inspect.signature(info.opt_class).parameters
    kwargs: dict[str, Any] = {"betas": tuple(o.betas), "eps": o.eps}
    if takes and not any(p.kind is p.VAR_KEYWORD for p in takes.values()):
        # optim.betas / eps are for the optimizers that have them (an older timm hands Kron an eps it refuses)
        kwargs = {k: v for k, v in kwargs.items() if k in takes}
    kwargs.update(o.options)
    if o.momentum is not None:
        kwargs["momentum"] = o.momentum
    betas = kwargs.get("betas")
    if info.has_betas and betas is not None and len(betas) != info.num_betas:
        raise ConfigError(
            f"optim.options.betas: {o.name!r} takes {info.num_betas} betas, got {list(betas)} (optim.betas holds "
            "two; give the optimizer's own number in optim.options.betas)"
        )
    if "deterministic" in takes and kwargs.setdefault("deterministic", True) is not True:
        raise ConfigError(
            f"optim.options.deterministic: {o.name!r} must draw its noise from its own saved generator "
            "(true, the default here) so that DDP ranks agree and a resumed run is exact"
        )
    return kwargs


def _optimizer_info(name: str) -> Any:
    """timm's ``OptimInfo`` of ``name``; refuses what :func:`check_optimizer` says of names and packages."""
    names = timm.optim.list_optimizers()
    prefix, _, base = name.lower().rpartition("_")
    if base not in names:
        raise ConfigError(f"optim.name: unknown optimizer {name!r}; timm's are: {', '.join(names)}")
    if prefix not in ("", "lookahead"):
        raise ConfigError(
            f"optim.name: {name!r}: the only prefix timm's optimizers take is 'lookahead_' (e.g. "
            f"'lookahead_{base}'), got {prefix + '_'!r}"
        )
    info = timm.optim.get_optimizer_info(base)
    if info.second_order:
        raise ConfigError(
            f"optim.name: {name!r} is a second-order optimizer: its step needs the gradients' graph "
            "(loss.backward(create_graph=True)) for Hessian estimates, which hiercls's training loop does not "
            "keep; choose a first-order optimizer"
        )
    module = info.opt_class if isinstance(info.opt_class, str) else ""
    for root, package in OPTIONAL_PACKAGES.items():
        if module.startswith(root) and importlib.util.find_spec(root[:-1]) is None:
            raise ConfigError(f"optim.name: {name!r} is {module}, which needs the package {package}: not installed")
        if module.startswith(root) and not torch.cuda.is_available():
            raise ConfigError(f"optim.name: {name!r} is {module}, which runs on CUDA only: no CUDA device here")
    return info


def cosine_schedule(step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Learning-rate multiplier: linear warmup from ``1/warmup`` to 1, then cosine decay to ``min_ratio``.

    Example:
        >>> [round(cosine_schedule(s, 10, 2), 3) for s in (0, 1, 2, 6, 9)]
        [0.5, 1.0, 1.0, 0.5, 0.038]
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class StepScheduler:
    """A timm scheduler stepped once per optimizer step, with the ``step`` / ``get_last_lr`` / state interface
    of torch's schedulers (``step_update`` of the number of optimizer steps taken)."""

    def __init__(self, scheduler: timm.scheduler.scheduler.Scheduler, optimizer: torch.optim.Optimizer) -> None:
        self.scheduler, self.optimizer, self.num_updates = scheduler, optimizer, 0
        scheduler.step_update(0)

    def step(self) -> None:
        self.num_updates += 1
        self.scheduler.step_update(self.num_updates)

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"num_updates": self.num_updates, "timm": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.num_updates = int(state["num_updates"])
        self.scheduler.load_state_dict(state["timm"])
        self.scheduler.step_update(self.num_updates)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: TrainConfig, *, total_steps: int, steps_per_epoch: int
) -> Any:
    """The schedule ``sched.name`` over ``total_steps`` optimizer steps (``sched`` epochs are ``steps_per_epoch``).

    Warmup (``optim.warmup_steps`` / ``warmup_ratio``) and the floor (``lr * optim.min_lr_ratio``) apply to every
    schedule that has them; the returned object has ``step()`` (once per optimizer step), ``get_last_lr()``,
    ``state_dict()`` and ``load_state_dict()``.
    """
    o, s = cfg.optim, cfg.sched
    warmup = o.warmup_steps or round(o.warmup_ratio * total_steps)
    if s.name == "cosine":
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: cosine_schedule(step, total_steps, warmup, o.min_lr_ratio)
        )
    if s.name == "constant":  # hiercls's own: timm has it only from releases above the declared floor
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )
    try:
        if s.name == "onecycle":
            return torch.optim.lr_scheduler.OneCycleLR(
                optimizer,
                max_lr=[g["lr"] for g in optimizer.param_groups],
                total_steps=total_steps,
                pct_start=s.pct_start,
                div_factor=s.div_factor,
                final_div_factor=s.final_div_factor,
                cycle_momentum=s.cycle_momentum,
                **s.options,
            )
        scheduler, _ = timm.scheduler.create_scheduler_v2(optimizer, **_timm_options(cfg, total_steps, steps_per_epoch))
    except (TypeError, ValueError, AssertionError) as err:
        raise ConfigError(
            f"sched: the {s.name!r} schedule refused the settings ({err}); see sched.options "
            "(onecycle's cycle_momentum needs an optimizer with momentum or betas)"
        ) from None
    if scheduler is None:  # an older timm answers an unknown name with None
        raise ConfigError(
            f"sched.name: {s.name!r} is not a schedule of the installed timm {timm.__version__} (wsd and rsqrt need "
            "a newer timm); choose cosine, onecycle, constant, step, multistep, tanh or poly, or upgrade timm"
        )
    return StepScheduler(scheduler, optimizer)


def _timm_options(cfg: TrainConfig, total_steps: int, steps_per_epoch: int) -> dict[str, Any]:
    """``create_scheduler_v2``'s arguments, every length in optimizer steps."""
    o, s = cfg.optim, cfg.sched
    return {
        "sched": "cosine" if s.name == "timm_cosine" else s.name,
        "num_epochs": total_steps,
        "decay_epochs": s.decay_epochs * steps_per_epoch,
        "decay_milestones": [round(m * steps_per_epoch) for m in s.decay_milestones],
        "decay_rate": s.decay_rate,
        "min_lr": o.lr * o.min_lr_ratio,
        "warmup_lr": o.lr * s.warmup_lr_ratio,
        "warmup_epochs": o.warmup_steps or round(o.warmup_ratio * total_steps),
        "step_on_epochs": False,
        "updates_per_epoch": 1,  # every length above is already in optimizer steps
        **s.options,
    }


def build_ema(model: nn.Module, cfg: TrainConfig) -> ModelEmaV3 | None:
    """timm's ``ModelEmaV3`` of ``model`` when ``model.ema.decay`` is set (``None`` otherwise).

    Example:
        >>> from hiercls.train.config import TrainConfig
        >>> cfg = TrainConfig()
        >>> build_ema(nn.Linear(2, 2), cfg) is None
        True
        >>> cfg.model.ema.decay = 0.9
        >>> ema = build_ema(nn.Linear(2, 2), cfg)
        >>> ema.decay, ema.use_warmup
        (0.9, False)
    """
    e = cfg.model.ema
    if e.decay is None:
        return None
    return ModelEmaV3(model, decay=e.decay, use_warmup=e.warmup)
