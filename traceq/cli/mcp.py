"""``traceq mcp``: traceq's read-only reports and SQL console as an MCP server on stdio, for a coding agent
(the tools: :mod:`traceq.mcp_server`)."""

from __future__ import annotations

from pathlib import Path

from traceq.cli.base import DbOption, app
from traceq.errors import ConfigError
from traceq.store.warehouse import DEFAULT_DB


@app.command()
def mcp(db: DbOption = Path(DEFAULT_DB)) -> None:
    """Serve the warehouse to a coding agent: an MCP server (Model Context Protocol) on stdin/stdout.

    Its tools are the read-only reports (runs, metrics, report, summary, kernels, collectives,
    stragglers, critical_path, explain, diff) and the SQL console (sql, as `traceq sql`: the warehouse
    and nothing else). Each gives the report's table (its first max_rows rows, 100 unless asked;
    a note says how many there are) and its notes as structured data. The warehouse is opened
    read-only at each call. The agent starts the server itself: register the command with it.
    Needs the mcp package: pip install 'traceq[mcp]'.

    Examples:

      traceq mcp --db runs.duckdb

    \b
      claude mcp add traceq -- traceq mcp --db /abs/path/runs.duckdb
    """
    from importlib.util import find_spec

    if find_spec("mcp") is None:
        raise ConfigError("the MCP server needs the mcp package: pip install 'traceq[mcp]'")
    from traceq.mcp_server import serve

    serve(db)
