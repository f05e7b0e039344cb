"""Config files for warm starts: every source, rule, transform and policy in one reviewed file.

:func:`load_config` reads a YAML, TOML or JSON file (or an already-parsed dict) with the schema
documented in ``docs/config.md`` and returns a :class:`Config`. Validation happens before
any checkpoint is opened: unknown keys (with "did you mean"), wrong types, bad enum values,
regexes that do not compile or use constructs RE2 does not run, backreferences to missing
groups, unset environment variables, missing paths, duplicate source names and syntax errors are
all collected and raised as one :class:`ckptmerge.ConfigError`, each problem on its own line as
``FILE:LINE KEYPATH: message``. Files are untrusted: only regular files up to
:data:`MAX_CONFIG_BYTES` are read, nesting is limited to :data:`MAX_NESTING` levels, and YAML
aliases may not expand a file beyond a size proportional to it.

A :class:`Config` maps one to one onto the Python API: :meth:`Config.source_kwargs` gives the
keyword arguments of each ``ckptmerge.Source`` and :attr:`Config.plan_options` those of
``ckptmerge.planning.planner``. Nothing here reads checkpoints or imports TensorFlow; vocabulary files are
read (they are small and part of the config's meaning).

The work is split by idea, each module importing only those below it: ``problems``
(key paths, line locators and the wording of problems), ``env`` (``$VAR`` expansion
and path resolution), ``model`` (:class:`Config`, :class:`SourceConfig`),
``files`` (reading and parsing files within the safety limits) and ``schema``
(validation). This module is the front door; :mod:`ckptmerge.config` re-exports its public names.
"""

from __future__ import annotations

import os
from typing import Any, Iterable, List, Mapping, Optional, Tuple, Union

from ..core.errors import ConfigError
from ..core.redact import get_logger
from .env import allowed_variables
from .fields import SLICE_KEYS, SOURCE_KEYS, TOP_LEVEL_KEYS, VOCAB_KEYS, Context
from .files import MAX_CONFIG_BYTES, MAX_NESTING, parse_config_file
from .model import Config, RemoteURL, SourceConfig
from .problems import KeyPath, Locator, Problems, fail, no_lines, show
from .schema import build, report_duplicates

__all__ = [
    "Config",
    "SourceConfig",
    "RemoteURL",
    "load_config",
    "TOP_LEVEL_KEYS",
    "SOURCE_KEYS",
    "VOCAB_KEYS",
    "SLICE_KEYS",
    "MAX_CONFIG_BYTES",
    "MAX_NESTING",
]

logger = get_logger(__name__)


def load_config(path_or_dict: Union[str, "os.PathLike[str]", Mapping[str, Any], Config], *,
                base_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
                env: Optional[Mapping[str, str]] = None,
                allow_env: Union[None, str, Iterable[str]] = None) -> Config:
    """Read and validate a warm-start config (YAML, TOML, JSON file, or a dict).

    Everything is checked before any checkpoint is opened, and every problem is reported at
    once. Environment variables (``$VAR``, ``${VAR}``; ``$$`` for a literal ``$``) are expanded
    in checkpoint paths, vocabulary file paths, ``target`` and ``output``; relative paths are
    resolved from the config file's folder (for a dict: ``base_dir``, else the current
    directory; ``base_dir`` also overrides the file's folder when given). A path that is a URL
    (or becomes one) may use only the variables ``allow_env`` names: its host would receive
    their values, and a config may come from anyone. Messages show paths as written.

    Args:
        path_or_dict: a ``.yaml``/``.yml``, ``.toml`` or ``.json`` file, a parsed dict, or a
            :class:`Config` (returned as it is).
        base_dir: the folder relative paths are resolved from.
        env: the environment for variable expansion (default ``os.environ``).
        allow_env: the variables that may be expanded into a URL (a name or a list of names),
            besides those the environment's ``CKPTMERGE_ALLOW_ENV`` lists (comma-separated).

    Returns:
        The validated :class:`Config`.

    Raises:
        ConfigError: listing every problem as ``FILE:LINE KEYPATH: message`` in ``e.problems``.
        ArgumentError: ``allow_env`` holds something that is not a variable name.
        SettingError: ``CKPTMERGE_ALLOW_ENV`` does.

    Example:
        >>> cfg = load_config({"sources": [{"path": "${HOME}", "name": "home"}]},
        ...                   env={"HOME": "/"})
        >>> cfg.sources[0].path, cfg.sources[0].name
        ('/', 'home')
    """
    if isinstance(path_or_dict, Config):
        return path_or_dict
    env = os.environ if env is None else env
    allowed = allowed_variables(allow_env, env)
    if isinstance(path_or_dict, Mapping):
        file: Optional[str] = None
        label: Optional[str] = None
        data: Any = path_or_dict
        locate: Locator = no_lines
        dups: List[Tuple[KeyPath, str, int, int]] = []
        base = os.path.abspath(os.fspath(base_dir)) if base_dir is not None else os.getcwd()
        base_label = "base_dir" if base_dir is not None else "the current directory"
    elif isinstance(path_or_dict, (str, os.PathLike)):
        file = os.fspath(path_or_dict)
        label = os.path.basename(file) or file
        data, locate, dups = parse_config_file(file, label)
        if base_dir is not None:
            base = os.path.abspath(os.fspath(base_dir))
            base_label = "base_dir"
        else:
            base = os.path.dirname(os.path.abspath(file))
            base_label = "the config file's folder"
    else:
        raise ConfigError("load_config expects a path to a .yaml, .yml, .toml or .json file, or a dict; "
                          f"received {show(path_or_dict)}.")
    ctx = Context(Problems(label, locate), base, base_label, env, allowed)
    report_duplicates(dups, ctx)
    cfg = build(data, file, ctx)
    ctx.problems.raise_if_any(file)
    if cfg is None:  # pragma: no cover - build returns None only after reporting a problem
        raise fail(file, "the config could not be read")
    logger.debug("loaded config %s: %d source(s)", file or "<dict>", len(cfg.sources))
    return cfg
