"""Markdown rendering of the report document (for PR comments and CI summaries)."""

from __future__ import annotations

from typing import Any

from traceguard.report.inspector import inspector_section
from traceguard.report.links import markdown_section as links_section
from traceguard.report.overview import markdown_section as overview_section
from traceguard.report.sizes import REGIMES, bands, size_rows, small_bytes
from traceguard.report.steps import step_sources_line
from traceguard.report.tables import table
from traceguard.report.units import bytes_h, held_up_clause, ms, pct, value_h
from traceguard.report.workloads import workload_section

_ICON = {"pass": "✅ pass", "warn": "⚠️ warn", "fail": "❌ fail", "skip": "⏭️ skip"}


def sizes_section(doc: dict[str, Any]) -> list[str]:
    """Collective calls inside the steps per payload band, and the small calls' issuers."""
    rows = size_rows(doc)
    if not rows:
        return []
    bound = small_bytes(doc)
    lines = ["", "## Collective payload sizes", ""]
    if bound:
        lines += [f"Calls inside the steps by payload (small: < {bytes_h(bound)}). {REGIMES}", ""]
    labels = bands()
    lines += table(
        ["rank", "collective", *labels],
        [[str(rank), collective, *(str(counts.get(b, 0)) for b in labels)] for rank, collective, counts in rows],
    )
    offenders = [
        [
            str(rank["rank"]),
            o["collective"],
            o.get("issuer") or "—",
            str(o["calls"]),
            bytes_h(o["min_bytes"]),
            bytes_h(o["max_bytes"]),
        ]
        for rank in doc["ranks"]
        for o in (rank.get("small_collectives") or {}).get("offenders", [])
    ]
    if offenders:
        lines += ["", "Small calls by issuer:", ""]
        lines += table(["rank", "collective", "issued by", "calls", "smallest", "largest"], offenders)
    return lines


#: Per-step collective rows shown per rank (the JSON report has all of them).
MAX_STEP_ROWS = 40


def collectives_section(doc: dict[str, Any]) -> list[str]:
    """Collectives by type per rank (window totals) and the rank × peer matrix."""
    lines = ["", "## Collectives by type", ""]
    rows = []
    for rank in doc["ranks"]:
        for r in (rank.get("collectives_by_type") or {}).get("totals") or []:
            exposed = r["exposed_ns"] / r["time_ns"] if r["time_ns"] else None
            issued = ", ".join(f"{op} {n}" for op, n in (r.get("issued_as") or {}).items())
            rows.append(
                [
                    str(rank["rank"]),
                    r["collective"] + (f" ({issued})" if issued else ""),
                    str(r["count"]),
                    ms(r["time_ns"]),
                    ms(r["exposed_ns"]),
                    pct(exposed),
                    bytes_h(r["bytes"]),
                ]
            )
    if rows:
        lines += table(["rank", "collective", "count", "time", "exposed", "exposed share", "bytes"], rows)
    else:
        lines.append("No NCCL kernels in the analysis window.")
    matrix = doc["run"].get("peer_matrix") or {}
    lines += ["", "### Point-to-point peers", ""]
    if matrix.get("rows"):
        rows = [
            [
                str(r["rank"]),
                str(r["peer"]),
                str(r["kernels"]),
                ms(r["time_ns"]),
                "—" if r["sends"] is None else str(r["sends"]),
                "—" if r["recvs"] is None else str(r["recvs"]),
                bytes_h(r["bytes"]),
                r["source"],
            ]
            for r in matrix["rows"]
        ]
        lines += table(["rank", "peer", "kernels", "time", "sends", "recvs", "bytes", "peer named by"], rows)
    if matrix.get("null_reason"):
        lines += ["", f"Peers not named: {matrix['null_reason']}"]
    return lines


def waits_section(doc: dict[str, Any]) -> list[str]:
    """Who waits for whom (docs/collectives.md): the clock alignment, the late rank, each rank's
    NCCL time split into waiting for the last rank and transfer, and each step's GPU time."""
    run = doc["run"]
    clock = run.get("clock_alignment")
    if clock is None or len(doc["ranks"]) < 2:
        return []
    lines = ["", "## Who waits for whom", ""]
    if clock.get("method"):
        measured = any(c["residual_ns"] is not None for c in clock["ranks"])
        if not clock["trusted"]:
            trust = f"**not trusted**: {clock['reason']}"
        elif measured:
            trust = f"trusted (every residual ≤ {ms(clock['residual_limit_ns'])})"
        else:
            trust = "trusted (the ranks share one host's clock)"
        lines.append(f"Clocks: {clock['method']}; reference rank {clock['reference_rank']}; {trust}.")
        lines.append("")
        lines += table(
            ["rank", "clock base", "offset", "residual", "matched calls"],
            [
                [
                    str(c["rank"]),
                    c["base_source"] or "none",
                    "n/a" if c["offset_ns"] is None else f"{c['offset_ns'] / 1e3:.1f} µs",
                    "n/a" if c["residual_ns"] is None else f"{c['residual_ns'] / 1e3:.1f} µs",
                    str(c["matched"]),
                ]
                for c in clock["ranks"]
            ],
        )
    else:
        lines.append(f"Clocks not aligned: {clock.get('reason') or 'no collective to align on'}.")
    lines.append("")
    if not clock["trusted"] and clock.get("reason"):
        why = "Without clocks that agree" if clock.get("method") else "With nothing to align on"
        lines.append(f"{why} there is no late rank and no wait / transfer split.")
    else:
        lines += _late_and_split(doc)
    lines += _step_time_table(doc)
    lines += ["", "Definitions: docs/collectives.md (check `collective_wait`)."]
    return lines


def _late_and_split(doc: dict[str, Any]) -> list[str]:
    """The late rank in a sentence, the run's wait share, and each rank's split."""
    run = doc["run"]
    metrics, reasons = run["metrics"], run["metrics"].get("null_reasons", {})
    lines: list[str] = []
    late = run.get("late_rank")
    if late:
        phases = ", ".join(f"`{p['phase']}` ({p['calls']})" for p in late["launched_in"])
        lines.append(
            f"**Rank {late['rank']} is the late rank**: it arrived last at {late['last_arrivals']} of {late['of']} "
            f"matched collectives ({pct(late['share'])}), median {ms(late['median_late_ns'])} after the first rank "
            f"(p95 {ms(late['p95_late_ns'])})"
            + (f", launched in {phases}" if phases else "")
            + (f"; late in steps {', '.join(map(str, late['steps_late']))}" if late["steps_late"] else "")
            + held_up_clause(late)
            + "."
        )
    else:
        lines.append(f"No late rank: {reasons.get('late_rank', 'not available')}.")
    if metrics.get("nccl_wait_share") is not None:
        lines.append(
            f"Of the matched collectives' NCCL kernel time, {pct(metrics['nccl_wait_share'])} was waiting for the "
            f"last rank ({ms(metrics['nccl_wait_ns'])} waiting, {ms(metrics['nccl_transfer_ns'])} transfer)."
        )
    else:
        lines.append(f"Wait and transfer not split: {reasons.get('nccl_wait_share', 'not available')}.")
    rows = []
    for rank in doc["ranks"]:
        m = rank["metrics"]
        last = m.get("last_arrivals") or {}
        rows.append(
            [
                str(rank["rank"]),
                ms(m.get("nccl_wait_ns")),
                ms(m.get("nccl_transfer_ns")),
                pct(m.get("nccl_wait_share")),
                f"{last['count']} of {last['of']}" if last else "n/a",
                ms(last.get("median_late_ns")),
            ]
        )
    lines += ["", *table(["rank", "NCCL wait", "transfer", "wait share", "last to arrive", "median late"], rows)]
    return lines


def _step_time_table(doc: dict[str, Any]) -> list[str]:
    """Each step's GPU time broken down over its period, with the rank's lateness."""
    lines: list[str] = []
    steps = [(rank["rank"], s) for rank in doc["ranks"] for s in rank["steps"] if s.get("period_ns") is not None]
    if steps:
        lines += ["", "GPU time of each step (its period: from the previous step's GPU end to its own):", ""]
        lines += table(
            [
                "rank",
                "step",
                "period",
                "compute",
                "comm wait",
                "comm transfer",
                "copies",
                "idle (host)",
                "idle (other)",
                "lateness",
            ],
            [
                [
                    str(rank_id),
                    s["name"],
                    ms(s["period_ns"]),
                    ms(s["compute_ns"]),
                    ms(s["comm_wait_ns"]) if s.get("comm_wait_ns") is not None else f"{ms(s['comm_ns'])} (not split)",
                    ms(s.get("comm_transfer_ns")),
                    ms(s["copy_ns"]),
                    ms(s["idle_host_ns"]),
                    ms(s["idle_other_ns"]),
                    ms(s.get("lateness_ns")),
                ]
                for rank_id, s in steps[:MAX_STEP_ROWS]
            ],
        )
        if len(steps) > MAX_STEP_ROWS:
            lines.append(f"… {len(steps) - MAX_STEP_ROWS} more rows in the JSON report")
    return lines


def render(doc: dict[str, Any]) -> str:
    lines = [f"# traceguard report — {doc['verdict'].upper()}", ""]
    lines.append(f"Profile `{doc['profile']['name']}` · traceguard {doc['traceguard_version']} · {doc['generated_at']}")
    if steps := step_sources_line(doc):
        lines += ["", steps]
    lines.append("")
    lines += ["## Checks", ""]
    rows = []
    for c in doc["checks"]:
        detail = c["reason"] if c["status"] == "skip" else c["message"]
        rows.append([f"`{c['id']}`", _ICON.get(c["status"], c["status"]), detail or ""])
    lines += table(["check", "status", "detail"], rows)
    for c in doc["checks"]:
        if c["status"] in ("warn", "fail"):
            lines += ["", f"### `{c['id']}` — {c['status']}", "", c["message"], ""]
            if c.get("remedy"):
                lines += [f"**Remedy:** {c['remedy']}", ""]
            for row in c["evidence"][:8]:
                lines.append("- " + ", ".join(f"{k}={value_h(k, v)}" for k, v in row.items()))
    m = doc["run"]["metrics"]
    lines += ["", "## Run metrics", ""]
    rows = [[k, value_h(k, v)] for k, v in m.items() if k != "null_reasons"]
    lines += table(["metric", "value"], rows)
    if m.get("null_reasons"):
        lines += ["", "Not available:"]
        lines += [f"- `{k}`: {v}" for k, v in m["null_reasons"].items()]
    lines += waits_section(doc)
    lines += inspector_section(doc)
    lines += collectives_section(doc)
    lines += workload_section(doc)
    lines += sizes_section(doc)
    lines += overview_section(doc)
    for rank in doc["ranks"]:
        lines += ["", f"## Rank {rank['rank']}", ""]
        if rank["steps"]:
            rows = []
            for s in rank["steps"]:
                phases = ", ".join(f"{name} {ms(p['cpu_ns'])}" for name, p in s["phases"].items())
                rows.append(
                    [
                        s["name"],
                        ms(s["cpu_ns"]),
                        ms(s["gpu_span_ns"]),
                        ms(s["nccl_ns"]),
                        pct(s["nccl_share"]),
                        bytes_h(s["dtod_bytes"]),
                        phases,
                    ]
                )
            lines += table(["step", "CPU", "GPU span", "NCCL", "NCCL share", "DtoD", "phases (CPU)"], rows)
        else:
            lines.append("No steps found.")
        if rank["collectives"]:
            lines += [""]
            rows = [
                [
                    c["collective"] or "?",
                    bytes_h(c["msg_bytes"]),
                    str(c["count"]),
                    ms(c["median_ns"]),
                    value_h("gbps", c["algbw_gbps"]),
                    value_h("gbps", c["busbw_gbps"]),
                ]
                for c in rank["collectives"]
            ]
            lines += table(["collective", "size", "count", "median", "algbw GB/s", "busbw GB/s"], rows)
        per_step = (rank.get("collectives_by_type") or {}).get("steps") or []
        if per_step:
            lines += ["", "Collectives per step:", ""]
            rows = [
                [
                    str(r["step_index"]),
                    r["collective"],
                    str(r["count"]),
                    ms(r["time_ns"]),
                    ms(r["exposed_ns"]),
                    bytes_h(r["bytes"]),
                ]
                for r in per_step[:MAX_STEP_ROWS]
            ]
            lines += table(["step", "collective", "count", "time", "exposed", "bytes"], rows)
            if len(per_step) > MAX_STEP_ROWS:
                lines.append(f"… {len(per_step) - MAX_STEP_ROWS} more rows in the JSON report")
        lines += links_section(rank)
    bad = [i for i in doc["inputs"] if i["error"] or i["warnings"]]
    if bad:
        lines += ["", "## Inputs", ""]
        for i in bad:
            if i["error"]:
                lines.append(f"- `{i['path']}`: **error** {i['error']}")
            for w in i["warnings"]:
                lines.append(f"- `{i['path']}`: {w}")
    return "\n".join(lines) + "\n"
