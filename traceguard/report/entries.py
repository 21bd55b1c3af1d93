"""One rank of the report (``ranks[]``) and the field lists of its metrics and steps: what the
report document (traceguard.report.document) and its side output (traceguard.report.detail) both
build from a rank's result."""

from __future__ import annotations

from typing import Any

import polars as pl

from traceguard.metrics import small_collectives
from traceguard.metrics.link_counters import LINK_RANK_METRICS
from traceguard.metrics.rank import RankResult
from traceguard.metrics.workloads import empty as workload_entry
from traceguard.report.fields import LINK_STEP_FIELDS, WAIT_STEP_FIELDS
from traceguard.report.rows import project_rows

#: Metric names every ``metrics`` object carries (issue contract), in this order.
CONTRACT_METRICS = (
    "gpu_ops",
    "gpu_to_cpu_copies",
    "gpu_to_cpu_bytes",
    "gpu_to_cpu_copy_rate",
    "dtod_copies",
    "dtod_bytes",
    "dtod_bytes_per_step",
    "peer_copies",
    "peer_bytes",
    "nccl_kernels",
    "nccl_time_ns",
    "nccl_exposed_ns",
    "nccl_share_of_step",
    "straggler_spread",
    "step_count",
)
EXTRA_METRICS = (
    "gpu_span_ns",
    "nccl_step_ns",
    "allreduce_bytes_per_step",
    "gradient_reduction_bytes_per_step",
    "gradient_reduction_collective",
    "dtod_to_gradient_ratio",
    "host_device_bytes",
    "pageable_host_bytes",
    "pageable_host_share",
    # Evidence the checks' floors read (DESIGN.md, "Minimum evidence").
    "host_device_copies",
    "host_device_bytes_per_step",
    "pageable_host_bytes_per_step",
    "gpu_to_cpu_copies_per_step",
    # Small collectives (metrics.small_collectives) and their rule's evidence.
    *small_collectives.RANK_METRICS,
    # Who waited for whom (metrics.waits; docs/collectives.md).
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "nccl_wait_share",
    "collective_instances_matched",
)
#: Rank-only: how often the rank arrived last at a matched collective, and how late; the link
#: counters of its GPU over its NCCL kernels (metrics.link_counters, docs/links.md).
RANK_ONLY = ("last_arrivals", *LINK_RANK_METRICS)
STEP_FIELDS = (
    "name",
    "index",
    "cpu_ns",
    "gpu_span_ns",
    "nccl_ns",
    "nccl_share",
    "dtod_bytes",
    "dtod_copies",
    "peer_bytes",
    "peer_copies",
    *WAIT_STEP_FIELDS,
    *LINK_STEP_FIELDS,
    "phases",
)
#: A report step row's keys, in order.
_STEP_KEYS = (*STEP_FIELDS, "graph_ns")
#: What a step row lacking a field holds (None otherwise).
_STEP_DEFAULTS = {"graph_ns": 0}


def _metrics(values: dict[str, Any], null_reasons: dict[str, str], keys: tuple[str, ...]) -> dict[str, Any]:
    out = {k: values.get(k) for k in keys}
    out["null_reasons"] = {k: null_reasons[k] for k in keys if out.get(k) is None and k in null_reasons}
    return out


#: Why a peer matrix is empty when no rank was analysed.
NO_RANKS = "no rank was analysed"


def _by_type(doc: dict[str, Any]) -> dict[str, Any]:
    """``ranks[].collectives_by_type``: totals over the window, rows per step, null reasons."""
    return {"totals": doc.get("totals", []), "steps": doc.get("steps", []), "null_reasons": doc.get("null_reasons", {})}


def _collectives(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dicts() if frame.height else []


def rank_entry(r: RankResult, input_path: str | None) -> dict[str, Any]:
    """One rank of the report's ``ranks`` (not yet JSON-safe: :func:`_json_safe` the document)."""
    return {
        "rank": r.rank,
        "step_source": r.step_source,
        "step_detail": r.step_detail,
        "input": input_path,
        "gpu_models": r.gpu_models,
        "metrics": _metrics(r.metrics, r.null_reasons, CONTRACT_METRICS + EXTRA_METRICS + RANK_ONLY),
        # graph_ns: GPU time in CUDA graph executions (metrics.graphs), 0 where not set.
        "steps": project_rows(r.steps, _STEP_KEYS, _STEP_DEFAULTS),
        "collectives": _collectives(r.collectives),
        "collectives_by_type": _by_type(r.collectives_by_type),
        "small_collectives": r.small_collectives or None,
        "peers": r.peers or {"rows": [], "null_reason": NO_RANKS},
        "workload": r.workload or workload_entry(),
        "gpu_to_cpu_offenders": r.gpu_to_cpu_offenders,
        "links": r.link_counters or {"null_reason": "not analysed"},
    }
