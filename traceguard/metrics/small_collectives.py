"""Communication split into many small collectives (the zero-copy checklist's third failure).

Each collective launch pays NCCL's (or gloo's) fixed latency, microseconds that do not shrink
with the message; below about a megabyte the link never reaches its bandwidth. A hand-written
loop that all-reduces every parameter on its own, DDP with a tiny ``bucket_cap_mb``, FSDP wrapped
too finely or a metric synced every step all look alike: many collective calls, most of them
small. Definitions, per rank (the run adds the counts and times up and recomputes the shares):

- **collective calls**: the rank's NCCL collective kernels inside its steps (GPU captures); when
  the capture has no NCCL kernel at all, the c10d calls PyTorch's profiler annotates inside the
  steps (``gloo:all_reduce``, ``nccl:broadcast`` ... ranges: CPU jobs on gloo).
- **payload**: the call's message size in bytes — the kernel's ``msg_bytes`` (Kineto collective
  args, or NCCL's NVTX payload in nsys exports made with ``--include-blobs=true``), or the
  annotation's input size (torch.profiler with ``record_shapes=True``). Calls without one are
  left out of every number below; ``collective_calls_sized`` counts those that have one.
- **small**: payload below the bound (the profile's ``small_bytes``, default 1 MiB).
- ``small_collective_calls``; ``small_collective_share`` = small calls ÷ sized calls;
  ``small_collective_time_share`` = Σ duration of small calls ÷ Σ duration of sized calls
  (kernel time on the GPU; the annotation's wall time for CPU calls, which block);
  ``small_collectives_per_step`` = small calls ÷ the rank's steps.
- **sizes**: per collective type, the number of sized calls in each payload band of
  :data:`SIZE_BANDS` (a histogram on a ×16 scale).
- **offenders**: small calls grouped by (collective, the NVTX range or API call that issued them)
  with their count and smallest / largest payload.
"""

from __future__ import annotations

from typing import Any

import polars as pl

#: The default bound between small and large messages (the checklist's "< 1 MB").
DEFAULT_SMALL_BYTES = 1 << 20
#: Payload bands of the size histogram: (label, lower bound inclusive, upper bound exclusive).
SIZE_BANDS: tuple[tuple[str, int, int | None], ...] = (
    ("< 4 KiB", 0, 4 << 10),
    ("4–64 KiB", 4 << 10, 64 << 10),
    ("64 KiB–1 MiB", 64 << 10, 1 << 20),
    ("1–16 MiB", 1 << 20, 16 << 20),
    ("16–256 MiB", 16 << 20, 256 << 20),
    ("≥ 256 MiB", 256 << 20, None),
)
#: The collective of an NCCL kernel whose name says none.
OTHER = "Other"
#: c10d annotations PyTorch's profiler records around a collective call: ``<backend>:<op>``.
C10D_ANNOTATION = r"^(?:nccl|gloo|mpi|ucc|xccl):([a-z_]+)"
#: c10d op → collective type (the names NCCL's kernels use).
C10D_TYPES: dict[str, str] = {
    "all_reduce": "AllReduce",
    "allreduce": "AllReduce",
    "allreduce_coalesced": "AllReduce",
    "all_reduce_coalesced": "AllReduce",
    "all_gather": "AllGather",
    "allgather": "AllGather",
    "_allgather_base": "AllGather",
    "all_gather_into_tensor": "AllGather",
    "all_gather_into_tensor_coalesced": "AllGather",
    "reduce_scatter": "ReduceScatter",
    "_reduce_scatter_base": "ReduceScatter",
    "reduce_scatter_tensor": "ReduceScatter",
    "reduce_scatter_tensor_coalesced": "ReduceScatter",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "all_to_all": "AllToAll",
    "alltoall": "AllToAll",
    "alltoall_base": "AllToAll",
    "send": "Send",
    "recv": "Recv",
}
CALL_SCHEMA: dict[str, pl.DataType] = {
    "collective": pl.String(),
    "duration_ns": pl.Int64(),
    "payload_bytes": pl.Int64(),
    "step_id": pl.Int64(),
    "issuer": pl.String(),
}
METRICS = (
    "collective_calls_sized",
    "small_collective_calls",
    "small_collective_ns",
    "sized_collective_ns",
    "small_collective_share",
    "small_collective_time_share",
    "small_collectives_per_step",
)
#: The family's per-rank metrics as reports and the CUDA-graph caveat list them: :data:`METRICS`
#: with the sized calls per step (computed beside them) after the sized calls.
RANK_METRICS = (METRICS[0], "collective_calls_per_step", *METRICS[1:])


def band(payload: int) -> str:
    """The :data:`SIZE_BANDS` label of a payload."""
    for label, low, high in SIZE_BANDS:
        if payload >= low and (high is None or payload < high):
            return label
    raise ValueError(payload)


def band_expr(payload: pl.Expr) -> pl.Expr:
    """:func:`band` as an expression."""
    expr = pl.lit(SIZE_BANDS[-1][0])
    for label, _, high in reversed(SIZE_BANDS[:-1]):
        expr = pl.when(payload < high).then(pl.lit(label)).otherwise(expr)
    return expr


def annotation_calls(ranges: pl.DataFrame) -> pl.DataFrame:
    """c10d annotation ranges (``gloo:all_reduce`` ...) with their collective type, or empty."""
    op = pl.col("name").str.extract(C10D_ANNOTATION, 1)
    found = ranges.filter(op.is_not_null()).with_columns(
        op.replace_strict(C10D_TYPES, default=None, return_dtype=pl.String).alias("collective")
    )
    return found.filter(pl.col("collective").is_not_null())


def small_collectives(
    calls: pl.DataFrame, step_count: int, small_bytes: int = DEFAULT_SMALL_BYTES
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The metrics (module docstring), their null reasons, and the details (sizes histogram,
    offenders) of one rank. ``calls``: :data:`CALL_SCHEMA` rows of the collective calls inside the
    rank's steps (``source`` in the details says what they were)."""
    m: dict[str, Any] = dict.fromkeys(METRICS)
    null: dict[str, str] = {}
    details: dict[str, Any] = {"small_bytes": small_bytes, "sizes": [], "offenders": []}
    sized = calls.filter(pl.col("payload_bytes").is_not_null())
    m["collective_calls_sized"] = sized.height
    if calls.height == 0:
        reason = "no collective calls inside the steps" if step_count else "the rank has no steps"
        for key in METRICS:
            null[key] = reason
        m["collective_calls_sized"] = 0 if step_count else None
        return m, null, details
    if sized.height == 0:
        reason = (
            "the capture does not record collective message sizes (nsys: export with "
            "`nsys export --type sqlite --include-blobs=true`; torch.profiler: collective args are recorded "
            "for NCCL, and for gloo with `record_shapes=True`)"
        )
        for key in METRICS[1:]:
            null[key] = reason
        return m, null, details
    small = pl.col("payload_bytes") < small_bytes
    totals = sized.select(
        small.sum().alias("small"),
        pl.col("duration_ns").filter(small).sum().alias("small_ns"),
        pl.col("duration_ns").sum().alias("sized_ns"),
    ).row(0, named=True)
    m["small_collective_calls"] = int(totals["small"])
    m["small_collective_ns"] = int(totals["small_ns"] or 0)
    m["sized_collective_ns"] = int(totals["sized_ns"] or 0)
    m["small_collective_share"] = m["small_collective_calls"] / sized.height
    if m["sized_collective_ns"]:
        m["small_collective_time_share"] = m["small_collective_ns"] / m["sized_collective_ns"]
    else:
        null["small_collective_time_share"] = "the sized collective calls took no measurable time"
    if step_count:
        m["small_collectives_per_step"] = m["small_collective_calls"] / step_count
    else:
        null["small_collectives_per_step"] = "the rank has no steps"
    banded = sized.with_columns(band_expr(pl.col("payload_bytes")).alias("band"))
    order = {label: i for i, (label, _, _) in enumerate(SIZE_BANDS)}
    sizes = banded.group_by(["collective", "band"]).agg(pl.len().alias("calls"))
    rows = [{**r, "calls": int(r["calls"])} for r in sizes.iter_rows(named=True)]
    details["sizes"] = sorted(rows, key=lambda r: (r["collective"], order[r["band"]]))
    offenders = (
        sized.filter(small)
        .group_by(["collective", "issuer"])
        .agg(
            pl.len().alias("calls"),
            pl.col("payload_bytes").min().alias("min_bytes"),
            pl.col("payload_bytes").max().alias("max_bytes"),
            pl.col("duration_ns").sum().alias("time_ns"),
        )
        .sort(["calls", "time_ns", "collective", "issuer"], descending=[True, True, False, False], nulls_last=True)
        .head(5)
    )
    details["offenders"] = offenders.to_dicts()
    return m, null, details


def run_totals(per_rank: list[dict[str, Any]], step_count: int | None) -> dict[str, Any]:
    """Run values: counts and times added over ranks, shares recomputed from the sums."""
    out: dict[str, Any] = dict.fromkeys(METRICS)
    known = [r for r in per_rank if r.get("collective_calls_sized")]
    if not known:
        return out
    for key in ("collective_calls_sized", "small_collective_calls", "small_collective_ns", "sized_collective_ns"):
        values = [r[key] for r in known if r.get(key) is not None]
        out[key] = sum(values) if values else None
    if out["small_collective_calls"] is not None and out["collective_calls_sized"]:
        out["small_collective_share"] = out["small_collective_calls"] / out["collective_calls_sized"]
    if out["small_collective_ns"] is not None and out["sized_collective_ns"]:
        out["small_collective_time_share"] = out["small_collective_ns"] / out["sized_collective_ns"]
    if out["small_collective_calls"] is not None and step_count:
        out["small_collectives_per_step"] = out["small_collective_calls"] / step_count
    return out
