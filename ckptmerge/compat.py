"""Old import paths, kept for one release: ``ckptmerge.planner`` and its kin still import, with a warning.

The modules moved into one folder per idea (``ckptmerge.planner`` is now
``ckptmerge.planning.planner``). Importing an old path gives the module at its new path, the very
same module object, and a :class:`DeprecationWarning` naming the new path. The finder is installed
by ``import ckptmerge`` and answers only for the names in :data:`MOVED`.

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
from typing import Optional, Sequence

#: old dotted module path -> the path it moved to (these go away in the next release)
MOVED = {
    "ckptmerge.align": "ckptmerge.alignment.align",
    "ckptmerge.backends": "ckptmerge.restoring.backends",
    "ckptmerge.backends.eager": "ckptmerge.restoring.backends.eager",
    "ckptmerge.backends.graph": "ckptmerge.restoring.backends.graph",
    "ckptmerge.backends.keras_native": "ckptmerge.restoring.backends.keras_native",
    "ckptmerge.backends.tensors": "ckptmerge.restoring.backends.tensors",
    "ckptmerge.casts": "ckptmerge.planning.casts",
    "ckptmerge.config_env": "ckptmerge.config.env",
    "ckptmerge.config_files": "ckptmerge.config.files",
    "ckptmerge.config_model": "ckptmerge.config.model",
    "ckptmerge.config_problems": "ckptmerge.config.problems",
    "ckptmerge.config_schema": "ckptmerge.config.schema",
    "ckptmerge.findings": "ckptmerge.planning.findings",
    "ckptmerge.formats.bundle": "ckptmerge.formats.tf.bundle",
    "ckptmerge.formats.bundleindex": "ckptmerge.formats.tf.bundleindex",
    "ckptmerge.formats.bytecopy": "ckptmerge.formats.io.bytecopy",
    "ckptmerge.formats.fileio": "ckptmerge.formats.io.fileio",
    "ckptmerge.formats.objectgraph": "ckptmerge.formats.tf.objectgraph",
    "ckptmerge.formats.output_prefix": "ckptmerge.formats.io.output_prefix",
    "ckptmerge.formats.protowire": "ckptmerge.formats.tf.protowire",
    "ckptmerge.formats.regions": "ckptmerge.formats.tf.regions",
    "ckptmerge.formats.slices": "ckptmerge.formats.tf.slices",
    "ckptmerge.formats.storage": "ckptmerge.formats.io.storage",
    "ckptmerge.formats.table": "ckptmerge.formats.tf.table",
    "ckptmerge.formats.table_writer": "ckptmerge.formats.tf.table_writer",
    "ckptmerge.formats.tfproto": "ckptmerge.formats.tf.tfproto",
    "ckptmerge.formats.v1": "ckptmerge.formats.tf.v1",
    "ckptmerge.formats.writer": "ckptmerge.formats.tf.writer",
    "ckptmerge.keraswalk": "ckptmerge.restoring.keraswalk",
    "ckptmerge.layouts": "ckptmerge.alignment.layouts",
    "ckptmerge.localfile": "ckptmerge.formats.io.localfile",
    "ckptmerge.nameshifts": "ckptmerge.planning.nameshifts",
    "ckptmerge.notebook": "ckptmerge.render.notebook",
    "ckptmerge.offline": "ckptmerge.merging.dispatch",
    "ckptmerge.offline_remote": "ckptmerge.merging.remote",
    "ckptmerge.patterns": "ckptmerge.planning.patterns",
    "ckptmerge.planmodel": "ckptmerge.planning.model",
    "ckptmerge.planner": "ckptmerge.planning.planner",
    "ckptmerge.report": "ckptmerge.render.report",
    "ckptmerge.resolve": "ckptmerge.sources.resolve",
    "ckptmerge.resolve_files": "ckptmerge.sources.files",
    "ckptmerge.resolve_remote": "ckptmerge.sources.remote",
    "ckptmerge.resolve_state": "ckptmerge.sources.state",
    "ckptmerge.rules": "ckptmerge.planning.rules",
    "ckptmerge.source": "ckptmerge.sources.source",
    "ckptmerge.suggestion": "ckptmerge.planning.suggestion",
    "ckptmerge.targets": "ckptmerge.restoring.targets",
    "ckptmerge.transforms": "ckptmerge.planning.transforms",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old module paths of :data:`MOVED` and loads them as their new modules."""

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
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""


def install() -> None:
    """Put the finder in front of the usual ones (once)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
