"""The results table of a harness sweep: one row per setting, from each bundle's report.

Throughput is the manifest's (timed outside the capture; with ``--repeats`` the median of the
repeats, each paced by the slowest rank, and their spread (max − min) ÷ median). The workload
columns come from the report's ``run.workload`` (metrics/workloads.py): bytes sent per step over
all ranks' point-to-point transfers, the broadcast + reduce payload per step, the host's blocked
communication time per step (mean over ranks) and the pipeline bubble.
"""

from __future__ import annotations

from typing import Any

from traceguard.report.tables import table
from traceguard.report.units import bytes_h, pct

COLUMNS = (
    "setting",
    "throughput (steps/s)",
    "NCCL share of step",
    "exposed NCCL / step",
    "DtoD / step",
    "all-reduce payload / step",
    "GPU→CPU copy rate",
    "transport",
    "workload",
    "P2P sent / step",
    "bcast + reduce payload / step",
    "host blocked in comm / step",
    "bubble",
    "verdict",
    "failing / warning checks",
)


def row(setting: str, options: list[str], manifest: dict[str, Any], report: dict[str, Any] | None) -> dict[str, Any]:
    """One setting's numbers (raw values for JSON; the Markdown renders them)."""
    if report is None:
        return {
            "setting": setting,
            "options": options,
            "exit_status": manifest.get("exit_status"),
            "refused": manifest.get("refused"),
            "verdict": None,
        }
    m = report["run"]["metrics"]
    steps = m.get("step_count") or 0
    exposed = m.get("nccl_exposed_ns")
    workload = report["run"].get("workload") or {}
    matrix = workload.get("peer_matrix") or []
    sent = [r["sent_bytes_per_step"] for r in matrix if r.get("sent_bytes_per_step") is not None]
    payload = workload.get("payload_bytes_per_step") or {}
    blocked = workload.get("host_blocked_ns_per_step") or {}
    return {
        "setting": setting,
        "options": options,
        "exit_status": manifest.get("exit_status"),
        "throughput_steps_per_s": manifest.get("throughput_steps_per_s"),
        "throughput_repeats_steps_per_s": manifest.get("throughput_repeats_steps_per_s") or [],
        "throughput_spread": manifest.get("throughput_spread"),
        "nccl_share_of_step": m.get("nccl_share_of_step"),
        "nccl_exposed_ns_per_step": exposed / steps if exposed is not None and steps else None,
        "dtod_bytes_per_step": m.get("dtod_bytes_per_step"),
        "allreduce_bytes_per_step": m.get("allreduce_bytes_per_step"),
        "gpu_to_cpu_copy_rate": m.get("gpu_to_cpu_copy_rate"),
        "transports": m.get("nccl_transports"),
        "workload": (manifest.get("workload") or {}).get("name") or (manifest.get("config") or {}).get("workload"),
        "workload_kind": workload.get("kind"),
        "p2p_sent_bytes_per_step": sum(sent) if sent else None,
        "rooted_payload_bytes_per_step": sum(payload.values()) if payload else None,
        "host_blocked_ns_per_step": sum(blocked.values()) if blocked else None,
        "bubble": workload.get("bubble"),
        "bubble_null_reason": (workload.get("null_reasons") or {}).get("bubble"),
        "verdict": report["verdict"],
        "checks": {c["id"]: c["status"] for c in report["checks"]},
    }


def _throughput(r: dict[str, Any]) -> str:
    value = r.get("throughput_steps_per_s")
    if not value:
        return "n/a"
    spread = r.get("throughput_spread")
    n = len(r.get("throughput_repeats_steps_per_s") or [])
    return f"{value:.2f} (spread {spread:.1%}, {n} runs)" if spread is not None else f"{value:.2f}"


def _bytes_or_dash(n: float | None) -> str:
    return bytes_h(n) if n is not None else "—"


def render_markdown(rows: list[dict[str, Any]], profile: str) -> str:
    body = []
    for r in rows:
        if r.get("verdict") is None:
            why = "run failed" if r.get("exit_status") else "analysis failed"
            why = f"refused: {r['refused']}" if r.get("refused") else why
            body.append([r["setting"], why, *["—"] * (len(COLUMNS) - 3), f"exit {r.get('exit_status')}"])
            continue
        bad = [f"{k} ({v})" for k, v in r["checks"].items() if v in ("fail", "warn")]
        exposed = r["nccl_exposed_ns_per_step"]
        blocked = r.get("host_blocked_ns_per_step")
        body.append(
            [
                r["setting"],
                _throughput(r),
                pct(r["nccl_share_of_step"]),
                f"{exposed / 1e6:.1f} ms" if exposed is not None else "n/a",
                bytes_h(r["dtod_bytes_per_step"]),
                bytes_h(r["allreduce_bytes_per_step"]),
                pct(r["gpu_to_cpu_copy_rate"]),
                ", ".join(r["transports"] or []) or "n/a",
                r.get("workload") or "n/a",
                _bytes_or_dash(r.get("p2p_sent_bytes_per_step")),
                _bytes_or_dash(r.get("rooted_payload_bytes_per_step")),
                f"{blocked / 1e6:.2f} ms" if blocked is not None else "—",
                pct(r.get("bubble")) if r.get("bubble") is not None else "—",
                r["verdict"],
                ", ".join(bad) or "—",
            ]
        )
    return "\n".join([f"Profile `{profile}`.", "", *table(list(COLUMNS), body)]) + "\n"
