"""``run.loggers``: TensorBoard gets what metrics.jsonl gets (also across a resume); missing packages are refused.

Reference: ``metrics.jsonl``, the run's own log, read back record by record; TensorBoard's files are read with
TensorBoard's own ``EventAccumulator``.
"""

from __future__ import annotations

import json
import os
import socket
import typing
from pathlib import Path

import pytest
import torch

from hiercls.train import loggers as loggers_module
from hiercls.train.config import ConfigError, Logger, apply_overrides, config_from_dict
from hiercls.train.loggers import LOGGERS, scalars
from hiercls.train.loop import train

TAXONOMY = "root animal\nroot vehicle\nanimal cat\nanimal dog\nvehicle car\nvehicle bike\n"


def _recipe(tmp: Path, out: str, *overrides: str):
    (tmp / "tax.txt").write_text(TAXONOMY, encoding="utf-8")
    cfg = config_from_dict(
        {
            "taxonomy": str(tmp / "tax.txt"),
            "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
            "data": {
                "dataset": "synthetic",
                "batch_size": 8,
                "options": {"kind": "image", "image_size": 16, "train_samples": 24, "val_samples": 8},
            },
            "schedule": {"epochs": 2},
            "eval": {"decoders": ["argmax_leaf", "optimal_hf1"]},
            "run": {"out_dir": str(tmp / out), "progress": False, "plot": False, "log_every": 1},
        }
    )
    return apply_overrides(cfg, list(overrides))


def _events(logdir: Path) -> dict[str, dict[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    out = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
    for tag, values in out.items():
        assert len(values) == len(acc.Scalars(tag)), f"{tag}: a step shown twice"
    return out


def _jsonl(run: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for tag, value in scalars(record).items():
            assert record["step"] not in out.setdefault(tag, {}), (tag, record["step"])  # each step once
            out[tag][record["step"]] = value
    return out


def test_logger_names_are_the_recipe_schema():
    assert tuple(LOGGERS) == typing.get_args(Logger)


def test_tensorboard_gets_every_record_of_metrics_jsonl_also_across_a_resume(tmp_path: Path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    loggers = "run.loggers=[jsonl, tensorboard]"
    part = train(_recipe(tmp_path, "run", loggers, "schedule.max_steps_this_run=2"))
    assert part["interrupted"] and part["step"] == 2
    # A killed run logged step 3 after its last checkpoint (step 2); the resumed run logs step 3 again.
    with SummaryWriter(str(tmp_path / "run" / "tensorboard")) as stale:
        stale.add_scalar("train/loss", 999.0, global_step=3)
    final = train(_recipe(tmp_path, "run", loggers))
    assert final["step"] == 6 and not final["interrupted"]

    expected = _jsonl(tmp_path / "run")
    got = _events(tmp_path / "run" / "tensorboard")
    assert set(expected) <= set(got)
    assert "eval/optimal_hf1/hF1_micro" in expected and sorted(expected["train/loss"]) == [1, 2, 3, 4, 5, 6]
    for tag, values in expected.items():
        assert got[tag].keys() == values.keys(), tag
        for step, value in values.items():
            assert got[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-7), (tag, step)  # float32 events

    # Starting over removes the previous run's event files with its other outputs.
    train(_recipe(tmp_path, "run", loggers, "run.resume=false", "schedule.max_steps=1"))
    assert sorted(_events(tmp_path / "run" / "tensorboard")["train/loss"]) == [1]


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow"])
def test_a_logger_without_its_package_is_refused_before_training(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    real = loggers_module.importlib.util.find_spec
    monkeypatch.setattr(
        loggers_module.importlib.util, "find_spec", lambda pkg, *a: None if pkg == LOGGERS[name] else real(pkg, *a)
    )
    with pytest.raises(ConfigError, match=rf"run.loggers: '{name}' needs .* pip install 'hiercls\[{name}\]'"):
        train(_recipe(tmp_path, "run", f"run.loggers=[jsonl, {name}]"))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_logger_config_errors(tmp_path: Path):
    with pytest.raises(ConfigError, match="must include jsonl"):
        _recipe(tmp_path, "run", "run.loggers=[tensorboard]")
    with pytest.raises(ConfigError, match="expected one of 'jsonl', 'tensorboard', 'wandb', 'mlflow'"):
        _recipe(tmp_path, "run", "run.loggers=[jsonl, tensorbord]")
    with pytest.raises(ConfigError, match="must be distinct"):
        _recipe(tmp_path, "run", "run.loggers=[jsonl, jsonl]")


def _ddp_worker(rank: int, world: int, port: int, cfg) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    train(cfg)


def test_under_ddp_only_rank_0_logs(tmp_path: Path):
    """Two gloo processes: one event file, each step once in metrics.jsonl and in TensorBoard."""
    pytest.importorskip("tensorboard")
    cfg = _recipe(tmp_path, "ddp", "run.loggers=[jsonl, tensorboard]")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_ddp_worker, args=(2, port, cfg), nprocs=2, join=True)
    assert len(list((tmp_path / "ddp" / "tensorboard").iterdir())) == 1  # rank 1 opened no writer
    expected = _jsonl(tmp_path / "ddp")  # asserts each step once
    got = _events(tmp_path / "ddp" / "tensorboard")
    assert sorted(expected["train/loss"]) == [1, 2, 3, 4, 5, 6]
    assert {tag: sorted(v) for tag, v in got.items()} == {tag: sorted(v) for tag, v in expected.items()}
