"""The training loop: ``train(config) -> final metrics``.

:func:`train` runs one ``_Run``, whose methods read top to bottom (prepare the run folder, build, resume or
start, fit = epochs of train steps, evaluate, checkpoint, finish): AdamW (no weight decay on biases and
normalisation weights) with linear warmup and cosine decay, gradient accumulation, autocast (bf16 on CUDA by
default, fp16 with a gradient scaler on request), gradient clipping, evaluation with hierarchical metrics under every
configured decoder, ``best`` / ``last`` checkpoints, exact resume (model, optimizer, scheduler, scaler, RNG of
every rank, data position, step, best metric) and DDP under ``torchrun``.

Files in ``<out_dir>``:

* ``config.yaml`` — the resolved config; ``metrics.jsonl`` — one JSON record per log step / evaluation;
* ``checkpoints/last/`` and ``checkpoints/best/`` — ``model.safetensors`` + ``config.json`` (loadable with
  ``HierarchicalClassifier.from_pretrained``; ``last`` hard-links ``best``'s files when they are the same step),
  ``last`` also ``resume.pt`` until the run finishes;
* ``.lock`` — held by the training that uses the folder (``hiercls.train.runfolder``, docs/reliability.md);
* ``results.json`` — the final metrics; ``curves.png`` — loss curve and per-level accuracy.

DDP equivalence: every rank gets ``data.batch_size / world_size`` samples of each global batch (the data
sampler cuts the same global order for any world size), and each micro-batch loss is weighted by its share
of the optimizer step's *global* sample count, so the gradient is the mean over the global batch exactly as
in one process (DDP's averaging over ranks is compensated), uneven last batches included.

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
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from safetensors.torch import load_model
from torch import nn
from tqdm.auto import tqdm

from hiercls.data import build_dataset, dataset_taxonomy, image_transform, make_loader, subsample
from hiercls.decode import parse_decoder
from hiercls.evaluation.calibration import calibrate_outputs
from hiercls.evaluation.model import evaluate_model
from hiercls.models import HierarchicalClassifier, create_model, move_to_device
from hiercls.models.classifier import verify_model_files
from hiercls.models.files import CheckpointError, folder_size, read_json_file, writing
from hiercls.taxonomy import Taxonomy, load_taxonomy
from hiercls.train.config import ConfigError, TrainConfig, config_from_dict, config_to_dict, save_config
from hiercls.train.distributed import (
    DistInfo,
    all_gather_object,
    all_reduce_sum,
    barrier,
    cleanup_distributed,
    eval_loader,
    init_distributed,
)
from hiercls.train.plots import plot_run, read_log
from hiercls.train.runfolder import (
    RunLock,
    check_out_dir,
    clear_previous_run,
    recover_checkpoints,
    save_dir_atomically,
)

logger = logging.getLogger(__name__)

__all__ = [
    "StopTraining",
    "TrainingDiverged",
    "build_model",
    "build_optimizer",
    "cosine_schedule",
    "evaluate_model",
    "load_taxonomy_for",
    "train",
]

#: Config keys that may differ between a run and its resumption (they do not change the result).
RESUME_FREE_KEYS = frozenset(
    {
        "run.resume",
        "run.out_dir",
        "run.keep_resume_state",
        "run.progress",
        "run.plot",
        "run.log_every",
        "run.threads",
        "run.save_every_steps",
        "run.device",
        "schedule.max_steps_this_run",
        "data.num_workers",
        "eval.save_probs",
        "description",
        "compare_heads",
    }
)


class StopTraining(Exception):
    """Raise from a callback to stop training after the current step (a resumable checkpoint is written)."""


class TrainingDiverged(ConfigError):
    """The loss (or the weights) became NaN or infinite; the message names the step, the loss and the lr.

    Raised before the bad step reaches the weights; the last checkpoint written stays as it was. A
    :class:`~hiercls.train.config.ConfigError` because the cure is a config change (a lower ``optim.lr``).
    """


# ------------------------------------------------------------------------------------------- building blocks
def load_taxonomy_for(cfg: TrainConfig) -> Taxonomy | None:
    """The taxonomy named by ``cfg.taxonomy`` (a shipped name or a file), or ``None`` when unset.

    Raises:
        TaxonomyError / FileNotFoundError: unknown name or unreadable file (with the list of shipped names).
    """
    if cfg.taxonomy is None:
        return None
    return load_taxonomy(cfg.taxonomy, **cfg.taxonomy_options)


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


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices/kernels only (not on 1-D tensors: biases, norms); ``head_lr`` for ``head.*``.

    Example:
        >>> from hiercls.train.config import TrainConfig
        >>> opt = build_optimizer(nn.Sequential(nn.Linear(2, 2)), TrainConfig())
        >>> [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups]
        [(1, 0.01), (1, 0.0)]
    """
    head_lr = cfg.optim.head_lr if cfg.optim.head_lr is not None else cfg.optim.lr
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            groups.setdefault((name.startswith("head.") and head_lr != cfg.optim.lr, p.dim() >= 2), []).append(p)
    param_groups = []
    for is_head in (False, True):
        for decay in (True, False):
            params = groups.get((is_head, decay))
            if params:
                param_groups.append(
                    {
                        "params": params,
                        "weight_decay": cfg.optim.weight_decay if decay else 0.0,
                        "lr": head_lr if is_head else cfg.optim.lr,
                    }
                )
    return torch.optim.AdamW(param_groups, lr=cfg.optim.lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps)


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


def _num_samples(targets: Any) -> int:
    """Samples a micro-batch's mean loss averages over (1-D targets: the non-ignored ones)."""
    if isinstance(targets, torch.Tensor):
        if targets.dim() == 1 and not targets.dtype.is_floating_point:
            return int((targets != -1).sum())
        return int(targets.shape[0])
    return len(targets)


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "fp32":
        return None
    if precision == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return None
    if precision == "fp16":
        if device.type != "cuda":
            raise ConfigError("run.precision: fp16 needs a CUDA device (on CPU use bf16 or fp32)")
        return torch.float16
    return torch.bfloat16


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _rng_state() -> dict[str, Any]:
    """Every RNG's state as tensors and plain values, so that ``resume.pt`` loads with ``weights_only=True``."""
    version, mt, gauss = random.getstate()
    key, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": int(version), "state": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "key": str(key),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    np.random.set_state(
        (npy["key"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# -------------------------------------------------------------------------------------------- checkpoints
#: Keys every ``resume.pt`` holds (written by :meth:`_Run.save_last`).
_RESUME_KEYS = ("optimizer", "scheduler", "scaler", "data", "step", "rng")


def _read_resume_state(path: Path) -> dict[str, Any]:
    """``resume.pt`` read with ``weights_only=True``: tensors and plain values only, never code from the file.

    Raises:
        CheckpointError: unreadable, not a resume state, or written by a hiercls that pickled NumPy objects.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling errors come in many types; all mean "not a state we can trust"
        text = str(err).strip()
        if "Weights only load failed" in text:
            # torch's message goes on to explain how to load it unsafely; name only what was refused.
            detail = next((x.strip() for x in text.splitlines() if "WeightsUnpickler error" in x), "")
            why = "it holds Python objects, not only tensors and plain values, and loading them could run code"
            why += f"; {detail.split(':', 1)[-1].strip()[:200]}" if detail else ""
        else:
            why = text.splitlines()[0][:200] if text else type(err).__name__
        raise CheckpointError(
            f"{path}: not a resume state hiercls can read safely ({why}); it is corrupt or was written by "
            "another program or an older hiercls. Start over with --set run.resume=false (the weights in "
            "model.safetensors next to it stay loadable with from_pretrained)"
        ) from None
    missing = [k for k in _RESUME_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(
            f"{path}: not a hiercls resume state (missing {', '.join(missing)}); start over with --set run.resume=false"
        )
    return state


def _checkpoint_dir(out_dir: Path, which: str) -> Path | None:
    """``checkpoints/<which>``, or its ``.old`` copy when a kill hit between the two renames."""
    d = out_dir / "checkpoints" / which
    if d.is_dir():
        return d
    old = d.with_name(which + ".old")
    return old if old.is_dir() else None


def _load_model_weights(model: nn.Module, ckpt: Path) -> None:
    """The checkpoint's verified weights (hash and identity, as ``from_pretrained``) into ``model``."""
    path = ckpt / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(ckpt)!r} has no model.safetensors; start over with run.resume=false")
    if (ckpt / "config.json").is_file():
        verify_model_files(ckpt, read_json_file(ckpt / "config.json", "checkpoint's config"))
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except Exception as err:  # SafetensorError carries no file name
        if type(err).__name__ != "SafetensorError":
            raise
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
    # Non-persistent buffers are rebuilt from the taxonomy; anything else missing is an error.
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {str(path)!r} does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )


def _config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    diffs = []
    for key in sorted(set(saved) | set(current)):
        dotted = f"{prefix}{key}"
        a, b = saved.get(key), current.get(key)
        if (
            isinstance(a, dict)
            and isinstance(b, dict)
            and key not in ("head_options", "options", "backbone_options", "taxonomy_options")
        ):
            diffs += _config_differences(a, b, f"{dotted}.")
        elif a != b and dotted not in RESUME_FREE_KEYS:
            diffs.append(f"{dotted}: {a!r} (saved) vs {b!r} (now)")
    return diffs


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
    """One training run, in reading order: :meth:`run` = prepare the folder, build, resume or start, fit, finish.

    The state that changes while training (step, epoch, best metric) lives on the object, so the steps are
    plain methods instead of closures.
    """

    def __init__(self, cfg: TrainConfig, info: DistInfo, callbacks: list[Callable[[dict[str, Any]], None]]) -> None:
        if not cfg.data.dataset:
            raise ConfigError("data.dataset: required, e.g. wordnet_gloss, fashion_mnist, image_folder, synthetic")
        self.cfg, self.info, self.callbacks = cfg, info, callbacks
        self.out_dir, self.device, self.main = cfg.out_dir, info.device, info.is_main
        if cfg.run.threads:
            torch.set_num_threads(cfg.run.threads)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.amp_dtype = _autocast_dtype(cfg.run.precision, self.device)
        if cfg.data.batch_size % info.world_size:
            raise ConfigError(
                f"data.batch_size: the global batch {cfg.data.batch_size} must be divisible by the "
                f"{info.world_size} processes"
            )
        self.step, self.epoch = 0, 0
        self.best_value: float | None = None
        self.best_key: str | None = None
        self.history_loss: list[float] = []
        self.at_epoch_start = False
        self.log_file: Any = None
        self.lock: RunLock | None = None
        self.best_step: int | None = None  # the step of checkpoints/best
        self.saved_step: int | None = None  # the step of checkpoints/last
        self.done_without_state = False  # a finished run whose resume.pt was removed at its end
        self.fresh_reason: str | None = None  # why the run starts fresh (None: it resumes)

    def run(self) -> dict[str, Any]:
        """Train (or resume) to the end or to an interruption; returns the final results."""
        try:
            last_dir = self.prepare_run_folder()
            if self.done_without_state:
                # Finished, its resume state dropped: nothing to build, the saved results are the answer.
                saved = self.finished_results()
                if saved is None:
                    raise CheckpointError(
                        f"{self.out_dir / 'results.json'}: unreadable, and the finished run's resume state was "
                        f"removed; its final model is {self.out_dir / 'checkpoints' / 'last'}. Start over with "
                        "--set run.resume=false"
                    )
                return saved
            self.build()
            self.claim_run_folder()
            if last_dir is not None:
                try:
                    self.resume(last_dir)
                except CheckpointError as err:
                    # A run finished by an older hiercls (its resume.pt pickled NumPy state) still reports.
                    saved = self.finished_results(require_step=False)
                    if saved is None:
                        raise
                    logger.warning("%s\nThe run had finished: its saved results are reported", err)
                    return saved
            else:
                self.start()
            finished = self.finished_results()
            if finished is not None:
                return finished
            self.train_model: nn.Module = self.model
            if self.info.distributed:
                # Sparse index tables (tree operators) are the same on every rank and DDP cannot broadcast them.
                sparse = [n for n, b in self.model.named_buffers() if b.layout != torch.strided]
                nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self.model, sparse)
                self.train_model = nn.parallel.DistributedDataParallel(
                    self.model,
                    device_ids=[self.device.index] if self.device.type == "cuda" else None,
                    find_unused_parameters=self.cfg.run.find_unused_parameters,
                )
            self.log_file = (self.out_dir / "metrics.jsonl").open("a", encoding="utf-8") if self.main else None
            try:
                results, interrupted = self.fit()
            finally:
                if self.log_file is not None:
                    self.log_file.close()
            return self.finish(results, interrupted)
        finally:
            if self.lock is not None:
                self.lock.release()
                self.lock = None

    # ------------------------------------------------------------------ setup
    def prepare_run_folder(self) -> Path | None:
        """Lock the run folder, clean up after killed runs, decide whether to resume (nothing else is written).

        Returns:
            The checkpoint folder to resume from, or ``None`` to start fresh.
        """
        cfg, out_dir = self.cfg, self.out_dir
        problem = None
        if self.main:
            # Lock first: nothing of the folder is read or cleaned while another training may be writing it.
            try:
                check_out_dir(out_dir)
                self.lock = RunLock.acquire(out_dir)
                recover_checkpoints(out_dir, locked=self.lock.fd is not None)
            except (ConfigError, CheckpointError) as err:
                problem = err
        # Every rank learns rank 0's verdict (and waits for its clean-up) before looking at the folder.
        verdicts = all_gather_object(None if problem is None else str(problem))
        if problem is not None:
            raise problem
        if verdicts[0] is not None:
            raise ConfigError(verdicts[0])
        last_dir = _checkpoint_dir(out_dir, "last")
        has_state = last_dir is not None and (last_dir / "resume.pt").is_file()
        # A finished run drops its resume state (run.keep_resume_state); its results.json marks it finished.
        self.done_without_state = last_dir is not None and not has_state and (out_dir / "results.json").is_file()
        has_state = has_state or self.done_without_state
        if cfg.run.resume is True and not has_state:
            raise ConfigError(
                f"run.resume: true but {str(out_dir / 'checkpoints' / 'last' / 'resume.pt')!r} does "
                "not exist (use run.resume=auto to start fresh when there is nothing to resume)"
            )
        resuming = has_state and cfg.run.resume in (True, "auto")
        self.done_without_state = self.done_without_state and resuming
        if resuming and (out_dir / "config.yaml").is_file():
            saved = yaml.safe_load((out_dir / "config.yaml").read_text(encoding="utf-8")) or {}
            diffs = _config_differences(saved, config_to_dict(cfg))
            if diffs:
                raise ConfigError(
                    f"{out_dir / 'config.yaml'}: the run in {str(out_dir)!r} was started with a "
                    f"different config ({'; '.join(diffs[:5])}); resume with the same config, or pass "
                    "--set run.resume=false to start over, or choose another run.out_dir"
                )
        self.fresh_reason = None if resuming else ("run.resume=false" if has_state else "starting a new run")
        return last_dir if resuming else None

    def claim_run_folder(self) -> None:
        """Once the recipe has proved buildable: clear a previous run when starting over, write ``config.yaml``.

        Not earlier, so that a recipe that fails to build leaves the folder (and its config.yaml) as it was.
        """
        barrier()  # every rank has read the saved config before rank 0 may overwrite it
        if self.main:
            if self.fresh_reason is not None:
                # A new run's best/, results and probabilities must never sit next to an old run's.
                clear_previous_run(self.out_dir, self.fresh_reason)
            with writing(self.out_dir / "config.yaml"):
                save_config(self.cfg, self.out_dir / "config.yaml")
        barrier()

    def build(self) -> None:
        """Taxonomy, model, data sets and loaders, optimizer, scheduler, scaler (the same init on every rank)."""
        cfg, info, device = self.cfg, self.info, self.device
        _seed_everything(cfg.run.seed)
        taxonomy = load_taxonomy_for(cfg) or dataset_taxonomy(cfg.data.dataset)
        if taxonomy is None:
            # The data set brings its own taxonomy (e.g. nested image folders).
            probe = build_dataset(cfg.data.dataset, cfg.data.train_split, None, cfg.data.options)
            taxonomy = getattr(probe, "taxonomy", None)
            if taxonomy is None:
                raise ConfigError(f"taxonomy: required for data set {cfg.data.dataset!r} (a shipped name or a file)")
        self.taxonomy = taxonomy
        self.model = model = build_model(cfg, taxonomy).to(device)
        transform_eval = image_transform(model, train=False, image_size=cfg.data.image_size)
        transform_train = (
            image_transform(model, train=True, image_size=cfg.data.image_size) if cfg.data.augment else transform_eval
        )
        train_set = subsample(
            build_dataset(cfg.data.dataset, cfg.data.train_split, taxonomy, cfg.data.options, transform_train),
            cfg.data.max_train_samples,
        )
        eval_set = None
        if cfg.data.eval_split:
            eval_set = subsample(
                build_dataset(cfg.data.dataset, cfg.data.eval_split, taxonomy, cfg.data.options, transform_eval),
                cfg.data.max_eval_samples,
            )
        self.decoders = [parse_decoder(d) for d in cfg.eval.decoders]
        collate = getattr(model, "collate", None)
        per_rank = cfg.data.batch_size // info.world_size
        self.loader = make_loader(
            train_set,
            per_rank,
            shuffle=cfg.data.shuffle,
            seed=cfg.run.seed,
            rank=info.rank,
            world_size=info.world_size,
            collate_fn=collate,
            drop_last=cfg.data.drop_last,
            num_workers=cfg.data.num_workers,
            pin_memory=device.type == "cuda",
        )
        self.eval_loader = (
            eval_loader(eval_set, cfg.data.eval_batch_size or cfg.data.batch_size, info, collate, cfg.data.num_workers)
            if eval_set is not None
            else None
        )

        batches_per_epoch = len(self.loader)
        if batches_per_epoch == 0:
            raise ConfigError(
                f"data.batch_size: {len(train_set)} training samples give no batch of "
                f"{cfg.data.batch_size} (drop_last={cfg.data.drop_last})"
            )
        steps_per_epoch = math.ceil(batches_per_epoch / cfg.optim.grad_accum)
        self.total_steps = total = cfg.schedule.max_steps or cfg.schedule.epochs * steps_per_epoch
        warmup = cfg.optim.warmup_steps or round(cfg.optim.warmup_ratio * total)
        self.optimizer = build_optimizer(model, cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: cosine_schedule(s, total, warmup, cfg.optim.min_lr_ratio)
        )
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.amp_dtype == torch.float16)

    def resume(self, last_dir: Path) -> None:
        """Restore weights, optimizer, scheduler, scaler, data position, step, best metric and every rank's RNG."""
        cfg, info, taxonomy = self.cfg, self.info, self.taxonomy
        resume_file = last_dir / "resume.pt"
        state = _read_resume_state(resume_file)
        if state.get("taxonomy_fingerprint") not in (None, taxonomy.fingerprint):
            raise ConfigError(
                f"{resume_file}: saved for taxonomy fingerprint {state['taxonomy_fingerprint']} but the "
                f"config's taxonomy {taxonomy.name!r} has {taxonomy.fingerprint}"
            )
        _load_model_weights(self.model, last_dir)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        self.loader.load_state_dict(state["data"])
        self.step, self.epoch = int(state["step"]), int(state["data"]["epoch"])
        self.best_value, self.best_key = state.get("best_value"), state.get("best_key")
        rngs = state["rng"]
        if len(rngs) == info.world_size:
            _set_rng_state(rngs[info.rank])
        else:
            logger.warning("resuming %d-rank state on %d ranks: RNG streams are reseeded", len(rngs), info.world_size)
            _seed_everything(cfg.run.seed + info.rank + 7919 * self.step)
        self.best_step = state.get("best_step")
        if self.main:
            # The log up to the checkpoint is kept; its last training loss is the run's until new steps log.
            self.history_loss = _truncate_log(self.out_dir / "metrics.jsonl", self.step)
            logger.info(
                "resumed from %s at step %d (epoch %d, sample %d)",
                last_dir,
                self.step,
                self.epoch,
                state["data"]["index"],
            )

    def finished_results(self, require_step: bool = True) -> dict[str, Any] | None:
        """A finished run started again (``run.resume=auto``): its saved ``results.json``, left untouched.

        ``None`` unless the run is finished (``results.json`` exists and, with ``require_step``, the restored
        step is the last one).
        """
        done = self.out_dir / "results.json"
        at_end = self.done_without_state or not require_step or self.step >= self.total_steps
        if not done.is_file() or not at_end:
            return None
        try:
            final = read_json_file(done, "run's results")
        except CheckpointError as err:
            logger.warning("%s; evaluating the final checkpoint again", err)
            return None
        if not isinstance(final, dict):
            return None
        if self.main:
            logger.info(
                "%s: the run finished at step %s; its saved results are reported", self.out_dir, final.get("step")
            )
        return final

    def start(self) -> None:
        """A fresh run: per-rank RNG streams and an empty log."""
        _seed_everything(self.cfg.run.seed + self.info.rank)
        if self.main:
            (self.out_dir / "metrics.jsonl").write_text("", encoding="utf-8")

    # ------------------------------------------------------------------ training
    def fit(self) -> tuple[dict[str, Any], bool]:
        """The epochs: optimizer steps, evaluation at the end of (every ``eval.every``-th) epoch, checkpoints.

        Returns:
            ``(last evaluation results, interrupted)``.
        """
        cfg = self.cfg
        self.model.train()
        self.steps_this_run, interrupted, results = 0, False, {}
        self.bar = tqdm(
            total=self.total_steps,
            initial=self.step,
            desc="train",
            disable=not (self.main and cfg.run.progress),
            dynamic_ncols=True,
        )
        self.log_acc = torch.zeros(2, dtype=torch.float64)
        self.t_log, self.samples_since_log = time.perf_counter(), 0
        self.at_epoch_start = False
        if self.step >= self.total_steps and self.eval_loader is not None:
            # Killed after its last checkpoint but before results.json: evaluate that checkpoint again.
            results = self.evaluate()
        while self.step < self.total_steps and not interrupted:
            consumed, remaining, interrupted = self.train_epoch()
            if interrupted:
                break
            # End of the epoch (or of training): evaluate, then save the resumable state.
            epoch_done, last = consumed >= remaining, self.step >= self.total_steps
            if (epoch_done or last) and (last or (cfg.eval.every and (self.epoch + 1) % cfg.eval.every == 0)):
                results = self.evaluate()
            if epoch_done:
                self.epoch += 1
                self.at_epoch_start = True
            self.save_last()
        self.bar.close()
        return results, interrupted

    def train_epoch(self) -> tuple[int, int, bool]:
        """Optimizer steps over (the rest of) this epoch; returns ``(batches consumed, batches in the epoch,
        interrupted)``."""
        cfg, accum = self.cfg, self.cfg.optim.grad_accum
        self.loader.set_epoch(self.epoch)
        remaining, consumed = len(self.loader), 0
        batches = iter(self.loader)
        self.at_epoch_start = False
        while self.step < self.total_steps:
            # One optimizer step = up to `accum` micro-batches; fetch them first to know the global sample count.
            window = [b for _, b in zip(range(accum), batches, strict=False)]
            if not window:
                break
            consumed += len(window)
            step_loss, global_n = self.train_step(window)
            self.step += 1
            self.steps_this_run += 1
            lr = self.scheduler.get_last_lr()[0]
            self.log_train(step_loss, global_n, lr)
            stop = False
            for cb in self.callbacks:
                try:
                    cb({"step": self.step, "epoch": self.epoch, "loss": step_loss, "lr": lr})
                except StopTraining:
                    stop = True
            max_this_run = cfg.schedule.max_steps_this_run
            if max_this_run is not None and self.steps_this_run >= max_this_run and self.step < self.total_steps:
                stop = True
            if stop or (cfg.run.save_every_steps and self.step % cfg.run.save_every_steps == 0):
                self.save_last()
            if stop:
                return consumed, remaining, True
        return consumed, remaining, False

    def train_step(self, window: list[Any]) -> tuple[float, float]:
        """One optimizer step over the micro-batches of ``window``; returns ``(mean loss, global sample count)``.

        Each micro-batch loss is weighted by its share of the step's global sample count (times the world size,
        undoing DDP's mean), so the gradient is the global-batch mean as in one process.
        """
        cfg, info, model, device, amp_dtype = self.cfg, self.info, self.model, self.device, self.amp_dtype
        local_n = sum(_num_samples(t) for _, t in window)
        global_n = float(all_reduce_sum(torch.tensor([local_n], dtype=torch.float64))[0])
        step_loss, bad_loss = 0.0, None
        for i, (inputs, targets) in enumerate(window):
            inputs, targets = move_to_device(inputs, device), move_to_device(targets, device)
            n = _num_samples(targets)
            sync = i == len(window) - 1 or not info.distributed
            with contextlib.nullcontext() if sync else self.train_model.no_sync():
                with torch.autocast(device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                    output = self.train_model(inputs)
                    loss = model.loss(output, targets)
                weight = n / global_n * info.world_size if global_n > 0 else 0.0
                scaled = loss * weight if n > 0 else sum(p.sum() for p in model.parameters()) * 0.0
                self.scaler.scale(scaled).backward()
            if n > 0:
                value = float(loss.detach())
                step_loss += value * n / global_n
                if not math.isfinite(value):
                    bad_loss = value
        # Every rank must agree before one of them stops (the others would wait in the next all-reduce).
        if float(all_reduce_sum(torch.tensor([0.0 if bad_loss is None else 1.0], dtype=torch.float64))[0]):
            self.optimizer.zero_grad(set_to_none=True)
            self.diverged(bad_loss)
        if cfg.optim.clip_grad_norm is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.clip_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return step_loss, global_n

    def diverged(self, loss: float | None, *, weights: bool = False) -> None:
        """Stop at the first non-finite loss (or weights) before it reaches the weights or a checkpoint."""
        lr = self.scheduler.get_last_lr()[0]
        if weights:
            what = f"step {self.step}: the weights are no longer finite after this step (lr {lr:.3g})"
        else:
            value = "not finite on another rank" if loss is None else f"{loss}"
            what = f"step {self.step + 1}: the training loss is {value} at lr {lr:.3g}"
        kept = (
            f"the last good checkpoint {self.out_dir / 'checkpoints' / 'last'} (step {self.saved_step}) is kept"
            if self.saved_step is not None
            else "no checkpoint had been written yet"
        )
        raise TrainingDiverged(
            f"{what}: training diverged; {kept}. Lower optim.lr (or set optim.clip_grad_norm / "
            "optim.warmup_steps) and start over with --set run.resume=false"
        )

    def log_train(self, step_loss: float, global_n: float, lr: float) -> None:
        """Accumulate the step's loss; every ``run.log_every`` steps log the mean over ranks and steps."""
        self.samples_since_log += int(global_n)
        self.log_acc += torch.tensor([step_loss, 1.0], dtype=torch.float64)
        self.bar.update(1)
        if self.step % self.cfg.run.log_every == 0 or self.step == self.total_steps:
            # Each rank holds its share of every step's global mean loss; the step count is the same.
            mean_loss = float(all_reduce_sum(self.log_acc[:1].clone())[0] / self.log_acc[1])
            elapsed = time.perf_counter() - self.t_log
            self.history_loss.append(mean_loss)
            self.log(
                {
                    "type": "train",
                    "step": self.step,
                    "epoch": self.epoch,
                    "loss": mean_loss,
                    "lr": lr,
                    "samples_per_s": self.samples_since_log / elapsed if elapsed > 0 else None,
                }
            )
            self.bar.set_postfix(loss=f"{mean_loss:.4f}", lr=f"{lr:.2e}")
            self.log_acc.zero_()
            self.t_log, self.samples_since_log = time.perf_counter(), 0

    def log(self, record: dict[str, Any]) -> None:
        """One JSON line in ``metrics.jsonl`` (rank 0)."""
        if self.log_file is not None:
            self.log_file.write(json.dumps(record) + "\n")
            self.log_file.flush()

    # ------------------------------------------------------------------ evaluation and checkpoints
    def evaluate(self) -> dict[str, Any]:
        """Evaluate, keep ``checkpoints/best`` on the best metric, log; optionally save the probabilities."""
        cfg = self.cfg
        if self.eval_loader is None:
            return {}
        collected: list[tuple[torch.Tensor, torch.Tensor]] | None = [] if cfg.eval.calibrate else None
        if collected is not None:
            self.model.temperature = 1.0  # the raw probabilities first; the fit below sets the new temperature
        results, probs, labels = evaluate_model(
            self.model,
            self.eval_loader,
            self.taxonomy,
            self.decoders,
            device=self.device,
            amp_dtype=self.amp_dtype,
            progress=self.main and cfg.run.progress,
            keep_probs=cfg.eval.save_probs,
            collect=collected,
        )
        if collected is not None:
            results.update(
                calibrate_outputs(self.model, collected, self.taxonomy, self.decoders, n_bins=cfg.eval.ece_bins)
            )
            del collected
        if cfg.eval.save_probs:
            self.save_probs(probs, labels)
        key = self.best_key or _best_metric_key(cfg, results)
        self.best_key = key
        value = results.get(key)
        improved = isinstance(value, (int, float)) and (
            self.best_value is None
            or (value > self.best_value if cfg.eval.best_mode == "max" else value < self.best_value)
        )
        if improved:
            self.best_value = float(value)
            self.best_step = self.step
            if self.main:
                save_dir_atomically(
                    self.out_dir / "checkpoints" / "best",
                    lambda d: self.model.save_pretrained(d, metrics=results),  # the card's metrics table
                )
            barrier()
        self.log(
            {
                "type": "eval",
                "step": self.step,
                "epoch": self.epoch,
                **results,
                "best_key": key,
                "best_value": self.best_value,
            }
        )
        shown = ("accuracy", "hF1_micro", "mean_dice", "eval_loss", key.rsplit("/", 1)[-1])
        logger.info(
            "eval after step %d: %s",
            self.step,
            ", ".join(
                f"{k}={v:.4f}" for k, v in results.items() if isinstance(v, float) and k.rsplit("/", 1)[-1] in shown
            ),
        )
        return results

    def save_probs(self, probs: np.ndarray | None, labels: np.ndarray | None) -> None:
        """``eval_probs.npy`` / ``eval_labels.npy`` in data set order, gathered from every rank."""
        gathered = all_gather_object((probs, labels))
        if not self.main:
            return
        world = self.info.world_size
        # Ranks hold interleaved shards (r, r + w, ...): restore the data set order.
        n = sum(len(y) for _, y in gathered if y is not None)
        p_all = np.zeros((n, self.taxonomy.num_nodes) + (() if probs is None else probs.shape[2:]), np.float32)
        y_all = np.zeros(n, np.int64) if labels is None or labels.ndim == 1 else None
        for r, (p, y) in enumerate(gathered):
            if p is not None:
                p_all[r::world] = p
                if y_all is not None:
                    y_all[r::world] = y
        _write_atomically(self.out_dir / "eval_probs.npy", lambda t: np.save(t, p_all))
        if y_all is not None:
            _write_atomically(self.out_dir / "eval_labels.npy", lambda t: np.save(t, y_all))

    def save_last(self) -> None:
        """``checkpoints/last``: the weights and everything exact resumption needs (written atomically).

        ``resume.pt`` holds the optimizer, scheduler, scaler, data position and RNG states, not the weights
        (they are the checkpoint's ``model.safetensors``). When ``best`` is the same step, ``last`` hard-links
        its files instead of a second copy (files are only ever replaced, never rewritten in place, so the two
        folders cannot diverge by a later write).
        """
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            self.diverged(None, weights=True)
        rngs = all_gather_object(_rng_state())
        if self.main:
            data_state = self.loader.state_dict()
            if self.at_epoch_start:
                # Between epochs the loader still reports the end of the previous one.
                data_state = {**data_state, "epoch": self.epoch, "index": 0}
            state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(),
                "data": data_state,
                "step": self.step,
                "rng": rngs,
                "best_value": self.best_value,
                "best_key": self.best_key,
                "best_step": self.best_step,
                "world_size": self.info.world_size,
                "taxonomy_fingerprint": self.taxonomy.fingerprint,
            }
            best = self.out_dir / "checkpoints" / "best"

            def write(d: Path) -> None:
                if not (self.best_step == self.step and best.is_dir() and _link_tree(best, d)):
                    self.model.save_pretrained(d)
                with writing(d / "resume.pt"):
                    torch.save(state, d / "resume.pt")

            save_dir_atomically(self.out_dir / "checkpoints" / "last", write)
        self.saved_step = self.step
        barrier()

    def best_evaluation(self) -> dict[str, Any] | None:
        """The metrics of the evaluation that made ``checkpoints/best`` (from ``metrics.jsonl``), or ``None``."""
        log = self.out_dir / "metrics.jsonl"
        if not log.is_file():
            return None
        found = None
        for rec in read_log(log):
            if rec.get("type") == "eval" and rec.get("step") == self.best_step:
                found = rec
        if found is None:
            return None
        return {k: v for k, v in found.items() if "/" in k or k in ("eval_loss", "calibration")}

    def finish(self, results: dict[str, Any], interrupted: bool) -> dict[str, Any]:
        """The final results; a finished run also writes ``results.json`` and ``curves.png``.

        The metrics reported are those of ``checkpoints/best`` (what ``hiercls evaluate --model`` and ``predict``
        load), read back from its evaluation record when an earlier step was the best; the last evaluation's
        are kept under ``"last"``.
        """
        reported_step = self.step
        if results and self.best_step is not None and self.best_step != self.step:
            best = self.best_evaluation()
            if best is not None:
                results = {**best, "last": {k: v for k, v in results.items() if "/" in k}}
                reported_step = self.best_step
        final = {
            "step": self.step,
            "epoch": self.epoch,
            "out_dir": str(self.out_dir),
            "interrupted": interrupted,
            "train_loss": self.history_loss[-1] if self.history_loss else None,
            "taxonomy": self.taxonomy.name,
            "head": self.cfg.model.head,
            "best_key": self.best_key,
            "best_value": self.best_value,
            "reported_step": reported_step,
            **results,
        }
        if self.main and not interrupted and self.cfg.run.plot:
            try:
                plot_run(self.out_dir / "metrics.jsonl", self.out_dir / "curves.png")
            except Exception as err:  # a plotting problem must not lose a finished run
                logger.warning("could not write %s: %s", self.out_dir / "curves.png", err)
        if self.main:
            # Finished: the optimizer's moments in resume.pt (twice the weights) can never be used again.
            state = self.out_dir / "checkpoints" / "last" / "resume.pt"
            drop = not interrupted and not self.cfg.run.keep_resume_state and state.is_file()
            final["best_step"] = self.best_step
            final["run_folder_bytes"] = size = folder_size(self.out_dir) - (state.stat().st_size if drop else 0)
            logger.info(
                "run folder %s: %.1f MB%s",
                self.out_dir,
                size / 1e6,
                f" (best = last = step {self.step}, one copy)"
                if self.best_step == self.saved_step == self.step
                else "",
            )
            if not interrupted:
                text = json.dumps(final, indent=2)
                _write_atomically(self.out_dir / "results.json", lambda t: t.write_text(text, encoding="utf-8"))
                if drop:
                    # After results.json: a kill in between leaves a run that still reads as finished.
                    state.unlink()
                    logger.info("removed %s: the run is finished (run.keep_resume_state=true keeps it)", state)
        barrier()
        return final


def _link_tree(src: Path, dst: Path) -> bool:
    """Hard-link every file of ``src`` into ``dst``; ``False`` (and ``dst`` emptied) where links are impossible."""
    try:
        shutil.copytree(src, dst, copy_function=os.link, dirs_exist_ok=True)
        return True
    except OSError as err:  # another file system, or one without hard links: write a copy instead
        logger.debug("cannot hard-link %s into %s (%s); writing a copy", src, dst, err)
        for child in dst.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        return False


def _write_atomically(path: Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` then rename ``tmp`` to ``path``: a full disk or a kill never leaves half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        with writing(path):
            write(tmp)
            tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _truncate_log(path: Path, step: int) -> list[float]:
    """Drop log records written after the checkpoint we resume from (they will be logged again); returns the
    training losses that remain."""
    if not path.is_file():
        return []
    keep, losses = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError, AttributeError, TypeError):
            record = json.loads(line)
            if record.get("step", 0) <= step:
                keep.append(line)
                if record.get("type") == "train" and isinstance(record.get("loss"), (int, float)):
                    losses.append(float(record["loss"]))
    with writing(path):
        path.write_text("".join(k + "\n" for k in keep), encoding="utf-8")
    return losses
