"""GPU time of each step, broken down (DESIGN.md, "GPU time of a step, broken down").

A step's *period* runs from the previous step's GPU end to its own (the first step's from its own
start: the earlier of its range's start on the host and its first GPU op), so a host that stalls
before launching a step's first kernel shows up in that step. Per device, every nanosecond of the
period is exactly one of, in this order of precedence:

- ``compute_ns``: a compute kernel runs (any kernel but NCCL's, and CUDA graph executions);
- ``comm_ns``: an NCCL kernel runs and no compute kernel does (the exposed communication; the
  reduce over ranks splits it into waiting for the last rank and transfer, metrics.waits);
- ``copy_ns``: only a memcpy or memset runs;
- ``idle_host_ns``: nothing runs, and the op that ends the idle gap was launched after the GPU fell
  idle: the GPU waited for its host (an input pipeline, a sync point, Python overhead, a sleep);
- ``idle_other_ns``: nothing runs although the next op was already launched (it waited on an
  event or another stream), or the op has no launch record.

The five add up to ``period_ns`` × the rank's devices that ran ops (one, as a rule). The ops are fed
in start order, a slice at a time (:class:`StepBreakdown`), so the sliced analysis and the whole
frame give the same numbers; memory is O(steps), not O(ops).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

COMPUTE, NCCL, COPY = 0, 1, 2
#: The breakdown's fields in a step row, in the order above.
FIELDS = ("period_ns", "compute_ns", "comm_ns", "copy_ns", "idle_host_ns", "idle_other_ns")


def periods(steps: pl.DataFrame, spans: pl.DataFrame, *, gpu_timed: bool) -> tuple[np.ndarray, list[int]]:
    """Period boundaries (steps with a GPU span + 1 of them, non-decreasing) and the step indices
    they belong to, in step order. ``steps``: ``range_id``, ``index``, ``start``; ``spans``:
    ``step_id``, ``gpu_start``, ``gpu_end`` (metrics.steps.step_spans)."""
    if steps.height == 0 or spans.height == 0:
        return np.empty(0, np.int64), []
    index = steps["index"] if "index" in steps.columns else pl.int_range(steps.height, eager=True)
    timed = (
        steps.select(pl.col("range_id").cast(pl.Int64), index.cast(pl.Int64).alias("index"), "start")
        .join(spans.select(pl.col("step_id").cast(pl.Int64).alias("range_id"), "gpu_start", "gpu_end"), on="range_id")
        .filter(pl.col("gpu_start").is_not_null() & pl.col("gpu_end").is_not_null())
        .sort("index")
    )
    if timed.height == 0:
        return np.empty(0, np.int64), []
    first = timed.row(0, named=True)
    begin = first["gpu_start"] if gpu_timed else min(first["start"], first["gpu_start"])
    bounds = np.concatenate([[begin], timed["gpu_end"].to_numpy()]).astype(np.int64)
    return np.maximum.accumulate(bounds), timed["index"].to_list()


def _covered_at(bounds: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For sorted disjoint segments: the covered length before each bound."""
    out = np.zeros(bounds.size, dtype=np.int64)
    if starts.size == 0:
        return out
    before = np.searchsorted(starts, bounds, side="right")
    has = before > 0
    last = before[has] - 1
    lengths = np.cumsum(ends - starts)
    full = np.where(last > 0, lengths[np.maximum(last - 1, 0)], 0)
    out[has] = full + np.maximum(np.minimum(ends[last], bounds[has]) - starts[last], 0)
    return out


@dataclass
class _Union:
    """A running union of intervals fed in start order: emits the segments it closes."""

    start: int | None = None
    end: int | None = None
    launch: int = -1  # the launch of the op that opened the current segment (-1: none)

    def feed(
        self, start: np.ndarray, end: np.ndarray, launch: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Every segment of the union so far that this slice touches, the carried one first and
        the last still open (it is kept); with the launch of the op that opened each."""
        if self.start is not None:
            start = np.concatenate([[self.start], start])
            end = np.concatenate([[self.end], end])
            if launch is not None:
                launch = np.concatenate([[self.launch], launch])
        if start.size == 0:
            return start, end, launch
        reach = np.maximum.accumulate(end)
        opens = np.empty(start.size, dtype=bool)
        opens[0] = True
        np.greater(start[1:], reach[:-1], out=opens[1:])
        first = np.flatnonzero(opens)
        seg_start = start[first]
        seg_end = reach[np.append(first[1:] - 1, start.size - 1)]
        seg_launch = launch[first] if launch is not None else None
        self.start, self.end = int(seg_start[-1]), int(seg_end[-1])
        if seg_launch is not None:
            self.launch = int(seg_launch[-1])
        return seg_start, seg_end, seg_launch

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        if self.start is None:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.array([self.start], np.int64), np.array([self.end], np.int64)


@dataclass
class _Device:
    """One device's running unions and the covered time before each period bound."""

    bounds: np.ndarray
    compute: _Union = field(default_factory=_Union)
    with_nccl: _Union = field(default_factory=_Union)
    busy: _Union = field(default_factory=_Union)
    sums: np.ndarray = field(init=False)  # rows: compute, compute+nccl, busy, idle host, idle other

    def __post_init__(self) -> None:
        self.sums = np.zeros((5, self.bounds.size), dtype=np.int64)
        # The GPU is taken as busy up to the first period's start: idle is counted from there.
        self.busy.start = self.busy.end = int(self.bounds[0])

    def feed(self, start: np.ndarray, end: np.ndarray, launch: np.ndarray, category: np.ndarray) -> None:
        is_compute = category == COMPUTE
        seg_start, seg_end, _ = self.compute.feed(start[is_compute], end[is_compute])
        self._add(0, seg_start[:-1], seg_end[:-1])
        keep = category <= NCCL
        seg_start, seg_end, _ = self.with_nccl.feed(start[keep], end[keep])
        self._add(1, seg_start[:-1], seg_end[:-1])
        seg_start, seg_end, seg_launch = self.busy.feed(start, end, launch)
        self._add(2, seg_start[:-1], seg_end[:-1])
        if seg_launch is not None and seg_start.size > 1:
            # The busy union always carries a segment (the first period's start at least), so
            # each segment after the first opens a gap: between the one before and itself.
            self._gaps(seg_end[:-1], seg_start[1:], seg_launch[1:])

    def _gaps(self, gap_start: np.ndarray, gap_end: np.ndarray, launch: np.ndarray) -> None:
        real = gap_end > gap_start
        gap_start, gap_end, launch = gap_start[real], gap_end[real], launch[real]
        host = launch >= gap_start
        self._add(3, gap_start[host], gap_end[host])
        self._add(4, gap_start[~host], gap_end[~host])

    def _add(self, row: int, start: np.ndarray, end: np.ndarray) -> None:
        if start.size:
            self.sums[row] += _covered_at(self.bounds, start, end)

    def finish(self) -> np.ndarray:
        self._add(0, *self.compute.close())
        self._add(1, *self.with_nccl.close())
        self._add(2, *self.busy.close())
        # After the last op: idle to the last bound, waiting on nothing the capture shows.
        if self.busy.end is not None and self.busy.end < self.bounds[-1]:
            self._add(4, np.array([self.busy.end]), np.array([self.bounds[-1]]))
        return np.diff(self.sums, axis=1)


class StepBreakdown:
    """Feed a rank's timed GPU ops in start order (a slice at a time, per device), then
    :meth:`rows` gives each step's breakdown (module docstring)."""

    def __init__(self, bounds: np.ndarray, indices: list[int]) -> None:
        self.bounds = bounds
        self.indices = indices
        self.devices: dict[int, _Device] = {}

    def feed(
        self, device: np.ndarray, start: np.ndarray, end: np.ndarray, launch: np.ndarray, category: np.ndarray
    ) -> None:
        """One slice, sorted by start (``launch``: the launching call's start, -1 when unknown)."""
        if self.bounds.size < 2 or start.size == 0:
            return
        low, high = int(device.min()), int(device.max())
        for dev in (low,) if low == high else np.unique(device).tolist():
            rows = slice(None) if low == high else device == dev
            state = self.devices.get(dev)
            if state is None:
                state = self.devices[dev] = _Device(self.bounds)
            state.feed(start[rows], end[rows], launch[rows], category[rows])

    def rows(self) -> dict[int, dict[str, int]]:
        """Step index → the breakdown, summed over devices."""
        if self.bounds.size < 2:
            return {}
        total = np.zeros((5, self.bounds.size - 1), dtype=np.int64)
        for state in self.devices.values():
            total += state.finish()
        self.devices = {}
        compute, with_nccl, busy, host, other = total
        period = np.diff(self.bounds)
        return {
            index: {
                "period_ns": int(period[k]),
                "compute_ns": int(compute[k]),
                "comm_ns": int(with_nccl[k] - compute[k]),
                "copy_ns": int(busy[k] - with_nccl[k]),
                "idle_host_ns": int(host[k]),
                "idle_other_ns": int(other[k]),
            }
            for k, index in enumerate(self.indices)
        }


#: Rows fed at a time from a whole frame: the sorted columns are gathered a chunk at a time.
CHUNK_ROWS = 1 << 20


def whole_breakdown(ops: pl.DataFrame, bounds: np.ndarray, indices: list[int]) -> dict[int, dict[str, int]]:
    """:class:`StepBreakdown` of a whole frame of attributed ops (``is_nccl``, ``kind``, ``device``,
    ``start``, ``end``, ``launch_start``), fed in start order a chunk at a time."""
    account = StepBreakdown(bounds, indices)
    if bounds.size < 2 or ops.height == 0:
        return account.rows()
    device, start, end, launch, category = slice_arrays(ops, sort=False)
    order = None if bool(np.all(start[1:] >= start[:-1])) else np.argsort(start, kind="stable")
    for lo in range(0, start.size, CHUNK_ROWS):
        rows = slice(lo, lo + CHUNK_ROWS) if order is None else order[lo : lo + CHUNK_ROWS]
        account.feed(device[rows], start[rows], end[rows], launch[rows], category[rows])
    return account.rows()


def slice_arrays(
    ops: pl.DataFrame, *, sort: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(device, start, end, launch, category) of ``ops``' timed rows, sorted by start (stable)
    unless told not to: what :meth:`StepBreakdown.feed` takes. ``ops`` carries ``is_nccl`` and ``kind``."""
    kind = pl.col("kind").cast(pl.String)
    category = (
        pl.when(pl.col("is_nccl").fill_null(False))
        .then(NCCL)
        .when(kind.is_in(["memcpy", "memset"]))
        .then(COPY)
        .otherwise(COMPUTE)
        .cast(pl.Int8)
    )
    launch = pl.col("launch_start") if "launch_start" in ops.columns else pl.lit(None, dtype=pl.Int64)
    frame = ops.select(
        pl.col("device").fill_null(-1).cast(pl.Int64),
        "start",
        "end",
        launch.fill_null(-1).cast(pl.Int64).alias("launch"),
        category.alias("category"),
    ).filter(pl.col("start").is_not_null() & pl.col("end").is_not_null())
    start = frame["start"].to_numpy()
    order = None if not sort or frame["start"].is_sorted() else np.argsort(start, kind="stable")
    columns = [frame[c].to_numpy() for c in ("device", "start", "end", "launch", "category")]
    if order is not None:
        columns = [c[order] for c in columns]
    device, start, end, launch, cat = columns
    return device, start, np.maximum(end, start), launch, cat
