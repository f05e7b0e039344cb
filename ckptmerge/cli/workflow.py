"""Workflow commands: ``demo``, ``check``, ``plan`` and ``merge`` (config driven)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
from typing import (
    Any,
    Callable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

import click

from ..core.errors import CkptMergeError, PlanError, did_you_mean
from ..core.redact import redact
from ..core.specs import VariableInfo
from ..core.text import escape_name, plural, quote_name
from .common import (
    ProgressBar,
    CONFIG_KEYS_HINT,
    EXIT_FINDINGS,
    JSON_OPTION,
    CliError,
    cli,
    echo_json,
    logger,
    stderr_is_tty,
)

# ============================================================================================
# demo
# ============================================================================================


@cli.command("demo", short_help="Run the built-in A/B/C demo (imports TensorFlow).")
@click.option("--dir", "workdir", type=click.Path(file_okay=False), default=None,
              help="Write the demo checkpoints here (default: a new temporary folder).")
def demo_command(workdir: Optional[str]) -> None:
    """Run the built-in A/B/C demo: write two checkpoints, plan, restore, check values.

    Imports TensorFlow. Prints each step's plan or report and then every check with
    PASS/FAIL; exit code 0 when all pass, 1 otherwise.
    """
    if workdir is not None:
        if os.path.isdir(workdir) and os.listdir(workdir):
            raise CliError(f"--dir {quote_name(workdir)} is not empty; the demo writes its checkpoints into a new or "
                           "empty folder. Pass another --dir, or leave it out for a temporary folder.")
        os.makedirs(workdir, exist_ok=True)
    _quiet_tensorflow()
    from ..demo import run_demo

    click.echo("Running the ckptmerge demo (imports TensorFlow: a few seconds) ...", err=True)
    with _tf_startup_silenced(_verbose()):
        import tensorflow as tf

        tf.constant(0)  # device set-up, with its own chatter
    result = run_demo(workdir)
    if result.kept:
        click.echo(f"Demo folder: {escape_name(result.workdir)}")
    else:
        click.echo(f"Demo folder: {escape_name(result.workdir)} (temporary, removed; pass --dir to keep it)")
    for title, text in result.steps:
        click.echo(f"\n== {title} ==\n{text}")
    click.echo("\n== Checks ==")
    for description, ok in result.checks:
        click.echo(f"{'PASS' if ok else 'FAIL'}  {description}")
    n_fail = sum(1 for _, ok in result.checks if not ok)
    if result.ok:
        click.echo(f"All {plural(len(result.checks), 'check')} passed.")
    else:
        click.echo(f"{n_fail} of {plural(len(result.checks), 'check')} FAILED.")
        raise SystemExit(EXIT_FINDINGS)


# ============================================================================================
# check, plan, merge: config-driven
# ============================================================================================


def _load_config(path: str, allow_env: Sequence[str] = ()) -> Any:
    from ..config.load import load_config

    return load_config(path, allow_env=list(allow_env))


ALLOW_ENV_OPTION = click.option(
    "--allow-env", "allow_env", multiple=True, metavar="NAME",
    help="Let the config expand the environment variable NAME into a URL (repeatable; also "
         "CKPTMERGE_ALLOW_ENV=NAME,...). Without it, a URL built from a variable is refused: its host "
         "would receive the value.")


@cli.command("check", short_help="Validate a config file; list the hosts it contacts.")
@click.argument("config", metavar="CONFIG")
@ALLOW_ENV_OPTION
@JSON_OPTION
def check_command(config: str, allow_env: Sequence[str], as_json: bool) -> None:
    """Validate the config file CONFIG (YAML, TOML or JSON) without opening any checkpoint.

    Prints 'OK: N sources' and every host and URL that plan and merge would contact, as written
    in the config (exit 0), or every problem, one per line as FILE:LINE KEYPATH: message
    (exit 2). --json prints {"ok", "sources", "hosts", "urls": [{"key", "url", "host"}]}.
    """
    cfg = _load_config(config, allow_env)
    if as_json:
        echo_json({"ok": True, "sources": len(cfg.sources), "hosts": [redact(h) for h in cfg.hosts],
                   "urls": [{"key": u.key, "url": redact(u.written), "host": redact(u.host)} for u in cfg.urls]})
        return
    click.echo(f"OK: {plural(len(cfg.sources), 'source')}")
    if not cfg.urls:
        click.echo("Contacts no remote host: every path is local.")
        return
    click.echo(f"Contacts {plural(len(cfg.hosts), 'host')}: {', '.join(map(escape_name, cfg.hosts))}")
    for u in cfg.urls:
        click.echo(f"  {escape_name(u.key)}: {escape_name(u.written)}")


def _import_function(spec: str) -> Callable[[], Any]:
    """``module:function`` or ``path/to/file.py:function`` -> the function."""
    mod_name, sep, func_name = spec.rpartition(":")
    if not sep or not mod_name or not func_name:
        raise CliError(f"--model expects MODULE:FUNCTION or path/to/file.py:FUNCTION, e.g. "
                       f"--model mymodels:build_model. Received: {quote_name(spec)}")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name or "/" in mod_name:
            if not os.path.isfile(mod_name):
                raise CliError(f"--model {quote_name(spec)}: file {quote_name(mod_name)} does not exist.")
            name = "_ckptmerge_model_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(mod_name))[0])
            loader_spec = importlib.util.spec_from_file_location(name, mod_name)
            if loader_spec is None or loader_spec.loader is None:
                raise CliError(f"--model {quote_name(spec)}: cannot load {quote_name(mod_name)} as a Python module.")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` would: modules next to the user
            module = importlib.import_module(mod_name)
    except CliError:
        raise
    except ImportError as e:
        raise CliError(f"--model {quote_name(spec)}: cannot import module {quote_name(mod_name)}: "
                       f"{escape_name(str(e))}. Pass a module on the Python path (run from its folder) or a file path, "
                       "e.g. models.py:build.") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while loading: say so in one line
        logger.info("importing %s failed:", mod_name, exc_info=True)
        raise CliError(f"--model {quote_name(spec)}: importing {quote_name(mod_name)} raised "
                       f"{type(e).__name__}: {escape_name(str(e))} (ckptmerge -v plan/merge ... shows the "
                       "traceback)") from None
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        public = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
        raise CliError(f"--model {quote_name(spec)}: module {quote_name(mod_name)} has no function "
                       f"{quote_name(func_name)}."
                       f"{did_you_mean(func_name, public)}")
    return func


def _quiet_tensorflow() -> None:
    """TF's C++ start-up chatter is noise on a command line (the user's setting wins)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def _tf_startup_silenced(verbose: bool) -> Iterator[None]:
    """Silence file descriptor 2 while TensorFlow starts (imports, first device set-up).

    Recent TF writes "oneDNN ...", "Could not find cuda drivers ..." and the like from C++ before
    its logging is configured, ignoring TF_CPP_MIN_LOG_LEVEL. Python errors still surface (they
    are raised, and printed once stderr is back); ``-v`` keeps everything.
    """
    if verbose:
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):  # pragma: no cover - no real fd 2 (embedded interpreters)
        yield
        return
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _verbose() -> bool:
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return bool(root is not None and root.params.get("verbose"))


def model_target(spec: str) -> Any:
    """Import and call the --model function; returns what it built (imports TensorFlow)."""
    _quiet_tensorflow()
    with _tf_startup_silenced(_verbose()):
        import tensorflow as tf

        tf.constant(0)
    func = _import_function(spec)
    try:
        target = func()
    except CkptMergeError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's function failed: say so in one line
        logger.info("%s() failed:", getattr(func, "__name__", spec), exc_info=True)
        raise CliError(f"--model {quote_name(spec)}: {getattr(func, '__name__', 'the function')}() raised "
                       f"{type(e).__name__}: {escape_name(str(e))} (ckptmerge -v plan/merge ... shows the "
                       "traceback)") from None
    import tensorflow as tf

    from ..restoring.targets import is_keras_object

    ok = (is_keras_object(target) or isinstance(target, tf.Module)
          or (isinstance(target, (list, tuple, dict)) and bool(target)))
    if not ok:
        kind = type(target).__name__
        got = "None" if target is None else f"{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind}"
        raise CliError(f"--model {quote_name(spec)}: {getattr(func, '__name__', 'the function')}() returned {got}; "
                       "it must return a Keras model, a tf.Module, or a non-empty list/dict of variables.")
    return target


def checkpoint_specs(path: str, step: Optional[int], what: str) -> List[VariableInfo]:
    from ..api import list_variables

    specs = list_variables(path, step=step, optimizer=False)
    if not specs:
        raise CliError(f"{what} checkpoint {quote_name(path)} holds no model variables (only optimizer state "
                       "or bookkeeping), so it cannot serve as a target.")
    return specs


def _close_plan(plan: Any) -> None:
    binding = getattr(plan, "_binding", None)
    if binding is not None and hasattr(binding, "close"):
        binding.close()


def _blocking(plan: Any, strict: bool) -> List[str]:
    return list(plan.blocking(strict=strict))


@cli.command("plan", short_help="Dry run: what a config would restore, and every finding.")
@click.argument("config", metavar="CONFIG")
@click.option("--target", "target_path", metavar="PATH",
              help="A checkpoint whose model variables (names, shapes, dtypes) are the target.")
@click.option("--target-step", type=click.IntRange(min=0), default=None, metavar="N",
              help="With a --target directory: its checkpoint of step N.")
@click.option("--model", "model_spec", metavar="MODULE:FUNCTION",
              help="A function that builds the target model (imports TensorFlow); MODULE may be "
                   "a path/to/file.py.")
@click.option("--all", "show_all", is_flag=True, help="Show every line of each section (no '... and N more').")
@click.option("--skip-mismatch", is_flag=True,
              help="Leave targets whose shape differs as they are (a new head), listing each under "
                   "Skipped: the config's on_shape_mismatch: skip, as Keras's skip_mismatch=True.")
@ALLOW_ENV_OPTION
@JSON_OPTION
def plan_command(config: str, target_path: Optional[str], target_step: Optional[int], model_spec: Optional[str],
                 show_all: bool, skip_mismatch: bool, allow_env: Sequence[str], as_json: bool) -> None:
    """Dry run: show what the config CONFIG would restore into a target, and every finding.

    The target is --target PATH (a checkpoint), --model MODULE:FUNCTION, or the config's
    'target' key. Nothing is restored or written. Exit code 0 when nothing blocks the restore
    (strict unless the config says strict: false), 1 when findings remain, 2 on config or
    input errors. --json prints plan.to_dict() (keys: ok, blocking, options, targets,
    sources, assignments, missing, mismatched, conflicts, unmatched_rules, unused, ...).
    """
    from ..api import plan as make_plan

    if target_path is not None and model_spec is not None:
        raise CliError("pass either --target PATH or --model MODULE:FUNCTION, not both.")
    if target_step is not None and target_path is None:
        raise CliError("--target-step needs --target PATH.")
    cfg = _load_config(config, allow_env)
    sources = cfg.make_sources()
    if model_spec is not None:
        target = model_target(model_spec)
    elif target_path is not None:
        target = checkpoint_specs(target_path, target_step, "--target")
    elif cfg.target is not None:
        target = checkpoint_specs(cfg.target, None, "The config's 'target'")
    else:
        raise CliError(f"no target to plan against: pass --target PATH (a checkpoint) or --model "
                       f"MODULE:FUNCTION, or set 'target: PATH' in {quote_name(config)}.")
    plan = make_plan(target, sources, **_options(cfg, skip_mismatch))
    try:
        blocking = _blocking(plan, cfg.strict)
        if as_json:
            echo_json(plan.to_dict(lazy=True))  # (written a piece at a time)
        else:
            click.echo(plan.report(limit=None if show_all else 50))
            if not cfg.strict:
                click.echo("strict: false in the config: "
                           + ("nothing blocks the restore." if not blocking
                              else f"{plural(len(blocking), 'finding')} still block it."))
    finally:
        _close_plan(plan)
    if blocking:
        if not as_json:
            click.echo(CONFIG_KEYS_HINT, err=True)
        raise SystemExit(EXIT_FINDINGS)


def _options(cfg: Any, skip_mismatch: bool) -> Dict[str, Any]:
    """The config's plan options, with ``--skip-mismatch`` applied."""
    options = dict(cfg.plan_options)
    if options.pop("skip_mismatch", False) or skip_mismatch:
        options["on_shape_mismatch"] = "skip"
    return options


def _as_list(globs: Any) -> List[str]:
    return [globs] if isinstance(globs, str) else list(globs)


@cli.command("merge", short_help="Write a new checkpoint assembled from several.")
@click.argument("config", metavar="CONFIG")
@click.option("-o", "--output", "out_prefix", metavar="OUT_PREFIX",
              help="Prefix of the checkpoint to write (OUT_PREFIX.index + .data-*); default: the "
                   "config's 'output' key.")
@click.option("--template", "template_path", metavar="PATH",
              help="A checkpoint whose model variables the output holds, exactly (names, shapes, "
                   "dtypes); its own values fill what no source provides.")
@click.option("--model", "model_spec", metavar="MODULE:FUNCTION",
              help="A function that builds a model whose variables the output holds (imports "
                   "TensorFlow); MODULE may be a path/to/file.py.")
@click.option("--force", is_flag=True, help="Overwrite an existing checkpoint at OUT_PREFIX.")
@click.option("--dry-run", is_flag=True, help="Plan and report what would be written; write nothing.")
@click.option("--update-state", is_flag=True,
              help="Also write/update the 'checkpoint' state file of OUT_PREFIX's directory.")
@click.option("--durable", is_flag=True,
              help="fsync every file before it is moved into place (survives a power loss; slower).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar; print only the summary line.")
@click.option("--format", "out_format", type=click.Choice(["tf", "safetensors", "orbax"]), default=None,
              help="Output format (default: safetensors when OUT_PREFIX ends with .safetensors, else a TF "
                   "checkpoint); orbax writes an Orbax checkpoint folder that JAX's Orbax restores.")
@click.option("--layout", "layout", type=click.Choice(["torch"]), default=None,
              help="torch: write the Keras/TF weights under the --template's PyTorch names, shapes and "
                   "layouts (a .safetensors file, or a save_pretrained folder), paired by structural "
                   "alignment; -o must end with .safetensors.")
@click.option("--allow-missing", "allow_missing", metavar="GLOB", multiple=True,
              help="Template names no source needs to provide (repeatable; added to the config's "
                   "allow_missing). With --layout torch: template tensors alignment leaves unresolved "
                   "that may be written from the template's own values.")
@click.option("--record-paths/--no-record-paths", "record_paths", default=None,
              help="Whether a .safetensors output's metadata records where each source was read from "
                   "(default: the config's 'record_paths', else yes; URL credentials are always redacted).")
@click.option("--skip-mismatch", is_flag=True,
              help="Leave targets whose shape differs as they are (a new head), listing each under "
                   "Skipped: the config's on_shape_mismatch: skip, as Keras's skip_mismatch=True.")
@ALLOW_ENV_OPTION
@JSON_OPTION
def merge_command(config: str, out_prefix: Optional[str], template_path: Optional[str], model_spec: Optional[str],
                  force: bool, dry_run: bool, update_state: bool, durable: bool, quiet: bool,
                  out_format: Optional[str], layout: Optional[str], allow_missing: Tuple[str, ...],
                  record_paths: Optional[bool], skip_mismatch: bool, allow_env: Sequence[str],
                  as_json: bool) -> None:
    """Write a new checkpoint assembled from the sources of CONFIG, without model code.

    Without a template the output holds every name the sources give after their rules; with
    --template PATH or --model MODULE:FUNCTION exactly the template's names and shapes (the
    plan's findings apply). The output is a standard TF checkpoint, one .safetensors file
    (-o out/model.safetensors, or --format safetensors) or an Orbax checkpoint folder
    (--format orbax: names split on '/' into the tree), written atomically; an existing one is
    kept unless --force. A progress bar shows on a terminal unless --quiet. With --layout torch
    and --template FILE the output is a PyTorch state_dict (.safetensors) under FILE's names.
    Exit code 0 on success, 1 when findings block the merge (nothing is written), 2 on config
    or input errors. --json prints the report (report.to_dict(): summary, restored, skipped,
    output, dry_run, bytes_written, plan, ...).
    """
    if template_path is not None and model_spec is not None:
        raise CliError("pass either --template PATH or --model MODULE:FUNCTION, not both.")
    from ..merging.dispatch import merge

    cfg = _load_config(config, allow_env)
    out = out_prefix if out_prefix is not None else cfg.output
    if out is None:
        raise CliError(f"no output: pass -o OUT_PREFIX, or set 'output: PREFIX' in {quote_name(config)}.")
    sources = cfg.make_sources()
    template: Any = template_path
    if model_spec is not None:  # the model itself: the names of Keras weights files depend on it
        template = model_target(model_spec)
    progress = ProgressBar("Merging") if (not quiet and not as_json and stderr_is_tty()) else None
    options = _options(cfg, skip_mismatch)
    try:
        allowed = [*_as_list(options.get("allow_missing", ())), *allow_missing]
        report = merge(sources, out, template=template, allow_missing=allowed,
                       on_conflict=options.get("on_conflict", "error"),
                       on_shape_mismatch=options.get("on_shape_mismatch", "error"),
                       cast=options.get("cast", False), strict=cfg.strict, overwrite=force, dry_run=dry_run,
                       update_state=update_state, progress=progress, verify=options.get("verify", True),
                       durable=durable, format=out_format, layout=layout,
                       record_paths=cfg.record_paths if record_paths is None else record_paths)
    except PlanError as e:
        if dry_run and e.plan is not None:  # a dry run is for reading the findings: show them all
            if as_json:
                echo_json(e.plan.to_dict(lazy=True))
            else:
                click.echo(e.plan.report())
        raise
    finally:
        if progress is not None:
            progress.close()
    if as_json:
        echo_json(report.to_dict(lazy=True))
    elif quiet:
        click.echo(report.summary())
    else:
        if dry_run:
            click.echo(report.plan.report())
        click.echo(report.render())


