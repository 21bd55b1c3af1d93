"""Markdown rendering of the report document (for PR comments and CI summaries)."""

from __future__ import annotations

from typing import Any

from traceguard.report.units import bytes_h, ms, pct, value_h

_ICON = {"pass": "✅ pass", "warn": "⚠️ warn", "fail": "❌ fail", "skip": "⏭️ skip"}


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out


def render(doc: dict[str, Any]) -> str:
    lines = [f"# traceguard report — {doc['verdict'].upper()}", ""]
    lines.append(f"Profile `{doc['profile']['name']}` · traceguard {doc['traceguard_version']} · {doc['generated_at']}")
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
    bad = [i for i in doc["inputs"] if i["error"] or i["warnings"]]
    if bad:
        lines += ["", "## Inputs", ""]
        for i in bad:
            if i["error"]:
                lines.append(f"- `{i['path']}`: **error** {i['error']}")
            for w in i["warnings"]:
                lines.append(f"- `{i['path']}`: {w}")
    return "\n".join(lines) + "\n"
