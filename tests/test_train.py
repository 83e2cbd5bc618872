"""Training loop: one step of every head (tiny timm and HF models), resume equality, DDP equality, configs.

References: an uninterrupted run is the reference for resume (bitwise-equal weights); a single process on
the same global batches is the reference for 2-process DDP (gloo); the cosine schedule and config errors
are checked against hand-written values.
"""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path

import pytest
import torch
import yaml

from hiercls.train.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
)
from hiercls.train.loop import StopTraining, cosine_schedule, train

TAXONOMY_LINES = [
    "root animal",
    "root vehicle",
    "animal cat",
    "animal dog",
    "animal bird",
    "vehicle car",
    "vehicle bike",
    "bike ebike",
    "bike pushbike",
]


@pytest.fixture(scope="module")
def taxonomy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tax") / "tax.txt"
    path.write_text("\n".join(TAXONOMY_LINES) + "\n", encoding="utf-8")
    return path


def image_recipe(taxonomy_file: Path, out_dir: Path, **overrides: object) -> TrainConfig:
    """A tiny ViT (no batch norm, no dropout: DDP and resume are exactly comparable) on synthetic images."""
    data = {
        "taxonomy": str(taxonomy_file),
        "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
        "data": {
            "dataset": "synthetic",
            "batch_size": 8,
            "options": {"kind": "image", "image_size": 16, "train_samples": 22, "val_samples": 11},
        },
        "optim": {"lr": 3e-3, "warmup_steps": 2, "grad_accum": 1},
        "schedule": {"epochs": 2},
        "eval": {"decoders": ["argmax_leaf"]},
        "run": {"out_dir": str(out_dir), "progress": False, "plot": False, "seed": 3},
    }
    cfg = config_from_dict(data)
    return apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])


def read_weights(run_dir: Path, which: str = "last") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoints" / which / "model.safetensors"))


# ---------------------------------------------------------------------------------------------- schedule
def test_cosine_schedule_hand_values() -> None:
    # warmup 2 of 10 steps: 1/2, 2/2, then cos from 1 (step 2) to 0 (step 10).
    assert cosine_schedule(0, 10, 2) == pytest.approx(0.5)
    assert cosine_schedule(1, 10, 2) == pytest.approx(1.0)
    assert cosine_schedule(2, 10, 2) == pytest.approx(1.0)
    assert cosine_schedule(6, 10, 2) == pytest.approx(0.5)
    assert cosine_schedule(10, 10, 2) == pytest.approx(0.0, abs=1e-12)
    assert cosine_schedule(4, 10, 0, min_ratio=0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.4)))


# ---------------------------------------------------------------------------------------------- configs
def test_yaml_unknown_key_names_file_line_and_suggestion(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  backbone: timm:test_vit\noptim:\n  lr: 0.1\n  wieght_decay: 0.1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_config(recipe)
    msg = str(err.value)
    assert f"{recipe}:5" in msg and "'wieght_decay'" in msg and "did you mean 'weight_decay'" in msg
    assert "valid keys: lr, head_lr, weight_decay, betas" in msg


def test_yaml_errors(tmp_path: Path) -> None:
    bad_type = tmp_path / "t.yaml"
    bad_type.write_text("data:\n  batch_size: many\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"t.yaml:2: data.batch_size: expected int, got 'many'"):
        load_config(bad_type)
    section = tmp_path / "s.yaml"
    section.write_text("optim: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"'optim' is a section"):
        load_config(section)
    broken = tmp_path / "b.yaml"
    broken.write_text("optim:\n  lr: [1,\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"b.yaml:\d+: invalid YAML"):
        load_config(broken)
    top = tmp_path / "l.yaml"
    top.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(top)
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml"):
        load_config(tmp_path / "nope.yaml")
    rng = tmp_path / "r.yaml"
    rng.write_text("optim:\n  grad_accum: 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"optim\.grad_accum: must be >= 1"):
        load_config(rng)


def test_overrides_precedence_and_coercion(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: demo\noptim:\n  lr: 0.1\n  weight_decay: 0.5\n", encoding="utf-8")
    cfg = load_config(
        recipe,
        [
            "optim.lr=1e-4",
            "optim.betas=[0.8, 0.9]",
            "run.resume=false",
            "eval.decoders=[argmax_leaf, optimal_hf1]",
            "model.head_options.alpha=0.25",
            "schedule.max_steps=null",
            "run.precision=bf16",
            "name=007",
        ],
    )
    assert cfg.optim.lr == 1e-4  # CLI beats YAML
    assert cfg.optim.weight_decay == 0.5  # YAML beats the default
    assert cfg.optim.eps == TrainConfig().optim.eps  # default kept
    assert cfg.optim.betas == (0.8, 0.9) and cfg.run.resume is False and cfg.name == "007"
    assert cfg.eval.decoders == ["argmax_leaf", "optimal_hf1"] and cfg.model.head_options == {"alpha": 0.25}
    assert load_config(recipe, ["run.resume=auto"]).run.resume == "auto"
    assert load_config(recipe, ["run.resume=true"]).run.resume is True
    cases = {
        "optim.lrr=1": "unknown key 'lrr' in section 'optim' (did you mean 'lr'?)",
        "optimm.lr=1": "unknown key 'optimm' at the top level (did you mean 'optim'?)",
        "optim.lr=fast": "--set optim.lr: expected float, got 'fast'",
        "run.precision=fp8": "expected one of 'auto', 'fp32', 'bf16', 'fp16', got 'fp8'",
        "optim.grad_accum=1.5": "expected int",
        "data.shuffle=maybe": "expected bool",
        "optim.betas=[0.9]": "expected 2 values",
        "optim": "expected KEY=VALUE",
        "optim.lr.x=1": "'optim.lr' is a value, not a section",
        "run.device=tpu": "run.device: expected auto, cpu, cuda or cuda:<index>",
        "optim.lr=-1": "optim.lr: must be > 0",
    }
    for item, expected in cases.items():
        with pytest.raises(ConfigError) as err:
            load_config(recipe, [item])
        assert expected in str(err.value), (item, str(err.value))


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = config_from_dict({"name": "x", "optim": {"betas": [0.5, 0.6]}, "compare_heads": ["flat"]})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(cfg)), encoding="utf-8")
    assert load_config(path) == cfg


def test_every_recipe_parses() -> None:
    recipes = sorted((Path(__file__).parent.parent / "recipes").glob("*.yaml"))
    assert {p.name for p in recipes} >= {
        "quickstart.yaml",
        "fashion_mnist_efficientnet.yaml",
        "transhp_vit.yaml",
        "nested_regions_3d.yaml",
        "imagenet21k_semantic_softmax.yaml",
    }
    from hiercls.data import list_datasets
    from hiercls.decode import parse_decoder

    for path in recipes:
        cfg = load_config(path)
        assert cfg.model.backbone and cfg.data.dataset in list_datasets(), path
        assert len({parse_decoder(d).label for d in cfg.eval.decoders}) == len(cfg.eval.decoders), path


def test_bad_configs_fail_clearly_at_train_time(taxonomy_file: Path, tmp_path: Path) -> None:
    from hiercls.taxonomy import TaxonomyError

    with pytest.raises(ConfigError, match=r"model\.backbone: required"):
        train(image_recipe(taxonomy_file, tmp_path / "a", **{"model.backbone": "''"}))
    with pytest.raises((TaxonomyError, FileNotFoundError), match="no_such_taxonomy"):
        train(image_recipe(taxonomy_file, tmp_path / "b", taxonomy="no_such_taxonomy"))
    with pytest.raises((ValueError, KeyError), match="no_such_head"):
        train(image_recipe(taxonomy_file, tmp_path / "c", **{"model.head": "no_such_head"}))
    with pytest.raises(ValueError, match="unknown data set 'synthetik' \\(did you mean 'synthetic'\\?\\)"):
        train(image_recipe(taxonomy_file, tmp_path / "d", **{"data.dataset": "synthetik"}))
    with pytest.raises(ValueError, match=r"data\.options: unknown option\(s\) 'colour'"):
        train(image_recipe(taxonomy_file, tmp_path / "e", **{"data.options.colour": "red"}))
    with pytest.raises(ConfigError, match="unknown decoder 'argmax_leef'"):
        train(image_recipe(taxonomy_file, tmp_path / "f", **{"eval.decoders": "[argmax_leef]"}))
    with pytest.raises(ConfigError, match=r"run\.resume: true but"):
        train(image_recipe(taxonomy_file, tmp_path / "g", **{"run.resume": "true"}))
    with pytest.raises(ConfigError, match=r"run\.precision: fp16 needs a CUDA device"):
        train(image_recipe(taxonomy_file, tmp_path / "h", **{"run.precision": "fp16", "run.device": "cpu"}))


# ---------------------------------------------------------------------------------------------- one step per head
def _one_step(cfg: TrainConfig) -> dict:
    cfg = apply_overrides(cfg, ["schedule.max_steps=1", "data.options.train_samples=8", "data.options.val_samples=6"])
    result = train(cfg)
    assert result["step"] == 1 and not result["interrupted"]
    assert math.isfinite(result["train_loss"])
    assert 0.0 <= result["argmax_leaf/hF1_micro"] <= 1.0
    return result


def _heads() -> list[str]:
    from hiercls.heads import get_head_class, list_heads

    return [h for h in list_heads() if not get_head_class(h).supports_dense or h != "nested_sigmoid"]


@pytest.mark.parametrize("head", [*_heads(), "transhp"])
def test_one_step_every_head_tiny_timm(head: str, taxonomy_file: Path, tmp_path: Path) -> None:
    _one_step(image_recipe(taxonomy_file, tmp_path, **{"model.head": head}))


@pytest.mark.parametrize("head", [*_heads(), "transhp"])
def test_one_step_every_head_tiny_hf(head: str, taxonomy_file: Path, tiny_bert: Path, tmp_path: Path) -> None:
    cfg = image_recipe(
        taxonomy_file,
        tmp_path,
        **{
            "model.head": head,
            "model.backbone": f"hf:{tiny_bert}",
            "model.backbone_options": "{max_length: 16}",
            "data.options.kind": "text",
        },
    )
    _one_step(cfg)


def test_dense_head_on_nested_blobs(tmp_path: Path) -> None:
    from hiercls.train.config import config_from_dict

    cfg = config_from_dict(
        {
            "model": {"backbone": "conv3d:4", "head": "nested_sigmoid"},
            "data": {
                "dataset": "nested_blobs_3d",
                "batch_size": 2,
                "eval_split": "val",
                "options": {"train_samples": 4, "val_samples": 3, "size": 8},
            },
            "schedule": {"max_steps": 2},
            "eval": {"decoders": ["threshold"]},
            "run": {"out_dir": str(tmp_path), "progress": False, "plot": True},
        }
    )
    result = train(cfg)
    assert result["step"] == 2 and len(result["threshold/dice"]) == 3
    assert all(0.0 <= d <= 1.0 for d in result["threshold/dice"])
    assert (tmp_path / "curves.png").is_file()


# ---------------------------------------------------------------------------------------------- run outputs
def test_run_folder_outputs(taxonomy_file: Path, tmp_path: Path) -> None:
    cfg = image_recipe(
        taxonomy_file,
        tmp_path,
        **{"run.plot": "true", "run.log_every": 1, "eval.decoders": "[argmax_leaf, optimal_hf1]"},
    )
    result = train(cfg)
    # 22 samples / batch 8 = 3 steps per epoch, 2 epochs.
    assert result["step"] == 6 and result["epoch"] == 2
    for name in ("config.yaml", "metrics.jsonl", "results.json", "curves.png"):
        assert (tmp_path / name).is_file(), name
    assert load_config(tmp_path / "config.yaml") == cfg
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "train"] == [1, 2, 3, 4, 5, 6]
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["epoch"] for r in evals] == [0, 1]
    assert isinstance(evals[-1]["optimal_hf1/hF1_micro"], float)
    assert len(evals[-1]["argmax_leaf/per_level_accuracy"]) == 3
    from hiercls.models import HierarchicalClassifier

    for which in ("best", "last"):
        model = HierarchicalClassifier.from_pretrained(tmp_path / "checkpoints" / which)
        assert model.head_name == "semantic_softmax"
    # Started again with resume=auto, the finished run reports its results without training.
    again = train(cfg)
    assert again["step"] == 6 and again["argmax_leaf/hF1_micro"] == result["argmax_leaf/hF1_micro"]
    # Another config in the same folder is refused with the difference named.
    with pytest.raises(ConfigError, match=r"optim.lr: 0.003 \(saved\) vs 0.01 \(now\)"):
        train(apply_overrides(cfg, ["optim.lr=0.01"]))


# ---------------------------------------------------------------------------------------------- resume
def test_resume_after_interruption_equals_uninterrupted(taxonomy_file: Path, tmp_path: Path) -> None:
    # grad_accum 2 over 3 batches per epoch: steps of 2 + 1 micro-batches; stop mid-epoch (after step 1,
    # i.e. inside epoch 0) and at an epoch boundary (a callback at step 4 = end of epoch 1), then resume.
    # Dropout makes the result depend on the restored RNG state, not only on weights and data position.
    common = {
        "optim.grad_accum": 2,
        "schedule.epochs": 3,
        "data.options.noise": 1.0,
        "model.backbone_options": "{img_size: 16, proj_drop_rate: 0.2}",
        "run.keep_resume_state": "true",  # the optimizer states are compared below
    }
    ref = train(image_recipe(taxonomy_file, tmp_path / "ref", **common))
    assert ref["step"] == 6

    part = train(image_recipe(taxonomy_file, tmp_path / "cut", **common, **{"schedule.max_steps_this_run": 1}))
    assert part["interrupted"] and part["step"] == 1
    assert not (tmp_path / "cut" / "results.json").exists()

    def stop_at_4(info: dict) -> None:
        if info["step"] == 4:
            raise StopTraining

    part2 = train(image_recipe(taxonomy_file, tmp_path / "cut", **common), callbacks=[stop_at_4])
    assert part2["interrupted"] and part2["step"] == 4
    final = train(image_recipe(taxonomy_file, tmp_path / "cut", **common))
    assert final["step"] == 6 and not final["interrupted"]
    # Finished with its resume state kept: started again, it reports results.json (the same step) untouched.
    saved = (tmp_path / "cut" / "results.json").read_bytes()
    assert train(image_recipe(taxonomy_file, tmp_path / "cut", **common)) == json.loads(saved)
    assert (tmp_path / "cut" / "results.json").read_bytes() == saved

    a, b = read_weights(tmp_path / "ref"), read_weights(tmp_path / "cut")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa = torch.load(tmp_path / "ref" / "checkpoints" / "last" / "resume.pt", weights_only=True)
    sb = torch.load(tmp_path / "cut" / "checkpoints" / "last" / "resume.pt", weights_only=True)
    assert sa["scheduler"] == sb["scheduler"] and sa["data"] == sb["data"]
    for ga, gb in zip(sa["optimizer"]["state"].values(), sb["optimizer"]["state"].values(), strict=True):
        assert torch.equal(ga["exp_avg_sq"], gb["exp_avg_sq"])
    for key in ("argmax_leaf/hF1_micro", "argmax_leaf/accuracy", "eval_loss"):
        assert final[key] == ref[key]
    # The log of the resumed run has each step once.
    steps = [
        json.loads(line)["step"]
        for line in (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["type"] == "train"
    ]
    assert steps == sorted(set(steps))


# ---------------------------------------------------------------------------------------------- DDP
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_worker(rank: int, world: int, port: int, cfg: TrainConfig, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    result = train(cfg)
    if rank == 0:
        Path(out).write_text(json.dumps(result), encoding="utf-8")


def test_ddp_two_processes_equal_single_process(taxonomy_file: Path, tmp_path: Path) -> None:
    # 22 samples, global batch 8: batches 8, 8, 6 (3 + 3 per rank); eval on 11 samples = shards of 6 and 5.
    # grad_accum 2 exercises no_sync; dropout-free ViT so that both runs are deterministic. Attention key
    # biases have an exactly-zero true gradient (softmax is shift-invariant), so their gradients are pure
    # rounding noise that Adam's normalisation would blow up to lr-sized, order-dependent steps; a larger
    # eps keeps the comparison about the training loop rather than about float summation order.
    common = {"optim.grad_accum": 2, "schedule.epochs": 2, "optim.eps": 1e-4}
    single = train(image_recipe(taxonomy_file, tmp_path / "single", **common))
    cfg = image_recipe(taxonomy_file, tmp_path / "ddp", **common)
    out = tmp_path / "ddp_result.json"
    torch.multiprocessing.spawn(_ddp_worker, args=(2, _free_port(), cfg, str(out)), nprocs=2, join=True)
    ddp = json.loads(out.read_text())
    a, b = read_weights(tmp_path / "single"), read_weights(tmp_path / "ddp")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=k)
    assert ddp["step"] == single["step"] == 4
    assert ddp["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    for key in ("argmax_leaf/accuracy", "argmax_leaf/hF1_micro", "argmax_leaf/mistake_severity", "eval_loss"):
        assert ddp[key] == pytest.approx(single[key], rel=1e-5, abs=1e-6), key
    assert ddp["argmax_leaf/per_level_accuracy"] == pytest.approx(single["argmax_leaf/per_level_accuracy"], nan_ok=True)


def test_best_checkpoint_is_chosen_on_the_metric_the_first_decoder_is_optimal_for() -> None:
    from hiercls.train.loop import _best_metric_key

    results = {
        "optimal_hfbeta:beta=2/hF1_micro": 0.9,
        "optimal_hfbeta:beta=2/hF2_samples": 0.5,
        "argmax_leaf/hF1_micro": 0.7,
        "argmax_leaf/hF2_samples": 0.4,
        "eval_loss": 1.0,
    }
    cfg = config_from_dict({"eval": {"decoders": ["optimal_hfbeta:beta=2", "argmax_leaf"]}})
    assert _best_metric_key(cfg, results) == "optimal_hfbeta:beta=2/hF2_samples"
    cfg = config_from_dict({"eval": {"decoders": ["argmax_leaf", "optimal_hfbeta:beta=2"]}})
    assert _best_metric_key(cfg, results) == "argmax_leaf/hF1_micro"
    cfg = config_from_dict({"eval": {"decoders": ["argmax_leaf"], "best_metric": "argmax_leaf/hF2_samples"}})
    assert _best_metric_key(cfg, results) == "argmax_leaf/hF2_samples"


def test_decoder_specs_are_checked_when_the_config_loads() -> None:
    with pytest.raises(ConfigError, match=r"eval\.decoders: decoder 'optimal_hfbeta:beta=-2': beta must be"):
        config_from_dict({"eval": {"decoders": ["optimal_hfbeta:beta=-2"]}})
    with pytest.raises(ConfigError, match="are the same decoder"):
        config_from_dict({"eval": {"decoders": ["optimal_hf1", "optimal_hfbeta:beta=1"]}})


def test_results_report_the_best_checkpoint_that_evaluate_loads(taxonomy_file: Path, tmp_path: Path) -> None:
    """``results.json`` holds the metrics of ``checkpoints/best``, also when an earlier epoch was the best."""
    from hiercls.evaluation import evaluate_run
    from hiercls.train.inference import load_trained_model
    from hiercls.train.plots import read_log

    # eval loss falls as training goes on: "max" makes the first evaluation the best, not the last
    cfg = image_recipe(
        taxonomy_file,
        tmp_path / "run",
        **{"schedule.epochs": 3, "eval.best_metric": "eval_loss", "eval.best_mode": "max"},
    )
    res = train(cfg)
    evals = [r for r in read_log(tmp_path / "run" / "metrics.jsonl") if r.get("type") == "eval"]
    best = max(evals, key=lambda r: r["eval_loss"])
    assert res["reported_step"] == res["best_step"] == best["step"] < res["step"]
    assert res["argmax_leaf/accuracy"] == best["argmax_leaf/accuracy"]
    assert res["last"]["argmax_leaf/accuracy"] == evals[-1]["argmax_leaf/accuracy"]
    model, tax, run_cfg = load_trained_model(tmp_path / "run", which="best")
    again = evaluate_run(model, tax, run_cfg)
    assert again["argmax_leaf/accuracy"] == pytest.approx(res["argmax_leaf/accuracy"])
    assert again["eval_loss"] == pytest.approx(res["eval_loss"], rel=1e-5)
