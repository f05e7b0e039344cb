"""``python -m ckptmerge`` and the ``ckptmerge`` console script: the program's entry point.

Ctrl-C is handled from here on before anything heavy is imported (the command line imports
click and every command's module, half a second or more): it exits 130 with ``Aborted!``,
never a traceback (see :mod:`ckptmerge.core.interrupts`).
"""

from ckptmerge.core import interrupts


def main() -> None:
    """Run the ``ckptmerge`` command line (``sys.argv``), Ctrl-C handled from the first line.

    Example:
        $ python -m ckptmerge --version
        ckptmerge 0.1.0
    """
    interrupts.install()
    from ckptmerge.cli import main as run

    run()


if __name__ == "__main__":
    main()
