"""Which steps a report uses, and the parameters every report query takes (docs/explanation/metrics.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from traceq import classify, query
from traceq.catalog import StepMarker, event_categories
from traceq.errors import ConfigError
from traceq.peaks import gpu_peaks


@dataclass(frozen=True)
class StepSelection:
    """Which steps a report uses (docs/explanation/metrics.md).

    Args:
        skip_steps: leading profiled steps to skip; None = the run's ``warmup_steps`` metadata, else 0.
        step_min, step_max: keep step numbers (N of ProfilerStep#N) in [step_min, step_max] (None = unbounded).
        include_last: keep each rank's last step. By default, on traces with device activity, it is left
            out: its device window is open
            (nothing closes it but the GPU's drain, so it holds the backlog of earlier steps on a GPU that
            lags its CPU, or loses its trailing idle on one that leads); a rank whose only step is the
            last keeps it.
        drop_incomplete: with ``include_last``, still drop a last step that the end of the trace cut.
        drop_last: drop the last step always, even a rank's only step (what HTA does).
    """

    skip_steps: int | None = None
    step_min: int | None = None
    step_max: int | None = None
    include_last: bool = False
    drop_incomplete: bool = True
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.include_last and self.drop_last:
            raise ConfigError("include_last keeps each rank's last step and drop_last drops it: give one of them")

    def describe(self, metadata: bool = True) -> str:
        """The selection in words, e.g. 'steps 900..1000, warm-up steps skipped: 10, ...'. ``metadata``:
        the steps are of runs with metadata (a warehouse's); trace files read directly have no warmup_steps."""
        parts = []
        if self.step_min is not None or self.step_max is not None:
            parts.append(f"steps {'' if self.step_min is None else self.step_min}..{'' if self.step_max is None else self.step_max}")
        skipped = ("the run's warmup_steps, 0 if unset" if metadata else "none unless --skip-steps") \
            if self.skip_steps is None else str(self.skip_steps)
        parts.append(f"warm-up steps skipped: {skipped}")
        parts.append("dropping every last step" if self.drop_last
                     else ("keeping the last step (open window)" + (" unless cut" if self.drop_incomplete else ""))
                     if self.include_last else "leaving out the open last step (--include-last keeps it)")
        return ", ".join(parts)

    @classmethod
    def parse(cls, steps: str | None = None, skip_steps: int | None = None, drop_last: bool = False,
              include_last: bool = False) -> StepSelection:
        """From CLI text: ``steps`` as "a:b" (inclusive step numbers; either side may be empty)."""
        lo = hi = None
        if steps:
            left, sep, right = steps.partition(":")
            try:
                lo = int(left) if left.strip() else None
                hi = int(right) if right.strip() else None
                if not sep:
                    hi = lo
            except ValueError:
                raise ConfigError("expected a:b with step numbers, e.g. 11:60", param="steps", value=steps) from None
            if lo is not None and hi is not None and hi < lo:
                raise ConfigError("the end is before the start", param="steps", value=steps)
        if skip_steps is not None and skip_steps < 0:
            raise ConfigError("must be 0 or more", param="skip_steps", value=skip_steps)
        return cls(skip_steps=skip_steps, step_min=lo, step_max=hi, drop_last=drop_last, include_last=include_last)


def query_params(selection: StepSelection = StepSelection(), runs: Sequence[str] | None = None) -> dict[str, object]:
    """Every parameter the report queries take: the step selection, the runs a statement reads
    (``runs``: None for every run; :func:`traceq.query.run` reads only theirs), the event categories,
    the default step marker (for traces ingested before markers were stored), the GPU peak table, and
    whether the cross-rank tables keep to the steps every rank has (``shared_steps``)."""
    return {
        "runs": list(runs) if runs else None,
        "shared_steps": False,
        "skip_steps": selection.skip_steps,
        "step_min": selection.step_min,
        "step_max": selection.step_max,
        "include_last": selection.include_last,
        "drop_incomplete": selection.drop_incomplete,
        "drop_last": selection.drop_last,
        **event_categories().sql_params(),
        **StepMarker().sql_params(),
        "gpu_peaks": [
            {"position": i, "pattern": p.pattern, "gpu": p.gpu, "peak_tflops": p.peak_tflops}
            for i, p in enumerate(gpu_peaks())
        ],
    }


def relation(
    con: duckdb.DuckDBPyConnection, name: str, selection: StepSelection = StepSelection(),
    bind: dict[str, str] | None = None,
) -> duckdb.DuckDBPyRelation:
    """The relation of ``sql/<name>.sql`` (e.g. ``gpu_activity``, ``device_windows``) on ``con``, with the
    parameters reports use: for queries of your own over traceq's classification and windows.

    It leaves ``con`` as it was: the kernel classes and optimizer launches the SQL reads go into the
    statement (:func:`traceq.classify.inline`), not into the temporary tables traceq's own connections keep."""
    inputs, params = classify.inline(con)
    return query.run(con, name, {**query_params(selection), **params}, {**inputs, **(bind or {})})
