"""The run folder's life cycle: :meth:`RunFolder.open` locks it, settles what killed runs left and decides once.

The decision, made before anything is built (every rank reads the folder after rank 0 has settled it):

* **finished**: ``results.json`` records the step of ``checkpoints/last`` (or ``last`` has no ``resume.pt``
  left, which a run drops when it finishes): :attr:`RunFolder.results` is the answer; nothing is trained.
* **resume**: ``checkpoints/last/resume.pt`` exists and ``config.yaml`` is the config given now (up to
  :data:`RESUME_FREE_KEYS`): :meth:`RunFolder.restore` puts the weights, optimizer, scheduler, scaler, EMA,
  data position, every rank's RNG and the best metric back, bit for bit.
* **fresh**: nothing to resume, or ``run.resume=false``.

Then, in the order a run meets them (docs/reliability.md states them as promises; rank 0 writes every file):

* ``run.out_dir`` must be a writable folder of the run's own, checked before anything is written: new (created),
  empty, or one hiercls created (its :data:`MARKER` file ``.hiercls``, written when the folder is first used).
  An empty value, the current folder (``.``), its parents, the home folder (``~``) and a folder holding files
  hiercls did not write are refused, so a new run can never delete a user's files. (A run folder of an older
  hiercls, recognised by its ``config.yaml`` and ``metrics.jsonl``, is marked and used.)
* ``<out_dir>/.lock`` is held (``fcntl.flock``, taken atomically) for the whole run and names its holder (pid,
  host, start time): a second training into the same folder is refused at once with those facts. The kernel
  drops the lock when the holder dies, so a killed run never leaves a stale lock. Every rank of a DDP run also
  holds ``.lock-ranks`` (shared) until it ends, and the workers die with their launcher
  (:func:`hiercls.train.distributed.die_with_launcher`): no run starts while a worker of an earlier one lives.
* Files and checkpoint folders are written by :func:`hiercls._textio.atomic_write` / ``atomic_dir`` (a
  temporary sibling renamed into place); at start, what a killed run left of them is removed or put back
  (:func:`hiercls._textio.recover_atomic`).
* :meth:`RunFolder.claim` runs once the recipe has proved buildable: starting fresh removes the previous run's
  outputs (:data:`PREVIOUS_RUN_OUTPUTS`, so a new run's files never sit next to an old run's ``best/``) and
  every start writes ``config.yaml``.
* ``resume.pt`` holds tensors and plain values only and is read with ``weights_only=True``; one that holds
  anything else (a crafted pickle, the NumPy objects an older hiercls pickled) is refused, naming the file.
  It names the SHA-256 of the ``model.safetensors`` it was saved with: a ``resume.pt`` next to other weights (a
  copied or restored folder) is refused, and so is one without the digest in a folder of the current format.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import random
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from safetensors.torch import load_model

from hiercls._textio import atomic_dir, atomic_write, recover_atomic
from hiercls.models import HierarchicalClassifier
from hiercls.models.classifier import verify_model_files
from hiercls.models.files import CheckpointError, folder_size, read_json_file, sha256_file, writing
from hiercls.taxonomy import Taxonomy
from hiercls.train.config import ConfigError, TrainConfig, config_to_dict, save_config
from hiercls.train.distributed import DistInfo, all_gather_object, barrier
from hiercls.train.plots import read_log

try:  # POSIX; elsewhere runs are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

__all__ = [
    "PREVIOUS_RUN_OUTPUTS",
    "RESUME_FREE_KEYS",
    "RunFolder",
    "TrainState",
    "lock_folder",
    "own_folder",
    "seed_everything",
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
        "run.loggers",
        "run.find_unused_parameters",
        "schedule.max_steps_this_run",
        "data.num_workers",
        "eval.save_probs",
        "description",
        "compare_heads",
    }
)
#: What a run writes into its folder (besides config.yaml and metrics.jsonl, which a fresh start rewrites).
PREVIOUS_RUN_OUTPUTS = (
    "checkpoints/best",
    "checkpoints/last",
    "results.json",
    "comparison.json",
    "eval_probs.npy",
    "eval_labels.npy",
    "curves.png",
    "tensorboard",
)
#: The file that marks a folder as hiercls's own: ``{"kind": "run" | "study", "created", "format"}``.
MARKER = ".hiercls"
#: The format of the run folders this hiercls writes (2: resume.pt names the digest of its weights).
RUN_FORMAT = 2
#: Held (shared) by every rank of a DDP run for its whole life, so that no new run starts while one lives.
RANKS_LOCK = ".lock-ranks"
#: Keys every ``resume.pt`` holds (written by :meth:`RunFolder.save_last`).
RESUME_KEYS = ("optimizer", "scheduler", "scaler", "data", "step", "rng")
#: Dict-valued config fields compared as one value (their keys are the user's, not the recipe's).
_FREE_FORM = ("head_options", "options", "backbone_options", "taxonomy_options")


@dataclass
class TrainState:
    """What a checkpoint saves and restores: the objects training changes and where it stands."""

    model: HierarchicalClassifier
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    loader: Any  # a hiercls.data loader: state_dict / load_state_dict / set_epoch
    taxonomy: Taxonomy
    step: int = 0
    epoch: int = 0
    at_epoch_start: bool = False  # between epochs (the loader still reports the end of the previous one)
    best_value: float | None = None
    best_key: str | None = None
    best_step: int | None = None  # the step of checkpoints/best
    train_loss: float | None = None  # the last logged mean training loss
    ema: Any = None  # timm's ModelEmaV3 of the model (model.ema), or None
    teacher_sha256: str | None = None  # the model.teacher weights' digest (a resume with other weights is refused)


class RunFolder:
    """``run.out_dir`` of one training: use :meth:`open` (a context manager that holds the lock).

    Attributes:
        path: the folder.
        results: a finished run's saved ``results.json`` (then nothing else is to be done), else ``None``.
        resuming: ``True`` when :meth:`restore` is to be called after building.
        saved_step: the step of ``checkpoints/last`` (``None`` before the first save of a fresh run).
    """

    def __init__(self, cfg: TrainConfig, info: DistInfo) -> None:
        self.cfg, self.info, self.path = cfg, info, cfg.out_dir
        self.lock: int | None = None  # the descriptor holding the flock (rank 0)
        self.ranks_lock: int | None = None  # every rank of a DDP run: a shared flock of .lock-ranks
        self.results: dict[str, Any] | None = None
        self.fresh_reason: str | None = None  # why the run starts fresh (None: it resumes or has finished)
        self.resume_state: dict[str, Any] | None = None
        self.saved_step: int | None = None

    @classmethod
    def open(cls, cfg: TrainConfig, info: DistInfo) -> RunFolder:
        """Lock the folder, clean up after killed runs, decide finished / resume / fresh (nothing is written).

        Raises:
            ConfigError: an unusable folder, a folder in use, a changed config, ``run.resume=true`` without state.
            CheckpointError: an unreadable ``resume.pt`` (or a finished run's unreadable ``results.json``).
        """
        folder = cls(cfg, info)
        try:
            folder._settle()
            folder._decide()
        except BaseException:
            folder.close()
            raise
        return folder

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock."""
        for fd in (self.ranks_lock, self.lock):
            if fd is not None:
                os.close(fd)  # closing the descriptor releases the flock; the file keeps the holder's facts
        self.lock = self.ranks_lock = None

    @property
    def resuming(self) -> bool:
        return self.resume_state is not None

    def _settle(self) -> None:
        """Rank 0 locks and cleans up first; every rank learns its verdict before looking at the folder."""
        problem = None
        if self.info.is_main:
            try:
                self.lock = own_folder(self.path)
                check_no_workers(self.path)
                for folder in (self.path, self.path / "checkpoints"):
                    if folder.is_dir():
                        recover_atomic(folder, others_are_gone=fcntl is not None)  # the lock proves it
            except (ConfigError, CheckpointError) as err:
                problem = err
        verdicts = all_gather_object(None if problem is None else str(problem))
        if problem is not None:
            raise problem
        if verdicts[0] is not None:
            raise ConfigError(verdicts[0])
        if self.info.distributed and fcntl is not None:
            # Every rank holds .lock-ranks until it ends: a run started while any of them lives is refused.
            self.ranks_lock = hold_shared(self.path / RANKS_LOCK)
            pids = all_gather_object(f"{socket.gethostname()}:{os.getpid()}")
            if self.info.is_main:
                os.ftruncate(self.ranks_lock, 0)
                os.write(self.ranks_lock, (json.dumps({"ranks": pids}) + "\n").encode())

    def _decide(self) -> None:
        """Finished, resume or fresh (see the module docstring)."""
        last = self.path / "checkpoints" / "last"
        state_file, done = last / "resume.pt", self.path / "results.json"
        # A finished run drops its resume state (unless run.keep_resume_state); its results.json marks it finished.
        resumable = state_file.is_file() or (last.is_dir() and done.is_file())
        if self.cfg.run.resume is True and not resumable:
            raise ConfigError(
                f"run.resume: true but {str(state_file)!r} does not exist (use run.resume=auto to start fresh "
                "when there is nothing to resume)"
            )
        if self.cfg.run.resume is False or not resumable:
            self.fresh_reason = "run.resume=false" if resumable else "starting a new run"
            return
        self._check_config()
        saved = self._saved_results()
        if state_file.is_file():
            state = read_resume_state(state_file)
            check_state_weights(state, last, int(folder_marker(self.path).get("format", RUN_FORMAT)))
            finished = saved is not None and saved.get("step") == int(state["step"])
            self.results, self.resume_state = (saved, None) if finished else (None, state)
        elif saved is None:
            raise CheckpointError(
                f"{done}: unreadable, and the finished run's resume state was removed; its final model is {last}. "
                "Start over with --set run.resume=false"
            )
        else:
            self.results = saved
        if self.results is not None and self.info.is_main:
            logger.info(
                "%s: the run finished at step %s; its saved results are reported", self.path, self.results.get("step")
            )

    def _check_config(self) -> None:
        saved_file = self.path / "config.yaml"
        if not saved_file.is_file():
            return
        saved = yaml.safe_load(saved_file.read_text(encoding="utf-8")) or {}
        # Keys an older hiercls did not write had today's defaults then (adamw, cosine, no EMA...).
        saved = _with_defaults(config_to_dict(TrainConfig()), saved)
        diffs = config_differences(saved, config_to_dict(self.cfg))
        if diffs:
            raise ConfigError(
                f"{saved_file}: the run in {str(self.path)!r} was started with a different config "
                f"({'; '.join(diffs[:5])}); resume with the same config, or pass --set run.resume=false to "
                "start over, or choose another run.out_dir"
            )

    def _saved_results(self) -> dict[str, Any] | None:
        done = self.path / "results.json"
        if not done.is_file():
            return None
        try:
            final = read_json_file(done, "run's results")
        except CheckpointError as err:
            logger.warning("%s; evaluating the final checkpoint again", err)
            return None
        return final if isinstance(final, dict) else None

    # ------------------------------------------------------------------ starting
    def claim(self) -> None:
        """Once the recipe has proved buildable: clear a previous run when starting fresh, write ``config.yaml``.

        Not earlier, so that a recipe that fails to build leaves the folder (and its config.yaml) as it was.
        """
        barrier()  # every rank has read the saved config before rank 0 may overwrite it
        if self.info.is_main:
            if self.fresh_reason is not None:
                # A new run's best/, results and probabilities must never sit next to an old run's.
                clear_previous_run(self.path, self.fresh_reason)
                (self.path / "metrics.jsonl").write_text("", encoding="utf-8")
            with writing(self.path / "config.yaml"):
                save_config(self.cfg, self.path / "config.yaml")
        barrier()

    def restore(self, s: TrainState) -> None:
        """Weights, optimizer, scheduler, scaler, EMA, data position, step, best metric and this rank's RNG into
        ``s``."""
        state, last = self.resume_state, self.path / "checkpoints" / "last"
        assert state is not None, "restore() of a run folder that does not resume"
        if state.get("taxonomy_fingerprint") not in (None, s.taxonomy.fingerprint):
            raise ConfigError(
                f"{last / 'resume.pt'}: saved for taxonomy fingerprint {state['taxonomy_fingerprint']} but the "
                f"config's taxonomy {s.taxonomy.name!r} has {s.taxonomy.fingerprint}"
            )
        if state.get("teacher_sha256") != s.teacher_sha256:
            raise ConfigError(
                f"{last / 'resume.pt'}: saved with model.teacher weights {state.get('teacher_sha256')} but "
                f"model.teacher.path now has {s.teacher_sha256}; restore that teacher or start over with "
                "--set run.resume=false"
            )
        load_model_weights(s.model, last)
        load_optimization_state(state, s.optimizer, s.scheduler, s.scaler, s.ema)
        s.loader.load_state_dict(state["data"])
        s.step, s.epoch = int(state["step"]), int(state["data"]["epoch"])
        s.best_value, s.best_key, s.best_step = state.get("best_value"), state.get("best_key"), state.get("best_step")
        rngs, rank, world = state["rng"], self.info.rank, self.info.world_size
        if len(rngs) == world:
            set_rng_state(rngs[rank])
        else:
            logger.warning("resuming %d-rank state on %d ranks: RNG streams are reseeded", len(rngs), world)
            seed_everything(self.cfg.run.seed + rank + 7919 * s.step)
        self.saved_step, self.resume_state = s.step, None
        if self.info.is_main:
            # The log up to the checkpoint is kept; its last training loss is the run's until new steps log.
            s.train_loss = truncate_log(self.path / "metrics.jsonl", s.step)
            index = state["data"]["index"]
            logger.info("resumed from %s at step %d (epoch %d, sample %d)", last, s.step, s.epoch, index)

    # ------------------------------------------------------------------ writing
    def save_best(self, model: HierarchicalClassifier, results: dict[str, Any]) -> None:
        """``checkpoints/best``: the weights and a model card with ``results`` (written atomically)."""
        if self.info.is_main:
            best = self.path / "checkpoints" / "best"
            with writing(best), atomic_dir(best) as d:
                model.save_pretrained(d, metrics=results)
        barrier()

    def save_last(self, s: TrainState) -> None:
        """``checkpoints/last``: the weights and everything exact resumption needs (written atomically).

        ``resume.pt`` holds the optimizer, scheduler, scaler, EMA weights, data position and RNG states, not the
        trained weights (they are the checkpoint's ``model.safetensors``). When ``best`` is the same step (and
        holds the trained weights, not the EMA's), ``last`` hard-links its files instead of a second copy (files
        are only ever replaced, never rewritten in place, so the two folders cannot diverge by a later write).
        """
        rngs = all_gather_object(rng_state())
        if self.info.is_main:
            data_state = s.loader.state_dict()
            if s.at_epoch_start:
                data_state = {**data_state, "epoch": s.epoch, "index": 0}
            state = {
                **optimization_state(s.optimizer, s.scheduler, s.scaler, s.ema),
                "data": data_state,
                "step": s.step,
                "rng": rngs,
                "best_value": s.best_value,
                "best_key": s.best_key,
                "best_step": s.best_step,
                "world_size": self.info.world_size,
                "taxonomy_fingerprint": s.taxonomy.fingerprint,
                "teacher_sha256": s.teacher_sha256,
            }
            last, best = self.path / "checkpoints" / "last", self.path / "checkpoints" / "best"
            with writing(last), atomic_dir(last) as d:
                best_is_raw = s.ema is None or self.cfg.model.ema.best_on == "raw"  # else best holds the EMA's
                if not (best_is_raw and s.best_step == s.step and best.is_dir() and link_tree(best, d)):
                    s.model.save_pretrained(d)
                state["weights_sha256"] = sha256_file(d / "model.safetensors")  # ties the state to these weights
                write_resume_state(d / "resume.pt", state)
        self.saved_step = s.step
        barrier()

    def save_probs(self, probs: np.ndarray | None, labels: np.ndarray | None, num_nodes: int) -> None:
        """``eval_probs.npy`` / ``eval_labels.npy`` in data set order, gathered from every rank."""
        gathered = all_gather_object((probs, labels))
        if not self.info.is_main:
            return
        world = self.info.world_size
        # Ranks hold interleaved shards (r, r + w, ...): restore the data set order.
        n = sum(len(y) for _, y in gathered if y is not None)
        p_all = np.zeros((n, num_nodes) + (() if probs is None else probs.shape[2:]), np.float32)
        y_all = np.zeros(n, np.int64) if labels is None or labels.ndim == 1 else None
        for r, (p, y) in enumerate(gathered):
            if p is not None:
                p_all[r::world] = p
                if y_all is not None:
                    y_all[r::world] = y
        for name, array in (("eval_probs.npy", p_all), ("eval_labels.npy", y_all)):
            if array is not None:
                with writing(self.path / name), atomic_write(self.path / name, "wb") as f:
                    np.save(f, array)

    def evaluation_at(self, step: int | None) -> dict[str, Any] | None:
        """The metrics of the evaluation logged at ``step`` (from ``metrics.jsonl``), or ``None``."""
        log = self.path / "metrics.jsonl"
        records = read_log(log) if log.is_file() else []
        found = [r for r in records if r.get("type") == "eval" and r.get("step") == step]
        if not found:
            return None
        return {k: v for k, v in found[-1].items() if "/" in k or k in ("eval_loss", "calibration")}

    def finish(self, final: dict[str, Any], interrupted: bool) -> dict[str, Any]:
        """Rank 0: the folder's size into ``final``; a finished run writes ``results.json`` and drops ``resume.pt``."""
        if self.info.is_main:
            # Finished: the optimizer's moments in resume.pt (twice the weights) can never be used again.
            state = self.path / "checkpoints" / "last" / "resume.pt"
            drop = not interrupted and not self.cfg.run.keep_resume_state and state.is_file()
            size = folder_size(self.path) - (state.stat().st_size if drop else 0)
            final["run_folder_bytes"] = size
            step, best_step = final["step"], final["best_step"]
            one_copy = f" (best = last = step {step}, one copy)" if best_step == self.saved_step == step else ""
            logger.info("run folder %s: %.1f MB%s", self.path, size / 1e6, one_copy)
            if not interrupted:
                text = json.dumps(final, indent=2)
                with writing(self.path / "results.json"), atomic_write(self.path / "results.json") as f:
                    f.write(text)
                if drop:
                    # After results.json: a kill in between leaves a run that still reads as finished.
                    state.unlink()
                    logger.info("removed %s: the run is finished (run.keep_resume_state=true keeps it)", state)
        barrier()
        return final


# ------------------------------------------------------------------------------------------- the folder
def own_folder(out_dir: Path, kind: str = "run") -> int:
    """Check, create and lock ``out_dir`` for a ``kind`` (``run`` or ``study``) before any work; returns the lock.

    The folder must be new, empty, or one hiercls created (its :data:`MARKER` file, written here on first use,
    says so); the current folder, its parents, the home folder and a folder of someone else's files are refused
    before anything is written into them. The lock is taken atomically (``flock``), then the marker is written.

    Raises:
        ConfigError: naming ``run.out_dir``, the path and what was expected.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "notes.txt").write_text("mine")
        >>> own_folder(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hiercls.train.config.ConfigError: run.out_dir: ... already holds files hiercls did not write (notes.txt) ...
        >>> fd = own_folder(d / "run")
        >>> sorted(p.name for p in (d / "run").iterdir())
        ['.hiercls', '.lock']
        >>> os.close(fd)
    """
    run_format = check_out_dir(out_dir, kind)
    fd = lock_folder(out_dir)
    try:
        marker = out_dir / MARKER
        if not marker.is_file():
            created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            with atomic_write(marker, encoding="utf-8") as f:
                f.write(json.dumps({"kind": kind, "created": created, "format": run_format}) + "\n")
    except OSError as err:
        os.close(fd)
        raise ConfigError(f"run.out_dir: cannot write {str(marker)!r} ({err.strerror or err})") from None
    return fd


def check_out_dir(out_dir: Path, kind: str = "run") -> int:
    """Create ``out_dir`` if needed; refuse a shared folder, someone else's folder, a file or a read-only path.

    Returns the folder's format: :data:`RUN_FORMAT`, or 1 for a run folder of a hiercls that wrote no marker.

    Raises:
        ConfigError: naming ``run.out_dir``, the path and the reason.
    """
    _refuse_shared(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"run.out_dir: {str(out_dir)!r} is a file, not a folder; choose another run.out_dir")
    run_format = _check_owner(out_dir, kind) if out_dir.is_dir() else RUN_FORMAT
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"run.out_dir: cannot create {str(out_dir)!r} ({err.strerror or err}); choose another run.out_dir"
        ) from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"run.out_dir: {str(out_dir)!r} is not writable (permission denied); choose another one")
    return run_format


def _refuse_shared(out_dir: Path) -> None:
    """The current folder, a parent of it, the home folder or a file system root is nobody's run folder."""
    if not str(out_dir).strip() or str(out_dir) == ".":
        where = "empty (an unset variable?)" if not str(out_dir).strip() else "'.'"
        raise ConfigError(
            f"run.out_dir: {where} is the current folder {str(Path.cwd())!r}; a run needs a folder of its own, "
            "e.g. runs/{name}"
        )
    target, cwd = out_dir.expanduser().resolve(), Path.cwd().resolve()
    shared = {cwd: "the current folder", Path.home().resolve(): "your home folder", Path(target.anchor): "a root"}
    shared.update({parent: "a parent of the current folder" for parent in cwd.parents if parent not in shared})
    if target in shared:
        raise ConfigError(
            f"run.out_dir: {str(out_dir)!r} is {shared[target]} ({str(target)!r}); a run needs a folder of its "
            "own, e.g. runs/{name}"
        )


def _check_owner(folder: Path, kind: str) -> int:
    """An existing folder: hiercls's own (its marker, of the same kind), empty, or an older hiercls's run folder."""
    marker = folder / MARKER
    if marker.is_file():
        made = folder_marker(folder)
        if made.get("kind") != kind:
            raise ConfigError(
                f"run.out_dir: {str(folder)!r} is not a {kind} folder ({MARKER} says {made.get('kind')!r}); choose "
                "another run.out_dir"
            )
        return int(made.get("format", RUN_FORMAT))
    # A starting run's lock and marker may already be there (it is then refused as "in use").
    others = sorted(p.name for p in folder.iterdir() if not p.name.startswith((".lock", MARKER, f".{MARKER}")))
    if not others:
        return RUN_FORMAT
    if kind == "run" and _older_run_folder(folder):
        logger.info("%s: a run folder of an older hiercls; marking it as hiercls's (%s)", folder, MARKER)
        return 1
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    raise ConfigError(
        f"run.out_dir: {str(folder)!r} already holds files hiercls did not write ({shown}) and no {MARKER} "
        f"marker; expected a new or empty folder, or a {kind} folder hiercls created. Choose another run.out_dir "
        "(nothing was written)"
    )


def folder_marker(folder: Path) -> dict[str, Any]:
    """The facts of ``folder``'s :data:`MARKER` (``{}`` when it is missing or unreadable)."""
    try:
        made = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return made if isinstance(made, dict) else {}


def _older_run_folder(folder: Path) -> bool:
    """A run folder of a hiercls that wrote no marker: its config.yaml (a recipe) and metrics.jsonl."""
    config, log = folder / "config.yaml", folder / "metrics.jsonl"
    if not (config.is_file() and log.is_file()) or config.stat().st_size > 1_000_000:
        return False
    try:
        saved = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return False
    return isinstance(saved, dict) and {"model", "data", "run"} <= saved.keys()


def lock_folder(out_dir: Path) -> int:
    """Take the exclusive ``flock`` of ``<out_dir>/.lock`` without waiting and write the holder's facts into it.

    Returns the descriptor: closing it releases the lock (the file stays: removing it would let two processes
    lock two different files). The kernel drops the lock when the holder dies.

    Raises:
        ConfigError: another process holds it (its pid, host and start time are named), or the folder is read-only.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> fd = lock_folder(d)
        >>> lock_folder(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hiercls.train.config.ConfigError: run.out_dir: ... is in use by another training (pid ...
        >>> os.close(fd)
        >>> os.close(lock_folder(d))
    """
    path = out_dir / ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise ConfigError(
            f"run.out_dir: cannot write {str(path)!r} ({err.strerror or err}); the folder is read-only or "
            "not yours: choose another run.out_dir"
        ) from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(f"run.out_dir: cannot lock {str(path)!r} ({err.strerror or err})") from None
        raise ConfigError(
            f"run.out_dir: {str(out_dir)!r} is in use by another training ({_holder(path)}); wait for it "
            "to finish or stop it, or choose another run.out_dir"
        ) from None
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n").encode())
    return fd


def check_no_workers(out_dir: Path) -> None:
    """Refuse ``out_dir`` while a process of an earlier DDP run still holds its ``.lock-ranks`` (call under the lock).

    Raises:
        ConfigError: naming the folder and the processes (host:pid of every rank).
    """
    path = out_dir / RANKS_LOCK
    if fcntl is None or not path.is_file():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        try:
            ranks = ", ".join(json.loads(path.read_text(encoding="utf-8"))["ranks"])
        except (OSError, ValueError, KeyError, TypeError):
            ranks = "unknown pids"
        raise ConfigError(
            f"run.out_dir: {str(out_dir)!r} is still in use by workers of an earlier DDP run ({ranks}; their "
            "launcher is gone); stop them first, or choose another run.out_dir"
        ) from None
    finally:
        os.close(fd)


def hold_shared(path: Path) -> int:
    """A shared ``flock`` of ``path`` (created if missing), held until the returned descriptor is closed."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # only a starting run's check holds it exclusively, for an instant
    except BaseException:
        os.close(fd)
        raise
    return fd


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet written its pid"


def clear_previous_run(out_dir: Path, reason: str) -> list[str]:
    """Remove the outputs of a previous run in ``out_dir`` (see :data:`PREVIOUS_RUN_OUTPUTS`); returns their names."""
    found = [name for name in PREVIOUS_RUN_OUTPUTS if (out_dir / name).exists()]
    if found:
        logger.warning("%s: removing the previous run's %s from %s", reason, ", ".join(found), out_dir)
    for name in found:
        p = out_dir / name
        with writing(p):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    return found


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """``"<dotted key>: <saved> (saved) vs <current> (now)"`` for every key that differs and matters on resume."""
    diffs = []
    for key in sorted(set(saved) | set(current)):
        dotted = f"{prefix}{key}"
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and key not in _FREE_FORM:
            diffs += config_differences(a, b, f"{dotted}.")
        elif a != b and dotted not in RESUME_FREE_KEYS:
            diffs.append(f"{dotted}: {a!r} (saved) vs {b!r} (now)")
    return diffs


def _with_defaults(defaults: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with the keys it lacks taken from ``defaults`` (nested sections merged, free-form dicts not)."""
    merged = dict(saved)
    for key, value in defaults.items():
        if key not in merged:
            merged[key] = value
        elif isinstance(value, dict) and isinstance(merged[key], dict) and key not in _FREE_FORM:
            merged[key] = _with_defaults(value, merged[key])
    return merged


def truncate_log(path: Path, step: int) -> float | None:
    """Drop log records written after ``step`` (they will be logged again); the last training loss that remains."""
    if not path.is_file():
        return None
    keep, loss = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError, AttributeError, TypeError):
            record = json.loads(line)
            if record.get("step", 0) <= step:
                keep.append(line)
                if record.get("type") == "train" and isinstance(record.get("loss"), (int, float)):
                    loss = float(record["loss"])
    with writing(path), atomic_write(path, encoding="utf-8") as f:
        f.write("".join(k + "\n" for k in keep))
    return loss


# ------------------------------------------------------------------------------------------- checkpoints
def optimization_state(
    optimizer: torch.optim.Optimizer, scheduler: Any, scaler: torch.amp.GradScaler, ema: Any = None
) -> dict[str, Any]:
    """The optimizer's, schedule's, gradient scaler's and (with ``ema``) EMA weights' states, as ``resume.pt``
    holds them (:func:`load_optimization_state` puts them back)."""
    state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()}
    if ema is not None:
        state["ema"] = ema.module.state_dict()
    return state


def load_optimization_state(
    state: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
    ema: Any = None,
) -> None:
    """Put back what :func:`optimization_state` took (into freshly built objects of the same recipe)."""
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    if ema is not None:
        ema.module.load_state_dict(state["ema"])


def write_resume_state(path: Path, state: dict[str, Any]) -> None:
    """``state`` (tensors and plain values) into ``path``; :func:`read_resume_state` reads it back."""
    with writing(path):
        torch.save(state, path)


def read_resume_state(path: Path) -> dict[str, Any]:
    """``resume.pt`` read with ``weights_only=True``: tensors and plain values only, never code from the file.

    Raises:
        CheckpointError: unreadable, not a resume state, or holding Python objects (a crafted pickle, or the
            NumPy state an older hiercls pickled).
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling errors come in many types; all mean "not a state we can trust"
        raise CheckpointError(
            f"{path}: not a resume state hiercls can read safely ({_load_failure(err)}). Start over with --set "
            "run.resume=false (the weights in model.safetensors next to it stay loadable with from_pretrained)"
        ) from None
    missing = [k for k in RESUME_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(
            f"{path}: not a hiercls resume state (missing {', '.join(missing)}); start over with --set run.resume=false"
        )
    return state


def check_state_weights(state: dict[str, Any], last: Path, run_format: int) -> None:
    """Refuse a ``resume.pt`` that does not belong to the ``model.safetensors`` next to it (its SHA-256 differs).

    A folder of the current format must name the digest; only a run folder of an older hiercls (``run_format``
    1) may lack it, and is then resumed with a warning.

    Raises:
        CheckpointError: naming ``resume.pt``, its step and both digests.
    """
    path, weights = last / "resume.pt", last / "model.safetensors"
    if (last / "config.json").is_file():  # damaged weights are named as such first (their own digest)
        verify_model_files(last, read_json_file(last / "config.json", "checkpoint's config"))
    want = state.get("weights_sha256")
    if want is None and run_format < RUN_FORMAT:
        logger.warning("%s: written by an older hiercls (no weights_sha256); not checked against %s", path, weights)
        return
    if not isinstance(want, str):
        raise CheckpointError(
            f"{path}: no weights_sha256 (a current run folder's resume state always names the digest of its "
            "weights); start over with --set run.resume=false"
        )
    have = sha256_file(weights) if weights.is_file() else "missing"
    if have != want:
        raise CheckpointError(
            f"{path}: the resume state of step {state.get('step')} belongs to other weights than {str(weights)!r} "
            f"(SHA-256 {want[:16]} saved, {have[:16]} found: a copied or restored folder?); start over with --set "
            "run.resume=false, or put back the checkpoint it came with"
        )


def _load_failure(err: Exception) -> str:
    text = str(err).strip()
    if "Weights only load failed" not in text:
        first = text.splitlines()[0][:200] if text else type(err).__name__
        return f"{first}; it is corrupt or was written by another program"
    # torch's message goes on to explain how to load it unsafely; name only what was refused.
    detail = next((x.strip() for x in text.splitlines() if "WeightsUnpickler error" in x), "")
    detail = detail.split(":", 1)[-1].split(" was not an allowed", 1)[0].strip()[:200]
    if "numpy" in detail:
        return f"it holds pickled NumPy objects ({detail}): it was written by an older hiercls"
    why = "it holds Python objects, not only tensors and plain values, and loading them could run code"
    return f"{why}; {detail}" if detail else why


def load_model_weights(model: torch.nn.Module, ckpt: Path) -> None:
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


def link_tree(src: Path, dst: Path) -> bool:
    """Hard-link every file of ``src`` into ``dst``; ``False`` (and ``dst`` emptied) where links are impossible."""
    try:
        shutil.copytree(src, dst, copy_function=os.link, dirs_exist_ok=True)
        return True
    except OSError as err:  # another file system, or one without hard links: write a copy instead
        logger.debug("cannot hard-link %s into %s (%s); writing a copy", src, dst, err)
        for child in dst.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        return False


# ------------------------------------------------------------------------------------------- random streams
def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global random streams."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
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


def set_rng_state(state: dict[str, Any]) -> None:
    """Put back the states :func:`rng_state` took."""
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    np.random.set_state(
        (npy["key"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
