"""The Markdown section naming what the run's workload does (report ``run.workload``,
metrics/workloads.py): point-to-point transfers per peer, the broadcast/reduce payload and the
host's blocked time, the pipeline bubble. Empty for a run that is neither a pipeline nor a
broadcast-reduce and has no transfer ranges (a DDP job)."""

from __future__ import annotations

from typing import Any

from traceguard.report.tables import table
from traceguard.report.units import bytes_h, pct


def _or_dash(value: float | None, render: Any) -> str:
    return "—" if value is None else render(value)


def workload_section(doc: dict[str, Any]) -> list[str]:
    workload = doc["run"].get("workload") or {}
    if not workload.get("kind") and not workload.get("peer_matrix"):
        return []
    lines = ["", f"## Workload: {workload.get('kind') or 'point-to-point transfers'}", ""]
    if workload.get("peer_matrix"):
        rows = [
            [
                str(r["rank"]),
                str(r["peer"]),
                bytes_h(r["sent_bytes_per_step"]),
                bytes_h(r["received_bytes_per_step"]),
                _or_dash(r.get("profiler_sent_bytes_per_step"), bytes_h),
                f"{r['sends']} / {r['recvs']}",
            ]
            for r in workload["peer_matrix"]
        ]
        header = ["rank", "peer", "sent / step", "received / step", "sent / step (PyTorch's record)", "sends / recvs"]
        lines += table(header, rows)
    payload = workload.get("payload_bytes_per_step") or {}
    blocked = workload.get("host_blocked_ns_per_step") or {}
    if payload or blocked:
        mode = {True: "async (issue, compute, wait)", False: "blocking"}.get(workload.get("asynchronous"), "n/a")
        lines += (["", ""] if workload.get("peer_matrix") else []) + [
            f"Broadcast / reduce, {mode} (mean over ranks):",
            "",
        ]
        rows = [
            [op, _or_dash(payload.get(op), bytes_h), _or_dash(blocked.get(op), lambda ns: f"{ns / 1e6:.2f} ms")]
            for op in sorted(set(payload) | set(blocked))
        ]
        lines += table(["collective", "payload / step", "host blocked / step"], rows)
    if workload.get("kind") == "pipeline":
        by_rank = ", ".join(f"rank {k}: {_or_dash(v, pct)}" for k, v in (workload.get("bubble_by_rank") or {}).items())
        bubble = pct(workload.get("bubble"))
        lines += ["", f"Pipeline bubble (step GPU span with no compute kernel): {bubble} ({by_rank})"]
        if reason := (workload.get("null_reasons") or {}).get("bubble"):
            lines += ["", f"Bubble not available: {reason}"]
    return lines
