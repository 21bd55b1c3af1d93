"""The report's ``timeline`` section drawn: one zoomable Plotly figure per run, and the same lanes
as a Chrome / Perfetto trace-event JSON (``traceguard export --perfetto``).

Both read only the report document (metrics/timeline.py made the lanes), never the captures.
Times are shown from the run's origin: the earliest ``origin_ns`` of its ranks (ranks of one node
share a clock; ranks on other hosts are on their own host's clock, as in the captures). In the
figure, when the report's clock alignment is trusted (``run.clock_alignment``), the ranks are put
on that one aligned clock instead, and each rank gets a lane of its NCCL kernels split into
waiting for the last rank and transfer (:mod:`traceguard.report.waits`).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from traceguard.report.link_charts import add_link_load, add_link_row, link_lanes, link_rows
from traceguard.report.waits import TRANSFER_COLOUR, WAIT_COLOUR, WAIT_LANE, rank_shifts, wait_lane

#: Lane colours by kind; NCCL lanes by collective type.
KIND_COLOUR = {
    "step": "#8c959f",
    "phase": "#8250df",
    "compute": "#2da44e",
    "exposed": "#cf222e",
    "memcpy": "#d4a72c",
}
COLLECTIVE_COLOUR = {
    "AllReduce": "#0969da",
    "AllGather": "#1b7c83",
    "ReduceScatter": "#54aeff",
    "Broadcast": "#6639ba",
    "Reduce": "#3192aa",
    "AllToAll": "#bf3989",
    "SendRecv": "#0550ae",
    "Send": "#218bff",
    "Recv": "#80ccff",
}
_NCCL_DEFAULT = "#0a3069"
#: Line width of a lane, px (rows are 22 px apart).
_LANE_WIDTH = 14


def lanes_of(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's timeline ranks (empty for a report made before timelines)."""
    return [r for r in (doc.get("timeline") or {}).get("ranks", []) if r.get("lanes")]


def run_origin(ranks: list[dict[str, Any]]) -> int:
    return min(int(r["origin_ns"]) for r in ranks)


def lane_colour(lane: dict[str, Any]) -> str:
    if lane["kind"] == "nccl":
        return COLLECTIVE_COLOUR.get(lane.get("collective") or "", _NCCL_DEFAULT)
    return KIND_COLOUR.get(lane["kind"], "#57606a")


def _hover(lane: dict[str, Any], i: int) -> str:
    start, end, busy = lane["start"][i], lane["end"][i], lane["busy"][i]
    length = end - start
    head = lane["labels"][i] if lane.get("labels") else lane["name"]
    text = f"{head}: {length / 1e6:.3f} ms"
    if busy != length and length > 0:
        text += f" (busy {busy / 1e6:.3f} ms, {busy / length:.0%}; merged)"
    return text


def _wait_traces(fig: go.Figure, rank: int, row: str, offset: int, segments: list[tuple[int, int, int]]) -> None:
    """The rank's matched NCCL kernels on one row: the part before the last rank arrived, then
    the transfer, in two colours."""
    for kind, colour, name in (
        ("wait", WAIT_COLOUR, "NCCL: waiting for the last rank"),
        ("transfer", TRANSFER_COLOUR, "NCCL: transfer"),
    ):
        x: list[float | None] = []
        y: list[str | None] = []
        text: list[str | None] = []
        for start, split, end in segments:
            lo, hi = (start, split) if kind == "wait" else (split, end)
            if hi <= lo:
                continue
            label = f"{kind} {(hi - lo) / 1e6:.3f} ms of a {(end - start) / 1e6:.3f} ms kernel"
            x += [(lo + offset) / 1e6, (hi + offset) / 1e6, None]
            y += [row, row, None]
            text += [label, label, None]
        fig.add_scatter(
            x=x,
            y=y,
            mode="lines",
            line={"color": colour, "width": _LANE_WIDTH},
            name=name,
            legendgroup=name,
            showlegend=not any(trace.name == name for trace in fig.data),
            hovertext=text,
            hoverinfo="text",
            connectgaps=False,
            meta={"rank": rank, "lane": WAIT_LANE, "kind": kind},
        )


def timeline_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Per rank, one row per lane (steps, phases, compute, NCCL by type, the NCCL kernels split
    into waiting and transfer, the PCIe and NVLink load (traceguard.report.link_charts), exposed
    NCCL, memcpy); zoom by dragging across the time axis, double-click to reset."""
    ranks = lanes_of(doc)
    if not ranks:
        return None
    shifts = rank_shifts(doc) or {}
    aligned = bool(shifts) and all(r["rank"] in shifts for r in ranks)
    if not aligned:
        shifts = {}
    origin = min(int(r["origin_ns"]) + shifts.get(r["rank"], 0) for r in ranks)
    waits, _ = wait_lane(doc) if aligned else ({}, None)
    links, _ = link_lanes(doc)
    fig = go.Figure()
    rows: list[str] = []
    #: The link rows, drawn on the numeric axis once every row's position is known.
    loads: list[tuple[int, str, str, dict[str, Any], int]] = []
    shown_kinds: set[str] = set()
    for rank in sorted(ranks, key=lambda r: r["rank"]):
        offset = int(rank["origin_ns"]) + shifts.get(rank["rank"], 0) - origin
        last_nccl = max((i for i, lane in enumerate(rank["lanes"]) if lane["kind"] == "nccl"), default=None)
        # The link rows go under the NCCL lanes (and their wait / transfer row), else last.
        links_after = last_nccl if last_nccl is not None else len(rank["lanes"]) - 1
        for position, lane in enumerate(rank["lanes"]):
            row = f"rank {rank['rank']} · {lane['name']}"
            rows.append(row)
            x: list[float | None] = []
            y: list[str | None] = []
            text: list[str | None] = []
            for i, (start, end) in enumerate(zip(lane["start"], lane["end"], strict=True)):
                label = _hover(lane, i)
                x += [(start + offset) / 1e6, (end + offset) / 1e6, None]
                y += [row, row, None]
                text += [label, label, None]
            legend = lane["name"] if lane["kind"] == "nccl" else lane["kind"]
            fig.add_scatter(
                x=x,
                y=y,
                mode="lines",
                line={"color": lane_colour(lane), "width": _LANE_WIDTH},
                name=legend,
                legendgroup=legend,
                showlegend=legend not in shown_kinds,
                hovertext=text,
                hoverinfo="text",
                connectgaps=False,
                meta={"rank": rank["rank"], "lane": lane["name"], "kind": lane["kind"]},
            )
            shown_kinds.add(legend)
            if position == last_nccl and waits.get(rank["rank"]):
                row = f"rank {rank['rank']} · {WAIT_LANE}"
                rows.append(row)
                _wait_traces(fig, rank["rank"], row, offset, waits[rank["rank"]])
            if position == links_after and rank["rank"] in links:
                lane = links[rank["rank"]]
                for row, key in link_rows(rank["rank"], lane):
                    rows.append(row)
                    add_link_row(fig, rank["rank"], row, key, lane, offset)
                    loads.append((rank["rank"], row, key, lane, offset))
    for rank_id, row, key, lane, offset in loads:
        add_link_load(fig, rank_id, row, key, lane, offset, len(rows) - 1 - rows.index(row))
    clock = (
        "the ranks on one clock (aligned by their collectives' ends)" if aligned else "each rank on its capture's clock"
    )
    fig.update_layout(
        title="Timeline (exposed = NCCL time no compute kernel overlaps; drag to zoom, double-click to reset)"
        f"<br><sup>{clock}</sup>",
        xaxis={"title": "ms from the run's first GPU op", "zeroline": False},
        yaxis={
            "categoryorder": "array",
            "categoryarray": list(reversed(rows)),
            "fixedrange": True,
            "automargin": True,
            # Fixed, so that the link rows' numeric axis (row index ± 0.5) lies over the categories.
            "range": [-0.5, len(rows) - 0.5],
        },
        **(
            {"yaxis2": {"overlaying": "y", "range": [-0.5, len(rows) - 0.5], "visible": False, "fixedrange": True}}
            if loads
            else {}
        ),
        dragmode="zoom",
        hovermode="closest",
        height=min(140 + 22 * len(rows), 2400),
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom"},
        margin={"t": 90, "l": 10, "r": 10},
    )
    return fig


def perfetto(doc: dict[str, Any]) -> dict[str, Any]:
    """The timeline as Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing): a process per
    rank, a thread per lane, one complete ("X") event per segment; ``ts``/``dur`` in µs from the
    run's origin, ``args`` with the segment's busy ns."""
    ranks = lanes_of(doc)
    events: list[dict[str, Any]] = []
    origin = run_origin(ranks) if ranks else None
    if ranks and origin is not None:
        for rank in sorted(ranks, key=lambda r: r["rank"]):
            pid = int(rank["rank"])
            offset = int(rank["origin_ns"]) - origin
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {pid}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
            for tid, lane in enumerate(rank["lanes"], start=1):
                name = {"name": lane["name"]}
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": name})
                events.append(
                    {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}
                )
                for i, (start, end) in enumerate(zip(lane["start"], lane["end"], strict=True)):
                    events.append(
                        {
                            "ph": "X",
                            "cat": lane["kind"],
                            "name": lane["labels"][i] if lane.get("labels") else lane["name"],
                            "pid": pid,
                            "tid": tid,
                            "ts": (start + offset) / 1e3,
                            "dur": (end - start) / 1e3,
                            "args": {"busy_ns": lane["busy"][i]},
                        }
                    )
    return {
        "displayTimeUnit": "ms",
        "otherData": {"source": "traceguard", "version": doc.get("traceguard_version"), "origin_ns": origin},
        "traceEvents": events,
    }
