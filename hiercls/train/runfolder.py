"""The run folder: its lock, atomic checkpoint folders, leftovers of killed runs, and starting over.

Every function here runs on rank 0 only (the process that writes files). The rules, in the order a run meets
them (docs/reliability.md states them as promises):

* ``run.out_dir`` must be a writable folder (created if missing); anything else is refused with its reason.
* ``<out_dir>/.lock`` is held (``fcntl.flock``) for the whole run and names its holder (pid, host, start
  time): a second training into the same folder is refused at once with those facts. The kernel drops the
  lock when the holder dies, so a killed run never leaves a stale lock.
* A checkpoint folder is written as ``<name>.tmp-<pid>`` and renamed into place (the previous one goes to
  ``<name>.old`` between the two renames); at start, ``.tmp-<pid>`` folders of other processes are removed and a
  ``.old`` left by a kill between the renames is put back.
* Starting fresh (``run.resume=false``, or nothing to resume) removes the previous run's outputs, so that a
  new run's files are never mixed with an old run's ``best/`` or ``results.json``.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hiercls.models.files import writing
from hiercls.train.config import ConfigError

try:  # POSIX; elsewhere runs are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

__all__ = [
    "PREVIOUS_RUN_OUTPUTS",
    "RunLock",
    "check_out_dir",
    "clear_previous_run",
    "recover_checkpoints",
    "save_dir_atomically",
]

#: What a run writes into its folder (besides config.yaml and metrics.jsonl, which a fresh start rewrites).
PREVIOUS_RUN_OUTPUTS = (
    "checkpoints/best",
    "checkpoints/last",
    "checkpoints/best.old",
    "checkpoints/last.old",
    "results.json",
    "comparison.json",
    "eval_probs.npy",
    "eval_labels.npy",
    "curves.png",
)
LOCK_NAME = ".lock"
_TMP = ".tmp-"


def check_out_dir(out_dir: Path) -> None:
    """Create ``out_dir`` if needed; refuse a file, an uncreatable path or a read-only folder.

    Raises:
        ConfigError: naming ``run.out_dir``, the path and the reason.
    """
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"run.out_dir: {str(out_dir)!r} is a file, not a folder; choose another run.out_dir")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"run.out_dir: cannot create {str(out_dir)!r} ({err.strerror or err}); choose another run.out_dir"
        ) from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ConfigError(f"run.out_dir: {str(out_dir)!r} is not writable (permission denied); choose another one")


class RunLock:
    """An exclusive ``flock`` on ``<out_dir>/.lock`` for the life of a run; the file names the holder.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> lock = RunLock.acquire(d)
        >>> RunLock.acquire(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hiercls.train.config.ConfigError: run.out_dir: ... is in use by another training (pid ...
        >>> lock.release()
        >>> RunLock.acquire(d).release()
    """

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def acquire(cls, out_dir: Path) -> RunLock:
        """Take the lock of ``out_dir`` (which exists) without waiting.

        Raises:
            ConfigError: another process holds it (its pid, host and start time are named), or the folder is
                read-only.
        """
        path = out_dir / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise ConfigError(
                f"run.out_dir: cannot write {str(path)!r} ({err.strerror or err}); the folder is read-only or "
                "not yours: choose another run.out_dir"
            ) from None
        if fcntl is None:  # pragma: no cover
            return cls(path, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise ConfigError(f"run.out_dir: cannot lock {str(path)!r} ({err.strerror or err})") from None
            holder = _read_holder(path)
            os.close(fd)
            raise ConfigError(
                f"run.out_dir: {str(out_dir)!r} is in use by another training ({holder}); wait for it to "
                "finish or stop it, or choose another run.out_dir"
            ) from None
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode())
        return cls(path, fd)

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would let two processes lock two different files)."""
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor releases the flock; the file keeps the last holder's facts
            self.fd = None


def _read_holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not yet written its pid"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_checkpoints(out_dir: Path, *, locked: bool) -> None:
    """Remove ``checkpoints/*.tmp-<pid>`` of killed runs and settle ``*.old`` folders left between two renames.

    With the run lock held (``locked``) no other process writes here, so every other pid's temporary folder is
    stale; without it (no ``fcntl``) only those of processes that are gone are removed.
    """
    for f in sorted(out_dir.glob(f".*{_TMP}*")):
        # Half-written results.json / eval_probs.npy of a killed run (written as .<name>.tmp-<pid><suffix>).
        pid_text = f.name.rpartition(_TMP)[2].split(".", 1)[0]
        stale = pid_text.isdigit() and int(pid_text) != os.getpid() and (locked or not _pid_alive(int(pid_text)))
        if stale and f.is_file():
            f.unlink(missing_ok=True)
    ckpt = out_dir / "checkpoints"
    if not ckpt.is_dir():
        return
    for d in sorted(ckpt.iterdir()):
        name, sep, pid_text = d.name.rpartition(_TMP)
        if sep and name and pid_text.isdigit() and d.is_dir():
            pid = int(pid_text)
            if pid != os.getpid() and (locked or not _pid_alive(pid)):
                logger.info("removing %s, the unfinished checkpoint of a killed run (pid %d)", d, pid)
                shutil.rmtree(d, ignore_errors=True)
    for old in sorted(ckpt.glob("*.old")):
        final = old.with_name(old.name[: -len(".old")])
        if final.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        elif old.is_dir():
            # Killed between moving the previous checkpoint aside and moving the new one in: keep the previous.
            logger.info("restoring %s from %s (a run was killed while replacing it)", final, old)
            old.rename(final)


def clear_previous_run(out_dir: Path, reason: str) -> list[str]:
    """Remove the outputs of a previous run in ``out_dir`` (see :data:`PREVIOUS_RUN_OUTPUTS`); returns their names."""
    found = [name for name in PREVIOUS_RUN_OUTPUTS if (out_dir / name).exists()]
    if found:
        logger.warning("%s: removing the previous run's %s from %s", reason, ", ".join(found), out_dir)
    for name in found:
        p = out_dir / name
        with writing(p):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    return found


def save_dir_atomically(final: Path, write: Callable[[Path], Any]) -> None:
    """Write a folder via ``<final>.tmp-<pid>`` and renames, so that a kill never leaves a torn one.

    A failed write (full disk, ...) removes the temporary folder and leaves the previous ``final`` as it was.

    Raises:
        CheckpointError: the write failed; the message names the file.
    """
    tmp = final.with_name(final.name + f"{_TMP}{os.getpid()}")
    old = final.with_name(final.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with writing(tmp):
            tmp.mkdir(parents=True)
        _fault_point("write", tmp)
        write(tmp)
        _fault_point("renames", tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        _fault_point("between-renames", tmp)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)


_FAULT_SEEN: dict[str, int] = {}


def _fault_point(where: str, folder: Path) -> None:
    """Test hook: ``HIERCLS_FAULT_SLEEP=<where>:<seconds>[:<skip>]`` pauses here so that a test can kill the run.

    ``where`` is ``write`` (inside the temporary folder, before its files), ``renames`` (files written, before
    the renames), ``between-renames`` (the previous checkpoint moved aside, the new one not yet in place) or
    ``all``; the first ``skip`` passes are not paused. ``HIERCLS_FAULT_MARKER`` names a file that is written
    on each pause (so the test knows when to kill).
    """
    spec = os.environ.get("HIERCLS_FAULT_SLEEP")
    if not spec:
        return
    point, _, rest = spec.partition(":")
    seconds, _, skip = rest.partition(":")
    if point not in (where, "all"):
        return
    _FAULT_SEEN[point] = seen = _FAULT_SEEN.get(point, 0) + 1
    if seen <= int(skip or 0):
        return
    marker = os.environ.get("HIERCLS_FAULT_MARKER")
    if marker:
        Path(marker).write_text(f"{where} {folder}\n", encoding="utf-8")
    time.sleep(float(seconds or 1))
