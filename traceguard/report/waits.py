"""Who waits for whom, drawn for the HTML report (docs/collectives.md): the late rank, each rank's
NCCL time split into waiting for the last rank and transfer, the clock alignment, each step's GPU
time broken down (a stacked bar per rank and step), the rank × step lateness heatmap, and the
per-kernel wait / transfer lane of the timeline.

Everything is read from the report document, the timeline lane too: the analysis gives each
rank's matched NCCL kernels split at the last member's arrival (``timeline.ranks[].wait_lane``,
metrics.waits), drawn when the clocks are trusted and a rank has at most 1,500 matched calls;
otherwise the page says why and the per-step chart stands alone.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from traceguard.report.units import held_up_clause, ms, pct

#: Colours of the step breakdown and the wait / transfer lane (the timeline's compute, exposed and
#: memcpy colours where the meaning is the same).
PART_COLOUR = {
    "compute_ns": "#2da44e",
    "comm_wait_ns": "#fb8500",
    "comm_transfer_ns": "#0e7490",
    "comm_ns": "#cf222e",
    "copy_ns": "#d4a72c",
    "idle_host_ns": "#8250df",
    "idle_other_ns": "#afb8c1",
}
PART_NAME = {
    "compute_ns": "compute",
    "comm_wait_ns": "comm: waiting for the last rank",
    "comm_transfer_ns": "comm: transfer",
    "comm_ns": "comm (not split)",
    "copy_ns": "copies",
    "idle_host_ns": "idle: waiting for the host",
    "idle_other_ns": "idle: other",
}
WAIT_COLOUR = PART_COLOUR["comm_wait_ns"]
TRANSFER_COLOUR = PART_COLOUR["comm_transfer_ns"]
#: The timeline row of the split.
WAIT_LANE = "NCCL wait / transfer"
#: Kernel times at least this large are wall-clock already (the reduce then adds no clock base).
_WALL_CLOCK_NS = 10**17


def _e(value: Any) -> str:
    return html.escape(str(value))


def rank_shifts(doc: dict[str, Any]) -> dict[int, int] | None:
    """Per rank, what puts its capture-clock times on the run's aligned clock (its clock base,
    unless its times are wall-clock already, plus its offset); None unless the clocks are trusted."""
    clock = (doc.get("run") or {}).get("clock_alignment") or {}
    if not clock.get("trusted"):
        return None
    timeline = (doc.get("timeline") or {}).get("ranks", [])
    origins = {r["rank"]: int(r["origin_ns"]) for r in timeline if r.get("origin_ns") is not None}
    shifts: dict[int, int] = {}
    for row in clock.get("ranks") or []:
        if row.get("offset_ns") is None:
            return None
        base = row.get("base_ns") or 0
        if origins.get(row["rank"], 0) > _WALL_CLOCK_NS:
            base = 0
        shifts[row["rank"]] = int(base) + int(row["offset_ns"])
    return shifts


def wait_lane(doc: dict[str, Any]) -> tuple[dict[int, list[tuple[int, int, int]]], str | None]:
    """Per rank, its matched NCCL kernels as (start, last member's arrival, end) on its timeline
    lanes' scale (ns from its ``origin_ns``), from the analysis (``timeline.ranks[].wait_lane``),
    or no segments and the reason they are not drawn."""
    if len(doc.get("ranks") or []) < 2:
        return {}, None
    clock = (doc.get("run") or {}).get("clock_alignment") or {}
    if not clock.get("trusted"):
        reason = clock.get("reason")
        return {}, f"the ranks' clocks are not trusted ({reason})" if reason else "the clocks are not aligned"
    out: dict[int, list[tuple[int, int, int]]] = {}
    reasons = []
    for rank in (doc.get("timeline") or {}).get("ranks", []):
        lane = rank.get("wait_lane") or {}
        if lane.get("null_reason"):
            reasons.append(f"rank {rank['rank']}: {lane['null_reason']}")
        elif lane.get("start"):
            out[rank["rank"]] = list(zip(lane["start"], lane["split"], lane["end"], strict=True))
    if reasons and not out:
        return {}, "; ".join(reasons[:2])
    return out, None


def step_time_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Per rank and step, a stacked bar of its GPU time over its period: compute, exposed
    communication split into waiting for the last rank and transfer (or not split), copies, idle
    waiting for the host, other idle."""
    steps = [(r["rank"], s) for r in doc["ranks"] for s in r["steps"] if s.get("period_ns") is not None]
    if not steps:
        return None
    labels = [f"r{rank} · {s['name']}" for rank, s in steps]
    fig = go.Figure()
    for key in PART_COLOUR:
        if key == "comm_ns":
            values = [s["comm_ns"] if s.get("comm_wait_ns") is None else None for _, s in steps]
        else:
            values = [s.get(key) for _, s in steps]
        if all(v is None for v in values):
            continue
        fig.add_bar(
            name=PART_NAME[key],
            x=labels,
            y=[None if v is None else v / 1e6 for v in values],
            marker_color=PART_COLOUR[key],
            customdata=[
                [ms(s["period_ns"]), pct((v or 0) / s["period_ns"]) if s["period_ns"] else "n/a"]
                for (_, s), v in zip(steps, values, strict=True)
            ],
            hovertemplate=f"%{{x}} · {PART_NAME[key]}: %{{y:.2f}} ms (%{{customdata[1]}} of the period "
            "%{customdata[0]})<extra></extra>",
            meta={"part": key},
        )
    fig.update_layout(
        barmode="stack",
        title="GPU time of each step: where it went (the period runs from the previous step's GPU end to its own)",
        yaxis_title="ms",
        legend={"orientation": "h", "y": -0.25},
        height=480,
        margin={"t": 60},
    )
    return fig


def lateness_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Heatmap of each rank's lateness at each step's collectives (its median arrival − the
    earliest member's), the late rank named in the title and on its row."""
    ranks = [r for r in doc["ranks"] if any(s.get("lateness_ns") is not None for s in r["steps"])]
    if not ranks:
        return None
    late = (doc["run"].get("late_rank") or {}).get("rank")
    indices = sorted({s["index"] for r in ranks for s in r["steps"] if s.get("lateness_ns") is not None})
    cells = {(r["rank"], s["index"]): s for r in ranks for s in r["steps"]}
    rows = [f"rank {r['rank']}" + (" (late)" if r["rank"] == late else "") for r in ranks]
    z = [
        [
            None
            if cells.get((r["rank"], i), {}).get("lateness_ns") is None
            else cells[(r["rank"], i)]["lateness_ns"] / 1e6
            for i in indices
        ]
        for r in ranks
    ]
    names = [[cells.get((r["rank"], i), {}).get("name", "") for i in indices] for r in ranks]
    text = [["" if v is None else f"{v:.2f}" for v in row] for row in z]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"step {i}" for i in indices],
            y=rows,
            text=text,
            texttemplate="%{text}",
            customdata=names,
            colorscale="Oranges",
            zmin=0,
            colorbar={"title": "ms late"},
            hovertemplate="%{y}, %{x} (%{customdata}): %{z:.3f} ms after the first rank<extra></extra>",
        )
    )
    info = doc["run"].get("late_rank")
    title = "Arrival lateness at the collectives (median per rank and step, ms after the first rank)"
    if info:
        title += f"<br>late rank: {info['rank']}, last at {info['last_arrivals']} of {info['of']} collectives"
    fig.update_layout(
        title=title,
        height=max(280, 46 * len(rows) + 170),
        yaxis={"autorange": "reversed"},
        margin={"t": 80},
    )
    return fig


def section_html(doc: dict[str, Any]) -> str:
    """The late rank, the wait share, each rank's split and the clock alignment (no charts)."""
    clock = doc["run"].get("clock_alignment")
    if clock is None or len(doc["ranks"]) < 2:
        return ""
    parts = ["<h2 id='waits'>Who waits for whom</h2>"]
    if not clock.get("trusted") and clock.get("reason"):
        why = "Without clocks that agree" if clock.get("method") else "With nothing to align the clocks on"
        parts.append(
            f"<p id='late-rank' class='muted'>{why} (see the clock alignment below) there is no late rank and no "
            "split of NCCL time into waiting and transfer.</p>"
        )
    else:
        parts += _late_and_split(doc)
    parts += _clock(clock)
    parts.append(
        "<p class='muted'>Waiting = the last member's arrival (kernel start) − this rank's, transfer = the rest of "
        "the kernel; definitions in docs/collectives.md.</p>"
    )
    return "\n".join(parts)


def _late_and_split(doc: dict[str, Any]) -> list[str]:
    run = doc["run"]
    metrics, reasons = run["metrics"], run["metrics"].get("null_reasons", {})
    late = run.get("late_rank")
    parts = []
    if late:
        phases = ", ".join(f"<code>{_e(p['phase'])}</code> ({_e(p['calls'])})" for p in late["launched_in"])
        steps = ", ".join(map(str, late["steps_late"]))
        parts.append(
            f"<p id='late-rank' data-rank='{_e(late['rank'])}'><b>Rank {_e(late['rank'])} is the late rank</b>: it "
            f"arrived last at {_e(late['last_arrivals'])} of {_e(late['of'])} matched collectives "
            f"({_e(pct(late['share']))}), median {_e(ms(late['median_late_ns']))} after the first rank (p95 "
            f"{_e(ms(late['p95_late_ns']))})"
            + (f", launched in {phases}" if phases else "")
            + (f"; late in steps {_e(steps)}" if steps else "")
            + _e(held_up_clause(late))
            + ".</p>"
        )
    else:
        reason = reasons.get("late_rank", "not available")
        parts.append(f"<p id='late-rank' class='muted'>No late rank: {_e(reason)}.</p>")
    if metrics.get("nccl_wait_share") is not None:
        parts.append(
            f"<p id='wait-share'>Of the matched collectives' NCCL kernel time, <b>{_e(pct(metrics['nccl_wait_share']))}"
            f"</b> was waiting for the last rank ({_e(ms(metrics['nccl_wait_ns']))} waiting, "
            f"{_e(ms(metrics['nccl_transfer_ns']))} transfer); the check <code>collective_wait</code> reads it.</p>"
        )
    else:
        reason = reasons.get("nccl_wait_share", "not available")
        parts.append(f"<p id='wait-share' class='muted'>Waiting and transfer are not split: {_e(reason)}.</p>")
    parts.append(
        "<table id='wait-transfer'><tr><th>rank</th><th>NCCL wait</th><th>transfer</th><th>wait share</th>"
        "<th>last to arrive</th><th>median late</th></tr>"
    )
    for rank in doc["ranks"]:
        m = rank["metrics"]
        last = m.get("last_arrivals") or {}
        mark = " style='font-weight:600'" if late and rank["rank"] == late["rank"] else ""
        arrived = f"{last['count']} of {last['of']}" if last else "n/a"
        parts.append(
            f"<tr data-rank='{_e(rank['rank'])}'{mark}><td>{_e(rank['rank'])}</td>"
            f"<td>{_e(ms(m.get('nccl_wait_ns')))}</td><td>{_e(ms(m.get('nccl_transfer_ns')))}</td>"
            f"<td>{_e(pct(m.get('nccl_wait_share')))}</td><td>{_e(arrived)}</td>"
            f"<td>{_e(ms(last.get('median_late_ns')))}</td></tr>"
        )
    parts.append("</table>")
    return parts


def _clock(clock: dict[str, Any]) -> list[str]:
    parts = ["<h3 id='clock'>Clock alignment</h3>"]
    if clock.get("method"):
        if not clock["trusted"]:
            trust = f"<b>not trusted</b>: {_e(clock['reason'])}"
        elif any(row["residual_ns"] is not None for row in clock.get("ranks") or []):
            trust = f"trusted: every rank's residual is within {_e(ms(clock['residual_limit_ns']))}"
        else:
            trust = "trusted: the ranks share one host's clock"
        parts.append(
            f"<p id='clock-method'>Method: {_e(clock['method'])}; calls matched by {_e(clock.get('matching', 'n/a'))}; "
            f"reference rank {_e(clock['reference_rank'])}; {trust}.</p>"
        )
    else:
        reason = clock.get("reason") or "nothing matched"
        parts.append(f"<p id='clock-method' class='muted'>Not aligned: {_e(reason)}.</p>")
    trusted = "true" if clock.get("trusted") else "false"
    parts.append(
        f"<table id='clock-alignment' data-trusted='{trusted}'><tr><th>rank</th><th>clock base</th><th>base (ns since "
        "the epoch)</th><th>offset</th><th>residual</th><th>matched calls</th></tr>"
    )
    for row in clock.get("ranks") or []:
        offset = "n/a" if row["offset_ns"] is None else f"{row['offset_ns'] / 1e3:.1f} µs"
        residual = "n/a" if row["residual_ns"] is None else f"{row['residual_ns'] / 1e3:.1f} µs"
        base = "n/a" if row["base_ns"] is None else row["base_ns"]
        parts.append(
            f"<tr data-rank='{_e(row['rank'])}'><td>{_e(row['rank'])}</td><td>{_e(row['base_source'] or 'none')}</td>"
            f"<td>{_e(base)}</td><td>{_e(offset)}</td><td>{_e(residual)}</td><td>{_e(row['matched'])}</td></tr>"
        )
    parts.append("</table>")
    return parts


def section(doc: dict[str, Any]) -> str:
    """The report page's "Who waits for whom" section: :func:`section_html`, the lateness heatmap,
    and whether the timeline has the wait / transfer lane (and why not)."""
    head = section_html(doc)
    if not head:
        return ""
    parts = ["<section id='who-waits'>", head]
    fig = lateness_figure(doc)
    if fig is not None:
        parts.append(fig.to_html(full_html=False, include_plotlyjs=False, div_id="lateness"))
    lanes, why = wait_lane(doc)
    if lanes:
        parts.append(
            f"<p id='wait-lane-note' class='muted'>The timeline's <i>{_e(WAIT_LANE)}</i> row splits each matched NCCL "
            "kernel of a rank at the last member's arrival: waiting (orange), then transfer (teal).</p>"
        )
    elif why:
        parts.append(f"<p id='wait-lane-note' class='muted'>No wait / transfer row on the timeline: {_e(why)}.</p>")
    parts.append("</section>")
    return "\n".join(parts)
