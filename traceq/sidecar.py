"""Files the collectors write beside each trace (``rank<r>.run.json``, ``rank<r>.power.jsonl``).

:func:`load_side_files` is called by ingest, inside the trace's transaction, after the trace's
events and steps are in the warehouse.
"""

from __future__ import annotations

from pathlib import Path

import duckdb


def side_file(trace_path: Path, suffix: str) -> Path:
    """``runs/x/rank0.trace.json.gz`` + ``.run.json`` -> ``runs/x/rank0.run.json``."""
    name = trace_path.name
    for ending in (".trace.json.gz", ".trace.json", ".json.gz", ".json"):
        if name.endswith(ending):
            return trace_path.with_name(name[: -len(ending)] + suffix)
    return trace_path.with_name(name + suffix)


def load_side_files(con: duckdb.DuckDBPyConnection, trace_id: int, trace_path: Path, run: str) -> list[str]:
    """Load the run metadata and power log that sit beside ``trace_path``, if any.

    Returns the names of the side files loaded.
    """
    return []
