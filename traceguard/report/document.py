"""The JSON report: the public contract (``docs/report.schema.json``), built from the run's
inputs, metrics and checks. Markdown, HTML and JUnit are renderings of this document only.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import orjson

from traceguard import __version__
from traceguard.checks.profiles import Profile
from traceguard.checks.rules import CheckResult, verdict
from traceguard.ingest import InputRecord
from traceguard.ingest.sides import SideData
from traceguard.metrics.link_counters import LINK_RANK_METRICS
from traceguard.metrics.run import RunResult
from traceguard.metrics.transport import nccl_document
from traceguard.metrics.workloads import run_workload
from traceguard.report import summary
from traceguard.report.detail import Detail
from traceguard.report.entries import (  # noqa: F401  (re-exported: the report's field lists)
    _STEP_KEYS,
    CONTRACT_METRICS,
    EXTRA_METRICS,
    NO_RANKS,
    RANK_ONLY,
    STEP_FIELDS,
    _collectives,
    _metrics,
    rank_entry,
)
from traceguard.report.inspector import inspector_document
from traceguard.report.rows import plain_rows

#: 2: ``detail`` (full or by summary, issue 30); a summary adds ``rank_summary``, ``rank_steps`` and
#: ``worst_steps`` and keeps only its worst ranks whole. A full report is version 1's plus ``detail``.
SCHEMA_VERSION = "2"
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


def _json_safe(doc: dict[str, Any]) -> dict[str, Any]:
    """:func:`_clean` of ``doc``, through orjson when it can (NaN/inf → null, tuples → lists, numpy
    scalars → Python: the same document, 2–3× faster on a report of tens of MB); any key that is not
    a str, an integer past 64 bits or a type orjson would change falls back to :func:`_clean`.

    The per-step row lists (a rank's ``steps``, its ``collectives_by_type.steps``) that are plain
    already (:func:`traceguard.report.rows.plain_rows`) skip the round trip: they are most of a long run's report, and
    rebuilding their dicts was 0.6 s of 68 k steps."""
    kept: list[tuple[int, str, list[Any]]] = []
    ranks = doc.get("ranks")
    for at, rank in enumerate(ranks if isinstance(ranks, list) else []):
        if not isinstance(rank, dict):
            continue
        for where in _ROW_LISTS:
            holder = _row_holder(rank, where)
            rows = holder.get("steps") if holder is not None else None
            if holder is not None and isinstance(rows, list) and plain_rows(rows):
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


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf → None, tuples → lists (other values as they are)."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


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
    detail: Detail | None = None,
) -> dict[str, Any]:
    """The report document; by summary when ``detail.mode`` says so (:mod:`traceguard.report.summary`):
    then ``ranks``, ``timeline`` and ``run.collectives`` hold only the chosen ranks, reloaded whole
    from the side output, and the peer rows and straggler steps only the worst."""
    detail = detail or Detail()
    by_summary = detail.mode == "summary" and result is not None and detail.folder is not None
    ranks = result.ranks if result else []
    chosen: dict[int, list[str]] = {}
    if by_summary:
        assert result is not None and detail.folder is not None
        chosen = summary.chosen_ranks(result, checks)
        rows = summary.reload(detail.folder, list(chosen))
        ranks = [summary.restored(r, rows[r.rank]) for r in ranks if r.rank in chosen]
    peer_matrix = (result.peer_matrix if result else None) or {"rows": [], "null_reason": NO_RANKS}
    straggler_steps = result.straggler_steps if result else []
    if by_summary:
        peer_rows = peer_matrix.get("rows", [])
        worst = sorted(peer_rows, key=lambda row: (-(row.get("time_ns") or 0), row["rank"], row["peer"]))
        peer_matrix = {**peer_matrix, "rows": worst[: summary.WORST_ROWS], "rows_total": len(peer_rows)}
        straggler_steps = straggler_steps[: summary.WORST_ROWS]
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
            "peer_matrix": peer_matrix,
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
                for s in straggler_steps
            ],
        },
        "ranks": [rank_entry(r, input_of_rank.get(r.rank)) for r in ranks],
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
        "detail": {
            "mode": "summary" if by_summary else "full",
            "folder": str(detail.folder) if detail.folder is not None else None,
            "tables": detail.tables or {},
        },
    }
    if by_summary and result is not None:
        doc["rank_summary"] = summary.rank_summary(
            result, chosen, (*CONTRACT_METRICS, *EXTRA_METRICS, *LINK_RANK_METRICS)
        )
        doc["rank_steps"] = summary.rank_steps(result)
        doc["worst_steps"] = summary.worst_steps(result.ranks)
    return _json_safe(doc)
