"""ckptmerge: restore TensorFlow variables from several checkpoints at once, with a plan first.

Importing this package does not import TensorFlow: planning and inspection read checkpoints
with ckptmerge's own reader; TF is imported only when variables are touched.

Example:
    >>> import ckptmerge as cm
    >>> sources = [cm.Source("runs/A", map={"a1": "c/x1"}),
    ...            cm.Source("runs/B/model-10", map={"b1": "c/y1"})]      # doctest: +SKIP
    >>> plan = cm.plan(None, sources, allow_missing=["c/z"])               # doctest: +SKIP
    >>> print(plan.report())                                               # doctest: +SKIP
    >>> plan.restore(session=sess)                                         # doctest: +SKIP
"""

from .api import list_variables, load, open, plan, restore, warm_start
from .config import Config, load_config
from .errors import (
    CheckpointFormatError,
    CheckpointNotFoundError,
    CkptMergeError,
    ConfigError,
    PlanError,
    RestoreError,
    RuleError,
    UnknownTensorError,
)
from .merge import MergeReport, merge
from .planner import Plan
from .report import Report
from .resolve import CheckpointInfo, checkpoints
from .restorer import Restorer, snapshot
from .source import Source
from .specs import VariableInfo
from .transforms import Slice, VocabRemap

__version__ = "0.1.0"

__all__ = [
    "CheckpointFormatError",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "CkptMergeError",
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
    "Source",
    "UnknownTensorError",
    "VariableInfo",
    "VocabRemap",
    "checkpoints",
    "list_variables",
    "load",
    "load_config",
    "merge",
    "open",
    "plan",
    "restore",
    "snapshot",
    "warm_start",
]
