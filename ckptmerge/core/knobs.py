"""Settings read from the environment (``CKPTMERGE_*``), checked when they are used.

The environment is untrusted input like any other. A setting is read, parsed and range-checked
at the moment the code that needs it runs, never at import: a malformed
``CKPTMERGE_REMOTE_RETRIES`` cannot break ``import ckptmerge`` or a command that reads only local
files, and the command that does use it stops with a :class:`~ckptmerge.core.errors.SettingError`
naming the variable, the value it holds and what is accepted, instead of a traceback or a value
silently clamped. Each setting is one small frozen object (:class:`IntSetting`,
:class:`FloatSetting`, :class:`FlagSetting`) whose :meth:`get` does that.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .errors import SettingError
from .text import quote_name

__all__ = ["IntSetting", "FloatSetting", "FlagSetting"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _raw(name: str, env: Optional[Mapping[str, str]]) -> Optional[str]:
    value = (os.environ if env is None else env).get(name)
    return None if value is None or not value.strip() else value.strip()


def _bad(name: str, raw: str, expected: str, default: object) -> SettingError:
    return SettingError(f"The environment variable {name}={quote_name(raw[:80])} is not valid: expected {expected}. "
                        f"Set it to such a value, or unset it for the default ({default}).", name=name, value=raw)


def _show(bound: Any) -> str:
    return f"{bound:,}" if isinstance(bound, int) else f"{bound:g}"


class _Setting:
    """What every setting does: read the variable now, its default when unset or blank."""

    name: str
    default: Any

    def get(self, env: Optional[Mapping[str, str]] = None) -> Any:
        """The value now (``env``: the environment to read, default ``os.environ``).

        Raises:
            SettingError: the value is malformed or out of range (the message says what is accepted).
        """
        raw = _raw(self.name, env)
        return self.default if raw is None else self.parse(raw)

    def parse(self, raw: str) -> Any:  # pragma: no cover - each kind has its own
        raise NotImplementedError


@dataclass(frozen=True)
class _RangeSetting(_Setting):
    """A number within ``[minimum, maximum]``; each kind converts the text its own way."""

    name: str
    default: Any
    minimum: Any
    maximum: Any
    meaning: str

    def parse(self, raw: str) -> Any:
        """``raw`` as the setting's value, or a :class:`SettingError`."""
        value = self.convert(raw)
        if value is None or not self.minimum <= value <= self.maximum:
            raise _bad(self.name, raw, f"{self.meaning}, {self.kind} from {_show(self.minimum)} to {_show(self.maximum)}",
                       self.default)
        return value

    kind = "a number"

    def convert(self, raw: str) -> Any:  # pragma: no cover - each kind has its own
        raise NotImplementedError


@dataclass(frozen=True)
class IntSetting(_RangeSetting):
    """An integer setting within ``[minimum, maximum]`` (an empty or unset variable: ``default``).

    Example:
        >>> IntSetting("CKPTMERGE_X", 4, 1, 100, "attempts").get({"CKPTMERGE_X": "7"})
        7
        >>> IntSetting("CKPTMERGE_X", 4, 1, 100, "attempts").get({"CKPTMERGE_X": "0"})
        Traceback (most recent call last):
        ckptmerge.core.errors.SettingError: The environment variable CKPTMERGE_X='0' is not valid: expected attempts, an integer from 1 to 100. Set it to such a value, or unset it for the default (4).
    """

    kind = "an integer"

    def convert(self, raw: str) -> Optional[int]:
        """Decimal digits as an int; anything else ``None``."""
        try:
            return int(raw, 10)
        except ValueError:
            return None


@dataclass(frozen=True)
class FloatSetting(_RangeSetting):
    """A number of seconds (or another real quantity) within ``[minimum, maximum]``; ``nan`` and
    ``inf`` are refused.

    Example:
        >>> FloatSetting("CKPTMERGE_T", 60.0, 0.001, 86400.0, "seconds").get({"CKPTMERGE_T": "2.5"})
        2.5
    """

    def convert(self, raw: str) -> Optional[float]:
        """A finite number as a float; anything else (``nan``, ``inf``, words) ``None``."""
        try:
            value = float(raw)
        except ValueError:
            return None
        return value if math.isfinite(value) else None


@dataclass(frozen=True)
class FlagSetting(_Setting):
    """An on/off setting: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``, any case.

    Example:
        >>> FlagSetting("CKPTMERGE_F", True, "whether to lock").get({"CKPTMERGE_F": "off"})
        False
    """

    name: str
    default: bool
    meaning: str

    def parse(self, raw: str) -> bool:
        """``raw`` as the setting's value, or a :class:`SettingError`."""
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise _bad(self.name, raw, f"{self.meaning}: 1 or 0 (also true/false, yes/no, on/off)",
                   "1" if self.default else "0")
