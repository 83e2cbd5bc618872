"""Register hiercls with ``transformers``' Auto classes when ``transformers`` loads them, not before.

``import hiercls`` must stay instant for users who never touch ``transformers`` (importing it and torch takes
seconds), yet ``AutoModel.from_pretrained(folder)`` should work after a plain ``import hiercls``. So importing
hiercls installs an import hook and nothing else: when an import of ``transformers`` code completes (the
outermost one: no ``transformers`` module is still half-initialised) and its Auto classes are loaded,
:mod:`hiercls.models.hf` is imported, which registers ``model_type="hiercls"`` with ``AutoConfig`` /
``AutoModel`` and the ``hierarchical-classification`` pipeline task. Where ``transformers`` was loaded before
hiercls, this happens at once.

Example:
    >>> import sys
    >>> any(isinstance(f, AfterTransformersImport) for f in sys.meta_path)
    True
"""

from __future__ import annotations

import importlib
import sys
import warnings

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: import hiercls stays ~1 ms
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType
    from typing import Any

__all__ = ["AfterTransformersImport", "install", "register_if_ready"]


#: The module whose import registers hiercls (it imports ``transformers``' Auto classes and pipelines).
REGISTRAR = "hiercls.models.hf"
_DEPTH = [0]  # transformers modules being imported through the hook, nested (registration waits for 0)


def _initialising(module: ModuleType) -> bool:
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def register_if_ready(done: str = "") -> bool:
    """Import :data:`REGISTRAR` if ``transformers``' Auto classes are loaded and none of its modules is mid-import.

    ``done``: a module whose code has just run (the import system marks it initialising until its loader returns).

    Returns whether hiercls is registered. A failure is a warning (``transformers`` keeps working; ``AutoModel``
    then does not know hiercls folders), never an error inside the caller's ``import transformers``.
    """
    if REGISTRAR in sys.modules:
        return True
    if "transformers.models.auto.configuration_auto" not in sys.modules:
        return False
    # Registering imports more of transformers; a half-initialised module there would fail that import.
    modules = list(sys.modules.items())
    if any(_initialising(m) for name, m in modules if name.startswith("transformers") and name != done and m):
        return False
    try:
        importlib.import_module(REGISTRAR)
    except Exception as err:  # any import failure: say so once, leave transformers usable
        warnings.warn(f"hiercls could not register with transformers' AutoModel: {err}", ImportWarning, stacklevel=2)
        return False
    return True


class _Loader:
    """Runs the real loader, then :func:`register_if_ready` (and puts the real loader back on the module)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        _DEPTH[0] += 1
        try:
            self.loader.exec_module(module)
        finally:
            _DEPTH[0] -= 1
        if _DEPTH[0] == 0:  # the outermost transformers import is complete: the one safe moment to register
            register_if_ready(module.__name__)


class AfterTransformersImport:
    """A ``sys.meta_path`` finder that wraps the loaders of ``transformers`` modules; everything else passes by."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if not fullname.startswith("transformers.") or REGISTRAR in sys.modules:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Put the hook first on ``sys.meta_path`` (once), and register now if ``transformers`` is loaded already."""
    if not any(isinstance(f, AfterTransformersImport) for f in sys.meta_path):
        sys.meta_path.insert(0, AfterTransformersImport())
    register_if_ready()
