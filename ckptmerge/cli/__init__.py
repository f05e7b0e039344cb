"""The ``ckptmerge`` command line: a thin click layer over the library.

Each command parses its arguments, calls the library, and renders the result: fixed-width
tables for people, ``--json`` for scripts. This package is the only part of ckptmerge that prints.
Every :class:`~ckptmerge.core.errors.CkptMergeError` (and every ``OSError`` on input files) becomes
one clear ``Error: ...`` message on stderr with exit code 2, never a traceback (config and plan
errors list one problem per line). Exit codes: 0 ok, 1 findings or differences, 2 usage or
input errors, 130 interrupted (Ctrl-C).

The inspection commands (``ls``, ``show``, ``diff``, ``checkpoints``, ``watch``, ``check``,
``plan --target``, ``suggest --target``, ``merging`` without ``--model``) never import TensorFlow; ``demo`` and
``--model MODULE:FUNCTION`` do.

Example:
    $ ckptmerge ls runs/A --match 'enc*'
    $ ckptmerge diff runs/A runs/B --values
    $ ckptmerge plan warm.yaml --target runs/C
"""

from __future__ import annotations

import gc
from typing import Optional, Sequence

from ..core import interrupts
from . import combine, follow, inspect, suggest, workflow  # noqa: F401  (registers the commands)
from .common import EXIT_ERROR, EXIT_FINDINGS, EXIT_INTERRUPTED, CliError, cli, table
from .inspect import max_abs_diff, tensor_stats, value_to_json

__all__ = ["cli", "main", "CliError", "EXIT_ERROR", "EXIT_FINDINGS", "EXIT_INTERRUPTED", "table", "max_abs_diff", "tensor_stats",
           "value_to_json"]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Run the ``ckptmerge`` command line (the console script and ``python -m ckptmerge``).

    Example:
        >>> main(["--version"])  # doctest: +SKIP
        ckptmerge 0.1.0
    """
    interrupts.install()  # (done already when the process started as ckptmerge: core/interrupts.py)
    # Objects made while importing live until exit: take them out of the cyclic collector's
    # reach, so the collections triggered while parsing a large index stay cheap (~10% of
    # `ckptmerge ls` on 10,000 variables).
    gc.freeze()
    cli.main(args=list(argv) if argv is not None else None, prog_name="ckptmerge",
             obj={"configure_logging": True})
