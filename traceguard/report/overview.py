"""A report by summary drawn (issue 30): the ranks kept whole and why, the distribution of each
per-rank metric over all ranks, the worst steps, the rank × step heat maps, and where the side
output is. Reads only the report document (``rank_summary``, ``rank_steps``, ``worst_steps``,
``detail``); a full report has none of them and gets nothing from here.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from traceguard.report.tables import table
from traceguard.report.units import value_h

#: Distribution rows shown: the per-rank metrics an engineer reads first, in this order, then the rest.
FIRST_METRICS = (
    "nccl_share_of_step",
    "nccl_wait_share",
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "straggler_spread",
    "step_count",
    "gpu_span_ns",
    "nccl_time_ns",
    "gpu_to_cpu_copy_rate",
    "dtod_bytes_per_step",
)
#: Worst-step lists shown, with their titles.
WORST_STEP_TITLES = {
    "nccl_share": "highest NCCL share of the step",
    "nccl_wait_ns": "longest NCCL time waiting for the last rank",
    "lateness_ns": "latest arrivals at the step's collectives",
    "gpu_span_ns": "longest GPU span",
}
#: Heat maps drawn, with their titles and colour bar units.
HEATMAP_TITLES = {
    "nccl_share": ("NCCL share of each step", "share"),
    "nccl_wait_ns": ("NCCL time waiting for the last rank", "ms"),
    "lateness_ns": ("Lateness at the step's collectives", "ms"),
}
_SHOWN_STEPS = 5


def is_summary(doc: dict[str, Any]) -> bool:
    return (doc.get("detail") or {}).get("mode") == "summary" and "rank_summary" in doc


def distribution_rows(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(metric, distribution) of the metrics known on some rank, :data:`FIRST_METRICS` first."""
    found = doc["rank_summary"]["distributions"]
    order = [k for k in FIRST_METRICS if k in found] + sorted(k for k in found if k not in FIRST_METRICS)
    return [(k, found[k]) for k in order if found[k].get("ranks")]


def _at_max(d: dict[str, Any]) -> str:
    """The rank at the max, or a dash when every rank has the same value (no rank stands out)."""
    return "—" if d["max"] == d["min"] else str(d["max_rank"])


def _kept_line(doc: dict[str, Any]) -> str:
    summary, detail = doc["rank_summary"], doc.get("detail") or {}
    tables = detail.get("tables") or {}
    rows = ", ".join(f"{name} {info['rows']:,}" for name, info in tables.items() if info.get("rows"))
    where = (
        f"in the Parquet side output `{detail['folder']}`"
        if detail.get("folder")
        else "stored beside this report (the service's steps and links queries)"
    )
    return (
        f"This report keeps {len(summary['in_report'])} of {summary['ranks']:,} ranks whole (the sections below); "
        f"every rank's and step's rows are {where}" + (f" (rows: {rows})" if rows else "") + "."
    )


def markdown_section(doc: dict[str, Any]) -> list[str]:
    if not is_summary(doc):
        return []
    summary = doc["rank_summary"]
    lines = ["", f"## Ranks: a summary of {summary['ranks']:,}", "", _kept_line(doc), ""]
    lines += table(["rank", "kept because"], [[str(e["rank"]), "; ".join(e["why"])] for e in summary["in_report"]])
    lines += ["", "Each per-rank metric over the ranks where it is known:", ""]
    rows = [
        [
            f"`{key}`",
            f"{d['ranks']:,}",
            value_h(key, d["min"]),
            value_h(key, d["p50"]),
            value_h(key, d["p95"]),
            value_h(key, d["max"]),
            _at_max(d),
        ]
        for key, d in distribution_rows(doc)
    ]
    lines += table(["metric", "ranks", "min", "p50", "p95", "max", "rank at max"], rows)
    for field, title in WORST_STEP_TITLES.items():
        worst = (doc.get("worst_steps") or {}).get(field) or []
        if not worst:
            continue
        lines += ["", f"Steps with the {title}:", ""]
        lines += table(
            ["rank", "step", "index", field, "GPU span"],
            [
                [
                    str(r["rank"]),
                    str(r["step"]),
                    str(r["index"]),
                    value_h(field, r[field]),
                    value_h("gpu_span_ns", r["gpu_span_ns"]),
                ]
                for r in worst[:_SHOWN_STEPS]
            ],
        )
    return lines


def heatmap_figures(doc: dict[str, Any]) -> list[tuple[str, go.Figure]]:
    """One rank × step heat map per :data:`HEATMAP_TITLES` field with a known value."""
    matrix = doc.get("rank_steps") or {}
    ranks, indices = matrix.get("ranks") or [], matrix.get("indices") or []
    figures = []
    for field, (title, unit) in HEATMAP_TITLES.items():
        values = (matrix.get("fields") or {}).get(field) or []
        if not values or not any(v is not None for row in values for v in row):
            continue
        scale = 1e-6 if unit == "ms" else 1.0
        z = [[None if v is None else v * scale for v in row] for row in values]
        binned = f" (step indices in bins of {matrix.get('bin_width')})" if matrix.get("binned") else ""
        fig = go.Figure(
            go.Heatmap(
                z=z,
                x=[str(i) for i in indices],
                y=[str(r) for r in ranks],
                colorscale="Viridis",
                colorbar={"title": unit},
                hovertemplate="rank %{y} · step %{x}<br>%{z}<extra></extra>",
            )
        )
        fig.update_layout(
            title=f"{title}, rank × step{binned}",
            xaxis_title="step index",
            yaxis_title="rank",
            yaxis={"type": "category"},
            xaxis={"type": "category"},
            height=min(900, 240 + 3 * len(ranks)),
            margin={"t": 60},
        )
        figures.append((f"heatmap-{field.replace('_', '-')}", fig))
    return figures


def histogram_svg(counts: list[int], width: int = 120, height: int = 22) -> str:
    """A distribution's histogram as an inline SVG of one bar per bin, its ranks in the bar's title."""
    top = max(counts) or 1
    step = width / len(counts)
    bars = "".join(
        f"<rect x='{i * step:.1f}' y='{height - height * c / top:.1f}' width='{max(step - 1, 1):.1f}' "
        f"height='{height * c / top:.1f}' fill='#0969da'><title>{c} rank{'s' if c != 1 else ''}</title></rect>"
        for i, c in enumerate(counts)
    )
    return f"<svg class='histogram' width='{width}' height='{height}' role='img'>{bars}</svg>"


def html_section(doc: dict[str, Any]) -> str:
    if not is_summary(doc):
        return ""
    e = html.escape
    summary = doc["rank_summary"]
    parts = [
        f"<h2 id='rank-summary'>Ranks: a summary of {summary['ranks']:,}</h2>",
        f"<p>{e(_kept_line(doc))}</p>",
        "<table id='kept-ranks'><tr><th>rank</th><th>kept because</th></tr>",
    ]
    parts += [f"<tr><td>{e(str(k['rank']))}</td><td>{e('; '.join(k['why']))}</td></tr>" for k in summary["in_report"]]
    parts.append(
        "</table><table id='distributions'><tr><th>metric</th><th>ranks</th><th>min</th><th>p50</th>"
        "<th>p95</th><th>max</th><th>rank at max</th><th>ranks per bin, min to max</th></tr>"
    )
    for key, d in distribution_rows(doc):
        cells = [f"{d['ranks']:,}", *(value_h(key, d[s]) for s in ("min", "p50", "p95", "max")), _at_max(d)]
        parts.append(
            f"<tr data-metric='{e(key)}'><td><code>{e(key)}</code></td>"
            + "".join(f"<td>{e(c)}</td>" for c in cells)
            + f"<td>{histogram_svg(d['histogram']['counts'])}</td></tr>"
        )
    parts.append("</table>")
    for fig_id, fig in heatmap_figures(doc):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=False, div_id=fig_id))
    for field, title in WORST_STEP_TITLES.items():
        worst = (doc.get("worst_steps") or {}).get(field) or []
        if not worst:
            continue
        parts.append(f"<h3>Steps with the {e(title)}</h3><table data-worst='{e(field)}'>")
        parts.append("<tr><th>rank</th><th>step</th><th>index</th><th>value</th><th>GPU span</th></tr>")
        for r in worst[:_SHOWN_STEPS]:
            cells = [
                r["rank"],
                r["step"],
                r["index"],
                value_h(field, r[field]),
                value_h("gpu_span_ns", r["gpu_span_ns"]),
            ]
            parts.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
    return "\n".join(parts)
