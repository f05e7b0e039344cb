"""``python -m ckptmerge``: the same command line as the ``ckptmerge`` console script."""

from ckptmerge.cli import main

if __name__ == "__main__":
    main()
