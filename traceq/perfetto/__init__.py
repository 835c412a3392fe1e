"""Perfetto: the second engine and the timeline export.

``engine`` computes the interval metrics from trace files with Perfetto's trace processor and traceq's
PerfettoSQL modules (``sql/perfetto/``), independently of the DuckDB engine, and runs PerfettoSQL of
the user's own on a trace (``traceq report --engine perfetto``, ``traceq sql --engine perfetto``),
through ``processor``, Perfetto's trace processor found, started and tied to traceq's life;
``timeline`` writes runs of the warehouse as an annotated Perfetto trace (``traceq export --perfetto``):
``ranks`` (the ranks asked for), ``clocks`` (each rank on its run's clock), ``plan`` (what is written),
``lanes`` (slices on tracks where none overlaps), ``writing`` (the plan as packets) and ``pftrace``,
the trace-file writer. Trace identity (run, rank) comes from
:mod:`traceq.ingest.identity`, as ingest's.
"""
