"""The link counters drawn for the HTML report (nsys GPU metrics; metrics/link_counters.py): the
timeline's PCIe and NVLink rows of each rank, under its NCCL lanes, and per rank a section with its
figures (traceguard.report.links) and a chart of each step's link load.

Everything is read from the report document: ``timeline.ranks[].link_lane`` (buckets of consecutive
samples, each with its mean and its peak, % of the link's peak) and ``ranks[].links`` / the step
rows' link fields. A rank without GPU metrics gets its reason instead of rows and charts.

The timeline's y axis lists its rows as categories; a link row is a category too (a thin base
line), and its load is drawn on a second, numeric y axis laid over the first with the same range,
so that 0–100 % fills the row's band: the mean as an area, the peak as a line above it.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from traceguard.report.links import (
    SPLIT_HEADER,
    STATS_HEADER,
    TITLE,
    null_reason,
    source_line,
    split_line,
    split_rows,
    stats_rows,
)

#: The links of a lane: (key in link_lane, row label, colour, translucent fill).
LINK_ROWS = (
    ("pcie", "PCIe %", "#9a6700", "rgba(212,167,44,0.55)"),
    ("nvlink", "NVLink %", "#1a7f37", "rgba(45,164,78,0.5)"),
)
#: The share of a row's height that 0–100 % spans (rows are one category apart).
BAND = 0.8
#: Trace kinds of a link row (``meta.kind``): the row's category (transparent), its 0 % line on the
#: numeric axis (the area's base), the mean (the area) and the peak (the line).
LINK_KINDS = ("link", "link_base", "link_avg", "link_peak")


def _e(value: Any) -> str:
    return html.escape(str(value))


def link_lanes(doc: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """Per rank its ``link_lane`` with buckets, and the reasons of the ranks without one."""
    lanes: dict[int, dict[str, Any]] = {}
    reasons = []
    for rank in (doc.get("timeline") or {}).get("ranks", []):
        lane = rank.get("link_lane") or {"null_reason": "not in this report (made before the link counters)"}
        if lane.get("start"):
            lanes[rank["rank"]] = lane
        else:
            reasons.append(f"rank {rank['rank']}: {lane.get('null_reason') or 'no samples'}")
    return lanes, reasons


def link_rows(rank: int, lane: dict[str, Any]) -> list[tuple[str, str]]:
    """The timeline rows of a rank's link lane: (row name, link key) for the links it has values of."""
    return [
        (f"rank {rank} · {label}", key)
        for key, label, _, _ in LINK_ROWS
        if any(v is not None for v in lane.get(f"{key}_avg") or [])
    ]


def add_link_row(fig: go.Figure, rank: int, row: str, key: str, lane: dict[str, Any], offset: int) -> None:
    """The row's category on the lanes' axis (a transparent line over the lane's span: the load is
    drawn on the numeric axis, :func:`add_link_load`)."""
    fig.add_scatter(
        x=[(lane["start"][0] + offset) / 1e6, (lane["end"][-1] + offset) / 1e6],
        y=[row, row],
        mode="lines",
        line={"color": "rgba(0,0,0,0)", "width": 1},
        hoverinfo="skip",
        showlegend=False,
        meta={"rank": rank, "lane": row.split(" · ", 1)[1], "kind": "link"},
    )


def add_link_load(
    fig: go.Figure, rank: int, row: str, key: str, lane: dict[str, Any], offset: int, position: int
) -> None:
    """The row's load on the overlaid numeric axis ``y2``: row ``position`` (its category's index)
    spans position ± BAND/2; each bucket's mean as an area from the row's base, its peak as a line.
    A bucket is drawn up to its last sample's time from the previous bucket's (a sample averages the
    period before it)."""
    label = next(lb for k, lb, _, _ in LINK_ROWS if k == key)
    colour, fill = next((c, f) for k, _, c, f in LINK_ROWS if k == key)
    base = position - BAND / 2
    x = [(end + offset) / 1e6 for end in lane["end"]]
    avg, peak = lane[f"{key}_avg"], lane[f"{key}_peak"]

    def scaled(values: list[float | None]) -> list[float | None]:
        return [None if v is None else base + BAND * min(max(v, 0.0), 100.0) / 100 for v in values]

    name = f"{label.removesuffix(' %')} load (area: mean, line: peak)"
    lane_name = row.split(" · ", 1)[1]
    fig.add_scatter(
        x=[x[0], x[-1]],
        y=[base, base],
        yaxis="y2",
        mode="lines",
        line={"width": 0.5, "color": colour},
        hoverinfo="skip",
        showlegend=False,
        meta={"rank": rank, "lane": lane_name, "kind": "link_base"},
    )
    hover = [
        f"rank {rank} · {label.removesuffix(' %')}: mean {'n/a' if a is None else f'{a:.1f} %'}, peak "
        f"{'n/a' if p is None else f'{p:.1f} %'} ({(s + offset) / 1e6:.3f}–{(e + offset) / 1e6:.3f} ms)"
        for a, p, s, e in zip(avg, peak, lane["start"], lane["end"], strict=True)
    ]
    fig.add_scatter(
        x=x,
        y=scaled(avg),
        yaxis="y2",
        mode="lines",
        line={"width": 0.5, "color": colour, "shape": "vh"},
        fill="tonexty",
        fillcolor=fill,
        customdata=avg,
        hovertext=hover,
        hoverinfo="text",
        name=name,
        legendgroup=name,
        showlegend=not any(t.name == name for t in fig.data),
        meta={"rank": rank, "lane": lane_name, "kind": "link_avg"},
    )
    fig.add_scatter(
        x=x,
        y=scaled(peak),
        yaxis="y2",
        mode="lines",
        line={"width": 1, "color": colour, "shape": "vh"},
        customdata=peak,
        hoverinfo="skip",
        legendgroup=name,
        showlegend=False,
        meta={"rank": rank, "lane": lane_name, "kind": "link_peak"},
    )


def step_links_figure(rank: dict[str, Any]) -> go.Figure | None:
    """Per step of a rank: mean PCIe and NVLink load over the step and over its NCCL kernels (bars),
    each step's peak (markers); % of the link's peak."""
    steps = [
        s for s in rank.get("steps", []) if s.get("pcie_avg_pct") is not None or s.get("nvlink_avg_pct") is not None
    ]
    if not steps:
        return None
    names = [s["name"] for s in steps]
    fig = go.Figure()
    for field, label, colour in (
        ("pcie_avg_pct", "PCIe mean (step)", "rgba(212,167,44,0.55)"),
        ("nccl_pcie_avg_pct", "PCIe mean in NCCL kernels", "#9a6700"),
        ("nvlink_avg_pct", "NVLink mean (step)", "rgba(45,164,78,0.5)"),
        ("nccl_nvlink_avg_pct", "NVLink mean in NCCL kernels", "#1a7f37"),
    ):
        fig.add_bar(
            name=label,
            x=names,
            y=[s.get(field) for s in steps],
            marker_color=colour,
            hovertemplate=f"%{{x}} · {label}: %{{y:.1f}} %<extra></extra>",
            meta={"field": field},
        )
    for field, label, colour in (
        ("pcie_peak_pct", "PCIe peak", "#9a6700"),
        ("nvlink_peak_pct", "NVLink peak", "#1a7f37"),
    ):
        fig.add_scatter(
            name=label,
            x=names,
            y=[s.get(field) for s in steps],
            mode="markers",
            marker={"symbol": "line-ew-open", "size": 22, "color": colour, "line": {"width": 3, "color": colour}},
            hovertemplate=f"%{{x}} · {label}: %{{y:.1f}} %<extra></extra>",
            meta={"field": field},
        )
    device = (rank.get("links") or {}).get("device")
    fig.update_layout(
        barmode="group",
        title=f"Rank {rank['rank']}: link load per step (nsys GPU metrics, GPU {device}; % of the link's peak)",
        yaxis={"title": "% of peak", "range": [0, 105]},
        legend={"orientation": "h", "y": -0.2},
        height=380,
        margin={"t": 60},
    )
    return fig


def _table(table_id: str, header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table id='{table_id}'><tr>{head}</tr>{body}</table>"


def section(doc: dict[str, Any]) -> str:
    """The page's link section: per rank its figures, where NCCL's bytes went and its chart, or
    why it has none; and whether the timeline has link rows (and why not)."""
    if not doc.get("ranks"):
        return ""
    parts = [f"<section id='links'><h2>{_e(TITLE)}</h2>"]
    lanes, reasons = link_lanes(doc)
    if lanes:
        parts.append(
            "<p id='link-lane-note' class='muted'>The timeline's <i>PCIe %</i> and <i>NVLink %</i> rows under each "
            "rank's NCCL lanes show its GPU's link load: the area is the mean of each bucket of samples, the line its "
            "peak (per sample the busier direction, % of the link's peak)."
            + (f" No rows for {_e('; '.join(reasons))}." if reasons else "")
            + "</p>"
        )
    elif reasons:
        parts.append(
            f"<p id='link-lane-note' class='muted'>No link rows on the timeline: {_e('; '.join(reasons))}.</p>"
        )
    for rank in doc["ranks"]:
        r = rank["rank"]
        parts.append(f"<h3>Rank {_e(r)}</h3>")
        why = null_reason(rank)
        if why is not None:
            parts.append(f"<p class='muted link-null' id='links-null-{_e(r)}'>No link counters: {_e(why)}.</p>")
            continue
        links = rank["links"]
        parts.append(f"<p id='links-source-{_e(r)}'>{_e(source_line(links))}</p>")
        parts.append(_table(f"links-stats-{r}", STATS_HEADER, stats_rows(links)))
        parts.append(f"<p>{_e(split_line(links))}</p>")
        parts.append(_table(f"links-split-{r}", SPLIT_HEADER, split_rows(links)))
        fig = step_links_figure(rank)
        if fig is not None:
            parts.append(fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"links-rank-{r}"))
    parts.append("</section>")
    return "\n".join(parts)
