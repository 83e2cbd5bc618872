"""Reading and writing the user's text files: one decoder of bytes, one JSON and one YAML parser, atomic writes.

Every file a user hands hiercls (taxonomies, label files, recipes, input lists) is read through
:func:`read_text` / :func:`decode_text`, so a file that is not UTF-8 gets the same one-line error naming the file,
the line and the byte offset. :func:`parse_json` is an iterative JSON parser (no recursion, so a 100,000-level
nesting is no ``RecursionError``) that refuses duplicate keys, which ``json.loads`` silently resolves by keeping
the last; :func:`load_yaml` does the same for YAML. :func:`atomic_write` writes to a temporary file next to the
target and renames it into place, so a failure never leaves a half-written or empty file.

Example:
    >>> parse_json('{"a": [1, 2.5, "x", null]}')
    {'a': [1, 2.5, 'x', None]}
    >>> parse_json('{"a": 1,\\n "a": 2}', "t.json")
    Traceback (most recent call last):
    ...
    hiercls._textio.TextFileError: t.json:2: duplicate key 'a' in a JSON object (first at line 1); each key may
    appear once (a second value would silently replace the first)
    >>> load_yaml("optim:\\n  lr: 1\\n  lr: 2\\n", "r.yaml")
    Traceback (most recent call last):
    ...
    hiercls._textio.TextFileError: r.yaml:3: duplicate key 'lr' (first at line 2); each key may appear once
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from json.decoder import scanstring
from pathlib import Path
from typing import IO, Any

__all__ = [
    "LinedDict",
    "LinedList",
    "TextFileError",
    "atomic_dir",
    "atomic_write",
    "check_writable",
    "decode_text",
    "dump_json",
    "load_yaml",
    "parse_json",
    "read_text",
    "recover_atomic",
    "umask",
]


class TextFileError(ValueError):
    """A user's file cannot be read as what it should be; the message names the file and, when known, the line.

    Attributes:
        source: the file (or a description of the input).
        line: 1-based line number, or ``None``.
        reason: the message without the location.
    """

    def __init__(self, reason: str, *, source: str | None = None, line: int | None = None) -> None:
        self.source, self.line, self.reason = source, line, reason
        where = source or ""
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        super().__init__(f"{where}: {reason}" if where else reason)


# ---------------------------------------------------------------------------------------------- text
def decode_text(data: bytes, source: str, what: str = "file") -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped).

    Raises:
        TextFileError: the bytes are not UTF-8, naming the file, line, byte offset and the fix.

    Example:
        >>> decode_text("café au lait".encode("latin-1"), "labels.txt", "label file")
        Traceback (most recent call last):
        ...
        hiercls._textio.TextFileError: labels.txt:1: the label file is not UTF-8 text: byte 0xe9 at offset 3
        cannot be decoded (invalid continuation byte); re-encode it as UTF-8, e.g. iconv -f latin1 -t utf-8
        labels.txt > labels.utf8.txt
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        name = Path(source).name or "file"
        stem, dot, ext = name.rpartition(".")
        fixed = f"{stem}.utf8.{ext}" if dot and stem else f"{name}.utf8"
        raise TextFileError(
            f"the {what} is not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start} cannot be decoded "
            f"({err.reason}); re-encode it as UTF-8, e.g. iconv -f latin1 -t utf-8 {name} > {fixed}",
            source=source,
            line=line,
        ) from None
    return text[1:] if text.startswith("\ufeff") else text  # a byte-order mark is not part of the first name


def read_text(path: str | os.PathLike[str], what: str = "file") -> str:
    """The UTF-8 text of a user's file (see :func:`decode_text`).

    Raises:
        FileNotFoundError: no such file (the error names it).
        TextFileError: a folder instead of a file, or not UTF-8.
    """
    p = Path(path)
    if p.is_dir():
        raise TextFileError(f"is a folder, not a {what}", source=str(p))
    return decode_text(p.read_bytes(), str(p), what)


# ---------------------------------------------------------------------------------------------- JSON
class LinedDict(dict):
    """A JSON object with the line it starts on (:func:`parse_json` with ``lines=True``)."""

    line: int = 0


class LinedList(list):
    """A JSON array with the line it starts on."""

    line: int = 0


_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?")
_CONSTANTS = {"true": True, "false": False, "null": None, "NaN": float("nan"), "Infinity": float("inf")}


def parse_json(text: str, source: str = "<json>", *, lines: bool = False) -> Any:
    """Parse JSON without recursion, refusing duplicate keys; ``lines=True`` tags objects and arrays with their line.

    Accepts what ``json.loads`` accepts (also ``NaN`` / ``Infinity``). Pure Python: use ``json.loads`` first and
    this when it fails or when positions are needed.

    Raises:
        TextFileError: invalid JSON or a duplicate key, naming the file, the line and the column.
    """
    newlines: list[int] | None = None

    def line_at(pos: int) -> int:
        nonlocal newlines
        if newlines is None:
            newlines = [m.start() for m in re.finditer("\n", text)]
        return bisect.bisect_right(newlines, pos - 1) + 1

    def fail(msg: str, pos: int) -> TextFileError:
        line = line_at(pos)
        col = pos - (newlines[line - 2] if line > 1 and newlines else -1)
        return TextFileError(f"invalid JSON: {msg} (column {col})", source=source, line=line)

    def key_at(i: int, frame: list[Any]) -> int:
        """Parse ``"key" :`` at ``i`` into ``frame``; the index after the colon and spaces."""
        if i >= n or text[i] != '"':
            raise fail("expecting a property name in double quotes", i)
        try:
            key, j = scanstring(text, i + 1, True)
        except ValueError as err:
            raise fail(str(err).split(":")[0], i) from None
        seen = frame[2]
        if key in seen:
            raise TextFileError(
                f"duplicate key {key!r} in a JSON object (first at line {line_at(seen[key])}); each key may appear "
                "once (a second value would silently replace the first)",
                source=source,
                line=line_at(i),
            )
        seen[key] = i
        frame[1] = key
        j = _WS.match(text, j).end()
        if j >= n or text[j] != ":":
            raise fail("expecting ':' delimiter", j)
        return _WS.match(text, j + 1).end()

    n = len(text)
    stack: list[list[Any]] = []  # [container, current key, {key: position} or None for arrays]
    i = _WS.match(text, 0).end()
    while True:
        # -- one value at i: a scalar, an empty container, or the opening of a container (pushed, then loop)
        if i >= n:
            raise fail("expecting value", i)
        ch = text[i]
        if ch in "{[":
            obj: Any = (LinedDict() if ch == "{" else LinedList()) if lines else ({} if ch == "{" else [])
            if lines:
                obj.line = line_at(i)
            j = _WS.match(text, i + 1).end()
            if j < n and text[j] == ("}" if ch == "{" else "]"):
                value, i = obj, j + 1
            else:
                frame = [obj, None, {} if ch == "{" else None]
                stack.append(frame)
                i = key_at(j, frame) if ch == "{" else j
                continue
        elif ch == '"':
            try:
                value, i = scanstring(text, i + 1, True)
            except ValueError as err:
                raise fail(str(err).split(":")[0], i) from None
        else:
            m = _NUMBER.match(text, i)
            if m:
                integer, frac, exp = m.groups()
                value = float(integer + (frac or "") + (exp or "")) if frac or exp else int(integer)
                i = m.end()
            else:
                for word, const in (*_CONSTANTS.items(), ("-Infinity", float("-inf"))):
                    if text.startswith(word, i):
                        value, i = const, i + len(word)
                        break
                else:
                    raise fail("expecting value", i)
        # -- the value is complete: store it, and close every container that ends here
        while True:
            if not stack:
                i = _WS.match(text, i).end()
                if i != n:
                    raise fail("extra data", i)
                return value
            frame = stack[-1]
            if frame[2] is not None:
                frame[0][frame[1]] = value
            else:
                frame[0].append(value)
            i = _WS.match(text, i).end()
            close = "}" if frame[2] is not None else "]"
            if i < n and text[i] == ",":
                i = _WS.match(text, i + 1).end()
                if frame[2] is not None:
                    i = key_at(i, frame)
                break
            if i < n and text[i] == close:
                stack.pop()
                value, i = frame[0], i + 1
                continue
            raise fail(f"expecting ',' or '{close}'", i)


def dump_json(obj: Any, f: IO[str], *, indent: int | None = None, ensure_ascii: bool = False) -> None:
    """Write ``obj`` as ``json.dump(obj, f, indent=indent, ensure_ascii=ensure_ascii)`` does, without recursion.

    Example:
        >>> import io
        >>> buf = io.StringIO(); dump_json({"r": {"a": {}, "b": [1, "x"]}}, buf, indent=1); buf.getvalue()
        '{\\n "r": {\\n  "a": {},\\n  "b": [\\n   1,\\n   "x"\\n  ]\\n }\\n}'
    """
    write = f.write
    item_sep = "," if indent is not None else ", "

    def newline(level: int) -> str:
        return "\n" + " " * (indent * level) if indent is not None else ""

    stack: list[list[Any]] = []  # [iterator, is_object, level, first]

    def start(value: Any, level: int) -> None:
        if isinstance(value, dict):
            if not value:
                write("{}")
                return
            write("{")
            stack.append([iter(value.items()), True, level + 1, True])
        elif isinstance(value, (list, tuple)):
            if not value:
                write("[]")
                return
            write("[")
            stack.append([iter(value), False, level + 1, True])
        else:
            write(json.dumps(value, ensure_ascii=ensure_ascii))

    start(obj, 0)
    while stack:
        frame = stack[-1]
        item = next(frame[0], _END)
        if item is _END:
            stack.pop()
            write(newline(frame[2] - 1) + ("}" if frame[1] else "]"))
            continue
        write(("" if frame[3] else item_sep) + newline(frame[2]))
        frame[3] = False
        if frame[1]:
            write(json.dumps(str(item[0]), ensure_ascii=ensure_ascii) + ": ")
            start(item[1], frame[2])
        else:
            start(item, frame[2])


_END = object()


# ---------------------------------------------------------------------------------------------- YAML
def _yaml_loader() -> Any:
    import yaml  # only recipes need it

    class UniqueKeyLoader(yaml.SafeLoader):
        """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last)."""

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *defaults`` may be overridden on purpose
                continue
            key = loader.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader reports it below
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise TextFileError(
                    f"duplicate key {key!r} (first at line {first}); each key may appear once",
                    source=loader.name,
                    line=line,
                )
            seen[key] = line
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    UniqueKeyLoader.add_constructor("tag:yaml.org,2002:map", construct_mapping)
    return UniqueKeyLoader


def load_yaml(text: str, source: str = "<yaml>") -> Any:
    """``yaml.safe_load(text)`` that refuses duplicate keys (naming the file and line); never builds objects.

    Raises:
        TextFileError: a duplicate key.
        yaml.YAMLError: invalid YAML (with PyYAML's own position).
    """
    loader = _yaml_loader()(text)
    loader.name = source
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------------- writing
_UMASK = os.umask(0o022)  # read once at import (reading it means setting it), then restored at once
os.umask(_UMASK)

# Temporaries are ``.<name>.tmp-<pid>-<random>`` next to their target, a replaced folder ``.<name>.old``: one
# naming rule, so that :func:`recover_atomic` knows what a killed writer left behind and whose it was.
_TEMP = re.compile(r"\.(?P<name>.+)\.tmp-(?P<pid>\d+)-[^.]+")
_FAULT_SEEN: dict[str, int] = {}


def umask() -> int:
    """The process umask at import: the permissions a plain ``open()`` would leave off new files."""
    return _UMASK


def check_writable(path: str | os.PathLike[str], what: str = "output file") -> Path:
    """``path`` as a Path if a file can be written there: not a folder, and its nearest existing folder writable.

    Call it before a long computation whose result goes to ``path``, so that a mistyped ``--out`` fails at once.

    Raises:
        IsADirectoryError: ``path`` is a folder.
        NotADirectoryError: a parent of ``path`` is a file.
        PermissionError: the folder it would be written to is not writable.
    """
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"{p}: is a folder; give the {what} a file name")
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(f"cannot write {p}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write {p}: the folder {parent} is not writable")
    return p


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", **open_kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path`` and rename it onto ``path`` when the block ends without error.

    On an error (a full disk, an interrupt) the temporary file is removed and ``path`` is left as it was.
    Missing parent folders are created.

    Raises:
        IsADirectoryError, NotADirectoryError, PermissionError: see :func:`check_writable`.
        OSError: the folder cannot be written, naming ``path``.

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "out.txt")
        >>> with atomic_write(p) as f:
        ...     _ = f.write("done")
        >>> open(p).read()
        'done'
    """
    p = check_writable(path, "file")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.tmp-{os.getpid()}-")
    except OSError as err:
        raise type(err)(err.errno, f"cannot write {p}: {err.strerror}") from None
    try:
        with os.fdopen(fd, mode, **open_kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp makes 0600 files; a plain open() would honour the umask
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a new empty folder next to ``path``; when the block ends without error it replaces ``path``.

    A folder cannot be renamed onto a folder, so an existing ``path`` first moves to ``.<name>.old``, the new one
    moves in, and only then is the old one removed: a kill at any moment leaves the old folder or the new one
    whole (between the two renames under the ``.old`` name, which :func:`recover_atomic` puts back). On an error
    the temporary folder is removed and ``path`` is left as it was. Writers of one ``path`` must not overlap
    (hold a lock).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "ckpt"
        >>> for text in ("v1", "v2"):
        ...     with atomic_dir(p) as tmp:
        ...         _ = (tmp / "w.txt").write_text(text)
        >>> (p / "w.txt").read_text(), sorted(x.name for x in p.parent.iterdir())
        ('v2', ['ckpt'])
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=p.parent, prefix=f".{p.name}.tmp-{os.getpid()}-"))
    try:
        os.chmod(tmp, 0o777 & ~umask())
        _fault_point("write", tmp)
        yield tmp
        _fault_point("renames", tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = p.with_name(f".{p.name}.old")
    if p.exists():
        shutil.rmtree(old, ignore_errors=True)
        p.rename(old)
        _fault_point("between-renames", tmp)
    tmp.rename(p)
    shutil.rmtree(old, ignore_errors=True)


def recover_atomic(folder: str | os.PathLike[str], *, others_are_gone: bool) -> None:
    """Settle what killed :func:`atomic_write` / :func:`atomic_dir` calls left in ``folder``.

    Temporaries of other processes are removed (all of them when ``others_are_gone``, e.g. under a lock that
    proves no other writer; else only those whose process has ended); a ``.<name>.old`` folder whose ``<name>``
    is missing (a kill between the two renames) is put back, one next to its ``<name>`` is removed.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> (d / ".ckpt.old").mkdir(); (d / ".out.json.tmp-999999999-x1").mkdir()
        >>> recover_atomic(d, others_are_gone=True)
        >>> sorted(x.name for x in d.iterdir())
        ['ckpt']
    """
    for entry in sorted(Path(folder).iterdir()):
        temp = _TEMP.fullmatch(entry.name)
        if temp is not None:
            pid = int(temp["pid"])
            if pid != os.getpid() and (others_are_gone or not _pid_alive(pid)):
                shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
        elif entry.name.startswith(".") and entry.name.endswith(".old") and entry.is_dir():
            final = entry.with_name(entry.name[1 : -len(".old")])
            if final.exists():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.rename(final)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fault_point(where: str, folder: Path) -> None:
    """Test hook: ``HIERCLS_FAULT_SLEEP=<where>:<seconds>[:<skip>]`` pauses :func:`atomic_dir` so a test can kill it.

    ``where`` is ``write`` (in the new folder, before its files), ``renames`` (files written, before the
    renames), ``between-renames`` (the previous folder moved aside, the new one not yet in place) or ``all``; the
    first ``skip`` passes are not paused. ``HIERCLS_FAULT_MARKER`` names a file written on each pause.
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
