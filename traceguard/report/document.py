"""The JSON report: the public contract (``docs/report.schema.json``), built from the run's
inputs, metrics and checks. Markdown, HTML and JUnit are renderings of this document only.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import orjson
import polars as pl

from traceguard import __version__
from traceguard.checks.profiles import Profile
from traceguard.checks.rules import CheckResult, verdict
from traceguard.ingest import InputRecord
from traceguard.ingest.sides import SideData
from traceguard.metrics.link_counters import LINK_RANK_METRICS
from traceguard.metrics.run import RunResult
from traceguard.metrics.transport import nccl_document
from traceguard.metrics.workloads import empty as workload_entry
from traceguard.metrics.workloads import run_workload
from traceguard.report.fields import LINK_STEP_FIELDS, WAIT_STEP_FIELDS
from traceguard.report.inspector import inspector_document

SCHEMA_VERSION = "1"
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
    "collective_calls_sized",
    "collective_calls_per_step",
    "small_collective_calls",
    "small_collective_ns",
    "sized_collective_ns",
    "small_collective_share",
    "small_collective_time_share",
    "small_collectives_per_step",
    # Who waited for whom (metrics.waits; docs/collectives.md).
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "nccl_wait_share",
    "collective_instances_matched",
)
#: Rank-only: how often the rank arrived last at a matched collective, and how late; the link
#: counters of its GPU over its NCCL kernels (metrics.link_counters, docs/links.md).
RANK_ONLY = ("last_arrivals", *LINK_RANK_METRICS)
RUN_ONLY = (
    "ranks",
    "distinct_gpu_models",
    "gpu_models",
    "straggler_steps_compared",
    "gpu_model_ranks",
    "late_rank",
    "exposed_wait_share",
    "collective_instances_unmatched",
    "matched_steps",
    "arrival_spread",
    "arrival_steps_compared",
    "straggler_worst",
    "straggler_evidence_steps",
    # Where the wait split and the bandwidth came from when NCCL Inspector logs were given (pipeline).
    "wait_source",
    "utilization_source",
)
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
LINK_METRICS = (
    "transport_fallback_pairs",
    "nccl_transports",
    "nccl_version",
    "pcie_saturation",
    "p2p_utilization",
    "allreduce_peak_busbw_gbps",
    "allreduce_small_latency_us",
    "nccl_connections",
    "pcie_samples",
    "pcie_saturation_source",
    "transport_observations",
    "allreduce_largest_bytes",
    "allreduce_small_sizes",
)


#: What :func:`_json_safe`'s fast path hands to its fallback rather than convert itself (a datetime,
#: dataclass or str/int subclass would come back as another type).
_STRICT = (
    orjson.OPT_SERIALIZE_NUMPY
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)


#: A report step row's keys, in order.
_STEP_KEYS = (*STEP_FIELDS, "graph_ns")


def _json_safe(doc: dict[str, Any]) -> dict[str, Any]:
    """:func:`_clean` of ``doc``, through orjson when it can (NaN/inf → null, tuples → lists, numpy
    scalars → Python: the same document, 2–3× faster on a report of tens of MB); any key that is not
    a str, an integer past 64 bits or a type orjson would change falls back to :func:`_clean`.

    The per-step row lists (a rank's ``steps``, its ``collectives_by_type.steps``) that are plain
    already (:func:`_plain_rows`) skip the round trip: they are most of a long run's report, and
    rebuilding their dicts was 0.6 s of 68 k steps."""
    kept: list[tuple[int, str, list[Any]]] = []
    ranks = doc.get("ranks")
    for at, rank in enumerate(ranks if isinstance(ranks, list) else []):
        if not isinstance(rank, dict):
            continue
        for where in _ROW_LISTS:
            holder = _row_holder(rank, where)
            rows = holder.get("steps") if holder is not None else None
            if holder is not None and isinstance(rows, list) and _plain_rows(rows):
                kept.append((at, where, rows))
                holder["steps"] = []
    try:
        out = orjson.loads(orjson.dumps(doc, option=_STRICT))
    except (TypeError, orjson.JSONEncodeError):
        out = _clean(doc)
    for at, where, rows in kept:
        _row_holder(doc["ranks"][at], where)["steps"] = rows  # type: ignore[index]
        _row_holder(out["ranks"][at], where)["steps"] = rows  # type: ignore[index]
    return out


#: Where a rank's per-step row lists are: ``rank["steps"]`` and ``rank["collectives_by_type"]["steps"]``.
_ROW_LISTS = ("rank", "collectives_by_type")


def _row_holder(rank: dict[str, Any], where: str) -> dict[str, Any] | None:
    holder = rank if where == "rank" else rank.get(where)
    return holder if isinstance(holder, dict) else None


#: Values JSON holds as they are (``bool`` is an ``int`` to ``isinstance``, not to ``type``).
_PLAIN = frozenset({int, str, bool, type(None)})


def _plain_rows(rows: list[Any]) -> bool:
    """Whether every row is a dict of str keys whose values (and those of dicts inside, two levels
    deep: a step's ``phases``) are ints, strs, bools, None or finite floats: what :func:`_clean`
    would leave as it is. Anything else (NaN, a tuple, a numpy scalar) says no."""
    finite = math.isfinite
    for row in rows:
        if type(row) is not dict:
            return False
        for value in row.values():
            kind = type(value)
            if kind in _PLAIN:
                continue
            if kind is float:
                if not finite(value):
                    return False
            elif kind is dict:
                if not _plain_dict(value, depth=1):
                    return False
            else:
                return False
        if any(type(k) is not str for k in row):
            return False
    return True


def _plain_dict(value: dict[Any, Any], depth: int) -> bool:
    for key, inner in value.items():
        kind = type(inner)
        if type(key) is not str:
            return False
        if kind in _PLAIN or (kind is float and math.isfinite(inner)):
            continue
        if kind is dict and depth < 2 and _plain_dict(inner, depth + 1):
            continue
        return False
    return True


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf → None, tuples → lists (other values as they are)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


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


def _with_wait_lane(timeline: dict[str, Any], result: RunResult | None, rank: int) -> dict[str, Any]:
    """The rank's timeline with ``wait_lane``: its matched NCCL kernels split at the last member's
    arrival, ns from ``origin_ns`` like the lanes ({"start", "split", "end"}), or {"null_reason"}."""
    lanes = result.waits.lanes if result and result.waits else {}
    origin = timeline.get("origin_ns")
    if rank not in lanes:
        reason = (result.waits.null_reasons.get("nccl_wait_share") if result and result.waits else None) or (
            "no collective of this rank was matched"
        )
        return {**timeline, "wait_lane": {"null_reason": reason}}
    lane = lanes[rank]
    if "null_reason" in lane or origin is None:
        return {**timeline, "wait_lane": {"null_reason": lane.get("null_reason", "the rank has no timeline origin")}}
    return {**timeline, "wait_lane": {k: [v - origin for v in lane[k]] for k in ("start", "split", "end")}}


def build(
    inputs: list[InputRecord],
    result: RunResult | None,
    checks: list[CheckResult],
    profile: Profile,
    *,
    side: SideData | None = None,
) -> dict[str, Any]:
    ranks = result.ranks if result else []
    input_of_rank: dict[int, str] = {r: i.path for i in inputs for r in i.ranks}
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "traceguard_version": __version__,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile": {"name": profile.name, "chain": profile.chain, "description": profile.description},
        "verdict": verdict(checks),
        "inputs": [
            {
                "path": i.path,
                "format": i.format,
                "tool_version": i.tool_version,
                "schema_version": i.schema_version,
                "rank": i.rank,
                "ranks": i.ranks,
                "rank_source": i.rank_source,
                "error": i.error,
                "error_code": i.error_code,
                "warnings": i.warnings,
            }
            for i in inputs
        ],
        "run": {
            "metrics": {
                **_metrics(
                    result.metrics if result else {},
                    result.null_reasons if result else {},
                    CONTRACT_METRICS + EXTRA_METRICS + RUN_ONLY + LINK_METRICS,
                ),
            },
            "collectives": [row for r in ranks for row in _collectives(r.collectives)],
            "collectives_by_type": result.collectives_by_type if result else [],
            "peer_matrix": (result.peer_matrix if result else None) or {"rows": [], "null_reason": NO_RANKS},
            "workload": (result.workload if result else None) or run_workload([]),
            "clock_alignment": result.waits.clock_alignment if result and result.waits else None,
            "late_rank": result.waits.late if result and result.waits else None,
            "arrival_steps": result.waits.arrival_steps[:20] if result and result.waits else [],
            "straggler_steps": [
                {
                    "index": s.index,
                    "slowest_rank": s.slowest_rank,
                    "slowest_gpu_span_ns": s.slowest_ns,
                    "median_gpu_span_ns": s.median_ns,
                    "spread": s.spread,
                }
                for s in (result.straggler_steps if result else [])
            ],
        },
        "ranks": [
            {
                "rank": r.rank,
                "step_source": r.step_source,
                "step_detail": r.step_detail,
                "input": input_of_rank.get(r.rank),
                "gpu_models": r.gpu_models,
                "metrics": _metrics(r.metrics, r.null_reasons, CONTRACT_METRICS + EXTRA_METRICS + RANK_ONLY),
                # graph_ns: GPU time in CUDA graph executions (metrics.graphs); zip of map, not a
                # dict comprehension: 68 k steps in 0.18 s, not 0.29 s.
                "steps": [
                    dict(zip(_STEP_KEYS, [*map(s.get, STEP_FIELDS), s.get("graph_ns", 0)], strict=True))
                    for s in r.steps
                ],
                "collectives": _collectives(r.collectives),
                "collectives_by_type": _by_type(r.collectives_by_type),
                "small_collectives": r.small_collectives or None,
                "peers": r.peers or {"rows": [], "null_reason": NO_RANKS},
                "workload": r.workload or workload_entry(),
                "gpu_to_cpu_offenders": r.gpu_to_cpu_offenders,
                "links": r.link_counters or {"null_reason": "not analysed"},
            }
            for r in ranks
        ],
        "checks": [c.to_dict() for c in checks],
        "timeline": {
            "unit": "ns",
            "ranks": [_with_wait_lane(r.timeline, result, r.rank) for r in ranks if r.timeline],
        },
        "inspector": inspector_document(result.inspector if result else None),
        "nccl": nccl_document(side.nccl, nvlink_pairs=side.nvlink_pairs) if side and side.nccl else None,
        "side_inputs": {
            "sources": side.sources if side else {},
            "errors": side.errors if side else [],
            "nvlink_pairs": sorted(sorted(p) for p in side.nvlink_pairs) if side and side.nvlink_pairs else None,
            "collective_benchmark": side.nccl_tests.to_dicts() if side and side.nccl_tests is not None else [],
        },
    }
    return _json_safe(doc)
