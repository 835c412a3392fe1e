"""The ``traceq`` console script: Ctrl-C while traceq loads ends it quietly.

Loading the command line (typer, rich, DuckDB, polars) takes most of a second; Python's own SIGINT
handler would end a Ctrl-C there with a traceback of whichever import it landed in. Until the
command runs, SIGINT ends the process as the signal does (exit 130 in a shell); then Python's
handler is back, and :func:`traceq.cli.main` ends an interrupted command with 130 itself.
"""

from __future__ import annotations

import signal


def main() -> None:
    loading = signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not where it is ignored
    if loading:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    from traceq.cli import main as command_line

    if loading:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    command_line()
