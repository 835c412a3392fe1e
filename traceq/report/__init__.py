"""Reports: metrics per step from the warehouse's SQL, aggregated, explained and plotted.

:mod:`~traceq.report.selection` (which steps) -> :mod:`~traceq.report.metrics` (step rows and their
aggregation) -> :mod:`~traceq.report.notes` (what a reader needs beside the numbers),
:mod:`~traceq.report.scaling`, :mod:`~traceq.report.runs`, :mod:`~traceq.report.check`,
:mod:`~traceq.report.power` -> :mod:`~traceq.report.html` with :mod:`~traceq.report.plots`.
Every report returns a :class:`~traceq.report.result.Report` (table, notes, title, the rows behind it),
which the CLI, the HTML pages and a notebook show one way. Reports only read; the CLI presents them.
"""
