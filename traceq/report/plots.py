"""Plotly figures built from frames the library computed; nothing here reads the warehouse.

Every function takes polars frames and returns a ``plotly.graph_objects.Figure`` (plotly is
imported inside the functions so that ``import traceq`` stays light).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceq.catalog import NO_DEVICE

# The stack of one step: the five parts add up to the device window.
STACK = (
    ("compute", "compute_only_us", "#4C78A8"),
    ("overlapped comm", "overlapped_comm_us", "#72B7B2"),
    ("exposed comm", "exposed_comm_us", "#E45756"),
    ("exposed memcpy", "exposed_memcpy_us", "#F58518"),
    ("idle", "idle_us", "#BAB0AC"),
)
_LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 60, "b": 60}, "height": 420}


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _rank_label(run: str, rank: int, runs: int) -> str:
    return f"{run} r{rank}" if runs > 1 else f"rank {rank}"


def pick_ranks(rows: pl.DataFrame, max_ranks: int) -> pl.DataFrame:
    """At most ``max_ranks`` (run, rank) pairs: the slowest and fastest first, by mean step time."""
    means = rows.group_by("run", "rank").agg(pl.col("step_time_ms").mean().alias("t")).sort("t", descending=True)
    if means.height <= max_ranks:
        return rows
    half = max_ranks // 2
    keep = pl.concat([means.head(max_ranks - half), means.tail(half)]).select("run", "rank")
    return rows.join(keep, on=["run", "rank"], how="semi")


def step_breakdown_figure(rows: pl.DataFrame, max_ranks: int = 16) -> Any:
    """Stacked bars per (rank, step): compute / overlapped comm / exposed comm / exposed memcpy / idle (us),
    one panel per run with an axis of its own (a run of 13 s steps beside one of 0.1 s would flatten it).

    ``rows``: step rows of :func:`traceq.report.metrics.step_metrics` that have GPU activity.
    """
    from plotly.subplots import make_subplots

    go = _go()
    rows = pick_ranks(rows, max_ranks).with_columns(
        (pl.col("compute_us") - pl.col("overlapped_comm_us")).alias("compute_only_us")
    ).sort("run", "rank", "device", "step")
    runs = rows["run"].unique(maintain_order=True).to_list()
    fig = make_subplots(rows=len(runs), cols=1, subplot_titles=[f"run {r}" for r in runs] if len(runs) > 1 else None,
                        vertical_spacing=min(0.12, 0.3 / len(runs)))
    for at, run in enumerate(runs, start=1):
        part = rows.filter(pl.col("run") == run)
        labels = [f"rank {k}" + (f" d{d}" if d not in (None, NO_DEVICE, 0) else "") for k, d in part.select("rank", "device").iter_rows()]
        x = [labels, [str(s) for s in part["step"].to_list()]]
        for name, column, color in STACK:
            fig.add_trace(go.Bar(
                name=name, x=x, y=part[column].to_list(), marker_color=color, legendgroup=name, showlegend=at == 1,
                hovertemplate=f"{run}<br>{name}: %{{y:,.1f}} us<br>%{{x}}<extra></extra>",
            ), row=at, col=1)
        fig.update_yaxes(title_text="us (stack = window)", row=at, col=1)
    fig.update_xaxes(title_text="rank / step", row=len(runs), col=1)
    fig.update_layout(barmode="stack", title="Where each step's device window goes (per rank and step)",
                      **{**_LAYOUT, "height": 120 + 300 * len(runs)})
    return fig


def summary_figure(table: pl.DataFrame, grain: list[str]) -> Any:
    """Stacked bars per row of a summary (``traceq summary``): the shares of the device window (compute
    alone, overlapped comm, exposed comm, exposed memcpy, idle), which add up to 100 %."""
    go = _go()
    varying = [c for c in grain if table[c].n_unique() > 1] or grain[:1]  # a column the same in every row names none
    labels = [" · ".join(f"{c} {v}" if c in ("rank", "step", "device") else str(v) for c, v in zip(varying, values))
              for values in table.select(varying).iter_rows()]
    shares = table.with_columns((pl.col("compute_pct") - pl.col("overlapped_comm_pct")).alias("compute_only_pct"))
    fig = go.Figure()
    for name, column, color in STACK:
        pct = column.replace("_us", "_pct")
        fig.add_trace(go.Bar(name=name, x=labels, y=shares[pct].to_list(), marker_color=color,
                             hovertemplate=f"{name}: %{{y:.1f}} %<br>%{{x}}<extra></extra>"))
    fig.update_layout(barmode="stack", title="Where the device window goes (% of it)", yaxis_title="% of the device window",
                      yaxis_range=[0, 100], **_LAYOUT)
    return fig


def step_time_figure(rows: pl.DataFrame, max_ranks: int = 16) -> Any:
    """Bars of step_time_ms per (rank, step): the fallback when the traces have no GPU activity."""
    go = _go()
    rows = pick_ranks(rows.unique(subset=["run", "rank", "step"], keep="first"), max_ranks).sort("run", "rank", "step")
    n_runs = rows["run"].n_unique()
    x = [[_rank_label(r, k, n_runs) for r, k in rows.select("run", "rank").iter_rows()],
         [str(s) for s in rows["step"].to_list()]]
    fig = go.Figure(go.Bar(name="step time", x=x, y=rows["step_time_ms"].to_list(), marker_color="#4C78A8",
                           hovertemplate="step time: %{y:,.2f} ms<br>%{x}<extra></extra>"))
    fig.update_layout(title="Step time per rank and step (no activity in these traces)",
                      yaxis_title="ms", xaxis_title="rank / step", showlegend=True, **_LAYOUT)
    return fig


def collective_figure(by_collective: pl.DataFrame) -> Any:
    """Grouped bars: mean exposed comm per step (us) by collective type, one bar colour per run.

    ``by_collective``: columns run, collective_type, exposed_comm_by_collective_us.
    """
    go = _go()
    fig = go.Figure()
    for (run,), part in by_collective.sort("run", "collective_type").group_by("run", maintain_order=True):
        fig.add_trace(go.Bar(name=str(run), x=part["collective_type"].to_list(),
                             y=part["exposed_comm_by_collective_us"].to_list(),
                             hovertemplate="%{x}: %{y:,.1f} us per step<extra>" + str(run) + "</extra>"))
    fig.update_layout(barmode="group", title="Exposed communication by collective type (mean per rank and step)",
                      yaxis_title="us per step", showlegend=True, **_LAYOUT)
    return fig


def wait_heatmap_figure(waits: pl.DataFrame, max_ranks: int = 512) -> Any:
    """Heatmap of each rank's waiting at collectives (comm_wait_us), ranks x steps, one panel per run.

    ``waits``: columns run, rank, step, comm_wait_us. Runs with more than ``max_ranks`` ranks show the
    ``max_ranks`` that waited most in all.
    """
    go = _go()
    from plotly.subplots import make_subplots

    runs = sorted(waits["run"].unique().to_list())
    fig = make_subplots(rows=len(runs), cols=1, subplot_titles=[f"run {r}" for r in runs], vertical_spacing=0.12)
    for i, run in enumerate(runs, start=1):
        part = waits.filter(pl.col("run") == run)
        top = part.group_by("rank").agg(pl.col("comm_wait_us").sum()).sort("comm_wait_us", descending=True).head(max_ranks)
        part = part.filter(pl.col("rank").is_in(top["rank"].implode()))
        grid = part.pivot(on="step", index="rank", values="comm_wait_us", aggregate_function="sum").sort("rank")
        steps = sorted((c for c in grid.columns if c != "rank"), key=int)
        fig.add_trace(go.Heatmap(
            x=steps, y=[str(r) for r in grid["rank"].to_list()], z=[list(r) for r in grid.select(steps).rows()],
            coloraxis="coloraxis", hovertemplate="rank %{y}, step %{x}: %{z:,.1f} us waiting<extra>" + str(run) + "</extra>",
        ), row=i, col=1)
        fig.update_xaxes(title_text="step", type="category", row=i, col=1)
        fig.update_yaxes(title_text="rank", type="category", row=i, col=1)
    fig.update_layout(title="Waiting for the last rank at collectives (comm_wait_us per rank and step)",
                      coloraxis={"colorscale": "Reds", "colorbar": {"title": "us"}},
                      **{**_LAYOUT, "height": max(360, 300 * len(runs))})
    return fig


def busbw_figure(table: pl.DataFrame) -> Any:
    """Bus bandwidth (GB/s) against message size (bytes, log), one line per (run, collective type) and, where
    the table has them, NCCL algorithm and protocol (a Ring and a Tree AllReduce are two lines).

    ``table``: rows of :func:`traceq.report.collectives.collectives_report` by run, collective_type and
    size_bucket (matched instances).
    """
    go = _go()
    fig = go.Figure()
    rows = table.filter(pl.col("busbw_gbps").is_not_null() & pl.col("size_bytes").is_not_null())
    keys = ["run", "collective_type", *[c for c in ("nccl_algo", "nccl_proto") if c in rows.columns]]
    for key, part in rows.sort(*keys, "size_bytes", nulls_last=True).group_by(*keys, maintain_order=True):
        run, kind, *nccl = key
        label = " ".join([kind, *[str(v) for v in nccl if v is not None]])
        fig.add_trace(go.Scatter(
            name=f"{label} ({run})", x=part["size_bytes"].to_list(), y=part["busbw_gbps"].to_list(),
            mode="lines+markers", text=part["count"].to_list(),
            hovertemplate="%{x:,.0f} bytes: %{y:,.1f} GB/s (%{text} instances)<extra></extra>",
        ))
    fig.update_layout(title="Bus bandwidth against message size (matched collectives, nccl-tests busbw)",
                      xaxis_title="message size (bytes)", yaxis_title="busbw (GB/s)", showlegend=True, **_LAYOUT)
    fig.update_xaxes(type="log")
    return fig


def scaling_figure(table: pl.DataFrame, group: list[str] | None = None) -> Any:
    """Global tokens/s against world size, measured and ideal (linear from the smallest run)."""
    go = _go()
    group = group or []
    fig = go.Figure()
    parts = table.partition_by(group, maintain_order=True) if group else [table]
    for part in parts:
        part = part.filter(pl.col("global_tokens_per_s").is_not_null()).sort("world_size")
        if part.height == 0:
            continue
        tag = " ".join(f"{c}={part[c][0]}" for c in group)
        suffix = f" ({tag})" if tag else ""
        fig.add_trace(go.Scatter(
            name="measured" + suffix, x=part["world_size"].to_list(), y=part["global_tokens_per_s"].to_list(),
            mode="lines+markers", text=part["run"].to_list(),
            hovertemplate="%{text}<br>world size %{x}: %{y:,.0f} tokens/s<extra></extra>",
        ))
        fig.add_trace(go.Scatter(
            name="ideal (linear)" + suffix, x=part["world_size"].to_list(), y=part["ideal_tokens_per_s"].to_list(),
            mode="lines", line={"dash": "dash"}, hovertemplate="ideal at %{x}: %{y:,.0f} tokens/s<extra></extra>",
        ))
    fig.update_layout(title="Scaling: global tokens/s against world size", xaxis_title="world size (GPUs / ranks)",
                      yaxis_title="global tokens/s", showlegend=True, **_LAYOUT)
    fig.update_xaxes(type="log", dtick=0.30102999566)  # ticks at powers of two
    return fig


def power_figure(series: pl.DataFrame, windows: pl.DataFrame, max_lines: int = 16, max_steps: int = 200) -> Any:
    """NVML power (W) over time, one line per (run, rank, GPU), with the first rank's step boundaries.

    ``series``: run, rank, gpu, wall_ns, power_w; ``windows``: run, rank, step, start_wall_ns, end_wall_ns.
    Time is seconds since the first sample of the run.
    """
    go = _go()
    fig = go.Figure()
    t0 = series.group_by("run").agg(pl.col("wall_ns").min().alias("t0"))
    series = series.join(t0, on="run").with_columns(((pl.col("wall_ns") - pl.col("t0")) / 1e9).alias("t_s"))
    for n, ((run, rank, gpu), part) in enumerate(series.group_by("run", "rank", "gpu", maintain_order=True)):
        if n >= max_lines:
            break
        fig.add_trace(go.Scatter(name=f"{run} r{rank} gpu{gpu}", x=part["t_s"].to_list(), y=part["power_w"].to_list(),
                                 mode="lines", hovertemplate="%{x:.2f} s: %{y:.0f} W<extra></extra>"))
    first = windows.join(t0, on="run").sort("run", "rank", "step")
    if first.height:
        run0, rank0 = first.row(0, named=True)["run"], first.row(0, named=True)["rank"]
        first = first.filter((pl.col("run") == run0) & (pl.col("rank") == rank0)).head(max_steps)
        for r in first.iter_rows(named=True):
            x = (r["start_wall_ns"] - r["t0"]) / 1e9
            fig.add_vline(x=x, line_width=1, line_dash="dot", line_color="#888")
        fig.add_trace(go.Scatter(name=f"step starts ({run0} r{rank0})", x=[None], y=[None], mode="lines",
                                 line={"dash": "dot", "color": "#888"}))
    fig.update_layout(title="GPU power over time (NVML; dotted lines: step starts)", xaxis_title="s since the first sample",
                      yaxis_title="W", showlegend=True, **_LAYOUT)
    return fig


def diff_figure(changes: pl.DataFrame, a: str, b: str) -> Any:
    """Horizontal bars: the % change from A to B of each quantity that moved beyond its spread."""
    go = _go()
    rows = changes.sort("delta_pct")
    labels = [f"{n} ({s})" if s != "metric" else n for s, n in zip(rows["section"], rows["name"])]
    fig = go.Figure(go.Bar(x=rows["delta_pct"].to_list(), y=labels, orientation="h",
                           marker_color=["#c0392b" if v > 0 else "#2471a3" for v in rows["delta_pct"]]))
    fig.update_layout(title=f"B ({b}) against A ({a}), % change", xaxis_title="% change from A",
                      height=max(300, 24 * rows.height + 120), margin={"l": 260})
    return fig


# the critical path's kinds, in the order of the legend
PATH_COLOURS = {
    "compute": "#4C78A8", "comm_transfer": "#E45756", "comm_wait": "#FF9DA6", "memcpy": "#F58518",
    "memset": "#FFBF79", "idle_host_bound": "#B279A2", "idle_sync": "#9D755D", "idle_other": "#BAB0AC",
    "idle_unknown": "#E0DCD8",
}


def critical_path_figure(segments: pl.DataFrame, jumps: pl.DataFrame, step: int, start_ns: int) -> Any:
    """One step's critical path: the ranks it crosses as lanes, its segments as bars on the time of the
    last-ending rank (ms from the step's start), coloured by kind, and its jumps between ranks at the
    collectives as dashed lines."""
    go = _go()
    seg = segments.filter(pl.col("step") == step).with_columns(
        ((pl.col("path_start_ns") - start_ns) / 1e6).alias("x0"), (pl.col("dur_ns") / 1e6).alias("ms"),
        pl.format("rank {}", pl.col("rank")).alias("lane"))
    lanes = [f"rank {r}" for r in sorted(seg["rank"].unique().to_list())]
    fig = go.Figure()
    for kind, colour in PATH_COLOURS.items():
        part = seg.filter(pl.col("kind") == kind)
        if not part.height:
            continue
        fig.add_trace(go.Bar(
            orientation="h", base=part["x0"].to_list(), x=part["ms"].to_list(), y=part["lane"].to_list(),
            name=kind.replace("_", " "), marker={"color": colour, "line": {"width": 0}},
            customdata=[[n or "", c or ""] for n, c in zip(part["name"].to_list(), part["collective_type"].to_list())],
            hovertemplate="%{y}: %{x:.3f} ms from %{base:.3f}<br>%{customdata[0]}<br>%{customdata[1]}<extra>"
                          + kind.replace("_", " ") + "</extra>",
        ))
    for j in jumps.filter(pl.col("step") == step).iter_rows(named=True):
        x = (j["path_ns"] - start_ns) / 1e6
        fig.add_trace(go.Scatter(
            x=[x, x], y=[f"rank {j['from_rank']}", f"rank {j['to_rank']}"], mode="lines+markers",
            line={"dash": "dash", "color": "#222", "width": 1}, showlegend=False,
            hovertemplate=f"rank {j['from_rank']} waits for rank {j['to_rank']} at {j['collective_type']} "
                          f"({j['wait_on_path_ns'] / 1e6:.3f} ms of waiting on the path)<extra>jump</extra>",
        ))
    fig.update_layout(**{**_LAYOUT, "height": max(260, 90 + 48 * len(lanes))},
                      title=f"Step {step}: the critical path across ranks", barmode="overlay",
                      xaxis_title="ms from the step's start (the last-ending rank's clock)",
                      yaxis={"categoryorder": "array", "categoryarray": lanes[::-1]})
    return fig
