"""Reliability of training, checkpoints and model folders (issue 10; docs/reliability.md).

Each table row damages one thing a user can meet (a file of a saved model, of a checkpoint, the run folder,
the training itself) and asserts the outcome class: a clear error naming the culprit, or the correct result
(exact resume = bitwise the weights of an uninterrupted run). Every row also asserts that nothing the user had
is lost (the files are byte-for-byte what they were, or the previous checkpoint survives). The references are
an uninterrupted run of the same recipe and the untouched folders.

Separately: a fault-injection test kills a training process (SIGKILL) inside checkpoint writes and at random
times, then asserts exact resume and no leftover temporary folders; and a crafted pickle placed as every file
of a run folder must never execute.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import json
import logging
import os
import pickle
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from hiercls.cli import main
from hiercls.heads.registry import HeadOptionError
from hiercls.models import CheckpointError, HierarchicalClassifier
from hiercls.models.files import folder_size, sha256_file
from hiercls.train.config import ConfigError, TrainConfig, apply_overrides, config_from_dict, config_to_dict
from hiercls.train.loop import TrainingDiverged, train

TAXONOMY = "root animal\nroot vehicle\nanimal cat\nanimal dog\nvehicle car\nvehicle bike\nbike ebike\n"
REPO = Path(__file__).resolve().parents[1]


def recipe(tax: Path, out: Path, **overrides: object) -> TrainConfig:
    """A tiny ViT on 16 synthetic images, batch 8: 2 steps per epoch."""
    cfg = config_from_dict(
        {
            "taxonomy": str(tax),
            "model": {"backbone": "timm:test_vit", "head": "semantic_softmax", "backbone_options": {"img_size": 16}},
            "data": {
                "dataset": "synthetic",
                "batch_size": 8,
                "options": {"kind": "image", "image_size": 16, "train_samples": 16, "val_samples": 8},
            },
            "optim": {"lr": 3e-3, "warmup_steps": 1},
            "schedule": {"epochs": 1},
            "eval": {"decoders": ["argmax_leaf"]},
            "run": {"out_dir": str(out), "progress": False, "plot": False, "seed": 5},
        }
    )
    return apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file's bytes (the lock file excluded: it is the run's, not the user's)."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def leftovers(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if ".tmp-" in p.name or p.name.endswith(".old"))


def weights(run: Path, which: str = "last") -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / which / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


class Evil:
    """Unpickling this runs code that writes ``marker``: the test that no loader ever unpickles a user's file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished 2-step run (``ref``), the same run cut after step 1 (``cut``) and a saved model folder."""
    d = tmp_path_factory.mktemp("reltrain")
    tax = d / "tax.txt"
    tax.write_text(TAXONOMY, encoding="utf-8")
    train(recipe(tax, d / "ref"))
    part = train(recipe(tax, d / "cut", **{"schedule.max_steps_this_run": 1}))
    assert part["interrupted"] and part["step"] == 1
    shutil.copytree(d / "ref" / "checkpoints" / "best", d / "model")
    return {"dir": d, "tax": tax, "ref": d / "ref", "cut": d / "cut", "model": d / "model"}


# ------------------------------------------------------------------------------------------ model folders
def _flip(path: Path, at: int = -200) -> None:
    b = bytearray(path.read_bytes())
    b[at] ^= 0x10
    path.write_bytes(bytes(b))


def _edit_config(**changes: Any) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        for k, v in changes.items():
            if v is None:
                cfg.pop(k, None)
            else:
                cfg[k] = v
        (d / "config.json").write_text(json.dumps(cfg))

    return edit


def _truncate(name: str, keep: int) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes((d / name).read_bytes()[:keep])


def _old_folder_truncated(d: Path) -> None:
    _edit_config(weights_sha256=None)(d)
    _truncate("model.safetensors", 1000)(d)


def _other_models_weights(d: Path) -> None:
    (d / "model.safetensors").write_bytes((d.parent / "other" / "model.safetensors").read_bytes())


MODEL_CASES: list[tuple[str, Callable[[Path], None], type[BaseException], str, str]] = [
    # (id, damage, error type, culprit file, message part)
    ("bit-flip", lambda d: _flip(d / "model.safetensors"), CheckpointError, "model.safetensors", "content hash"),
    ("bit-flip-header", lambda d: _flip(d / "model.safetensors", 40), CheckpointError, "model.safetensors", "hash"),
    ("truncated", _truncate("model.safetensors", 5000), CheckpointError, "model.safetensors", "damaged"),
    ("empty-weights", _truncate("model.safetensors", 0), CheckpointError, "model.safetensors", "content hash"),
    ("old-truncated", _old_folder_truncated, CheckpointError, "model.safetensors", "not a readable safetensors"),
    ("other-model", _other_models_weights, CheckpointError, "model.safetensors", "another model"),
    ("no-weights", lambda d: (d / "model.safetensors").unlink(), FileNotFoundError, "", "lacks model.safetensors"),
    ("bad-json", lambda d: (d / "config.json").write_text('{"format": '), CheckpointError, "config.json", "invalid"),
    (
        "latin1-json",
        lambda d: (d / "config.json").write_bytes(b'{"a": "\xe9"}'),
        CheckpointError,
        "config.json",
        "UTF-8",
    ),
    ("json-list", lambda d: (d / "config.json").write_text("[1, 2]"), ValueError, "config.json", "not a JSON object"),
    ("no-config", lambda d: (d / "config.json").unlink(), FileNotFoundError, "", "no config.json"),
    ("edited-head", _edit_config(head="flat"), CheckpointError, "config.json", "'head' is 'flat'"),
    ("edited-options", _edit_config(head_options={"bias": False}), CheckpointError, "config.json", "'head_options'"),
    ("edited-backbone", _edit_config(backbone="timm:resnet10t"), CheckpointError, "config.json", "'backbone'"),
    ("edited-nodes", _edit_config(num_nodes=3), CheckpointError, "config.json", "'num_nodes'"),
    ("missing-head", _edit_config(head=None), CheckpointError, "config.json", "missing head"),
    ("newer-version", _edit_config(version=99), ValueError, "config.json", "upgrade hiercls"),
    ("not-hiercls", _edit_config(format="other"), ValueError, "config.json", "not a hiercls model"),
    ("no-taxonomy", lambda d: (d / "taxonomy.json.gz").unlink(), FileNotFoundError, "", "taxonomy.json.gz"),
    (
        "other-taxonomy",
        lambda d: (d / "taxonomy.json.gz").write_bytes(gzip.compress(b'{"root": ["a", "b"]}')),
        CheckpointError,  # config.json records the digest of every file that defines the model
        "taxonomy.json.gz",
        "edited",
    ),
]


@pytest.mark.parametrize(("case", "damage", "error", "culprit", "part"), MODEL_CASES, ids=[c[0] for c in MODEL_CASES])
def test_damaged_model_folder_is_refused_naming_the_file(
    base: dict[str, Path],
    tmp_path: Path,
    case: str,
    damage: Callable[[Path], None],
    error: type[BaseException],
    culprit: str,
    part: str,
) -> None:
    d = tmp_path / "m"
    shutil.copytree(base["model"], d)
    if case == "other-model":
        other = HierarchicalClassifier.from_pretrained(base["model"])
        torch.manual_seed(1)
        other.reset_head()
        other.save_pretrained(tmp_path / "other")
    damage(d)
    before = snapshot(d)
    with pytest.raises(error) as info:
        HierarchicalClassifier.from_pretrained(d)
    msg = str(info.value)
    assert str(d) in msg and culprit in msg and part in msg, msg
    assert snapshot(d) == before  # a failed load changes nothing


def test_old_model_folder_without_hash_loads_with_a_warning(
    base: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "m"
    shutil.copytree(base["model"], d)
    _edit_config(weights_sha256=None)(d)
    # an older hiercls wrote no identity into the weights header (with one, a removed hash is refused)
    save_file(load_file(d / "model.safetensors"), d / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        back = HierarchicalClassifier.from_pretrained(d)
    assert "no weights_sha256" in caplog.text and "config.json" in caplog.text
    assert_same_weights(
        {k: v for k, v in back.state_dict().items() if k in weights(base["ref"], "best")}, weights(base["ref"], "best")
    )


def test_truncated_weights_file_given_as_model_weights_is_named(base: dict[str, Path], tmp_path: Path) -> None:
    from hiercls.models import read_state_dict

    f = tmp_path / "w.safetensors"
    f.write_bytes((base["model"] / "model.safetensors").read_bytes()[:100])
    with pytest.raises(ValueError, match=r"w\.safetensors' are not a readable safetensors file"):
        read_state_dict(f)


def test_cli_evaluate_names_a_damaged_checkpoint_in_one_line(
    base: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(base["ref"], run)
    _flip(run / "checkpoints" / "best" / "model.safetensors")
    assert main(["evaluate", "--model", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "best/model.safetensors: content hash" in err


# ------------------------------------------------------------------------------------------ resuming a checkpoint
def _torch_pickle(marker: Path) -> Callable[[Path], None]:
    return lambda run: torch.save({"step": 1, "x": Evil(marker)}, run / "checkpoints" / "last" / "resume.pt")


def _raw_pickle(name: str, marker: Path) -> Callable[[Path], None]:
    return lambda run: (run / "checkpoints" / "last" / name).write_bytes(pickle.dumps(Evil(marker), protocol=2))


def _last(name: str) -> Callable[[Path], Path]:
    return lambda run: run / "checkpoints" / "last" / name


RESUME_ERRORS: list[tuple[str, Callable[[Path, Path], None], str, str]] = [
    # (id, damage(run, marker), culprit under the run folder, message part)
    ("resume-torch-pickle", lambda r, m: _torch_pickle(m)(r), "last/resume.pt", "could run code"),
    ("resume-raw-pickle", lambda r, m: _raw_pickle("resume.pt", m)(r), "last/resume.pt", "could run code"),
    (
        "resume-truncated",
        lambda r, m: _truncate("resume.pt", 300)(r / "checkpoints" / "last"),
        "last/resume.pt",
        "corrupt",
    ),
    ("resume-empty", lambda r, m: _truncate("resume.pt", 0)(r / "checkpoints" / "last"), "last/resume.pt", "corrupt"),
    (
        "resume-not-a-state",
        lambda r, m: torch.save({"step": 1}, _last("resume.pt")(r)),
        "last/resume.pt",
        "not a hiercls resume state (missing optimizer",
    ),
    ("weights-bit-flip", lambda r, m: _flip(_last("model.safetensors")(r)), "last/model.safetensors", "content hash"),
    ("weights-pickle", lambda r, m: _raw_pickle("model.safetensors", m)(r), "last/model.safetensors", "content hash"),
    ("config-bad-json", lambda r, m: _last("config.json")(r).write_text("{"), "last/config.json", "invalid JSON"),
    ("config-pickle", lambda r, m: _raw_pickle("config.json", m)(r), "last/config.json", "corrupt"),
    (
        "config-edited-head",
        lambda r, m: _edit_config(head="flat")(r / "checkpoints" / "last"),
        "last/config.json",
        "'head' is 'flat'",
    ),
]


@pytest.mark.parametrize(("case", "damage", "culprit", "part"), RESUME_ERRORS, ids=[c[0] for c in RESUME_ERRORS])
def test_damaged_checkpoint_is_refused_on_resume(
    base: dict[str, Path], tmp_path: Path, case: str, damage: Callable[[Path, Path], None], culprit: str, part: str
) -> None:
    run, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(base["cut"], run)
    damage(run, marker)
    before = snapshot(run / "checkpoints")
    with pytest.raises(CheckpointError) as info:
        train(recipe(base["tax"], run))
    msg = str(info.value)
    assert str(run / "checkpoints" / culprit) in msg and part in msg, msg
    assert not marker.exists()  # no code from the file ran
    assert snapshot(run / "checkpoints") == before  # the user's checkpoint is untouched


def _stale_tmp(pid: int, which: str = "last") -> Callable[[Path], None]:
    def make(run: Path) -> None:
        shutil.copytree(run / "checkpoints" / "last", run / "checkpoints" / f".{which}.tmp-{pid}-x1")
        (run / "checkpoints" / f".{which}.tmp-{pid}-x1" / "model.safetensors").write_bytes(b"half")

    return make


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


RESUME_OK: list[tuple[str, Callable[[Path], None]]] = [
    ("stale-tmp-dead-pid", lambda run: _stale_tmp(_dead_pid())(run)),
    ("stale-tmp-alive-other-pid", _stale_tmp(1, "best")),  # pid 1 is alive, but the lock proves it is not a writer
    ("killed-between-renames", lambda run: (run / "checkpoints" / "last").rename(run / "checkpoints" / ".last.old")),
    (
        "old-next-to-new",
        lambda run: shutil.copytree(run / "checkpoints" / "last", run / "checkpoints" / ".last.old"),
    ),
    ("no-metrics-log", lambda run: (run / "metrics.jsonl").unlink()),
    ("half-written-results", lambda run: (run / f".results.json.tmp-{_dead_pid()}-x1").write_text('{"st')),
    ("stale-results", lambda run: (run / "results.json").write_text('{"argmax_leaf/accuracy": 0.99}')),
]


@pytest.mark.parametrize(("case", "prepare"), RESUME_OK, ids=[c[0] for c in RESUME_OK])
def test_leftovers_of_killed_runs_are_cleaned_and_resume_is_exact(
    base: dict[str, Path], tmp_path: Path, case: str, prepare: Callable[[Path], None]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(base["cut"], run)
    prepare(run)
    result = train(recipe(base["tax"], run))
    assert result["step"] == 2 and not result["interrupted"]
    assert_same_weights(weights(run), weights(base["ref"]))
    assert leftovers(run) == [] and not [p.name for p in run.iterdir() if ".tmp-" in p.name]
    ref = json.loads((base["ref"] / "results.json").read_text())
    assert result["argmax_leaf/accuracy"] == ref["argmax_leaf/accuracy"]


# ------------------------------------------------------------------------------------------ the run folder
def test_out_dir_that_is_a_file_is_refused(base: dict[str, Path], tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("my notes")
    with pytest.raises(ConfigError, match=r"run\.out_dir: .*notes\.txt' is a file, not a folder"):
        train(recipe(base["tax"], f))
    assert f.read_text() == "my notes"


def test_out_dir_below_a_file_is_refused(base: dict[str, Path], tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("my notes")
    with pytest.raises(ConfigError, match=r"run\.out_dir: cannot create .*notes\.txt/run'"):
        train(recipe(base["tax"], f / "run"))
    assert f.read_text() == "my notes"


def test_read_only_out_dir_is_refused(base: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests may run as root (chmod would not stop root), so the file system's refusal is simulated.
    import hiercls.train.checkpoint as checkpoint

    def refuse(path: Any, flags: int, mode: int = 0o777) -> int:
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(checkpoint.os, "open", refuse)
    with pytest.raises(ConfigError, match=r"run\.out_dir: cannot write .*\.lock' \(Read-only file system\)"):
        train(recipe(base["tax"], tmp_path / "ro"))


def test_a_second_training_into_a_locked_folder_names_the_holder(base: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(base["cut"], run)
    holder = (
        "import fcntl, json, os, socket, sys, time\n"
        f"fd = os.open({str(run / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        # Truncated as lock_folder does: the copied run folder holds the previous holder's (maybe longer) facts.
        "os.ftruncate(fd, 0)\n"
        "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), "
        "'started': '2026-01-01T00:00:00+00:00'}).encode())\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        before = snapshot(run / "checkpoints")
        with pytest.raises(ConfigError) as info:
            train(recipe(base["tax"], run))
        msg = str(info.value)
        assert f"pid {p.pid} on host {socket.gethostname()}, started 2026-01-01" in msg and str(run) in msg
        assert snapshot(run / "checkpoints") == before
    finally:
        p.communicate("")
    # Once the holder is gone (its lock died with it), the run resumes.
    assert train(recipe(base["tax"], run))["step"] == 2


def test_lock_is_held_during_the_run_and_released_after(base: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    seen = []

    def probe(info: dict) -> None:
        fd = os.open(run / ".lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            seen.append("free")
        except BlockingIOError:
            seen.append(json.loads((run / ".lock").read_text())["pid"])
        finally:
            os.close(fd)

    train(recipe(base["tax"], run), callbacks=[probe])
    assert seen == [os.getpid(), os.getpid()]
    fd = os.open(run / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released: would raise otherwise
    os.close(fd)


def test_starting_over_removes_the_previous_runs_outputs(
    base: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    shutil.copytree(base["ref"], run)
    for name in ("eval_probs.npy", "eval_labels.npy", "curves.png"):
        (run / name).write_bytes(b"old")
    old_best = sha256_file(run / "checkpoints" / "best" / "model.safetensors")
    with caplog.at_level(logging.WARNING):
        result = train(recipe(base["tax"], run, **{"run.resume": "false", "optim.lr": 1e-2, "schedule.max_steps": 1}))
    assert (
        "run.resume=false: removing the previous run's checkpoints/best, checkpoints/last, results.json" in caplog.text
    )
    assert result["step"] == 1
    for name in ("eval_probs.npy", "eval_labels.npy", "curves.png"):
        assert not (run / name).exists(), name
    assert json.loads((run / "results.json").read_text())["step"] == 1
    assert sha256_file(run / "checkpoints" / "best" / "model.safetensors") != old_best
    assert yaml.safe_load((run / "config.yaml").read_text())["optim"]["lr"] == 1e-2


def test_starting_over_with_a_broken_recipe_keeps_the_previous_run(base: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(base["ref"], run)
    before = snapshot(run)
    with pytest.raises(HeadOptionError, match="unknown option 'bais'"):
        train(recipe(base["tax"], run, **{"run.resume": "false", "model.head_options": "{bais: false}"}))
    assert snapshot(run) == before


def test_a_finished_run_started_again_keeps_its_results(base: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(base["ref"], run)
    before = (run / "results.json").read_bytes()
    again = train(recipe(base["tax"], run))
    assert (run / "results.json").read_bytes() == before
    assert again["train_loss"] is not None and again["train_loss"] == json.loads(before)["train_loss"]


def test_a_resume_state_of_an_older_hiercls_is_refused_naming_it(base: dict[str, Path], tmp_path: Path) -> None:
    import numpy as np

    run = tmp_path / "run"
    shutil.copytree(base["ref"], run)
    # Older versions pickled NumPy's RNG state into resume.pt, which weights_only=True refuses.
    state = run / "checkpoints" / "last" / "resume.pt"
    torch.save({"step": 2, "rng": [{"numpy": np.random.get_state()}]}, state)
    before = snapshot(run)
    with pytest.raises(CheckpointError, match="written by an older hiercls") as info:
        train(recipe(base["tax"], run))
    assert str(state) in str(info.value) and "run.resume=false" in str(info.value)
    assert snapshot(run) == before


def test_a_changed_config_is_refused_and_nothing_is_removed(base: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(base["cut"], run)
    before = snapshot(run)
    with pytest.raises(ConfigError, match=r"optim\.lr: 0\.003 \(saved\) vs 0\.1 \(now\)"):
        train(recipe(base["tax"], run, **{"optim.lr": 0.1}))
    assert snapshot(run) == before


# ------------------------------------------------------------------------------------------ training faults
def test_diverging_run_stops_at_the_first_non_finite_loss(base: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = recipe(base["tax"], run, **{"optim.lr": 1e6, "run.save_every_steps": 1, "schedule.epochs": 3})
    with pytest.raises(TrainingDiverged) as info:
        train(cfg)
    msg = str(info.value)
    step = int(msg.split(":", 1)[0].removeprefix("step "))
    assert "the training loss is nan at lr 1e+06" in msg or "the training loss is inf at lr 1e+06" in msg
    assert f"{run / 'checkpoints' / 'last'} (step {step - 1}) is kept" in msg
    # The kept checkpoint is whole, finite and loadable; no metrics of the bad step were written.
    model = HierarchicalClassifier.from_pretrained(run / "checkpoints" / "last")
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert torch.load(run / "checkpoints" / "last" / "resume.pt", weights_only=True)["step"] == step - 1
    assert leftovers(run) == []


@pytest.mark.parametrize("where", ["model.safetensors", "resume.pt", "results.json"])
def test_full_disk_names_the_file_and_keeps_the_previous_checkpoint(
    base: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    import hiercls._textio as textio
    import hiercls.models.classifier as classifier
    import hiercls.models.files as files
    import hiercls.train.checkpoint as checkpoint

    run = tmp_path / "run"
    shutil.copytree(base["cut"], run)
    before = snapshot(run / "checkpoints" / "last")
    if where == "model.safetensors":
        real = classifier.save_model

        def full(model: Any, path: str, **kw: Any) -> None:
            real(model, path, **kw)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(classifier, "save_model", full)
    elif where == "resume.pt":
        # torch's zip writer reports a full disk without an errno; the free space tells.
        def enforce_fail(*a: Any, **k: Any) -> None:
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

        monkeypatch.setattr(checkpoint.torch, "save", enforce_fail)
        monkeypatch.setattr(files.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 4096, 4096))
    else:
        real_fsync = textio.os.fsync

        def fsync(fd: int) -> None:  # a full disk surfaces when the written blocks are flushed
            if ".results.json.tmp-" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            real_fsync(fd)

        monkeypatch.setattr(textio.os, "fsync", fsync)
    with pytest.raises(CheckpointError) as info:
        train(recipe(base["tax"], run))
    msg = str(info.value)
    assert where in msg and "no space left on device" in msg, msg
    if where == "results.json":
        assert str(run / "results.json") in msg
        assert not [p for p in run.iterdir() if ".tmp-" in p.name]
    else:
        assert snapshot(run / "checkpoints" / "last") == before  # the step-1 checkpoint is intact
        assert leftovers(run) == []
    if where == "model.safetensors":
        monkeypatch.undo()
        assert train(recipe(base["tax"], run))["step"] == 2  # and resumable once there is space again
        assert_same_weights(weights(run), weights(base["ref"]))


def test_unknown_head_option_names_it_and_the_valid_ones(base: dict[str, Path], tmp_path: Path) -> None:
    cfg = recipe(base["tax"], tmp_path / "run", **{"model.head": "hxe", "model.head_options": "{alpah: 0.5}"})
    with pytest.raises(HeadOptionError, match=r"head 'hxe': unknown option 'alpah' \(did you mean 'alpha'\?\); "):
        train(cfg)
    with pytest.raises(HeadOptionError, match=r"valid options: alpha, bias, normalize"):
        train(cfg)


def test_cli_unknown_head_option_is_one_line(
    base: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config_to_dict(recipe(base["tax"], tmp_path / "run"))), encoding="utf-8")
    assert main(["train", str(path), "--set", "model.head_options={bais: false}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown option 'bais'" in err and "did you mean 'bias'" in err


# ------------------------------------------------------------------------------------------ checkpoint sizes
def test_best_equal_to_last_is_one_copy_and_resume_state_holds_no_weights(base: dict[str, Path]) -> None:
    ref = base["ref"]
    results = json.loads((ref / "results.json").read_text())
    assert results["best_step"] == results["step"] == 2  # one epoch, evaluated at its end
    best, last = ref / "checkpoints" / "best", ref / "checkpoints" / "last"
    for name in ("model.safetensors", "config.json", "taxonomy.json.gz"):
        assert os.stat(best / name).st_ino == os.stat(last / name).st_ino, name
    assert results["run_folder_bytes"] == folder_size(ref) - (ref / "results.json").stat().st_size
    naive = sum(p.stat().st_size for p in ref.rglob("*") if p.is_file())
    assert results["run_folder_bytes"] < naive - (best / "model.safetensors").stat().st_size + 1
    # A finished run drops resume.pt (it can never be used again); an unfinished one keeps it, holding the
    # optimizer's moments (2 per trained parameter) and small state, no copy of the weights.
    assert not (last / "resume.pt").exists()
    state = torch.load(base["cut"] / "checkpoints" / "last" / "resume.pt", weights_only=True)
    assert "model" not in state and "state_dict" not in state
    moments = sum(t.numel() for s in state["optimizer"]["state"].values() for k, t in s.items() if k != "step")
    params = sum(t.numel() for t in weights(ref).values())
    assert moments <= 2 * params


# ------------------------------------------------------------------------------------------ crafted pickles
def test_a_crafted_pickle_in_any_file_never_runs(
    base: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "pwned"
    payloads: dict[str, Callable[[Path], Any]] = {
        "torch": lambda p: torch.save({"a": Evil(marker)}, p),
        "raw": lambda p: p.write_bytes(pickle.dumps(Evil(marker), protocol=2)),
    }
    # Files a run folder holds that some entry point reads; each gets the payload in turn.
    names = ["resume.pt", "model.safetensors", "config.json", "taxonomy.json.gz"]
    expected = {"resume.pt": 1, "model.safetensors": 3, "config.json": 3, "taxonomy.json.gz": 2}
    for kind, write in payloads.items():
        for name in names:
            run = tmp_path / f"{kind}-{name}"
            shutil.copytree(base["ref"], run)
            for which in ("last", "best"):
                if (run / "checkpoints" / which / name).exists():
                    write(run / "checkpoints" / which / name)
            # hiercls train (resume), evaluate --model, from_pretrained: a file an entry point reads is refused
            # with a user error (the finished run reports its results.json without reading any of them).
            cut = tmp_path / f"cut-{kind}-{name}"
            shutil.copytree(base["cut"], cut)
            if (cut / "checkpoints" / "last" / name).exists():
                write(cut / "checkpoints" / "last" / name)
            refused = 0
            calls = [lambda run=run: HierarchicalClassifier.from_pretrained(run / "checkpoints" / "last")]
            if name != "taxonomy.json.gz":  # resuming reads the recipe's taxonomy, never the checkpoint's copy
                calls.append(lambda cut=cut: train(recipe(base["tax"], cut)))
            for call in calls:
                try:
                    call()
                except (ValueError, FileNotFoundError) as err:
                    assert str(tmp_path) in str(err), err
                    refused += 1
            refused += main(["evaluate", "--model", str(run), "--checkpoint", "last"]) == 2
            assert not marker.exists(), (kind, name)
            # resume.pt is read by train only, taxonomy.json.gz by from_pretrained / evaluate only.
            assert refused == expected[name], (kind, name, refused)
    assert "Traceback" not in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ kills (fault injection)
def _launch(recipe_file: Path, marker: Path, fault: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HIERCLS_FAULT_MARKER": str(marker)}
    log = marker.with_name("train.log").open("a")
    env.pop("HIERCLS_FAULT_SLEEP", None)
    if fault:
        env["HIERCLS_FAULT_SLEEP"] = fault
    return subprocess.Popen(
        [sys.executable, "-m", "hiercls", "train", str(recipe_file)],
        env=env,
        stdout=log,
        stderr=log,
    )


def _kill_when(p: subprocess.Popen, marker: Path, extra_delay: float = 0.0, timeout: float = 120.0) -> bool:
    """SIGKILL ``p`` once it has reached a fault point (``marker`` written); ``False`` if it ended first."""
    t0 = time.monotonic()
    while not marker.exists():
        if p.poll() is not None:
            return False
        if time.monotonic() - t0 > timeout:
            p.kill()
            pytest.fail("the training never reached its fault point")
        time.sleep(0.02)
    time.sleep(extra_delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    marker.unlink(missing_ok=True)
    return True


def test_sigkill_inside_checkpoint_writes_and_at_random_times_resumes_exactly(
    base: dict[str, Path], tmp_path: Path
) -> None:
    rng = random.Random(int(os.environ.get("HIERCLS_FAULT_SEED", "2026")))
    # 8 samples, batch 4, 2 epochs: 4 steps, a checkpoint after every step. One thread everywhere: the
    # reference, the killed processes and the last one must do the same float arithmetic.
    common = {
        "data.options.train_samples": 8,
        "data.batch_size": 4,
        "schedule.epochs": 2,
        "run.save_every_steps": 1,
        "run.log_every": 1,
        "run.threads": 1,
    }
    threads = torch.get_num_threads()
    try:
        ref = train(recipe(base["tax"], tmp_path / "ref", **common))
    finally:
        torch.set_num_threads(threads)
    assert ref["step"] == 4
    run = tmp_path / "run"
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text(yaml.safe_dump(config_to_dict(recipe(base["tax"], run, **common))), encoding="utf-8")
    marker = tmp_path / "at-fault-point"
    # Inside the write of a checkpoint (before its files, or after them but before the renames), and between
    # the two renames, each at a randomly chosen save (counters restart in every process); then at a random
    # moment while the writes are slowed down.
    kills = [f"{rng.choice(['write', 'renames'])}:60:{rng.randrange(2)}", f"between-renames:60:{rng.randrange(2)}"]
    for fault in kills:
        assert _kill_when(_launch(recipe_file, marker, fault), marker), fault
    killed_randomly = _kill_when(_launch(recipe_file, marker, "all:0.2"), marker, extra_delay=rng.uniform(0, 0.6))
    # The last process finishes the run (in process, so that its errors show).
    try:
        final = train(load_recipe(recipe_file))
    finally:
        torch.set_num_threads(threads)
    assert final["step"] == 4 and not final["interrupted"], killed_randomly
    assert_same_weights(weights(run), weights(tmp_path / "ref"))
    assert leftovers(run) == []
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert steps == [1, 2, 3, 4]


def load_recipe(path: Path) -> TrainConfig:
    from hiercls.train.config import load_config

    return load_config(path)
