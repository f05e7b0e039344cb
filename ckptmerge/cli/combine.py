"""``ckptmerge combine`` and ``ckptmerge average``: checkpoint arithmetic from the command line.

Both call :func:`ckptmerge.combine` and :func:`ckptmerge.merge` and render their reports;
``average RUN_DIR --last 5 -o avg`` is ``combine RUN_DIR --method mean --last 5 -o avg``.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

import click

from ..combining.combine import ACCUMULATE, INTEGERS, KEYS
from ..combining.methods import CONVENTIONS, METHODS
from .common import JSON_OPTION, CliError, ProgressBar, cli, echo_json, stderr_is_tty

__all__ = ["parse_params", "parse_steps"]


def _value(text: str) -> Any:
    """A parameter value as typed: a number (``nan`` and ``inf`` too, which the check then
    refuses by name), true/false, a JSON list (a gradient: ``[0, 0.5, 1]``), or the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low.lstrip("+-") in ("nan", "inf", "infinity"):
        return float(low)
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_params(items: Sequence[str], what: str = "--param") -> Dict[str, Any]:
    """``KEY=VALUE`` and ``KEY[GLOB]=VALUE`` options as ``combine`` keywords (a glob's values
    in the order given, a plain value last as ``'*'``).

    Example:
        >>> parse_params(["density[*attn*]=0.3", "density=0.5", "seed=3"])
        {'density': {'*attn*': 0.3, '*': 0.5}, 'seed': 3}
    """
    per_glob: Dict[str, Dict[str, Any]] = {}
    plain: Dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"{what} takes KEY=VALUE or KEY[GLOB]=VALUE (e.g. density=0.5, 'density[*attn*]=0.3'); "
                           f"received {item!r}.")
        glob = None
        if key.endswith("]") and "[" in key:
            key, _, glob = key[:-1].partition("[")
            if not glob:
                raise CliError(f"{what} {item!r}: the glob between [ and ] is empty.")
        if glob is None:
            plain[key] = _value(value)
        else:
            per_glob.setdefault(key, {})[glob] = _value(value)
    out: Dict[str, Any] = {}
    for key in list(per_glob) + [k for k in plain if k not in per_glob]:
        if key in per_glob:
            out[key] = {**per_glob[key], **({"*": plain[key]} if key in plain else {})}
        else:
            out[key] = plain[key]
    return out


def parse_steps(text: Optional[str]) -> Any:
    """``--steps``: ``LOW:HIGH`` (inclusive, either may be empty) or ``A,B,C``.

    Example:
        >>> parse_steps("1000:5000"), parse_steps("100,300"), parse_steps(":200")
        ((1000, 5000), [100, 300], (None, 200))
    """
    if text is None:
        return None
    try:
        if ":" in text:
            lo, _, hi = text.partition(":")
            return (int(lo) if lo.strip() else None, int(hi) if hi.strip() else None)
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise CliError(f"--steps takes LOW:HIGH (inclusive, e.g. 1000:5000) or a list A,B,C; received {text!r}.") from None


def _inputs(inputs: Tuple[str, ...], selecting: bool) -> Any:
    if len(inputs) == 1 and (selecting or _is_dir(inputs[0])):
        return inputs[0]  # a training directory
    if selecting:
        raise CliError("--last, --steps and --every select checkpoints of one training directory: pass exactly one "
                       f"directory, not {len(inputs)} inputs.")
    return list(inputs)


def _is_dir(path: str) -> bool:
    import os

    from ..formats.io.storage import is_url

    return is_url(path) or os.path.isdir(path)


def _weights(text: Optional[str], n_hint: int) -> Optional[List[float]]:
    if text is None:
        return None
    try:
        return [float(w) for w in text.split(",")]
    except ValueError:
        raise CliError(f"--weights takes one number per input, comma-separated (e.g. 0.5,0.3,0.2); received {text!r}.") \
            from None


def _run(inputs: Tuple[str, ...], method: str, base: Optional[str], last: Optional[int], steps: Optional[str],
         every: Optional[int], weights: Optional[str], params: Tuple[str, ...], dtype: Optional[str], keys: str,
         integers: str, optimizer: bool, accumulate: str, include: Tuple[str, ...], exclude: Tuple[str, ...],
         out: Optional[str], force: bool, dry_run: bool, durable: bool, quiet: bool, out_format: Optional[str],
         as_json: bool, mergekit: Optional[str] = None, conventions: Optional[str] = None,
         model_spec: Optional[str] = None) -> None:
    from ..combining.combine import combine
    from ..merging.dispatch import merge

    if out is None and not dry_run:
        raise CliError("no output: pass -o OUT (a TF prefix, a .safetensors or a .weights.h5 file), or --dry-run.")
    if mergekit is not None:
        from ..config.mergekit import from_mergekit

        given = [flag for flag, v in (("INPUT", inputs), ("--method", method != "mean"), ("--base", base),
                                      ("--last", last is not None), ("--steps", steps), ("--every", every),
                                      ("--weights", weights), ("--dtype", dtype),
                                      ("--optimizer", optimizer), ("--include", include), ("--exclude", exclude)) if v]
        if given:
            raise CliError(f"--mergekit reads the models, method and parameters from {mergekit!r}: drop "
                           f"{', '.join(given)} (edit the config instead).")
        extra = parse_params(params)
        if set(extra) - {"seed"}:
            raise CliError(f"--mergekit takes only --param seed=N (DARE's draws); the other parameters come from "
                           f"{mergekit!r}: drop --param {', '.join(sorted(set(extra) - {'seed'}))} (edit the config "
                           "instead).")
        src = from_mergekit(mergekit, conventions=conventions or "mergekit", keys=keys, integers=integers,
                            accumulate=accumulate, **extra)
    else:
        if not inputs:
            raise CliError("no inputs: give the checkpoints to combine (INPUT...), one training directory, or "
                           "--mergekit CONFIG.yml.")
        selecting = last is not None or steps is not None or every is not None
        src = combine(_inputs(inputs, selecting), method, base=base, weights=_weights(weights, len(inputs)),
                      dtype=dtype, keys=keys, integers=integers, optimizer=optimizer, accumulate=accumulate,
                      last=last, steps=parse_steps(steps), every=every, include=list(include) or None,
                      exclude=list(exclude) or None, conventions=conventions or "ckptmerge", **parse_params(params))
    if out is None:  # a dry run without an output: the combination alone
        report = src.report()
        if as_json:
            echo_json({"combine": report.to_dict()})
        else:
            click.echo(report.summary() if quiet else report.render())
        return
    template = None
    if model_spec is not None:  # the model the output is for (imports TensorFlow)
        from .workflow import model_target

        template = model_target(model_spec)
    progress = ProgressBar("Combining") if (not quiet and not as_json and stderr_is_tty()) else None
    try:
        merged = merge([src], out, template=template, overwrite=force, dry_run=dry_run, durable=durable,
                       format=out_format, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    combined = src.report() if dry_run else None
    if as_json:
        echo_json({"combine": (combined or src.report()).to_dict(), "merge": merged.to_dict(lazy=True)})
    elif quiet:
        click.echo(merged.summary())
    else:
        if combined is None:  # what keys='union'/'intersection' did is shown, name by name, after a merge too
            report = src.report()
            combined = report if (report.fewer or report.left_out) else None
            if combined is None:  # at least what was combined (the steps of a run, by number)
                click.echo(report.summary())
        if combined is not None:
            click.echo(combined.render())
        click.echo(merged.render())


_SHARED = [
    click.option("--base", metavar="PATH", help="The base checkpoint (task_arithmetic, ties, dare, model_stock; "
                                                  "for slerp, the start)."),
    click.option("--last", type=click.IntRange(min=1), default=None, metavar="N",
                 help="With a training directory: its last N checkpoints."),
    click.option("--steps", metavar="LOW:HIGH|A,B,C", help="With a training directory: these steps (inclusive range "
                                                             "or list)."),
    click.option("--every", type=click.IntRange(min=1), default=None, metavar="K",
                 help="With a training directory: the steps divisible by K."),
    click.option("--weights", metavar="W1,W2,...", help="One weight per input (mean, task_arithmetic, ties, dare)."),
    click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
                 help="A method parameter (density=0.5, t=0.3, decay=0.99, seed=1, scale=1.0, normalize=false, "
                      "filter_wise=true), or a gradient over the layers ('t=[0,0.5,1]'); "
                      "'KEY[GLOB]=VALUE' for the tensors a glob matches (first match wins). Repeatable."),
    click.option("--dtype", type=click.Choice(["float16", "bfloat16", "float32", "float64"]), default=None,
                 help="Output dtype of float tensors (default: the inputs')."),
    click.option("--keys", type=click.Choice(list(KEYS)), default="strict", show_default=True,
                 help="Inputs whose names differ: an error listing every difference, only the shared names, or "
                      "each name over the inputs holding it (both write, listing every name they touched)."),
    click.option("--integers", type=click.Choice(list(INTEGERS)), default="last", show_default=True,
                 help="Integer/bool tensors (counters): the last or first input's value, or an error."),
    click.option("--optimizer", is_flag=True, help="Also combine optimizer slots and bookkeeping (left out by default)."),
    click.option("--accumulate", type=click.Choice(list(ACCUMULATE)), default="float64", show_default=True,
                 help="Accumulation dtype (float32 applies to float16/bfloat16 tensors)."),
    click.option("--include", multiple=True, metavar="GLOB", help="Keep only the combined names matching (repeatable)."),
    click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out the combined names matching (repeatable)."),
    click.option("-o", "--output", "out", metavar="OUT",
                 help="The output: a TF checkpoint prefix, a .safetensors or a .weights.h5 file."),
    click.option("--model", "model_spec", metavar="MODULE:FUNCTION",
                 help="A function that builds the model the output is for (imports TensorFlow): the output holds "
                      "exactly its variables, and a .weights.h5 output is laid out as its load_weights reads it."),
    click.option("--force", is_flag=True, help="Overwrite an existing output."),
    click.option("--dry-run", is_flag=True, help="Resolve the inputs and report what would be written; write nothing."),
    click.option("--durable", is_flag=True, help="fsync the output before it is moved into place."),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar; print only the summary line."),
    click.option("--format", "out_format", type=click.Choice(["tf", "safetensors", "keras-h5", "orbax"]), default=None,
                 help="Output format (default: by OUT's suffix: .safetensors, .weights.h5, else a TF checkpoint); "
                      "orbax writes an Orbax checkpoint folder that Orbax restores."),
    JSON_OPTION,
]


def _shared(f: Any) -> Any:
    for option in reversed(_SHARED):
        f = option(f)
    return f


@cli.command("combine", short_help="Average, EMA or merge many checkpoints into one (streamed).")
@click.argument("inputs", nargs=-1, required=False, metavar="INPUT...")
@click.option("--method", "-m", type=click.Choice(list(METHODS)), default="mean", show_default=True,
              help="How to combine.")
@click.option("--mergekit", metavar="CONFIG.yml", default=None,
              help="Read a mergekit config as written (models, method, parameters; mergekit's conventions).")
@click.option("--conventions", type=click.Choice(list(CONVENTIONS)), default=None,
              help="Defaults and meanings of the parameters: ckptmerge's (default) or mergekit's (default with "
                   "--mergekit); docs/merging.md lists every difference.")
@_shared
def combine_command(inputs: Tuple[str, ...], method: str, **options: Any) -> None:
    """Combine checkpoints: INPUT... are checkpoints (paths or URLs, any format ckptmerge reads),
    or one training directory with --last, --steps or --every; or --mergekit CONFIG.yml, a
    mergekit config read as written (its models' paths relative to the config file).

    Methods: mean (uniform or --weights), ema (by step, --param decay=0.999), task_arithmetic,
    ties (--param density=0.5), dare (--param density=0.5 --param seed=0), slerp (two inputs,
    --param t=0.5), model_stock (a --base and two or more fine-tunes). Tensors are streamed
    chunk by chunk; the output is written atomically. Exit code 0 on success, 2 on input errors
    (inputs that do not line up are listed at once). --json prints {"combine": ..., "merge": ...}.
    """
    _run(inputs, method, **options)


@cli.command("average", short_help="Average checkpoints, e.g. the last 5 of a run.")
@click.argument("inputs", nargs=-1, required=True, metavar="RUN_DIR|INPUT...")
@_shared
def average_command(inputs: Tuple[str, ...], **options: Any) -> None:
    """Average checkpoints: ``ckptmerge average RUN_DIR --last 5 -o avg`` is
    ``ckptmerge combine RUN_DIR --method mean --last 5 -o avg``."""
    _run(inputs, "mean", **options)
