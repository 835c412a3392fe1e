"""What ingest derives from a trace once its events are in the warehouse: its steps, the step that
launched each device event, and the GPU model its activity ran on. Also run on warehouses written by
an older traceq when they are opened (:func:`traceq.store.warehouse.connect`)."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceq.errors import ConfigError
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


def check_step_marker(con: Any, paths: dict[int, Path], pattern: str) -> dict[int, list[str]]:
    """After :func:`write_steps` with a user's step marker ``pattern``, for the traces ``paths`` (trace id ->
    file; consecutive ids): ConfigError naming the file and the annotations it does have when the marker
    matches no event of a trace that has events; per trace id, a note where the marker's spans cover under
    half the time from the first to the last (a marker inside the step, such as ``Optimizer.step#``)."""
    found = {trace_id: rest for trace_id, *rest in con.execute(
        """
        select trace_id, count(*) filter (where source = 'marker'),
               sum(step_time_ns) filter (where source = 'marker'),
               max(end_ns) filter (where source = 'marker') - min(start_ns) filter (where source = 'marker')
        from steps where trace_id between $first and $last group by trace_id
        """,
        {"first": min(paths), "last": max(paths)},
    ).fetchall()}
    notes: dict[int, list[str]] = {}
    for trace_id, path in paths.items():
        n, busy_ns, span_ns = found.get(trace_id, (0, None, None))
        if trace_id in found and n == 0:
            names = [name for (name,) in con.execute(
                """
                select regexp_replace(n.name, '\\d+', 'N', 'g') as shape
                from host_events as h inner join names as n on n.trace_id = h.trace_id and n.name_id = h.name_id
                where h.trace_id = ? and h.cat in ('user_annotation', 'gpu_user_annotation', 'Operator', 'cpu_op')
                group by shape order by regexp_matches(shape, '(?i)step') desc, count(*) desc, shape limit 8
                """,
                [trace_id],
            ).fetchall()]
            has = f"its annotations include {', '.join(map(repr, names))}" if names else "it has no annotation"
            raise ConfigError(f"{path}: no event matches the step marker {pattern!r}; {has}; give a marker that "
                              "matches its steps (or leave --step-marker out for ProfilerStep#N)")
        if n > 1 and span_ns and busy_ns < 0.5 * span_ns:
            notes[trace_id] = [
                f"{path}: the step marker's {n} spans ({busy_ns / n / 1e6:,.3f} ms each on average) cover "
                f"{100 * busy_ns / span_ns:.0f} % of the time from the first to the last: a marker inside the "
                "step? step_time_ms, the clock of throughput, is the marker's span"]
    return notes


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


