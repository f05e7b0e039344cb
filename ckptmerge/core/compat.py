"""Old import paths, kept for one release: ``ckptmerge.planner`` and its kin still import, with a warning.

The modules moved into one folder per idea (``ckptmerge.planner`` is now
``ckptmerge.planning.planner``, ``ckptmerge.errors`` is ``ckptmerge.core.errors``,
``ckptmerge.formats.h5`` is ``ckptmerge.formats.keras.h5``). Importing an old path gives the
module at its new path, the very same module object, and a :class:`DeprecationWarning` naming the
new path. The finder is installed by ``import ckptmerge`` and answers only for the names in
:data:`MOVED`.

Where an old module's path is now a package of its own family (``ckptmerge.formats.orbax`` was
one module and is now the folder of Orbax's reader and writer), the package answers for the old
module's names through :func:`moved_names`: ``from ckptmerge.formats.orbax import OrbaxReader``
still works, with a warning naming ``ckptmerge.formats.orbax.reader``.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True):
    ...     import ckptmerge.planner as old
    >>> import ckptmerge.planning.planner as new
    >>> old is new
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Sequence

#: old dotted module path -> the path it moved to (these go away in the next release)
MOVED = {
    "ckptmerge.align": "ckptmerge.alignment.align",
    "ckptmerge.args": "ckptmerge.core.args",
    "ckptmerge.backends": "ckptmerge.restoring.backends",
    "ckptmerge.backends.eager": "ckptmerge.restoring.backends.eager",
    "ckptmerge.backends.graph": "ckptmerge.restoring.backends.graph",
    "ckptmerge.backends.keras_native": "ckptmerge.restoring.backends.keras_native",
    "ckptmerge.backends.tensors": "ckptmerge.restoring.backends.tensors",
    "ckptmerge.casts": "ckptmerge.planning.casts",
    "ckptmerge.compat": "ckptmerge.core.compat",
    "ckptmerge.config_env": "ckptmerge.config.env",
    "ckptmerge.config_files": "ckptmerge.config.files",
    "ckptmerge.config_model": "ckptmerge.config.model",
    "ckptmerge.config_problems": "ckptmerge.config.problems",
    "ckptmerge.config_schema": "ckptmerge.config.schema",
    "ckptmerge.errors": "ckptmerge.core.errors",
    "ckptmerge.findings": "ckptmerge.planning.findings",
    "ckptmerge.formats.bundle": "ckptmerge.formats.tf.bundle",
    "ckptmerge.formats.bundleindex": "ckptmerge.formats.tf.bundleindex",
    "ckptmerge.formats.bytecopy": "ckptmerge.formats.io.bytecopy",
    "ckptmerge.formats.fileio": "ckptmerge.formats.io.fileio",
    "ckptmerge.formats.h5": "ckptmerge.formats.keras.h5",
    "ckptmerge.formats.h5_writer": "ckptmerge.formats.keras.h5_writer",
    "ckptmerge.formats.kerasnames": "ckptmerge.formats.keras.names",
    "ckptmerge.formats.kerasshards": "ckptmerge.formats.keras.shards",
    "ckptmerge.formats.numpy_files": "ckptmerge.formats.numpy.reader",
    "ckptmerge.formats.objectgraph": "ckptmerge.formats.tf.objectgraph",
    "ckptmerge.formats.ocdbt": "ckptmerge.formats.orbax.ocdbt",
    "ckptmerge.formats.orbax_bridge": "ckptmerge.formats.orbax.bridge",
    "ckptmerge.formats.orbax_msgpack": "ckptmerge.formats.orbax.aggregate",
    "ckptmerge.formats.orbax_store": "ckptmerge.formats.orbax.store",
    "ckptmerge.formats.orbax_writer": "ckptmerge.formats.orbax.writer",
    "ckptmerge.formats.output_prefix": "ckptmerge.formats.io.output_prefix",
    "ckptmerge.formats.protowire": "ckptmerge.formats.tf.protowire",
    "ckptmerge.formats.regions": "ckptmerge.formats.tf.regions",
    "ckptmerge.formats.safetensors_writer": "ckptmerge.formats.safetensors.writer",
    "ckptmerge.formats.slices": "ckptmerge.formats.tf.slices",
    "ckptmerge.formats.storage": "ckptmerge.formats.io.storage",
    "ckptmerge.formats.table": "ckptmerge.formats.tf.table",
    "ckptmerge.formats.table_writer": "ckptmerge.formats.tf.table_writer",
    "ckptmerge.formats.tfproto": "ckptmerge.formats.tf.tfproto",
    "ckptmerge.formats.v1": "ckptmerge.formats.tf.v1",
    "ckptmerge.formats.writer": "ckptmerge.formats.tf.writer",
    "ckptmerge.formats.zipmembers": "ckptmerge.formats.io.zipmembers",
    "ckptmerge.gcpause": "ckptmerge.core.gcpause",
    "ckptmerge.jsonout": "ckptmerge.core.jsonout",
    "ckptmerge.keraswalk": "ckptmerge.restoring.keraswalk",
    "ckptmerge.knobs": "ckptmerge.core.knobs",
    "ckptmerge.layouts": "ckptmerge.alignment.layouts",
    "ckptmerge.localfile": "ckptmerge.formats.io.localfile",
    "ckptmerge.merging.blocks": "ckptmerge.combining.blocks",
    "ckptmerge.merging.combine": "ckptmerge.combining.combine",
    "ckptmerge.merging.combine_report": "ckptmerge.combining.report",
    "ckptmerge.merging.methods": "ckptmerge.combining.methods",
    "ckptmerge.nameshifts": "ckptmerge.planning.nameshifts",
    "ckptmerge.notebook": "ckptmerge.render.notebook",
    "ckptmerge.offline": "ckptmerge.merging.dispatch",
    "ckptmerge.offline_remote": "ckptmerge.merging.remote",
    "ckptmerge.patterns": "ckptmerge.planning.patterns",
    "ckptmerge.planmodel": "ckptmerge.planning.model",
    "ckptmerge.planner": "ckptmerge.planning.planner",
    "ckptmerge.redact": "ckptmerge.core.redact",
    "ckptmerge.report": "ckptmerge.render.report",
    "ckptmerge.resolve": "ckptmerge.sources.resolve",
    "ckptmerge.resolve_files": "ckptmerge.sources.files",
    "ckptmerge.resolve_remote": "ckptmerge.sources.remote",
    "ckptmerge.resolve_state": "ckptmerge.sources.state",
    "ckptmerge.rules": "ckptmerge.planning.rules",
    "ckptmerge.source": "ckptmerge.sources.source",
    "ckptmerge.sources.pins": "ckptmerge.following.pins",
    "ckptmerge.sources.watch": "ckptmerge.following.watch",
    "ckptmerge.sources.watchscan": "ckptmerge.following.scan",
    "ckptmerge.specs": "ckptmerge.core.specs",
    "ckptmerge.suggestion": "ckptmerge.planning.suggestion",
    "ckptmerge.targets": "ckptmerge.restoring.targets",
    "ckptmerge.text": "ckptmerge.core.text",
    "ckptmerge.transforms": "ckptmerge.planning.transforms",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old module paths of :data:`MOVED` and loads them as their new modules."""

    def __init__(self) -> None:
        self._specs: Dict[str, Any] = {}

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        """A spec for an old path, or None for every other name (the usual finders answer)."""
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """Import the module at its new path and hand that very object back."""
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old path goes away in "
                      "the next release)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name; give it back its own spec.

        The import system sets ``__spec__`` to the old path's spec after :meth:`create_module`;
        the module keeps the spec of its new path (its ``__package__`` and relative imports agree).
        """
        own = self._specs.pop(module.__spec__.name, None) if module.__spec__ is not None else None
        if own is not None:
            module.__spec__ = own


def moved_names(package: str, modules: Sequence[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for a package whose path was a module's: the old names, with a warning.

    Args:
        package: the package's dotted path (its ``__name__``), once the path of a module.
        modules: the modules that hold that module's names now: the one whose ``__all__`` has
            the name first, then in order.

    Returns:
        A function to bind as the package's ``__getattr__`` (PEP 562).

    Example:
        >>> import warnings
        >>> from ckptmerge.formats.orbax.reader import OrbaxReader
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     from ckptmerge.formats.orbax import OrbaxReader as old
        >>> old is OrbaxReader, "ckptmerge.formats.orbax.reader" in str(caught[0].message)
        (True, True)
    """

    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            found = [importlib.import_module(path) for path in modules]
            # the module that exports the name first (a name one of them imports from another
            # is named at its home), then any module that has it
            for path, module in sorted(zip(modules, found), key=lambda pm: name not in getattr(pm[1], "__all__", ())):
                if hasattr(module, name):
                    warnings.warn(f"{package}.{name} moved to {path}.{name}; import it from there (the "
                                  "old path goes away in the next release)", DeprecationWarning, stacklevel=2)
                    return getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def install() -> None:
    """Put the finder in front of the usual ones (once)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
