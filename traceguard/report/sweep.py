"""The results table of a harness sweep: one row per setting, from each bundle's report."""

from __future__ import annotations

from typing import Any

from traceguard.report.markdown import table
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
    "verdict",
    "failing / warning checks",
)


def row(setting: str, options: list[str], manifest: dict[str, Any], report: dict[str, Any] | None) -> dict[str, Any]:
    """One setting's numbers (raw values for JSON; the Markdown renders them)."""
    if report is None:
        return {"setting": setting, "options": options, "exit_status": manifest.get("exit_status"), "verdict": None}
    m = report["run"]["metrics"]
    steps = m.get("step_count") or 0
    exposed = m.get("nccl_exposed_ns")
    return {
        "setting": setting,
        "options": options,
        "exit_status": manifest.get("exit_status"),
        "throughput_steps_per_s": manifest.get("throughput_steps_per_s"),
        "nccl_share_of_step": m.get("nccl_share_of_step"),
        "nccl_exposed_ns_per_step": exposed / steps if exposed is not None and steps else None,
        "dtod_bytes_per_step": m.get("dtod_bytes_per_step"),
        "allreduce_bytes_per_step": m.get("allreduce_bytes_per_step"),
        "gpu_to_cpu_copy_rate": m.get("gpu_to_cpu_copy_rate"),
        "transports": m.get("nccl_transports"),
        "verdict": report["verdict"],
        "checks": {c["id"]: c["status"] for c in report["checks"]},
    }


def render_markdown(rows: list[dict[str, Any]], profile: str) -> str:
    body = []
    for r in rows:
        if r.get("verdict") is None:
            body.append([r["setting"], "run failed", *["—"] * 7, f"exit {r.get('exit_status')}"])
            continue
        bad = [f"{k} ({v})" for k, v in r["checks"].items() if v in ("fail", "warn")]
        exposed = r["nccl_exposed_ns_per_step"]
        body.append(
            [
                r["setting"],
                f"{r['throughput_steps_per_s']:.2f}" if r["throughput_steps_per_s"] else "n/a",
                pct(r["nccl_share_of_step"]),
                f"{exposed / 1e6:.1f} ms" if exposed is not None else "n/a",
                bytes_h(r["dtod_bytes_per_step"]),
                bytes_h(r["allreduce_bytes_per_step"]),
                pct(r["gpu_to_cpu_copy_rate"]),
                ", ".join(r["transports"] or []) or "n/a",
                r["verdict"],
                ", ".join(bad) or "—",
            ]
        )
    return "\n".join([f"Profile `{profile}`.", "", *table(list(COLUMNS), body)]) + "\n"
