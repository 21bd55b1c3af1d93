"""What a rank's workload does: pipeline transfers per peer and the bubble, broadcast/reduce payload and
exposed time (pure functions over one rank's ranges and attributed GPU ops).

The harness's workloads (``traceguard/capture/workload_jobs.py``) name their communication in their
NVTX / ``record_function`` ranges; captures from elsewhere are read from their GPU kernels only.

Definitions (per rank, over the ranges that start inside the rank's steps; "per step" = ÷ steps):

- **kind**: ``pipeline`` when the rank has ``microbatch N forward|backward`` ranges or point-to-point
  transfer ranges, or (any capture) NCCL point-to-point kernels (SendRecv/Send/Recv) inside its
  steps; ``broadcast-reduce`` when it has the harness's ``broadcast …``/``reduce …`` ranges, or NCCL
  Broadcast and Reduce kernels and no all-reduce; else null.
- **peers** (transfers): per peer, ``sent_bytes`` / ``received_bytes``: Σ the sizes the transfer
  ranges name (``send to P (B B)`` / ``recv from P (B B)``, several per ``batch_isend_irecv: …``
  range), ``sends`` / ``recvs`` the transfers, and ``profiler_sent_bytes`` /
  ``profiler_received_bytes``: Σ the payload PyTorch itself recorded for the c10d ``<backend>:send``
  / ``<backend>:recv`` annotations inside those ranges (Input Dims × element size, a torch.profiler
  trace with shapes) where the range names one peer for that direction; null when no annotation is
  there (an nsys capture of a CPU job; a trace without shapes).
- **payload** (broadcast/reduce): per collective, ``bytes_per_step`` Σ the sizes the harness's
  ranges name, ``profiler_bytes_per_step`` Σ the c10d annotations' payloads (``gloo:broadcast``,
  ``nccl:reduce``, …) inside the steps, and ``gpu_bytes_per_step`` the NCCL kernels' message bytes
  (metrics.collectives, per type) — each null when its source is absent.
- **host_blocked_ns_per_step** (broadcast/reduce): per collective, Σ the durations of the ranges in
  which the host thread waited for it: a blocking call's whole range, or, for a collective issued with
  ``async_op=True`` (``issue …``), only its ``wait …`` range. It is the host's exposed communication
  time, the measure a CPU (gloo) job has. **gpu_exposed_ns_per_step** is the GPU's: NCCL kernel
  time of the type that no compute kernel covers (``exposed_ns`` of metrics.collectives), null
  without a GPU trace. **in_flight_ns_per_step**: per collective, Σ over those issued with
  ``async_op=True`` of the time from the end of the issue range to the start of its wait range
  (same step, same name), in which the host computed: the room async gives the communication to
  hide in (0 for blocking calls).
- **bubble** (pipeline): per step, the share of the step's GPU span (first to last GPU op attributed
  to it, the ``gpu_span_ns`` of the step table) in which no compute kernel (a kernel that is not
  NCCL) runs on any of the rank's devices: (span − |⋃ compute kernels ∩ span|) ÷ span. The rank's
  bubble is Σ idle ÷ Σ span over its steps. Null without GPU kernels (a CPU job has no kernels to
  tell compute from waiting) or without steps.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceguard.metrics.collectives import P2P_TYPES
from traceguard.metrics.intervals import union_ns
from traceguard.metrics.steps import containing_ids

PIPELINE = "pipeline"
BROADCAST_REDUCE = "broadcast-reduce"

TRANSFER = re.compile(r"(send to|recv from) (\d+) \((\d+) B\)")
COLLECTIVE_RANGE = re.compile(r"^(issue )?(broadcast|reduce) (.+) \((\d+) B\)$")
WAIT_RANGE = re.compile(r"^wait (broadcast|reduce) (.+)$")
MICROBATCH = r"^microbatch \d+ (forward|backward)$"
C10D_P2P = r"^(?:nccl|gloo|mpi|ucc):(send|recv)\b"
C10D_ROOTED = r"^(?:nccl|gloo|mpi|ucc):(broadcast|reduce)\b"
HARNESS_NAMES = r"^(microbatch \d+ |send to |recv from |batch_isend_irecv: |(issue )?(broadcast|reduce) |wait )"

NO_GPU = "no GPU kernels in the capture (a CPU/gloo job): compute cannot be told from waiting"
NO_STEPS = "the rank has no steps"


def empty() -> dict[str, Any]:
    return {
        "kind": None,
        "steps": 0,
        "peers": [],
        "payload": [],
        "asynchronous": None,
        "host_blocked_ns_per_step": {},
        "in_flight_ns_per_step": {},
        "gpu_exposed_ns_per_step": {},
        "bubble": None,
        "bubble_per_step": [],
        "null_reasons": {},
    }


def _in_steps(ranges: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Ranges that start inside one of the steps (same process), with ``step_id``."""
    if ranges.height == 0 or steps.height == 0:
        return ranges.head(0).with_columns(pl.lit(None, dtype=pl.Int64).alias("step_id"))
    intervals = steps.select("pid", "start", "end", pl.col("range_id").cast(pl.Int64).alias("step_id"))
    step_id = containing_ids(ranges, "start", intervals, "step_id", ["pid"])
    return ranges.with_columns(step_id).filter(pl.col("step_id").is_not_null())


def _transfers(named: pl.DataFrame, annotations: pl.DataFrame, steps: int) -> list[dict[str, Any]]:
    peers: dict[int, dict[str, Any]] = defaultdict(
        lambda: {
            "sent_bytes": 0,
            "received_bytes": 0,
            "sends": 0,
            "recvs": 0,
            "profiler_sent_bytes": None,
            "profiler_received_bytes": None,
        }
    )
    one_peer: dict[tuple[int, str], int] = {}  # (transfer range id, direction) → its single peer
    for range_id, name in named.select("range_id", "name").iter_rows():
        found: dict[str, set[int]] = defaultdict(set)
        for verb, peer, size in TRANSFER.findall(name):
            direction = "sent" if verb == "send to" else "received"
            row = peers[int(peer)]
            row[f"{direction}_bytes"] += int(size)
            row["sends" if direction == "sent" else "recvs"] += 1
            found[direction].add(int(peer))
        for direction, where in found.items():
            if len(where) == 1:
                one_peer[(range_id, direction)] = next(iter(where))
    if annotations.height:
        for range_id, op, payload in annotations.select("transfer_id", "op", "payload_bytes").iter_rows():
            direction = "sent" if op == "send" else "received"
            peer = one_peer.get((range_id, direction))
            if peer is None or payload is None:
                continue
            key = f"profiler_{direction}_bytes"
            peers[peer][key] = (peers[peer][key] or 0) + int(payload)
    rows = []
    for peer, row in sorted(peers.items()):
        per_step = {
            f"{k}_per_step": (row[k] / steps if row[k] is not None and steps else None)
            for k in ("sent_bytes", "received_bytes", "profiler_sent_bytes", "profiler_received_bytes")
        }
        rows.append({"peer": peer, **row, **per_step})
    return rows


@dataclass
class BubbleInputs:
    """What the pipeline bubble reads from the attributed ops (:func:`bubble_inputs`): per
    ``step_id``, the GPU span (``s0``, ``s1``: first start, last end of its ops) and ``covered``
    (the union ns of its compute kernels); ``has_kernels``: any kernel lies in a step."""

    spans: pl.DataFrame
    covered: pl.DataFrame
    has_kernels: bool


def bubble_inputs(ops: pl.DataFrame) -> BubbleInputs:
    # Only the columns read here: a filtered copy of every column of 10 M ops would be ~1 GB.
    columns = ["step_id", "kind", "is_nccl", "start", "end"]
    attributed = ops.lazy().filter(pl.col("step_id").is_not_null()).select(columns).collect()
    has_kernels = attributed.filter(pl.col("kind") == "kernel").height > 0
    spans = attributed.group_by("step_id").agg(pl.col("start").min().alias("s0"), pl.col("end").max().alias("s1"))
    compute = attributed.filter((pl.col("kind") == "kernel") & ~pl.col("is_nccl").fill_null(False))
    # Every compute kernel of a step lies inside the step's span (the span is its ops' extent),
    # so the union needs no clipping to it: the NumPy union, not Polars' segments (+0.5 GB at
    # 5 M kernels a rank).
    # (A kernel ending before it starts covers nothing, as the clipped segments gave it.)
    kernels = compute.select("step_id", "start", pl.max_horizontal("start", "end").alias("end"))
    covered = union_ns(kernels, ["step_id"]).collect().rename({"union_ns": "covered"})
    return BubbleInputs(spans, covered, has_kernels)


def _bubble(inputs: BubbleInputs, steps: pl.DataFrame) -> tuple[float | None, list[dict[str, Any]], str | None]:
    if not inputs.has_kernels:
        return None, [], NO_GPU
    table = (
        inputs.spans.join(inputs.covered, on="step_id", how="left")
        .join(steps.select(pl.col("range_id").cast(pl.Int64).alias("step_id"), "name", "start"), on="step_id")
        .sort("start")
    )
    per_step, idle_total, span_total = [], 0, 0
    for name, s0, s1, cov in table.select("name", "s0", "s1", "covered").iter_rows():
        span = int(s1 - s0)
        idle = span - int(cov or 0)
        idle_total, span_total = idle_total + idle, span_total + span
        per_step.append(
            {
                "step": name,
                "gpu_start_ns": int(s0),
                "span_ns": span,
                "idle_ns": idle,
                "bubble": idle / span if span else None,
            }
        )
    if not span_total:
        return None, per_step, "the steps have no GPU span"
    return idle_total / span_total, per_step, None


def may_be_pipeline(ranges: pl.DataFrame, collectives: pl.Series) -> bool:
    """Whether :func:`rank_workload` could call the rank a pipeline (and read its bubble): a
    microbatch or transfer range anywhere, or a point-to-point NCCL kernel (``collectives``: the
    NCCL kernels' types). A superset of its test, which looks only inside the steps and the window."""
    names = ranges["name"]
    if bool(names.str.contains(MICROBATCH).any()) or bool(names.str.contains(TRANSFER.pattern).any()):
        return True
    return bool(collectives.cast(pl.String).is_in(list(P2P_TYPES)).any())


def rank_workload(
    ranges: pl.DataFrame, steps: pl.DataFrame, ops: pl.DataFrame | BubbleInputs, by_type: dict[str, Any]
) -> dict[str, Any]:
    """The rank's workload entry (module docstring). ``ops``: attributed GPU ops with ``is_nccl``
    and ``collective``; ``by_type``: metrics.collectives.by_type's result for the rank."""
    out = empty()
    n = steps.height
    out["steps"] = n
    if n == 0:
        out["null_reasons"]["bubble"] = NO_STEPS
        return out
    relevant = ranges.filter(
        pl.col("name").str.contains(HARNESS_NAMES)
        | pl.col("name").str.contains(C10D_P2P)
        | pl.col("name").str.contains(C10D_ROOTED)
    )
    inside = _in_steps(relevant, steps)
    totals = {row["collective"]: row for row in (by_type.get("totals") or [])}
    p2p_kernels = sum(int(totals[t]["count"]) for t in P2P_TYPES if t in totals)
    names = inside["name"]
    microbatches = int(names.str.contains(MICROBATCH).sum())
    transfer = inside.filter(pl.col("name").str.contains(TRANSFER.pattern))
    rooted = inside.filter(pl.col("name").str.contains(COLLECTIVE_RANGE.pattern))
    if microbatches or transfer.height or p2p_kernels:
        out["kind"] = PIPELINE
    elif rooted.height or ({"Broadcast", "Reduce"} <= set(totals) and "AllReduce" not in totals):
        out["kind"] = BROADCAST_REDUCE

    if transfer.height:
        annotations = inside.filter(pl.col("name").str.contains(C10D_P2P)).with_columns(
            pl.col("name").str.extract(C10D_P2P, 1).alias("op")
        )
        if annotations.height:
            # The transfer range around each annotation (same thread, latest start).
            ids = containing_ids(
                annotations,
                "start",
                transfer.select("pid", "tid", "start", "end", "range_id"),
                "range_id",
                ["pid", "tid"],
            )
            annotations = annotations.with_columns(ids.alias("transfer_id")).filter(pl.col("transfer_id").is_not_null())
        out["peers"] = _transfers(transfer, annotations, n)
        if all(p["profiler_sent_bytes"] is None and p["profiler_received_bytes"] is None for p in out["peers"]):
            out["null_reasons"]["profiler_bytes"] = (
                "no c10d send/recv annotation with sizes inside the transfer ranges (an nsys capture, or a "
                "torch.profiler trace without record_shapes)"
            )

    if out["kind"] == BROADCAST_REDUCE:
        out.update(_rooted(inside, rooted, totals, n))

    if out["kind"] == PIPELINE:
        bubble, per_step, reason = _bubble(ops if isinstance(ops, BubbleInputs) else bubble_inputs(ops), steps)
        out["bubble"], out["bubble_per_step"] = bubble, per_step
        if reason:
            out["null_reasons"]["bubble"] = reason
    else:
        out["null_reasons"]["bubble"] = "not a pipeline (no microbatch or point-to-point ranges, no P2P kernels)"
    return out


def _rooted(inside: pl.DataFrame, rooted: pl.DataFrame, totals: dict[str, Any], n: int) -> dict[str, Any]:
    named: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    blocked: dict[str, int] = defaultdict(int)
    asynchronous = False
    issued: dict[tuple[int, str, str], int] = {}  # (step, op, what) → end of its async issue
    for name, start, end, step in rooted.select("name", "start", "end", "step_id").iter_rows():
        m = COLLECTIVE_RANGE.match(name)
        assert m is not None
        issued_async, op, what, size = m.group(1), m.group(2), m.group(3), int(m.group(4))
        named[op] += size
        calls[op] += 1
        if issued_async:
            asynchronous = True
            issued[(step, op, what)] = int(end)
        else:
            blocked[op] += int(end - start)
    in_flight: dict[str, int] = defaultdict(int)
    waits = inside.filter(pl.col("name").str.contains(WAIT_RANGE.pattern)).select("name", "start", "end", "step_id")
    for name, start, end, step in waits.iter_rows():
        m = WAIT_RANGE.match(name)
        assert m is not None
        blocked[m.group(1)] += int(end - start)
        if (issued_end := issued.get((step, m.group(1), m.group(2)))) is not None:
            in_flight[m.group(1)] += max(0, int(start) - issued_end)
    profiled: dict[str, int] = defaultdict(int)
    sized: dict[str, bool] = defaultdict(lambda: True)
    annotated = inside.filter(pl.col("name").str.contains(C10D_ROOTED))
    for name, payload in annotated.select("name", "payload_bytes").iter_rows():
        op = re.match(C10D_ROOTED, name).group(1)  # type: ignore[union-attr]
        if payload is None:
            sized[op] = False
        else:
            profiled[op] += int(payload)
    payload = []
    gpu_exposed: dict[str, float | None] = {}
    for op, kernel_type in (("broadcast", "Broadcast"), ("reduce", "Reduce")):
        row = totals.get(kernel_type)
        gpu_bytes = row.get("bytes") if row else None
        if row is not None:
            gpu_exposed[op] = row["exposed_ns"] / n if row.get("exposed_ns") is not None else None
        payload.append(
            {
                "collective": op,
                "calls_per_step": calls[op] / n if calls[op] else None,
                "bytes_per_step": named[op] / n if named[op] else None,
                "profiler_bytes_per_step": profiled[op] / n if profiled[op] and sized[op] else None,
                "gpu_bytes_per_step": gpu_bytes / n if gpu_bytes is not None else None,
            }
        )
    return {
        "payload": payload,
        "asynchronous": asynchronous if rooted.height else None,
        "host_blocked_ns_per_step": {op: ns / n for op, ns in sorted(blocked.items())},
        "in_flight_ns_per_step": {op: in_flight[op] / n for op in sorted(blocked)},
        "gpu_exposed_ns_per_step": gpu_exposed,
    }


def run_workload(per_rank: Sequence[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """The run's view: the kind most ranks show, the rank × peer transfer matrix, the bubble over
    all ranks (Σ idle ÷ Σ span), and per collective the payload and host-blocked time, mean over ranks."""
    kinds = [w["kind"] for _, w in per_rank if w.get("kind")]
    kind = max(set(kinds), key=kinds.count) if kinds else None
    matrix = [{"rank": rank, **p} for rank, w in per_rank for p in w.get("peers", [])]
    idle = sum(s["idle_ns"] for _, w in per_rank for s in w.get("bubble_per_step", []))
    span = sum(s["span_ns"] for _, w in per_rank for s in w.get("bubble_per_step", []))
    reasons = [f"rank {rank}: {w['null_reasons']['bubble']}" for rank, w in per_rank if "bubble" in w["null_reasons"]]
    payload: dict[str, list[float]] = defaultdict(list)
    blocked: dict[str, list[float]] = defaultdict(list)
    in_flight: dict[str, list[float]] = defaultdict(list)
    for _, w in per_rank:
        for op, ns in w.get("in_flight_ns_per_step", {}).items():
            in_flight[op].append(ns)
        for row in w.get("payload", []):
            if row["bytes_per_step"] is not None:
                payload[row["collective"]].append(row["bytes_per_step"])
        for op, ns in w.get("host_blocked_ns_per_step", {}).items():
            blocked[op].append(ns)
    asynchronous = {w["asynchronous"] for _, w in per_rank if w.get("asynchronous") is not None}
    return {
        "kind": kind,
        "peer_matrix": matrix,
        "bubble": idle / span if span else None,
        "bubble_by_rank": {str(rank): w["bubble"] for rank, w in per_rank},
        "payload_bytes_per_step": {op: sum(v) / len(v) for op, v in sorted(payload.items())},
        "host_blocked_ns_per_step": {op: sum(v) / len(v) for op, v in sorted(blocked.items())},
        "in_flight_ns_per_step": {op: sum(v) / len(v) for op, v in sorted(in_flight.items())},
        "asynchronous": asynchronous.pop() if len(asynchronous) == 1 else None,
        "null_reasons": {"bubble": reasons[0]} if not span and reasons else {},
    }
