"""Training: YAML recipes -> :class:`TrainConfig` -> :func:`train` (single process, or DDP under torchrun).

Example:
    >>> from hiercls.train import load_config, train  # doctest: +SKIP
    >>> results = train(load_config("recipes/quickstart.yaml", ["schedule.epochs=2"]))  # doctest: +SKIP
"""

from hiercls.evaluation.model import evaluate_model
from hiercls.models.inference import predict, write_predictions
from hiercls.train.config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    ScheduleConfig,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    save_config,
)
from hiercls.train.distributed import DistInfo, cleanup_distributed, init_distributed, is_main_process
from hiercls.train.inference import load_trained_model
from hiercls.train.loop import StopTraining, build_model, build_optimizer, cosine_schedule, train
from hiercls.train.report import format_results, run_recipe
from hiercls.train.study import format_study, run_study

__all__ = [
    "ConfigError",
    "DataConfig",
    "DistInfo",
    "EvalConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "ScheduleConfig",
    "StopTraining",
    "TrainConfig",
    "apply_overrides",
    "build_model",
    "build_optimizer",
    "cleanup_distributed",
    "config_from_dict",
    "config_to_dict",
    "cosine_schedule",
    "evaluate_model",
    "format_results",
    "format_study",
    "init_distributed",
    "is_main_process",
    "load_config",
    "load_trained_model",
    "predict",
    "run_recipe",
    "run_study",
    "save_config",
    "train",
    "write_predictions",
]
