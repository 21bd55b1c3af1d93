"""The report's ``inspector`` section: what NCCL Inspector logs say (metrics.inspector; docs/inspector.md)."""

from __future__ import annotations

from typing import Any

from traceguard.report.tables import table
from traceguard.report.units import bytes_h, held_up_clause, ms, pct, value_h

#: Time-window rows the Markdown shows (all are in the JSON).
MAX_WINDOW_ROWS = 30


def inspector_document(result: Any) -> dict[str, Any] | None:
    """The JSON section (None when no Inspector log was given)."""
    if result is None:
        return None
    return {
        "metrics": {**result.metrics, "null_reasons": dict(result.null_reasons)},
        "arrival_source": result.arrival_source,
        "arrival_check": result.arrival_check,
        "window_s": result.window_s,
        "window_time": result.window_time,
        "late_rank": result.late,
        "ranks": result.per_rank,
        "by_type": result.by_type,
        "transfer": result.transfer,
        "windows": result.windows,
        "prometheus": result.prom,
        "files": result.files,
        "notes": result.notes,
    }


def inspector_section(doc: dict[str, Any]) -> list[str]:
    """Markdown: the Inspector's split, late rank, bandwidth on transfer time and time windows."""
    section = doc.get("inspector")
    if not section:
        return []
    m = section["metrics"]
    lines = ["", "## NCCL Inspector", ""]
    files = section["files"]
    read = [f for f in files if not f["error"]]
    versions = sorted({f["version"] for f in read if f["version"]})
    verbose = any(f["verbose"] for f in read)
    lines.append(
        f"{len(read)} of {len(files)} file(s) read ({m.get('inspector_lines', 0):,} lines, "
        f"{m.get('inspector_ranks', 0)} rank(s), format {', '.join(versions) or 'unknown'}"
        f"{', verbose' if verbose else ''})."
    )
    for f in files:
        if f["error"]:
            lines.append(f"- `{f['path']}`: **error** {f['error']}")
        for w in f["warnings"]:
            lines.append(f"- `{f['path']}`: {w}")
    lines.append("")
    if m.get("nccl_wait_share") is not None:
        lines.append(
            f"Matched {m['collective_instances_matched']:,} collective instances on all their ranks by communicator "
            f"id + `coll_sn` ({m['collective_instances_unmatched']:,} unmatched). Transfer = the shortest execution "
            f"time of an instance's ranks; the rest of each rank's time is waiting: **{pct(m['nccl_wait_share'])}** "
            f"of the collectives' time waits for the last rank. Arrivals from: {section['arrival_source']}."
        )
        check = section.get("arrival_check")
        if check:
            lines.append(
                f"Verbose kernel starts (host wall clock when the plugin saw a channel start) against the split: "
                f"the same last rank at {check['same_last_rank']} of {check['instances']} instances "
                f"({check['clear_same_last_rank']} of {check['clear_instances']} where the last rank is > 50 µs late); "
                f"lateness differs by {check['lateness_diff_median_ns'] / 1e3:.0f} µs median, "
                f"{check['lateness_diff_max_ns'] / 1e3:.0f} µs at most."
            )
        late = section.get("late_rank")
        if late:
            lines.append(
                f"Late rank: **{late['rank']}** ({late['host']} pid {late['pid']}), last to arrive at "
                f"{late['last_arrivals']} of {late['of']} instances with a last rank, "
                f"median {ms(late['median_late_ns'])} late ({late['instances_together']} instances arrived together)"
                f"{held_up_clause(late)}."
            )
        else:
            lines.append(f"No late rank: {m['null_reasons'].get('late_rank', 'none')}.")
        lines.append("")
        lines += table(
            ["rank", "host", "pid", "wait", "transfer", "wait share", "last to arrive", "median late"],
            [
                [
                    str(r["rank"]),
                    r["host"],
                    str(r["pid"]),
                    ms(r["nccl_wait_ns"]),
                    ms(r["nccl_transfer_ns"]),
                    pct(r["nccl_wait_share"]),
                    f"{r['last_arrivals']['count']} / {r['last_arrivals']['of']}",
                    ms(r["last_arrivals"]["median_late_ns"]),
                ]
                for r in section["ranks"]
            ],
        )
    else:
        lines.append(f"No wait / transfer split: {m['null_reasons'].get('nccl_wait_share', 'not available')}.")
    if section["transfer"]:
        lines += ["", "Bandwidth on transfer time (the plugin's busbw counts the waiting in):", ""]
        lines += table(
            ["communicator", "type", "size", "instances", "transfer median", "busbw (transfer)", "busbw (plugin)"],
            [
                [
                    r["comm_id"],
                    r["coll"],
                    bytes_h(r["msg_bytes"]),
                    str(r["instances"]),
                    ms(r["transfer_median_ns"]),
                    value_h("gbps", r["busbw_transfer_median_gbps"]),
                    value_h("gbps", r["busbw_reported_median_gbps"]),
                ]
                for r in section["transfer"]
            ],
        )
    if section["by_type"]:
        lines += ["", "Per rank, communicator and type (the plugin's own numbers):", ""]
        lines += table(
            ["rank", "communicator", "type", "count", "bytes", "exec", "median", "p95", "busbw median", "busbw p95"],
            [
                [
                    str(r["rank"]),
                    r["comm_id"],
                    r["coll"],
                    str(r["count"]),
                    bytes_h(r["bytes"]),
                    ms(r["exec_ns"]),
                    ms(r["exec_median_ns"]),
                    ms(r["exec_p95_ns"]),
                    value_h("gbps", r["busbw_median_gbps"]),
                    value_h("gbps", r["busbw_p95_gbps"]),
                ]
                for r in section["by_type"]
            ],
        )
    if section["windows"]:
        lines += [
            "",
            f"No steps in Inspector logs: {section['window_s']}-s time windows by {section['window_time']} (UTC):",
            "",
        ]
        from datetime import UTC, datetime

        rows = [
            [
                datetime.fromtimestamp(w["window_start_s"], UTC).strftime("%Y-%m-%d %H:%M:%S"),
                str(w["instances"]),
                ms(w["wait_ns"]),
                ms(w["transfer_ns"]),
                pct(w["nccl_wait_share"]),
                "none" if w["late_rank"] is None else str(w["late_rank"]),
                value_h("gbps", w["busbw_transfer_median_gbps"]),
            ]
            for w in section["windows"][:MAX_WINDOW_ROWS]
        ]
        lines += table(["window", "instances", "wait", "transfer", "wait share", "late rank", "busbw (transfer)"], rows)
        if len(section["windows"]) > MAX_WINDOW_ROWS:
            lines.append(f"… {len(section['windows']) - MAX_WINDOW_ROWS} more windows in the JSON report")
    if section["prometheus"]:
        lines += ["", "Prometheus snapshot (means since the previous dump; no sequence numbers, nothing matched):", ""]
        lines += table(
            ["file", "node", "gpu", "communicator", "type", "size", "algo_proto", "exec mean", "busbw (geo. mean)"],
            [
                [
                    (r.get("path") or "").rsplit("/", 1)[-1],
                    r["node"] or "",
                    r["gpu"] or "",
                    r["comm_name"] or "",
                    r["coll"] or "",
                    r["message_size"] or "",
                    r["algo_proto"] or "",
                    "n/a" if r["exec_mean_us"] is None else f"{r['exec_mean_us']:.1f} µs",
                    value_h("gbps", r["busbw_gm_gbps"]),
                ]
                for r in section["prometheus"]
            ],
        )
    for note in section["notes"]:
        lines += ["", f"Note: {note}."]
    lines += ["", "Definitions: docs/inspector.md."]
    return lines


def inspector_html(doc: dict[str, Any]) -> str:
    """HTML: the split per rank, the late rank and the time windows (the trend of a long job)."""
    import html

    section = doc.get("inspector")
    if not section:
        return ""
    e = html.escape
    m = section["metrics"]
    parts = ["<h2 id='inspector'>NCCL Inspector</h2>"]
    if m.get("nccl_wait_share") is not None:
        parts.append(
            f"<p>{m['collective_instances_matched']:,} collective instances matched on all their ranks by "
            f"communicator id + coll_sn ({m['collective_instances_unmatched']:,} unmatched): "
            f"<b>{e(pct(m['nccl_wait_share']))}</b> of their time waits for the last rank (transfer = the shortest "
            f"execution over the ranks). Arrivals from: {e(str(section['arrival_source']))}.</p>"
        )
        late = section.get("late_rank")
        parts.append(
            f"<p>Late rank: <b>{late['rank']}</b> ({e(str(late['host']))} pid {late['pid']}), last at "
            f"{late['last_arrivals']} of {late['of']} instances with a last rank.</p>"
            if late
            else f"<p>No late rank: {e(m['null_reasons'].get('late_rank', 'none'))}.</p>"
        )
        parts.append(
            "<table id='inspector-ranks'><tr><th>rank</th><th>host</th><th>pid</th><th>wait</th><th>transfer</th>"
            "<th>wait share</th><th>last to arrive</th></tr>"
        )
        for r in section["ranks"]:
            parts.append(
                f"<tr><td>{r['rank']}</td><td>{e(str(r['host']))}</td><td>{r['pid']}</td>"
                f"<td>{ms(r['nccl_wait_ns'])}</td><td>{ms(r['nccl_transfer_ns'])}</td>"
                f"<td>{pct(r['nccl_wait_share'])}</td>"
                f"<td>{r['last_arrivals']['count']} / {r['last_arrivals']['of']}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append(
            f"<p>No wait / transfer split: {e(m['null_reasons'].get('nccl_wait_share', 'not available'))}.</p>"
        )
    if section["windows"]:
        from datetime import UTC, datetime

        parts.append(
            f"<p class='muted'>No steps in Inspector logs: {section['window_s']}-s time windows by "
            f"{e(str(section['window_time']))} (UTC).</p><table id='inspector-windows'><tr><th>window</th>"
            "<th>instances</th><th>wait share</th><th>late rank</th><th>busbw on transfer time</th></tr>"
        )
        for w in section["windows"][:MAX_WINDOW_ROWS]:
            start = datetime.fromtimestamp(w["window_start_s"], UTC).strftime("%Y-%m-%d %H:%M:%S")
            parts.append(
                f"<tr><td>{start}</td><td>{w['instances']}</td><td>{pct(w['nccl_wait_share'])}</td>"
                f"<td>{'none' if w['late_rank'] is None else w['late_rank']}</td>"
                f"<td>{value_h('gbps', w['busbw_transfer_median_gbps'])}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<p class='muted'>Definitions: docs/inspector.md.</p>")
    return "\n".join(parts)
