"""Is an ingest of this tree slower than one of an earlier commit, on the same files, in the same run?

    git worktree add --detach /tmp/base a090854 && ln -s ../sql /tmp/base/traceq/sql
    python benchmarks/bench_versions.py --base /tmp/base benchmarks/out/rank0_500mb.json benchmarks/out/rank0_500mb.json.gz

Each file is ingested into a fresh warehouse by this tree's ``traceq.ingest.ingest_traces`` and by the
``--base`` tree's (the same Python and dependencies; ``PYTHONPATH`` picks the tree), the two taking
turns, ``--repeats`` times each. Printed per file and tree: median wall and CPU seconds, peak RSS of the
process (sampled every 50 ms in one more run), MB of JSON per CPU-second, and this tree's ratio to the
base. A folder (``make_ranks.py``) is ingested whole, in one call. ``--decode`` reads every file with
``traceq.ingest.decode`` instead of DuckDB's JSON reader. A ``--base`` tree needs its ``sql/`` folder linked as ``traceq/sql`` (the package data of an
install).
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_measure import measure  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CHILD = ("import sys, traceq\nassert traceq.__file__.startswith(sys.argv[3]), traceq.__file__\n"
         "from traceq.ingest import ingest_traces\nassert ingest_traces([sys.argv[1]], sys.argv[2], native=sys.argv[4] == 'native').ok\n")


def json_mb(path: Path) -> float:
    if path.is_dir():  # a folder of traces (make_ranks.py): its files, ingested in one call
        return sum(json_mb(p) for p in sorted(path.iterdir()) if p.is_file())
    if path.suffix != ".gz":
        return path.stat().st_size / 1e6
    with gzip.open(path, "rb") as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 24), b"")) / 1e6


def ingest(tree: Path, path: Path, sample_s: float | None, parser: str = "native") -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-versions-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        # run from the scratch folder: `python -c` puts its working directory before PYTHONPATH, and the
        # repository's would shadow the tree asked for
        result = measure([sys.executable, "-c", CHILD, str(path.resolve()), str(Path(tmp) / "w.duckdb"), str(tree), parser], env=env,
                         cwd=Path(tmp), sample_s=sample_s)
    if result["rc"] != 0:
        raise RuntimeError(f"{tree}: {path}: {result['stderr_tail']}")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--base", type=Path, required=True, help="the earlier tree (a git worktree)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode", action="store_true",
                    help="read with traceq.ingest.decode (native=False), the path of the files DuckDB would read otherwise")
    args = ap.parse_args(argv)
    trees = {"this tree": REPO, "base": args.base.resolve()}
    parser = "decode" if args.decode else "native"
    print(f"{'file':26s} {'tree':10s} {'wall s':>7s} {'CPU s':>7s} {'peak RSS MiB':>13s} {'MB/CPU-s':>9s} {'ratio':>6s}")
    for path in args.files:
        mb = json_mb(path)
        runs: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():
                runs[name].append(ingest(tree, path, None, parser))
        rss = {name: ingest(tree, path, 0.05, parser)["peak_rss_mb"] for name, tree in trees.items()}
        walls = {name: statistics.median(r["seconds"] for r in rs) for name, rs in runs.items()}
        for name in trees:
            cpu = statistics.median(r["cpu_s"] for r in runs[name])
            ratio = walls[name] / walls["base"]
            print(f"{path.name:26s} {name:10s} {walls[name]:7.2f} {cpu:7.2f} {rss[name]:13.0f} {mb / cpu:9.0f} {ratio:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
