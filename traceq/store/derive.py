"""What ingest derives from a trace once its events are in the warehouse: its steps, the step that
launched each device event, and the GPU model its activity ran on. Also run on warehouses written by
an older traceq when they are opened (:func:`traceq.store.warehouse.connect`)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

from traceq.kineto import to_int
from traceq.query import compose, params_of


def write_steps(con: Any, trace_ids: Sequence[int], params: dict[str, Any]) -> None:
    """The steps of the traces ``trace_ids`` (``sql/steps.sql``) and the step that launched each of
    their device events (``sql/step_attribution.sql``), in one statement each: ingest derives
    several small files at once (a statement costs milliseconds whatever its rows, BENCHMARKS.md).
    ``trace_ids``: consecutive ids, as ingest takes them; ``params``: the event categories and the
    step marker's parameters."""
    first, last = trace_ids[0], trace_ids[-1]
    if list(trace_ids) != list(range(first, last + 1)):
        raise ValueError(f"trace ids {list(trace_ids)} are not consecutive")
    params = {**params, "first_trace": first, "last_trace": last}
    steps = compose("steps")
    con.execute(
        "insert into steps (trace_id, rank, step, start_ns, end_ns, step_time_ns, launches_without_gpu_work, source) "
        + steps,
        params_of(steps, params),
    )
    attribution = compose("step_attribution")
    con.execute(
        f"update gpu_events as g set step = a.step, step_source = a.step_source from ({attribution}) as a "
        "where g.rowid = a.rid",
        params_of(attribution, params),
    )


def device_properties(value: Any) -> list[dict[str, Any]]:
    """deviceProperties as [{"id", "name"}]: a JSON list (Kineto), or its Python repr as a string (MTIA
    traces); [] when absent or unreadable."""
    if isinstance(value, str) and len(value) < 1 << 20:
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return []
    if not isinstance(value, list):
        return []
    return [
        {"id": to_int(d.get("id")), "name": d["name"].strip()}
        for d in value
        if isinstance(d, dict) and isinstance(d.get("name"), str)
    ]


def gpu_model_of(con: Any, trace_id: int, devices: list[dict[str, Any]]) -> str | None:
    """The name of the device(s) the trace's activity ran on, from ``devices``; where the ids do not
    match, the one name every listed device has. Several models: their names joined by ' | '."""
    if not devices:
        return None
    used = {d for (d,) in con.execute("select distinct device from gpu_events where trace_id = ?", [trace_id]).fetchall()}
    names = sorted({d["name"] for d in devices if d["name"] and d["id"] in used})
    if not names:
        every = {d["name"] for d in devices if d["name"]}
        names = sorted(every) if len(every) == 1 else []
    return " | ".join(names) or None


