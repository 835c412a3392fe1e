"""The warehouse: a DuckDB file (or a Parquet directory) and what every connection needs.

:mod:`~traceq.store.schema` (tables, migrations, rules, session) <- :mod:`~traceq.store.parquet` (the
Parquet layout, read as views) <- :mod:`~traceq.store.warehouse` (open either) <-
:mod:`~traceq.store.export`, :mod:`~traceq.store.run_metadata`; :mod:`~traceq.store.derive` holds what
ingest (and a migration) derives from the events in SQL.
"""
