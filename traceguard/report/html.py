"""HTML report: checks, metrics, the per-rank step breakdown, each step's GPU time, the timeline,
who waits for whom (traceguard.report.waits), the link counters (traceguard.report.link_charts) and
the NCCL transport matrix as Plotly charts.

By default the page embeds plotly.js once, so it opens offline (CI artifacts, air-gapped
clusters); the service passes ``plotly_src`` to load it from its own static route instead.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from traceguard.checks.rules import format_value
from traceguard.report.inspector import inspector_html
from traceguard.report.link_charts import section as links_section
from traceguard.report.nccl import pair_transports, transport_order
from traceguard.report.overview import html_section as overview_section
from traceguard.report.sizes import REGIMES, bands, size_rows, small_bytes
from traceguard.report.steps import step_sources_line
from traceguard.report.timeline import timeline_figure
from traceguard.report.units import value_h
from traceguard.report.waits import section as waits_section
from traceguard.report.waits import step_time_figure

_STATUS_COLOUR = {"pass": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e", "skip": "#6e7781"}
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem;color:#1f2328}
h1 .verdict{padding:.1em .5em;border-radius:.3em;color:#fff}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}
td,th{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:left;vertical-align:top;font-size:.9rem}
th{background:#f6f8fa}.status{font-weight:600;color:#fff;border-radius:.3em;padding:.05em .4em}
.muted{color:#6e7781}details{margin:.3rem 0}code{background:#f6f8fa;padding:0 .2em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def step_breakdown_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Stacked phase CPU time per step and rank, with each step's GPU span and NCCL time."""
    labels: list[str] = []
    phases: dict[str, list[float]] = {}
    spans: list[float | None] = []
    nccl: list[float] = []
    for rank in doc["ranks"]:
        for step in rank["steps"]:
            labels.append(f"r{rank['rank']} · {step['name']}")
            spans.append(step["gpu_span_ns"] / 1e6 if step["gpu_span_ns"] is not None else None)
            nccl.append(step["nccl_ns"] / 1e6)
            for name in step["phases"]:
                phases.setdefault(name, [])
    if not labels:
        return None
    for name in phases:
        phases[name] = [
            step["phases"].get(name, {}).get("cpu_ns", 0) / 1e6 for rank in doc["ranks"] for step in rank["steps"]
        ]
    fig = go.Figure()
    for name, values in phases.items():
        fig.add_bar(name=f"{name} (CPU)", x=labels, y=values)
    fig.add_scatter(name="GPU span", x=labels, y=spans, mode="markers", marker={"symbol": "diamond", "size": 11})
    fig.add_scatter(name="NCCL time", x=labels, y=nccl, mode="markers", marker={"symbol": "x", "size": 11})
    fig.update_layout(
        barmode="stack",
        title="Step breakdown per rank",
        yaxis_title="ms",
        legend={"orientation": "h"},
        height=460,
        margin={"t": 60},
    )
    return fig


def nccl_share_figure(doc: dict[str, Any]) -> go.Figure | None:
    check = next((c for c in doc["checks"] if c["id"] == "nccl_step_share"), None)
    fig = go.Figure()
    any_step = False
    for rank in doc["ranks"]:
        steps = [s for s in rank["steps"] if s["nccl_share"] is not None]
        if steps:
            any_step = True
            fig.add_bar(name=f"rank {rank['rank']}", x=[s["name"] for s in steps], y=[s["nccl_share"] for s in steps])
    if not any_step:
        return None
    for key, colour in (("warn", "#9a6700"), ("fail", "#cf222e")):
        if check and check.get(key) is not None:
            fig.add_hline(y=check[key], line_dash="dash", line_color=colour, annotation_text=f"{key} {check[key]:.0%}")
    fig.update_layout(
        barmode="group",
        title="NCCL share of each step's GPU span",
        yaxis_tickformat=".0%",
        height=380,
        margin={"t": 60},
    )
    return fig


def collectives_by_type_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Kernel time per collective type per rank (stacked), with each rank's exposed time marked."""
    ranks = [r for r in doc["ranks"] if (r.get("collectives_by_type") or {}).get("totals")]
    if not ranks:
        return None
    labels = [f"rank {r['rank']}" for r in ranks]
    types: list[str] = []
    for rank in ranks:
        for row in rank["collectives_by_type"]["totals"]:
            if row["collective"] not in types:
                types.append(row["collective"])
    fig = go.Figure()
    for name in types:
        rows = [next((t for t in r["collectives_by_type"]["totals"] if t["collective"] == name), None) for r in ranks]
        fig.add_bar(
            name=name,
            x=labels,
            y=[row["time_ns"] / 1e6 if row else 0 for row in rows],
            customdata=[
                [row["count"], row["exposed_ns"] / 1e6, value_h("bytes", row["bytes"])] if row else [0, 0, "n/a"]
                for row in rows
            ],
            hovertemplate=f"{name} · %{{x}}: %{{y:.2f}} ms in %{{customdata[0]}} kernels, "
            "%{customdata[1]:.2f} ms exposed, %{customdata[2]}<extra></extra>",
        )
    exposed = [sum(t["exposed_ns"] for t in r["collectives_by_type"]["totals"]) / 1e6 for r in ranks]
    fig.add_scatter(name="exposed (all types)", x=labels, y=exposed, mode="markers", marker={"symbol": "x", "size": 12})
    fig.update_layout(
        barmode="stack",
        title="NCCL kernel time per collective type and rank",
        yaxis_title="ms",
        legend={"orientation": "h"},
        height=420,
        margin={"t": 60},
    )
    return fig


def collective_sizes_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Collective calls inside the steps per payload band, one bar per collective type (all ranks)."""
    rows = size_rows(doc)
    if not rows:
        return None
    labels = bands()
    totals: dict[str, list[int]] = {}
    for _, collective, counts in rows:
        bars = totals.setdefault(collective, [0] * len(labels))
        for i, label in enumerate(labels):
            bars[i] += counts.get(label, 0)
    fig = go.Figure([go.Bar(name=collective, x=labels, y=bars) for collective, bars in totals.items()])
    bound = small_bytes(doc)
    title = "Collective calls by payload size" + (f" (small: < {bound / 2**20:g} MiB)" if bound else "")
    fig.update_layout(title=title, barmode="group", yaxis_title="calls", height=360, margin={"t": 50})
    return fig


def peer_matrix_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Heatmap of point-to-point kernel time per (rank, peer), with kernels and bytes as text."""
    rows = (doc["run"].get("peer_matrix") or {}).get("rows") or []
    if not rows:
        return None
    ranks = sorted({r["rank"] for r in rows} | {r["peer"] for r in rows})
    cell = {(r["rank"], r["peer"]): r for r in rows}
    z = [[cell[(a, b)]["time_ns"] / 1e6 if (a, b) in cell else None for b in ranks] for a in ranks]
    text = [
        [
            f"{cell[(a, b)]['kernels']} kernels<br>{value_h('bytes', cell[(a, b)]['bytes'])}" if (a, b) in cell else ""
            for b in ranks
        ]
        for a in ranks
    ]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"peer {p}" for p in ranks],
            y=[f"rank {r}" for r in ranks],
            text=text,
            texttemplate="%{text}",
            colorscale="Blues",
            colorbar={"title": "ms"},
            hovertemplate="%{y} → %{x}: %{z:.2f} ms<br>%{text}<extra></extra>",
        )
    )
    fig.update_layout(
        title="Point-to-point kernel time per rank and peer",
        height=max(260, 60 * len(ranks) + 120),
        yaxis={"autorange": "reversed"},
        margin={"t": 60},
    )
    return fig


#: Per-step collective rows drawn in the page (the JSON report and the API have all of them).
MAX_STEP_ROWS = 2000


def _type_cells(row: dict[str, Any]) -> str:
    return (
        f"<td>{_e(row['collective'])}</td><td>{_e(row['count'])}</td>"
        f"<td>{_e(value_h('time_ns', row['time_ns']))}</td><td>{_e(value_h('time_ns', row['exposed_ns']))}</td>"
        f"<td>{_e(value_h('bytes', row['bytes']))}</td></tr>"
    )


def _collectives_table(doc: dict[str, Any], collective: str | None = None) -> list[str]:
    """Window totals per rank and type, then the per-step rows; ``collective`` keeps one type."""
    title = "Collectives by type" + (f" — {_e(collective)} only" if collective else "")
    parts = [
        f"<h2>{title}</h2><table id='collectives-table'><tr><th>rank</th><th>collective</th>"
        "<th>count</th><th>time</th><th>exposed</th><th>bytes</th><th>issued as</th></tr>"
    ]
    for rank in doc["ranks"]:
        for row in (rank.get("collectives_by_type") or {}).get("totals") or []:
            if collective is None or row["collective"] == collective:
                issued = ", ".join(f"{op} ×{n}" for op, n in (row.get("issued_as") or {}).items())
                parts.append(
                    f"<tr data-collective='{_e(row['collective'])}'><td>{_e(rank['rank'])}</td>"
                    + _type_cells(row).removesuffix("</tr>")
                    + f"<td>{_e(issued)}</td></tr>"
                )
    parts.append("</table>")
    per_step = [
        (rank["rank"], row)
        for rank in doc["ranks"]
        for row in (rank.get("collectives_by_type") or {}).get("steps") or []
        if collective is None or row["collective"] == collective
    ]
    if per_step:
        parts.append(
            f"<details><summary>Collectives per step ({len(per_step)} rows)</summary>"
            "<table id='collectives-per-step'><tr><th>rank</th><th>step</th><th>collective</th><th>count</th>"
            "<th>time</th><th>exposed</th><th>bytes</th></tr>"
        )
        for rank_id, row in per_step[:MAX_STEP_ROWS]:
            parts.append(
                f"<tr data-collective='{_e(row['collective'])}'><td>{_e(rank_id)}</td>"
                f"<td>{_e(row['step_index'])}</td>" + _type_cells(row)
            )
        parts.append("</table>")
        if len(per_step) > MAX_STEP_ROWS:
            parts.append(f"<p class='muted'>{len(per_step) - MAX_STEP_ROWS} more rows in the JSON report.</p>")
        parts.append("</details>")
    matrix = doc["run"].get("peer_matrix") or {}
    if matrix.get("rows"):
        parts.append(
            "<h3>Point-to-point peers</h3><table id='peer-table'><tr><th>rank</th><th>peer</th><th>kernels</th>"
            "<th>time</th><th>sends</th><th>recvs</th><th>bytes</th><th>peer named by</th></tr>"
        )
        for row in matrix["rows"]:
            parts.append(
                f"<tr data-rank='{_e(row['rank'])}' data-peer='{_e(row['peer'])}'><td>{_e(row['rank'])}</td>"
                f"<td>{_e(row['peer'])}</td><td>{_e(row['kernels'])}</td>"
                f"<td>{_e(value_h('time_ns', row['time_ns']))}</td>"
                f"<td>{_e(value_h('sends', row['sends']))}</td><td>{_e(value_h('recvs', row['recvs']))}</td>"
                f"<td>{_e(value_h('bytes', row['bytes']))}</td><td>{_e(row['source'])}</td></tr>"
            )
        parts.append("</table>")
    if matrix.get("null_reason"):
        parts.append(f"<p class='muted' id='peer-null-reason'>Peers not named: {_e(matrix['null_reason'])}</p>")
    return parts


_TRANSPORT_COLOUR = {"P2P": "#1a7f37", "NVLS": "#2da44e", "COLLNET": "#0969da", "NET": "#9a6700", "SHM": "#cf222e"}


def transport_matrix(doc: dict[str, Any]) -> tuple[list[int], dict[tuple[int, int], str]]:
    """The ranks and :func:`~traceguard.report.nccl.pair_transports` of ``nccl.connections``."""
    connections = (doc.get("nccl") or {}).get("connections", [])
    pairs = pair_transports((c.get("rank"), c.get("peer"), c["transport"]) for c in connections)
    return sorted({r for pair in pairs for r in pair}), pairs


def transport_figure(doc: dict[str, Any]) -> go.Figure | None:
    """Heatmap of the transport per rank pair: green P2P/NVLink, amber NET, red SHM (the fallback)."""
    ranks, pairs = transport_matrix(doc)
    if not pairs:
        return None
    classes = sorted(
        set(pairs.values()),
        key=lambda c: [transport_order(k) for k in c.split("+")],
    )
    code = {name: i for i, name in enumerate(classes)}
    z = [[code.get(pairs.get((r, p), "")) for p in ranks] for r in ranks]
    text = [[pairs.get((r, p), "") for p in ranks] for r in ranks]
    colours = [_TRANSPORT_COLOUR.get(c.split("+")[-1], "#6e7781") for c in classes]
    n = len(classes)
    scale = []
    for i, colour in enumerate(colours):
        scale += [[i / n, colour], [(i + 1) / n, colour]]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"peer {p}" for p in ranks],
            y=[f"rank {r}" for r in ranks],
            text=text,
            texttemplate="%{text}",
            colorscale=scale,
            zmin=-0.5,
            zmax=n - 0.5,
            showscale=False,
            hovertemplate="%{y} → %{x}: %{text}<extra></extra>",
        )
    )
    fig.update_layout(
        title="NCCL transport per rank pair (from NCCL_DEBUG=INFO)",
        height=max(260, 60 * len(ranks) + 120),
        yaxis={"autorange": "reversed"},
        margin={"t": 60},
    )
    return fig


def render(
    doc: dict[str, Any], *, plotly_src: str | None = None, header_html: str = "", collective: str | None = None
) -> str:
    """The report page. ``plotly_src``: load plotly.js from this URL instead of embedding it;
    ``header_html``: trusted markup (the service's navigation) put above the report;
    ``collective``: show only that collective type in the collectives tables."""
    verdict = doc["verdict"]
    script = f"<script src='{_e(plotly_src)}'></script>" if plotly_src else f"<script>{get_plotlyjs()}</script>"
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>traceguard — {_e(verdict)}</title><style>{_CSS}</style>",
        f"{script}</head><body>",
        header_html,
        f"<h1>traceguard report <span class='verdict' style='background:{_STATUS_COLOUR.get(verdict, '#333')}'>"
        f"{_e(verdict.upper())}</span></h1>",
        f"<p class='muted'>profile <code>{_e(doc['profile']['name'])}</code> · traceguard "
        f"{_e(doc['traceguard_version'])} · {_e(doc['generated_at'])}</p>",
        f"<p id='step-sources'>{_e(step_sources_line(doc) or '')}</p>",
        "<h2>Checks</h2><table id='checks'><tr><th>check</th><th>status</th><th>value</th><th>detail</th></tr>",
    ]
    for c in doc["checks"]:
        colour = _STATUS_COLOUR.get(c["status"], "#333")
        detail = _e(c["reason"] if c["status"] == "skip" else c["message"])
        if c.get("remedy"):
            detail += f"<details><summary>remedy and evidence</summary><p>{_e(c['remedy'])}</p><ul>"
            detail += "".join(
                "<li>" + _e(", ".join(f"{k}={value_h(k, v)}" for k, v in row.items())) + "</li>"
                for row in c["evidence"][:10]
            )
            detail += "</ul></details>"
        parts.append(
            f"<tr data-check='{_e(c['id'])}'><td><code>{_e(c['id'])}</code></td>"
            f"<td><span class='status' style='background:{colour}'>{_e(c['status'])}</span></td>"
            f"<td>{_e(format_value(c['value'], c.get('unit')))}</td><td>{detail}</td></tr>"
        )
    parts.append("</table>")
    parts.append(overview_section(doc))
    parts.append("<h2>Charts</h2>")
    for fig_id, fig in (
        ("step-breakdown", step_breakdown_figure(doc)),
        ("step-time", step_time_figure(doc)),
        ("timeline", timeline_figure(doc)),
        ("nccl-share", nccl_share_figure(doc)),
        ("transport-matrix", transport_figure(doc)),
        ("collectives-by-type", collectives_by_type_figure(doc)),
        ("peer-matrix", peer_matrix_figure(doc)),
        ("collective-sizes", collective_sizes_figure(doc)),
    ):
        if fig is not None:
            parts.append(fig.to_html(full_html=False, include_plotlyjs=False, div_id=fig_id))
    if size_rows(doc):
        parts.append(f"<p id='size-regimes' class='muted'>{_e(REGIMES)}</p>")
    if not doc["ranks"] or not any(r["steps"] for r in doc["ranks"]):
        parts.append("<p class='muted'>No steps were found, so there is no step breakdown to chart.</p>")
    parts.append(waits_section(doc))
    parts.append(inspector_html(doc))
    parts.append(links_section(doc))
    parts += _collectives_table(doc, collective)
    parts.append("<h2>Run metrics</h2><table id='metrics'><tr><th>metric</th><th>value</th></tr>")
    metrics = doc["run"]["metrics"]
    for key, value in metrics.items():
        if key == "null_reasons":
            continue
        shown = value_h(key, value)
        if value is None and key in metrics["null_reasons"]:
            shown += f" <span class='muted'>({_e(metrics['null_reasons'][key])})</span>"
            parts.append(f"<tr><td><code>{_e(key)}</code></td><td>{shown}</td></tr>")
        else:
            parts.append(f"<tr><td><code>{_e(key)}</code></td><td>{_e(shown)}</td></tr>")
    parts.append("</table><h2>Inputs</h2><table><tr><th>path</th><th>format</th><th>rank</th><th>notes</th></tr>")
    for i in doc["inputs"]:
        notes = _e(i["error"]) if i["error"] else _e("; ".join(i["warnings"]))
        parts.append(
            f"<tr><td>{_e(i['path'])}</td><td>{_e(i['format'] or '')} {_e(i['tool_version'] or '')}</td>"
            f"<td>{_e(', '.join(map(str, i['ranks'])) or '')}</td><td>{notes}</td></tr>"
        )
    parts.append("</table></body></html>")
    return "\n".join(parts)
