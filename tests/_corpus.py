"""Where the real-world corpus of checkpoints is, for the tests that read it.

The corpus (checkpoints written by other people with TF 0.x to 2.x and Keras 3, each folder with
a ``reference.json``) is not part of the repository. It is found through ``CKPTMERGE_CORPUS``,
else ``../shared/corpus`` beside the checkout. Tests reach it only through :func:`corpus`, at
run time: without a corpus they skip with :data:`MISSING`; with one they run and fail loudly when
a file in it is read wrongly. Nothing reads the corpus at import time, so collection never fails
for want of it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

import pytest

#: The one reason every corpus test gives when it skips.
MISSING = "real-world corpus not found: set CKPTMERGE_CORPUS"

_ENV = os.environ.get("CKPTMERGE_CORPUS")

#: Where the corpus should be (it may not exist: tests use :func:`corpus`).
# Resolved: resolution reports a checkpoint by its real path, so a corpus reached through a
# symbolic link (a ``shared`` folder linked beside the checkout) compares equal.
CORPUS_PATH = (Path(os.path.abspath(_ENV)) if _ENV else Path(__file__).resolve().parents[2] / "shared" / "corpus").resolve()


def corpus() -> Path:
    """Return the corpus directory; skip the calling test when there is no corpus, fail when
    ``CKPTMERGE_CORPUS`` names a directory that does not exist (a typo must not skip CI's tests)."""
    if CORPUS_PATH.is_dir():
        return CORPUS_PATH
    if _ENV:
        pytest.fail(f"CKPTMERGE_CORPUS={_ENV!r} is not a directory", pytrace=False)
    pytest.skip(MISSING)


def corpus_folders() -> List[str]:
    """The corpus folder names, sorted, for ``parametrize`` (lists a directory, reads no file);
    without a corpus one placeholder, so the test is collected and skips when it calls :func:`corpus`."""
    if not CORPUS_PATH.is_dir():
        return ["corpus-missing"]
    return sorted(p.name for p in CORPUS_PATH.iterdir() if p.is_dir())
