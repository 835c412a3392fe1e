"""The traceq command line: thin commands over the library, the only package that prints or exits.

``base`` holds the application, its one error boundary and what the commands share (options, tables);
the commands are in ``ingest`` (loading traces), ``reports``, ``paths`` (the critical path), ``explain``
(findings), ``warehouse`` (runs, rules, checks, SQL, exports) and ``mcp`` (the reports served to a coding
agent). A command parses its options, calls one library function and prints what it returns.
"""

from __future__ import annotations

import sys

from traceq.cli import ingest, reports, paths, explain, warehouse, mcp  # noqa: F401 (they register their commands, in this order)
from traceq.cli.base import app, echo

__all__ = ["app", "main"]


def main() -> None:
    """The console script: the command, then its exit code. Ctrl-C ends it with 130 and nothing on
    stderr; what the machine got wrong (a full disk, no memory, a damaged file) with one line and 1;
    anything else is a bug, and its traceback is due."""
    from traceq.interrupts import end_process, is_interrupt, noting_interrupts
    from traceq.scratch import remove_process_scratch, remove_stale_scratch_everywhere
    from traceq.store.warehouse import environment_error

    remove_stale_scratch_everywhere()  # what a killed ingest left, as soon as its owner is gone
    try:
        # Ctrl-C in a DuckDB statement comes out as DuckDB's error; a statement that heeds no signal
        # ends with the process, 6 s after Ctrl-C (its writes are a transaction DuckDB undoes)
        with noting_interrupts(knock_s=1.0, knocks=5, stuck=end_process):
            app()  # click's standalone mode ends with SystemExit(int); Ctrl-C with SystemExit(130)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException as exc:
        if is_interrupt(exc):
            code = 130  # as typer ends a KeyboardInterrupt: silently, 128 + SIGINT
        elif (message := environment_error(exc)) is not None:
            echo(f"error: {message}", err=True)
            code = 1
        else:
            raise  # a bug: the traceback is due
    remove_process_scratch()
    sys.exit(code)
