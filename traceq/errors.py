"""The one exception family traceq raises. Messages name the input and the fix."""

from __future__ import annotations


class TraceqError(Exception):
    """Base class: every error traceq raises on purpose derives from it."""


class TraceFormatError(TraceqError):
    """A file is not a readable Kineto trace (missing, not JSON, truncated, wrong shape)."""


class WarehouseError(TraceqError):
    """The DuckDB warehouse cannot be opened or is locked by another process."""


class ConfigError(TraceqError):
    """Bad options: an unknown metric, a bad step range, a bad rule file."""


class EmptySelection(ConfigError):
    """A report's selection leaves nothing to report: no such run, steps out of range, an empty
    warehouse. The message says what exists."""
