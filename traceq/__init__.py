"""traceq: where the time, communication and energy of distributed PyTorch training go.

Kept light on purpose: importing traceq loads neither torch, plotly nor duckdb. The public
functions are imported on first use.

    >>> import traceq
    >>> summary = traceq.ingest_traces(["runs/job1"], db="traceq.duckdb")
    >>> df = traceq.compute_metric("traceq.duckdb", "exposed_comm_us", by="run,rank")
"""

from __future__ import annotations

from importlib import import_module as _import_module
from typing import Any as _Any

from traceq.errors import (
    ConfigError,
    EmptySelection,
    TraceFormatError,
    TraceqError,
    WarehouseError,
)

__version__ = "0.1.0"

_LAZY = {
    "ingest_traces": "traceq.ingest",
    "IngestSummary": "traceq.ingest",
    "compute_metric": "traceq.report.metrics",
    "metric_report": "traceq.report.metrics",
    "Report": "traceq.report.result",
    "list_metrics": "traceq.report.metrics",
    "StepSelection": "traceq.report.selection",
    "relation": "traceq.report.selection",
    "connect": "traceq.store.warehouse",
    "remove_run": "traceq.store.manage",
    "rename_run": "traceq.store.manage",
    "summary": "traceq.report.summary",
    "kernel_report": "traceq.report.kernels",
    "diff": "traceq.report.diff",
    "scaling_report": "traceq.report.scaling",
    "check_warehouse": "traceq.report.check",
    "collectives_report": "traceq.report.collectives",
    "stragglers_report": "traceq.report.collectives",
    "instances_report": "traceq.report.collectives",
    "collective_scaling": "traceq.report.collectives",
    "critical_path": "traceq.report.critical_path",
    "CriticalPath": "traceq.report.critical_path",
    "explain": "traceq.report.explain",
    "export_perfetto": "traceq.perfetto.timeline",
    "perfetto_report": "traceq.perfetto.engine",
    "warehouse_sql": "traceq.report.adhoc",
    "trace_sql": "traceq.perfetto.engine",
}

__all__ = [
    "ConfigError",
    "EmptySelection",
    "TraceFormatError",
    "TraceqError",
    "WarehouseError",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> _Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'traceq' has no attribute {name!r}")
    return getattr(_import_module(module), name)


def __dir__() -> list[str]:
    """The public API, the lazy names included (what ``dir(traceq)`` and completion show)."""
    return sorted(__all__)
