"""Each kind of finding of ``traceq explain`` (docs/explanation/findings.md), read off
:class:`~traceq.report.findings.Figures`: exposed communication by collective type, waiting for a late rank,
idle by cause, exposed memcpy, compute by kernel category with MFU, step-time variation, power and energy
per token, the critical path per rank, and, where an input is missing, what would enable the finding."""

from __future__ import annotations

from traceq.report.findings import (
    MIN_PCT,
    PATH_TOP,
    Evidence,
    Figures,
    Finding,
    kept,
    ms_text,
    number,
    pct_text,
    short,
)

IDLE_CAUSES = {  # idle part -> (its name, what it is in a reader's words)
    "idle_host_bound": ("Host-bound idle", "the GPU waits for the CPU to launch work"),
    "idle_sync": ("Idle in a synchronize", "the host is held in a synchronize while the GPU has nothing queued"),
    "idle_other": ("Launched, not started", "work waits between its launch and its start (launch latency, a stream "
                   "waiting on an event)"),
    "idle_unknown": ("Idle of unknown cause", "the trace has no launch events to say why; a trace with CPU activity "
                     "(ProfilerActivity.CPU) would split it into host-bound, sync and other"),
}
CATEGORY_SHARE = 10.0  # a kernel category below this share of kernel time is no finding of its own
CATEGORIES_SHOWN = 3
OUTLIER = 1.2  # a rank-step this many times the median step time is an outlier


def us_text(us: float) -> str:
    """A kernel's time: in us below 1 ms, else in ms."""
    return f"{number(us)} us" if us < 1000 else ms_text(us / 1000)


def _large(finding: Finding) -> bool:
    return finding.pct_of_step is None or finding.pct_of_step >= MIN_PCT


def communication(fig: Figures, run: str) -> list[Finding]:
    """Exposed communication per collective type, with its instances' wait and transfer (``collectives``)."""
    types = fig.rows(fig.by_type, run)
    if types is None:
        return []
    step = fig.metric(run, "step_time_ms", "step_time")
    out = []
    for ctype, us in types.select("collective_type", "exposed_comm_by_collective_us").rows():
        amount = Evidence(fig.command(run, "report", "--metric", "exposed_comm_by_collective_us", "--by", "run"),
                          "exposed_comm_by_collective_us", (("run", run), ("collective_type", ctype)), float(us),
                          role="amount")
        text = f"Exposed {ctype} costs {ms_text(amount.value / 1000)} a step{pct_text(amount.value / 1000, step and step.value)}"
        context = []
        coll = fig.rows(fig.collectives, run, collective_type=ctype)
        if coll is not None:
            # the row (algorithm, protocol, basis) with the most transfer time: matched rows before lower bounds
            row = coll.sort([coll["basis"] == "matched", coll["transfer_us"] * coll["count"]], descending=True,
                            nulls_last=True).row(0, named=True)
            keys = [k for k in ("nccl_algo", "nccl_proto") if k in coll.columns]
            where = (("run", run), ("collective_type", ctype), *((k, row[k]) for k in keys), ("basis", row["basis"]))
            cmd = fig.command(run, "collectives", "--by", "run,collective_type")
            context = [Evidence(cmd, c, where, float(row[c])) for c in ("transfer_us", "wait_us", "busbw_gbps")
                       if row[c] is not None]
            named = "/".join(row[k] for k in keys if row[k])
            whose = f"its {named} instances each" if named else "each instance"
            if row["basis"] == "matched":
                text += f"; {whose} moved data for {us_text(row['transfer_us'])}"
                if row["wait_us"] is not None:
                    text += f" after {us_text(row['wait_us'])} of waiting per rank"
            else:
                text += f"; {whose} took {us_text(row['transfer_us'])} (not matched across ranks)"
            if row["busbw_gbps"] is not None:
                text += f", busbw {number(row['busbw_gbps'])} GB/s"
        path = fig.path_sum(run, kind="comm_transfer", collective_type=ctype)
        most = None  # the path gives overlapping collectives' time to one of them: no more than a rank's own
        per_rank = fig.rows(fig.by_type_ranks, run, collective_type=ctype)
        if path is not None and per_rank is not None:
            top = per_rank.sort("exposed_comm_by_collective_us", descending=True).row(0, named=True)
            most = Evidence(fig.command(run, "report", "--metric", "exposed_comm_by_collective_us", "--by", "run,rank"),
                            "exposed_comm_by_collective_us", (("run", run), ("rank", top["rank"]), ("collective_type", ctype)),
                            float(top["exposed_comm_by_collective_us"]), role="bound")
        finding = Finding.of(run, "exposed_comm", f"exposed {ctype}", text, kept(
            amount, step, *context, path, most, fig.path_count(run, "bound_steps")), fig.command(run, "collectives", "--by", "run,collective_type,size_bucket"))
        out.append(finding)
    return out


def waiting(fig: Figures, run: str) -> list[Finding]:
    """Exposed communication spent waiting for the last rank, and the rank that arrives last most."""
    wait = fig.metric(run, "exposed_comm_wait_us", "amount")
    ranks = fig.rows(fig.metrics, run)
    exposed = fig.metric(run, "exposed_comm_us")
    step = fig.metric(run, "step_time_ms", "step_time")
    if ranks is not None and ranks["ranks"][0] == 1 and exposed and step and exposed.value / 10 >= MIN_PCT * step.value:
        return [Finding(run, "missing", "wait vs transfer", "Who the others wait for at collectives: the run holds one rank's trace; "
                        "ingest every rank's trace of the run to split its communication into wait and transfer",
                        (exposed,), fig.command(run, "collectives"))]
    stragglers = fig.rows(fig.stragglers, run)
    if stragglers is None and exposed and step and exposed.value / 10 >= MIN_PCT * step.value:
        return [Finding(run, "missing", "wait vs transfer", "Who the others wait for at collectives: no collective "
                        "of the run was matched across its ranks, so its communication is not split into wait and "
                        "transfer (traceq collectives says why: process groups, counts that differ)", (exposed,),
                        fig.command(run, "collectives"))]
    if wait is None or wait.value == 0 or stragglers is None:
        return []
    top = stragglers.row(0, named=True)  # the rank that caused the most waiting first
    r = top["rank"]
    where = (("run", run), ("rank", r))
    share = Evidence(fig.command(run, "stragglers"), "arrived_last_share", where, float(top["arrived_last_share"]))
    count = Evidence(fig.command(run, "stragglers"), "arrived_last_count", where, float(top["arrived_last_count"]))
    ms = wait.value / 1000
    text = (f"Waiting for the last rank at collectives costs {ms_text(ms)} a step{pct_text(ms, step and step.value)}, "
            f"exposed; rank {r} arrives last at {top['arrived_last_share'] * 100:.0f} % of them "
            f"({top['arrived_last_count']} of {top['matched_count']})")
    context = [share, count]
    host = fig.metric(run, "idle_host_bound_us", rank=r)
    others = fig.rows(fig.ranks, run)
    if host is not None and others is not None and others.height > 1:
        rest = others.filter(others["rank"] != r).sort("idle_host_bound_us", descending=True, nulls_last=True)
        most = fig.metric(run, "idle_host_bound_us", rank=rest["rank"][0])
        if most is not None:
            text += (f"; rank {r}'s host-bound idle is {ms_text(host.value / 1000)} a step, the others' at most "
                     f"{ms_text(most.value / 1000)}")
            context += [host, most]
    caused = None
    path = fig.rows(fig.path_ranks, run)
    if path is not None:
        total = float(path["wait_caused_ms"].sum())
        if path["rank"][0] == r:  # the late rank holds the path: its own time bounds the step, not the waiting
            text += f"; the critical path runs on rank {r} itself, so its own findings bound the step"
        caused = Evidence(fig.command(run, "critical-path", "--ranks"), "wait_caused_ms", (("run", run),), total, "sum",
                          "bound_total")
    return [Finding.of(run, "comm_wait", "waiting for the last rank", text, kept(wait, step, *context, caused, fig.path_count(run, "bound_steps")),
                       fig.command(run, "stragglers", "--by-step"))]


def idle(fig: Figures, run: str) -> list[Finding]:
    """Idle by cause (host-bound, sync, other, unknown): the run's mean and the rank with the most."""
    step = fig.metric(run, "step_time_ms", "step_time")
    per_rank = fig.rows(fig.ranks, run)
    path_idle = fig.path_mean(run, "idle_ms")
    out = []
    for part, (name, what) in IDLE_CAUSES.items():
        amount = fig.metric(run, f"{part}_us", "amount")
        if amount is None or amount.value <= 0 or per_rank is None:
            continue
        ms = amount.value / 1000
        top = per_rank.sort(f"{part}_us", descending=True, nulls_last=True)["rank"][0]
        most = fig.metric(run, f"{part}_us", "bound" if path_idle else "", rank=top)
        text = f"{name}: {what}: {ms_text(ms)} a step{pct_text(ms, step and step.value)}"
        if per_rank.height > 1 and most is not None:
            text += f"; most on rank {top} ({ms_text(most.value / 1000)})"
        out.append(Finding.of(run, part, name.lower(), text, kept(amount, step, most, path_idle),
                              fig.command(run, "critical-path", "--segments")))
    return out


def memcpy(fig: Figures, run: str) -> list[Finding]:
    """Exposed memcpy/memset, and the copy with the most time (``kernels``)."""
    amount = fig.metric(run, "exposed_memcpy_us", "amount")
    if amount is None or amount.value <= 0:
        return []
    step = fig.metric(run, "step_time_ms", "step_time")
    ms = amount.value / 1000
    text = f"Exposed memcpy/memset costs {ms_text(ms)} a step{pct_text(ms, step and step.value)}"
    copies = fig.rows(fig.kernels, run)
    context = []
    if copies is not None:
        copies = copies.filter(copies["class"].is_in(["memcpy", "memset"]))
        if copies.height:
            name = copies["name"][0]
            text += f"; mostly {name}"
            context.append(Evidence(fig.command(run, "kernels", "--top", str(PATH_TOP)), "total_ms",
                                    (("run", run), ("name", name)), float(copies["total_ms"][0])))
    return [Finding.of(run, "exposed_memcpy", "exposed memcpy/memset", text, kept(amount, step, *context, fig.path_mean(run, "copy_ms")),
                       fig.command(run, "kernels", "--level", "category"))]


def compute(fig: Figures, run: str) -> list[Finding]:
    """The kernel categories that dominate compute (``kernels --level category``), with their top kernel, and
    MFU against the peak on the first."""
    cats = fig.rows(fig.categories, run, **{"class": "compute"})
    summary = fig.rows(fig.summary, run)
    if cats is None or summary is None:
        return []
    step = fig.metric(run, "step_time_ms", "step_time")
    steps = Evidence(fig.command(run, "summary", "--by", "run"), "steps", (("run", run),), float(summary["steps"][0]),
                     role="amount_steps")
    mfu = fig.metric(run, "mfu")
    cmd = fig.command(run, "kernels", "--level", "category", "--top", str(PATH_TOP))
    out = []
    for row in cats.head(CATEGORIES_SHOWN).iter_rows(named=True):
        if row["share_pct"] < CATEGORY_SHARE or not steps.value:
            continue
        where = (("run", run), ("class", "compute"), ("category", row["category"]))
        total = Evidence(cmd, "total_ms", where, float(row["total_ms"]), role="amount")
        share = Evidence(cmd, "share_pct", where, float(row["share_pct"]))
        ms = row["total_ms"] / steps.value
        text = (f"{row['category']} kernels run {ms_text(ms)} a step{pct_text(ms, step and step.value)}, "
                f"{row['share_pct']:.0f} % of kernel time")
        context = [share]
        top = fig.rows(fig.kernels, run, category=row["category"])
        if top is not None:
            text += f", most in {short(top['name'][0])}"
            context.append(Evidence(fig.command(run, "kernels", "--top", str(PATH_TOP)), "total_ms",
                                    (("run", run), ("name", top["name"][0])), float(top["total_ms"][0])))
        if not out and mfu is not None:
            text += f"; MFU {mfu.value * 100:.1f} % of the GPU's peak"
            context.append(mfu)
        out.append(Finding.of(run, "compute", f"{row['category']} kernels", text, kept(
            total, steps, step, *context, fig.path_sum(run, kind="compute", category=row["category"]),
            fig.path_count(run, "bound_steps")), fig.command(run, "kernels", "--top", "20")))
    if out and mfu is None:
        out.append(Finding(run, "missing", "MFU", "MFU against the peak: the run lacks model FLOPs or a known GPU peak; set "
                           f"them with traceq runs set {run} --flops-per-step F (or --model-flops-per-token F, "
                           "--peak-tflops P)", (), fig.command(run, "report", "--metric", "mfu", "--by", "run")))
    return out


def variation(fig: Figures, run: str) -> list[Finding]:
    """Step time that varies: on the rank whose mean step time exceeds its median most (``report --metric
    step_time_ms --by run,rank``: mean, median, p10, p90 over its steps), by how much, and its outlier steps."""
    per_rank = fig.rows(fig.ranks, run)
    steps = fig.rows(fig.steps, run)
    if per_rank is None or steps is None or "step_time_ms_median" not in per_rank.columns:
        return []
    per_rank = per_rank.filter(per_rank["step_time_ms_median"].is_not_null())
    if not per_rank.height:
        return []
    r = per_rank.sort(per_rank["step_time_ms"] - per_rank["step_time_ms_median"], descending=True)["rank"][0]
    mean, median = fig.metric(run, "step_time_ms", "amount", rank=r), fig.metric(run, "step_time_ms_median", "amount_minus", rank=r)
    p10, p90 = fig.metric(run, "step_time_ms_p10", rank=r), fig.metric(run, "step_time_ms_p90", rank=r)
    mine = steps.filter((steps["rank"] == r) & (steps["step"] >= 0))
    if None in (mean, median, p10, p90) or mine["step"].n_unique() < 3:
        return []
    outliers = mine.filter(mine["step_time_ms"] > OUTLIER * median.value).sort("step_time_ms", descending=True)
    if mean.value <= median.value or (not outliers.height and (mean.value - median.value) < MIN_PCT / 100 * mean.value):
        return []
    where = "" if per_rank.height == 1 else f" on rank {r}"
    text = (f"Step time varies{where}: {ms_text(mean.value - median.value)} a step above the median of "
            f"{ms_text(median.value)} on average (p10 {number(p10.value)}, p90 {number(p90.value)} ms)")
    cmd = fig.command(run, "report", "--metric", "step_time_ms", "--by", "run,rank,step")
    worst = outliers.head(3).rows(named=True)
    if worst:
        text += "; outliers: " + ", ".join(f"step {w['step']} {ms_text(w['step_time_ms'])}" for w in worst)
    context = [Evidence(cmd, "step_time_ms", (("run", run), ("rank", r), ("step", w["step"])), float(w["step_time_ms"]))
               for w in worst]
    step = Evidence(mean.command, mean.column, mean.where, mean.value, role="step_time")
    focus = worst[0]["step"] if worst else mine.sort("step_time_ms", descending=True)["step"][0]
    return [Finding.of(run, "step_variation", "step-time variation", text, kept(mean, median, step, p10, p90, *context),
                       fig.command(run, "critical-path", "--steps", f"{focus}:{focus}", "--segments"))]


def power(fig: Figures, run: str) -> list[Finding]:
    """Power and energy per step, tokens per joule; or what would enable them."""
    watts, joules, per_j = fig.metric(run, "power_w"), fig.metric(run, "energy_j"), fig.metric(run, "tokens_per_j")
    if watts is None and joules is None:
        return [Finding(run, "missing", "power", "Power and energy per token: no power figures (the run's note says "
                        "why: no power log, or no NVML where it ran); record it with traceq's collectors on a machine "
                        "with NVML and ingest the rank*.power.jsonl files beside the traces", (),
                        fig.command(run, "report", "--metric", "power_w", "--by", "run"))]
    parts = ([f"its GPUs draw {number(watts.value)} W"] if watts else []) + (
        [f"{number(joules.value)} J a step each"] if joules else [])
    text = "Power: " + ", ".join(parts)
    text += (f", {number(per_j.value)} tokens per joule" if per_j else
             f"; tokens per joule needs tokens_per_step (traceq runs set {run} --tokens-per-step N)")
    return [Finding(run, "power", "power", text, tuple(kept(watts, joules, per_j)),
                    fig.command(run, "report", "--metric", "power_w,energy_j,tokens_per_j", "--by", "run,rank"))]


def path_ranks(fig: Figures, run: str) -> list[Finding]:
    """What the critical path says per rank: the rank most on it, its compute there, the waiting it caused."""
    ranks = fig.rows(fig.path_ranks, run)
    if ranks is None:
        why = fig.missing.get("critical_path")
        return [Finding(run, "missing", "critical path", f"The critical path: {why}", (), fig.command(run, "critical-path"))] if why else []
    top = ranks.row(0, named=True)
    where = (("run", run), ("rank", top["rank"]))
    cmd = fig.command(run, "critical-path", "--ranks")
    critical = Evidence(cmd, "critical_ms", where, float(top["critical_ms"]), role="amount")
    steps = Evidence(cmd, "steps", where, float(top["steps"]), role="amount_steps")
    comp = Evidence(cmd, "compute_ms", where, float(top["compute_ms"]))
    per = top["critical_ms"] / top["steps"]
    if ranks.height > 1:
        text = (f"The critical path runs {top['share'] * 100:.0f} % on rank {top['rank']}: {ms_text(per)} a step, "
                f"{ms_text(top['compute_ms'] / top['steps'])} of it compute")
    else:
        text = (f"The critical path stays on rank {top['rank']}: {ms_text(per)} a step, "
                f"{ms_text(top['compute_ms'] / top['steps'])} of it compute")
    evidence = [critical, steps, comp, Evidence(cmd, "share", where, float(top["share"]))]
    if top["waited_for"]:
        text += (f"; the others wait for it {top['waited_for']} times, {ms_text(top['wait_caused_ms'])} "
                 "in all on the path")
        evidence += [Evidence(cmd, "waited_for", where, float(top["waited_for"])),
                     Evidence(cmd, "wait_caused_ms", where, float(top["wait_caused_ms"]))]
    found = Finding.of(run, "critical_path", "critical path", text, evidence, cmd)  # its share of the path says how much
    return [Finding(found.run, found.kind, found.topic, found.text, found.evidence, found.next, found.ms_per_step,
                    found.pct_of_step, None)]  # context, not a cause: no bound of its own


KINDS = (communication, waiting, idle, memcpy, compute, variation, power, path_ranks)


def findings_of(fig: Figures, run: str) -> tuple[list[Finding], list[Finding]]:
    """The findings of ``run``: (those shown, those of time below :data:`MIN_PCT` of the step)."""
    found = [f for kind in KINDS for f in kind(fig, run)]
    return [f for f in found if _large(f)], [f for f in found if not _large(f)]
