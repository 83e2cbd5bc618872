"""Reading and writing the user's text files: one decoder of bytes, one JSON and one YAML parser, atomic writes.

Every file a user hands hiercls (taxonomies, label files, recipes, input lists) is read through
:func:`read_text` / :func:`decode_text`, so a file that is not UTF-8 gets the same one-line error naming the file,
the line and the byte offset. :func:`parse_json` is ``json.loads`` refusing duplicate keys (``json.loads`` alone
keeps the last without a word); :func:`load_yaml` does the same for YAML. :func:`atomic_write` writes to a
temporary file next to the target and renames it into place, so a failure never leaves a half-written or empty
file.

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
import contextvars
import gzip
import io
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.resources import files
from json.decoder import JSONArray, JSONObject
from json.scanner import py_make_scanner
from pathlib import Path
from typing import IO, Any

import yaml

__all__ = [
    "DEFAULT_MAX_READ_BYTES",
    "MAX_JSON_DEPTH",
    "LinedDict",
    "LinedList",
    "TextFileError",
    "atomic_dir",
    "atomic_write",
    "check_writable",
    "decode_text",
    "dump_json",
    "load_yaml",
    "max_read_bytes",
    "over_read_limit",
    "package_data_dirs",
    "parse_json",
    "read_bytes",
    "read_limit",
    "read_text",
    "recover_atomic",
    "regular_file_size",
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


DEFAULT_MAX_READ_BYTES = 2 * 1024**3
"""The read limit unless ``HIERCLS_MAX_READ_BYTES`` or :func:`read_limit` says otherwise: 2 GiB (decompressed)."""

_READ_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar("hiercls_read_limit", default=None)


@contextlib.contextmanager
def read_limit(max_bytes: int) -> Iterator[None]:
    """Inside the block, every reader of user files (:func:`read_bytes`) reads at most ``max_bytes`` bytes
    (decompressed) per file.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "big.txt"
        >>> _ = p.write_text("x" * 100)
        >>> with read_limit(10):
        ...     read_text(p)
        Traceback (most recent call last):
        ...
        hiercls._textio.TextFileError: .../big.txt: the file holds 100 bytes, over the read limit of 10 bytes; ...
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes must be a whole number of bytes >= 1; got {max_bytes!r}")
    token = _READ_LIMIT.set(max_bytes)
    try:
        yield
    finally:
        _READ_LIMIT.reset(token)


def max_read_bytes() -> int:
    """The read limit in force: :func:`read_limit`'s, else ``HIERCLS_MAX_READ_BYTES``, else 2 GiB."""
    limit = _READ_LIMIT.get()
    if limit is not None:
        return limit
    env = os.environ.get("HIERCLS_MAX_READ_BYTES", "").strip()
    if not env:
        return DEFAULT_MAX_READ_BYTES
    if not env.isdigit() or int(env) < 1:
        raise ValueError(f"HIERCLS_MAX_READ_BYTES must be a whole number of bytes >= 1; got {env!r}")
    return int(env)


def over_read_limit(size: str, limit: int, source: str) -> TextFileError:
    """The error for a file over the read limit: ``size`` says what is too large ("the file holds 3 bytes")."""
    return TextFileError(
        f"{size}, over the read limit of {limit} bytes; if the file is meant to be this large, raise the limit "
        "(environment variable HIERCLS_MAX_READ_BYTES, or hiercls._textio.read_limit)",
        source=source,
    )


def regular_file_size(path: str | os.PathLike[str], what: str = "file") -> int:
    """The size of a user's file in bytes, refused unless it is a regular file of at most :func:`max_read_bytes`.

    A FIFO or a device (``/dev/zero``) is refused before it is opened (a FIFO without a writer would block, a
    device never ends).

    Raises:
        FileNotFoundError: no such file. TextFileError: a folder, a FIFO, a device, over the limit.
    """
    p, limit = Path(path), max_read_bytes()
    st = os.stat(p)  # FileNotFoundError names the path
    if stat.S_ISDIR(st.st_mode):
        raise TextFileError(f"is a folder, not a {what}", source=str(p))
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "FIFO (named pipe)"
            if stat.S_ISFIFO(st.st_mode)
            else "device"
            if stat.S_ISCHR(st.st_mode)
            else "special file"
        )
        raise TextFileError(
            f"is a {kind}, not a regular file; hiercls reads a {what} from a regular file only", source=str(p)
        )
    if st.st_size > limit:
        raise over_read_limit(f"the file holds {st.st_size} bytes", limit, str(p))
    return st.st_size


def read_bytes(path: str | os.PathLike[str], what: str = "file", *, gunzip: bool = True) -> bytes:
    """The bytes of a user's file, gunzipped when they start with gzip's magic (``gunzip``), at most
    :func:`max_read_bytes` of them (after decompression), from a regular file only.

    A FIFO or a device (``/dev/zero``) is refused before it is opened (a FIFO without a writer would block, a
    device never ends); a file, or its decompressed content, over the limit is refused without being held whole.

    Raises:
        FileNotFoundError: no such file. TextFileError: a folder, a FIFO, a device, over the limit, corrupt gzip.
    """
    p, limit = Path(path), max_read_bytes()
    regular_file_size(p, what)
    with open(p, "rb") as f:
        data = _read_at_most(f, limit)  # bounded even if the file grows while read
    if data is None:
        raise over_read_limit(f"the file holds more than {limit} bytes", limit, str(p))
    if gunzip and data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
                data = _read_at_most(gz, limit)
        except (OSError, EOFError, zlib.error) as err:
            raise TextFileError(f"corrupt gzip file: {err}", source=str(p)) from None
        if data is None:
            raise over_read_limit(f"the gzip file expands to more than {limit} bytes", limit, str(p))
    return data


def _read_at_most(f: IO[bytes], limit: int) -> bytes | None:
    """All of ``f`` if it holds at most ``limit`` bytes, else ``None``; read in 16 MiB blocks (``f.read(limit)``
    would allocate the whole limit up front, 2 GiB for every file)."""
    blocks, size = [], 0
    while block := f.read(min(1 << 24, limit + 1 - size)):
        blocks.append(block)
        size += len(block)
        if size > limit:
            return None
    return b"".join(blocks)


def read_text(path: str | os.PathLike[str], what: str = "file") -> str:
    """The UTF-8 text of a user's file (see :func:`decode_text`), read by :func:`read_bytes` (bounded, regular
    files only; not gunzipped).

    Raises:
        FileNotFoundError: no such file (the error names it).
        TextFileError: a folder, FIFO or device instead of a file, over the read limit, or not UTF-8.
    """
    p = Path(path)
    return decode_text(read_bytes(p, what, gunzip=False), str(p), what)


# ---------------------------------------------------------------------------------------------- JSON
class LinedDict(dict):
    """A JSON object with the line it starts on (:func:`parse_json` with ``lines=True``)."""

    line: int = 0


class LinedList(list):
    """A JSON array with the line it starts on."""

    line: int = 0


MAX_JSON_DEPTH = 10_000
"""Deepest nesting :func:`parse_json` reads (json's parser recurses once per level)."""


class _DuplicateKey(Exception):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _DuplicateKey
    return out


def parse_json(text: str, source: str = "<json>", *, lines: bool = False) -> Any:
    """``json.loads(text)`` that refuses duplicate keys (``json.loads`` keeps the last without a word).

    ``lines=True`` returns every object and array as a :class:`LinedDict` / :class:`LinedList` carrying the line
    it starts on, so that a reader can say where a malformed entry is. Nesting up to :data:`MAX_JSON_DEPTH` levels
    is read (json's parser recurses, so deep input is parsed on a thread with room for that many levels).

    Raises:
        TextFileError: invalid JSON, a duplicate key, or nesting too deep, naming the file and the line.

    Example:
        >>> parse_json('{"a": [1, 2.5, "x", null]}')
        {'a': [1, 2.5, 'x', None]}
        >>> parse_json('[{"a": 1},\\n {"b": 2}]', lines=True)[1].line
        2
    """
    if not lines:
        try:
            return json.loads(text, object_pairs_hook=_unique_pairs)
        except json.JSONDecodeError as err:
            raise _invalid(err, source) from None
        except (_DuplicateKey, RecursionError):
            pass  # parsed again below, by json's Python parser: to name the duplicate's lines, or to go deeper
    decoder = _PositionDecoder(text, source, lines)
    try:
        try:
            return decoder.decode(text)
        except RecursionError:
            return _on_deep_stack(decoder.decode, text)
    except json.JSONDecodeError as err:
        raise _invalid(err, source) from None
    except RecursionError:
        raise TextFileError(
            f"JSON nesting deeper than {MAX_JSON_DEPTH} levels; hiercls reads at most that", source=source
        ) from None


def _invalid(err: json.JSONDecodeError, source: str) -> TextFileError:
    return TextFileError(f"invalid JSON: {err.msg} (column {err.colno})", source=source, line=err.lineno)


def _on_deep_stack(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on a thread whose stack (address space only: pages are touched as deep as the input goes) and
    recursion limit hold :data:`MAX_JSON_DEPTH` levels of json's recursive parser (three Python calls a level)."""

    def deeper() -> Any:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + 3 * MAX_JSON_DEPTH + 100)
        try:
            return fn(*args)
        finally:
            sys.setrecursionlimit(limit)

    old = threading.stack_size(256 << 20)
    try:
        with ThreadPoolExecutor(1) as pool:  # its one thread starts at submit, with this stack size
            return pool.submit(deeper).result()
    finally:
        threading.stack_size(old)


_TOKEN = re.compile(r'(?P<string>"(?:[^"\\]|\\.)*")(?P<colon>\s*:)?|(?P<open>[{\[])|[}\]]')


class _PositionDecoder(json.JSONDecoder):
    """json's own Python parser, with hooks that see where each object and array starts."""

    def __init__(self, text: str, source: str, lines: bool) -> None:
        super().__init__()
        self.text, self.source, self.lines = text, source, lines
        self.newlines: list[int] | None = None
        self.parse_object = self._object
        self.parse_array = self._array
        self.scan_once = py_make_scanner(self)

    def line_at(self, pos: int) -> int:
        if self.newlines is None:
            self.newlines = [m.start() for m in re.finditer("\n", self.text)]
        return bisect.bisect_left(self.newlines, pos) + 1

    def _object(self, s_and_end: tuple[str, int], strict: bool, scan_once: Any, *_hooks: Any, **_kw: Any) -> Any:
        pairs, end = JSONObject(s_and_end, strict, scan_once, None, list, self.memo)
        obj = LinedDict(pairs) if self.lines else dict(pairs)
        if len(obj) != len(pairs):
            raise self._duplicate(pairs, s_and_end[1], end)
        if self.lines:
            obj.line = self.line_at(s_and_end[1] - 1)
        return obj, end

    def _array(self, s_and_end: tuple[str, int], scan_once: Any, **_kw: Any) -> Any:
        values, end = JSONArray(s_and_end, scan_once)
        if not self.lines:
            return values, end
        out = LinedList(values)
        out.line = self.line_at(s_and_end[1] - 1)
        return out, end

    def _duplicate(self, pairs: list[tuple[str, Any]], start: int, end: int) -> TextFileError:
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        # Only now are the keys' positions wanted: re-scan this object's own keys (nested objects skipped).
        depth, where = 0, []
        for m in _TOKEN.finditer(self.text, start, end):
            if m["string"] is None:
                depth += 1 if m["open"] else -1
            elif depth == 0 and m["colon"] and json.loads(m["string"]) == key:
                where.append(self.line_at(m.start()))
        first, line = (where + [self.line_at(start)] * 2)[:2]
        return TextFileError(
            f"duplicate key {key!r} in a JSON object (first at line {first}); each key may appear once (a second "
            "value would silently replace the first)",
            source=self.source,
            line=line,
        )


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
#: How many nodes the aliases of one YAML document may add when expanded (a billion-laughs document adds 10^9).
MAX_YAML_ALIAS_NODES = 1_000_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last) and aliases that
    expand to more than :data:`MAX_YAML_ALIAS_NODES` nodes (an alias is shared when loaded, but every reader that
    walks the result, and every copy of it, expands it)."""

    def compose_document(self) -> Any:
        self._alias_nodes, self._sizes, self._open_anchors = 0, {}, []
        return super().compose_document()

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if not isinstance(event, yaml.AliasEvent):
            self._open_anchors.append(getattr(event, "anchor", None))
            try:
                return super().compose_node(parent, index)
            finally:
                self._open_anchors.pop()
        line = event.start_mark.line + 1
        if event.anchor in self._open_anchors:
            raise TextFileError(
                f"alias *{event.anchor} refers to the node that contains it", source=self.name, line=line
            )
        node = self.anchors.get(event.anchor)
        if node is not None:
            self._alias_nodes += self._expanded_size(node)
            if self._alias_nodes > MAX_YAML_ALIAS_NODES:
                raise TextFileError(
                    f"its aliases (*{event.anchor} and others) expand to more than {MAX_YAML_ALIAS_NODES:,} "
                    "nodes; write the values out, or use fewer nested aliases",
                    source=self.name,
                    line=line,
                )
        return super().compose_node(parent, index)

    def _expanded_size(self, node: Any) -> int:
        """The number of nodes ``node`` stands for once every alias in it is expanded (memoised per node)."""
        known = self._sizes.get(id(node))
        if known is None:
            if isinstance(node, yaml.MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                children = node.value if isinstance(node, yaml.SequenceNode) else []
            known = min(1 + sum(self._expanded_size(child) for child in children), MAX_YAML_ALIAS_NODES + 1)
            self._sizes[id(node)] = known
        return known

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *defaults`` may be overridden on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader reports it below
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise TextFileError(
                    f"duplicate key {key!r} (first at line {first}); each key may appear once",
                    source=self.name,
                    line=line,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, source: str = "<yaml>") -> Any:
    """``yaml.safe_load(text)`` that refuses duplicate keys (naming the file and line); never builds objects.

    Raises:
        TextFileError: a duplicate key.
        yaml.YAMLError: invalid YAML (with PyYAML's own position).
    """
    loader = _UniqueKeyLoader(text)
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


def package_data_dirs(package: str, checkout_folder: str) -> list[Path]:
    """Folders holding a data package's files: the installed package ``package`` (e.g. ``hiercls.recipes``), then
    the checkout's top-level ``checkout_folder`` that pyproject.toml maps to it (an editable install or a source
    tree), each once, existing folders only.

    Example:
        >>> [d.name for d in package_data_dirs("hiercls.recipes", "recipes")][-1:]
        ['recipes']
    """
    dirs: list[Path] = []
    try:
        res = files(package)
        # A data package has no __init__.py: a namespace package, which may span several folders.
        dirs += [Path(str(p)) for p in getattr(res, "_paths", None) or [res]]
    except (ModuleNotFoundError, TypeError, ValueError):
        pass
    dirs.append(Path(__file__).resolve().parents[1] / checkout_folder)
    out: dict[str, Path] = {}
    for d in dirs:
        if d.is_dir():
            out.setdefault(os.path.realpath(d), d)
    return list(out.values())


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
