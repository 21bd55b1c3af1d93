"""One rank's collective instances: the compact arrays the cross-rank reduce matches (map side).

The reduce (traceguard.metrics.waits) puts the ranks on one clock, matches each collective call
across its member ranks and splits every kernel into waiting for the last rank and transfer. It
needs, per collective call of a rank, only the columns of :data:`INSTANCE_SCHEMA` — never the
rank's events:

- ``kind``: the collective (``AllReduce``, ``SendRecv``...; ``Other`` when the name says none);
- ``peer``: the other rank of a point-to-point call when the capture names it;
- ``step``: the index of the step the call belongs to (its launching CPU call's step), or null;
- ``seq``: the call's order among the rank's calls of the same kind (and peer) and step;
- ``start``/``end``: the kernel's start (the rank's *arrival*) and end, ns on the rank's own clock;
- ``exposed_ns``: the kernel's time with no compute kernel of its device beside it;
- ``covered_until``: the end of the last compute that overlaps the kernel (``start`` if none):
  compute never overlaps the kernel after it, so the exposed time after any later instant is all
  of the rest (what lets the reduce split the exposed time at the last arrival exactly);
- ``phase``: the step phase the call was launched in (``forward``, ``backward``...), or null;
- ``bytes``: the message size when the capture records it.

On a CPU capture (gloo, no GPU kernels) the instances are the c10d calls (``gloo:all_reduce``):
their start is the arrival, their end the call's return, which for an asynchronous backend is not
the collective's completion, so those instances carry ``cpu`` = true and the reduce reports the
arrival lateness only. 9 columns, about 60 bytes an instance as they travel (Arrow, with
validity bitmaps): 10 k collectives a rank are 0.6 MB.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from traceguard.metrics import small_collectives as small
from traceguard.metrics.steps import calls_in_steps

INSTANCE_SCHEMA: dict[str, pl.DataType] = {
    "kind": pl.String(),
    "peer": pl.Int32(),
    "step": pl.Int64(),
    "seq": pl.Int32(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "exposed_ns": pl.Int64(),
    "covered_until": pl.Int64(),
    "phase": pl.String(),
    "bytes": pl.Int64(),
}
#: Collectives a capture names with their peer: matched pair by pair.
POINT_TO_POINT = frozenset({"SendRecv", "Send", "Recv"})


def empty() -> pl.DataFrame:
    return pl.DataFrame(schema=INSTANCE_SCHEMA)


def collective_instances(
    nccl_ops: pl.DataFrame,
    steps: pl.DataFrame,
    phases: pl.DataFrame,
    compute: dict[int, tuple[np.ndarray, np.ndarray]],
) -> pl.DataFrame:
    """The instances of one rank's NCCL kernels in its analysis window (``nccl_ops``: ``collective``,
    ``start``, ``end``, ``device``, ``step_id``, ``phase_id``, ``msg_bytes``, ``peer``), ``compute``:
    the window's compute union per device (at least the segments that meet an NCCL kernel)."""
    timed = nccl_ops.filter(pl.col("start").is_not_null() & pl.col("end").is_not_null())
    if timed.height == 0:
        return empty()
    frame = timed.select(
        pl.col("collective").cast(pl.String).fill_null("Other").alias("kind"),
        (pl.col("peer") if "peer" in timed.columns else pl.lit(None)).cast(pl.Int32).alias("peer"),
        pl.col("step_id").cast(pl.Int64),
        pl.col("phase_id").cast(pl.Int64) if "phase_id" in timed.columns else pl.lit(None, dtype=pl.Int64),
        pl.col("device").fill_null(-1).cast(pl.Int64),
        "start",
        pl.max_horizontal("start", "end").alias("end"),
        pl.col("msg_bytes").cast(pl.Int64).alias("bytes"),
    )
    exposed = np.zeros(frame.height, dtype=np.int64)
    until = frame["start"].to_numpy().copy()
    device = frame["device"].to_numpy()
    start, end = frame["start"].to_numpy(), frame["end"].to_numpy()
    for dev in np.unique(device).tolist():
        rows = np.flatnonzero(device == dev)
        seg_start, seg_end = compute.get(int(dev), (np.empty(0, np.int64), np.empty(0, np.int64)))
        exposed[rows], until[rows] = _against_compute(start[rows], end[rows], seg_start, seg_end)
    frame = frame.with_columns(pl.Series("exposed_ns", exposed), pl.Series("covered_until", until))
    return _finish(frame, steps, phases)


def cpu_instances(ranges: pl.DataFrame, steps: pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """The instances of a CPU capture: its c10d collective calls (``gloo:all_reduce``...)."""
    calls = small.annotation_calls(ranges)
    if calls.height == 0:
        return empty()
    frame = calls.select(
        pl.col("collective").alias("kind"),
        pl.lit(None, dtype=pl.Int32).alias("peer"),
        "pid",
        "start",
        pl.max_horizontal("start", "end").alias("end"),
        pl.col("payload_bytes").cast(pl.Int64).alias("bytes"),
    ).sort("start")
    frame = calls_in_steps(frame, steps, phases)
    frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("exposed_ns"), pl.col("start").alias("covered_until"))
    return _finish(frame.drop("pid"), steps, phases)


def _finish(frame: pl.DataFrame, steps: pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """Step ids → step indices, phase ids → names, and each call's order within (kind, peer, step)."""
    if steps.height:
        index = steps["index"] if "index" in steps.columns else pl.int_range(steps.height, eager=True)
        step_index = pl.DataFrame({"step_id": steps["range_id"].cast(pl.Int64), "step": index.cast(pl.Int64)})
        frame = frame.join(step_index, on="step_id", how="left", maintain_order="left")
    else:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("step"))
    names = phases.select(pl.col("phase_id").cast(pl.Int64), pl.col("name").alias("phase"))
    frame = frame.join(names, on="phase_id", how="left", maintain_order="left")
    frame = frame.sort("start", maintain_order=True).with_columns(
        pl.int_range(pl.len()).over(["kind", "peer", "step"]).cast(pl.Int32).alias("seq")
    )
    return frame.select(list(INSTANCE_SCHEMA)).cast(INSTANCE_SCHEMA)  # type: ignore[arg-type]


def _against_compute(
    start: np.ndarray, end: np.ndarray, seg_start: np.ndarray, seg_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel [start, end): its time with no compute segment beside it, and the end of the last
    compute that overlaps it (its start when none). The segments are sorted and disjoint.

    Only the segments that overlap some kernel count for either, so those are taken first where
    they are few: a whole-file analysis hands every compute segment of the window (10 M at 10 M
    kernels), whose sums over all of them were fresh 80 MB arrays (0.04-0.4 s by the page faults)."""
    if seg_start.size == 0:
        return end - start, start.copy()
    first = np.searchsorted(seg_end, start, side="right")  # the first segment ending after the start
    past = np.searchsorted(seg_start, end, side="left")  # the first starting at or after the end
    counts = np.maximum(past - first, 0)
    total = int(counts.sum())
    if total <= seg_start.size // 4:
        # Each kernel's run of segments, numbered by a running count: one index per (kernel, segment).
        offsets = np.repeat(first - np.cumsum(counts) + counts, counts)
        near = np.unique(offsets + np.arange(total, dtype=np.int64))
        return _against_all(start, end, seg_start[near], seg_end[near])
    return _against_all(start, end, seg_start, seg_end)


def _against_all(
    start: np.ndarray, end: np.ndarray, seg_start: np.ndarray, seg_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_against_compute` over every segment given."""
    if seg_start.size == 0:
        return end - start, start.copy()
    lengths = np.cumsum(seg_end - seg_start)

    def covered_before(x: np.ndarray) -> np.ndarray:
        before = np.searchsorted(seg_start, x, side="right")
        out = np.zeros(x.size, dtype=np.int64)
        has = before > 0
        last = before[has] - 1
        full = np.where(last > 0, lengths[np.maximum(last - 1, 0)], 0)
        out[has] = full + np.maximum(np.minimum(seg_end[last], x[has]) - seg_start[last], 0)
        return out

    overlap = covered_before(end) - covered_before(start)
    last = np.searchsorted(seg_start, end, side="left") - 1  # the last segment starting before the end
    safe = np.maximum(last, 0)
    overlaps = (last >= 0) & (seg_end[safe] > start)
    until = np.where(overlaps, np.minimum(seg_end[safe], end), start)
    return (end - start) - overlap, until


def describe(instances: pl.DataFrame) -> dict[str, Any]:
    """How many instances a rank ships, by kind (for the report's inputs summary)."""
    if instances.height == 0:
        return {}
    return dict(instances.group_by("kind").len().sort("kind").iter_rows())
