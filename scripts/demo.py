"""The built-in demo from a source checkout: the same as `ckptmerge demo`, without installing.

Writes checkpoints A and B (TF1 Savers) and two Keras checkpoints to a folder, builds model C,
prints each plan's report, restores in graph and eager mode and checks every value
(see ckptmerge/demo.py).

Run: python scripts/demo.py [--dir EMPTY_FOLDER]
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ckptmerge.cli import main  # noqa: E402

if __name__ == "__main__":
    main(["demo", *sys.argv[1:]])
