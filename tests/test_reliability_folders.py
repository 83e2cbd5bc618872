"""Reliability of the run folder's ownership and locks (issue 28; docs/reliability.md, "Run folders").

Each case is one thing a user (or a copied folder, a killed launcher, a second start) can do to a run folder,
and asserts the outcome class: refused before any work with a message naming the folder and what was expected,
with every file that was there byte-for-byte the same (and nothing added); or the correct result (resume equal
to an uninterrupted run, the reference). The processes here are real: ``python -m hiercls train``, ``torchrun``
with 2 gloo workers, SIGINT and SIGKILL.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from hiercls.cli import main
from hiercls.models import CheckpointError, create_model
from hiercls.taxonomy import Taxonomy
from hiercls.train.checkpoint import MARKER, RANKS_LOCK, own_folder
from hiercls.train.config import ConfigError, TrainConfig, apply_overrides, config_from_dict, config_to_dict
from hiercls.train.distributed import rank_local_layers
from hiercls.train.loop import train
from hiercls.train.study import run_study

TAXONOMY = "root animal\nroot vehicle\nanimal cat\nanimal dog\nvehicle car\nvehicle bike\nbike ebike\n"
REPO = Path(__file__).resolve().parents[1]


def recipe(tax: Path, out: Path | str, **overrides: object) -> TrainConfig:
    """A tiny ViT on 16 synthetic images, batch 8: 2 steps; one thread (runs in other processes compare bitwise)."""
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
            "run": {"out_dir": str(out), "progress": False, "plot": False, "seed": 5, "threads": 1},
        }
    )
    return apply_overrides(cfg, [f"{k}={v}" for k, v in overrides.items()])


def everything(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder`` (hidden ones included): a file's bytes, ``None`` for a folder."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def weights(run: Path, which: str = "last") -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / which / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def user_files(folder: Path) -> Path:
    """A folder of the user's own: the names a run writes, but not written by hiercls."""
    (folder / "checkpoints" / "best").mkdir(parents=True)
    (folder / "checkpoints" / "best" / "model.safetensors").write_bytes(b"my model")
    (folder / "results.json").write_text('{"mine": true}')
    (folder / "curves.png").write_bytes(b"my plot")
    return folder


def write_recipe(path: Path, cfg: TrainConfig) -> Path:
    path.write_text(yaml.safe_dump(config_to_dict(cfg)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A finished 2-step run (``ref``) and the same run cut after step 1 (``cut``)."""
    d = tmp_path_factory.mktemp("relfolders")
    tax = d / "tax.txt"
    tax.write_text(TAXONOMY, encoding="utf-8")
    threads = torch.get_num_threads()
    try:
        train(recipe(tax, d / "ref"))
        assert train(recipe(tax, d / "cut", **{"schedule.max_steps_this_run": 1}))["step"] == 1
    finally:
        torch.set_num_threads(threads)
    return {"dir": d, "tax": tax, "ref": d / "ref", "cut": d / "cut"}


# ------------------------------------------------------------------------------------------ whose folder
# (id, the run.out_dir given, relative to the working folder, the message part)
REFUSED = [
    ("empty", "", "run.out_dir: must name a folder for the run"),
    ("dot", ".", "is the current folder"),
    ("parent", "..", "is a parent of the current folder"),
    ("home", "~", "is your home folder"),
    ("user-folder", "mine", "already holds files hiercls did not write (checkpoints, curves.png, results.json)"),
]


@pytest.mark.parametrize(("case", "out_dir", "part"), REFUSED, ids=[c[0] for c in REFUSED])
def test_out_dir_that_is_not_the_runs_own_is_refused_and_nothing_is_touched(
    base: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    case: str,
    out_dir: str,
    part: str,
) -> None:
    # The working folder, its parent, home and a folder of theirs hold the user's own files with a run's names.
    home = user_files(tmp_path / "home")
    work = user_files(user_files(home / "projects") / "work")
    user_files(work / "mine")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    recipe_file = write_recipe(tmp_path / "recipe.yaml", recipe(base["tax"], "unused"))
    before = everything(home)
    assert main(["train", str(recipe_file), "--set", f"run.out_dir={out_dir}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hiercls train: error:") and part in err and "\n" not in err, err
    assert "run.out_dir: " in err, err
    assert everything(home) == before  # nothing removed, changed or added (not even a lock file)


def test_a_run_folder_of_another_kind_is_refused(base: dict[str, Path], tmp_path: Path) -> None:
    study = tmp_path / "study"
    os.close(own_folder(study, "study"))
    with pytest.raises(ConfigError, match=r"run\.out_dir: .*study' is not a run folder \(\.hiercls says 'study'\)"):
        train(recipe(base["tax"], study))
    assert sorted(p.name for p in study.iterdir()) == [MARKER, ".lock"]


def test_an_empty_folder_is_used_and_marked(base: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    assert train(recipe(base["tax"], run, **{"schedule.max_steps": 1}))["step"] == 1
    assert json.loads((run / MARKER).read_text())["kind"] == "run"


def test_a_run_folder_of_an_older_hiercls_resumes_with_a_warning(
    base: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # What the previous hiercls wrote: no marker, a resume.pt without the digest of its weights.
    run = tmp_path / "run"
    shutil.copytree(base["cut"], run)
    (run / MARKER).unlink()
    state_file = run / "checkpoints" / "last" / "resume.pt"
    state = torch.load(state_file, weights_only=True)
    del state["weights_sha256"]
    torch.save(state, state_file)
    assert train(recipe(base["tax"], run))["step"] == 2
    assert "written by an older hiercls (no weights_sha256)" in caplog.text
    assert_same_weights(weights(run), weights(base["ref"]))
    assert json.loads((run / MARKER).read_text())["format"] == 1


# ------------------------------------------------------------------------------------------ resume state
def test_a_stale_resume_state_next_to_newer_weights_is_refused_by_name(base: dict[str, Path], tmp_path: Path) -> None:
    # A restored folder: the step-1 resume.pt next to the step-2 weights (which verify on their own).
    run = tmp_path / "run"
    shutil.copytree(base["cut"], run)
    last = run / "checkpoints" / "last"
    for name in ("model.safetensors", "config.json"):
        shutil.copy(base["ref"] / "checkpoints" / "last" / name, last / name)
    before = everything(run)
    with pytest.raises(CheckpointError) as info:
        train(recipe(base["tax"], run))
    msg = str(info.value)
    assert msg.startswith(f"{last / 'resume.pt'}: the resume state of step 1 belongs to other weights than"), msg
    assert str(last / "model.safetensors") in msg
    assert {k: v for k, v in everything(run).items() if k != ".lock"} == {
        k: v for k, v in before.items() if k != ".lock"
    }


def test_a_resume_state_without_its_digest_is_refused_in_a_current_folder(
    base: dict[str, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(base["cut"], run)
    state_file = run / "checkpoints" / "last" / "resume.pt"
    state = torch.load(state_file, weights_only=True)
    del state["weights_sha256"]  # removing the integrity field must not skip the check
    torch.save(state, state_file)
    with pytest.raises(CheckpointError, match=r"resume\.pt: no weights_sha256 \(a current run folder's"):
        train(recipe(base["tax"], run))


# ------------------------------------------------------------------------------------------ one writer
def test_racing_starts_on_one_folder_give_exactly_one_owner(tmp_path: Path) -> None:
    for trial in range(100):
        folder = tmp_path / f"run{trial}"
        gate, outcomes = threading.Barrier(2), []

        def start(folder: Path = folder, gate: threading.Barrier = gate, outcomes: list = outcomes) -> None:
            gate.wait()
            try:
                outcomes.append(own_folder(folder))
            except ConfigError as err:
                outcomes.append(str(err))

        threads = [threading.Thread(target=start) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        owners = [o for o in outcomes if isinstance(o, int)]
        assert len(owners) == 1, (trial, outcomes)
        refused = next(o for o in outcomes if isinstance(o, str))
        assert "is in use by another training" in refused, refused
        os.close(owners[0])


def _cli(recipe_file: Path, log: Path, **env: str) -> subprocess.Popen:
    environ = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}
    with log.open("w") as f:
        return subprocess.Popen([sys.executable, "-m", "hiercls", "train", str(recipe_file)], env=environ, stderr=f)


def test_two_cli_trainings_started_together_one_is_refused(base: dict[str, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    recipe_file = write_recipe(tmp_path / "recipe.yaml", recipe(base["tax"], run))
    # Checkpoint writes pause for 2 s: the winner still holds the folder when the other one asks.
    slow = {"HIERCLS_FAULT_SLEEP": "write:2"}
    procs = [_cli(recipe_file, tmp_path / f"log{i}", **slow) for i in range(2)]
    codes = [p.wait(timeout=300) for p in procs]
    logs = [(tmp_path / f"log{i}").read_text() for i in range(2)]
    assert sorted(codes) == [0, 2], logs
    loser = logs[codes.index(2)]
    assert f"run.out_dir: {str(run)!r} is in use by another training (pid" in loser and "Traceback" not in loser
    assert json.loads((run / "results.json").read_text())["step"] == 2


def test_a_study_locks_its_folder(base: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "study"
    cfg = recipe(base["tax"], out, **{"study.seeds": "[0]"})
    held = own_folder(out, "study")  # a study running there
    try:
        with pytest.raises(ConfigError, match=r"study' is in use by another training \(pid"):
            run_study(cfg)
        assert not (out / "runs").exists()
    finally:
        os.close(held)


def test_a_run_is_refused_while_a_worker_of_an_earlier_ddp_run_lives(base: dict[str, Path], tmp_path: Path) -> None:
    # The launcher and rank 0 are gone (the folder's .lock is free); rank 1 still holds its shared lock.
    run = tmp_path / "run"
    shutil.copytree(base["cut"], run)
    worker = (
        "import fcntl, os, sys\n"
        f"fd = os.open({str(run / RANKS_LOCK)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_SH)\n"
        'os.write(fd, (\'{"ranks": ["h:1", "h:\' + str(os.getpid()) + \'"]}\').encode())\n'
        "print('holding', flush=True)\n"
        "sys.stdin.read()\n"
    )
    p = subprocess.Popen([sys.executable, "-c", worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "holding"
        with pytest.raises(ConfigError, match=rf"still in use by workers of an earlier DDP run \(h:1, h:{p.pid};"):
            train(recipe(base["tax"], run))
    finally:
        p.communicate("")
    assert train(recipe(base["tax"], run))["step"] == 2


def _lock_free(path: Path) -> bool:
    """No process holds a flock on ``path`` (a run folder's ``.lock`` or ``.lock-ranks``)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing drops the lock again
    return True


def _alive(pid: int) -> bool:
    """Running (a zombie that no one reaped yet counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_killing_the_torchrun_launcher_kills_its_workers(base: dict[str, Path], tmp_path: Path) -> None:
    run, marker = tmp_path / "run", tmp_path / "at-checkpoint"
    cfg = recipe(base["tax"], run, **{"run.device": "cpu", "run.save_every_steps": 1})
    recipe_file = write_recipe(tmp_path / "recipe.yaml", cfg)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env |= {"HIERCLS_FAULT_SLEEP": "write:120", "HIERCLS_FAULT_MARKER": str(marker)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port())]
    with (tmp_path / "torchrun.log").open("w") as log:
        launcher = subprocess.Popen([*cmd, "-m", "hiercls", "train", str(recipe_file)], env=env, stdout=log, stderr=log)
    try:
        t0 = time.monotonic()
        while not marker.exists():  # rank 0 is inside its first checkpoint write, rank 1 waits for it
            assert launcher.poll() is None and time.monotonic() - t0 < 240, (tmp_path / "torchrun.log").read_text()
            time.sleep(0.1)
        ranks = json.loads((run / RANKS_LOCK).read_text())["ranks"]
        pids = [int(r.rsplit(":", 1)[1]) for r in ranks]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        t0 = time.monotonic()
        while any(_alive(p) for p in pids) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), "the workers outlived their launcher"
        # A dead worker's leader thread reads as a zombie while its other threads still exit (its files, the folder's
        # two locks among them, close with the last one): the resume waits for both, as a user's would be refused.
        while not (_lock_free(run / ".lock") and _lock_free(run / RANKS_LOCK)) and time.monotonic() - t0 < 60:
            time.sleep(0.2)
    finally:
        launcher.kill()
    threads = torch.get_num_threads()
    try:
        assert train(recipe(base["tax"], run, **{"run.save_every_steps": 1}))["step"] == 2  # the folder is free
    finally:
        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------ Ctrl-C, absurd values
def test_ctrl_c_stops_with_one_line_and_the_run_resumes_exactly(base: dict[str, Path], tmp_path: Path) -> None:
    run, marker = tmp_path / "run", tmp_path / "at-checkpoint"
    recipe_file = write_recipe(tmp_path / "recipe.yaml", recipe(base["tax"], run, **{"run.save_every_steps": 1}))
    # Paused in the second checkpoint write (step 2); step 1's checkpoint is saved.
    log = tmp_path / "log"
    p = _cli(recipe_file, log, HIERCLS_FAULT_SLEEP="write:120:1", HIERCLS_FAULT_MARKER=str(marker))
    t0 = time.monotonic()
    while not marker.exists():
        assert p.poll() is None and time.monotonic() - t0 < 240, log.read_text()
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 130
    err = log.read_text()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines()[-1] == (
        "hiercls train: interrupted (Ctrl-C); run the same command again to resume from the last checkpoint in "
        f"{str(run)!r}"
    )
    threads = torch.get_num_threads()
    try:
        assert train(recipe(base["tax"], run, **{"run.save_every_steps": 1}))["step"] == 2
    finally:
        torch.set_num_threads(threads)
    assert_same_weights(weights(run), weights(base["ref"]))


ABSURD = [
    ("lr-1e300", ["--set", "optim.lr=1e300"], "--set: optim.lr: must be <= 1e+06 (a weight moves by about lr per"),
    ("head-lr", ["--set", "optim.head_lr=1e300"], "--set: optim.head_lr: must be <= 1e+06 (a weight moves by"),
    ("weight-decay", ["--set", "optim.weight_decay=1e300"], "--set: optim.weight_decay: must be <= 1e+06, got 1e+300"),
]


@pytest.mark.parametrize(("case", "args", "message"), ABSURD, ids=[c[0] for c in ABSURD])
def test_absurd_optimizer_values_are_one_clear_line(
    base: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, args: list, message: str
) -> None:
    recipe_file = write_recipe(tmp_path / "recipe.yaml", recipe(base["tax"], tmp_path / "run"))
    assert main(["train", str(recipe_file), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hiercls train: error: {message}") and err.endswith("got 1e+300") and "\n" not in err
    assert not (tmp_path / "run").exists()


def test_a_yaml_alias_bomb_in_a_recipe_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 10 levels of 9 aliases: 9^10 (3.5e9) nodes once expanded, a few hundred bytes on disk.
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(
        "description: boom\n" + "\n".join(f"  {x}" if i else f"x_bomb:\n  {x}" for i, x in enumerate(lines))
    )
    assert main(["train", str(bomb)]) == 2  # without the bound: memory runs out while the recipe is read
    err = capsys.readouterr().err
    assert f"hiercls train: error: {bomb}:" in err and "expand to more than 1,000,000 nodes" in err, err


# ------------------------------------------------------------------------------------------ DDP vs one process
def _ddp_worker(rank: int, world: int, port: int, cfg: TrainConfig) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1")
    os.environ.update(MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    train(cfg)


def test_ddp_ends_within_float_rounding_of_one_process_at_default_settings(
    base: dict[str, Path], tmp_path: Path
) -> None:
    # The tiny ViT has no batch norm and no dropout, so only the summation order differs: measured 1.8e-5 at
    # most (attention biases, whose gradient Adam normalises), 6 steps over 22 samples, default eps.
    common = {"data.options.train_samples": 22, "data.options.val_samples": 11, "schedule.epochs": 2}
    threads = torch.get_num_threads()
    try:
        single = train(recipe(base["tax"], tmp_path / "single", **common))
    finally:
        torch.set_num_threads(threads)
    cfg = recipe(base["tax"], tmp_path / "ddp", **common)
    torch.multiprocessing.spawn(_ddp_worker, args=(2, _free_port(), cfg), nprocs=2, join=True)
    a, b = weights(tmp_path / "single"), weights(tmp_path / "ddp")
    gap = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert single["step"] == 6 and gap <= 1e-4, gap
    ddp = json.loads((tmp_path / "ddp" / "results.json").read_text())
    assert ddp["argmax_leaf/accuracy"] == single["argmax_leaf/accuracy"]


def test_layers_that_make_ddp_differ_from_one_process_are_named() -> None:
    tax = Taxonomy([("r", "a"), ("r", "b")])
    assert rank_local_layers(create_model("timm:test_vit", tax, head="flat", img_size=16)) is None
    found = rank_local_layers(create_model("timm:test_resnet", tax, head="flat"))
    assert found is not None and "batch-norm layer(s) (each rank normalises by its own share" in found
