"""The one exception family traceq raises. Messages name the input and the fix.

An error about one argument carries its name (``param``) and ``value``: the library shows them as
``by='colour': ...``, the CLI as ``--by colour: ...``, so that neither face names the other's spelling.
"""

from __future__ import annotations

import shlex


class TraceqError(Exception):
    """Base class: every error traceq raises on purpose derives from it."""


class TraceFormatError(TraceqError):
    """A file is not a readable Kineto trace (missing, not JSON, truncated, wrong shape)."""


class WarehouseError(TraceqError):
    """The DuckDB warehouse cannot be opened or is locked by another process."""


class ConfigError(TraceqError):
    """Bad options: an unknown metric, a bad step range, a bad rule file.

    Args:
        message: what is wrong and the fix.
        param: the argument it is about (its name in the library; the CLI option is ``--`` + it).
        value: the value given.
    """

    def __init__(self, message: str, *, param: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.value = value

    def __str__(self) -> str:
        return f"{self.param}={self.value!r}: {self.message}" if self.param else self.message

    def cli_message(self) -> str:
        """The message as the CLI says it: the option as typed, then what is wrong."""
        if not self.param:
            return self.message
        return f"--{self.param.replace('_', '-')} {shlex.quote(str(self.value))}: {self.message}"


class EmptySelection(ConfigError):
    """A report's selection leaves nothing to report: no such run, steps out of range, an empty
    warehouse. The message says what exists."""
