"""Build a synthetic many-rank run by replicating corpus traces under new rank numbers.

    python benchmarks/make_ranks.py --ranks 64                       # nccl_data.json.gz x 64
    python benchmarks/make_ranks.py --ranks 8 --source A.json.gz --source B.json.gz --plain

Rank r is a copy of source ``r % len(sources)`` whose ``distributedInfo`` says ``"rank": r`` and
``"world_size": N`` (added at the top of the trace when the source has none), written as
``OUT/rank<r>.trace.json.gz`` (``.json`` with ``--plain``). Each copy is therefore a distinct file
(its own content hash) that traceq attributes to rank r. Events are left as they are: every rank
shows the same timeline, which is what a balanced data-parallel run looks like.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO.parent / "shared" / "corpus" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
_DIST = re.compile(rb'"distributedInfo"\s*:\s*\{')


def read_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def renumbered(text: bytes, rank: int, world_size: int) -> bytes:
    """``text`` with distributedInfo.rank = rank and world_size = world_size."""
    m = _DIST.search(text)
    if m is None:
        brace = text.index(b"{")
        info = json.dumps({"rank": rank, "world_size": world_size}).encode()
        return text[: brace + 1] + b'\n  "distributedInfo": ' + info + b"," + text[brace + 1 :]
    start = m.end() - 1  # the object's "{"
    head = text[start : start + (1 << 20)].decode("utf-8", "ignore")
    info, end = json.JSONDecoder().raw_decode(head)
    info["rank"] = rank
    info["world_size"] = world_size
    return text[:start] + json.dumps(info).encode() + text[start + len(head[:end].encode()) :]


def build(sources: list[Path], out: Path, ranks: int, plain: bool) -> dict:
    texts = [read_bytes(s) for s in sources]
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    total = 0
    for r in range(ranks):
        data = renumbered(texts[r % len(texts)], r, ranks)
        total += len(data)
        if plain:
            (out / f"rank{r}.trace.json").write_bytes(data)
        else:
            (out / f"rank{r}.trace.json.gz").write_bytes(gzip.compress(data, compresslevel=1, mtime=0))
    return {
        "out": str(out),
        "ranks": ranks,
        "sources": [str(s) for s in sources],
        "json_bytes": total,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, action="append", help="trace to replicate (repeatable)")
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out" / "ranks64")
    ap.add_argument("--plain", action="store_true", help="write .json instead of .json.gz")
    args = ap.parse_args(argv)
    json.dump(build(args.source or [DEFAULT_SOURCE], args.out, args.ranks, args.plain), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
