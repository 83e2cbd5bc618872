"""Where a run's log records go: ``run.loggers`` of the recipe, rank 0 only.

Every record the loop logs (``{"type": "train" | "eval", "step", "epoch", ...}``, one per ``run.log_every`` steps
and one per evaluation) goes to each logger of ``run.loggers``:

* ``jsonl`` (the default): ``<out_dir>/metrics.jsonl``, one JSON record per line, exactly as logged; what
  ``curves.png``, resumption and :meth:`~hiercls.train.checkpoint.RunFolder.evaluation_at` read.
* ``tensorboard``: event files in ``<out_dir>/tensorboard`` (``tensorboard --logdir runs``), each number of a
  record as a scalar ``<type>/<key>`` (``train/loss``, ``eval/optimal_hf1/hF1_micro``) at its step. A resumed
  run hides what the killed run logged after its checkpoint (``purge_step``), as ``metrics.jsonl`` drops it.
  Needs the ``tensorboard`` package (``pip install 'hiercls[tensorboard]'``).
* ``wandb``: a Weights & Biases run named after the recipe, with the resolved config, the same scalars.
  Needs ``pip install 'hiercls[wandb]'`` (and a login or ``WANDB_MODE=offline``).
* ``mlflow``: an MLflow run named after the recipe (``MLFLOW_TRACKING_URI`` says where), the config flattened
  into parameters, the same scalars as metrics. Needs ``pip install 'hiercls[mlflow]'``.

A logger whose package is missing is refused before training starts (:func:`check_loggers`).

Example:
    >>> import tempfile
    >>> from hiercls.train.config import config_from_dict
    >>> cfg = config_from_dict({"run": {"out_dir": tempfile.mkdtemp(), "loggers": ["jsonl"]}})
    >>> with open_loggers(cfg, cfg.out_dir, resume_step=None) as log:
    ...     log({"type": "train", "step": 1, "epoch": 0, "loss": 0.5})
    >>> (cfg.out_dir / "metrics.jsonl").read_text()
    '{"type": "train", "step": 1, "epoch": 0, "loss": 0.5}\\n'
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hiercls.train.config import ConfigError, TrainConfig, config_to_dict

__all__ = ["LOGGERS", "check_loggers", "open_loggers", "scalars"]

#: The names ``run.loggers`` accepts, and the package each needs (``None``: nothing beyond hiercls).
LOGGERS: dict[str, str | None] = {"jsonl": None, "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}

Log = Callable[[Mapping[str, Any]], None]


def check_loggers(names: list[str]) -> None:
    """Refuse an unknown logger, or one whose package is not installed (naming the extra that installs it).

    Example:
        >>> check_loggers(["jsonl"])
        >>> try:
        ...     check_loggers(["tensorbord"])
        ... except ConfigError as err:
        ...     print(err)
        run.loggers: unknown logger 'tensorbord'; valid: jsonl, tensorboard, wandb, mlflow
    """
    for name in names:
        if name not in LOGGERS:
            raise ConfigError(f"run.loggers: unknown logger {name!r}; valid: {', '.join(LOGGERS)}")
        package = LOGGERS[name]
        if package is not None and importlib.util.find_spec(package) is None:
            raise ConfigError(
                f"run.loggers: {name!r} needs the {package!r} package, which is not installed: "
                f"pip install 'hiercls[{name}]' (or remove {name} from run.loggers)"
            )


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a log record, keyed ``<type>/<key>`` (step, epoch and the type itself left out).

    Example:
        >>> scalars({"type": "eval", "step": 4, "epoch": 1, "argmax_leaf/accuracy": 0.5, "best_key": "x",
        ...          "argmax_leaf/per_level_accuracy": [1.0, 0.5], "eval_loss": float("nan")})
        {'eval/argmax_leaf/accuracy': 0.5}
    """
    kind = record.get("type", "log")
    return {
        f"{kind}/{k}": float(v)
        for k, v in record.items()
        if k not in ("type", "step", "epoch")
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


@contextlib.contextmanager
def open_loggers(cfg: TrainConfig, out_dir: Path, *, resume_step: int | None) -> Iterator[Log]:
    """A function that sends one record to every logger of ``cfg.run.loggers``; they are closed on exit.

    Call it on rank 0 only. ``resume_step``: the step a resumed run restarts from (``None``: a fresh run).
    """
    check_loggers(cfg.run.loggers)
    with contextlib.ExitStack() as stack:
        sinks = [stack.enter_context(_OPENERS[name](cfg, out_dir, resume_step)) for name in cfg.run.loggers]

        def log(record: Mapping[str, Any]) -> None:
            for sink in sinks:
                sink(record)

        yield log


@contextlib.contextmanager
def _jsonl(cfg: TrainConfig, out_dir: Path, resume_step: int | None) -> Iterator[Log]:
    with (out_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:

        def log(record: Mapping[str, Any]) -> None:
            f.write(json.dumps(record) + "\n")
            f.flush()  # a killed run keeps every record logged before its checkpoint

        yield log


@contextlib.contextmanager
def _tensorboard(cfg: TrainConfig, out_dir: Path, resume_step: int | None) -> Iterator[Log]:
    from torch.utils.tensorboard import SummaryWriter  # needs the optional tensorboard package

    # purge_step hides the events a killed run wrote after the checkpoint this run resumes from.
    writer = SummaryWriter(str(out_dir / "tensorboard"), purge_step=None if resume_step is None else resume_step + 1)
    try:

        def log(record: Mapping[str, Any]) -> None:
            for key, value in scalars(record).items():
                writer.add_scalar(key, value, global_step=int(record.get("step", 0)))
            writer.flush()

        yield log
    finally:
        writer.close()


@contextlib.contextmanager
def _wandb(cfg: TrainConfig, out_dir: Path, resume_step: int | None) -> Iterator[Log]:
    import wandb  # optional heavy dependency (hiercls[wandb])

    run = wandb.init(name=cfg.name, dir=str(out_dir), config=config_to_dict(cfg), resume="allow")
    try:
        yield lambda record: run.log(scalars(record), step=int(record.get("step", 0)))
    finally:
        run.finish()


@contextlib.contextmanager
def _mlflow(cfg: TrainConfig, out_dir: Path, resume_step: int | None) -> Iterator[Log]:
    import mlflow  # optional heavy dependency (hiercls[mlflow])

    with mlflow.start_run(run_name=cfg.name):
        mlflow.log_params(_flat(config_to_dict(cfg)))
        yield lambda record: mlflow.log_metrics(scalars(record), step=int(record.get("step", 0)))


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


_OPENERS: dict[str, Callable[[TrainConfig, Path, int | None], contextlib.AbstractContextManager[Log]]] = {
    "jsonl": _jsonl,
    "tensorboard": _tensorboard,
    "wandb": _wandb,
    "mlflow": _mlflow,
}
