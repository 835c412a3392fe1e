"""SQL files composed into one statement.

Each file under ``sql/`` holds one SELECT. Besides the warehouse tables, it may read the results of
other files, named in its header::

    -- inputs: device_activity, windows

:func:`compose` puts each input in front of the file as a common table expression, recursively, so
that one query runs with every file it needs. An input is the file of the same name unless ``bind``
maps it to another file (``windows`` -> ``trace_windows`` for the whole trace) or to a table. One
input is a table by default: ``kernel_classes``, each kernel name with its rule, and
``optimizer_launches``, the launches inside an optimizer step, which :func:`statement` keeps current
on the connection (:mod:`traceq.classify`). Values go in as named
parameters (``$trace_id``); :func:`run` passes each statement only those it names.

A statement over a selection of runs (``$runs``, a list of run names) reads the warehouse tables
through common table expressions of the same names that hold only those runs' rows, so that its
cost follows what it selects, not what the warehouse holds: the files themselves never filter by run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib.resources import files
from typing import TYPE_CHECKING, Any

from traceq import classify

if TYPE_CHECKING:
    import duckdb

_INPUTS = re.compile(r"^--\s*inputs:\s*(.*)$", re.MULTILINE)
_PARAM = re.compile(r"\$(\w+)")
_LEADING = re.compile(r"\A(?:\s*--[^\n]*\n)*\s*", re.MULTILINE)


@cache
def sql_text(name: str) -> str:
    """The text of ``sql/<name>`` as shipped in the package."""
    return files("traceq.sql").joinpath(name).read_text(encoding="utf-8")


@cache
def _is_file(name: str) -> bool:
    return files("traceq.sql").joinpath(f"{name}.sql").is_file()


def inputs_of(name: str) -> tuple[str, ...]:
    """The relations ``sql/<name>.sql`` reads besides tables (its ``-- inputs:`` header line)."""
    m = _INPUTS.search(sql_text(f"{name}.sql"))
    return tuple(x.strip() for x in m.group(1).split(",") if x.strip()) if m else ()


def compose(name: str, bind: Mapping[str, str] | None = None) -> str:
    """``sql/<name>.sql`` with its inputs, and theirs, as common table expressions: one statement.

    Args:
        name: the file, without ``.sql``.
        bind: input name -> the file (or table) that provides it, where that is not the file of the
            same name. One binding holds for the whole statement.
    """
    bind = {"kernel_classes": classify.TABLE, "optimizer_launches": classify.OPTIMIZER_TABLE, **(bind or {})}
    ctes: dict[str, str] = {}
    _collect(name, bind, ctes, ())
    body = _LEADING.sub("", sql_text(f"{name}.sql"), count=1).rstrip().rstrip(";")
    if not ctes:
        return body
    head = "with " + ",\n".join(f"{cte} as (\n{text}\n)" for cte, text in ctes.items())
    if re.match(r"with\s", body, re.IGNORECASE):
        return head + ",\n" + body[4:].lstrip()
    return head + "\n" + body


def _collect(name: str, bind: dict[str, str], ctes: dict[str, str], path: tuple[str, ...]) -> None:
    if name in path:
        raise ValueError(f"sql/{name}.sql reads itself through {' -> '.join(path)}")
    for cte in inputs_of(name):
        if cte in ctes:
            continue
        target = bind.get(cte, cte)
        if _is_file(target):
            _collect(target, bind, ctes, (*path, name))
            ctes[cte] = _LEADING.sub("", sql_text(f"{target}.sql"), count=1).rstrip().rstrip(";")
        elif target != cte:
            ctes[cte] = f"select * from {target}"
        else:
            raise ValueError(f"sql/{name}.sql reads {cte!r}: no sql/{cte}.sql and no binding for it")


# the warehouse tables a statement over selected runs sees through a filter: by run, or by trace
_BY_RUN = ("runs", "traces", "run_settings")
_BY_TRACE = ("names", "gpu_events", "host_events", "steps", "trace_threads", "run_files", "step_wall_times",
             "power_logs", "power_samples")
_TABLE_READ = re.compile(r"\b(?:from|join)\s+(" + "|".join(_BY_RUN + _BY_TRACE) + r")\b", re.IGNORECASE)


def selecting_runs(statement: str) -> str:
    """``statement`` reading the warehouse tables of the runs in ``$runs`` only (see the module's text)."""
    read = {t.lower() for t in _TABLE_READ.findall(re.sub(r"--[^\n]*", "", statement))}
    if not read:
        return statement
    ctes = [f"{t} as not materialized (select * from main.{t} where list_contains($runs, run))"
            for t in _BY_RUN if t in read]
    ctes += [f"{t} as not materialized (select * from main.{t} where trace_id in "
             f"(select trace_id from main.traces where list_contains($runs, run)))" for t in _BY_TRACE if t in read]
    head = "with " + ",\n".join(ctes)
    if re.match(r"with\s", statement, re.IGNORECASE):
        return head + ",\n" + statement[4:].lstrip()
    return head + "\n" + statement


def params_of(statement: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``params`` that ``statement`` names as ``$name`` (DuckDB refuses unused ones);
    KeyError naming a parameter it needs that ``params`` lacks."""
    code = re.sub(r"--[^\n]*", "", statement)
    return {p: params[p] for p in set(_PARAM.findall(code))}


def run(
    con: duckdb.DuckDBPyConnection, name: str, params: Mapping[str, Any] | None = None,
    bind: Mapping[str, str] | None = None,
) -> duckdb.DuckDBPyRelation:
    """The relation of ``sql/<name>.sql`` composed with its inputs (:func:`statement`), on ``con``; over
    the runs in ``params["runs"]`` alone where that is given."""
    params = params or {}
    text = statement(con, name, bind, params.get("runs"))
    return con.sql(text, params=params_of(text, params) or None)


def statement(
    con: duckdb.DuckDBPyConnection, name: str, bind: Mapping[str, str] | None = None, runs: Sequence[str] | None = None,
) -> str:
    """:func:`compose`, with the kernel classes it reads brought up to date on ``con``; over the runs in
    ``runs`` alone where they are given (:func:`selecting_runs`; None: every run)."""
    text = compose(name, bind)
    if classify.TABLE in text:
        classify.ensure(con, runs)
    return selecting_runs(text) if runs else text
