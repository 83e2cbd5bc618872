"""The training loop: ``train(config) -> final metrics``.

Read top to bottom, :meth:`_Run.run` is the whole story: open the run folder (:mod:`hiercls.train.checkpoint`
decides finished / resume / fresh), build (taxonomy, model, data, optimizer), restore or seed, fit (epochs of
optimizer steps), evaluate (hierarchical metrics under every configured decoder, ``checkpoints/best`` on the best
metric), checkpoint (``checkpoints/last`` with everything exact resumption needs) and finish (``results.json``,
``curves.png``). Any of timm's optimizers (AdamW by default; no weight decay on biases and normalisation weights)
and schedules (linear warmup and cosine decay by default; :mod:`hiercls.train.optim`), an EMA of the weights,
gradient accumulation, autocast (bf16 on CUDA by default, fp16 with a gradient scaler on request), gradient
clipping, ``torch.compile``, channels-last and DDP under ``torchrun``.

Files in ``<out_dir>``: ``config.yaml`` (the resolved config), ``metrics.jsonl`` (one JSON record per log step /
evaluation; ``run.loggers`` adds TensorBoard, W&B or MLflow, :mod:`hiercls.train.loggers`),
``checkpoints/{best,last}/`` (loadable with ``HierarchicalClassifier.from_pretrained``; ``last`` also ``resume.pt``
until the run finishes), ``.lock``, ``results.json`` and ``curves.png``.

DDP equivalence: every rank gets ``data.batch_size / world_size`` samples of each global batch (the data
sampler cuts the same global order for any world size), and each micro-batch loss is weighted by its share
of the optimizer step's *global* sample count, so the gradient is the mean over the global batch exactly as
in one process (DDP's averaging over ranks is compensated), uneven last batches included. A step costs one
all-reduce of ``[samples, loss sum, non-finite losses]`` and one host sync, after its last backward.

Example:
    >>> import tempfile
    >>> from hiercls.train.config import config_from_dict
    >>> cfg = config_from_dict({"taxonomy": None, "model": {"backbone": "conv3d:4", "head": "nested_sigmoid"},
    ...     "data": {"dataset": "nested_blobs_3d", "options": {"num_samples": 4, "size": 8}, "batch_size": 2},
    ...     "schedule": {"max_steps": 1}, "run": {"out_dir": tempfile.mkdtemp(), "progress": False,
    ...     "plot": False}})  # doctest: +SKIP
    >>> train(cfg)["step"]  # doctest: +SKIP
    1
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from hiercls.data import build_dataset, dataset_taxonomy, image_transform, make_loader, subsample
from hiercls.decode import parse_decoder
from hiercls.evaluation.calibration import calibrate_outputs
from hiercls.evaluation.model import evaluate_model
from hiercls.models import HierarchicalClassifier, create_model, move_to_device
from hiercls.models.inference import resolve_model_dir
from hiercls.taxonomy import Taxonomy, load_taxonomy
from hiercls.train.checkpoint import RunFolder, TrainState, rng_state, seed_everything, set_rng_state
from hiercls.train.config import ConfigError, TrainConfig, config_from_dict
from hiercls.train.distributed import (
    DistInfo,
    all_reduce_sum,
    cleanup_distributed,
    eval_loader,
    init_distributed,
    rank_local_layers,
)
from hiercls.train.loggers import check_loggers, open_loggers
from hiercls.train.optim import build_ema, build_optimizer, build_scheduler, check_optimizer, cosine_schedule
from hiercls.train.plots import plot_run
from hiercls.train.targets import build_soft_targets

logger = logging.getLogger(__name__)

__all__ = [
    "StopTraining",
    "TrainingDiverged",
    "build_model",
    "build_optimizer",
    "cosine_schedule",
    "evaluate_model",
    "train",
    "unused_parameters",
]


class StopTraining(Exception):
    """Raise from a callback to stop training after the current step (a resumable checkpoint is written)."""


class TrainingDiverged(ConfigError):
    """The loss (or the weights) became NaN or infinite; the message names the step, the loss and the lr.

    Raised before the bad step reaches the weights; the last checkpoint written stays as it was. A
    :class:`~hiercls.train.config.ConfigError` because the cure is a config change (a lower ``optim.lr``).
    """


# ------------------------------------------------------------------------------------------- building blocks
def build_model(cfg: TrainConfig, taxonomy: Taxonomy) -> HierarchicalClassifier:
    """The model of ``cfg.model`` for ``taxonomy``: :func:`hiercls.models.create_model` of its fields."""
    if not cfg.model.backbone:
        raise ConfigError("model.backbone: required, e.g. 'timm:efficientnet_lite0', 'hf:minilm' or 'conv3d:16'")
    return create_model(
        cfg.model.backbone,
        taxonomy,
        head=cfg.model.head,
        weights=cfg.model.weights,
        head_options=dict(cfg.model.head_options),
        **cfg.model.backbone_options,
    )


def _num_samples(targets: Any) -> int:
    """Samples a micro-batch's mean loss averages over (1-D targets and soft leaf targets: the non-ignored ones)."""
    if isinstance(targets, torch.Tensor):
        if targets.dim() == 1 and not targets.dtype.is_floating_point:
            return int((targets != -1).sum())
        if targets.dim() == 2 and targets.dtype.is_floating_point:  # a row with a negative entry is ignored
            return int((targets >= 0).all(1).sum())
        return int(targets.shape[0])
    return len(targets)


def unused_parameters(model: nn.Module, batch: Any, device: torch.device) -> list[str]:
    """Names of the trainable parameters that get no gradient from ``model.loss`` on ``batch`` (a dry step).

    The random streams, the buffers (batch-norm statistics) and the gradients are put back as they were, so the
    run that follows is the run that would have followed without the check.

    Example:
        >>> class Half(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.used, self.spare = nn.Linear(2, 1), nn.Linear(2, 1)
        ...     def forward(self, x):
        ...         return self.used(x)
        ...     def loss(self, out, y):
        ...         return (out.squeeze(1) - y).pow(2).mean()
        >>> unused_parameters(Half(), (torch.zeros(3, 2), torch.zeros(3)), torch.device("cpu"))
        ['spare.weight', 'spare.bias']
    """
    # Sparse buffers are index tables no forward changes; dense ones (running statistics) may change.
    buffers = [(b, b.detach().clone()) for b in model.buffers() if b.layout == torch.strided]
    rngs = rng_state()
    grads = {p: p.grad for p in model.parameters()}
    for p in grads:
        p.grad = None
    try:
        inputs, targets = move_to_device(batch[0], device), move_to_device(batch[1], device)
        model.loss(model(inputs), targets).backward()
        return [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    finally:
        for p, g in grads.items():
            p.grad = g
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        set_rng_state(rngs)


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError("run.precision: fp16 needs a CUDA device (on CPU use bf16 or fp32)")
    return torch.float16 if precision == "fp16" else torch.bfloat16


def _best_metric_key(cfg: TrainConfig, results: dict[str, Any]) -> str:
    if cfg.eval.best_metric:
        if cfg.eval.best_metric not in results:
            scalar = sorted(k for k, v in results.items() if isinstance(v, (int, float)))
            raise ConfigError(
                f"eval.best_metric: {cfg.eval.best_metric!r} is not among the evaluation results; "
                f"valid: {', '.join(scalar)}"
            )
        return cfg.eval.best_metric
    first = parse_decoder(cfg.eval.decoders[0])
    for key in (first.judged_on, "hF1_micro", "hF1_samples", "accuracy", "mean_dice"):
        if f"{first.label}/{key}" in results:
            return f"{first.label}/{key}"
    return "eval_loss"


# ------------------------------------------------------------------------------------------------ the loop
def train(
    config: TrainConfig | dict[str, Any], *, callbacks: Iterable[Callable[[dict[str, Any]], None]] = ()
) -> dict[str, Any]:
    """Train the model described by ``config``; returns the final evaluation metrics and run facts.

    Args:
        config: a :class:`TrainConfig` (or a nested dict of its fields).
        callbacks: called after every optimizer step with ``{"step", "epoch", "loss", "lr"}``; raising
            :class:`StopTraining` stops after that step with a resumable checkpoint (as a kill would,
            but cleanly).

    Returns:
        ``{"step", "epoch", "out_dir", "interrupted", "train_loss", "<decoder>/<metric>": ...}``.

    Raises:
        ConfigError: an invalid or incomplete config (missing backbone/data set, bad resume state...).
    """
    cfg = config if isinstance(config, TrainConfig) else config_from_dict(config)
    info = init_distributed(cfg.run.device)
    try:
        return _Run(cfg, info, list(callbacks)).run()
    finally:
        cleanup_distributed(info)


class _Run:
    """One training run; :meth:`run` reads top to bottom. What changes while training lives in ``self.state``."""

    def __init__(self, cfg: TrainConfig, info: DistInfo, callbacks: list[Callable[[dict[str, Any]], None]]) -> None:
        if not cfg.data.dataset:
            raise ConfigError("data.dataset: required, e.g. wordnet_gloss, fashion_mnist, image_folder, synthetic")
        if cfg.data.batch_size % info.world_size:
            raise ConfigError(
                f"data.batch_size: the global batch {cfg.data.batch_size} must be divisible by the "
                f"{info.world_size} processes"
            )
        check_optimizer(cfg)  # an optimizer that cannot train or resume exactly is refused before the folder is used
        self.cfg, self.info, self.callbacks = cfg, info, callbacks
        self.device, self.main = info.device, info.is_main
        self.amp_dtype = _autocast_dtype(cfg.run.precision, self.device)
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)

    def run(self) -> dict[str, Any]:
        """Train (or resume) to the end or to an interruption; returns the final results."""
        with RunFolder.open(self.cfg, self.info) as self.folder:
            if self.folder.results is not None:
                return self.folder.results  # a finished run started again: its saved results, untouched
            if self.main:
                check_loggers(self.cfg.run.loggers)  # a missing package is refused before anything is built
            self.build()
            self.folder.claim()
            resuming = self.folder.resuming  # restore() settles it
            if resuming:
                self.folder.restore(self.state)
            else:
                seed_everything(self.cfg.run.seed + self.info.rank)  # per-rank random streams
            self.ddp = self.wrap_ddp(self.state.model)
            self.train_model = torch.compile(self.ddp) if self.cfg.model.compile else self.ddp
            resumed = self.state.step if resuming else None
            loggers = open_loggers(self.cfg, self.folder.path, resume_step=resumed) if self.main else None
            with loggers or contextlib.nullcontext() as self.log_sink:
                results, interrupted = self.fit()
            return self.finish(results, interrupted)

    # ------------------------------------------------------------------ build
    def build(self) -> None:
        """Taxonomy, model, data loaders, optimizer, scheduler, scaler (the same init on every rank)."""
        cfg = self.cfg
        seed_everything(cfg.run.seed)
        taxonomy = self.build_taxonomy()
        model = build_model(cfg, taxonomy).to(self.device)
        if cfg.model.channels_last:
            model = model.to(memory_format=torch.channels_last)
        loader = self.build_loaders(model, taxonomy)
        self.decoders = [parse_decoder(d) for d in cfg.eval.decoders]
        per_epoch = math.ceil(len(loader) / cfg.optim.grad_accum)
        self.total_steps = total = cfg.schedule.max_steps or cfg.schedule.epochs * per_epoch
        optimizer = build_optimizer(model, cfg)
        scheduler = build_scheduler(optimizer, cfg, total_steps=total, steps_per_epoch=per_epoch)
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        self.state = TrainState(model, optimizer, scheduler, scaler, loader, taxonomy, ema=build_ema(model, cfg))
        self.soft_targets = build_soft_targets(cfg.data.mixup, taxonomy, cfg.model.head)
        self.teacher = self.build_teacher(taxonomy)

    def build_teacher(self, taxonomy: Taxonomy) -> HierarchicalClassifier | None:
        """``model.teacher``: a frozen semantic-softmax model over the run's taxonomy (eval mode, not in the
        optimizer, DDP or checkpoints; reloaded from its path on resume), or ``None``."""
        t = self.cfg.model.teacher
        if t.path is None:
            return None
        where = f"model.teacher.path: {t.path!r}"
        if self.cfg.model.head != "semantic_softmax":
            raise ConfigError(f"{where}: distillation needs model.head semantic_softmax, got {self.cfg.model.head!r}")
        try:
            folder, _ = resolve_model_dir(t.path)
        except FileNotFoundError as err:
            raise ConfigError(f"{where}: expected a hiercls run, study or model folder ({err})") from None
        teacher = HierarchicalClassifier.from_pretrained(folder, map_location=self.device).eval()
        if teacher.head_name != "semantic_softmax":
            raise ConfigError(f"{where}: the teacher's head must be semantic_softmax, got {teacher.head_name!r}")
        if teacher.taxonomy.fingerprint != taxonomy.fingerprint:
            raise ConfigError(
                f"{where}: the teacher's taxonomy {teacher.taxonomy.name!r} (fingerprint "
                f"{teacher.taxonomy.fingerprint[:16]}) is not the run's {taxonomy.name!r} ({taxonomy.fingerprint[:16]})"
            )
        teacher.requires_grad_(False)
        saved = json.loads((folder / "config.json").read_text(encoding="utf-8"))  # from_pretrained verified it
        self.state.teacher_sha256 = saved.get("weights_sha256")
        return teacher

    def step_loss(self, inputs: Any, targets: Any) -> torch.Tensor:
        """The head's loss on the student's output, plus ``model.teacher``'s distillation term (same inputs)."""
        model, output = self.state.model, self.train_model(inputs)
        loss = model.loss(output, targets)
        if self.teacher is None:
            return loss
        t = self.cfg.model.teacher
        with torch.no_grad():
            teacher_output = self.teacher(inputs)
        return loss + t.weight * model.head.distillation_loss(output, teacher_output, distance=t.distance)

    def build_taxonomy(self) -> Taxonomy:
        """The recipe's taxonomy, else the data set's (a shipped one, or one it brings, e.g. nested folders)."""
        cfg = self.cfg
        if cfg.taxonomy is not None:
            return load_taxonomy(cfg.taxonomy, **cfg.taxonomy_options)
        taxonomy = dataset_taxonomy(cfg.data.dataset)
        if taxonomy is None:
            probe = build_dataset(cfg.data.dataset, cfg.data.train_split, None, cfg.data.options)
            taxonomy = getattr(probe, "taxonomy", None)
        if taxonomy is None:
            raise ConfigError(f"taxonomy: required for data set {cfg.data.dataset!r} (a shipped name or a file)")
        return taxonomy

    def build_loaders(self, model: HierarchicalClassifier, taxonomy: Taxonomy) -> Any:
        """This rank's training loader (returned) and evaluation loader (``self.eval_loader``, or ``None``)."""
        cfg, data, info = self.cfg, self.cfg.data, self.info

        def dataset(split: str, train: bool, limit: int | None) -> Any:
            transform = image_transform(model, train=train, image_size=data.image_size, augment=data.augment)
            return subsample(build_dataset(data.dataset, split, taxonomy, data.options, transform), limit)

        train_set = dataset(data.train_split, True, data.max_train_samples)
        collate = getattr(model, "collate", None)
        # A batch for the dry step of find_unused_parameters=auto (read lazily: only DDP runs need it).
        first = range(min(2, len(train_set)))
        self.probe = lambda: (collate or torch.utils.data.default_collate)([train_set[i] for i in first])
        loader = make_loader(
            train_set,
            data.batch_size // info.world_size,
            shuffle=data.shuffle,
            seed=cfg.run.seed,
            rank=info.rank,
            world_size=info.world_size,
            collate_fn=collate,
            drop_last=data.drop_last,
            num_workers=data.num_workers,
            pin_memory=self.device.type == "cuda",
            persistent_workers=data.num_workers > 0,
        )
        if len(loader) == 0:
            raise ConfigError(
                f"data.batch_size: {len(train_set)} training samples give no batch of {data.batch_size} "
                f"(drop_last={data.drop_last})"
            )
        self.eval_loader = None
        if data.eval_split:
            eval_set = dataset(data.eval_split, False, data.max_eval_samples)
            size = data.eval_batch_size or data.batch_size
            self.eval_loader = eval_loader(eval_set, size, info, collate, data.num_workers)
        return loader

    def wrap_ddp(self, model: nn.Module) -> nn.Module:
        """``model`` itself in one process; under torchrun a ``DistributedDataParallel`` of it."""
        if not self.info.distributed:
            return model
        local = rank_local_layers(model)
        if local and self.main:
            logger.warning("DDP: the model has %s; the result differs from one process's by more than rounding", local)
        # Sparse index tables (tree operators) are the same on every rank and DDP cannot broadcast them.
        sparse = [n for n, b in model.named_buffers() if b.layout != torch.strided]
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, sparse)
        find_unused = self.cfg.run.find_unused_parameters
        if find_unused == "auto":
            # Every rank decides on its own batch; the sum makes the decision the same everywhere.
            unused = unused_parameters(model, self.probe(), self.device)
            find_unused = bool(all_reduce_sum(torch.tensor([float(len(unused))], device=self.device))[0])
            if self.main and find_unused:
                logger.info("DDP: find_unused_parameters on (no gradient for %s)", ", ".join(unused[:5]))
        return nn.parallel.DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=find_unused,
        )

    # ------------------------------------------------------------------ fit
    def fit(self) -> tuple[dict[str, Any], bool]:
        """The epochs: optimizer steps, evaluation at the end of (every ``eval.every``-th) epoch, checkpoints.

        Returns:
            ``(last evaluation results, interrupted)``.
        """
        cfg, s = self.cfg, self.state
        s.model.train()
        self.steps_this_run, interrupted, results = 0, False, {}
        show = self.main and cfg.run.progress
        # disable=None: the bar only on a terminal, never written into a redirected log.
        bar_off = None if show else True
        self.bar = tqdm(total=self.total_steps, initial=s.step, desc="train", disable=bar_off, dynamic_ncols=True)
        self.log_acc = [0.0, 0]
        self.t_log, self.samples_since_log = time.perf_counter(), 0
        if s.step >= self.total_steps and self.eval_loader is not None:
            # Killed after its last checkpoint but before results.json: evaluate that checkpoint again.
            results = self.evaluate()
        while s.step < self.total_steps and not interrupted:
            epoch_done, interrupted = self.train_epoch()
            if interrupted:
                break
            # End of the epoch (or of training): evaluate, then save the resumable state.
            last = s.step >= self.total_steps
            if (epoch_done or last) and (last or (cfg.eval.every and (s.epoch + 1) % cfg.eval.every == 0)):
                results = self.evaluate()
            if epoch_done:
                s.epoch += 1
                s.at_epoch_start = True
            self.save_last()
        if not interrupted and self.eval_loader is None and s.ema is not None and cfg.model.ema.best_on == "ema":
            s.best_step = s.step  # no evaluation picks a best: the final EMA weights are the run's model
            self.folder.save_best(s.ema.module, {})
        self.bar.close()
        return results, interrupted

    def train_epoch(self) -> tuple[bool, bool]:
        """Optimizer steps over (the rest of) this epoch; returns ``(epoch done, interrupted)``."""
        cfg, s = self.cfg, self.state
        s.loader.set_epoch(s.epoch)
        remaining, consumed = len(s.loader), 0
        batches = iter(s.loader)
        s.at_epoch_start = False
        while s.step < self.total_steps:
            # One optimizer step = up to `grad_accum` micro-batches; fetched first to know the global sample count.
            window = [b for _, b in zip(range(cfg.optim.grad_accum), batches, strict=False)]
            if not window:
                break
            consumed += len(window)
            step_loss, global_n = self.train_step(window)
            s.step += 1
            if s.ema is not None:  # the same update on every rank: the weights are the same after the step
                s.ema.update(s.model, step=s.step)
            self.steps_this_run += 1
            lr = self.scheduler_lr()
            self.log_train(step_loss, global_n, lr)
            stop = self.call_back(step_loss, lr)
            if stop or (cfg.run.save_every_steps and s.step % cfg.run.save_every_steps == 0):
                self.save_last()
            if stop:
                return consumed >= remaining, True
        return consumed >= remaining, False

    def call_back(self, step_loss: float, lr: float) -> bool:
        """Run the callbacks; whether to stop here (a callback raised :class:`StopTraining`, or
        ``schedule.max_steps_this_run`` is reached before the end)."""
        s, stop = self.state, False
        for cb in self.callbacks:
            try:
                cb({"step": s.step, "epoch": s.epoch, "loss": step_loss, "lr": lr})
            except StopTraining:
                stop = True
        limit = self.cfg.schedule.max_steps_this_run
        return stop or (limit is not None and self.steps_this_run >= limit and s.step < self.total_steps)

    def train_step(self, window: list[Any]) -> tuple[float, float]:
        """One optimizer step over the micro-batches of ``window``; returns ``(mean loss, global sample count)``.

        Each micro-batch loss is weighted by its sample count over the full global step's (times the world
        size, undoing DDP's mean); a shorter step (an epoch's end, ignored labels) has its gradient rescaled by
        full / actual count once the step's one all-reduce has counted it, so the gradient is the mean over the
        step's global samples as in one process.
        """
        cfg, info, s, device, amp_dtype = self.cfg, self.info, self.state, self.device, self.amp_dtype
        full = cfg.data.batch_size * cfg.optim.grad_accum
        acc = torch.zeros(3, dtype=torch.float64, device=device)  # samples, loss * samples, non-finite losses
        for i, (loaded_inputs, loaded_targets) in enumerate(window):
            inputs, targets = self.prepare_batch(loaded_inputs, loaded_targets)  # data.mixup: mixed, soft targets
            n = _num_samples(targets)  # on the host copy: no device sync
            inputs, targets = self.to_device(inputs), move_to_device(targets, device)
            sync = i == len(window) - 1 or not info.distributed
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                    loss = self.step_loss(inputs, targets)
                weight = n * info.world_size / full
                scaled = loss * weight if n > 0 else sum(p.sum() for p in s.model.parameters()) * 0.0
                s.scaler.scale(scaled).backward()
            if n > 0:
                value = loss.detach().double()
                acc[0] += n  # a scalar operand: no host-to-device copy
                acc[1] += value * n
                acc[2] += (~torch.isfinite(value)).double()
        # The step's one all-reduce and host sync: every rank must agree before one of them stops.
        global_n, loss_sum, bad = all_reduce_sum(acc).tolist()
        step_loss = loss_sum / global_n if global_n > 0 else 0.0
        if bad:
            s.optimizer.zero_grad(set_to_none=True)
            self.diverged(step_loss)
        if 0 < global_n != full:
            for p in s.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(full / global_n)
        if cfg.optim.clip_grad_norm is not None:
            s.scaler.unscale_(s.optimizer)
            torch.nn.utils.clip_grad_norm_(s.model.parameters(), cfg.optim.clip_grad_norm)
        s.scaler.step(s.optimizer)
        s.scaler.update()
        s.optimizer.zero_grad(set_to_none=True)
        s.scheduler.step()
        return step_loss, global_n

    def prepare_batch(self, inputs: Any, targets: Any) -> tuple[Any, Any]:
        """The micro-batch as loaded, or with ``data.mixup`` on, its inputs mixed on the device and its soft leaf
        targets ``[B, num_leaves]`` (built on the host: counting their samples needs no device sync)."""
        if self.soft_targets is None:
            return inputs, targets
        return self.soft_targets(move_to_device(inputs, self.device), targets)

    def to_device(self, inputs: Any) -> Any:
        """``inputs`` on the run's device; image batches channels-last with ``model.channels_last``."""
        inputs = move_to_device(inputs, self.device)
        if self.cfg.model.channels_last and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return inputs

    def scheduler_lr(self) -> float:
        return self.state.scheduler.get_last_lr()[0]

    def diverged(self, loss: float | None, *, weights: bool = False) -> None:
        """Stop at the first non-finite loss (or weights) before it reaches the weights or a checkpoint."""
        step, lr, saved = self.state.step, self.scheduler_lr(), self.folder.saved_step
        if weights:
            what = f"step {step}: the weights are no longer finite after this step (lr {lr:.3g})"
        else:
            what = f"step {step + 1}: the training loss is {loss} at lr {lr:.3g}"
        last = self.folder.path / "checkpoints" / "last"
        kept = "no checkpoint had been written yet"
        if saved is not None:
            kept = f"the last good checkpoint {last} (step {saved}) is kept"
        raise TrainingDiverged(
            f"{what}: training diverged; {kept}. Lower optim.lr (or set optim.clip_grad_norm / "
            "optim.warmup_steps) and start over with --set run.resume=false"
        )

    def log_train(self, step_loss: float, global_n: float, lr: float) -> None:
        """Accumulate the step's loss; every ``run.log_every`` steps log the mean over steps (of global means)."""
        s = self.state
        self.samples_since_log += int(global_n)
        self.log_acc = [self.log_acc[0] + step_loss, self.log_acc[1] + 1]
        self.bar.update(1)
        if s.step % self.cfg.run.log_every and s.step != self.total_steps:
            return
        s.train_loss = mean_loss = self.log_acc[0] / self.log_acc[1]
        elapsed = time.perf_counter() - self.t_log
        speed = self.samples_since_log / elapsed if elapsed > 0 else None
        self.log(
            {"type": "train", "step": s.step, "epoch": s.epoch, "loss": mean_loss, "lr": lr, "samples_per_s": speed}
        )
        self.bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}")
        self.log_acc = [0.0, 0]
        self.t_log, self.samples_since_log = time.perf_counter(), 0

    def log(self, record: dict[str, Any]) -> None:
        """The record to every logger of ``run.loggers`` (rank 0; ``metrics.jsonl`` by default)."""
        if self.log_sink is not None:
            self.log_sink(record)

    # ------------------------------------------------------------------ evaluate and checkpoint
    def evaluate(self) -> dict[str, Any]:
        """Evaluate, keep ``checkpoints/best`` on the best metric, log; optionally save the probabilities.

        With an EMA, the run's model (evaluated, calibrated, kept as ``best``) is the EMA's weights when
        ``model.ema.best_on`` is ``ema``, and the other weights' scalar metrics are logged beside its under
        ``raw/`` or ``ema/`` (with ``model.ema.eval``).
        """
        cfg, s = self.cfg, self.state
        if self.eval_loader is None:
            return {}
        on_ema = s.ema is not None and cfg.model.ema.best_on == "ema"
        run_model = s.ema.module if on_ema else s.model
        results = self.evaluate_weights(run_model)
        if s.ema is not None and cfg.model.ema.eval:
            other, prefix = (s.model, "raw") if on_ema else (s.ema.module, "ema")
            scores, _, _ = evaluate_model(
                other, self.eval_loader, s.taxonomy, self.decoders, device=self.device, amp_dtype=self.amp_dtype
            )
            results.update({f"{prefix}/{k}": v for k, v in scores.items() if isinstance(v, (int, float))})
        s.best_key = key = s.best_key or _best_metric_key(cfg, results)
        value = results.get(key)
        if isinstance(value, (int, float)) and (
            s.best_value is None or (value > s.best_value if cfg.eval.best_mode == "max" else value < s.best_value)
        ):
            s.best_value, s.best_step = float(value), s.step
            self.folder.save_best(run_model, results)
        self.log(
            {"type": "eval", "step": s.step, "epoch": s.epoch, **results, "best_key": key, "best_value": s.best_value}
        )
        shown = ("accuracy", "hF1_micro", "mean_dice", "eval_loss", key.rsplit("/", 1)[-1])
        summary = [f"{k}={v:.4f}" for k, v in results.items() if isinstance(v, float) and k.rsplit("/", 1)[-1] in shown]
        logger.info("eval after step %d: %s", s.step, ", ".join(summary))
        return results

    def evaluate_weights(self, model: HierarchicalClassifier) -> dict[str, Any]:
        """``model``'s metrics under every decoder (calibrated and saved as ``eval.calibrate`` / ``save_probs`` ask)."""
        cfg, s = self.cfg, self.state
        collected: list[tuple[torch.Tensor, torch.Tensor]] | None = [] if cfg.eval.calibrate else None
        if collected is not None:
            model.temperature = 1.0  # the raw probabilities first; the fit below sets the new temperature
        results, probs, labels = evaluate_model(
            model,
            self.eval_loader,
            s.taxonomy,
            self.decoders,
            device=self.device,
            amp_dtype=self.amp_dtype,
            progress=self.main and cfg.run.progress,
            keep_probs=cfg.eval.save_probs,
            collect=collected,
        )
        if collected is not None:
            results.update(calibrate_outputs(model, collected, s.taxonomy, self.decoders, n_bins=cfg.eval.ece_bins))
        if cfg.eval.save_probs:
            self.folder.save_probs(probs, labels, s.taxonomy.num_nodes)
        return results

    def save_last(self) -> None:
        """``checkpoints/last`` (see :meth:`RunFolder.save_last`), never of weights that are no longer finite."""
        if not all(bool(torch.isfinite(p).all()) for p in self.state.model.parameters()):
            self.diverged(None, weights=True)
        self.folder.save_last(self.state)

    def finish(self, results: dict[str, Any], interrupted: bool) -> dict[str, Any]:
        """The final results; a finished run also writes ``results.json`` and ``curves.png``.

        The metrics reported are those of ``checkpoints/best`` (what ``hiercls evaluate --model`` and ``predict``
        load), read back from its evaluation record when an earlier step was the best; the last evaluation's
        are kept under ``"last"``.
        """
        s, reported_step = self.state, self.state.step
        best = self.folder.evaluation_at(s.best_step) if results and s.best_step not in (None, s.step) else None
        if best is not None:
            results = {**best, "last": {k: v for k, v in results.items() if "/" in k}}
            reported_step = s.best_step
        final = {
            "step": s.step,
            "epoch": s.epoch,
            "out_dir": str(self.folder.path),
            "interrupted": interrupted,
            "train_loss": s.train_loss,
            "taxonomy": s.taxonomy.name,
            "head": self.cfg.model.head,
            "best_key": s.best_key,
            "best_value": s.best_value,
            "reported_step": reported_step,
            **results,
            "best_step": s.best_step,
        }
        if self.main and not interrupted and self.cfg.run.plot:
            try:
                plot_run(self.folder.path / "metrics.jsonl", self.folder.path / "curves.png")
            except Exception as err:  # a plotting problem must not lose a finished run
                logger.warning("could not write %s: %s", self.folder.path / "curves.png", err)
        return self.folder.finish(final, interrupted)
