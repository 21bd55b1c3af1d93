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

from dataclasses import dataclass

import numpy as np
import polars as pl

from traceguard.metrics.intervals import running_max
from traceguard.metrics.table_rows import dicts_from_columns
from traceguard.model import OP_KINDS

try:  # the compiled loop (setup.py builds it when a C compiler is there); NumPy otherwise
    from traceguard.metrics import _breakdown as _native
except ImportError:  # pragma: no cover - exercised where no compiler is available
    _native = None

COMPUTE, NCCL, COPY = 0, 1, 2
#: ``kind``'s codes of memcpys and memsets in traceguard.model.OpKind.
_COPY_CODES = (OP_KINDS.index("memcpy"), OP_KINDS.index("memset"))
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
    return running_max(bounds), timed["index"].to_list()


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
    """A running union of intervals fed in start order. Each feed returns the segments it closed
    and the gaps before the segments it opened (with the launch of the op that opened each)."""

    start: int | None = None
    end: int | None = None

    def feed(
        self, start: np.ndarray, end: np.ndarray, launch: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """(closed starts, closed ends, gap starts, gap ends, gap launches) of this slice."""
        empty = np.empty(0, np.int64)
        if start.size == 0:
            return empty, empty, empty, empty, None if launch is None else empty
        reach = running_max(end)
        before = np.empty(start.size, dtype=np.int64)  # the union's reach before each op
        before[1:] = reach[:-1]
        if self.end is not None:
            np.maximum(reach, self.end, out=reach)
            np.maximum(before, self.end, out=before)
            before[0] = self.end
        else:
            before[0] = start[0] - 1  # the first op opens the first segment
        opened = np.flatnonzero(start > before)
        if opened.size == 0:  # everything extends the carried segment
            self.end = int(reach[-1])
            return empty, empty, empty, empty, None if launch is None else empty
        if self.start is None:  # the first op opened the first segment: no gap, nothing closed before it
            closed_start = start[opened[:-1]]
            opened = opened[1:]
        else:
            closed_start = np.concatenate([[self.start], start[opened[:-1]]])
        closed_end = gap_start = before[opened]
        gap_end = start[opened]
        self.start = int(start[opened[-1]]) if opened.size else int(start[0])
        self.end = int(reach[-1])
        return closed_start, closed_end, gap_start, gap_end, None if launch is None else launch[opened]

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        if self.start is None:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        return np.array([self.start], np.int64), np.array([self.end], np.int64)


class _Device:
    """One device's running unions and its per-period sums (rows: compute, compute+NCCL, busy,
    idle host, idle other). Fed by the C loop when it is built (:mod:`._breakdown`), else by NumPy."""

    def __init__(self, bounds: np.ndarray, native: bool) -> None:
        self.bounds = bounds
        self.native = native
        self.sums = np.zeros((5, bounds.size - 1), dtype=np.int64)
        # Per union: open?, start, end. The busy union is open from the first bound: idle time is
        # counted from there (an op before it only extends that segment).
        self.state = np.zeros(14, dtype=np.int64)  # then each row's period cursor (the C loop's)
        self.state[6:9] = (1, bounds[0], bounds[0])
        self.unions = [_Union(), _Union(), _Union(int(bounds[0]), int(bounds[0]))]

    def feed(self, start: np.ndarray, end: np.ndarray, launch: np.ndarray, category: np.ndarray) -> None:
        if self.native and _native is not None:
            self.feed_runs(start, end, launch, category, np.array([0, start.size], dtype=np.int64))
            return
        compute, with_nccl, busy = self.unions
        is_compute = category == COMPUTE
        closed_start, closed_end, *_ = compute.feed(start[is_compute], end[is_compute])
        self._add(0, closed_start, closed_end)
        keep = category <= NCCL
        closed_start, closed_end, *_ = with_nccl.feed(start[keep], end[keep])
        self._add(1, closed_start, closed_end)
        closed_start, closed_end, gap_start, gap_end, gap_launch = busy.feed(start, end, launch)
        self._add(2, closed_start, closed_end)
        if gap_launch is not None and gap_start.size:
            host = gap_launch >= gap_start
            self._add(3, gap_start[host], gap_end[host])
            self._add(4, gap_start[~host], gap_end[~host])

    def feed_runs(
        self, start: np.ndarray, end: np.ndarray, launch: np.ndarray, category: np.ndarray, runs: np.ndarray
    ) -> None:
        """Ops in sorted runs (``runs``: their bounds), merged by start in the C loop."""
        assert _native is not None
        _native.feed(
            np.ascontiguousarray(start, dtype=np.int64),
            np.ascontiguousarray(end, dtype=np.int64),
            np.ascontiguousarray(launch, dtype=np.int64),
            np.ascontiguousarray(category, dtype=np.int8),
            np.ascontiguousarray(runs, dtype=np.int64),
            self.bounds,
            self.sums,
            self.state,
        )

    def _add(self, row: int, start: np.ndarray, end: np.ndarray) -> None:
        if start.size:
            self.sums[row] += np.diff(_covered_at(self.bounds, start, end))

    def finish(self) -> np.ndarray:
        if self.native and _native is not None:
            carried = [
                (bool(self.state[3 * u]), int(self.state[3 * u + 1]), int(self.state[3 * u + 2])) for u in (0, 1, 2)
            ]
        else:
            carried = [(u.start is not None, u.start or 0, u.end or 0) for u in self.unions]
        for row, (is_open, start, end) in enumerate(carried):
            if is_open:
                self._add(row, np.array([start]), np.array([end]))
        busy_end = carried[2][2]
        # After the last op: idle to the last bound, waiting on nothing the capture shows.
        if busy_end < self.bounds[-1]:
            self._add(4, np.array([busy_end]), np.array([self.bounds[-1]]))
        return self.sums


class StepBreakdown:
    """Feed a rank's timed GPU ops in start order (a slice at a time, per device), then
    :meth:`rows` gives each step's breakdown (module docstring)."""

    def __init__(self, bounds: np.ndarray, indices: list[int], *, native: bool = True) -> None:
        self.bounds = bounds
        self.indices = indices
        self.native = native  # False: the NumPy loop even when the C one is built (tests compare them)
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
            self.device(dev).feed(start[rows], end[rows], launch[rows], category[rows])

    def device(self, dev: int) -> _Device:
        """The running state of one device (made on its first op)."""
        state = self.devices.get(dev)
        if state is None:
            state = self.devices[dev] = _Device(self.bounds, self.native)
        return state

    def rows(self) -> dict[int, dict[str, int]]:
        """Step index → the breakdown, summed over devices."""
        if self.bounds.size < 2:
            return {}
        total = np.zeros((5, self.bounds.size - 1), dtype=np.int64)
        for state in self.devices.values():
            total += state.finish()
        self.devices = {}
        compute, with_nccl, busy, host, other = total
        # Python ints by tolist(), not int() of a NumPy scalar six times a step, and the dicts
        # built from the columns (table_rows): 68.5 k steps, 0.10-0.16 -> 0.09 s.
        columns = (np.diff(self.bounds), compute, with_nccl - compute, busy - with_nccl, host, other)
        return dict(zip(self.indices, dicts_from_columns(FIELDS, [c.tolist() for c in columns]), strict=True))


#: Rows fed at a time: the start-ordered columns are gathered a chunk at a time.
CHUNK_ROWS = 1 << 18
#: Sorted runs the C loop merges (its MAX_RUNS); more are sorted first.
MAX_RUNS = 64


@dataclass
class OpArrays:
    """Ops as the breakdown reads them, in the frame's own order, with their start order."""

    device: np.ndarray | None  # None: every op ran on ``sole_device``
    sole_device: int
    start: np.ndarray
    end: np.ndarray
    launch: np.ndarray  # -1 where the op has no launch record
    category: np.ndarray
    #: Bounds of the sorted runs in the frame's order (one per table, as a capture's ops come).
    runs: np.ndarray

    def order(self) -> np.ndarray | None:
        """The start order (stable), or None when the ops are in start order already."""
        return None if self.runs.size == 2 else np.argsort(self.start, kind="stable")


def op_arrays(ops: pl.DataFrame) -> OpArrays:
    """:class:`OpArrays` of ``ops``' timed rows (``is_nccl``, ``kind``, ``device``, ``start``,
    ``end``, ``launch_start`` when joined). Columns without nulls are read in place."""
    if ops["start"].null_count() or ops["end"].null_count():
        ops = ops.filter(pl.col("start").is_not_null() & pl.col("end").is_not_null())
    # One select, run by Polars on all cores: the category and the launch, columns in place.
    kind = pl.col("kind").to_physical()
    launch = pl.col("launch_start") if "launch_start" in ops.columns else pl.lit(None, dtype=pl.Int64)
    derived = ops.select(
        pl.when(pl.col("is_nccl").fill_null(False))
        .then(pl.lit(NCCL, pl.Int8))
        .when(kind.is_in(list(_COPY_CODES)))
        .then(pl.lit(COPY, pl.Int8))
        .otherwise(pl.lit(COMPUTE, pl.Int8))
        .alias("category"),
        launch.fill_null(-1).cast(pl.Int64).alias("launch"),
    )
    device = ops["device"].fill_null(-1)
    low, high = device.min(), device.max()
    start = ops["start"].to_numpy()
    breaks = np.flatnonzero(start[1:] < start[:-1]) + 1
    return OpArrays(
        device=None if low == high else device.cast(pl.Int64).to_numpy(),
        sole_device=int(low) if low is not None else -1,  # type: ignore[arg-type]
        start=start,
        end=ops["end"].to_numpy(),
        launch=derived["launch"].to_numpy(),
        category=derived["category"].to_numpy(),
        runs=np.concatenate([[0], breaks, [start.size]]).astype(np.int64),
    )


def feed_arrays(account: StepBreakdown, arrays: OpArrays) -> None:
    """Feed :class:`OpArrays` in start order: their sorted runs straight to the C loop (it merges
    them), else a chunk at a time in the start order."""
    rows = arrays.start.size
    if rows == 0 or account.bounds.size < 2:
        return
    if account.native and _native is not None and arrays.device is None and arrays.runs.size - 1 <= MAX_RUNS:
        account.device(arrays.sole_device).feed_runs(
            arrays.start, arrays.end, arrays.launch, arrays.category, arrays.runs
        )
        return
    order = arrays.order()
    for lo in range(0, rows, CHUNK_ROWS):
        take = slice(lo, lo + CHUNK_ROWS) if order is None else order[lo : lo + CHUNK_ROWS]
        device = (
            np.full(min(CHUNK_ROWS, rows - lo), arrays.sole_device, dtype=np.int64)
            if arrays.device is None
            else arrays.device[take]
        )
        end = np.maximum(arrays.end[take], arrays.start[take])
        account.feed(device, arrays.start[take], end, arrays.launch[take], arrays.category[take])


def whole_breakdown(ops: pl.DataFrame, bounds: np.ndarray, indices: list[int]) -> dict[int, dict[str, int]]:
    """:class:`StepBreakdown` of a whole frame of attributed ops, fed in start order."""
    account = StepBreakdown(bounds, indices)
    if bounds.size >= 2 and ops.height:
        feed_arrays(account, op_arrays(ops))
    return account.rows()
