"""ckptmerge: restore TensorFlow variables from several checkpoints at once, with a plan first.

Importing this package does not import TensorFlow: planning and inspection read checkpoints
with ckptmerge's own reader; TF is imported only when variables are touched. The public names
below are loaded on first use (PEP 562), so ``import ckptmerge`` and the inspection commands
stay fast.

Example:
    >>> import ckptmerge as cm
    >>> sources = [cm.Source("runs/A", map={"a1": "c/x1"}),
    ...            cm.Source("runs/B/model-10", map={"b1": "c/y1"})]      # doctest: +SKIP
    >>> plan = cm.plan(None, sources, allow_missing=["c/z"])               # doctest: +SKIP
    >>> print(plan.report())                                               # doctest: +SKIP
    >>> plan.restore(session=sess)                                         # doctest: +SKIP
"""

from __future__ import annotations

from .core import interrupts as _interrupts

if _interrupts.started_as_program():  # first: Ctrl-C while the program starts exits 130 (core/interrupts.py)
    _interrupts.install()

import importlib  # noqa: E402
from typing import TYPE_CHECKING, Any, Dict, List

from .core import compat
from .core.errors import (
    ArgumentError,
    ArgumentTypeError,
    CheckpointFormatError,
    CheckpointNotFoundError,
    CkptMergeError,
    CombineError,
    ConfigError,
    PlanError,
    RestoreError,
    RuleError,
    UnknownTensorError,
    UnreadableTensorError,
    UnsafeCheckpointError,
)
from .core.specs import VariableInfo

compat.install()  # old module paths (ckptmerge.planner, ...) still import, with a warning

__version__ = "0.1.0"

#: public name -> the module that defines it (imported on first access); keep in step with
#: ``__all__`` (tests/test_package.py checks every name resolves).
_LAZY: Dict[str, str] = {
    "Config": ".config",
    "load_config": ".config",
    "CheckpointInfo": ".sources.resolve",
    "checkpoints": ".sources.resolve",
    "CombinedSource": ".combining.combine",
    "CombineReport": ".combining.combine",
    "combine": ".combining.combine",
    "from_mergekit": ".config.mergekit",
    "MergeReport": ".merging.dispatch",
    "merge": ".merging.dispatch",
    "Plan": ".planning.planner",
    "Report": ".render.report",
    "Restorer": ".restorer",
    "snapshot": ".restorer",
    "Slice": ".planning.transforms",
    "Transpose": ".planning.transforms",
    "VocabRemap": ".planning.transforms",
    "Source": ".sources.source",
    "Reshape": ".alignment.tensorops",
    "Split": ".alignment.tensorops",
    "Squeeze": ".alignment.tensorops",
    "ExpandDims": ".alignment.tensorops",
    "Concat": ".alignment.tensorops",
    "Convention": ".alignment.conventions",
    "add_convention": ".alignment.conventions",
    "FusedConvention": ".alignment.fused",
    "add_fused_convention": ".alignment.fused",
    "list_variables": ".api",
    "load": ".api",
    "open": ".api",
    "plan": ".api",
    "restore": ".api",
    "suggest": ".api",
    "Suggestion": ".planning.suggestion",
    "warm_start": ".api",
    "watch": ".following.watch",
}

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "CheckpointFormatError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "CkptMergeError",
    "CombineError",
    "CombineReport",
    "CombinedSource",
    "Config",
    "ConfigError",
    "MergeReport",
    "Plan",
    "PlanError",
    "Report",
    "RestoreError",
    "Restorer",
    "RuleError",
    "Slice",
    "Reshape",
    "Split",
    "Squeeze",
    "ExpandDims",
    "Concat",
    "Convention",
    "add_convention",
    "FusedConvention",
    "add_fused_convention",
    "Source",
    "Suggestion",
    "Transpose",
    "UnknownTensorError",
    "UnreadableTensorError",
    "UnsafeCheckpointError",
    "VariableInfo",
    "VocabRemap",
    "checkpoints",
    "combine",
    "from_mergekit",
    "list_variables",
    "load",
    "load_config",
    "merge",
    "open",
    "plan",
    "restore",
    "snapshot",
    "suggest",
    "warm_start",
    "watch",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptmerge' has no attribute '{name}'")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> List[str]:
    """The public names only (``dir(ckptmerge)``, tab completion): what ``__all__`` lists."""
    return sorted(set(__all__) | {"__version__"} & set(globals()))


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .alignment.conventions import Convention, add_convention
    from .alignment.fused import FusedConvention, add_fused_convention
    from .alignment.tensorops import Concat, ExpandDims, Reshape, Split, Squeeze
    from .api import list_variables, load, open, plan, restore, suggest, warm_start
    from .config.load import Config, load_config
    from .combining.combine import CombinedSource, CombineReport, combine
    from .config.mergekit import from_mergekit
    from .merging.dispatch import MergeReport, merge
    from .planning.planner import Plan
    from .planning.suggestion import Suggestion
    from .planning.transforms import Slice, Transpose, VocabRemap
    from .render.report import Report
    from .restorer import Restorer, snapshot
    from .sources.resolve import CheckpointInfo, checkpoints
    from .sources.source import Source
    from .following.watch import watch
