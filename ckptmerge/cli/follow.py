"""``ckptmerge watch``: one line (or JSON object) per new checkpoint of a training run, as it
arrives, optionally running a command for each (TensorFlow-free)."""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import subprocess
import sys
from typing import Any, Optional

import click

from ..core.text import escape_name, human_bytes, quote_name
from .common import JSON_OPTION, cli, echo_json

#: Environment variables the ``--exec`` command gets.
ENV_CHECKPOINT = "CKPTMERGE_CHECKPOINT"
ENV_CHECKPOINT_PATH = "CKPTMERGE_CHECKPOINT_PATH"
ENV_STEP = "CKPTMERGE_STEP"


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


def _shown(path: str, directory: str) -> str:
    """``path`` under DIR as the user wrote DIR (URLs and paths outside DIR as they are)."""
    if "://" in path:
        return path
    try:
        rel = os.path.relpath(path, os.path.abspath(directory))
    except ValueError:  # pragma: no cover - another drive on Windows
        return path
    return path if rel.startswith(os.pardir) else os.path.join(directory, rel)


@cli.command("watch", short_help="Print each new checkpoint of a training run as it arrives.")
@click.argument("directory", metavar="DIR")
@JSON_OPTION
@click.option("--exec", "command", metavar="CMD", default=None,
              help=f"Run CMD (through the shell) for each checkpoint, with its path in ${ENV_CHECKPOINT} "
                   f"(pinned while CMD runs), the trainer's path in ${ENV_CHECKPOINT_PATH} and the step in "
                   f"${ENV_STEP}; the next checkpoint waits until it ends.")
@click.option("--after", type=click.IntRange(min=0), default=None, metavar="N",
              help="Only steps above N (default: every checkpoint there is, then each new one).")
@click.option("--latest", is_flag=True, help="Only the newest checkpoint each time (TF's behaviour), not every one.")
@click.option("--until-step", type=click.IntRange(min=0), default=None, metavar="N",
              help="Stop after a checkpoint of step N or higher.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Stop when no new checkpoint came for SECONDS (default: never; 0: look once).")
@click.option("--poll", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
              metavar="SECONDS", help="The longest wait between two looks at DIR.")
def watch_command(directory: str, as_json: bool, command: Optional[str], after: Optional[int], latest: bool,
                  until_step: Optional[int], timeout: Optional[float], poll: float) -> None:
    """Print one line per new complete checkpoint of DIR (a directory or a URL), in increasing
    step order, as a trainer writes them; a checkpoint still being written is waited for.

    Each line is 'step N: PATH (SIZE, TIME)'; --json prints one JSON object per line instead,
    with path, name (relative to DIR), step, time (epoch seconds), time_iso, size (bytes),
    latest and pinned (where the checkpoint is held while --exec runs, or null). A damaged
    checkpoint, or one deleted before it could be pinned, is reported on stderr and skipped.
    With --exec, the command's output goes to stderr when --json is given. Stops at --timeout or
    --until-step (exit 0); Ctrl-C exits 130.
    """
    from ..following.watch import watch

    def skipped(info: Any, err: BaseException) -> None:
        click.echo(f"Skipped: {escape_name(err)}", err=True)

    loop = watch(directory, after=after, backlog="latest" if latest else "all", until_step=until_step,
                 timeout=timeout, poll=poll, on_skip=skipped)
    unpinned_said = False
    last: Optional[int] = None
    with contextlib.closing(loop):
        for info in loop:
            last = info.step
            if as_json:
                echo_json({"path": info.path, "name": _shown(info.path, directory), "step": info.step,
                           "time": info.time, "time_iso": _iso(info.time), "size": info.size,
                           "latest": info.latest, "pinned": info.pinned}, expand=0)
            else:
                click.echo(escape_name(f"step {info.step}: {_shown(info.path, directory)} "
                                       f"({human_bytes(info.size)}, {_iso(info.time)})"))
            if command is None:
                continue
            readable = info.pinned if info.pinned and "://" not in info.pinned else info.path
            if readable == info.path and not unpinned_said and "://" not in info.path:
                unpinned_said = True
                click.echo(f"Warning: {quote_name(info.path)} could not be pinned with hard links here; "
                           f"${ENV_CHECKPOINT} names the trainer's own files, which its cleanup may delete "
                           "while the command runs.", err=True)
            env = dict(os.environ, **{ENV_CHECKPOINT: readable, ENV_CHECKPOINT_PATH: info.path,
                                      ENV_STEP: "" if info.step is None else str(info.step)})
            sys.stdout.flush()
            done = _run(command, env, as_json)
            if done.returncode != 0:
                click.echo(f"Warning: the command exited with {done.returncode} for step {info.step}.", err=True)
    reached = until_step is not None and last is not None and last >= until_step
    if timeout is not None and not reached and not as_json:
        click.echo(f"Stopped: no new checkpoint in {timeout:g} s.", err=True)


def _run(command: str, env: Any, as_json: bool) -> "subprocess.CompletedProcess[bytes]":
    """Run ``command``; with --json its output goes to stderr, so stdout stays JSON lines."""
    if not as_json:
        return subprocess.run(command, shell=True, env=env)
    try:
        return subprocess.run(command, shell=True, env=env, stdout=sys.stderr.fileno())
    except (AttributeError, ValueError, io.UnsupportedOperation):  # a stderr without a descriptor
        done = subprocess.run(command, shell=True, env=env, stdout=subprocess.PIPE)
        click.echo(done.stdout.decode("utf-8", "replace"), err=True, nl=False)
        return done
