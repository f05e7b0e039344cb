"""Where the tests find a Python with torch (torch and TensorFlow cannot share a process).

``CKPTMERGE_TORCH_PYTHON`` names that interpreter; without it, ``../venvs/torch/bin/python`` beside
the checkout is used when it exists (the layout ``tests/fixtures/xframe/README.md`` sets up). Tests
that need it skip with :data:`REASON` when there is none.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "CKPTMERGE_TORCH_PYTHON"
REASON = (f"needs a Python with torch (torch and TF cannot share a process): set {ENV} to it, or make "
          "../venvs/torch beside the checkout (tests/fixtures/xframe/README.md)")


def torch_python() -> str:
    """The torch interpreter's path, or ``""`` when there is none."""
    named = os.environ.get(ENV, "").strip()
    if named:
        return named if os.path.isfile(named) and os.access(named, os.X_OK) else ""
    default = Path(__file__).resolve().parents[2] / "venvs" / "torch" / "bin" / "python"
    return str(default) if default.exists() else ""
