"""Link metrics from side inputs: NCCL's transport map, PCIe saturation, collective bandwidth.

- ``transport_fallback_pairs``: rank pairs of one node whose NCCL connections used SHM or NET
  where P2P was possible (NVLink peers per ``nvidia-smi topo -m`` when given, else any pair).
- ``pcie_saturation``: the highest per-GPU PCIe throughput sample in ``nvidia-smi dmon``
  (max of rx, tx) ÷ the link's rated one-direction bandwidth (from ``nvidia-smi -q`` link
  generation × width when given, else the profile's ``rated_pcie_gbps``).
- ``p2p_utilization``: large-message all-reduce bus bandwidth (out-of-place, the largest size in
  the collective benchmark) ÷ the expected peak: NCCL's own ``maxBw`` from its GRAPH log lines
  when an NCCL log is given, else the profile's ``peak_busbw_gbps``.
- ``allreduce_small_latency_us``: the median out-of-place all-reduce time over the message sizes
  of at most 8 KiB in the collective benchmark (median: one noisy size must not decide).

Evidence the link rules' floors read (DESIGN.md, "Minimum evidence"): ``nccl_connections`` (the
connection lines in the NCCL log), ``pcie_samples`` (dmon PCIe samples of the GPU with the
fewest), ``allreduce_largest_bytes`` (the largest all-reduce size in the benchmark) and
``allreduce_small_sizes`` (its distinct sizes of at most 8 KiB that have a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import polars as pl

from traceguard.ingest.sides import SideData
from traceguard.metrics.transport import Finding, findings

FALLBACK_FINDINGS = ("shm_within_node", "net_within_node")
SMALL_MESSAGE_BYTES = 8192


@dataclass
class LinkResult:
    metrics: dict[str, Any]
    null_reasons: dict[str, str]
    findings: list[Finding]
    evidence: dict[str, list[dict[str, Any]]]


def analyse_links(side: SideData, *, peak_busbw_gbps: float | None, rated_pcie_gbps: float | None) -> LinkResult:
    m: dict[str, Any] = {}
    null: dict[str, str] = {}
    evidence: dict[str, list[dict[str, Any]]] = {}
    found: list[Finding] = []

    m["nccl_connections"] = len(side.nccl.connections) if side.nccl is not None else None
    if side.nccl is None:
        null["nccl_connections"] = "no NCCL_DEBUG=INFO log given (--nccl-log, or nccl*.log in the run bundle)"
        m["transport_fallback_pairs"] = None
        null["transport_fallback_pairs"] = "no NCCL_DEBUG=INFO log given (--nccl-log, or nccl*.log in the run bundle)"
    elif not side.nccl.transport_known:
        # A partial log: its WARN/version findings still count, but no pair can be judged (skip, not pass).
        found = findings(side.nccl, nvlink_pairs=side.nvlink_pairs)
        m["transport_fallback_pairs"] = None
        null["transport_fallback_pairs"] = f"transport unknown: {side.nccl.transport_unknown_reason}"
    else:
        found = findings(side.nccl, nvlink_pairs=side.nvlink_pairs)
        pairs: set[frozenset[int]] = set()
        for f in found:
            if f.id in FALLBACK_FINDINGS:
                ranks = sorted(f.ranks)
                pairs |= {frozenset((a, b)) for i, a in enumerate(ranks) for b in ranks[i + 1 :]} or {frozenset(ranks)}
        m["transport_fallback_pairs"] = len(pairs)
    if side.nccl is not None:  # a partial log's WARN/error findings are link evidence too
        evidence["transport_p2p"] = [
            {"finding": f.id, "severity": f.severity, "message": f.message, "ranks": f.ranks, "lines": f.evidence[:6]}
            for f in found
            if f.severity in ("fail", "warn")
        ]
    m["nccl_transports"] = side.nccl.transports if side.nccl and side.nccl.transport_known else None
    if side.nccl is not None and not side.nccl.transport_known:
        null["nccl_transports"] = null["transport_fallback_pairs"]
    m["nccl_version"] = side.nccl.version if side.nccl else None

    _pcie(side, rated_pcie_gbps, m, null, evidence)
    _collectives(side, peak_busbw_gbps, m, null, evidence)
    return LinkResult(m, null, found, evidence)


def _pcie(
    side: SideData, rated_gbps: float | None, m: dict[str, Any], null: dict[str, str], evidence: dict[str, Any]
) -> None:
    from traceguard.ingest.side_inputs import pcie_saturation

    m["pcie_saturation"] = None
    m["pcie_samples"] = None
    if side.dmon is None or side.dmon.height == 0:
        null["pcie_saturation"] = "no `nvidia-smi dmon -s t` output given (--dmon, or dmon*.txt in the run bundle)"
        null["pcie_samples"] = null["pcie_saturation"]
        return
    if not {"rxpci", "txpci"} & set(side.dmon.columns):
        null["pcie_saturation"] = "the dmon output has no PCIe rx/tx columns (record it with `nvidia-smi dmon -s t`)"
        return
    rated: dict[int, float] | float | None = side.pcie_rated_mb_s or (rated_gbps * 1000 if rated_gbps else None)
    if not rated:
        null["pcie_saturation"] = "the PCIe link's rated speed is unknown (give `nvidia-smi -q` or set rated_pcie_gbps)"
        return
    result = pcie_saturation(side.dmon, rated)
    per_gpu = result.get("per_gpu") or {}
    peak = result.get("peak")
    if per_gpu:
        m["pcie_samples"] = min(int(row["samples"]) for row in per_gpu.values())
    else:
        null["pcie_samples"] = "no PCIe samples with values in the dmon output"
    if peak is None:
        null["pcie_saturation"] = "no PCIe samples with values in the dmon output"
        return
    m["pcie_saturation"] = peak
    evidence["pcie_saturation"] = [{"gpu": gpu, **row} for gpu, row in sorted(per_gpu.items())]


def _collectives(
    side: SideData, peak_gbps: float | None, m: dict[str, Any], null: dict[str, str], evidence: dict[str, Any]
) -> None:
    m["p2p_utilization"] = None
    m["allreduce_small_latency_us"] = None
    m["allreduce_peak_busbw_gbps"] = None
    m["allreduce_largest_bytes"] = None
    m["allreduce_small_sizes"] = None
    table = side.nccl_tests
    reason = "no collective benchmark output given (--nccl-tests; `traceguard bench-collectives` makes one)"
    if table is None or table.height == 0:
        null["p2p_utilization"] = null["allreduce_small_latency_us"] = reason
        null["allreduce_peak_busbw_gbps"] = null["allreduce_largest_bytes"] = null["allreduce_small_sizes"] = reason
        return
    allreduce = table.filter(pl.col("collective") == "all_reduce")
    if allreduce.height == 0:
        null["p2p_utilization"] = null["allreduce_small_latency_us"] = "the benchmark output has no all_reduce table"
        null["allreduce_peak_busbw_gbps"] = null["p2p_utilization"]
        null["allreduce_largest_bytes"] = null["allreduce_small_sizes"] = null["p2p_utilization"]
        return
    largest = allreduce.sort("size_bytes").tail(1).row(0, named=True)
    m["allreduce_largest_bytes"] = int(largest["size_bytes"])
    busbw = largest["oop_busbw"]
    m["allreduce_peak_busbw_gbps"] = busbw
    nccl_peak = None
    if side.nccl and side.nccl.max_bw_by_rank:
        nccl_peak = min(side.nccl.max_bw_by_rank.values())
    expected = nccl_peak or peak_gbps
    if busbw is None:
        null["p2p_utilization"] = "the largest all_reduce row has no bus bandwidth"
    elif not expected:
        null["p2p_utilization"] = "no expected peak: give the NCCL log (GRAPH maxBw) or set peak_busbw_gbps"
    else:
        m["p2p_utilization"] = busbw / expected
        evidence["p2p_utilization"] = [
            {
                "size_bytes": largest["size_bytes"],
                "busbw_gbps": busbw,
                "expected_gbps": expected,
                "expected_from": "NCCL GRAPH maxBw" if nccl_peak else "profile peak_busbw_gbps",
            }
        ]
    small = allreduce.filter(pl.col("size_bytes") <= SMALL_MESSAGE_BYTES).drop_nulls("oop_time_us")
    # Distinct sizes: one sweep given twice (nccl-tests.txt and the job's stdout) is not more evidence.
    m["allreduce_small_sizes"] = small["size_bytes"].n_unique()
    if small.height == 0:
        null["allreduce_small_latency_us"] = f"no all_reduce sizes of at most {SMALL_MESSAGE_BYTES} bytes"
    else:
        m["allreduce_small_latency_us"] = float(small["oop_time_us"].median())
        evidence["allreduce_latency"] = [
            {"size_bytes": r["size_bytes"], "time_us": r["oop_time_us"]} for r in small.sort("size_bytes").to_dicts()
        ]
