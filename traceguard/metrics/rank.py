"""Every metric of one rank, from its normalized capture (pure: no I/O).

The definitions are DESIGN.md's "Metric definitions"; each number here says where it comes from.
A metric the capture cannot support is ``None`` with its reason in ``null_reasons``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceguard.metrics import arrivals, breakdown, collectives, copies, graphs, link_counters, nccl
from traceguard.metrics import small_collectives as small
from traceguard.metrics.intervals import union_ns_batched
from traceguard.metrics.steps import (
    NCCL_DOMAIN,
    STEP_SOURCES,
    ResolvedSteps,
    attribute,
    calls_in_steps,
    containing_ids,
    find_phases,
    innermost_containing,
    resolve_steps,
    step_spans,
    window_mask,
)
from traceguard.metrics.table_rows import dicts_from_columns
from traceguard.metrics.timeline import assemble_timeline, compute_union, window_lanes, with_compute
from traceguard.metrics.workloads import BubbleInputs, rank_workload
from traceguard.model import Capture, add_columns

#: Why one rank alone has no straggler spread; the run replaces it when it has the ranks.
STRAGGLER_NEEDS_RANKS = "needs the same steps from at least two ranks"


@dataclass
class RankResult:
    rank: int
    metrics: dict[str, Any]
    null_reasons: dict[str, str]
    steps: list[dict[str, Any]]
    collectives: pl.DataFrame
    #: DtoH copies grouped by the NVTX range and API call that issued them, worst first.
    gpu_to_cpu_offenders: list[dict[str, Any]]
    #: Raw facts for capture_health.
    health: dict[str, Any] = field(default_factory=dict)
    gpu_models: list[str] = field(default_factory=list)
    #: Per step: step index → GPU span (for the straggler spread across ranks).
    spans_by_index: dict[int, int] = field(default_factory=dict)
    #: Where this rank's steps came from (DESIGN.md, "Steps"): "pattern" (the user's or the
    #: profile's ``step_patterns``), "convention" (a training loop's own per-iteration ranges),
    #: "inferred" (the capture's periodic structure), "window" (the whole GPU window as one step),
    #: or None when the rank has neither ranges nor GPU work.
    step_source: str | None = None
    #: The framework whose marker matched (``convention``), or the kernels per inferred
    #: iteration (``inferred``): what the report says next to ``step_source``.
    step_detail: str | None = None
    #: Collectives by type (metrics.collectives.by_type): {"totals", "steps", "null_reasons"}.
    collectives_by_type: dict[str, Any] = field(default_factory=dict)
    #: This rank's row of the rank × peer matrix (metrics.collectives.peer_matrix): {"rows", "null_reason"}.
    peers: dict[str, Any] = field(default_factory=dict)
    #: Collective payload sizes and the small calls' issuers (metrics.small_collectives).
    small_collectives: dict[str, Any] = field(default_factory=dict)
    #: What the rank's workload does (metrics.workloads.rank_workload): transfers per peer, payload, bubble.
    workload: dict[str, Any] = field(default_factory=dict)
    #: Lanes of merged segments over the window (metrics.timeline.rank_timeline).
    timeline: dict[str, Any] = field(default_factory=dict)
    #: The rank's collective calls, a few columns each (metrics.arrivals): what the reduce matches.
    instances: pl.DataFrame = field(default_factory=arrivals.empty)
    #: The capture's clock base and where it came from, and its host (metrics.waits.RankClock).
    clock: dict[str, Any] = field(default_factory=dict)
    #: nsys GPU metrics over the rank's steps, NCCL kernels and copies (metrics.link_counters.rank_links).
    link_counters: dict[str, Any] = field(default_factory=dict)


def analyse_rank(
    rank: int,
    capture: Capture,
    *,
    step_patterns: Sequence[str] = (),
    step_sources: Sequence[str] = STEP_SOURCES,
    ranks_analysed: int = 1,
    small_bytes: int = small.DEFAULT_SMALL_BYTES,
    resolved_steps: ResolvedSteps | None = None,
) -> RankResult:
    """The rank's result from its whole capture. ``resolved_steps``: its steps found already
    (what :func:`resolve_steps` gives of the same ranges, ops and strings; the map finds them
    while the read joins the launches), else found here."""
    info = capture.info
    resolved = (
        resolved_steps
        if resolved_steps is not None
        else resolve_steps(capture.ranges, capture.gpu_ops, capture.strings, step_patterns, step_sources)
    )
    steps = resolved.steps
    phases = find_phases(capture.ranges, steps) if not resolved.gpu_timed else find_phases(capture.ranges, steps[:0])
    ops = attribute(capture.gpu_ops, capture.api_calls, steps, phases, gpu_timed=resolved.gpu_timed)
    ops = nccl.mark_nccl(ops, capture.strings, collective=False)  # collective: on NCCL rows below
    # The NCCL kernels (a few thousand of 10 M ops) as a frame of their own, payload filled: every
    # reader of ``msg_bytes`` reads only them, and filling it in ``ops`` would write a 10 M-row column.
    nccl_rows = ops.select(pl.arg_where(pl.col("is_nccl"))).to_series()
    nccl_kernels = _with_nccl_payload(ops[nccl_rows], capture.ranges, group_size=info.world_size or ranks_analysed)
    spans = step_spans(ops)
    # The window as a lazy filter: each metric below reads only its own columns of it.
    mask = window_mask(ops, spans, steps.select(pl.col("range_id").alias("step_id"), "pid"))
    window = ops.lazy().filter(mask)
    nccl_in_window = nccl_kernels.filter(mask.gather(nccl_rows))
    # The step table, the step breakdown, the timeline's lanes but the compute one and the
    # exposed NCCL time read only ``ops``: they run on a second thread beside the compute union
    # below (Polars and NumPy release the GIL in their heavy calls), not after it, where the
    # timeline's thread was what the rank's result waited for (the 10 M-kernel file read whole:
    # 0.9 s of the result on one core). Two threads, not more: each holds its temporaries, and
    # two cores keep two busy.
    with ThreadPoolExecutor(max_workers=1) as pool:
        step_table = pool.submit(
            lambda: _step_rows(steps, phases, step_pieces(ops, phases), spans, gpu_timed=resolved.gpu_timed)
        )
        lanes = pool.submit(window_lanes, ops, mask, phases)
        gpu_breakdown = (
            pool.submit(
                lambda: breakdown.whole_breakdown(ops, *breakdown.periods(steps, spans, gpu_timed=resolved.gpu_timed))
            )
            if info.has_gpu_trace
            else None
        )
        # Asked only where the window has NCCL kernels (rank_result).
        exposed = pool.submit(nccl.exposed_time, ops, mask) if nccl_in_window.height else None
        sums = window_sums(ops, window)
        # The union of the window's compute kernels per device: read by the timeline and the
        # per-collective breakdown alike, built once, in slices.
        compute_segments = compute_union(ops, mask)
        timeline_parts = with_compute(lanes.result(), compute_segments)  # while the pool ends its queue
        step_table_rows = step_table.result()
        step_breakdown = gpu_breakdown.result() if gpu_breakdown is not None else {}
    inputs = RankInputs(
        resolved=resolved,
        phases=phases,
        op_counts=op_counts(ops),
        nccl_kernels=nccl_kernels,
        nccl_in_window=nccl_in_window,
        sums=sums,
        exposed=lambda: exposed.result() if exposed is not None else nccl.exposed_time(ops, mask),
        step_table=step_table_rows,
        graph_summary=graphs.summarize(ops, mask, capture.strings),
        rare_ops=ops,
        rare_mask=mask,
        offender_groups=lambda: offender_groups(window, capture),
        compute_near_nccl=compute_segments,
        timeline=lambda step_rows, nccl_ops: assemble_timeline(rank, timeline_parts, nccl_ops, step_rows, phases),
        devices_used=window.select(pl.col("device").unique()).collect().to_series(),
        bubble=ops,
        breakdown=lambda: step_breakdown,
        copy_mask=lambda _device, times: link_counters.copy_mask_of(ops, mask, times),
    )
    return rank_result(rank, capture, inputs, ranks_analysed=ranks_analysed, small_bytes=small_bytes)


@dataclass
class RankInputs:
    """What :func:`rank_result` needs from the attributed ops: :func:`analyse_rank` takes it from
    the whole frame; the sliced analysis (traceguard.metrics.sliced) builds it a time slice at a time."""

    resolved: ResolvedSteps
    phases: pl.DataFrame
    #: :func:`op_counts` of all the ops.
    op_counts: dict[str, int]
    #: The NCCL kernels in the ops' order, ``msg_bytes`` filled; those of the window.
    nccl_kernels: pl.DataFrame
    nccl_in_window: pl.DataFrame
    sums: WindowSums
    #: The window's exposed NCCL ns (asked only when the window has NCCL kernels).
    exposed: Callable[[], int]
    #: :func:`_step_rows`' result.
    step_table: tuple[list[dict[str, Any]], int, int]
    #: metrics.graphs.summary of the window.
    graph_summary: dict[str, Any]
    #: At least every NCCL kernel and CUDA graph execution of the ops (attributed), and which of
    #: them lie in the window.
    rare_ops: pl.DataFrame
    rare_mask: pl.Series
    #: The window's GPU-to-CPU copies by issuer: :func:`offender_groups` of them (or parts of
    #: them, in any number of rows per group: the groups add up).
    offender_groups: Callable[[], pl.DataFrame]
    #: Per device, the window's compute union (at least the segments that meet its NCCL kernels).
    compute_near_nccl: dict[int, tuple[Any, Any]]
    #: (step rows, the window's NCCL kernels with their collective) → the timeline.
    timeline: Callable[[list[dict[str, Any]], pl.DataFrame], dict[str, Any]]
    #: The devices the window's ops ran on.
    devices_used: pl.Series
    #: The attributed ops, or what the pipeline bubble reads of them.
    bubble: pl.DataFrame | BubbleInputs
    #: Step index → the step's GPU time broken down (metrics.breakdown).
    breakdown: Callable[[], dict[int, dict[str, int]]]
    #: (device, its GPU metrics sample times) → which samples lie over the window's copies
    #: (metrics.link_counters); asked only when the capture has samples of the rank's GPU.
    copy_mask: Callable[[int, np.ndarray], np.ndarray] | None = None


def rank_result(
    rank: int, capture: Capture, inputs: RankInputs, *, ranks_analysed: int, small_bytes: int
) -> RankResult:
    """The rank's result from its :class:`RankInputs` (``capture``: its small frames and info)."""
    info = capture.info
    resolved, steps, phases = inputs.resolved, inputs.resolved.steps, inputs.phases
    no_steps = _no_steps_reason(capture, inputs.op_counts["gpu_ops"])
    m, null, nccl_ops = _window_metrics(
        capture.strings,
        inputs.sums,
        steps,
        phases,
        inputs.nccl_kernels,
        inputs.nccl_in_window,
        inputs.exposed,
        no_steps,
    )
    step_rows, span_total, nccl_in_steps = inputs.step_table
    m["gpu_span_ns"] = span_total
    m["nccl_step_ns"] = nccl_in_steps
    step_count = steps.height
    if not step_count:
        m["nccl_share_of_step"] = None
        null["nccl_share_of_step"] = no_steps
    elif not span_total:
        m["nccl_share_of_step"] = None
        null["nccl_share_of_step"] = "no GPU work was launched inside the steps"
    else:
        m["nccl_share_of_step"] = nccl_in_steps / span_total
    m["straggler_spread"] = None
    null["straggler_spread"] = STRAGGLER_NEEDS_RANKS
    # CUDA graphs traced whole hide their kernels: what counts them is unknown, not 0 (metrics.graphs).
    graph_summary = inputs.graph_summary
    graphs.hide(m, null, graph_summary)
    graphs.hide_in_steps(step_rows, inputs.rare_ops, steps)
    # The link counters over the steps, NCCL kernels and copies: before the timeline's thread
    # starts, since they add the steps' link fields that the timeline's step rows carry.
    own, device, no_samples = link_counters.rank_device_samples(capture, inputs.devices_used.to_list())
    copy_mask = inputs.copy_mask(device, own["time"].to_numpy()) if device is not None and inputs.copy_mask else None
    link_m, link_null, links = link_counters.rank_links(
        capture, own, device, no_samples, step_rows, inputs.nccl_in_window, copy_mask
    )
    m.update(link_m)
    null.update(link_null)
    # The timeline's lanes read only these frames: drawn on a second thread beside the metrics below
    # (NumPy and Polars release the GIL in their heavy calls), ~1.5 s of a 10 M-kernel rank.
    timeline_pool = ThreadPoolExecutor(max_workers=1)
    timeline = timeline_pool.submit(inputs.timeline, step_rows, nccl_ops)
    timeline_pool.shutdown(wait=False)
    _add_breakdown(step_rows, inputs.breakdown() if info.has_gpu_trace else {})

    if not info.has_gpu_trace:
        _null_gpu_metrics(m, null)

    models = _gpu_models(capture, inputs.devices_used)
    by_type, peers = collectives.breakdown(
        rank,
        inputs.rare_ops,
        inputs.rare_mask,
        nccl_ops,
        steps,
        capture.ranges,
        nccl_domain=NCCL_DOMAIN,
        group_size=info.world_size or ranks_analysed,
        compute=inputs.compute_near_nccl,
    )
    if graph_summary["graph_executions"]:
        by_type = {"totals": [], "steps": [], "null_reasons": {"totals": graphs.hidden_reason(graph_summary)}}
        peers = {"rows": [], "null_reason": graphs.hidden_reason(graph_summary)}
    small_metrics, small_null, small_details = small.small_collectives(
        _collective_calls(capture, nccl_ops, steps, phases), step_count, small_bytes
    )
    m.update(small_metrics)
    null.update(small_null)
    sized = small_metrics["collective_calls_sized"]
    m["collective_calls_per_step"] = sized / step_count if sized is not None and step_count else None
    if m["collective_calls_per_step"] is None:
        null["collective_calls_per_step"] = small_null.get("collective_calls_sized") or no_steps
    graphs.hide(m, null, graph_summary)  # again: the collective-call metrics exist now
    return RankResult(
        rank=rank,
        metrics=m,
        null_reasons=null,
        steps=step_rows,
        collectives=nccl.collective_table(nccl_ops, ranks_analysed),
        gpu_to_cpu_offenders=_offenders(inputs.offender_groups(), capture),
        health={**_health(capture, steps, inputs.op_counts), **graph_summary},
        gpu_models=models,
        spans_by_index={r["index"]: r["gpu_span_ns"] for r in step_rows if r["gpu_span_ns"] is not None},
        step_source=resolved.source,
        step_detail=_step_detail(resolved),
        collectives_by_type=by_type,
        peers=peers,
        small_collectives=small_details,
        workload=rank_workload(capture.ranges, steps, inputs.bubble, by_type),
        timeline=link_counters.with_link_lane(timeline.result(), own, device),
        link_counters=links,
        instances=(
            arrivals.collective_instances(nccl_ops, steps, phases, inputs.compute_near_nccl)
            if nccl_ops.height
            else arrivals.cpu_instances(capture.ranges, steps, phases)
        ),
        clock={"base_ns": info.clock_base_ns, "source": info.clock_source, "host": info.host},
    )


def _add_breakdown(step_rows: list[dict[str, Any]], parts: dict[int, dict[str, int]]) -> None:
    """Each step row's GPU time broken down (metrics.breakdown); None where the step has no GPU span."""
    missing = dict.fromkeys(breakdown.FIELDS)  # update() copies its values: one serves every row
    for row in step_rows:
        row.update(parts.get(row["index"], missing))


def _step_detail(resolved: ResolvedSteps) -> str | None:
    if resolved.source == "convention":
        return resolved.convention
    if resolved.source == "inferred":
        periods = sorted(set(resolved.period_kernels.values()))
        return f"{', '.join(map(str, periods))} kernels per iteration"
    return None


@dataclass
class WindowSums:
    """The analysis window's additive facts that read every op (:func:`window_sums`); the sliced
    analysis adds them up a time slice at a time."""

    #: metrics.copies.copy_counts of the window.
    counts: dict[str, int]
    #: metrics.copies.pageable_bytes of the window: (pageable, known host bytes, known copies).
    pageable: tuple[int, int, int]
    #: Σ bytes of the device-to-device copies inside the steps (window or not).
    dtod_step_bytes: int


def window_sums(ops: pl.DataFrame, window: pl.LazyFrame) -> WindowSums:
    dtod_in_steps = ops.lazy().filter(pl.col("step_id").is_not_null() & (pl.col("copy_kind") == "DtoD"))
    dtod = int(dtod_in_steps.select(pl.col("bytes").sum()).collect().item() or 0)
    return WindowSums(copies.copy_counts(window), copies.pageable_bytes(window), dtod)


def _window_metrics(
    strings: pl.DataFrame,
    sums: WindowSums,
    steps: pl.DataFrame,
    phases: pl.DataFrame,
    nccl_kernels: pl.DataFrame,
    nccl_in_window: pl.DataFrame,
    exposed: Callable[[], int],
    no_steps: str,
) -> tuple[dict[str, Any], dict[str, str], pl.DataFrame]:
    """The copy, payload and NCCL-kernel metrics, their null reasons, and the NCCL kernels of
    the window (with their collective). ``nccl_kernels``: the NCCL kernels of the ops, in their
    order, ``msg_bytes`` filled (:func:`_with_nccl_payload`); ``nccl_in_window``: those in the
    window; ``exposed``: the window's exposed NCCL ns (metrics.nccl.exposed_time), asked only
    when the window has NCCL kernels."""
    null: dict[str, str] = {}
    m: dict[str, Any] = dict(sums.counts)
    gpu_ops = m["gpu_ops"]
    m["gpu_to_cpu_copy_rate"] = (m["gpu_to_cpu_copies"] / gpu_ops) if gpu_ops else None
    if m["gpu_to_cpu_copy_rate"] is None:
        null.setdefault("gpu_to_cpu_copy_rate", "no GPU ops in the analysis window")

    step_count = steps.height
    m["step_count"] = step_count
    dtod_step_bytes = sums.dtod_step_bytes
    m["dtod_bytes_in_steps"] = dtod_step_bytes
    if step_count:
        m["dtod_bytes_per_step"] = dtod_step_bytes / step_count
    else:
        m["dtod_bytes_per_step"] = None
        null["dtod_bytes_per_step"] = no_steps

    # All-reduce payload per step (the gradient bytes DDP moves): Kineto kernel args, or NCCL's
    # NVTX payload in nsys exports made with --include-blobs=true.
    nccl_in_step = nccl_kernels.filter(pl.col("step_id").is_not_null())
    nccl_in_step = nccl.with_collective(nccl_in_step, strings)
    allreduce = nccl_in_step.filter(pl.col("collective") == "AllReduce")
    known = allreduce.filter(pl.col("msg_bytes").is_not_null())
    if step_count and allreduce.height and known.height == allreduce.height:
        m["allreduce_bytes_per_step"] = int(known["msg_bytes"].sum()) / step_count
    else:
        m["allreduce_bytes_per_step"] = None
        null["allreduce_bytes_per_step"] = (
            no_steps
            if not step_count
            else "no all-reduce kernels inside the steps"
            if not allreduce.height
            else "all-reduce message sizes are not in this capture (nsys: export with "
            "`nsys export --type sqlite --include-blobs=true`; or capture with torch.profiler)"
        )
    # The gradient payload rides on all-reduce (DDP) or reduce-scatter (FSDP/ZeRO): whichever
    # carries more bytes in the steps (metrics.collectives.gradient_reduction).
    phase_names = dict(phases.select("phase_id", "name").iter_rows()) if phases.height else None
    grad_collective, grad_bytes, grad_reason = collectives.gradient_reduction(nccl_in_step, step_count, phase_names)
    m["gradient_reduction_collective"] = grad_collective
    m["gradient_reduction_bytes_per_step"] = grad_bytes
    if grad_bytes is None:
        null["gradient_reduction_bytes_per_step"] = no_steps if not step_count else str(grad_reason)
    if m["dtod_bytes_per_step"] is not None and m["gradient_reduction_bytes_per_step"]:
        m["dtod_to_gradient_ratio"] = m["dtod_bytes_per_step"] / m["gradient_reduction_bytes_per_step"]
    else:
        m["dtod_to_gradient_ratio"] = None
        null["dtod_to_gradient_ratio"] = null.get("dtod_bytes_per_step") or null["gradient_reduction_bytes_per_step"]

    pageable, known_bytes, known_copies = sums.pageable
    m["host_device_copies"] = known_copies
    m["host_device_bytes"] = known_bytes
    m["host_device_bytes_per_step"] = known_bytes / step_count if step_count else None
    m["pageable_host_bytes_per_step"] = pageable / step_count if step_count else None
    m["gpu_to_cpu_copies_per_step"] = m["gpu_to_cpu_copies"] / step_count if step_count else None
    if not step_count:
        for key in ("host_device_bytes_per_step", "pageable_host_bytes_per_step", "gpu_to_cpu_copies_per_step"):
            null[key] = no_steps
    m["pageable_host_bytes"] = pageable
    m["pageable_host_share"] = pageable / known_bytes if known_bytes else None
    if not known_bytes:
        null["pageable_host_share"] = "no host↔device copies with a known host memory kind in the window"

    nccl_ops = nccl.with_collective(nccl_in_window, strings)
    m["nccl_kernels"] = nccl_ops.height
    m["nccl_time_ns"] = int(nccl.nccl_time(nccl_ops, []).get_column("nccl_ns").sum() or 0) if nccl_ops.height else 0
    m["nccl_exposed_ns"] = exposed() if nccl_ops.height else 0
    return m, null, nccl_ops


def _null_gpu_metrics(m: dict[str, Any], null: dict[str, str]) -> None:
    """A CPU-only capture: every GPU-derived number is "not available", for one reason."""
    no_gpu = "the capture has no GPU activity trace (CPU-only job, or nsys without --trace=cuda)"
    for key in (
        "gpu_ops",
        "gpu_to_cpu_copies",
        "gpu_to_cpu_bytes",
        "dtod_copies",
        "dtod_bytes",
        "peer_copies",
        "peer_bytes",
        "gpu_to_cpu_copy_rate",
        "dtod_bytes_per_step",
        "allreduce_bytes_per_step",
        "gradient_reduction_bytes_per_step",
        "dtod_to_gradient_ratio",
        "pageable_host_share",
        "nccl_share_of_step",
        "nccl_kernels",
        "nccl_time_ns",
        "nccl_exposed_ns",
        "gpu_span_ns",
        "nccl_step_ns",
        "dtod_bytes_in_steps",
        "host_device_copies",
        "host_device_bytes",
        "host_device_bytes_per_step",
        "pageable_host_bytes",
        "pageable_host_bytes_per_step",
        "gpu_to_cpu_copies_per_step",
    ):
        m[key] = None
        null[key] = no_gpu
    null["straggler_spread"] = no_gpu


def _no_steps_reason(capture: Capture, gpu_ops: int) -> str:
    """Why a rank has no step at all: no marker range, and no GPU work (``gpu_ops`` of the
    capture) to infer steps from (with GPU work, the ``window`` source always yields one)."""
    if gpu_ops:
        return "no step marker matched and the step sources tried found none (see --step-source)"
    if not capture.info.has_ranges or capture.ranges.height == 0:
        return "no NVTX / user-annotation ranges and no GPU work in the capture, so no steps"
    return (
        "no range matches a step pattern or a known training-loop marker (e.g. `Batch 3`, `ProfilerStep#3`; "
        "give yours with --step-pattern), and the capture has no GPU work to infer steps from"
    )


def _with_nccl_payload(ops: pl.DataFrame, ranges: pl.DataFrame, *, group_size: int | None = None) -> pl.DataFrame:
    """Fill NCCL kernels' ``msg_bytes`` from the NCCL NVTX range around their launch call, or
    (traces without collective args) PyTorch's ``nccl:<op>`` annotation around it.

    NCCL's payload of ``ncclAllGather`` is the send size and of ``ncclReduceScatter`` the
    receive size: one rank's share. ``msg_bytes`` follows nccl-tests (the larger buffer), so
    those are multiplied by the communicator size (``group_size``: the run's world size or the
    number of ranks analysed, DESIGN.md's rule for n); without it they stay unknown."""
    sized = (pl.col("domain") == NCCL_DOMAIN) | pl.col("name").str.starts_with("nccl:")
    payload = ranges.filter(sized & pl.col("payload_bytes").is_not_null())
    per_rank = (pl.col("domain") == NCCL_DOMAIN) & pl.col("name").is_in(list(collectives.PER_RANK_PAYLOAD_CALLS))
    whole = pl.col("payload_bytes") * group_size if group_size else pl.lit(None, dtype=pl.Int64)
    payload = payload.with_columns(
        pl.when(per_rank.fill_null(False)).then(whole).otherwise(pl.col("payload_bytes")).alias("payload_bytes")
    )
    wanted = pl.col("is_nccl") & pl.col("msg_bytes").is_null()
    if payload.height == 0:
        return ops
    rows = ops.select(pl.arg_where(wanted)).to_series()
    if rows.len() == 0:
        return ops
    targets = ops[rows].select("pid", pl.col("launch_tid").alias("tid"), "launch_start")
    found = containing_ids(
        targets,
        "launch_start",
        payload.select("pid", "tid", "start", "end", pl.col("payload_bytes").alias("_payload")),
        "_payload",
        ["pid", "tid"],
    )
    # Only the wanted rows change (their msg_bytes was null): one column is rewritten, not the frame.
    return add_columns(ops, [ops["msg_bytes"].scatter(rows, found.cast(ops.schema["msg_bytes"]))])


@dataclass
class StepPieces:
    """What the step breakdown reads from the attributed ops (:func:`step_pieces`); the sliced
    analysis (traceguard.metrics.sliced) builds the same pieces a time slice at a time."""

    #: Whether any op lies in a step / in a phase of a step.
    any_in_steps: bool
    any_in_phases: bool
    #: NCCL kernels inside the steps (``is_nccl``, ``step_id``, ``phase_id``, ``device``, ``start``, ``end``).
    nccl_in_steps: pl.DataFrame
    #: Per ``step_id``: ``dtod_bytes``, ``dtod_copies``, ``peer_bytes``, ``peer_copies``.
    copies: pl.DataFrame
    #: Per ``phase_id``: ``gpu_ns`` (the union of the phase's ops per device, summed over devices).
    phase_gpu: pl.DataFrame


def step_pieces(ops: pl.DataFrame, phases: pl.DataFrame) -> StepPieces:
    """:class:`StepPieces` of the attributed ``ops`` (``step_id``, ``phase_id``, ``is_nccl``)."""
    in_steps = ops.lazy().filter(pl.col("step_id").is_not_null())
    any_in_steps = bool(ops.select(pl.col("step_id").is_not_null().any()).item())
    any_in_phases = bool(
        phases.height and ops.select((pl.col("step_id").is_not_null() & pl.col("phase_id").is_not_null()).any()).item()
    )
    nccl_in_steps = in_steps.filter(pl.col("is_nccl")).select(*STEP_NCCL_COLUMNS).collect()
    phase_gpu = pl.DataFrame(schema={"phase_id": ops.schema["phase_id"], "gpu_ns": pl.Int64})
    if phases.height:
        in_phases = in_steps.filter(pl.col("phase_id").is_not_null())
        phase_gpu = (
            union_ns_batched(in_phases, ["phase_id", "device"])
            .group_by("phase_id")
            .agg(pl.col("union_ns").sum().alias("gpu_ns"))
            .collect()
        )
    return StepPieces(any_in_steps, any_in_phases, nccl_in_steps, step_copies(in_steps), phase_gpu)


#: The columns of the NCCL kernels the step breakdown reads.
STEP_NCCL_COLUMNS = ("is_nccl", "step_id", "phase_id", "device", "start", "end")


def step_copies(in_steps: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Per ``step_id`` of the ops in steps: device-to-device and peer copies and bytes."""
    return step_copies_query(in_steps).collect()


def step_copies_query(in_steps: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """:func:`step_copies` as a query (collected with others: traceguard.metrics.sliced)."""
    is_dtod, is_peer = pl.col("copy_kind") == "DtoD", pl.col("copy_kind") == "PtoP"
    return (
        in_steps.lazy()
        .filter(is_dtod | is_peer)
        .group_by("step_id")
        .agg(
            pl.col("bytes").filter(is_dtod).sum().alias("dtod_bytes"),
            is_dtod.sum().alias("dtod_copies"),
            pl.col("bytes").filter(is_peer).sum().alias("peer_bytes"),
            is_peer.sum().alias("peer_copies"),
        )
    )


#: A step's phase's times in the JSON contract (``steps[].phases``).
PHASE_TIMES = ("cpu_ns", "gpu_ns", "nccl_ns")


def _step_rows(
    steps: pl.DataFrame, phases: pl.DataFrame, pieces: StepPieces, spans: pl.DataFrame, *, gpu_timed: bool = False
) -> tuple[list[dict[str, Any]], int, int]:
    """The step breakdown of the JSON contract, plus Σ GPU spans and Σ NCCL time in steps.

    ``cpu_ns`` is the step range's duration on the CPU; GPU-timed steps (inferred, window) have
    no CPU range, so it is None for them."""
    if steps.height == 0:
        return [], 0, 0
    step_nccl = nccl.nccl_time(pieces.nccl_in_steps, ["step_id"]) if pieces.any_in_steps else None
    table = steps.join(spans, left_on="range_id", right_on="step_id", how="left")
    if step_nccl is not None:
        table = table.join(step_nccl, left_on="range_id", right_on="step_id", how="left")
    else:
        table = table.with_columns(pl.lit(None, dtype=pl.Int64).alias("nccl_ns"))
    table = table.join(pieces.copies, left_on="range_id", right_on="step_id", how="left").sort("index")

    phase_rows: dict[int, dict[str, dict[str, int]]] = {}
    if phases.height:
        in_phases = pieces.nccl_in_steps.filter(pl.col("phase_id").is_not_null())
        nccl_by_phase = nccl.nccl_time(in_phases, ["phase_id"]) if pieces.any_in_phases else None
        per_phase = phases.with_columns((pl.col("end") - pl.col("start")).alias("cpu_ns")).join(
            pieces.phase_gpu, on="phase_id", how="left"
        )
        if nccl_by_phase is not None:
            per_phase = per_phase.join(nccl_by_phase, on="phase_id", how="left")
        else:
            per_phase = per_phase.with_columns(pl.lit(None, dtype=pl.Int64).alias("nccl_ns"))
        # A name repeated inside one step (two `forward` ranges) is one phase: times add up.
        grouped = (
            per_phase.group_by(["step_id", "name"], maintain_order=True)
            .agg(
                pl.col("cpu_ns").sum().cast(pl.Int64),
                pl.col("gpu_ns").fill_null(0).sum().cast(pl.Int64),
                pl.col("nccl_ns").fill_null(0).sum().cast(pl.Int64),
                pl.col("start").min(),
            )
            .sort("start")
        )
        # Each phase's times a dict from the columns (table_rows), then grouped by step: 137 k
        # phase rows of the CUDA-graph shape.
        times = dicts_from_columns(PHASE_TIMES, [grouped[c].to_list() for c in PHASE_TIMES])
        for step_id, name, phase in zip(grouped["step_id"].to_list(), grouped["name"].to_list(), times, strict=True):
            phase_rows.setdefault(step_id, {})[name] = phase

    # Every value as a column, then a dict per row from them (table_rows): 68 k steps of the
    # CUDA-graph shape, where a dict literal per row in a Python loop took 0.1 s more.
    # (Casts as int() took each value: the columns are integers already.)
    span = pl.col("gpu_end") - pl.col("gpu_start")  # null where the step has no GPU span
    nccl_ns = pl.col("nccl_ns").fill_null(0).cast(pl.Int64)
    spanned = span.fill_null(0) != 0
    values = table.select(
        "name",
        pl.col("index").cast(pl.Int64),
        pl.col("start").cast(pl.Int64).alias("start_ns"),
        pl.col("gpu_start").alias("gpu_start_ns"),
        (pl.lit(None, dtype=pl.Int64) if gpu_timed else pl.col("end") - pl.col("start")).cast(pl.Int64).alias("cpu_ns"),
        span.alias("gpu_span_ns"),
        nccl_ns.alias("nccl_ns"),
        pl.when(spanned).then(nccl_ns / span).alias("nccl_share"),
        *(pl.col(c).fill_null(0).cast(pl.Int64) for c in ("dtod_bytes", "dtod_copies", "peer_bytes", "peer_copies")),
    )
    totals = table.select(span.filter(spanned).sum(), nccl_ns.filter(spanned).sum()).row(0)
    phases_of = [phase_rows.get(range_id, {}) for range_id in table["range_id"].to_list()]
    columns = [series.to_list() for series in values.get_columns()]
    rows = dicts_from_columns((*values.columns, "phases"), [*columns, phases_of])
    span_total, nccl_total = (int(total or 0) for total in totals)
    return rows, span_total, nccl_total


#: What :func:`offender_groups` gives: GPU-to-CPU copies by issuer (range id, launching call's name id).
OFFENDER_GROUP_SCHEMA = {"range_id": pl.Int64, "launch_name_id": pl.Int64, "copies": pl.UInt32, "bytes": pl.Int64}


def offender_groups(ops: pl.LazyFrame | pl.DataFrame, capture: Capture) -> pl.DataFrame:
    """The GPU-to-CPU copies of ``ops`` grouped by issuer: the innermost NVTX range on the
    launching thread (its ``range_id``) and the launching call (``launch_name_id``), with their
    count and bytes (:data:`OFFENDER_GROUP_SCHEMA`). Ids, not names: a host-staged job's millions
    of copies never carry a string column, and groups of parts of the ops add up."""
    # Only what the grouping reads: every other column would be carried through the joins below.
    dtoh = (
        ops.lazy()
        .filter(pl.col("copy_kind").is_in(copies.GPU_TO_CPU))
        .select("pid", "launch_tid", "launch_start", "launch_name_id", "bytes")
        .collect()
    )
    if dtoh.height == 0:
        return pl.DataFrame(schema=OFFENDER_GROUP_SCHEMA)
    return (
        _issuing_range(dtoh, capture)
        .group_by(["range_id", "launch_name_id"])
        .agg(pl.len().alias("copies"), pl.col("bytes").sum().alias("bytes"))
        .cast(OFFENDER_GROUP_SCHEMA)  # type: ignore[arg-type]
    )


def _offenders(groups: pl.DataFrame, capture: Capture, limit: int = 5) -> list[dict[str, Any]]:
    """GPU-to-CPU copies by (innermost NVTX range on the launching thread, API call): the
    :func:`offender_groups` rows named and added up, the ``limit`` largest."""
    if groups.height == 0:
        return []
    return (
        _range_and_call_names(groups, capture)
        .group_by(["nvtx_range", "api_call"])
        .agg(pl.col("copies").sum(), pl.col("bytes").sum())
        .sort(["copies", "bytes", "nvtx_range", "api_call"], descending=[True, True, False, False], nulls_last=True)
        .head(limit)
        .to_dicts()
    )


def _issued_by(ops: pl.DataFrame, capture: Capture) -> pl.DataFrame:
    """``ops`` with ``nvtx_range`` (the innermost range, outside NCCL's domain, open on the
    launching thread at the launch) and ``api_call`` (the launching call's name): who issued them."""
    return _range_and_call_names(_issuing_range(ops, capture), capture)


def _range_and_call_names(frame: pl.DataFrame, capture: Capture) -> pl.DataFrame:
    """``frame``'s ``range_id`` and ``launch_name_id`` as ``nvtx_range`` and ``api_call`` names."""
    names = capture.strings.rename({"id": "launch_name_id", "value": "api_call"})
    frame = frame.join(names, on="launch_name_id", how="left")
    # Only the ranges named here are joined (a range per op: 1.25 M ranges a rank, 27 -> 5 ms).
    ranges = _ranges_with_ids(capture.ranges.select("range_id", pl.col("name").alias("nvtx_range")), frame)
    return frame.join(ranges, on="range_id", how="left")


def _ranges_with_ids(ranges: pl.DataFrame, frame: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``ranges`` whose ``range_id`` is one of ``frame``'s: a left join of ``frame``
    on them is its join on all of ``ranges``, without hashing every range."""
    return ranges.filter(pl.col("range_id").is_in(frame["range_id"].drop_nulls().unique().implode()))


def _issuing_range(ops: pl.DataFrame, capture: Capture) -> pl.DataFrame:
    """``ops`` with ``range_id``: the innermost range, outside NCCL's domain, open on the
    launching thread at the launch (null: none)."""
    dtoh = ops
    ranges = capture.ranges.filter(pl.col("domain").is_null() | (pl.col("domain") != NCCL_DOMAIN))
    if ranges.height:
        found = innermost_containing(
            dtoh.lazy().with_columns(pl.col("launch_tid").alias("tid")),
            "launch_start",
            ranges.select("pid", "tid", "start", "end", "range_id"),
            "range_id",
            ["pid", "tid"],
        ).collect()
        # The latest range that started before the call may have ended already: climb parents.
        parents = ranges.select("range_id", "parent", pl.col("end").alias("_end"))
        for _ in range(int(ranges["depth"].max() or 0) + 1):
            found = found.join(_ranges_with_ids(parents, found), on="range_id", how="left")
            ended = pl.col("launch_start") > pl.col("_end")
            if found.select(ended.fill_null(False).any()).item() is False:
                found = found.drop("parent", "_end")
                break
            found = found.with_columns(
                pl.when(ended).then(pl.col("parent")).otherwise(pl.col("range_id")).alias("range_id")
            ).drop("parent", "_end")
        return found.drop([c for c in ("parent", "_end") if c in found.columns])
    return dtoh.with_columns(pl.lit(None, dtype=capture.ranges.schema["range_id"]).alias("range_id"))


def _collective_calls(
    capture: Capture, nccl_ops: pl.DataFrame, steps: pl.DataFrame, phases: pl.DataFrame
) -> pl.DataFrame:
    """The rank's collective calls inside its steps (metrics.small_collectives.CALL_SCHEMA): its
    NCCL kernels, or without any, the c10d annotations (``gloo:all_reduce`` ...) of a CPU job.
    ``issuer``: the innermost range open on the launching thread, else the step's phase the call
    falls in (DDP launches from autograd's or gloo's own thread), else the launching API call."""
    phase_names = phases.select(pl.col("phase_id").cast(pl.Int64), pl.col("name").alias("_phase"))
    if nccl_ops.height:
        kernels = nccl_ops.filter(pl.col("step_id").is_not_null())
        if kernels.height == 0:
            return pl.DataFrame(schema=small.CALL_SCHEMA)
        kernels = _issued_by(kernels, capture).with_columns(pl.col("phase_id").cast(pl.Int64))
        kernels = kernels.join(phase_names, on="phase_id", how="left")
        return kernels.select(
            pl.col("collective").cast(pl.String).fill_null(small.OTHER),
            (pl.col("end") - pl.col("start")).alias("duration_ns"),
            pl.col("msg_bytes").alias("payload_bytes"),
            pl.col("step_id").cast(pl.Int64),
            pl.coalesce("nvtx_range", "_phase", "api_call").alias("issuer"),
        )
    calls = small.annotation_calls(capture.ranges)
    if calls.height == 0 or steps.height == 0:
        return pl.DataFrame(schema=small.CALL_SCHEMA)
    parents = capture.ranges.select(pl.col("range_id").alias("parent"), pl.col("name").alias("_parent_name"))
    calls = calls_in_steps(calls, steps, phases).join(parents, on="parent", how="left")
    calls = calls.filter(pl.col("step_id").is_not_null()).join(phase_names, on="phase_id", how="left")
    return calls.select(
        "collective",
        (pl.col("end") - pl.col("start")).alias("duration_ns"),
        "payload_bytes",
        "step_id",
        pl.coalesce("_parent_name", "_phase", "name").alias("issuer"),
    )


def _gpu_models(capture: Capture, used: pl.Series) -> list[str]:
    """Names of the GPUs this rank ran work on (``used``: the window's devices; the file lists
    every GPU of the node)."""
    used = used.drop_nulls()
    names = capture.devices.filter(pl.col("device").is_in(used.implode()) & pl.col("name").is_not_null())
    return sorted(set(names["name"].to_list()))


def op_counts(ops: pl.DataFrame) -> dict[str, int]:
    """The op counts capture_health reports: all ops, those without a launch, those ending before they start."""
    row = ops.select(*op_count_exprs()).row(0, named=True)
    return {k: int(v or 0) for k, v in row.items()}


def op_count_exprs() -> list[pl.Expr]:
    """:func:`op_counts`' sums as expressions, named by its keys."""
    return [
        pl.len().alias("gpu_ops"),
        pl.col("launch_start").is_null().sum().alias("ops_without_launch"),
        (pl.col("end") < pl.col("start")).sum().alias("negative_ops"),
    ]


def _health(capture: Capture, steps: pl.DataFrame, counts: dict[str, int]) -> dict[str, Any]:
    ranges = capture.ranges
    domains_with_ranges = set(ranges["domain"].drop_nulls().unique().to_list())
    empty_domains = [d for d in capture.info.nvtx_domains if d not in domains_with_ranges]
    folded = int(capture.folded_ranges["ranges"].sum() or 0)
    return {
        "gpu_ops": counts["gpu_ops"],
        "api_calls": capture.api_calls.height,
        "ranges": ranges.height + folded,  # every range seen, the per-op ones counted but not kept too
        "folded_op_ranges": folded,
        "steps": steps.height,
        "has_gpu_trace": capture.info.has_gpu_trace,
        "has_ranges": capture.info.has_ranges,
        "nvtx_domains": list(capture.info.nvtx_domains),
        "domains_without_ranges": empty_domains,
        # PyTorch opens its per-op ranges in the default domain (nvtxRangePushA: domainId 0 in
        # every capture at hand), so the folded ones count there, as they did when they were rows.
        "default_domain_ranges": ranges.filter(pl.col("domain").is_null()).height + folded,
        "ops_without_launch": counts["ops_without_launch"],
        "negative_durations": counts["negative_ops"] + ranges.filter(pl.col("end") < pl.col("start")).height,
    }
