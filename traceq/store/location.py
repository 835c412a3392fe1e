"""Where a path the user gave leads: made once, and that one path is both checked and opened.

DuckDB reads a database name its own way: it expands a leading ``~``, opens ``:memory:`` (and ``""``)
as a database that is never kept, and reads ``?name=value`` after a file name as settings. A check made
on the literal text (``./~/x.duckdb`` does not exist) then passes a file DuckDB opens elsewhere
(``$HOME/x.duckdb``, someone else's database). :func:`user_path` turns what was given into the absolute
path it means, or refuses it in one line; the warehouse, its checks and every output use that path.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from traceq.errors import ConfigError

MEMORY = ":memory:"  # DuckDB's database that is never written to a file (the library's, never a user's --db)
_REMOTE = re.compile(r"^(?:md|motherduck):|^[A-Za-z][A-Za-z0-9+.-]+:/")  # md:db, s3://..., https://...


def user_path(given: str | Path, option: str = "--db") -> Path:
    """The absolute path ``given`` (an option's value) means: ``~`` expanded, made absolute and its
    symbolic links resolved, once. ConfigError (one line, naming ``option``) for a value that names no
    file of its own: empty, ``-``, option-like (``--help``), DuckDB's in-memory database, a URL, or a
    name with DuckDB settings after ``?``.

    Args:
        given: the value as typed.
        option: the option it was given to, for the message (``--db``, ``--html``).
    """
    text = str(given)
    stripped = text.strip()
    why = None
    if not stripped:
        why = "an empty name"
    elif stripped == "-":
        why = "'-' (traceq writes no warehouse or output to standard input or output)"
    elif stripped.startswith("-"):
        why = "an option, not a file name (was the value left out?)"
    elif stripped.lower().startswith(MEMORY):
        why = "DuckDB's in-memory database, which keeps nothing"
    elif _REMOTE.match(stripped):
        raise ConfigError(f"{text}: a warehouse is a local DuckDB file or Parquet directory; traceq opens no URL "
                          "and no MotherDuck database (copy it here first)" if option == "--db" else
                          f"{option} {text!r}: a URL; traceq writes local files only")
    elif "?" in text:
        why = "DuckDB would read what follows '?' as its settings"
    if why is not None:
        raise ConfigError(f"{option} {text!r}: {why}; give a file name, e.g. {option} ./runs.duckdb"
                          if option == "--db" else f"{option} {text!r}: {why}; give a file name")
    try:
        return Path(os.path.expanduser(text)).resolve()
    except (OSError, RuntimeError) as exc:  # a loop of symbolic links, a name too long
        raise ConfigError(f"{option} {text!r}: not a path traceq can use ({exc})") from None


def warehouse_path(db: str | Path) -> str:
    """``db`` as the path to check and open: :func:`user_path`'s, or :data:`MEMORY` as given (the
    library's own in-memory warehouse)."""
    if str(db) == MEMORY:
        return MEMORY
    return str(user_path(db))
