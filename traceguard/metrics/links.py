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


def analyse_links(
    side: SideData,
    *,
    peak_busbw_gbps: float | None,
    rated_pcie_gbps: float | None,
    capture: list[dict[str, Any]] | None = None,
    capture_reason: str | None = None,
    capture_pcie_share: float | None = None,
    capture_nvlink_share: float | None = None,
) -> LinkResult:
    """The link metrics from the side inputs and, where the captures hold nsys GPU metrics, from
    ``capture``: one row per rank (traceguard.metrics.link_counters.capture_link_rows);
    ``capture_reason`` says why there are none. ``capture_pcie_share`` / ``capture_nvlink_share``
    (the profile's transport_p2p parameters): a rank whose NCCL kernels' samples show PCIe busy at
    least that often and NVLink busy at most that often moved its collective bytes over PCIe."""
    capture = capture or []
    m: dict[str, Any] = {}
    null: dict[str, str] = {}
    evidence: dict[str, list[dict[str, Any]]] = {}
    found: list[Finding] = []

    pairs: set[frozenset[int]] = set()
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
    log_pairs = pairs if side.nccl is not None and side.nccl.transport_known else set()
    # Pairs the log saw connected over P2P only: their transport is NCCL's own word, which the
    # counters cannot overrule (PCIe traffic beside a P2P kernel belongs to other work).
    p2p_pairs = _p2p_only_pairs(side.nccl) if side.nccl is not None and side.nccl.transport_known else set()
    _capture_transport(
        capture,
        side,
        capture_reason,
        capture_pcie_share,
        capture_nvlink_share,
        log_pairs,
        p2p_pairs,
        m,
        null,
        evidence,
        found,
    )

    _pcie(side, rated_pcie_gbps, m, null, evidence, capture, capture_reason)
    _collectives(side, peak_busbw_gbps, m, null, evidence)
    return LinkResult(m, null, found, evidence)


def _pcie(
    side: SideData,
    rated_gbps: float | None,
    m: dict[str, Any],
    null: dict[str, str],
    evidence: dict[str, Any],
    capture: list[dict[str, Any]],
    capture_reason: str | None,
) -> None:
    """``pcie_saturation``: the worse of dmon's peak ÷ rated speed and the captures' peak PCIe
    throughput during NCCL kernels (nsys GPU metrics, already a share of the link's peak); both
    sources' rows are the evidence and ``pcie_saturation_source`` names the one that decided.
    ``pcie_samples``: that source's samples (dmon: of the GPU with the fewest; capture: samples
    over NCCL kernels of the rank with the fewest)."""
    m["pcie_saturation"] = m["pcie_samples"] = m["pcie_saturation_source"] = None
    rows: list[dict[str, Any]] = []
    dmon_peak, dmon_samples, dmon_reason = _dmon_pcie(side, rated_gbps, rows)
    judged = [r for r in capture if r.get("pcie_nccl_peak") is not None]
    capture_peak = max((r["pcie_nccl_peak"] for r in judged), default=None)
    for r in judged:
        rows.append(
            {
                "source": "nsys GPU metrics",
                "rank": r["rank"],
                "gpu": r["gpu"],
                "peak": r["pcie_nccl_peak"],
                "p95": r["pcie_nccl_p95"],
                "avg": r["pcie_nccl_avg"],
                "during": "NCCL kernels",
                "samples": r["samples_nccl"],
                "copies_peak": r["copies_pcie_peak"],
                "copies_avg": r["copies_pcie_avg"],
            }
        )
    if rows:
        evidence["pcie_saturation"] = rows
    candidates = [
        (v, n, source)
        for v, n, source in (
            (dmon_peak, dmon_samples, "nvidia-smi dmon"),
            (capture_peak, min((r["samples_nccl"] or 0 for r in judged), default=None), "nsys GPU metrics"),
        )
        if v is not None
    ]
    if not candidates:
        capture_why = (
            "no NCCL kernel holds a GPU metrics sample" if capture else (capture_reason or "no capture was analysed")
        )
        null["pcie_saturation"] = f"{dmon_reason}; and from the captures: {capture_why}"
        null["pcie_samples"] = null["pcie_saturation_source"] = null["pcie_saturation"]
        return
    value, samples, source = max(candidates, key=lambda c: c[0])
    m["pcie_saturation"] = value
    m["pcie_samples"] = samples
    m["pcie_saturation_source"] = source


def _dmon_pcie(
    side: SideData, rated_gbps: float | None, rows: list[dict[str, Any]]
) -> tuple[float | None, int | None, str]:
    """dmon's peak PCIe load ÷ rated speed and its sample count (GPU with the fewest), or why not;
    its per-GPU rows are appended to ``rows``."""
    from traceguard.ingest.side_inputs import pcie_saturation

    if side.dmon is None or side.dmon.height == 0:
        return None, None, "no `nvidia-smi dmon -s t` output given (--dmon, or dmon*.txt in the run bundle)"
    if not {"rxpci", "txpci"} & set(side.dmon.columns):
        return None, None, "the dmon output has no PCIe rx/tx columns (record it with `nvidia-smi dmon -s t`)"
    rated: dict[int, float] | float | None = side.pcie_rated_mb_s or (rated_gbps * 1000 if rated_gbps else None)
    if not rated:
        return None, None, "the PCIe link's rated speed is unknown (give `nvidia-smi -q` or set rated_pcie_gbps)"
    result = pcie_saturation(side.dmon, rated)
    per_gpu = result.get("per_gpu") or {}
    rows.extend({"source": "nvidia-smi dmon", "gpu": gpu, **row} for gpu, row in sorted(per_gpu.items()))
    samples = min(int(row["samples"]) for row in per_gpu.values()) if per_gpu else None
    if result.get("peak") is None:
        return None, samples, "no PCIe samples with values in the dmon output"
    return result["peak"], samples, ""


def _capture_transport(
    capture: list[dict[str, Any]],
    side: SideData,
    capture_reason: str | None,
    pcie_share: float | None,
    nvlink_share: float | None,
    log_pairs: set[frozenset[int]],
    p2p_pairs: set[frozenset[int]],
    m: dict[str, Any],
    null: dict[str, str],
    evidence: dict[str, list[dict[str, Any]]],
    found: list[Finding],
) -> None:
    """The transport finding from the link counters: rank pairs of one host, NVLink peers per
    ``nvidia-smi topo -m``, whose NCCL kernels moved their bytes over PCIe with NVLink idle, unless
    the NCCL log shows the pair connected over P2P only (``p2p_pairs``: the log names the transport).
    Fills ``transport_observations`` (NCCL connection lines + rank pairs judged from the capture)
    and, where the capture decides, ``transport_fallback_pairs`` (the union with the log's pairs)."""
    judged = [r for r in capture if r.get("nccl_pcie_share") is not None]
    on_pcie = {
        r["rank"]: r
        for r in judged
        if r["nccl_pcie_share"] >= (pcie_share if pcie_share is not None else 0.5)
        and (r.get("nccl_nvlink_share") or 0.0) <= (nvlink_share if nvlink_share is not None else 0.05)
    }
    peers = side.nvlink_pairs
    candidates = [
        (a, b)
        for i, a in enumerate(judged)
        for b in judged[i + 1 :]
        if a.get("host") == b.get("host") and a["gpu"] != b["gpu"]
    ]
    judged_pairs = [(a, b) for a, b in candidates if peers is not None and frozenset((a["gpu"], b["gpu"])) in peers]
    # A pair the NCCL log shows on P2P is not flagged: a P2P pipeline's middle stages (2×H200,
    # bench/gpu/SWEEP.md) read 5–26 % PCIe during their send/recv kernels, with NVLink under 5 %,
    # from other work beside small transfers; the log's `via P2P/CUMEM` is the transport.
    flagged = [
        (a, b)
        for a, b in judged_pairs
        if a["rank"] in on_pcie and b["rank"] in on_pcie and frozenset((a["rank"], b["rank"])) not in p2p_pairs
    ]
    connections = m.get("nccl_connections")
    observations = (connections or 0) + len(judged_pairs)
    m["transport_observations"] = observations if connections is not None or judged_pairs else None
    if m["transport_observations"] is None:
        why = null.get("nccl_connections", "no NCCL_DEBUG=INFO log given")
        if not judged:
            why += f"; and the captures show no link counters during NCCL kernels ({capture_reason or 'none'})"
        elif peers is None:
            why += "; and which GPUs are NVLink peers is unknown (give `nvidia-smi topo -m`)"
        else:
            why += "; and no two ranks of one host run on NVLink peers"
        null["transport_observations"] = why

    def figures(r: dict[str, Any]) -> str:
        return (
            f"rank {r['rank']} (GPU {r['gpu']}): during its NCCL kernels PCIe busy in {r['nccl_pcie_share']:.0%} "
            f"of the samples (avg {r['pcie_nccl_avg']:.0%}, peak {r['pcie_nccl_peak']:.0%}), NVLink busy in "
            f"{(r.get('nccl_nvlink_share') or 0):.0%} (avg {(r.get('nvlink_nccl_avg') or 0):.0%})"
        )

    if flagged:
        pairs = {frozenset((a["rank"], b["rank"])) for a, b in flagged}
        ranks = sorted({r for p in pairs for r in p})
        described = ", ".join(f"{min(p)}↔{max(p)}" for p in sorted(pairs, key=sorted))
        finding = Finding(
            "pcie_while_nvlink_idle",
            "fail",
            f"NCCL kernels moved their bytes over PCIe with NVLink idle for {len(pairs)} rank pair(s) of NVLink "
            f"peers ({described}; nsys GPU metrics): the collectives do not use NVLink (NCCL fell back to SHM or "
            "to P2P over PCIe).",
            ranks,
            [figures(on_pcie[r]) for r in ranks],
        )
        found.append(finding)
        evidence.setdefault("transport_p2p", []).append(
            {
                "finding": finding.id,
                "severity": finding.severity,
                "message": finding.message,
                "ranks": ranks,
                "lines": finding.evidence,
            }
        )
        all_pairs = log_pairs | pairs
        m["transport_fallback_pairs"] = len(all_pairs)
        null.pop("transport_fallback_pairs", None)
    elif judged_pairs and m.get("transport_fallback_pairs") is None:
        # The capture judged NVLink peers and found their collectives on NVLink (or not on PCIe).
        m["transport_fallback_pairs"] = 0
        null.pop("transport_fallback_pairs", None)
    elif on_pcie and peers is None and m.get("transport_fallback_pairs") is None:
        ranks = sorted(on_pcie)
        null["transport_fallback_pairs"] = (
            f"{null.get('transport_fallback_pairs', 'no NCCL log')}; the captures show NCCL kernels on PCIe with "
            f"NVLink idle ({'; '.join(figures(on_pcie[r]) for r in ranks)}), but whether these GPUs are NVLink "
            "peers is unknown: give `nvidia-smi topo -m`"
        )


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


def _p2p_only_pairs(log: Any) -> set[frozenset[int]]:
    """Rank pairs every one of whose logged connections is P2P (or NVLS, NVLink too), read from the
    largest communicators only: their ranks are the job's (a sub-communicator's, e.g. a 2-rank
    send/recv comm's 0 and 1, would name other ranks' pairs)."""
    sizes = {c.comm: c.nranks for c in log.comms if c.comm is not None and c.nranks is not None}
    world = max(sizes.values(), default=None)
    by_pair: dict[frozenset[int], set[str]] = {}
    for c in log.connections:
        if world is None or sizes.get(c.comm) != world:
            continue
        if c.peer is not None and c.peer != c.rank:
            by_pair.setdefault(frozenset((c.rank, c.peer)), set()).add(c.transport)
    return {pair for pair, kinds in by_pair.items() if kinds <= {"P2P", "NVLS"}}
