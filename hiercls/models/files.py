"""Files of saved models and checkpoints: content hashes, write errors that name the file, one error type.

A saved model's ``config.json`` records the SHA-256 of its ``model.safetensors`` and ``model.safetensors``
carries the identity of the model it holds (backbone spec, head name and options, taxonomy fingerprint) in its
header, so a flipped bit, a truncated file, a file from another model or an edited ``"head"`` is refused on
load instead of predicting garbage (see docs/reliability.md).

Example:
    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.bin"
    >>> _ = p.write_bytes(b"abc")
    >>> sha256_file(p)[:16]
    'ba7816bf8f01cfea'
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["CheckpointError", "folder_size", "sha256_file", "writing"]

#: Below this many free bytes a write failure without an errno (torch's zip writer) is reported as a full disk.
_NEARLY_FULL = 64 * 2**20


class CheckpointError(ValueError):
    """A saved model, checkpoint or run folder cannot be used or written.

    The message names the file, what is wrong and how to proceed. A ``ValueError``, so the command line prints
    it as one line.
    """


def sha256_file(path: str | os.PathLike[str], chunk: int = 2**22) -> str:
    """Hex SHA-256 of a file's bytes, read in chunks (a 100 MB checkpoint needs no 100 MB buffer)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _reason(err: BaseException, path: Path) -> str:
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return "no space left on device"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    # torch's zip writer and safetensors report a full disk without an errno ("enforce fail ... unexpected pos").
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
        if free < _NEARLY_FULL:
            return f"no space left on device ({free} bytes free)"
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a failure while writing ``path`` (full disk, read-only folder...) into a :class:`CheckpointError`.

    Example:
        >>> with writing("/nonexistent-folder/x.json"):  # doctest: +ELLIPSIS
        ...     open("/nonexistent-folder/x.json", "w")
        Traceback (most recent call last):
        ...
        hiercls.models.files.CheckpointError: /nonexistent-folder/x.json: could not write (No such file or directory)...
    """
    p = Path(path)
    try:
        yield
    except CheckpointError:
        raise
    except Exception as err:  # OSError, torch's RuntimeError, SafetensorError: all a failed write of p
        if not isinstance(err, (OSError, RuntimeError)) and type(err).__name__ != "SafetensorError":
            raise
        raise CheckpointError(
            f"{p}: could not write ({_reason(err, p)}); free space or choose another run.out_dir / folder"
        ) from err


def folder_size(path: str | os.PathLike[str]) -> int:
    """Bytes of the files under ``path``, each hard-linked file counted once (as ``du`` does).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "a").write_bytes(b"12345")
        >>> os.link(d / "a", d / "b")
        >>> folder_size(d)
        5
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(root, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


def read_json_file(path: Path, what: str) -> Any:
    """A JSON file that hiercls wrote, or a :class:`CheckpointError` naming the line of a corrupt one."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: not a UTF-8 text file ({err.reason}); the {what} is corrupt") from None
    except json.JSONDecodeError as err:
        raise CheckpointError(
            f"{path}:{err.lineno}: invalid JSON ({err.msg}); the {what} is corrupt or was edited by hand"
        ) from None
