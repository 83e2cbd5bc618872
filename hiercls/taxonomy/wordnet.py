"""Offline WordNet 3.0 (through nltk) and WordNet noun taxonomies keyed by ImageNet ids.

nltk's WordNet reader is pointed at the Debian files in ``/usr/share/wordnet`` (packages ``wordnet-base``
and ``wordnet-sense-index``), never at a download. That folder lacks the ``lexnames`` file the reader
opens first, and nltk (3.9+) only opens corpora that lie under a folder of ``nltk.data.path`` with no
link leading outside. So :func:`wordnet_data_dir` lays out ``<cache>/nltk_data/corpora/wordnet/`` with copies
of the Debian files and a generated ``lexnames`` (the 45 lexicographer files of WordNet
3.0), and :func:`wordnet` adds ``<cache>/nltk_data`` to ``nltk.data.path``.

ImageNet names a class by its WordNet id (*wnid*): ``"n"`` followed by the 8-digit offset of the noun
synset in ``data.noun``, e.g. ``n01440764`` is ``tench.n.01``.

Example:
    >>> wnid_to_synset("n01440764").name()  # doctest: +SKIP
    'tench.n.01'
    >>> tax = wordnet_taxonomy(["n01440764", "n01443537"])  # doctest: +SKIP
    >>> tax.display_names[tax.lca(tax.index("n01440764"), tax.index("n01443537"))]  # doctest: +SKIP
    'cyprinid'
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hiercls.taxonomy.core import Taxonomy, TaxonomyError

if TYPE_CHECKING:
    from nltk.corpus.reader.wordnet import Synset, WordNetCorpusReader

logger = logging.getLogger(__name__)

__all__ = [
    "DEBIAN_WORDNET_DIR",
    "LEXNAMES",
    "WORDNET_ROOT_WNID",
    "WordNetUnavailableError",
    "is_wnid",
    "noun_glosses",
    "synset_to_wnid",
    "wnid_to_synset",
    "wordnet",
    "wordnet_available",
    "wordnet_data_dir",
    "wordnet_taxonomy",
]

#: Where Debian's ``wordnet-base`` / ``wordnet-sense-index`` put the WordNet 3.0 database.
DEBIAN_WORDNET_DIR = Path("/usr/share/wordnet")

#: wnid of ``entity.n.01``, the unique beginner (root) of the WordNet 3.0 noun hierarchy.
WORDNET_ROOT_WNID = "n00001740"

#: The 45 lexicographer files of WordNet 3.0 as ``(name, syntactic category)``, numbered 00..44 in this order
#: (lexnames(5WN); category 1 noun, 2 verb, 3 adjective, 4 adverb).
_LEXNAME_ORDER = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body "
    "noun.cognition noun.communication noun.event noun.feeling noun.food noun.group noun.location noun.motive "
    "noun.object noun.person noun.phenomenon noun.plant noun.possession noun.process noun.quantity noun.relation "
    "noun.shape noun.state noun.substance noun.time verb.body verb.change verb.cognition verb.communication "
    "verb.competition verb.consumption verb.contact verb.creation verb.emotion verb.motion verb.perception "
    "verb.possession verb.social verb.stative verb.weather adj.ppl "
)
LEXNAMES: tuple[tuple[str, int], ...] = tuple(
    (name, {"noun": 1, "verb": 2, "adj": 3, "adv": 4}[name.partition(".")[0]]) for name in _LEXNAME_ORDER.split()
)

# The files nltk's WordNetCorpusReader opens, with the Debian package that ships each one.
_REQUIRED_FILES: dict[str, str] = {
    **{f"{kind}.{pos}": "wordnet-base" for kind in ("data", "index") for pos in ("noun", "verb", "adj", "adv")},
    **{f"{pos}.exc": "wordnet-base" for pos in ("noun", "verb", "adj", "adv")},
    "cntlist.rev": "wordnet-base",
    "index.sense": "wordnet-sense-index",
}
_OPTIONAL_FILES = ("cntlist", "frames.vrb", "sents.vrb", "sentidx.vrb")
_INSTALL_HINT = "apt-get install wordnet-base wordnet-sense-index"
_WNID_RE = re.compile(r"^n\d{8}$")


class WordNetUnavailableError(RuntimeError):
    """The WordNet 3.0 database files are missing (the message names the Debian packages to install)."""


def _source_dir(source: str | os.PathLike[str] | None) -> Path:
    if source is not None:
        return Path(source)
    return Path(os.environ.get("HIERCLS_WORDNET_DIR", DEBIAN_WORDNET_DIR))


def _missing_files(source: Path) -> list[str]:
    return [f for f in _REQUIRED_FILES if not (source / f).is_file()]


def wordnet_available(source: str | os.PathLike[str] | None = None) -> bool:
    """Whether the WordNet 3.0 database files are present (default folder: ``$HIERCLS_WORDNET_DIR`` or
    ``/usr/share/wordnet``).

    Example:
        >>> isinstance(wordnet_available(), bool)
        True
    """
    return not _missing_files(_source_dir(source))


def _cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("HIERCLS_CACHE")
    return Path(env) / "nltk_data" if env else Path.home() / ".cache" / "hiercls" / "nltk_data"


def _lexnames_text() -> str:
    return "".join(f"{i:02d}\t{name}\t{cat}\n" for i, (name, cat) in enumerate(LEXNAMES))


def _layout_is_valid(target: Path, source: Path) -> bool:
    try:
        if (target / ".source").read_text(encoding="utf-8") != str(source.resolve()):
            return False
        if (target / "lexnames").read_text(encoding="utf-8") != _lexnames_text():
            return False
    except OSError:
        return False
    for f in _REQUIRED_FILES:
        try:
            got, want = (target / f).stat(), (source / f).stat()
        except OSError:
            return False
        # A Debian upgrade replaces the source files; the linked or copied ones must follow.
        if got.st_size != want.st_size or int(got.st_mtime) != int(want.st_mtime):
            return False
    return True


def _copy(src: Path, dst: Path) -> None:
    # A copy, not a link: nltk's path sandbox resolves symlinks (and refuses those leading out of the corpus
    # folder) and refuses multiply-linked files, so links to /usr/share/wordnet cannot be read. ~37 MB once.
    shutil.copy2(src, dst)


def wordnet_data_dir(
    source: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Lay out ``<cache_dir>/corpora/wordnet/`` for nltk and return that folder.

    The folder holds copies of the database files in ``source`` (nltk refuses symlinks and hard links
    that lead outside its corpus folder) and a generated ``lexnames``. It is built in a temporary folder
    and renamed into place, so parallel processes never see a half-built folder; a folder made from another
    source (or from older files) is rebuilt.

    Args:
        source: folder with the WordNet 3.0 database (``data.noun``, ``index.sense``...). Default:
            ``$HIERCLS_WORDNET_DIR`` or ``/usr/share/wordnet`` (Debian).
        cache_dir: the ``nltk_data``-style root. Default: ``$HIERCLS_CACHE/nltk_data`` or
            ``~/.cache/hiercls/nltk_data``.

    Raises:
        WordNetUnavailableError: a database file is missing (names the file and the Debian package), or
            the cache folder cannot be written.

    Example:
        >>> d = wordnet_data_dir()  # doctest: +SKIP
        >>> (d / "lexnames").read_text().splitlines()[5]  # doctest: +SKIP
        '05\\tnoun.animal\\t1'
    """
    src = _source_dir(source)
    missing = _missing_files(src)
    if missing:
        packages = sorted({_REQUIRED_FILES[f] for f in missing})
        raise WordNetUnavailableError(
            f"WordNet 3.0 files missing from {src}: {', '.join(missing)} (Debian package(s) "
            f"{', '.join(packages)}; install with `{_INSTALL_HINT}`, or point $HIERCLS_WORDNET_DIR at a folder "
            "holding the WordNet 3.0 database files)"
        )
    corpora = _cache_root(cache_dir) / "corpora"
    target = corpora / "wordnet"
    if _layout_is_valid(target, src):
        return target
    try:
        corpora.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=corpora))
    except OSError as err:
        raise WordNetUnavailableError(
            f"cannot lay out WordNet for nltk in {corpora} ({err}); set $HIERCLS_CACHE "
            "(or pass cache_dir=) to a writable folder"
        ) from None
    try:
        for f in (*_REQUIRED_FILES, *_OPTIONAL_FILES):
            if (src / f).is_file():
                _copy((src / f).resolve(), tmp / f)
        (tmp / "lexnames").write_text(_lexnames_text(), encoding="utf-8")
        (tmp / ".source").write_text(str(src.resolve()), encoding="utf-8")
        if target.exists() or target.is_symlink():
            if _layout_is_valid(target, src):  # another process won the race
                return target
            # A stale layout (other source, broken links): move it aside, then swap the new one in.
            stale = Path(tempfile.mkdtemp(prefix=".wordnet-stale-", dir=corpora))
            with contextlib.suppress(OSError):  # another process moved it first
                os.replace(target, stale / "wordnet")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _layout_is_valid(target, src):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("prepared WordNet 3.0 for nltk in %s (from %s)", target, src)
    return target


@lru_cache(maxsize=4)
def _reader(source: str, cache_dir: str | None) -> WordNetCorpusReader:
    import nltk.data
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    folder = wordnet_data_dir(source, cache_dir)
    root = str(folder.parent.parent)
    if root not in nltk.data.path:
        # nltk refuses to read corpora outside nltk.data.path (its path sandbox).
        nltk.data.path.append(root)
    with warnings.catch_warnings():
        # Without an Open Multilingual Wordnet reader nltk warns on every construction; English is all we use.
        warnings.filterwarnings("ignore", message="The multilingual functions are not available")
        return WordNetCorpusReader(str(folder), None)


def wordnet(
    source: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> WordNetCorpusReader:
    """A ready nltk ``WordNetCorpusReader`` over the offline WordNet 3.0 files (cached per folder).

    Args:
        source: folder with the database files (see :func:`wordnet_data_dir`).
        cache_dir: the ``nltk_data``-style root for the generated layout.

    Raises:
        WordNetUnavailableError: the database files are missing; install ``wordnet-base`` and
            ``wordnet-sense-index``.

    Example:
        >>> wn = wordnet()  # doctest: +SKIP
        >>> wn.synset_from_pos_and_offset("n", 1440764).name()  # doctest: +SKIP
        'tench.n.01'
    """
    src = str(_source_dir(source).resolve())
    return _reader(src, None if cache_dir is None else str(Path(cache_dir).resolve()))


def is_wnid(name: str) -> bool:
    """Whether ``name`` has the form of an ImageNet noun id (``n`` + 8 digits).

    Example:
        >>> is_wnid("n01440764"), is_wnid("tench.n.01")
        (True, False)
    """
    return bool(_WNID_RE.match(name))


def wnid_to_synset(wnid: str, wn: WordNetCorpusReader | None = None) -> Synset:
    """The noun synset of an ImageNet id.

    Raises:
        TaxonomyError: ``wnid`` is malformed or not the offset of a WordNet 3.0 noun synset.

    Example:
        >>> wnid_to_synset("n01440764").name()  # doctest: +SKIP
        'tench.n.01'
    """
    if not isinstance(wnid, str) or not is_wnid(wnid):
        raise TaxonomyError(
            f"{wnid!r} is not a WordNet noun id: expected 'n' followed by 8 digits, e.g. 'n01440764'", label=str(wnid)
        )
    wn = wn or wordnet()
    try:
        with warnings.catch_warnings():  # nltk warns, then returns None, for an offset that is no synset
            warnings.simplefilter("ignore")
            synset = wn.synset_from_pos_and_offset("n", int(wnid[1:]))
    except Exception as err:  # nltk raises WordNetError, or ValueError on a line that is no synset
        raise TaxonomyError(f"{wnid!r} is not a WordNet 3.0 noun synset ({err})", label=wnid) from None
    if synset is None or synset.offset() != int(wnid[1:]):
        raise TaxonomyError(f"{wnid!r} is not a WordNet 3.0 noun synset", label=wnid)
    return synset


def synset_to_wnid(synset: Synset | str, wn: WordNetCorpusReader | None = None) -> str:
    """The ImageNet id of a noun synset, given as an nltk ``Synset`` or its name (``"tench.n.01"``).

    Raises:
        TaxonomyError: unknown synset name, or a synset that is not a noun.

    Example:
        >>> synset_to_wnid("tench.n.01")  # doctest: +SKIP
        'n01440764'
    """
    if isinstance(synset, str):
        wn = wn or wordnet()
        try:
            synset = wn.synset(synset)
        except Exception as err:
            raise TaxonomyError(f"unknown WordNet synset {synset!r} ({err})", label=synset) from None
    if synset.pos() != "n":
        raise TaxonomyError(
            f"synset {synset.name()!r} is not a noun (pos {synset.pos()!r}); ImageNet ids name noun synsets only",
            label=synset.name(),
        )
    return f"n{synset.offset():08d}"


def _data_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of the synset lines of a WordNet data file (the license header skipped)."""
    with open(path, encoding="utf-8") as f:
        yield from ((n, line) for n, line in enumerate(f, 1) if not line.startswith("  "))


@lru_cache(maxsize=2)
def _noun_table(source: str) -> dict[str, tuple[tuple[str, ...], tuple[str, ...], str]]:
    """``wnid -> (hypernyms, instance hypernyms, first lemma)`` read straight from ``data.noun``.

    Read here rather than through nltk for two reasons: the pointers keep their order in the database (nltk
    3.9+ keeps a synset's pointers in a ``set``, so ``hypernyms()`` order changes from one process to the
    next), and one pass over the file takes about a second where ``all_synsets("n")`` takes over ten.
    """
    table: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {}
    path = Path(source) / "data.noun"
    for lineno, line in _data_lines(path):
        try:
            fields = line.split(" | ", 1)[0].split()
            n_words = int(fields[3], 16)
            lemma = fields[4]
            k = 4 + 2 * n_words
            n_ptr = int(fields[k])
            hyper: list[str] = []
            inst: list[str] = []
            for j in range(k + 1, k + 1 + 4 * n_ptr, 4):
                symbol, offset, pos = fields[j], fields[j + 1], fields[j + 2]
                if pos == "n" and symbol == "@":
                    hyper.append("n" + offset)
                elif pos == "n" and symbol == "@i":
                    inst.append("n" + offset)
        except (IndexError, ValueError):
            raise TaxonomyError("malformed WordNet data line", source=str(path), line=lineno) from None
        table["n" + fields[0]] = (tuple(hyper), tuple(inst), lemma.replace("_", " "))
    return table


@lru_cache(maxsize=2)
def _gloss_table(source: str) -> dict[str, str]:
    table: dict[str, str] = {}
    path = Path(source) / "data.noun"
    for lineno, line in _data_lines(path):
        head, sep, gloss = line.partition(" | ")
        if not sep or not head[:8].isdigit():
            raise TaxonomyError("malformed WordNet data line (no ' | ' gloss)", source=str(path), line=lineno)
        # The gloss is the definition, then quoted examples after '; "': keep the definition.
        table["n" + head[:8]] = gloss.split('; "', 1)[0].strip().rstrip(";").strip()
    return table


def noun_glosses(source: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """``wnid -> definition`` of every WordNet 3.0 noun synset, read from ``data.noun`` (examples left out).

    Raises:
        WordNetUnavailableError: the WordNet files are missing.

    Example:
        >>> noun_glosses()["n02084071"][:26]  # doctest: +SKIP
        'a member of the genus Cani'
    """
    src = _source_dir(source)
    if _missing_files(src):
        wordnet_data_dir(src)  # raises WordNetUnavailableError naming the packages
    return dict(_gloss_table(str(src.resolve())))


def _parent_list(entry: tuple[tuple[str, ...], tuple[str, ...], str], include_instances: bool) -> list[str]:
    # WordNet lists an instance's class under "@i" pointers, apart from "@" hypernyms; 5 synsets have both.
    hyper, inst, _ = entry
    if not include_instances:
        return list(hyper)
    return list(hyper) + [p for p in inst if p not in hyper]


def _preorder(parents: Mapping[str, list[str]], root: str) -> list[str]:
    """Depth-first pre-order along first parents (children by wnid): the node order given to :class:`Taxonomy`.

    It only breaks ties between siblings (ids stay topological); each node's parents keep the order of its
    edges, i.e. WordNet's hypernym order.
    """
    children: dict[str, list[str]] = {n: [] for n in parents}
    for child, ps in parents.items():
        if ps:
            children[ps[0]].append(child)
    order: list[str] = []
    stack = [root]
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(sorted(children[n], reverse=True))
    return order


def wordnet_taxonomy(
    wnids: Iterable[str] | None = None,
    *,
    include_instances: bool = False,
    display_names: Mapping[str, str] | None = None,
    name: str = "wordnet_nouns",
    metadata: Mapping[str, Any] | None = None,
    source: str | os.PathLike[str] | None = None,
) -> Taxonomy:
    """The WordNet 3.0 noun hypernym DAG, restricted to ``wnids`` and all their ancestors.

    Multi-parent synsets keep every hypernym in the order of the database (``data.noun``; the set-valued
    ``hypernyms()`` of nltk 3.9+ has no stable order), so ``to_tree("first")`` follows each synset's first
    hypernym. The root is ``entity.n.01`` (``n00001740``).

    Args:
        wnids: ImageNet-style noun ids to keep (with all their hypernym ancestors). Default: the whole
            noun hierarchy (74,374 synsets; 82,115 with ``include_instances``).
        include_instances: also follow instance hypernyms (``Rome`` is an instance of ``national capital``).
            Without it, synsets that are only instances have no parent: they are dropped from the full
            hierarchy and are an error when listed in ``wnids``.
        display_names: display name per wnid (default: the synset's first lemma, underscores as spaces).
        name: the taxonomy's name.
        metadata: extra metadata (merged over the defaults: source, wordnet version, include_instances).
        source: folder with the WordNet 3.0 database (default: ``$HIERCLS_WORDNET_DIR`` or
            ``/usr/share/wordnet``).

    Returns:
        A :class:`Taxonomy` whose node names are wnids; its classes are ``wnids`` (default: every node
        but the root).

    Raises:
        TaxonomyError: a wnid is malformed, unknown, duplicated, or (without ``include_instances``) an
            instance-only synset.
        WordNetUnavailableError: the WordNet files are missing.

    Example:
        >>> tax = wordnet_taxonomy(["n02084071"])  # doctest: +SKIP
        >>> [tax.display_names[i] for i in tax.path(tax.index("n02084071"))][:3]  # doctest: +SKIP
        ['entity', 'physical entity', 'object']
    """
    src = _source_dir(source)
    missing = _missing_files(src)
    if missing:
        wordnet_data_dir(src)  # raises WordNetUnavailableError naming the packages
    table = _noun_table(str(src.resolve()))
    classes = None if wnids is None else _checked_wnids(wnids, table)
    # Walk up from every seed; parents[w] lists w's hypernyms in WordNet's order.
    parents: dict[str, list[str]] = {}
    stack = list(table) if classes is None else classes[::-1]
    while stack:
        w = stack.pop()
        if w in parents:
            continue
        parents[w] = _parent_list(table[w], include_instances)
        stack.extend(p for p in parents[w] if p not in parents)
    lemma = {w: table[w][2] for w in parents}
    parents = _rooted(parents, classes, lemma)
    order = _preorder(parents, WORDNET_ROOT_WNID)
    edges = [(p, c) for c in order for p in parents[c]]
    disp = {w: lemma[w] for w in order}
    if display_names:
        disp.update({k: v for k, v in display_names.items() if k in parents})
    meta = {
        "source": "WordNet 3.0 noun hypernyms (Princeton), data.noun",
        "wordnet_version": "3.0",
        "include_instances": include_instances,
        "root": WORDNET_ROOT_WNID,
    }
    meta.update(metadata or {})
    return Taxonomy(edges, nodes=order, display_names=disp, classes=classes, name=name, metadata=meta)


def _checked_wnids(wnids: Iterable[str], table: Mapping[str, Any]) -> list[str]:
    """``wnids`` as a list, each a well-formed, known WordNet 3.0 noun id, listed once."""
    classes = list(wnids)
    seen: set[str] = set()
    for w in classes:
        if not isinstance(w, str) or not is_wnid(w):
            raise TaxonomyError(
                f"{w!r} is not a WordNet noun id: expected 'n' followed by 8 digits, e.g. 'n01440764'", label=str(w)
            )
        if w not in table:
            raise TaxonomyError(f"{w!r} is not a WordNet 3.0 noun synset", label=w)
        if w in seen:
            raise TaxonomyError(f"wnid {w!r} is listed twice", label=w)
        seen.add(w)
    return classes


def _rooted(parents: dict[str, list[str]], classes: list[str] | None, lemma: Mapping[str, str]) -> dict[str, list[str]]:
    """What hangs from entity.n.01 through the edges followed. Without instance edges, instance-only synsets
    have no hypernym, and a few (16) regular synsets name one as hypernym (blighty.n.01 -> united_kingdom.n.01):
    those edges, and synsets left with no path to the root, go (a class among them is an error)."""
    kids: dict[str, list[str]] = {w: [] for w in parents}
    for w, ps in parents.items():
        for p in ps:
            kids[p].append(w)
    reached = {WORDNET_ROOT_WNID} if WORDNET_ROOT_WNID in parents else set()
    stack = list(reached)
    while stack:
        for k in kids[stack.pop()]:
            if k not in reached:
                reached.add(k)
                stack.append(k)
    if len(reached) == len(parents):
        return parents
    bad = [w for w in classes or () if w not in reached]
    if bad:
        shown = ", ".join(f"{w} ({lemma[w]})" for w in bad[:5])
        raise TaxonomyError(
            f"{len(bad)} wnid(s) reach entity.n.01 only through instance hypernyms, e.g. {shown}; pass "
            "include_instances=True to place them under their instance hypernyms",
            label=bad[0],
        )
    logger.info(
        "wordnet_taxonomy: left out %d synsets reachable only through instance hypernyms", len(parents) - len(reached)
    )
    return {w: [p for p in ps if p in reached] for w, ps in parents.items() if w in reached}
