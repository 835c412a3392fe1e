"""Exceptions the collectors raise on purpose. Messages name the input and the fix.

The collectors run inside the training job and depend on nothing from the rest of traceq, so they
have their own small family instead of `traceq.errors`.
"""

from __future__ import annotations


class CollectorError(Exception):
    """Base class: every error the collectors raise on purpose derives from it."""


class CollectorConfigError(CollectorError, ValueError):
    """A collector option is out of range, inconsistent, or clashes with files already on disk."""
