"""Brute-force reference for cross-rank collective matching and the wait/transfer split of comm time.

Written from the contract alone (DESIGN §9 and its "resolved details"), apart from traceq's code: it
reads nothing from ``traceq/`` nor ``sql/*.sql``; it uses only the standard library and
``tests/step_reference.py`` (parsing rules, kernel classes, step windows, interval algebra).

Rules implemented (a run = a list of Kineto trace files):
  1. Collective kernels = kernel-category device events of class 'comm'. Type from args
     "Collective name": lowercase, '_' removed, first of allreduce/reducescatter/allgather/alltoall
     (contains), broadcast|bcast, sendrecv (contains), send/recv (starts or ends with), == reduce, else
     Other; no Collective name -> Other.
  2. Group = (args "Process Group Name", sorted ints of "Process Group Ranks" or None). Without a pg
     name: the file's distributedInfo.pg_config if it has exactly one entry, else unmatched
     "no process group".
  3. n = "Group size" (int > 0), else len(members), else pg_config's pg_size; else "no group size".
  4. Send/Recv/SendRecv: "point-to-point".
  5. present = distinct ranks holding a candidate of the group; present != n ->
     "the run holds {present} of the group's {n} ranks".
  6. All candidates of the group have Seq: key (Seq, k), k = ordinal per (rank, Seq) by (start, end);
     an instance needs n kernels, else "missing on some ranks". Otherwise per (group, type) ordinals;
     different counts per rank -> "ranks saw different numbers of kernels"; key (type, ordinal).
  7. transfer = min dur of the instance, wait = dur - transfer, arrived_last = min dur (lowest rank on
     a tie); the last arriver caused the sum of the others' waits. 8. Unmatched: wait 0, transfer = dur,
     not arrived last.
  7r. Rooted collectives (§9): an instance is rooted when any of its kernels is Broadcast or Reduce
     (point-to-point never matches, rule 4). Rule 7 does not apply to it:
     - on one host's clock (every kernel of the instance from the same trace file): arrival by start
       time. The last arriver = latest start_ns (lowest rank on a tie); each kernel's
       wait = min(dur, max(0, last_start - start)), transfer = dur - wait; the last arriver caused the
       sum of the others' waits, the others caused 0.
     - otherwise (kernels from different files, each on a clock of its own; no skew estimate):
       arrival not inferable. Still matched (same instance, reason None), but every kernel has wait 0,
       transfer = dur, not arrived last, caused 0: no straggler is counted for it.
  9. Wait part [start, start+wait), transfer part [start+wait, end); per window, clipped:
     transfer = |U(T)|, wait = |U(W) - U(T)|, exposed_* = the same minus U(compute).
 10. Stragglers: a matched kernel belongs to the window of its (rank, device) with s <= start < e.
 11. size_bytes = nelems (Out for AllGather, In otherwise) x dtype size; instance size = max.
 12. algbw = size / transfer (GB/s); busbw = algbw x factor(type, n).

Points the contract left open, and how they are resolved here:
  * Windows, whole-trace rows and comm/compute intervals are taken per file: a window of file F sees
    only F's events (step_reference works per file too). Matching is over the whole run.
  * A pg name that is absent, null or "" is "no pg name"; a non-string pg name is str()-ed.
    "Process Group Ranks" may be JSON text or a real list; any non-integer element, a parse failure or
    an empty list -> members None. pg_config's "ranks" the same way; its entry must be a dict with a
    non-null pg_name, otherwise the kernel has "no process group".
  * pg_config's pg_size is used for n only when the group itself came from pg_config. group_size is
    reported whenever rule 3 gives an n (also for kernels unmatched for another reason).
  * Kernels of one group that disagree on n are each judged with their own n in rule 5.
  * Rule 6 fallback: counts are compared over all ranks present in the group (rule 5), a rank without
    any kernel of that type counting 0. Ordinal ties on (start, end) are broken by file then file order.
  * An instance whose kernels disagree on type has busbw None (algbw still given). transfer_ns == 0 or
    no size -> algbw/busbw None. Seq = to_int(args "Seq"); a non-integer Seq counts as absent.
  * whole_trace_metrics: matched_count/arrived_last_count/wait_caused_ns over all the device's kernels
    (no start < end test, so a zero-length kernel at the very end still counts).
  * Instance rows also carry "name" and "path" (the kernel name, the file) for identification.
  * Rooted instances (rule 7r): "one clock" compares the file (its index in the run), so a merged file
    holding several ranks (args.rank) is one clock and one rank per file never is. Bandwidth (not fixed
    by the contract): algbw = size / the last arriver's transfer (rule 7: = min dur, the same as before;
    start time: the last arriver's dur, from its arrival to its end); arrival not inferable -> algbw and
    busbw None (no transfer time can be inferred for the instance).

Self-check: ``.venv/bin/python -m tests.comm_reference`` from the project root.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from decimal import Decimal

from tests import step_reference as sr

DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2,
               "Char": 1, "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16}
P2P = ("Send", "Recv", "SendRecv")
ROOTED = ("Broadcast", "Reduce")  # rule 7r (point-to-point is rooted too, but never matched: rule 4)
SPLIT_KEYS = ("comm_wait_ns", "comm_transfer_ns", "exposed_comm_wait_ns", "exposed_comm_transfer_ns")
STRAGGLER_KEYS = ("matched_count", "arrived_last_count", "wait_caused_ns")


def collective_type(value) -> str:
    if value is None:
        return "Other"
    s = str(value).lower().replace("_", "")
    for word, typ in (("allreduce", "AllReduce"), ("reducescatter", "ReduceScatter"),
                      ("allgather", "AllGather"), ("alltoall", "AllToAll")):
        if word in s:
            return typ
    if "broadcast" in s or "bcast" in s:
        return "Broadcast"
    if "sendrecv" in s:
        return "SendRecv"
    for word in ("send", "recv"):
        if s.startswith(word) or s.endswith(word):
            return word.capitalize()
    return "Reduce" if s == "reduce" else "Other"


def _members(value):
    if isinstance(value, str):
        try:
            value = json.loads(value, parse_float=Decimal)
        except ValueError:
            return None
    if not isinstance(value, list) or not value:
        return None
    ints = [sr.to_int(v) for v in value]
    return None if any(v is None for v in ints) else tuple(sorted(ints))


def dtype_bytes(dtype):
    return None if not isinstance(dtype, str) else 1 if dtype.startswith("Float8") else DTYPE_BYTES.get(dtype)


def bus_factor(typ, n):
    if typ == "AllReduce":
        return 2 * (n - 1) / n
    if typ in ("AllGather", "ReduceScatter", "AllToAll"):
        return (n - 1) / n
    return 1 if typ in ("Broadcast", "Reduce", "SendRecv", "Send", "Recv") else None


def _read(path):
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as fh:
        return json.loads(fh.read(), parse_float=Decimal)


def _comm_kernels(paths) -> list[dict]:
    """Every comm kernel of the run with its raw attributes (rules 1-3 applied, nothing matched yet)."""
    out = []
    for pi, path in enumerate(paths):
        doc = _read(path)
        file_rank, cfg = None, None
        events = doc if isinstance(doc, list) else []
        if isinstance(doc, dict):
            info = doc.get("distributedInfo")
            if isinstance(info, dict):
                file_rank = sr.to_int(info.get("rank"))
                pgc = info.get("pg_config")
                if isinstance(pgc, list) and len(pgc) == 1 and isinstance(pgc[0], dict):
                    cfg = pgc[0]
            events = doc.get("traceEvents") or []
        for order, ev in enumerate(events):
            if not isinstance(ev, dict) or ev.get("ph") != "X" or ev.get("cat") not in sr.KERNEL_CATS:
                continue
            start, dur = sr.ns(ev.get("ts")), sr.ns(ev.get("dur"))
            args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            name = ev.get("name")
            name = name if isinstance(name, str) else ("" if name is None else str(name))
            if start is None or dur is None or dur < 0 or sr.kernel_class(name, args) != "comm":
                continue
            rank = next((v for v in (sr.to_int(args.get("rank")), file_rank) if v is not None), -1)
            device = next((v for v in (sr.to_int(args.get("device")), sr.to_int(ev.get("pid")))
                           if v is not None), -1)
            k = dict(path=str(path), pi=pi, order=order, name=name, rank=rank, device=device,
                     start_ns=start, end_ns=start + dur, dur_ns=dur,
                     collective_type=collective_type(args.get("Collective name")),
                     seq=sr.to_int(args.get("Seq")), reason=None)
            pg = args.get("Process Group Name")
            pg = None if pg is None or pg == "" else str(pg)
            members, cfg_size = _members(args.get("Process Group Ranks")), None
            if pg is None:
                members = None
                if cfg is not None and cfg.get("pg_name") not in (None, ""):
                    pg, members = str(cfg["pg_name"]), _members(cfg.get("ranks"))
                    cfg_size = cfg.get("pg_size")
            n = sr.to_int(args.get("Group size"))
            if n is None or n <= 0:
                n = len(members) if members is not None else sr.to_int(cfg_size)
                n = n if n is not None and n > 0 else None
            k.update(pg_name=pg, members=members, group_size=n)
            elems_key = "Out msg nelems" if k["collective_type"] == "AllGather" else "In msg nelems"
            elems = sr.to_int(args.get(elems_key))
            width = dtype_bytes(args.get("dtype"))
            k["size_bytes"] = elems * width if elems is not None and width is not None else None
            k["reason"] = ("no process group" if pg is None else "no group size" if n is None
                           else "point-to-point" if k["collective_type"] in P2P else None)
            out.append(k)
    return out


def _sort_key(k):
    return (k["start_ns"], k["end_ns"], k["pi"], k["order"])


def _match(kernels) -> None:
    """Rules 5-8 and 11-12, in place."""
    groups = defaultdict(list)
    for k in kernels:
        if k["reason"] is None:
            groups[(k["pg_name"], k["members"])].append(k)
    instances = {}  # (pg_name, members, key) -> kernels
    for gkey, ks in groups.items():
        present = sorted({k["rank"] for k in ks})
        for k in ks:
            if len(present) != k["group_size"]:
                k["reason"] = f"the run holds {len(present)} of the group's {k['group_size']} ranks"
        ks = [k for k in ks if k["reason"] is None]
        if ks and all(k["seq"] is not None for k in ks):
            per = defaultdict(list)
            for k in ks:
                per[(k["rank"], k["seq"])].append(k)
            for (_, seq), lst in per.items():
                for i, k in enumerate(sorted(lst, key=_sort_key), start=1):
                    instances.setdefault(gkey + ((seq, i),), []).append(k)
        else:
            by_type = defaultdict(lambda: defaultdict(list))
            for k in ks:
                by_type[k["collective_type"]][k["rank"]].append(k)
            for typ, per_rank in by_type.items():
                if len({len(per_rank.get(r, [])) for r in present}) != 1:
                    for lst in per_rank.values():
                        for k in lst:
                            k["reason"] = "ranks saw different numbers of kernels"
                    continue
                for lst in per_rank.values():
                    for i, k in enumerate(sorted(lst, key=_sort_key), start=1):
                        instances.setdefault(gkey + ((typ, i),), []).append(k)
    for key, ks in instances.items():
        if len(ks) != ks[0]["group_size"] or len({k["rank"] for k in ks}) != len(ks):
            for k in ks:
                k["reason"] = "missing on some ranks"
            continue
        last = _split_instance(ks)  # sets wait_ns / transfer_ns; the last arriver, or None
        sizes = [k["size_bytes"] for k in ks if k["size_bytes"] is not None]
        size = max(sizes) if sizes else None
        transfer = last["transfer_ns"] if last is not None else None
        algbw = size / transfer if size is not None and transfer else None
        types = {k["collective_type"] for k in ks}
        factor = bus_factor(types.pop(), ks[0]["group_size"]) if len(types) == 1 else None
        busbw = algbw * factor if algbw is not None and factor is not None else None
        caused = sum(k["wait_ns"] for k in ks if k is not last)
        for k in ks:
            k.update(matched=True, instance=key, arrived_last=k is last, algbw_gbps=algbw, busbw_gbps=busbw,
                     _others_wait=caused if k is last else 0)
    for k in kernels:
        if k.get("matched") is None:
            k.update(matched=False, instance=None, wait_ns=0, transfer_ns=k["dur_ns"], arrived_last=False,
                     algbw_gbps=None, busbw_gbps=None, _others_wait=0)


def _split_instance(ks):
    """Rules 7 and 7r for one matched instance: set each kernel's wait_ns and transfer_ns; return the
    kernel that arrived last, or None when arrival cannot be inferred."""
    rooted = any(k["collective_type"] in ROOTED for k in ks)
    if not rooted:  # rule 7: the shortest kernel arrived last and transferred for its whole duration
        transfer = min(k["dur_ns"] for k in ks)
        for k in ks:
            k.update(wait_ns=k["dur_ns"] - transfer, transfer_ns=transfer)
        return min(ks, key=lambda k: (k["dur_ns"], k["rank"]))
    if len({k["pi"] for k in ks}) > 1:  # rooted, clocks of their own: not inferable, never guessed
        for k in ks:
            k.update(wait_ns=0, transfer_ns=k["dur_ns"])
        return None
    last = max(ks, key=lambda k: (k["start_ns"], -k["rank"]))  # rooted, one clock: by start time
    for k in ks:
        wait = min(k["dur_ns"], max(0, last["start_ns"] - k["start_ns"]))
        k.update(wait_ns=wait, transfer_ns=k["dur_ns"] - wait)
    return last


def _matched_run(paths) -> list[dict]:
    kernels = _comm_kernels(paths)
    _match(kernels)
    kernels.sort(key=lambda k: (k["pi"], k["rank"], k["device"], k["start_ns"], k["end_ns"], k["order"]))
    return kernels


PUBLIC_KEYS = ("path", "name", "rank", "device", "start_ns", "end_ns", "dur_ns", "collective_type", "pg_name",
               "members", "group_size", "seq", "matched", "reason", "instance", "wait_ns", "transfer_ns",
               "arrived_last", "size_bytes", "algbw_gbps", "busbw_gbps")


def instances(paths) -> list[dict]:
    """One dict per comm kernel of the run (ordered by file, rank, device, start, end)."""
    return [{key: k[key] for key in PUBLIC_KEYS} for k in _matched_run(paths)]


def _split(comm, compute, s, e) -> dict:
    """The four split metrics of window [s, e) from comm kernels and compute (start, end) intervals."""
    def union(pairs):
        return sr.union([(max(a, s), min(b, e)) for a, b in pairs])
    waits = union((k["start_ns"], k["start_ns"] + k["wait_ns"]) for k in comm)
    transfers = union((k["start_ns"] + k["wait_ns"], k["end_ns"]) for k in comm)
    comp = union(compute)
    wait_only = sr.subtract(waits, transfers)
    return dict(comm_wait_ns=sr.total(wait_only), comm_transfer_ns=sr.total(transfers),
                exposed_comm_wait_ns=sr.total(sr.subtract(wait_only, comp)),
                exposed_comm_transfer_ns=sr.total(sr.subtract(transfers, comp)))


def _stragglers(ks) -> dict:
    ks = [k for k in ks if k["matched"]]
    last = [k for k in ks if k["arrived_last"]]
    return dict(matched_count=len(ks), arrived_last_count=len(last),
                wait_caused_ns=sum(k["_others_wait"] for k in last))


def _per_device(paths):
    """(path, {(rank, device): comm kernels}, {(rank, device): compute intervals}) per file."""
    kernels = _matched_run(paths)
    for pi, path in enumerate(paths):
        comm, compute = defaultdict(list), defaultdict(list)
        for k in kernels:
            if k["pi"] == pi:
                comm[(k["rank"], k["device"])].append(k)
        for a in sr.load(path).activities:
            if a.cls == "compute":
                compute[(a.rank, a.device)].append((a.start, a.end))
        yield path, comm, compute


def window_metrics(paths) -> list[dict]:
    """One dict per step window (step_reference.step_windows of each file): split + straggler metrics."""
    out = []
    for path, comm, compute in _per_device(paths):
        for w in sr.step_windows(path):
            s, e = w["start_ns"], w["end_ns"]
            dev = (w["rank"], w["device"])
            row = {key: w[key] for key in ("rank", "device", "step", "start_ns", "end_ns")}
            row.update(_split(comm[dev], compute[dev], s, e))
            row.update(_stragglers([k for k in comm[dev] if s <= k["start_ns"] < e]))
            out.append(row)
    return out


def whole_trace_metrics(paths) -> list[dict]:
    """Per (rank, device) with activity, over min start..max end of all its activity."""
    out = []
    for path, comm, compute in _per_device(paths):
        for dev, bucket in sr.load(path).buckets.items():
            s, e = min(a.start for a in bucket.acts), max(a.end for a in bucket.acts)
            row = dict(rank=dev[0], device=dev[1], start_ns=s, end_ns=e)
            row.update(_split(comm[dev], compute[dev], s, e))
            row.update(_stragglers(comm[dev]))
            out.append(row)
    return out


# ----------------------------------------------------------------------------------------------------
# Self-check: .venv/bin/python -m tests.comm_reference

US = 1000
AR, AG, SEND = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclDevKernel_AllGather_RING_LL",
                "ncclDevKernel_SendRecv")
N = 1_000_000


def _args(coll="allreduce", pg="0", ranks="[0, 1, 2]", size=3, **extra):
    a = {"Collective name": coll, "Process Group Name": pg, "Process Group Ranks": ranks, "Group size": size,
         "In msg nelems": N, "Out msg nelems": N, "dtype": "Float"}
    a.update(extra)
    return {k: v for k, v in a.items() if v is not None}


def _check_identities(paths):
    windows = window_metrics(paths)
    steps = [m for p in paths for m in sr.step_metrics(p)]
    assert len(windows) == len(steps)
    for w, m in zip(windows, steps):
        assert all(w[k] == m[k] for k in ("rank", "device", "step", "start_ns", "end_ns"))
        assert w["comm_wait_ns"] + w["comm_transfer_ns"] == m["comm_ns"], (w, m)
        assert w["exposed_comm_wait_ns"] + w["exposed_comm_transfer_ns"] == m["exposed_comm_ns"], (w, m)
    return windows


def _self_check(tmp):
    from tests.tracegen import TraceBuilder

    assert sr.kernel_class(AR, {}) == "comm" and sr.kernel_class(AG, {}) == "comm"
    assert sr.kernel_class("gemm_kernel", {}) == "compute"

    def write(tag, builders, **top):
        return [b.write(tmp / f"{tag}{i}.json", **top) for i, b in enumerate(builders)]

    def allreduce_run(tag, durs_us, offsets=(0, 0, 0)):
        bs = []
        for r, (d, off) in enumerate(zip(durs_us, offsets)):
            b = TraceBuilder(rank=r)
            b.step(1, off, off + 100 * US)
            b.kernel(AR, off + (30 - d) * US, off + 30 * US, launch_ns=off + 10 * US, **_args())
            bs.append(b)
        return bs

    # (a) durations 10, 7, 3 us: transfer 3, waits 7, 4, 0; rank 2 arrived last and caused 7 + 4 = 11 us
    pa = write("a", allreduce_run("a", (10, 7, 3)))
    rows = instances(pa)
    assert [(r["rank"], r["matched"], r["wait_ns"], r["transfer_ns"], r["arrived_last"]) for r in rows] == [
        (0, True, 7 * US, 3 * US, False), (1, True, 4 * US, 3 * US, False), (2, True, 0, 3 * US, True)], rows
    assert len({r["instance"] for r in rows}) == 1
    assert rows[0]["instance"] == ("0", (0, 1, 2), ("AllReduce", 1))
    assert all(r["size_bytes"] == 4 * N and r["group_size"] == 3 and r["reason"] is None for r in rows)
    assert abs(rows[0]["algbw_gbps"] - 4 * N / 3000) < 1e-9
    assert abs(rows[0]["busbw_gbps"] - 4 * N / 3000 * 4 / 3) < 1e-9
    wa = _check_identities(pa)
    assert [(w["rank"], w["start_ns"], w["end_ns"], w["comm_wait_ns"], w["comm_transfer_ns"],
             w["exposed_comm_wait_ns"], w["exposed_comm_transfer_ns"]) for w in wa] == [
        (0, 20 * US, 30 * US, 7 * US, 3 * US, 7 * US, 3 * US),
        (1, 23 * US, 30 * US, 4 * US, 3 * US, 4 * US, 3 * US),
        (2, 27 * US, 30 * US, 0, 3 * US, 0, 3 * US)], wa
    assert [(w["matched_count"], w["arrived_last_count"], w["wait_caused_ns"]) for w in wa] == [
        (1, 0, 0), (1, 0, 0), (1, 1, 11 * US)], wa
    wh = whole_trace_metrics(pa)
    assert [(x["comm_wait_ns"], x["wait_caused_ns"]) for x in wh] == [(7 * US, 0), (4 * US, 0), (0, 11 * US)]

    # (b) rank 1's clock 1 ms ahead: everything but the absolute times is unchanged
    pb = write("b", allreduce_run("b", (10, 7, 3), offsets=(0, 1_000_000, 0)))
    drop = ("path", "start_ns", "end_ns")
    assert [{k: v for k, v in r.items() if k not in drop} for r in instances(pb)] == \
        [{k: v for k, v in r.items() if k not in drop} for r in rows]
    assert [{k: v for k, v in w.items() if k not in drop} for w in _check_identities(pb)] == \
        [{k: v for k, v in w.items() if k not in drop} for w in wa]

    # (c) rank 1 saw one AllGather fewer: the AllGathers are unmatched, the AllReduce still matches
    def ag_run(with_seq):
        bs = []
        for r in range(3):
            b = TraceBuilder(rank=r)
            b.step(1, 0, 100 * US)
            b.kernel(AR, 10 * US, (15 + r) * US, launch_ns=1 * US, **_args(Seq=1 if with_seq else None))
            for i in range(1 if r == 1 else 2):
                b.kernel(AG, (20 + 10 * i) * US, (25 + 10 * i) * US, launch_ns=2 * US,
                         **_args("allgather", Seq=2 + i if with_seq else None))
            bs.append(b)
        return bs

    pc = write("c", ag_run(False))
    rc = instances(pc)
    diff = "ranks saw different numbers of kernels"
    assert [(r["rank"], r["collective_type"], r["reason"]) for r in rc] == [
        (0, "AllReduce", None), (0, "AllGather", diff), (0, "AllGather", diff), (1, "AllReduce", None),
        (1, "AllGather", diff), (2, "AllReduce", None), (2, "AllGather", diff), (2, "AllGather", diff)], rc
    assert all(r["matched"] == (r["reason"] is None) for r in rc)
    assert all(r["wait_ns"] == 0 and r["transfer_ns"] == r["dur_ns"] and r["instance"] is None
               for r in rc if not r["matched"])
    assert rc[0]["arrived_last"] and rc[0]["wait_ns"] == 0 and rc[5]["wait_ns"] == 2 * US
    _check_identities(pc)
    # the same with Seq: Seq 1 and 2 match, Seq 3 (missing on rank 1) does not
    rs = instances(write("cs", ag_run(True)))
    miss = "missing on some ranks"
    assert [(r["rank"], r["seq"], r["matched"], r["reason"]) for r in rs] == [
        (0, 1, True, None), (0, 2, True, None), (0, 3, False, miss), (1, 1, True, None), (1, 2, True, None),
        (2, 1, True, None), (2, 2, True, None), (2, 3, False, miss)], rs
    assert rs[1]["instance"] == ("0", (0, 1, 2), (2, 1)) and rs[1]["size_bytes"] == 4 * N
    assert abs(rs[1]["busbw_gbps"] - rs[1]["algbw_gbps"] * 2 / 3) < 1e-9
    # only ranks 0 and 1 in the run; plus point-to-point, no process group, a pg_config fallback
    assert {r["reason"] for r in instances(pc[:2])} == {"the run holds 2 of the group's 3 ranks"}
    b = TraceBuilder(rank=0)
    b.kernel(SEND, 0, 5 * US, **_args("send"))
    b.kernel(AR, 10 * US, 15 * US, **_args(pg=None, ranks=None, size=None))
    b.kernel(AR, 20 * US, 25 * US, **_args(ranks="not json", size=None))
    assert [r["reason"] for r in instances(write("p", [b]))] == [
        "point-to-point", "no process group", "no group size"]
    cfg = {"rank": 0, "pg_config": [{"pg_name": "9", "ranks": [0], "pg_size": 1}]}
    rp = instances(write("q", [b], distributedInfo=cfg))
    assert [(r["pg_name"], r["members"], r["group_size"], r["matched"]) for r in rp[1:]] == [
        ("9", (0,), 1, True), ("0", None, None, False)], rp

    # (d) rank 0 of run (a) plus compute and a second, unmatched comm kernel (group "1", only rank 0):
    #   AllReduce [20, 30) us, dur 10, transfer 3 -> wait part [20, 27), transfer part [27, 30)
    #   comm2     [21, 23) us on stream 9: unmatched ("holds 1 of 2") -> all transfer [21, 23)
    #   gemm      [15, 25) and [28, 29) us on stream 8 -> window [15, 30) (first launched activity at 15)
    #   U(T) = [21, 23) + [27, 30) = 5;  U(W) - U(T) = [20, 21) + [23, 27) = 5;  total 10 = |U(comm)|
    #   exposed transfer = U(T) - compute = [27, 28) + [29, 30) = 2
    #   exposed wait     = ([20, 21) + [23, 27)) - [15, 25) = [25, 27) = 2;  2 + 2 = |[20,30) - compute| = 4
    bs = allreduce_run("d", (10, 7, 3))
    bs[0].kernel("gemm_kernel", 15 * US, 25 * US, stream=8, launch_ns=11 * US)
    bs[0].kernel("gemm_kernel", 28 * US, 29 * US, stream=8, launch_ns=12 * US)
    bs[0].kernel(AR, 21 * US, 23 * US, stream=9, launch_ns=13 * US, **_args(pg="1", ranks="[0, 2]", size=2))
    pd = write("d", bs)
    rd = instances(pd)
    assert rd[1]["reason"] == "the run holds 1 of the group's 2 ranks" and rd[1]["transfer_ns"] == 2 * US
    wd = _check_identities(pd)
    assert (wd[0]["start_ns"], wd[0]["end_ns"]) == (15 * US, 30 * US), wd[0]
    assert {k: wd[0][k] for k in SPLIT_KEYS + STRAGGLER_KEYS} == dict(
        comm_wait_ns=5 * US, comm_transfer_ns=5 * US, exposed_comm_wait_ns=2 * US,
        exposed_comm_transfer_ns=2 * US, matched_count=1, arrived_last_count=0, wait_caused_ns=0), wd[0]
    assert sr.step_metrics(pd[0])[0]["exposed_comm_ns"] == 4 * US
    wt = whole_trace_metrics(pd)
    assert all(wt[0][k] == wd[0][k] for k in SPLIT_KEYS + STRAGGLER_KEYS), (wt[0], wd[0])
    assert wt[2]["wait_caused_ns"] == 11 * US

    # (e) rooted collectives (rule 7r): a Broadcast then a Reduce, ranks 0-2 in one merged file (args.rank):
    #   Broadcast: rank 0 (root) [10, 14) us, rank 1 [12, 30), rank 2 [20, 30) -> rank 2 started last (20):
    #     waits min(4, 10) = 4, min(18, 8) = 8, 0; transfers 0, 10, 10; rank 2 caused 12; algbw = size / 10 us
    #   Reduce: rank 0 [40, 50), rank 1 [45, 60), rank 2 [45, 55) -> start tie at 45: rank 1 is the last
    #     waits 5, 0, 0; transfers 5, 15, 10; rank 1 caused 5
    timings = {0: ((10, 14), (40, 50)), 1: ((12, 30), (45, 60)), 2: ((20, 30), (45, 55))}

    def rooted(b, r, rank_arg):
        b.step(1, 0, 100 * US, rank=rank_arg)
        for coll, (a, z) in zip(("broadcast", "reduce"), timings[r]):
            b.kernel(AR, a * US, z * US, launch_ns=1 * US, rank=rank_arg, **_args(coll))

    merged = TraceBuilder(rank=None)
    for r in range(3):
        rooted(merged, r, r)
    pe = write("e", [merged])
    re_ = instances(pe)
    assert [(r["rank"], r["collective_type"], r["matched"], r["wait_ns"], r["transfer_ns"], r["arrived_last"])
            for r in re_] == [
        (0, "Broadcast", True, 4 * US, 0, False), (0, "Reduce", True, 5 * US, 5 * US, False),
        (1, "Broadcast", True, 8 * US, 10 * US, False), (1, "Reduce", True, 0, 15 * US, True),
        (2, "Broadcast", True, 0, 10 * US, True), (2, "Reduce", True, 0, 10 * US, False)], re_
    assert abs(re_[0]["algbw_gbps"] - 4 * N / 10000) < 1e-9 and re_[0]["busbw_gbps"] == re_[0]["algbw_gbps"]
    we = _check_identities(pe)
    assert [(w["rank"], w["comm_wait_ns"], w["comm_transfer_ns"], w["matched_count"], w["arrived_last_count"],
             w["wait_caused_ns"]) for w in we] == [
        (0, 9 * US, 5 * US, 2, 0, 0), (1, 8 * US, 25 * US, 2, 1, 5 * US), (2, 0, 20 * US, 2, 1, 12 * US)], we
    assert [x["wait_caused_ns"] for x in whole_trace_metrics(pe)] == [0, 5 * US, 12 * US]
    # the same kernels, one file per rank (clocks of their own): matched, but arrival is not inferable
    bs = []
    for r in range(3):
        bs.append(TraceBuilder(rank=r))
        rooted(bs[-1], r, None)
    pf = write("f", bs)
    rf = instances(pf)
    assert all(r["matched"] and r["reason"] is None and r["wait_ns"] == 0 and r["transfer_ns"] == r["dur_ns"]
               and not r["arrived_last"] and r["algbw_gbps"] is None and r["busbw_gbps"] is None for r in rf), rf
    assert len({r["instance"] for r in rf}) == 2
    assert all((w["comm_wait_ns"], w["matched_count"], w["arrived_last_count"], w["wait_caused_ns"]) == (0, 2, 0, 0)
               for w in _check_identities(pf))


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        _self_check(Path(d))
        sr.clear_caches()
    print("comm_reference self-check: OK")
