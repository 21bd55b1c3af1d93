"""Markdown rendering of the report document (for PR comments and CI summaries)."""

from __future__ import annotations

from typing import Any

from traceguard.report.sizes import REGIMES, bands, size_rows, small_bytes
from traceguard.report.steps import step_sources_line
from traceguard.report.tables import table
from traceguard.report.units import bytes_h, ms, pct, value_h
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
    lines += collectives_section(doc)
    lines += workload_section(doc)
    lines += sizes_section(doc)
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
    bad = [i for i in doc["inputs"] if i["error"] or i["warnings"]]
    if bad:
        lines += ["", "## Inputs", ""]
        for i in bad:
            if i["error"]:
                lines.append(f"- `{i['path']}`: **error** {i['error']}")
            for w in i["warnings"]:
                lines.append(f"- `{i['path']}`: {w}")
    return "\n".join(lines) + "\n"
