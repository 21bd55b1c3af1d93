"""Run-level metrics: the per-rank results reduced over ranks (DESIGN.md definitions).

Counts and bytes add up; rates and shares are recomputed from the sums (never averaged):
GPU→CPU copy rate = Σ copies ÷ Σ GPU ops; NCCL share = Σ NCCL time in steps ÷ Σ step GPU spans;
DtoD bytes per step = Σ DtoD bytes in steps ÷ Σ steps. Straggler spread, per step index present
on two or more ranks: (slowest rank's GPU span − median) ÷ median; the run value is the worst.
Ranks whose one step is their whole GPU window (step source ``window``) take no part in it: the
length of a capture is not a step time.

Evidence the checks' floors read (DESIGN.md, "Minimum evidence"): ``host_device_copies`` and
``host_device_bytes_per_step`` (Σ host↔device bytes with a known host memory kind ÷ Σ steps),
``pageable_host_bytes_per_step`` and ``gpu_to_cpu_copies_per_step`` (Σ ÷ Σ steps),
``straggler_steps_compared`` (step indices compared on two or more ranks), ``gpu_model_ranks``
(ranks whose GPU model the capture names).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import polars as pl

from traceguard.metrics import small_collectives as small
from traceguard.metrics.collectives import run_totals
from traceguard.metrics.graphs import HIDDEN_BY_GRAPHS
from traceguard.metrics.rank import STRAGGLER_NEEDS_RANKS, RankResult
from traceguard.metrics.waits import RankClock, WaitResult, reduce_waits
from traceguard.metrics.workloads import run_workload

SUMMED = (
    "gpu_ops",
    "gpu_to_cpu_copies",
    "gpu_to_cpu_bytes",
    "dtod_copies",
    "dtod_bytes",
    "peer_copies",
    "peer_bytes",
    "nccl_kernels",
    "nccl_time_ns",
    "nccl_exposed_ns",
    "step_count",
    "gpu_span_ns",
    "nccl_step_ns",
    "dtod_bytes_in_steps",
    "host_device_copies",
    "host_device_bytes",
    "pageable_host_bytes",
)
#: Why no straggler spread when ranks' steps are their whole GPU windows.
WINDOW_STEPS_NO_STRAGGLER = (
    "each rank's only step is its whole GPU window (no step marker, no periodic structure): "
    "capture lengths are not step times, so ranks are not compared"
)


@dataclass
class StragglerStep:
    index: int
    slowest_rank: int
    slowest_ns: int
    median_ns: float
    spread: float


def straggler(ranks: Sequence[RankResult]) -> tuple[float | None, list[StragglerStep], dict[int, float]]:
    """Run spread (worst step), every step's spread, and each rank's worst own spread."""
    compared = [r for r in ranks if r.step_source != "window"]
    if len({r.rank for r in compared}) < 2:  # no step has two ranks' spans (68 k steps: 0.3 s to find out)
        return None, [], {}
    by_index: dict[int, dict[int, int]] = {}
    for result in compared:
        for index, span in result.spans_by_index.items():
            by_index.setdefault(index, {})[result.rank] = span
    steps: list[StragglerStep] = []
    per_rank: dict[int, float] = {}
    for index, spans in sorted(by_index.items()):
        if len(spans) < 2:
            continue
        median = statistics.median(spans.values())
        if median <= 0:
            continue
        slowest = max(spans, key=lambda r: spans[r])
        steps.append(StragglerStep(index, slowest, spans[slowest], median, (spans[slowest] - median) / median))
        for rank, span in spans.items():
            per_rank[rank] = max(per_rank.get(rank, 0.0), (span - median) / median)
    worst = max((s.spread for s in steps), default=None)
    return worst, sorted(steps, key=lambda s: s.spread, reverse=True), per_rank


def reduce_run(ranks: Sequence[RankResult]) -> tuple[dict[str, Any], dict[str, str]]:
    """Run metrics and null reasons from the ranks' results."""
    m: dict[str, Any] = {}
    null: dict[str, str] = {}
    for key in SUMMED:
        values = [r.metrics.get(key) for r in ranks]
        known = [v for v in values if v is not None]
        m[key] = sum(known) if known else None
        if not known:
            null[key] = _first_reason(ranks, key)
    # A rank whose graph executions hide its kernels makes the run's sum unknown, not the other ranks' part.
    for key in set(SUMMED) & set(HIDDEN_BY_GRAPHS):
        blind = [r for r in ranks if r.health.get("graph_executions") and r.metrics.get(key) is None]
        if blind and m[key] is not None:
            m[key] = None
            null[key] = f"rank {blind[0].rank}: {blind[0].null_reasons.get(key, 'not available')}"
    m["gpu_to_cpu_copy_rate"] = _ratio(m["gpu_to_cpu_copies"], m["gpu_ops"])
    m["dtod_bytes_per_step"] = _ratio(m["dtod_bytes_in_steps"], m["step_count"])
    m["nccl_share_of_step"] = _ratio(m["nccl_step_ns"], m["gpu_span_ns"])
    m["pageable_host_share"] = _ratio(m["pageable_host_bytes"], m["host_device_bytes"])
    m["host_device_bytes_per_step"] = _ratio(m["host_device_bytes"], m["step_count"])
    m["pageable_host_bytes_per_step"] = _ratio(m["pageable_host_bytes"], m["step_count"])
    m["gpu_to_cpu_copies_per_step"] = _ratio(m["gpu_to_cpu_copies"], m["step_count"])
    # Small collectives: counts and times add up over ranks, shares from the sums.
    steps_with_calls = sum(r.metrics.get("step_count") or 0 for r in ranks if r.metrics.get("collective_calls_sized"))
    m.update(small.run_totals([r.metrics for r in ranks], steps_with_calls))
    if m["collective_calls_sized"] is not None and steps_with_calls:
        m["collective_calls_per_step"] = m["collective_calls_sized"] / steps_with_calls
    else:
        m["collective_calls_per_step"] = None
    for key in (*small.METRICS, "collective_calls_per_step"):
        if m[key] is None:
            null[key] = _first_reason(ranks, key)
    allreduce = [r.metrics.get("allreduce_bytes_per_step") for r in ranks]
    if allreduce and all(v is not None for v in allreduce) and m["step_count"]:
        total_steps = sum(r.metrics["step_count"] for r in ranks)
        moved = sum(v * r.metrics["step_count"] for v, r in zip(allreduce, ranks, strict=True))
        m["allreduce_bytes_per_step"] = moved / total_steps if total_steps else None
    else:
        m["allreduce_bytes_per_step"] = None
    # The gradient payload of the run: Σ (each rank's payload per step × its steps) ÷ Σ steps,
    # when every rank knows it; the collective that carries it when all ranks agree.
    gradient = [r.metrics.get("gradient_reduction_bytes_per_step") for r in ranks]
    carriers = {r.metrics.get("gradient_reduction_collective") for r in ranks}
    if gradient and all(v is not None for v in gradient) and m["step_count"]:
        moved = sum(v * r.metrics["step_count"] for v, r in zip(gradient, ranks, strict=True))
        m["gradient_reduction_bytes_per_step"] = moved / m["step_count"]
    else:
        m["gradient_reduction_bytes_per_step"] = None
    m["gradient_reduction_collective"] = next(iter(carriers)) if len(carriers) == 1 else None
    if m["dtod_bytes_per_step"] is not None and m["gradient_reduction_bytes_per_step"]:
        m["dtod_to_gradient_ratio"] = m["dtod_bytes_per_step"] / m["gradient_reduction_bytes_per_step"]
    else:
        m["dtod_to_gradient_ratio"] = None
    spread, compared, per_rank = straggler(ranks)
    m["straggler_spread"] = spread
    m["straggler_steps_compared"] = len(compared)
    for result in ranks:
        if result.rank in per_rank:
            result.metrics["straggler_spread"] = per_rank[result.rank]
            result.null_reasons.pop("straggler_spread", None)
    models = sorted({name for r in ranks for name in r.gpu_models})
    m["gpu_models"] = models
    m["distinct_gpu_models"] = len(models) if models else None
    m["gpu_model_ranks"] = sum(1 for r in ranks if r.gpu_models)
    m["ranks"] = len(ranks)
    for key in (
        "gpu_to_cpu_copy_rate",
        "dtod_bytes_per_step",
        "nccl_share_of_step",
        "pageable_host_share",
        "host_device_bytes_per_step",
        "pageable_host_bytes_per_step",
        "gpu_to_cpu_copies_per_step",
        "allreduce_bytes_per_step",
        "gradient_reduction_bytes_per_step",
        "dtod_to_gradient_ratio",
    ):
        if m[key] is None:
            null[key] = _first_reason(ranks, key)
    if spread is None:
        null["straggler_spread"] = (
            _first_reason(ranks, "straggler_spread")
            if not ranks
            else "needs at least two ranks"
            if len(ranks) < 2
            else WINDOW_STEPS_NO_STRAGGLER
            if any(r.step_source == "window" for r in ranks)
            else (
                reason
                if (reason := _first_reason(ranks, "straggler_spread")) != STRAGGLER_NEEDS_RANKS
                else "no step index was found on two or more ranks"
            )
        )
    if not models and ranks:
        null["distinct_gpu_models"] = "the captures do not name their GPUs (no TARGET_INFO_GPU / deviceProperties)"
    elif not models:
        null["distinct_gpu_models"] = _first_reason(ranks, "distinct_gpu_models")
    return m, null


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    """Numerator ÷ denominator, or None when either is unknown or the denominator is 0."""
    return None if numerator is None or not denominator else numerator / denominator


def _first_reason(ranks: Sequence[RankResult], key: str) -> str:
    if not ranks:
        return "no capture was given or could be read"
    for result in ranks:
        if key in result.null_reasons:
            return result.null_reasons[key]
    return "not available from these inputs"


@dataclass
class RunResult:
    """Everything the checks and reports read: run metrics, per-rank results, straggler steps."""

    metrics: dict[str, Any]
    null_reasons: dict[str, str]
    ranks: list[RankResult]
    straggler_steps: list[StragglerStep]
    #: Link metrics from side inputs (traceguard.metrics.links.LinkResult), merged into metrics.
    links: Any = None
    #: Per collective type, Σ over ranks (metrics.collectives.run_totals).
    collectives_by_type: list[dict[str, Any]] = field(default_factory=list)
    #: The rank × peer matrix: {"rows": [{rank, peer, kernels, time_ns, sends, recvs, bytes,
    #: source}], "null_reason": why a rank's point-to-point kernels have no peer, or None}.
    peer_matrix: dict[str, Any] = field(default_factory=dict)
    #: What the run's workload does (metrics.workloads.run_workload).
    workload: dict[str, Any] = field(default_factory=dict)
    #: Who waited for whom (metrics.waits): the clock alignment, the late rank, the split's sums.
    waits: WaitResult | None = None
    #: What NCCL Inspector logs say (metrics.inspector.InspectorResult), when they were given.
    inspector: Any = None


def lighten(result: RankResult) -> RankResult:
    """What the reduce keeps of a rank once its rows have gone to a side output (the streaming
    reduce, issue 30): its metrics, clock, collective calls (``instances``), per-step scalars,
    collectives, peers and GPU→CPU offenders; not its steps' phases, its collectives per step or
    its timeline lanes, which the reduce never reads (a report reloads them for its worst ranks)."""
    steps = [{k: v for k, v in step.items() if k != "phases"} for step in result.steps]
    by_type = {**result.collectives_by_type, "steps": []} if result.collectives_by_type else {}
    return replace(result, steps=steps, collectives_by_type=by_type, timeline={})


def analyse_run(
    ranks: Sequence[tuple[int, Any]],
    *,
    step_patterns: Sequence[str] = (),
    step_sources: Sequence[str] | None = None,
    small_bytes: int | None = None,
) -> RunResult:
    """Map: every rank's capture → RankResult; reduce: run metrics. ``ranks`` = (rank, Capture),
    all in memory (the pipeline maps input by input instead: traceguard.mapreduce).

    ``step_patterns``: the user's and the profile's step regexes; ``step_sources``: the step
    sources tried, in order (default all: pattern, convention, inferred, window); ``small_bytes``:
    the payload below which a collective is small (the profile's, default 1 MiB)."""
    from traceguard.metrics.rank import analyse_rank
    from traceguard.metrics.steps import STEP_SOURCES

    sources = tuple(step_sources) if step_sources else STEP_SOURCES
    results = [
        analyse_rank(
            rank,
            capture,
            step_patterns=step_patterns,
            step_sources=sources,
            ranks_analysed=len(ranks),
            small_bytes=int(small_bytes) if small_bytes else small.DEFAULT_SMALL_BYTES,
        )
        for rank, capture in ranks
    ]
    return reduce_results(results)


def reduce_results(results: Sequence[RankResult]) -> RunResult:
    """The reduce step: the run's metrics, straggler steps, collectives, peer matrix and workload
    from the ranks' results (in rank order)."""
    results = list(results)
    waits = reduce_waits(
        [
            (
                RankClock(r.rank, r.clock.get("base_ns"), r.clock.get("source"), r.clock.get("host"), r.step_source),
                r.instances,
            )
            for r in results
        ]
    )
    apply_waits(results, waits)
    metrics, null = reduce_run(results)
    _, steps, _ = straggler(results)
    run_waits(metrics, null, results, waits)
    return RunResult(
        metrics,
        null,
        results,
        steps,
        collectives_by_type=run_totals([r.collectives_by_type for r in results]),
        peer_matrix=peer_matrix_of(results),
        workload=run_workload([(r.rank, r.workload) for r in results]),
        waits=waits,
    )


#: Rank metrics the cross-rank split adds (metrics.waits), null with its reason when it cannot.
WAIT_RANK_METRICS = ("nccl_wait_ns", "nccl_transfer_ns", "nccl_wait_share", "collective_instances_matched")
#: Step fields it adds: the kernel-time split, its exposed part, and the rank's lateness.
WAIT_STEP_FIELDS = ("nccl_wait_ns", "nccl_transfer_ns", "comm_wait_ns", "comm_transfer_ns", "lateness_ns")


def apply_waits(results: Sequence[RankResult], waits: WaitResult) -> None:
    """The split's per-rank sums, last arrivals and per-step fields into each rank's result."""
    for result in results:
        row = waits.per_rank.get(result.rank, {})
        reason = row.get("null_reason") or "not available from these inputs"
        for key in WAIT_RANK_METRICS:
            result.metrics[key] = row.get(key)
            if row.get(key) is None:
                result.null_reasons[key] = reason
            else:
                result.null_reasons.pop(key, None)
        result.metrics["last_arrivals"] = row.get("last_arrivals")
        if row.get("last_arrivals") is None:
            result.null_reasons["last_arrivals"] = reason
        steps = waits.per_step.get(result.rank, {})
        unmatched = dict.fromkeys(WAIT_STEP_FIELDS)  # a step the split has nothing for: every field null
        for step in result.steps:
            found = steps.get(step["index"])
            step.update(unmatched if found is None else {key: found.get(key) for key in WAIT_STEP_FIELDS})
        result.collectives = with_transfer_bandwidth(result.collectives, waits.transfer_medians, result.rank)


def with_transfer_bandwidth(table: pl.DataFrame, medians: pl.DataFrame | None, rank: int) -> pl.DataFrame:
    """The rank's collective table with bandwidth from transfer time where its calls were matched:
    ``transfer_median_ns`` (median of wait-free kernel time, metrics.waits), ``matched`` calls, and
    algbw/busbw recomputed from it; ``bandwidth_time`` says which time each row's bandwidth uses
    (``transfer``, or ``kernel`` — a lower bound, it includes waiting for the last rank)."""
    if table.height == 0:
        return table.with_columns(
            pl.lit(None, dtype=pl.Float64).alias("transfer_median_ns"),
            pl.lit(None, dtype=pl.UInt32).alias("matched"),
            pl.lit(None, dtype=pl.String).alias("bandwidth_time"),
        )
    own = (
        medians.filter(pl.col("rank") == rank).drop("rank")
        if medians is not None and medians.height
        else pl.DataFrame(
            schema={
                "collective": pl.String,
                "msg_bytes": pl.Int64,
                "transfer_median_ns": pl.Float64,
                "matched": pl.UInt32,
            }
        )
    )
    joined = table.join(
        own.cast({"transfer_median_ns": pl.Float64, "matched": pl.UInt32, "msg_bytes": table.schema["msg_bytes"]}),
        on=["collective", "msg_bytes"],
        how="left",
        nulls_equal=True,
        maintain_order="left",
    )
    # Only where every call of the row was matched: otherwise the median mixes in waiting calls.
    use = (
        pl.col("transfer_median_ns").is_not_null()
        & (pl.col("matched") == pl.col("count"))
        & (pl.col("transfer_median_ns") > 0)
    )
    algbw = pl.when(use).then(pl.col("msg_bytes") / pl.col("transfer_median_ns")).otherwise(pl.col("algbw_gbps"))
    factor = (pl.col("busbw_gbps") / pl.col("algbw_gbps")).fill_nan(None)
    return joined.with_columns(
        algbw.alias("algbw_gbps"),
        pl.when(use)
        .then(pl.col("msg_bytes") / pl.col("transfer_median_ns") * factor)
        .otherwise(pl.col("busbw_gbps"))
        .alias("busbw_gbps"),
        pl.when(use).then(pl.lit("transfer")).otherwise(pl.lit("kernel")).alias("bandwidth_time"),
    )


def run_waits(metrics: dict[str, Any], null: dict[str, str], ranks: Sequence[RankResult], waits: WaitResult) -> None:
    """The run's wait metrics, and the arrival spread beside the span spread (the straggler rule)."""
    for key, value in waits.metrics.items():
        metrics[key] = value
        if value is None:
            null[key] = waits.null_reasons.get(key, "not available from these inputs")
    # Per step index: the latest rank's median lateness ÷ the median GPU span of that step.
    spreads = []
    timed = [r for r in ranks if r.step_source != "window"]  # a capture's length is not a step time
    # A step's length: its GPU span, or on a CPU capture (no GPU work) its range on the host.
    lengths = [r.spans_by_index or {s["index"]: s["cpu_ns"] for s in r.steps if s.get("cpu_ns")} for r in timed]
    for row in waits.arrival_steps if len(timed) == len(ranks) else []:
        spans = [length[row["index"]] for length in lengths if row["index"] in length]
        median = statistics.median(spans) if spans else 0
        if median > 0 and row["lateness_ns"] is not None:
            spreads.append({**row, "median_gpu_span_ns": median, "spread": row["lateness_ns"] / median})
    waits.arrival_steps = sorted(spreads, key=lambda r: r["spread"], reverse=True)
    metrics["arrival_spread"] = waits.arrival_steps[0]["spread"] if spreads else None
    metrics["arrival_steps_compared"] = len(spreads)
    if metrics["arrival_spread"] is None:
        null["arrival_spread"] = (
            WINDOW_STEPS_NO_STRAGGLER
            if len(timed) < len(ranks)
            else waits.null_reasons.get("late_rank") or "no step holds a collective matched on every member rank"
        )
    # What the waiting costs: the exposed NCCL time before the last arrival ÷ the steps' periods.
    exposed = [
        (s["comm_wait_ns"], s["period_ns"])
        for r in ranks
        for s in r.steps
        if s.get("comm_wait_ns") is not None and s.get("period_ns")
    ]
    metrics["exposed_wait_share"] = sum(w for w, _ in exposed) / sum(p for _, p in exposed) if exposed else None
    if metrics["exposed_wait_share"] is None:
        null["exposed_wait_share"] = (
            null.get("nccl_wait_share") or "no step has both a matched collective and a GPU period"
        )
    known = [v for v in (metrics.get("straggler_spread"), metrics["arrival_spread"]) if v is not None]
    metrics["straggler_worst"] = max(known) if known else None
    if not known:
        null["straggler_worst"] = null.get("straggler_spread", "not available from these inputs")
    metrics["straggler_evidence_steps"] = max(metrics.get("straggler_steps_compared") or 0, len(spreads))


def peer_matrix_of(ranks: Sequence[RankResult]) -> dict[str, Any]:
    """The ranks' peer rows as one matrix; the first rank's reason when some kernels lack a peer."""
    rows = [row for r in ranks for row in r.peers.get("rows", [])]
    reasons = [f"rank {r.rank}: {r.peers['null_reason']}" for r in ranks if r.peers.get("null_reason")]
    return {"rows": rows, "null_reason": reasons[0] if reasons else None}
