"""The link counters of a rank in words and tables (``ranks[].links``, metrics/link_counters.py):
PCIe and NVLink load over the steps, during the NCCL kernels and during the copies; where NCCL's
bytes went; which counters were read. Rows of text that the Markdown report prints here and the
HTML report (traceguard.report.link_charts) puts in its tables; no plotting.
"""

from __future__ import annotations

from typing import Any

from traceguard.report.tables import table
from traceguard.report.units import ms

#: The combined figures (per sample the busier direction), as the report names them.
LINKS = (("pcie", "PCIe"), ("nvlink", "NVLink"))
#: The sets of samples the detail's ``over`` has, as the tables name them.
OVER = (("window", "steps"), ("nccl", "NCCL kernels"), ("copies", "copies"))
#: Where the NCCL kernels' samples showed traffic (``nccl_split``).
SPLIT = (("nvlink", "NVLink"), ("pcie", "PCIe"), ("idle", "idle (neither link busy)"))
COUNTER_NAMES = {
    "pcie_rx_pct": "PCIe RX",
    "pcie_tx_pct": "PCIe TX",
    "nvlink_rx_pct": "NVLink RX",
    "nvlink_tx_pct": "NVLink TX",
    "sm_active_pct": "SMs active",
    "dram_bw_pct": "DRAM bandwidth",
}
TITLE = "Links (nsys GPU metrics)"
#: Per-step rows shown per rank (the JSON report has all of them).
MAX_STEP_ROWS = 40


def pct100(value: float | None) -> str:
    """A load in % of the link's peak (the detail's 0–100 figures)."""
    return "n/a" if value is None else f"{value:.1f} %"


def share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def null_reason(rank: dict[str, Any]) -> str | None:
    """Why the rank has no link figures, or None when it has them."""
    links = rank.get("links") or {"null_reason": "not in this report (made before the link counters)"}
    if links.get("device") is None:
        return links.get("null_reason") or "no GPU metrics samples of this rank's GPU"
    return None


def source_line(links: dict[str, Any]) -> str:
    """GPU, table, frequency and sample counts in one sentence."""
    samples = links.get("samples") or {}
    freq = links.get("frequency_hz")
    rate = f" at {freq / 1000:.1f} kHz" if freq else ""
    return (
        f"GPU {links['device']} ({links.get('source') or 'GPU metrics'}{rate}): {samples.get('window', 0)} samples "
        f"in the steps, {samples.get('nccl', 0)} during NCCL kernels, {samples.get('copies', 0)} during copies. "
        "Load per sample: the busier direction, max(RX, TX), % of the link's peak."
    )


def stats_rows(links: dict[str, Any]) -> list[list[str]]:
    """link, over, samples, avg, p95, peak: PCIe then NVLink over the steps, the NCCL kernels, the copies."""
    over = links.get("over") or {}
    samples = links.get("samples") or {}
    rows = []
    for key, name in LINKS:
        for where, label in OVER:
            stat = (over.get(where) or {}).get(key) or {}
            rows.append(
                [
                    name,
                    label,
                    str(samples.get(where, 0)),
                    pct100(stat.get("avg")),
                    pct100(stat.get("p95")),
                    pct100(stat.get("peak")),
                ]
            )
    return rows


def split_rows(links: dict[str, Any]) -> list[list[str]]:
    """Where NCCL's bytes went: link, share of the NCCL kernels' samples, time."""
    split = links.get("nccl_split") or {}
    return [[name, share(split.get(f"{key}_share")), ms(split.get(f"{key}_ns"))] for key, name in SPLIT]


def split_line(links: dict[str, Any]) -> str:
    split = links.get("nccl_split") or {}
    if not split.get("samples"):
        return (
            "Where NCCL's bytes went: not known (no sample lies in an NCCL kernel: no NCCL kernel, or kernels "
            "shorter than the sample period)."
        )
    busy = split.get("busy_pct", 5)
    return (
        f"Where NCCL's bytes went: of the {split['samples']} samples during the NCCL kernels "
        f"({ms(split.get('nccl_ns'))} of kernel time), a link carried the traffic when its load was ≥ {busy:g} % "
        "(NVLink first, then PCIe)."
    )


def counter_rows(links: dict[str, Any]) -> list[list[str]]:
    """Normalized counter, the capture's metric names summed into it."""
    return [
        [COUNTER_NAMES.get(key, key), "; ".join(names)] for key, names in (links.get("names") or {}).items() if names
    ]


def step_rows(rank: dict[str, Any]) -> list[list[str]]:
    """Per step with link figures: its PCIe / NVLink avg and peak, and the averages during its NCCL kernels."""
    return [
        [
            s["name"],
            pct100(s.get("pcie_avg_pct")),
            pct100(s.get("pcie_peak_pct")),
            pct100(s.get("nvlink_avg_pct")),
            pct100(s.get("nvlink_peak_pct")),
            pct100(s.get("nccl_pcie_avg_pct")),
            pct100(s.get("nccl_nvlink_avg_pct")),
        ]
        for s in rank.get("steps", [])
        if any(s.get(k) is not None for k in ("pcie_avg_pct", "nvlink_avg_pct"))
    ]


STATS_HEADER = ["link", "over", "samples", "avg", "p95", "peak"]
SPLIT_HEADER = ["NCCL bytes on", "share of NCCL samples", "time"]
STEP_HEADER = ["step", "PCIe avg", "PCIe peak", "NVLink avg", "NVLink peak", "PCIe avg in NCCL", "NVLink avg in NCCL"]


def markdown_section(rank: dict[str, Any]) -> list[str]:
    """The rank's "Links (nsys GPU metrics)" subsection, or the null reason in one line."""
    lines = ["", f"### {TITLE}", ""]
    why = null_reason(rank)
    if why is not None:
        return [*lines, f"No link counters: {why}."]
    links = rank["links"]
    lines += [source_line(links), ""]
    lines += table(STATS_HEADER, stats_rows(links))
    lines += ["", split_line(links), ""]
    lines += table(SPLIT_HEADER, split_rows(links))
    steps = step_rows(rank)
    if steps:
        lines += ["", "Per step (% of the link's peak):", ""]
        lines += table(STEP_HEADER, steps[:MAX_STEP_ROWS])
        if len(steps) > MAX_STEP_ROWS:
            lines.append(f"… {len(steps) - MAX_STEP_ROWS} more rows in the JSON report")
    counters = counter_rows(links)
    if counters:
        lines += ["", "Counters read:", ""]
        lines += [f"- {name}: {names}" for name, names in counters]
    return lines
