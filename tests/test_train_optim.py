"""Issue 26, items 1, 3 and 6: timm's optimizers and schedules, the EMA of the weights, the speed switches.

References: the default (AdamW + warmup-cosine) against torch's AdamW and a LambdaLR of the formula written out
here (what the loop did before); layer-wise decay against timm's own ``param_groups_layer_decay``; timm's step
schedule against its closed form; the EMA against ``d * w1 + (1 - d) * w2`` of two runs' weights; resumption
against an uninterrupted run, bitwise.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import typing
from pathlib import Path

import pytest
import timm.optim
import torch
import yaml
from safetensors.torch import load_file
from torch import nn

from hiercls.data import build_dataset, image_transform
from hiercls.models import create_model
from hiercls.taxonomy import load_taxonomy
from hiercls.train import train
from hiercls.train.checkpoint import (
    load_optimization_state,
    optimization_state,
    read_resume_state,
    rng_state,
    seed_everything,
    set_rng_state,
    write_resume_state,
)
from hiercls.train.config import ConfigError, SchedConfig, TrainConfig, apply_overrides, config_from_dict
from hiercls.train.loop import build_model, unused_parameters
from hiercls.train.optim import build_optimizer, build_scheduler

TAXONOMY = ["root animal", "root vehicle", "animal cat", "animal dog", "vehicle car", "vehicle bike"]


@pytest.fixture(scope="module")
def taxonomy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tax") / "tax.txt"
    path.write_text("\n".join(TAXONOMY) + "\n", encoding="utf-8")
    return path


def recipe(taxonomy_file: Path, out_dir: Path, *overrides: str) -> TrainConfig:
    """A tiny ViT (no batch norm, no dropout) on synthetic images: 22 samples, batches of 8, 2 epochs (6 steps)."""
    cfg = config_from_dict(
        {
            "taxonomy": str(taxonomy_file),
            "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
            "data": {
                "dataset": "synthetic",
                "batch_size": 8,
                "options": {"kind": "image", "image_size": 16, "train_samples": 22, "val_samples": 11},
            },
            "optim": {"lr": 3e-3, "warmup_steps": 2},
            "schedule": {"epochs": 2},
            "eval": {"decoders": ["argmax_leaf"]},
            "run": {"out_dir": str(out_dir), "progress": False, "plot": False, "seed": 3, "keep_resume_state": True},
        }
    )
    return apply_overrides(cfg, list(overrides))


def tiny_model(taxonomy_file: Path) -> nn.Module:
    torch.manual_seed(0)
    return create_model("timm:test_vit", load_taxonomy(str(taxonomy_file)), head="semantic_softmax", img_size=16)


# ------------------------------------------------------------------------------------------- optimizer groups
def test_default_is_todays_adamw_and_warmup_cosine_bitwise(taxonomy_file: Path) -> None:
    """The default equals torch's AdamW over (decay, no-decay) x (backbone, head) groups + the cosine formula."""
    cfg = apply_overrides(TrainConfig(), ["optim.lr=0.01", "optim.head_lr=0.03", "optim.warmup_steps=3"])
    total = 12
    ours, ref = tiny_model(taxonomy_file), tiny_model(taxonomy_file)
    opt = build_optimizer(ours, cfg)
    sched = build_scheduler(opt, cfg, total_steps=total, steps_per_epoch=4)
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for name, p in ref.named_parameters():
        groups.setdefault((name.startswith("head."), p.dim() >= 2), []).append(p)
    ref_opt = torch.optim.AdamW(
        [
            {"params": groups[h, d], "weight_decay": 0.01 if d else 0.0, "lr": 0.03 if h else 0.01}
            for h in (False, True)
            for d in (True, False)
        ],
        lr=0.01,
    )

    def formula(s: int) -> float:
        if s < 3:
            return (s + 1) / 3
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (s - 3) / (total - 3))))

    ref_sched = torch.optim.lr_scheduler.LambdaLR(ref_opt, formula)
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([2, 3, 4, 5])
    for _ in range(total):
        assert sched.get_last_lr() == ref_sched.get_last_lr()
        for model, o, s in ((ours, opt, sched), (ref, ref_opt, ref_sched)):
            model.loss(model(x), y).backward()
            o.step()
            o.zero_grad()
            s.step()
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)


def test_layer_decay_scales_each_parameter_as_timm_and_keeps_head_lr(taxonomy_file: Path) -> None:
    model = tiny_model(taxonomy_file)
    cfg = apply_overrides(TrainConfig(), ["optim.name=lamb", "optim.layer_decay=0.5", "optim.head_lr=0.02"])
    opt = build_optimizer(model, cfg)
    assert type(opt).__name__ == "Lamb"
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    scale_of = {
        id(p): g["lr_scale"]
        for g in timm.optim.param_groups_layer_decay(model, weight_decay=0.01, layer_decay=0.5)
        for p in g["params"]
    }
    assert len(set(scale_of.values())) > 2  # the backbone's blocks really get different scales
    for name, p in model.named_parameters():
        base = 0.02 if name.startswith("head.") else cfg.optim.lr
        assert lr_of[id(p)] == pytest.approx(base * scale_of[id(p)], rel=1e-12), name


def test_timm_step_schedule_follows_its_closed_form_in_epochs_of_optimizer_steps() -> None:
    cfg = apply_overrides(
        TrainConfig(),
        ["optim.name=sgd", "optim.momentum=0.8", "sched.name=step", "sched.decay_epochs=1", "sched.decay_rate=0.5"],
    )
    opt = build_optimizer(nn.Linear(2, 2), cfg)
    assert opt.param_groups[0]["momentum"] == 0.8
    sched = build_scheduler(opt, cfg, total_steps=9, steps_per_epoch=3)
    seen = []
    for _ in range(9):
        seen.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert seen == pytest.approx([1e-3 * 0.5 ** (t // 3) for t in range(9)], rel=1e-12)


def test_bad_optimizer_and_schedule_settings_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"optim.name: unknown optimizer 'adamx'; timm's are: .*adamw"):
        build_optimizer(nn.Linear(2, 2), apply_overrides(TrainConfig(), ["optim.name=adamx"]))
    with pytest.raises(ConfigError, match=r"sched.decay_milestones: multistep needs epochs"):
        apply_overrides(TrainConfig(), ["sched.name=multistep"])
    with pytest.raises(ConfigError, match=r"sched.name: expected one of 'cosine', 'onecycle'"):
        apply_overrides(TrainConfig(), ["sched.name=linear"])
    with pytest.raises(ConfigError, match=r"sched: the 'onecycle' schedule refused the settings"):
        cfg = apply_overrides(TrainConfig(), ["optim.name=adagrad", "sched.name=onecycle"])
        build_scheduler(build_optimizer(nn.Linear(2, 2), cfg), cfg, total_steps=4, steps_per_epoch=2)
    with pytest.raises(ConfigError, match=r"model.ema.eval: best_on: ema needs the EMA evaluated"):
        apply_overrides(TrainConfig(), ["model.ema.decay=0.99", "model.ema.eval=false"])


def test_a_short_last_step_is_the_mean_over_its_samples_as_a_hand_written_loop(
    taxonomy_file: Path, tmp_path: Path
) -> None:
    """22 samples in order, batches of 4, grad_accum 2: steps of 8, 8, 6 samples; SGD at a constant lr."""
    cfg = recipe(
        taxonomy_file,
        tmp_path,
        "optim.name=sgd",
        "optim.lr=0.1",
        "optim.momentum=0",
        "optim.options.nesterov=false",
        "optim.weight_decay=0",
        "optim.clip_grad_norm=null",
        "sched.name=constant",
        "optim.warmup_steps=0",
        "data.shuffle=false",
        "data.batch_size=4",
        "optim.grad_accum=2",
        "schedule.epochs=1",
        "data.eval_split=null",
    )
    train(cfg)
    seed_everything(cfg.run.seed)
    tax = load_taxonomy(str(taxonomy_file))
    model = build_model(cfg, tax)
    data = build_dataset(
        "synthetic", "train", tax, cfg.data.options, image_transform(model, train=False, image_size=None)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for start in (0, 8, 16):
        x, y = torch.utils.data.default_collate([data[i] for i in range(start, min(start + 8, 22))])
        model.loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    trained = load_file(str(tmp_path / "checkpoints/last/model.safetensors"))
    for k, v in model.state_dict().items():
        if k in trained:
            torch.testing.assert_close(trained[k], v, rtol=1e-5, atol=1e-6, msg=k)


# ------------------------------------------------------------------------------------------- every optimizer
class _Tiny(nn.Module):
    """A backbone and a head (four of hiercls's groups: head / not x decay / not), 2-D weights for Muon / Kron."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body, self.head = nn.Linear(4, 3), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x)))


def _needs_package(base: str) -> str | None:
    """The package a timm optimizer family imports (None: timm's or torch's own)."""
    return "bitsandbytes" if base.startswith("bnb") else "apex" if base.startswith("fused") else None


def _expected_refusal(name: str) -> str | None:
    """Why hiercls must refuse ``name`` here (a pattern of the message), or None where it must resume exactly."""
    base = name.rpartition("_")[2]
    if base == "adahessian":
        return r"second-order optimizer: its step needs the gradients' graph \(loss.backward\(create_graph=True\)\)"
    package = _needs_package(base)
    if package is not None and importlib.util.find_spec(package) is None:
        return rf"needs the package {package}"
    if package is not None and not torch.cuda.is_available():
        return "runs on CUDA only"
    return None


def _same(a: object, b: object, where: str = "") -> None:
    """``a`` and ``b`` equal all the way down: tensors bitwise (torch.equal, dtype, device), the rest by ``==``."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.device == b.device, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


BASE_OPTIMIZERS = timm.optim.list_optimizers()
KRON = [n for n in BASE_OPTIMIZERS if n.startswith("kron")]


def _resume_round_trip(
    tmp_path: Path, sets: list[str], *, device: str = "cpu", total: int = 6, cut: int = 3, per_epoch: int = 3
) -> list[list[float]]:
    """``cut`` steps, resume.pt written and read as the loop does, the rest into fresh objects: bitwise the
    ``total`` straight steps (weights, every optimizer and schedule state, every group's lr); the straight lrs."""
    cfg = apply_overrides(TrainConfig(), ["optim.head_lr=0.003", "optim.warmup_steps=2", "optim.lr=0.01", *sets])
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(5, 4, generator=g), torch.randn(5, 2, generator=g)) for _ in range(total)]

    def build() -> tuple[nn.Module, torch.optim.Optimizer, object, torch.amp.GradScaler]:
        model = _Tiny().to(device)
        opt = build_optimizer(model, cfg)
        sched = build_scheduler(opt, cfg, total_steps=total, steps_per_epoch=per_epoch)
        return model, opt, sched, torch.amp.GradScaler("cpu")

    def steps(model: nn.Module, opt: torch.optim.Optimizer, sched: object, which: range) -> list[list[float]]:
        lrs = []
        for i in which:
            lrs.append([group["lr"] for group in opt.param_groups])
            x, y = (t.to(device) for t in batches[i])
            (model(x) - y).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        return lrs

    torch.manual_seed(5)
    straight = build()
    lrs = steps(*straight[:3], range(total))
    torch.manual_seed(5)
    cut_run = build()
    steps(*cut_run[:3], range(cut))
    write_resume_state(
        tmp_path / "resume.pt",
        {**optimization_state(*cut_run[1:]), "data": {}, "step": cut, "rng": [rng_state()]},
    )
    torch.manual_seed(6)  # a new process seeds its streams before the restore puts them back
    resumed = build()
    saved = read_resume_state(tmp_path / "resume.pt")
    resumed[0].load_state_dict(cut_run[0].state_dict())  # the loop's weights come from model.safetensors
    load_optimization_state(saved, *resumed[1:])
    set_rng_state(saved["rng"][0])
    assert steps(*resumed[:3], range(cut, total)) == lrs[cut:]
    for (k, a), b in zip(straight[0].named_parameters(), resumed[0].parameters(), strict=True):
        assert torch.equal(a, b), k
    _same(straight[1].state_dict(), resumed[1].state_dict(), "optimizer")
    _same(straight[2].state_dict(), resumed[2].state_dict(), "scheduler")
    assert not torch.equal(straight[0].head.weight, cut_run[0].head.weight)  # the steps after the cut moved it
    return lrs


@pytest.mark.parametrize("name", BASE_OPTIMIZERS + [f"lookahead_{n}" for n in BASE_OPTIMIZERS])
def test_every_optimizer_resumes_bitwise_through_resume_pt_or_is_refused_by_name(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every name the recipe accepts resumes exactly through hiercls's own write / read / load of resume.pt."""
    why = _expected_refusal(name)
    if why is not None:
        with pytest.raises(ConfigError, match=rf"optim.name: '{name}' .*{why}"):
            build_optimizer(_Tiny(), apply_overrides(TrainConfig(), [f"optim.name={name}"]))
        return
    if name.rpartition("_")[2] in KRON:  # compiled Kron is the slow test below (minutes of compiling)
        monkeypatch.setattr(timm.optim.kron, "has_dynamo", False, raising=False)
    base = name.rpartition("_")[2]
    # adan's three betas are its own option (optim.betas holds two)
    sets = ["optim.options.betas=[0.98, 0.92, 0.99]"] if timm.optim.get_optimizer_info(base).num_betas == 3 else []
    _resume_round_trip(tmp_path, [f"optim.name={name}", *sets], device="cuda" if _needs_package(base) else "cpu")


SCHEDULES = list(typing.get_args(typing.get_type_hints(SchedConfig)["name"]))


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_schedule_resumes_bitwise_through_resume_pt(name: str, tmp_path: Path) -> None:
    """Every name sched.name accepts: stop after 4 of 12 steps, resume through resume.pt, the same weights and lrs."""
    sets = [f"sched.name={name}", "sched.decay_milestones=[1, 2]", "sched.decay_epochs=1", "optim.name=sgd"]
    sets.append("optim.warmup_steps=2")  # rsqrt's timescale defaults to the warmup
    if name in ("wsd", "rsqrt"):  # newer than the declared timm floor: an older timm is refused by name
        try:
            build_scheduler(
                build_optimizer(_Tiny(), TrainConfig()),
                apply_overrides(TrainConfig(), sets),
                total_steps=12,
                steps_per_epoch=4,
            )
        except ConfigError as err:
            assert f"{name!r} is not a schedule of the installed timm" in str(err)
            pytest.skip(f"timm {timm.__version__} has no {name!r} schedule")
    lrs = _resume_round_trip(tmp_path, sets, total=12, cut=4, per_epoch=4)
    assert len({lr[0] for lr in lrs[4:]}) > 1 or name == "constant"


@pytest.mark.slow
def test_compiled_kron_resumes_bitwise(tmp_path: Path) -> None:
    _resume_round_trip(tmp_path, ["optim.name=kron"])


def test_kron_draws_nothing_from_the_global_random_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP ranks are seeded apart: Kron's noise must come from its own (saved) generator, the same on every rank."""
    monkeypatch.setattr(timm.optim.kron, "has_dynamo", False, raising=False)  # compiling takes minutes
    model = _Tiny()
    opt = build_optimizer(model, apply_overrides(TrainConfig(), ["optim.name=kron"]))
    torch.manual_seed(3)
    for _ in range(2):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    after = torch.rand(2)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(2))
    with pytest.raises(ConfigError, match=r"optim.options.deterministic: 'kron' must draw its noise"):
        build_optimizer(model, apply_overrides(TrainConfig(), ["optim.name=kron", "optim.options.deterministic=false"]))


def test_optimizer_choices_that_cannot_train_here_are_refused_by_name(taxonomy_file: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"optim.name: 'adahessian' is a second-order optimizer"):
        train(recipe(taxonomy_file, tmp_path / "run", "optim.name=adahessian"))
    assert not (tmp_path / "run").exists()  # refused before the run folder is touched or anything is built
    with pytest.raises(ConfigError, match=r"optim.options.betas: 'adan' takes 3 betas, got \[0.9, 0.999\]"):
        build_optimizer(_Tiny(), apply_overrides(TrainConfig(), ["optim.name=adan"]))
    with pytest.raises(ConfigError, match=r"optim.name: 'slow_adamw': the only prefix .* 'lookahead_adamw'"):
        build_optimizer(_Tiny(), apply_overrides(TrainConfig(), ["optim.name=slow_adamw"]))
    opt = build_optimizer(_Tiny(), apply_overrides(TrainConfig(), ["optim.name=lookahead_adamw"]))
    assert type(opt).__name__ == "Lookahead"


# ------------------------------------------------------------------------------------------- exact resume
CASES = {
    "adamw_cosine_ema": ["model.ema.decay=0.9", "model.ema.warmup=true"],
    "sgd_step": ["optim.name=sgd", "optim.lr=0.05", "sched.name=step", "sched.decay_epochs=0.5"],
    "lamb_layer_decay": ["optim.name=lamb", "optim.layer_decay=0.7", "optim.head_lr=0.01"],
    "adam_onecycle_ema_raw": [
        "optim.name=adam",
        "sched.name=onecycle",
        "sched.pct_start=0.2",
        "sched.div_factor=20",
        "model.ema.decay=0.8",
        "model.ema.best_on=raw",
    ],
    # a per-step timm schedule (StepScheduler), Lookahead's plain-int state in the groups, mixup's random stream
    "lookahead_radam_tanh_mixup_ema": [
        "optim.name=lookahead_radam",
        "sched.name=tanh",
        "data.mixup.mixup_alpha=0.8",
        "data.mixup.cutmix_alpha=1.0",
        "data.mixup.label_smoothing=0.1",
        "model.ema.decay=0.9",
    ],
}


@pytest.mark.parametrize("case", list(CASES))
def test_resume_mid_epoch_is_bitwise_the_uninterrupted_run(taxonomy_file: Path, tmp_path: Path, case: str) -> None:
    straight = train(recipe(taxonomy_file, tmp_path / "a", *CASES[case]))
    cut = recipe(taxonomy_file, tmp_path / "b", *CASES[case], "schedule.max_steps_this_run=4")
    assert train(cut)["interrupted"]
    resumed = train(recipe(taxonomy_file, tmp_path / "b", *CASES[case]))
    assert resumed["step"] == straight["step"] == 6
    for which in ("last", "best"):
        a = load_file(str(tmp_path / "a" / "checkpoints" / which / "model.safetensors"))
        b = load_file(str(tmp_path / "b" / "checkpoints" / which / "model.safetensors"))
        assert all(torch.equal(a[k], b[k]) for k in a), which
    sa, sb = (torch.load(tmp_path / d / "checkpoints/last/resume.pt", weights_only=True) for d in ("a", "b"))
    assert sa["scheduler"] == sb["scheduler"]
    for k, v in sa["optimizer"]["state"].items():
        assert all(torch.equal(v[n], sb["optimizer"]["state"][k][n]) for n in v if isinstance(v[n], torch.Tensor))
    assert ("ema" in sa) == ("ema.decay" in " ".join(CASES[case]))
    for k, v in sa.get("ema", {}).items():
        assert torch.equal(v, sb["ema"][k]), k
    assert straight.get("argmax_leaf/accuracy") == resumed.get("argmax_leaf/accuracy")


def test_an_older_runs_config_without_the_new_keys_still_resumes(taxonomy_file: Path, tmp_path: Path) -> None:
    assert train(recipe(taxonomy_file, tmp_path, "schedule.max_steps_this_run=2"))["interrupted"]
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text(encoding="utf-8"))
    del saved["sched"], saved["optim"]["name"], saved["model"]["ema"]
    saved["run"]["find_unused_parameters"] = True  # the old default
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved), encoding="utf-8")
    assert train(recipe(taxonomy_file, tmp_path))["step"] == 6


# ------------------------------------------------------------------------------------------- EMA
def test_ema_is_the_moving_average_of_the_trained_weights_and_is_the_runs_model(
    taxonomy_file: Path, tmp_path: Path
) -> None:
    """Constant lr: run 1 stops after step 1 (w1), run 2 after step 2 (w2); its best (the EMA) = d w1 + (1-d) w2."""
    common = ["sched.name=constant", "optim.warmup_steps=0", "model.ema.decay=0.75", "schedule.epochs=1"]
    train(recipe(taxonomy_file, tmp_path / "one", *common, "schedule.max_steps=1"))
    two = train(recipe(taxonomy_file, tmp_path / "two", *common, "schedule.max_steps=2"))
    w1 = load_file(str(tmp_path / "one/checkpoints/last/model.safetensors"))
    w2 = load_file(str(tmp_path / "two/checkpoints/last/model.safetensors"))
    ema = load_file(str(tmp_path / "two/checkpoints/best/model.safetensors"))
    for k in w1:
        assert torch.allclose(ema[k], 0.75 * w1[k] + 0.25 * w2[k], atol=1e-6), k
    assert any(not torch.equal(ema[k], w2[k]) for k in w2)  # best is not the raw weights
    assert "raw/argmax_leaf/accuracy" in two and "argmax_leaf/accuracy" in two
    saved = yaml.safe_load((tmp_path / "two" / "config.yaml").read_text(encoding="utf-8"))
    assert saved["model"]["ema"] == {"decay": 0.75, "warmup": False, "eval": True, "best_on": "ema"}
    assert saved["optim"]["name"] == "adamw" and saved["sched"]["name"] == "constant"


def _ddp_worker(rank: int, port: int, cfg: TrainConfig, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    result = train(cfg)
    if rank == 0:
        Path(out).write_text(json.dumps(result), encoding="utf-8")


@pytest.mark.slow
def test_ddp_with_ema_sgd_and_a_short_last_step_equals_one_process(taxonomy_file: Path, tmp_path: Path) -> None:
    """2 gloo processes, grad_accum 2 (no_sync), batches 8, 8, 6 (a short step: the rescaled gradient), EMA on."""
    common = ["optim.name=sgd", "optim.lr=0.05", "sched.name=step", "sched.decay_epochs=1", "optim.grad_accum=2"]
    common += ["model.ema.decay=0.5", "run.keep_resume_state=false"]
    single = train(recipe(taxonomy_file, tmp_path / "single", *common))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg, out = recipe(taxonomy_file, tmp_path / "ddp", *common), tmp_path / "ddp.json"
    torch.multiprocessing.spawn(_ddp_worker, args=(port, cfg, str(out)), nprocs=2, join=True)
    ddp = json.loads(out.read_text())
    for which in ("last", "best"):  # best: the EMA's weights
        a = load_file(str(tmp_path / "single" / "checkpoints" / which / "model.safetensors"))
        b = load_file(str(tmp_path / "ddp" / "checkpoints" / which / "model.safetensors"))
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=f"{which}: {k}")
    assert ddp["step"] == single["step"] == 4
    assert ddp["train_loss"] == pytest.approx(single["train_loss"], rel=1e-5)
    for key in ("argmax_leaf/accuracy", "raw/argmax_leaf/accuracy", "eval_loss"):
        assert ddp[key] == pytest.approx(single[key], rel=1e-5, abs=1e-6), key


def test_without_evaluation_the_final_ema_is_kept_as_the_runs_model(taxonomy_file: Path, tmp_path: Path) -> None:
    cfg = recipe(taxonomy_file, tmp_path, "data.eval_split=null", "model.ema.decay=0.5", "schedule.max_steps=2")
    assert train(cfg)["best_step"] == 2
    saved = torch.load(tmp_path / "checkpoints/last/resume.pt", weights_only=True)
    best = load_file(str(tmp_path / "checkpoints/best/model.safetensors"))
    assert all(torch.equal(best[k], v) for k, v in saved["ema"].items() if k in best)


# ------------------------------------------------------------------------------------------- speed switches
def test_no_parameter_of_the_default_model_is_unused_and_the_check_leaves_no_trace(taxonomy_file: Path) -> None:
    model = tiny_model(taxonomy_file)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = (torch.randn(2, 3, 16, 16), torch.tensor([2, 5]))
    torch.manual_seed(5)
    assert unused_parameters(model, batch, torch.device("cpu")) == []
    after = torch.rand(1)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(1))  # the random stream is where it was
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all(p.grad is None for p in model.parameters())
    model.head.spare = nn.Linear(2, 2)  # a parameter no loss reaches
    assert unused_parameters(model, batch, torch.device("cpu")) == ["head.spare.weight", "head.spare.bias"]


class _NormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.out = nn.BatchNorm1d(2), nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(nn.functional.dropout(self.norm(x), 0.5))

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (out.squeeze(1) - y).pow(2).mean()


def test_the_dry_step_puts_back_batch_norm_statistics_and_the_dropout_stream() -> None:
    model = _NormNet()
    batch = (torch.randn(4, 2) + 3.0, torch.zeros(4))
    torch.manual_seed(1)
    assert unused_parameters(model, batch, torch.device("cpu")) == []
    assert torch.equal(model.norm.running_mean, torch.zeros(2)) and int(model.norm.num_batches_tracked) == 0
    after = torch.rand(3)
    torch.manual_seed(1)
    assert torch.equal(after, torch.rand(3))


def test_channels_last_trains_to_the_eager_weights(taxonomy_file: Path, tmp_path: Path) -> None:
    train(recipe(taxonomy_file, tmp_path / "eager", "schedule.max_steps=3"))
    train(recipe(taxonomy_file, tmp_path / "cl", "schedule.max_steps=3", "model.channels_last=true"))
    a = load_file(str(tmp_path / "eager/checkpoints/last/model.safetensors"))
    b = load_file(str(tmp_path / "cl/checkpoints/last/model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.slow
def test_compiled_model_trains_to_the_eager_weights(taxonomy_file: Path, tmp_path: Path) -> None:
    # SGD: the weights move by lr x gradient, so compiled kernels' round-off stays round-off (Adam's normalised
    # step turns a near-zero gradient's sign flip into a full lr step)
    sgd = ("schedule.max_steps=3", "optim.name=sgd", "optim.momentum=0.9")
    train(recipe(taxonomy_file, tmp_path / "eager", *sgd))
    train(recipe(taxonomy_file, tmp_path / "compiled", *sgd, "model.compile=true"))
    a = load_file(str(tmp_path / "eager/checkpoints/last/model.safetensors"))
    b = load_file(str(tmp_path / "compiled/checkpoints/last/model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-4) for k in a)
