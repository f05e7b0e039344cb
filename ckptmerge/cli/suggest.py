"""The ``suggest`` command: propose a map, by structure, for names that do not line up."""

from __future__ import annotations

from typing import Optional, Sequence

import click

from ..core.text import command_hint, escape_name, quote_name, quoted_command
from .common import EXIT_FINDINGS, JSON_OPTION, CliError, cli, echo_json
from .workflow import checkpoint_specs, model_target


@cli.command("suggest", short_help="Propose a map for names that differ (by structure).")
@click.argument("sources", nargs=-1, required=True, metavar="SOURCE...")
@click.option("--target", "target_path", metavar="PATH",
              help="A checkpoint whose model variables (names, shapes, dtypes) are the target (no TensorFlow).")
@click.option("--model", "model_spec", metavar="MODULE:FUNCTION",
              help="A function that builds the target model (imports TensorFlow); MODULE may be a path/to/file.py.")
@click.option("-o", "--output", "output", metavar="FILE", type=click.Path(dir_okay=False),
              help="Write the proposed map as a config file (YAML) that 'ckptmerge plan' uses as it is.")
@JSON_OPTION
def suggest_command(sources: Sequence[str], target_path: Optional[str], model_spec: Optional[str],
                    output: Optional[str], as_json: bool) -> None:
    """Propose a map from each SOURCE checkpoint to a target whose names differ wholesale.

    Targets that no name matches are aligned with the checkpoint variables nothing takes, from
    shapes and dtypes, scope trees, order and name tokens, solved as one global assignment; what
    the evidence cannot separate is listed as unresolved, never guessed. Prints the proposed
    entries with their evidence; -o FILE writes them as a config to review, edit and commit.
    Exit code 0 when the proposal leaves no target missing, 1 when some stay missing or
    unresolved, 2 on input errors. --json prints Suggestion.to_dict().
    """
    from ..api import suggest

    if (target_path is None) == (model_spec is None):
        raise CliError("pass exactly one of --target PATH (a checkpoint) or --model MODULE:FUNCTION.")
    target = (model_target(model_spec) if model_spec is not None
              else checkpoint_specs(target_path, None, "--target"))
    suggestion = suggest(target, list(sources))
    if output is not None:
        try:
            suggestion.write(output)
        except OSError as e:
            raise CliError(f"cannot write {quote_name(output)}: {e.strerror or e}. Pick another -o FILE.") from None
    if as_json:
        echo_json(suggestion.to_dict())
    else:
        from ..render.report import render_suggestion

        click.echo(render_suggestion(suggestion, next_step=False))
        if output is not None:
            click.echo(f"Wrote {escape_name(output)}: check it with {quoted_command('check', output)}, then "
                       f"'{command_hint('plan', output)} --target ...'.")
        elif suggestion.n_proposed:
            click.echo("Review the map, then write it as a config with 'ckptmerge suggest ... -o warm.yaml' "
                       "and run 'ckptmerge plan warm.yaml'.")
    if suggestion.missing or any(s.unresolved for s in suggestion.sources):
        raise SystemExit(EXIT_FINDINGS)
