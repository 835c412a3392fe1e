"""DuckDB results as polars frames (traceq.store.frames.to_polars): the same frames as DuckDB's own
``.pl()``, without importing pyarrow, and without DuckDB's binding reporting leaks at exit."""

from __future__ import annotations

import subprocess
import sys

import duckdb

from traceq.store.frames import to_polars

MANY_TYPES = """
select i::tinyint as a, i::smallint as b, i::integer as c, i::bigint as d, i::hugeint as e, i::ubigint as f,
    i / 3::float as g, i / 3 as h, (i / 4)::decimal(10, 2) as dec, 'x' || i as s, i % 2 = 0 as flag,
    null as nothing, case when i > 0 then i end as some_null, [i, i + 1] as list, {'k': i} as struct,
    timestamp '2024-01-01' + to_seconds(i) as ts, date '2024-01-01' + i::integer as day, ['a', null] as strings
from range(5) as t(i)
"""


def test_to_polars_equals_duckdb_pl() -> None:
    con = duckdb.connect()
    for query in (MANY_TYPES, MANY_TYPES + " where false"):
        ours, theirs = to_polars(con.sql(query)), con.sql(query).pl()
        assert ours.schema == theirs.schema
        assert ours.equals(theirs)


def test_reports_import_no_pyarrow_and_frames_alive_at_exit_leak_nothing(tmp_path) -> None:
    db = tmp_path / "w.duckdb"
    con = duckdb.connect(str(db))
    con.execute("create table t as " + MANY_TYPES)
    con.close()
    code = (
        "import sys, duckdb; from traceq.store.frames import to_polars\n"
        f"con = duckdb.connect({str(db)!r}, read_only=True)\n"
        "KEPT = [to_polars(con.sql('select * from t')) for _ in range(3)]\n"  # alive until exit
        "print(sum(f.height for f in KEPT), 'pyarrow' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["15", "False"]
    assert "leaked" not in run.stderr, run.stderr[:500]


def test_import_in_background_leaves_the_module_imported_and_failures_to_the_caller() -> None:
    code = (
        "import sys\nfrom traceq.store.frames import import_in_background\n"
        "with import_in_background('json.tool'):\n    pass\n"
        "print('json.tool' in sys.modules)\n"
        "try:\n    with import_in_background('no_such_module_xyz'):\n        import no_such_module_xyz\n"
        "except ModuleNotFoundError as exc:\n    print(exc.name)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "no_such_module_xyz"]
    assert run.stderr == ""
