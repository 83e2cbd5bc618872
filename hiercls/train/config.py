"""Training configuration: nested dataclasses, YAML recipes and ``--set key=value`` overrides.

The keys of a YAML recipe are exactly the fields of :class:`TrainConfig` and its sections. Precedence is
code defaults < YAML < command-line overrides. Unknown keys and values of the wrong type are errors that
name the key, the file (and line) and the valid keys, with a close-name suggestion.

Example:
    >>> cfg = config_from_dict({"model": {"backbone": "timm:test_vit"}, "data": {"dataset": "synthetic"}})
    >>> cfg = apply_overrides(cfg, ["optim.lr=3e-4", "schedule.epochs=2"])
    >>> cfg.optim.lr, cfg.schedule.epochs
    (0.0003, 2)
    >>> try:
    ...     apply_overrides(cfg, ["optim.lrr=1"])
    ... except ConfigError as err:
    ...     print(str(err).split(";")[0])
    --set optim.lrr: unknown key 'lrr' in section 'optim' (did you mean 'lr'?)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from hiercls._textio import TextFileError, atomic_write, load_yaml, read_text
from hiercls.data.images import augment_options
from hiercls.decode import parse_decoder

__all__ = [
    "ConfigError",
    "DataConfig",
    "EmaConfig",
    "EvalConfig",
    "MixupConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "SchedConfig",
    "ScheduleConfig",
    "StudyConfig",
    "TeacherConfig",
    "TrainConfig",
    "apply_overrides",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "save_config",
    "validate_config",
]

Precision = Literal["auto", "fp32", "bf16", "fp16"]
#: The largest ``optim.lr`` / ``optim.head_lr`` / ``optim.weight_decay`` accepted: far above any useful value (a
#: run diverges with a clear message), far below what overflows float32 optimizer arithmetic (``1e300`` does).
MAX_LR = 1e6
#: Where a run's log records go (:mod:`hiercls.train.loggers`).
Logger = Literal["jsonl", "tensorboard", "wandb", "mlflow"]


class ConfigError(ValueError):
    """A recipe or an override is invalid; the message names the key, the file/line and what was expected."""


@dataclass
class EmaConfig:
    """An exponential moving average of the weights (timm's ``ModelEmaV3``), updated after every optimizer step.

    Attributes:
        decay: the EMA's decay (e.g. ``0.9998``); ``None``: no EMA.
        warmup: timm's decay warmup (the decay grows with the step count up to ``decay``).
        eval: evaluate the EMA weights too (results ``ema/<decoder>/<metric>`` when ``best_on`` is ``raw``).
        best_on: ``ema``: the EMA weights are the run's model (evaluated, kept as ``checkpoints/best``); ``raw``:
            the trained weights are.
    """

    decay: float | None = None
    warmup: bool = False
    eval: bool = True
    best_on: Literal["ema", "raw"] = "ema"


@dataclass
class TeacherConfig:
    """Semantic knowledge distillation from a trained teacher (Ridnik et al. 2021, ImageNet-21K pretraining).

    The loss becomes ``head loss + weight * head.distillation_loss(student, teacher, distance=distance)``; the
    teacher sees the same (mixed) inputs under ``torch.no_grad`` and is never trained or saved. Both heads must be
    ``semantic_softmax`` over the run's taxonomy (same fingerprint); a timm-model teacher is not supported.

    Attributes:
        path: a hiercls run folder, study folder or saved model folder; ``None``: no distillation.
        weight: the weight of the distillation term (``>= 0``).
        distance: ``mse`` or ``kl`` between the per-level softmaxes (:class:`hiercls.losses.SemanticKDLoss`).
    """

    path: str | None = None
    weight: float = 1.0
    distance: Literal["mse", "kl"] = "mse"


@dataclass
class ModelConfig:
    """The network: a backbone spec, a head from ``hiercls.heads`` and where the weights come from.

    Attributes:
        backbone: ``"timm:<model name>"``, ``"hf:<path or package>"`` (see ``hiercls.models.create_model``)
            or ``"conv3d:<width>"`` for the small 3-D segmentation network :class:`hiercls.models.TinySegNet3D`.
        head: registry name of the head (``flat``, ``semantic_softmax``, ``conditional_softmax``, ...,
            ``transhp``).
        head_options: keyword options of the head (for example ``{"alpha": 0.1}`` for ``hxe``).
        weights: ``None`` (random init), ``"package"`` (the offline weight package of the backbone) or a path.
        backbone_options: extra keyword arguments of the backbone (``max_length``, ``img_size``, ...).
        ema: see :class:`EmaConfig`.
        teacher: see :class:`TeacherConfig`.
        compile: train through ``torch.compile`` of the model (the first steps compile it).
        channels_last: keep the weights and 4-D image batches in the channels-last memory format (faster
            convolutions on GPUs with tensor cores).
    """

    backbone: str = ""
    head: str = "semantic_softmax"
    head_options: dict[str, Any] = field(default_factory=dict)
    weights: str | None = None
    backbone_options: dict[str, Any] = field(default_factory=dict)
    ema: EmaConfig = field(default_factory=EmaConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    compile: bool = False
    channels_last: bool = False


@dataclass
class MixupConfig:
    """Mixup / CutMix (timm's ``timm.data.Mixup``) and label smoothing as soft leaf targets ``[B, num_leaves]``.

    Off by default. With ``mixup_alpha`` or ``cutmix_alpha`` > 0 each training micro-batch is mixed before the
    forward pass and every head is trained on the mixed leaf distribution (its soft-target loss); with only
    ``label_smoothing`` > 0 the one-hot leaf targets are smoothed (the same soft path, for every head). Labels
    must be leaves (an internal-node label has no leaf distribution: the step is refused, naming it).

    Attributes:
        mixup_alpha: Beta(alpha, alpha) of the mixup weight (0: no mixup).
        cutmix_alpha: Beta(alpha, alpha) of the CutMix box area (0: no CutMix; images only).
        prob: probability of mixing a batch (or element, ``mode: elem``).
        switch_prob: with both alphas > 0, the probability of CutMix instead of mixup.
        mode: ``batch`` (one weight per batch), ``pair`` (per pair of samples) or ``elem`` (per sample).
        label_smoothing: mass spread uniformly over the leaves (timm's ``smoothing``); the ``semantic_softmax``
            head smooths per level itself (``model.head_options.label_smoothing``).
    """

    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    prob: float = 1.0
    switch_prob: float = 0.5
    mode: str = "batch"
    label_smoothing: float = 0.0


@dataclass
class DataConfig:
    """The data set and how it is batched.

    Attributes:
        dataset: name of a data set kind, see :func:`hiercls.data.list_datasets` (``wordnet_gloss``,
            ``fashion_mnist``, ``image_folder``, ``text_csv``, ``text_jsonl``, ``nested_blobs_3d``,
            ``synthetic``).
        options: keyword options of that data set (paths, columns, sizes...).
        train_split: split used for training.
        eval_split: split evaluated every epoch (``None``: no evaluation).
        batch_size: the *global* batch size of one forward pass (split over DDP ranks); an optimizer
            step sees ``batch_size * optim.grad_accum`` samples.
        eval_batch_size: global batch size for evaluation (default: ``batch_size``).
        num_workers: DataLoader worker processes per rank.
        max_train_samples: keep only the first ``n`` training samples (a fixed subset, for quick runs).
        max_eval_samples: keep only the first ``n`` evaluation samples.
        shuffle: reshuffle the training set every epoch (seeded by ``run.seed`` and the epoch).
        drop_last: drop the last incomplete global batch of every epoch.
        image_size: resize images to this size (default: the backbone's input size).
        augment: ``true``: use the backbone's augmenting train transform (timm's) instead of the eval transform;
            or a mapping of timm ``create_transform`` options (:data:`hiercls.data.AUGMENT_OPTIONS`:
            ``auto_augment: rand-m9-mstd0.5``, ``re_prob``, ``re_mode``, ``re_count``, ``interpolation``,
            ``crop_pct``, ``crop_mode``, ``scale``, ``ratio``, ``hflip``, ``vflip``, ``color_jitter``), which
            also turns augmentation on; ``interpolation``, ``crop_pct`` and ``crop_mode`` also set the evaluation
            transform (as in timm's ``train.py``).
        mixup: mixup / cutmix and label smoothing as soft targets (:class:`MixupConfig`; off by default).
    """

    dataset: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    eval_split: str | None = "val"
    batch_size: int = 32
    eval_batch_size: int | None = None
    num_workers: int = 0
    max_train_samples: int | None = None
    max_eval_samples: int | None = None
    shuffle: bool = True
    drop_last: bool = False
    image_size: int | None = None
    augment: bool | dict[str, Any] = False
    mixup: MixupConfig = field(default_factory=MixupConfig)


@dataclass
class OptimConfig:
    """The optimizer (any of timm's, AdamW by default); warmup and floor of the schedule (see :class:`SchedConfig`).

    Attributes:
        name: a name ``timm.optim.create_optimizer_v2`` accepts (``adamw``, ``sgd``, ``lamb``, ``lars``,
            ``adam``, ``lookahead_adamw``...; ``timm.optim.list_optimizers()``).
        lr: peak learning rate.
        head_lr: peak learning rate of the parameters under ``head.`` (a freshly initialised head next to a
            pretrained backbone learns faster with a larger one); default ``lr``.
        weight_decay: decoupled weight decay, not applied to biases and normalisation weights (1-D tensors).
        betas: betas of the optimizers that have them (Adam-likes, LAMB).
        eps: epsilon of the optimizers that have one.
        momentum: momentum of the optimizers that have one (``None``: timm's default, 0.9).
        layer_decay: timm's layer-wise lr decay (``0.75``: each layer below the head learns at 0.75 times the
            lr of the one above); ``None``: off.
        options: further keyword arguments of the optimizer (e.g. ``{nesterov: true}``).
        warmup_steps: optimizer steps of linear warmup (takes precedence over ``warmup_ratio``).
        warmup_ratio: warmup as a fraction of the total optimizer steps.
        min_lr_ratio: the cosine decays to ``lr * min_lr_ratio``.
        grad_accum: micro-batches accumulated per optimizer step.
        clip_grad_norm: clip the global gradient norm to this value (``None``: no clipping).
    """

    lr: float = 1e-3
    head_lr: float | None = None
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    name: str = "adamw"
    momentum: float | None = None
    layer_decay: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    grad_accum: int = 1
    clip_grad_norm: float | None = 1.0


@dataclass
class SchedConfig:
    """The learning-rate schedule, stepped once per optimizer step (warmup and floor are ``optim``'s).

    Attributes:
        name: ``cosine`` (linear warmup, cosine decay to ``lr * optim.min_lr_ratio``), ``onecycle`` (torch's
            ``OneCycleLR``: ``pct_start``, ``div_factor``, ``final_div_factor``), or a name of timm's
            ``create_scheduler_v2``: ``step``, ``multistep``, ``tanh``, ``poly``, ``wsd``, ``rsqrt``,
            ``constant``, ``timm_cosine`` (timm's cosine).
        decay_epochs: ``step``: decay the lr every that many epochs (fractions allowed).
        decay_milestones: ``multistep``: the epochs at which the lr decays.
        decay_rate: ``step`` / ``multistep``: the factor of each decay (``poly``: the power).
        warmup_lr_ratio: timm's schedules: the warmup starts at ``lr * warmup_lr_ratio``.
        pct_start: ``onecycle``: the share of the steps spent raising the lr.
        div_factor: ``onecycle``: the lr starts at ``lr / div_factor``.
        final_div_factor: ``onecycle``: the lr ends at ``lr / div_factor / final_div_factor``.
        cycle_momentum: ``onecycle``: cycle the momentum (beta1) inversely to the lr.
        options: further keyword arguments of the schedule (timm's ``create_scheduler_v2`` or ``OneCycleLR``).
    """

    name: Literal[
        "cosine", "onecycle", "step", "multistep", "tanh", "poly", "wsd", "rsqrt", "constant", "timm_cosine"
    ] = "cosine"
    decay_epochs: float = 30.0
    decay_milestones: list[float] = field(default_factory=list)
    decay_rate: float = 0.1
    warmup_lr_ratio: float = 0.0
    pct_start: float = 0.3
    div_factor: float = 25.0
    final_div_factor: float = 1e4
    cycle_momentum: bool = True
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ScheduleConfig:
    """How long to train.

    Attributes:
        epochs: passes over the training set.
        max_steps: total optimizer steps (overrides ``epochs`` when set).
        max_steps_this_run: stop this process after that many optimizer steps, leaving a resumable
            checkpoint (simulates a preemption; used by the resume tests and for time-sliced clusters).
    """

    epochs: int = 1
    max_steps: int | None = None
    max_steps_this_run: int | None = None


@dataclass
class EvalConfig:
    """Evaluation after epochs with hierarchical metrics, once per decoder.

    Attributes:
        decoders: decoders applied to the node probabilities, as :func:`hiercls.decode.parse_decoder` specs
            (``argmax_leaf``, ``optimal_hfbeta:beta=2``, ``threshold:threshold=0.6``; ``optimal_hf1`` is
            ``optimal_hfbeta`` with beta 1). Results are keyed ``<decoder label>/<metric>``.
        every: evaluate every ``every`` epochs (``0``: only after the last epoch).
        best_metric: ``"<decoder>/<metric key>"`` used to keep the ``best`` checkpoint (default: the metric
            the first decoder is optimal for: ``hF{beta}_samples`` for an hF-beta decoder, else ``hF1_micro``).
        best_mode: ``max`` or ``min``.
        save_probs: write the evaluation node probabilities and labels (``eval_probs.npy``,
            ``eval_labels.npy``) so ``hiercls evaluate --probs`` can re-score them.
        calibrate: at every evaluation, fit a temperature on the evaluation split (the validation split of the
            recipe) by minimising the head's NLL, report every decoder also on the calibrated probabilities
            (``"<decoder> (calibrated)/<metric>"``) and the ECE per level before and after (``calibration``), and
            save the temperature with the checkpoints (see :mod:`hiercls.evaluation.calibration`).
        ece_bins: number of equal-width bins of the ECE.
        conformal: a target miscoverage ``alpha`` in ``(0, 1)`` (``None``: off). At the end of every run the best
            checkpoint's conformal predictors (:mod:`hiercls.conformal`: ``node``, ``set:r=2``,
            ``risk:overshoot``, beside the non-conformal ``threshold`` rule) are calibrated on
            ``data.eval_split`` and scored on ``study.split`` (default ``test``): coverage, mean set size and mean
            depth go into the run's ``results.json`` (``conformal``) and the study's report
            (:func:`hiercls.evaluation.table.conformal_rows`).
    """

    decoders: list[str] = field(default_factory=lambda: ["argmax_leaf"])
    every: int = 1
    best_metric: str | None = None
    best_mode: Literal["max", "min"] = "max"
    save_probs: bool = False
    calibrate: bool = False
    ece_bins: int = 15
    conformal: float | None = None


@dataclass
class RunConfig:
    """Where and how the run happens.

    Attributes:
        out_dir: run folder (``{name}`` is replaced by the config's name).
        seed: base seed; each DDP rank uses ``seed + rank`` for its own random streams.
        precision: ``auto`` (bf16 autocast on CUDA with bf16 support, else fp32), ``fp32``, ``bf16``, ``fp16``
            (CUDA only, with gradient scaling).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:<i>`` (under torchrun the local rank picks the GPU).
        log_every: optimizer steps between training-log lines in ``metrics.jsonl``.
        resume: ``auto`` (continue from ``<out_dir>/checkpoints/last`` if present), ``True`` (must
            resume) or ``False`` (start over).
        save_every_steps: also write the ``last`` checkpoint every that many optimizer steps.
        progress: tqdm progress bars on rank 0.
        plot: write ``curves.png`` (loss and per-level accuracy) at the end.
        threads: torch intra-op threads (``None``: leave torch's default).
        deterministic: ask torch for deterministic algorithms.
        find_unused_parameters: DDP option; needed when some parameters get no gradient (e.g. an unused
            pooler); costs a graph traversal per step. ``auto``: on only when a dry step on one batch (before
            training, random streams and buffers put back) leaves some trainable parameter without a gradient.
        keep_resume_state: keep ``checkpoints/last/resume.pt`` (the optimizer's moments, twice the size of the
            weights) once the run has finished. A finished run is never trained further (the same config
            reports its results; another config is refused), so by default it is removed at the end.
        loggers: where the log records go, on rank 0 (:mod:`hiercls.train.loggers`): ``jsonl``
            (``metrics.jsonl``, which resumption, ``results.json`` and ``curves.png`` read: always listed), and any
            of ``tensorboard``, ``wandb``, ``mlflow`` beside it (each needs its package: ``pip install
            'hiercls[tensorboard]'``...).
    """

    out_dir: str = "runs/{name}"
    seed: int = 0
    precision: Precision = "auto"
    device: str = "auto"
    log_every: int = 10
    resume: bool | Literal["auto"] = "auto"
    save_every_steps: int | None = None
    progress: bool = True
    plot: bool = True
    threads: int | None = None
    deterministic: bool = False
    find_unused_parameters: bool | Literal["auto"] = "auto"
    keep_resume_state: bool = False
    loggers: list[Logger] = field(default_factory=lambda: ["jsonl"])


@dataclass
class StudyConfig:
    """A comparison of heads over several seeds with confidence intervals (:func:`hiercls.train.run_study`).

    With ``seeds`` set, ``hiercls train`` trains the recipe's head and every head of ``compare_heads`` once per
    seed (each choosing its best checkpoint on ``data.eval_split``), scores every run on ``split``, adds a
    no-input label-prior row, and reports mean ± std over seeds, per-level accuracy with sample counts, and a
    paired bootstrap interval of the first two heads' difference.

    Attributes:
        seeds: run seeds (empty: no study, a plain run).
        split: the split the study reports on (keep it apart from ``data.eval_split``, which picks checkpoints).
        head_settings: per-head overrides, ``{head: {dotted.key: value}}`` (e.g. each head's tuned
            ``optim.head_lr``), applied on top of the recipe.
        prior: add the label-prior baseline (training label frequencies, the same for every input).
        bootstrap: bootstrap resamples of the paired difference.
        confidence: the interval's level.
        max_samples: score a fixed subset of ``split`` (``None``: all of it).
    """

    seeds: list[int] = field(default_factory=list)
    split: str = "test"
    head_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    prior: bool = True
    bootstrap: int = 2000
    confidence: float = 0.95
    max_samples: int | None = None


@dataclass
class TrainConfig:
    """A complete training recipe (the keys of a recipe YAML file).

    Attributes:
        name: short run name (used in ``run.out_dir``).
        description: free text.
        taxonomy: shipped taxonomy name or a taxonomy file (``None``: the data set's own taxonomy).
        taxonomy_options: keyword arguments of ``load_taxonomy``.
        model: see :class:`ModelConfig`.
        data: see :class:`DataConfig`.
        optim: see :class:`OptimConfig`.
        sched: see :class:`SchedConfig`.
        schedule: see :class:`ScheduleConfig`.
        eval: see :class:`EvalConfig`.
        run: see :class:`RunConfig`.
        compare_heads: after the main run, train the same recipe with each of these heads (into
            ``<out_dir>/compare/<head>``) and report a comparison table.
        study: see :class:`StudyConfig` (seeds, intervals, the prior baseline).
    """

    name: str = "run"
    description: str = ""
    taxonomy: str | None = None
    taxonomy_options: dict[str, Any] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    compare_heads: list[str] = field(default_factory=list)
    study: StudyConfig = field(default_factory=StudyConfig)

    @property
    def out_dir(self) -> Path:
        """``run.out_dir`` with ``{name}`` filled in and a leading ``~`` expanded to the home folder."""
        return Path(self.run.out_dir.replace("{name}", self.name)).expanduser()


# ---------------------------------------------------------------------------------------------- coercion
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _expected(value: Any, tp: Any, where: str) -> ConfigError:
    return ConfigError(f"{where}: expected {_type_name(tp)}, got {value!r} ({type(value).__name__})")


def _coerce(value: Any, tp: Any, where: str, from_string: bool = False) -> Any:
    """Convert ``value`` to the annotated type ``tp`` or raise :class:`ConfigError` naming ``where``.

    ``from_string`` marks a ``--set`` value: it is first parsed as YAML (so ``[1, 2]`` and ``1e-4`` work),
    falling back to the raw string for ``str`` fields.
    """
    if from_string and isinstance(value, str):
        return _coerce_text(value, tp, where)
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _coerce_union(value, tp, where)
    if origin is Literal:
        return _coerce_literal(value, tp, where)
    convert = _CONVERTERS.get(origin or tp)
    if convert is None:  # pragma: no cover - every field type of the config has a converter
        raise ConfigError(f"{where}: unsupported field type {_type_name(tp)}")
    return convert(value, tp, where)


def _coerce_text(value: str, tp: Any, where: str) -> Any:
    try:
        parsed = yaml.safe_load(value) if value.strip() else None
    except yaml.YAMLError:
        parsed = value
    # Strings stay strings for str fields (so "--set name=007" is not an int) unless the YAML value is needed
    # to satisfy the type.
    try:
        return _coerce(parsed, tp, where)
    except ConfigError as first:
        if value != parsed:
            with contextlib.suppress(ConfigError):
                return _coerce(value, tp, where)
        raise first from None


def _coerce_union(value: Any, tp: Any, where: str) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if value is None and len(args) < len(typing.get_args(tp)):
        return None
    # Exact type matches first, so that ``bool | Literal["auto"]`` keeps True as a bool.
    for a in args:
        if _matches_exactly(value, a):
            return _coerce(value, a, where)
    for a in args:
        with contextlib.suppress(ConfigError):
            return _coerce(value, a, where)
    raise _expected(value, tp, where)


def _coerce_literal(value: Any, tp: Any, where: str) -> Any:
    args = typing.get_args(tp)
    if value in args and not (isinstance(value, bool) and not any(isinstance(a, bool) for a in args)):
        return value
    raise ConfigError(f"{where}: expected one of {', '.join(repr(a) for a in args)}, got {value!r}")


def _instance(value: Any, tp: Any, where: str) -> Any:
    """A value that is already of the field's type (``None``, ``bool``, ``str``: no conversion is guessed)."""
    if not isinstance(value, tp):
        raise _expected(value, tp, where)
    return value


def _to_int(value: Any, tp: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _expected(value, tp, where)


def _to_float(value: Any, tp: Any, where: str) -> float:
    # PyYAML reads "1e-4" (no dot) as a string; accept it.
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _expected(value, tp, where)
    try:
        number = float(value)
    except ValueError:
        raise _expected(value, tp, where) from None
    if not math.isfinite(number):  # nan passes every "< 0" check; inf makes a run diverge on its first step
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    return number


def _to_sequence(value: Any, tp: Any, where: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise _expected(value, tp, where)
    args, is_list = typing.get_args(tp), typing.get_origin(tp) is list
    if is_list or (len(args) == 2 and args[1] is Ellipsis):
        items = [_coerce(v, args[0] if args else Any, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if is_list else tuple(items)
    if len(value) != len(args):
        raise ConfigError(f"{where}: expected {len(args)} values ({_type_name(tp)}), got {list(value)!r}")
    return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))


def _to_dict(value: Any, tp: Any, where: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise _expected(value, tp, where)
    key_t, val_t = typing.get_args(tp) or (Any, Any)
    return {_coerce(k, key_t, f"{where} key"): _coerce(v, val_t, f"{where}.{k}") for k, v in value.items()}


#: Field type (or generic origin) -> converter of a parsed value; each raises a ConfigError naming the key.
_CONVERTERS: dict[Any, typing.Callable[[Any, Any, str], Any]] = {
    type(None): _instance,
    bool: _instance,
    int: _to_int,
    float: _to_float,
    str: _instance,
    list: _to_sequence,
    tuple: _to_sequence,
    dict: _to_dict,
}


def _matches_exactly(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp) and not isinstance(value, bool)
    if tp is bool:
        return isinstance(value, bool)
    if tp in (int, float, str):
        return type(value) is tp
    if origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if origin is dict:
        return isinstance(value, dict)
    return False


def _unknown_key(key: str, section: str, valid: list[str], where: str) -> ConfigError:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    sec = f"in section {section!r}" if section else "at the top level"
    return ConfigError(f"{where}: unknown key {key!r} {sec}{hint}; valid keys: {', '.join(valid)}")


def _fill(obj: Any, data: dict[str, Any], prefix: str, locate: typing.Callable[[str], str]) -> None:
    """Set the fields of dataclass instance ``obj`` from the nested dict ``data`` (validated)."""
    hints = typing.get_type_hints(type(obj))
    valid = [f.name for f in dataclasses.fields(obj)]
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if not isinstance(key, str) or key not in hints:
            raise _unknown_key(str(key), prefix.rstrip("."), valid, locate(dotted))
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{locate(dotted)}: {dotted!r} is a section; expected a mapping of its keys "
                    f"({', '.join(f.name for f in dataclasses.fields(current))}), got {value!r}"
                )
            _fill(current, value, f"{dotted}.", locate)
        else:
            setattr(obj, key, _coerce(value, hints[key], locate(dotted)))


def _yaml_lines(text: str) -> dict[str, int]:
    """Dotted key -> 1-based line number in a YAML document (for error messages)."""
    lines: dict[str, int] = {}
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    dotted = f"{prefix}{k.value}"
                    lines[dotted] = k.start_mark.line + 1
                    walk(v, f"{dotted}.")

    if root is not None:
        walk(root, "")
    return lines


def config_from_dict(
    data: dict[str, Any] | None,
    *,
    source: str = "config",
    lines: dict[str, int] | None = None,
    base: TrainConfig | None = None,
) -> TrainConfig:
    """Build a validated :class:`TrainConfig` from a nested dict (the parsed YAML).

    Args:
        data: nested mapping of section -> key -> value.
        source: name of where the data came from, used in error messages (a file path).
        lines: dotted key -> line number in ``source`` (for error messages).
        base: start from this config instead of the code defaults (it is copied, not modified).

    Raises:
        ConfigError: unknown keys, values of the wrong type or semantically invalid settings.

    Example:
        >>> config_from_dict({"optim": {"lr": "fast"}}, source="x.yaml")
        Traceback (most recent call last):
        ...
        hiercls.train.config.ConfigError: x.yaml: optim.lr: expected float, got 'fast' (str)
    """
    cfg = copy.deepcopy(base) if base is not None else TrainConfig()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: a recipe must be a mapping of sections (model, data, optim, ...), got {type(data).__name__}"
        )
    lines = lines or {}

    def locate(dotted: str) -> str:
        line = lines.get(dotted)
        return f"{source}:{line}: {dotted}" if line else f"{source}: {dotted}"

    _fill(cfg, data, "", locate)
    validate_config(cfg, source=source)
    return cfg


def load_config(path: str | os.PathLike[str], overrides: list[str] | None = None) -> TrainConfig:
    """Read a YAML recipe, apply ``key=value`` overrides and validate.

    Raises:
        FileNotFoundError: the recipe does not exist.
        ConfigError: invalid YAML, a duplicate key, not UTF-8, unknown keys, wrong types, non-finite numbers (the
            message names the file and line).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"recipe {str(path)!r} not found" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        text = read_text(path, "recipe")
        data = load_yaml(text, str(path))  # refuses a key given twice (PyYAML alone keeps the last)
    except TextFileError as err:
        raise ConfigError(str(err)) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: invalid YAML: {getattr(err, 'problem', None) or err}") from None
    cfg = config_from_dict(data, source=str(path), lines=_yaml_lines(text))
    return apply_overrides(cfg, overrides or [])


def apply_overrides(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """Return a copy of ``cfg`` with ``section.key=value`` overrides applied (values parsed as YAML).

    ``model.head_options.alpha=0.5`` sets one key inside a dict field.

    Raises:
        ConfigError: malformed override, unknown key, or a value of the wrong type.
    """
    cfg = copy.deepcopy(cfg)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. optim.lr=1e-4")
        dotted, raw = item.split("=", 1)
        _set_dotted(cfg, dotted.strip(), raw)
    validate_config(cfg, source="--set")
    return cfg


def _set_dotted(cfg: TrainConfig, dotted: str, raw: str) -> None:
    """Set ``section.key`` (or ``section.key.sub...`` inside a free-form dict field) to the ``--set`` value ``raw``."""
    parts, where = dotted.split("."), f"--set {dotted}"
    obj: Any = cfg
    section = ""
    for i, part in enumerate(parts):
        hints = typing.get_type_hints(type(obj))
        if part not in hints:
            raise _unknown_key(part, section, [f.name for f in dataclasses.fields(obj)], where)
        current = getattr(obj, part)
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(current):
                keys = ", ".join(f.name for f in dataclasses.fields(current))
                raise ConfigError(f"{where}: {dotted!r} is a section; set one of its keys ({keys})")
            setattr(obj, part, _coerce(raw, hints[part], where, True))
        elif dataclasses.is_dataclass(current):
            obj, section = current, ".".join(parts[: i + 1])
        elif isinstance(current, dict):
            _set_free_form(current, parts[i + 1 :], raw, where)
            return
        else:
            raise ConfigError(f"{where}: {'.'.join(parts[: i + 1])!r} is a value, not a section")


def _set_free_form(target: dict[str, Any], keys: list[str], raw: str, where: str) -> None:
    """Keys inside a free-form dict field: the rest of the dotted path; the value parsed as YAML."""
    for sub in keys[:-1]:
        target = target.setdefault(sub, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{where}: {sub!r} is not a mapping")
    try:
        target[keys[-1]] = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        target[keys[-1]] = raw


def _validate_mixup(mix: MixupConfig, need: typing.Callable[[bool, str, str], None]) -> None:
    for key in ("mixup_alpha", "cutmix_alpha"):
        need(getattr(mix, key) >= 0, f"data.mixup.{key}", f"must be >= 0 (0: off), got {getattr(mix, key)}")
    for key in ("prob", "switch_prob"):
        need(0 <= getattr(mix, key) <= 1, f"data.mixup.{key}", f"must be in [0, 1], got {getattr(mix, key)}")
    need(mix.mode in ("batch", "pair", "elem"), "data.mixup.mode", f"must be batch, pair or elem, got {mix.mode!r}")
    need(0 <= mix.label_smoothing < 1, "data.mixup.label_smoothing", f"must be in [0, 1), got {mix.label_smoothing}")


def validate_config(cfg: TrainConfig, *, source: str = "config") -> None:
    """Check the settings that types alone cannot (ranges, required keys).

    Raises:
        ConfigError: naming the key and the constraint.
    """

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            raise ConfigError(f"{source}: {key}: {msg}")

    need(cfg.data.batch_size >= 1, "data.batch_size", f"must be >= 1, got {cfg.data.batch_size}")
    need(cfg.data.eval_batch_size is None or cfg.data.eval_batch_size >= 1, "data.eval_batch_size", "must be >= 1")
    need(cfg.data.num_workers >= 0, "data.num_workers", "must be >= 0")
    try:
        augment_options(cfg.data.augment)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    _validate_mixup(cfg.data.mixup, need)
    for key in ("max_train_samples", "max_eval_samples"):
        v = getattr(cfg.data, key)
        need(v is None or v >= 1, f"data.{key}", f"must be >= 1 or null, got {v}")
    for key, lr in (("lr", cfg.optim.lr), ("head_lr", cfg.optim.head_lr)):
        need(lr is None or lr > 0, f"optim.{key}", f"must be > 0{' or null' if key == 'head_lr' else ''}, got {lr}")
        need(
            lr is None or lr <= MAX_LR,
            f"optim.{key}",
            f"must be <= {MAX_LR:g} (a weight moves by about lr per step), got {lr}",
        )
    wd = cfg.optim.weight_decay
    need(wd >= 0, "optim.weight_decay", f"must be >= 0, got {wd}")
    need(wd <= MAX_LR, "optim.weight_decay", f"must be <= {MAX_LR:g}, got {wd}")
    need(all(0 <= b < 1 for b in cfg.optim.betas), "optim.betas", f"must be in [0, 1), got {cfg.optim.betas}")
    need(cfg.optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
    need(0 <= cfg.optim.warmup_ratio < 1, "optim.warmup_ratio", f"must be in [0, 1), got {cfg.optim.warmup_ratio}")
    need(0 <= cfg.optim.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]")
    need(cfg.optim.grad_accum >= 1, "optim.grad_accum", f"must be >= 1, got {cfg.optim.grad_accum}")
    need(
        cfg.optim.clip_grad_norm is None or cfg.optim.clip_grad_norm > 0, "optim.clip_grad_norm", "must be > 0 or null"
    )
    _validate_optim_extras(cfg, need)
    need(cfg.schedule.epochs >= 1, "schedule.epochs", f"must be >= 1, got {cfg.schedule.epochs}")
    need(cfg.schedule.max_steps is None or cfg.schedule.max_steps >= 1, "schedule.max_steps", "must be >= 1 or null")
    need(
        cfg.schedule.max_steps_this_run is None or cfg.schedule.max_steps_this_run >= 1,
        "schedule.max_steps_this_run",
        "must be >= 1 or null",
    )
    need(len(cfg.eval.decoders) >= 1, "eval.decoders", "needs at least one decoder (e.g. [argmax_leaf])")
    labels: dict[str, str] = {}
    for spec in cfg.eval.decoders:
        try:
            label = parse_decoder(spec).label
        except ValueError as err:
            raise ConfigError(f"{source}: eval.decoders: {err}") from None
        need(label not in labels, "eval.decoders", f"{spec!r} and {labels.get(label)!r} are the same decoder")
        labels[label] = spec
    need(cfg.eval.every >= 0, "eval.every", "must be >= 0")
    need(cfg.eval.ece_bins >= 1, "eval.ece_bins", f"must be >= 1, got {cfg.eval.ece_bins}")
    alpha = cfg.eval.conformal
    need(alpha is None or 0 < alpha < 1, "eval.conformal", f"must be an alpha in (0, 1) or null, got {alpha}")
    need(
        alpha is None or (cfg.data.eval_split is not None and cfg.data.eval_split != cfg.study.split),
        "eval.conformal",
        f"calibrates on data.eval_split and checks on study.split: they must be two splits, got "
        f"{cfg.data.eval_split!r} and {cfg.study.split!r}",
    )
    need(
        bool(cfg.run.out_dir.strip()),
        "run.out_dir",
        f"must name a folder for the run, e.g. runs/{{name}}, got {cfg.run.out_dir!r} (an unset variable?)",
    )
    need(cfg.run.log_every >= 1, "run.log_every", "must be >= 1")
    need(cfg.run.save_every_steps is None or cfg.run.save_every_steps >= 1, "run.save_every_steps", "must be >= 1")
    need(cfg.run.threads is None or cfg.run.threads >= 1, "run.threads", "must be >= 1")
    loggers = cfg.run.loggers
    need(len(set(loggers)) == len(loggers), "run.loggers", f"must be distinct, got {loggers}")
    need(
        "jsonl" in loggers,
        "run.loggers",
        f"must include jsonl (metrics.jsonl is what resumption, results.json and curves.png read), got {loggers}",
    )
    dev = cfg.run.device
    need(
        dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()),
        "run.device",
        f"expected auto, cpu, cuda or cuda:<index>, got {dev!r}",
    )
    study = cfg.study
    need(len(set(study.seeds)) == len(study.seeds), "study.seeds", f"must be distinct, got {study.seeds}")
    need(study.bootstrap >= 100 or not study.seeds, "study.bootstrap", f"must be >= 100, got {study.bootstrap}")
    need(0 < study.confidence < 1, "study.confidence", f"must be in (0, 1), got {study.confidence}")
    need(study.max_samples is None or study.max_samples >= 1, "study.max_samples", "must be >= 1 or null")
    heads = {cfg.model.head, *cfg.compare_heads}
    for head, settings in study.head_settings.items():
        need(head in heads, f"study.head_settings.{head}", f"is not a head of this recipe ({', '.join(sorted(heads))})")
        for key in settings:
            need(
                key.split(".", 1)[0] in ("optim", "schedule", "data", "model") and "." in key,
                f"study.head_settings.{head}.{key}",
                "must be a dotted key of the optim, schedule, data or model section (e.g. optim.head_lr)",
            )
    need(
        bool(cfg.name.strip()) and "/" not in cfg.name,
        "name",
        f"must be a non-empty name without '/', got {cfg.name!r}",
    )


def _validate_optim_extras(cfg: TrainConfig, need: typing.Callable[[bool, str, str], None]) -> None:
    """The optimizer's, schedule's, EMA's and teacher's ranges."""
    o, s, e = cfg.optim, cfg.sched, cfg.model.ema
    need(bool(o.name.strip()), "optim.name", "must name an optimizer, e.g. adamw, sgd, lamb, lars")
    need(o.momentum is None or 0 <= o.momentum < 1, "optim.momentum", f"must be in [0, 1) or null, got {o.momentum}")
    need(
        o.layer_decay is None or 0 < o.layer_decay <= 1,
        "optim.layer_decay",
        f"must be in (0, 1] or null, got {o.layer_decay}",
    )
    need(s.decay_epochs > 0, "sched.decay_epochs", f"must be > 0, got {s.decay_epochs}")
    need(all(m > 0 for m in s.decay_milestones), "sched.decay_milestones", f"must be > 0, got {s.decay_milestones}")
    need(
        s.name != "multistep" or bool(s.decay_milestones),
        "sched.decay_milestones",
        "multistep needs epochs, e.g. [30, 60]",
    )
    t = cfg.model.teacher
    need(math.isfinite(t.weight) and t.weight >= 0, "model.teacher.weight", f"must be finite and >= 0, got {t.weight}")
    need(s.decay_rate > 0, "sched.decay_rate", f"must be > 0, got {s.decay_rate}")
    need(0 <= s.warmup_lr_ratio <= 1, "sched.warmup_lr_ratio", f"must be in [0, 1], got {s.warmup_lr_ratio}")
    need(0 < s.pct_start < 1, "sched.pct_start", f"must be in (0, 1), got {s.pct_start}")
    for key in ("div_factor", "final_div_factor"):
        need(getattr(s, key) > 0, f"sched.{key}", f"must be > 0, got {getattr(s, key)}")
    need(e.decay is None or 0 < e.decay < 1, "model.ema.decay", f"must be in (0, 1) or null, got {e.decay}")
    need(
        e.decay is None or e.eval or e.best_on == "raw",
        "model.ema.eval",
        "best_on: ema needs the EMA evaluated (eval: true), or set best_on: raw",
    )


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """The config as plain nested dicts/lists (tuples become lists), ready for YAML or JSON."""

    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return plain(dataclasses.asdict(cfg))


def save_config(cfg: TrainConfig, path: str | os.PathLike[str]) -> None:
    """Write the resolved config as YAML (re-loadable with :func:`load_config`), atomically."""
    with atomic_write(path, encoding="utf-8") as f:
        f.write(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
