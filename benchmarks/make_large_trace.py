"""Build a large Kineto trace by replicating the steps of a real corpus trace.

    python benchmarks/make_large_trace.py                       # 500 MB from nccl_data.json.gz
    python benchmarks/make_large_trace.py --size-mb 1500 --gzip
    python benchmarks/make_large_trace.py --source ../shared/corpus/tracelens/mi300/resnet_act_checkpoint.json.gz

Replica k (k = 0, 1, ...) of every event is the event's ORIGINAL JSON text with
- ``ts`` + k * shift, where shift = span of the source trace (min ts .. max ts + dur) + ``--gap-us``,
  computed in Decimal so every timestamp keeps its exact decimals (3 for ns-precision traces);
- ids made fresh: ``args.correlation``, ``External id``, ``Record function id``, ``Ev Idx``,
  ``Sequence number``, ``Python id``/``Python parent id`` and flow ``id`` + k * stride
  (stride = a power of ten above every id in the source; ids <= 0 are left alone);
- ``ProfilerStep#N`` -> ``ProfilerStep#(N + k * steps)`` (steps = max - min + 1 of the source's step numbers),
  on CPU and GPU annotations alike.
Metadata events (``ph`` M), the whole-trace ``cat: Trace`` span and global instant events are written once,
after the replicas (the span and the window-end instant stretched/moved to the last replica). The text
before and after the ``traceEvents`` array (``distributedInfo``, ``deviceProperties``,
``baseTimeNanoseconds``, ...) is copied verbatim. Whole replicas are written until the file reaches
``--size-mb`` (decimal MB, uncompressed). Events are streamed to disk as they are produced.

Output: ``benchmarks/out/<source stem>_<size>mb.json`` (and ``.json.gz`` with ``--gzip``).
The source is read relative to the repository root (``../shared/corpus/...``).
"""

from __future__ import annotations

import argparse
import decimal
import gzip
import json
import re
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO / ".." / "shared" / "corpus" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
OUT_DIR = REPO / "benchmarks" / "out"

ID_KEYS = (
    "correlation",
    "External id",
    "Record function id",
    "Ev Idx",
    "Sequence number",
    "Python id",
    "Python parent id",
    "id",
)
_TS_RE = re.compile(r'("ts"\s*:\s*)(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)')
_DUR_RE = re.compile(r'("dur"\s*:\s*)(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)')
_ID_RE = re.compile(r'("(?:' + "|".join(re.escape(k) for k in ID_KEYS) + r')"\s*:\s*)(\d+)(?![\d.eE])')
_STEP_RE = re.compile(r"(ProfilerStep#)(\d+)")
_FIELD_RE = re.compile("|".join(f"(?:{r.pattern})" for r in (_TS_RE, _ID_RE, _STEP_RE)))


def read_text(path: Path) -> str:
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return fh.read()
    return path.read_text(encoding="utf-8")


def split_events(text: str) -> tuple[str, list[tuple[str, dict]], str]:
    """(text before the first event, [(event text, parsed event)], text after the last event)."""
    if text.lstrip().startswith("["):
        start = text.index("[") + 1
    else:
        m = re.search(r'"traceEvents"\s*:\s*\[', text)
        if not m:
            raise ValueError("no traceEvents array")
        start = m.end()
    dec = json.JSONDecoder(parse_float=decimal.Decimal)
    events: list[tuple[str, dict]] = []
    i = start
    n = len(text)
    ws = " \t\r\n"
    while True:
        while i < n and text[i] in ws:
            i += 1
        if text[i] == "]":
            end_array = i
            break
        obj, j = dec.raw_decode(text, i)
        events.append((text[i:j], obj))
        i = j
        while i < n and text[i] in ws:
            i += 1
        if text[i] == ",":
            i += 1
    # header keeps the whitespace Kineto put before the first event
    first = start
    while first < n and text[first] in ws:
        first += 1
    return text[:first], events, text[end_array:]


def _num(v) -> decimal.Decimal:
    return v if isinstance(v, decimal.Decimal) else decimal.Decimal(v)


def _fmt(d: decimal.Decimal) -> str:
    return format(d, "f")


class Template:
    """One event's text split around the fields that change between replicas."""

    __slots__ = ("parts", "fields")

    def __init__(self, text: str):
        self.parts: list[str] = []
        self.fields: list[tuple[str, object]] = []  # ("ts", Decimal) | ("id", int) | ("step", int)
        pos = 0
        for m in _FIELD_RE.finditer(text):
            g = m.groups()
            if g[0] is not None:  # ts
                self.parts.append(text[pos : m.start()] + g[0])
                self.fields.append(("ts", decimal.Decimal(g[1])))
            elif g[2] is not None:  # id
                self.parts.append(text[pos : m.start()] + g[2])
                self.fields.append(("id", int(g[3])))
            else:  # ProfilerStep#N
                self.parts.append(text[pos : m.start()] + g[4])
                self.fields.append(("step", int(g[5])))
            pos = m.end()
        self.parts.append(text[pos:])

    def render(self, ts_shift: decimal.Decimal, id_shift: int, step_shift: int) -> str:
        out = []
        parts = self.parts
        for idx, (kind, val) in enumerate(self.fields):
            out.append(parts[idx])
            if kind == "ts":
                out.append(_fmt(val + ts_shift))
            elif kind == "id":
                out.append(str(val + id_shift if val > 0 else val))
            else:
                out.append(str(val + step_shift))
        out.append(parts[-1])
        return "".join(out)


def is_global(ev: dict) -> bool:
    """Written once, not replicated: metadata, the whole-trace span, global instants."""
    return ev.get("ph") == "M" or ev.get("cat") == "Trace" or ev.get("ph") in ("i", "I")


def build(source: Path, out_path: Path, size_mb: float, gap_us: decimal.Decimal, write_gz: bool) -> dict:
    t0 = time.perf_counter()
    text = read_text(source)
    header, events, footer = split_events(text)
    del text
    replicated = [(t, e) for t, e in events if not is_global(e)]
    globals_ = [(t, e) for t, e in events if is_global(e)]

    starts = [_num(e["ts"]) for _, e in replicated if "ts" in e]
    ends = [_num(e["ts"]) + _num(e.get("dur", 0)) for _, e in replicated if "ts" in e]
    t_min, t_max = min(starts), max(ends)
    shift = (t_max - t_min) + gap_us

    max_id = 0
    steps = []
    templates = []
    for t, _ in replicated:
        tpl = Template(t)
        templates.append(tpl)
        for kind, val in tpl.fields:
            if kind == "id":
                max_id = max(max_id, val)
            elif kind == "step":
                steps.append(val)
    stride = 10 ** len(str(max_id))
    step_count = (max(steps) - min(steps) + 1) if steps else 0

    target = int(size_mb * 1_000_000)
    sep = ",\n  "
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".part")
    written = 0
    k = 0
    with open(tmp, "w", encoding="utf-8", buffering=1 << 22) as fh:
        fh.write(header)
        written += len(header.encode())
        tail_est = len(footer) + sum(len(t) + len(sep) for t, _ in globals_)
        while True:
            ts_shift = shift * k
            chunk = sep.join(tpl.render(ts_shift, stride * k, step_count * k) for tpl in templates)
            if k:
                chunk = sep + chunk
            fh.write(chunk)
            written += len(chunk.encode())
            k += 1
            if written + tail_est >= target:
                break
        last_shift = shift * (k - 1)
        for t, e in globals_:
            if e.get("cat") == "Trace" and "dur" in e:
                t = _DUR_RE.sub(lambda m: m.group(1) + _fmt(_num(e["dur"]) + last_shift), t, count=1)
            elif e.get("ph") in ("i", "I") and "ts" in e and _num(e["ts"]) >= t_max:
                t = _TS_RE.sub(lambda m: m.group(1) + _fmt(_num(e["ts"]) + last_shift), t, count=1)
            fh.write(sep + t)
        fh.write("\n  " + footer)
    tmp.replace(out_path)
    size = out_path.stat().st_size
    gz_path = None
    if write_gz:
        gz_path = out_path.with_name(out_path.name + ".gz")
        with open(out_path, "rb") as src, gzip.open(gz_path.with_name(gz_path.name + ".part"), "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        gz_path.with_name(gz_path.name + ".part").replace(gz_path)
    return {
        "source": str(source),
        "out": str(out_path),
        "out_gz": str(gz_path) if gz_path else None,
        "bytes": size,
        "replicas": k,
        "events_per_replica": len(templates),
        "global_events": len(globals_),
        "steps": (min(steps), max(steps) + step_count * (k - 1)) if steps else None,
        "shift_us": str(shift),
        "id_stride": stride,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="Kineto trace (.json or .json.gz)")
    ap.add_argument("--size-mb", type=float, default=500.0, help="target uncompressed size (1 MB = 1e6 bytes)")
    ap.add_argument("--gap-us", type=decimal.Decimal, default=decimal.Decimal(1000), help="idle gap between replicas")
    ap.add_argument("--out", type=Path, default=None, help="output .json path (default benchmarks/out/...)")
    ap.add_argument("--gzip", action="store_true", help="also write OUT.gz")
    args = ap.parse_args(argv)
    source = args.source.resolve()
    stem = source.name.split(".")[0]
    out = args.out or OUT_DIR / f"{stem}_{int(args.size_mb)}mb.json"
    info = build(source, out, args.size_mb, args.gap_us, args.gzip)
    json.dump(info, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
