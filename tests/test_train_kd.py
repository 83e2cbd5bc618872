"""Semantic knowledge distillation from a trained teacher (``model.teacher``, Ridnik et al. 2021)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hiercls.data import build_dataset, image_transform
from hiercls.models import create_model
from hiercls.taxonomy import Taxonomy, load_taxonomy
from hiercls.train.checkpoint import seed_everything
from hiercls.train.config import ConfigError, TrainConfig, config_from_dict
from hiercls.train.inference import load_trained_model
from hiercls.train.loop import build_model, train

EDGES = [("root", "animal"), ("root", "vehicle"), ("animal", "cat"), ("animal", "dog"), ("vehicle", "car")]


@pytest.fixture(scope="module")
def taxonomy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tax") / "tax.txt"
    path.write_text("".join(f"{a} {b}\n" for a, b in EDGES), encoding="utf-8")
    return path


def recipe(taxonomy_file: Path, out: Path, steps: int, teacher: dict | None = None, head: str = "semantic_softmax"):
    """A tiny ViT on synthetic 16 px images (the fastest training set-up of tests/test_train.py)."""
    model = {"backbone": "timm:test_vit", "head": head, "backbone_options": {"img_size": 16}}
    if teacher is not None:
        model["teacher"] = teacher
    return config_from_dict(
        {
            "taxonomy": str(taxonomy_file),
            "model": model,
            "data": {
                "dataset": "synthetic",
                "batch_size": 8,
                "shuffle": False,
                "augment": False,
                "options": {"kind": "image", "image_size": 16, "train_samples": 16, "val_samples": 8},
            },
            "optim": {"lr": 3e-3, "warmup_steps": 0},
            "schedule": {"max_steps": steps},
            "eval": {"decoders": ["argmax_leaf"]},
            "run": {"out_dir": str(out), "progress": False, "plot": False, "seed": 5},
        }
    )


@pytest.fixture(scope="module")
def teacher_run(taxonomy_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("teacher") / "run"
    cfg = recipe(taxonomy_file, out, steps=2)
    cfg.run.seed = 11  # a teacher that differs from the student's initialisation
    train(cfg)
    return out


def _student(taxonomy_file: Path, out: Path, teacher: dict | None) -> tuple[list[float], dict[str, torch.Tensor]]:
    losses: list[float] = []
    train(recipe(taxonomy_file, out, steps=2, teacher=teacher), callbacks=[lambda r: losses.append(r["loss"])])
    return losses, load_file(str(out / "checkpoints" / "last" / "model.safetensors"))


def _first_step_by_hand(cfg: TrainConfig, teacher_run: Path) -> tuple[float, float]:
    """``(head loss, KD loss)`` of the student's initial weights on the first (unshuffled) batch, built here."""
    taxonomy = load_taxonomy(cfg.taxonomy)
    seed_everything(cfg.run.seed)
    student = build_model(cfg, taxonomy)
    transform = image_transform(student, train=True, image_size=16, augment=False)
    dataset = build_dataset("synthetic", "train", taxonomy, cfg.data.options, transform)
    inputs, targets = torch.utils.data.default_collate([dataset[i] for i in range(8)])
    teacher, _, _ = load_trained_model(teacher_run, which="last")
    with torch.no_grad():
        output = student(inputs)
        kd = student.head.distillation_loss(output, teacher(inputs), distance=cfg.model.teacher.distance)
        return float(student.loss(output, targets)), float(kd)


@pytest.mark.parametrize("distance", ["mse", "kl"])
def test_kd_adds_weight_times_distillation_loss(
    taxonomy_file: Path, teacher_run: Path, tmp_path: Path, distance: str
) -> None:
    """The first step's loss is head loss + weight * KD computed by hand on the same batch; weight 0 trains
    bitwise like the run without a teacher, weight > 0 trains other weights."""
    teacher = {"path": str(teacher_run), "weight": 0.5, "distance": distance}
    head, kd = _first_step_by_hand(recipe(taxonomy_file, tmp_path / "x", 2, teacher), teacher_run)
    assert kd > 1e-6  # a teacher of another seed disagrees with the student's initial output
    kd_loss, kd_weights = _student(taxonomy_file, tmp_path / "kd", teacher)
    assert kd_loss[0] == pytest.approx(head + 0.5 * kd, rel=1e-5)
    plain_loss, plain = _student(taxonomy_file, tmp_path / "plain", None)
    assert plain_loss[0] == pytest.approx(head, rel=1e-5)
    assert any(not torch.equal(kd_weights[k], plain[k]) for k in plain)
    if distance == "mse":
        zero_loss, zero = _student(taxonomy_file, tmp_path / "w0", {**teacher, "weight": 0.0})
        assert zero_loss == plain_loss
        assert all(torch.equal(zero[k], plain[k]) for k in plain)


def test_kd_teacher_refusals(taxonomy_file: Path, teacher_run: Path, tmp_path: Path) -> None:
    tax = Taxonomy(EDGES)
    flat = create_model("timm:test_vit", tax, head="flat", img_size=16).save_pretrained(tmp_path / "flat")
    other = Taxonomy([*EDGES, ("vehicle", "bus")])
    foreign = create_model("timm:test_vit", other, head="semantic_softmax", img_size=16)
    foreign = foreign.save_pretrained(tmp_path / "foreign")
    cases = [
        ({"path": str(flat)}, "semantic_softmax", "the teacher's head must be semantic_softmax, got 'flat'"),
        ({"path": str(foreign)}, "semantic_softmax", "the teacher's taxonomy .* is not the run's"),
        ({"path": str(tmp_path / "missing")}, "semantic_softmax", "expected a hiercls run, study or model folder"),
        ({"path": str(teacher_run)}, "flat", "distillation needs model.head semantic_softmax, got 'flat'"),
    ]
    for teacher, head, message in cases:
        cfg = recipe(taxonomy_file, tmp_path / f"run_{len(message)}", steps=1, teacher=teacher, head=head)
        with pytest.raises(ConfigError, match=f"model.teacher.path: {re.escape(repr(teacher['path']))}.*{message}"):
            train(cfg)


def test_kd_config_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"model.teacher.weight: must be finite and >= 0, got -1"):
        config_from_dict({"model": {"teacher": {"weight": -1.0}}})
    with pytest.raises(ConfigError, match=r"model.teacher.distance: expected one of 'mse', 'kl'"):
        config_from_dict({"model": {"teacher": {"distance": "l1"}}})


def test_kd_resume_is_exact_and_refuses_a_changed_teacher(
    taxonomy_file: Path, teacher_run: Path, tmp_path: Path
) -> None:
    """The teacher is reloaded on resume: bitwise the uninterrupted run; other weights at its path are refused."""
    teach = tmp_path / "teacher"
    shutil.copytree(teacher_run / "checkpoints" / "last", teach)
    kd = {"path": str(teach), "weight": 0.5}
    train(recipe(taxonomy_file, tmp_path / "ref", 3, kd))
    cut = recipe(taxonomy_file, tmp_path / "cut", 3, kd)
    cut.schedule.max_steps_this_run = 1
    assert train(cut)["step"] == 1
    shutil.rmtree(teach)
    create_model("timm:test_vit", load_taxonomy(str(taxonomy_file)), img_size=16).save_pretrained(teach)
    with pytest.raises(ConfigError, match=r"resume\.pt: saved with model.teacher weights [0-9a-f]+ but model.teacher"):
        train(recipe(taxonomy_file, tmp_path / "cut", 3, kd))
    shutil.rmtree(teach)
    shutil.copytree(teacher_run / "checkpoints" / "last", teach)
    assert train(recipe(taxonomy_file, tmp_path / "cut", 3, kd))["step"] == 3
    a = load_file(str(tmp_path / "ref" / "checkpoints" / "last" / "model.safetensors"))
    b = load_file(str(tmp_path / "cut" / "checkpoints" / "last" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
