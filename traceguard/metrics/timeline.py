"""The timeline of one rank: what ran when, as a few lanes of merged segments (pure: no I/O).

Lanes, over the rank's analysis window (the ops the metrics count), times in ns from ``origin_ns``
(the window's first op start on the capture's clock):

- ``steps``: each step's GPU span (its first attributed op's start to its last op's end), labelled
  with the step's name; ``phases``: each phase's GPU extent the same way (ops attributed to it).
- ``compute``: the union of the non-NCCL kernels' intervals.
- ``nccl:<Collective>``: the union of the NCCL kernels of one collective type
  (:mod:`traceguard.metrics.collectives`' types, ``Other`` for unnamed ones).
- ``exposed``: NCCL time that no compute kernel covers on the same device (per device: the NCCL
  union minus the compute union) — the intervals ``nccl_exposed_ns`` sums.
- ``memcpy``: the union of memcpy and memset ops.
- ``cuda graphs``: the union of CUDA graph executions traced whole (kind ``graph``,
  :mod:`traceguard.metrics.graphs`): GPU time whose kernels the capture does not show.

A screen shows a couple of thousand segments per lane, a 10 M-kernel capture has millions: when a
lane's union has more than ``max_segments`` pieces, the shortest gaps are closed until it has
``max_segments`` (the ``max_segments - 1`` longest gaps — the idle time worth seeing — stay open;
among equal gaps the earlier one stays open, so the lane does not depend on how its segments were
fed: :class:`SegmentReducer` reduces a chunk at a time to the same lane). Every segment keeps
``busy``: the ns of the lane's union inside it, so a merged segment still says how full it was
(``busy == end - start`` for an unmerged one). ``merged_from`` is the lane's piece count before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import polars as pl

from traceguard.metrics.collectives import COLLECTIVE_ORDER, OTHER
from traceguard.metrics.intervals import running_max
from traceguard.model import OP_KINDS

#: Segments per lane a timeline keeps at most (about the pixels across a wide screen).
MAX_SEGMENTS = 1500
#: Lane kinds, in the order lanes are listed.
LANE_KINDS: tuple[str, ...] = ("step", "phase", "compute", "graph", "nccl", "exposed", "memcpy")

_KERNEL = OP_KINDS.index("kernel")
_COPY_CODES = (OP_KINDS.index("memcpy"), OP_KINDS.index("memset"))
_GRAPH = OP_KINDS.index("graph")


def union_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint sorted segments covering the same time as the ``[start, end)`` intervals: after
    sorting by start, an interval opens a segment when it starts after every earlier one ended."""
    if start.size == 0:
        return start.astype(np.int64), end.astype(np.int64)
    start = start.astype(np.int64, copy=False)
    end = np.maximum(end.astype(np.int64, copy=False), start)
    if not bool(np.all(start[1:] >= start[:-1])):
        order = np.argsort(start, kind="stable")
        start, end = start[order], end[order]
    reach = running_max(end)
    heads = np.flatnonzero(start[1:] > reach[:-1]) + 1
    seg_start = np.empty(heads.size + 1, dtype=np.int64)
    seg_end = np.empty(heads.size + 1, dtype=np.int64)
    seg_start[0], seg_start[1:] = start[0], start[heads]
    seg_end[:-1], seg_end[-1] = reach[heads - 1], reach[-1]
    return seg_start, seg_end


def subtract_intervals(
    a_start: np.ndarray, a_end: np.ndarray, b_start: np.ndarray, b_end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The parts of disjoint sorted segments A that disjoint sorted segments B do not cover:
    A ∩ (the gaps of B), each A segment cut by the few gaps it meets (binary search, so a large B
    costs only where A is)."""
    if a_start.size == 0 or b_start.size == 0:
        return a_start, a_end
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    gap_start = np.concatenate([[low], b_end])
    gap_end = np.concatenate([b_start, [high]])
    first = np.searchsorted(gap_end, a_start, side="right")
    past = np.maximum(np.searchsorted(gap_start, a_end, side="left"), first)
    counts = past - first
    owner = np.repeat(np.arange(a_start.size), counts)
    gap = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
    piece_start = np.maximum(a_start[owner], gap_start[gap])
    piece_end = np.minimum(a_end[owner], gap_end[gap])
    kept = piece_end > piece_start
    return piece_start[kept], piece_end[kept]


def reduce_segments(
    start: np.ndarray, end: np.ndarray, limit: int, labels: Sequence[str] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str] | None]:
    """At most ``limit`` segments (``limit >= 1``) of disjoint sorted segments: the ``limit - 1``
    longest gaps stay open (the earlier among equal ones), the others close. Returns (start, end,
    busy, labels): ``busy`` is the ns of the given segments inside each returned one; a merged run
    of labelled segments is labelled ``first … last (n)``. :class:`SegmentReducer` fed once: the
    same code as a lane reduced a chunk at a time."""
    reducer = SegmentReducer(limit, labelled=labels is not None)
    reducer.feed(start, end, labels)
    return reducer.result()


def _objects(values: list[str]) -> np.ndarray:
    """A 1-d object array of strings (``np.array`` of a list could make a 2-d or ``<U`` one)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


class SegmentReducer:
    """:func:`reduce_segments` of a lane fed a chunk of segments at a time, in time order: the same
    segments, busy time and labels as one call on all of them, with only ``limit - 1`` candidate
    open gaps kept (never every segment).

    Gap ``i`` is ``start[i + 1] - end[i]`` (``i``: the position, over all chunks, of the segment
    before it). The ``limit - 1`` largest gaps stay open, among equal gaps the lower position; the
    rest close. That order is total, so the open gaps of everything fed are the first
    ``limit - 1`` of (those kept from the chunks before) ∪ (the gap between the chunks) ∪ (this
    chunk's own first ``limit - 1``): each chunk selects its own (vectorized) and merges them.

    Each candidate keeps what rebuilds the runs around it: the gap (ns), its position, the end of
    the segment before it and the start of the one after, ``through`` (the busy ns of the segments
    up to and including the one before it) and the labels on either side. The runs are then the
    stretches between open gaps; a run's busy time is the difference of ``through`` at its ends."""

    def __init__(self, limit: int, labelled: bool = False) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.keep = limit - 1  # open gaps at most
        self.labelled = labelled
        self.count = 0  # segments fed
        self.busy = 0  # ns of the segments fed
        self.first_start = 0  # the first segment's start, the last one's end (valid once count > 0)
        self.last_end = 0
        self.first_label = ""
        self.last_label = ""
        # The candidates, one entry per gap, in no particular order.
        empty = np.empty(0, dtype=np.int64)
        self.gap, self.pos, self.end_before, self.start_after, self.through = empty, empty, empty, empty, empty
        self.label_before = self.label_after = _objects([])

    def feed(self, start: np.ndarray, end: np.ndarray, labels: Sequence[str] | None = None) -> None:
        """Add a chunk of disjoint sorted segments ``[start, end)``, starting at or after the last
        end fed; ``labels`` (one per segment) exactly when the reducer is ``labelled``."""
        start = np.asarray(start, dtype=np.int64)
        end = np.asarray(end, dtype=np.int64)
        if start.ndim != 1 or start.shape != end.shape:
            raise ValueError(f"start and end must be 1-d of one size, not {start.shape} and {end.shape}")
        if (labels is not None) != self.labelled:
            raise ValueError("labels are needed exactly when the reducer is labelled")
        if labels is not None and len(labels) != start.size:
            raise ValueError(f"{len(labels)} labels for {start.size} segments")
        size = start.size
        if size == 0:
            return
        if self.count and int(start[0]) < self.last_end:
            raise ValueError(f"a chunk starts at {int(start[0])}, before the last end fed ({self.last_end})")
        gaps = start[1:] - end[:-1]
        local = self._select(gaps)
        # Busy ns of this chunk's segments up to and including segment q: its extent to end[q]
        # less the gaps before q (sums between selected positions: no array of every length).
        if local.size:
            parts = np.add.reduceat(gaps, local)
            head = int(gaps[: local[0]].sum())
            before = head + np.concatenate([[0], np.cumsum(parts[:-1])])
            gap_sum = head + int(parts.sum())
        else:
            before = np.empty(0, dtype=np.int64)
            gap_sum = int(gaps.sum())
        new_gap = [gaps[local]]
        new_pos = [self.count + local]
        new_end = [end[local]]
        new_start = [start[local + 1]]
        new_through = [self.busy + end[local] - int(start[0]) - before]
        new_before = [labels[i] for i in local.tolist()] if labels is not None else []
        new_after = [labels[i + 1] for i in local.tolist()] if labels is not None else []
        if self.count and self.keep:  # the gap between the previous chunk and this one
            new_gap.append(np.array([int(start[0]) - self.last_end]))
            new_pos.append(np.array([self.count - 1]))
            new_end.append(np.array([self.last_end]))
            new_start.append(start[:1])
            new_through.append(np.array([self.busy]))
            if labels is not None:
                new_before.append(self.last_label)
                new_after.append(labels[0])
        self._merge(
            np.concatenate([self.gap, *new_gap]),
            np.concatenate([self.pos, *new_pos]),
            np.concatenate([self.end_before, *new_end]),
            np.concatenate([self.start_after, *new_start]),
            np.concatenate([self.through, *new_through]),
            np.concatenate([self.label_before, _objects(new_before)]),
            np.concatenate([self.label_after, _objects(new_after)]),
        )
        if not self.count:
            self.first_start = int(start[0])
            self.first_label = labels[0] if labels is not None else ""
        self.count += size
        self.busy += int(end[-1]) - int(start[0]) - gap_sum
        self.last_end = int(end[-1])
        self.last_label = labels[-1] if labels is not None else ""

    def _select(self, gaps: np.ndarray) -> np.ndarray:
        """The positions (ascending) of the first ``keep`` of ``gaps`` by (largest, earliest)."""
        k, m = self.keep, gaps.size
        if m <= k:
            return np.arange(m)
        if k == 0:
            return np.empty(0, dtype=np.int64)
        cut = np.partition(gaps, m - k)[m - k]  # the k-th largest gap
        chosen = np.flatnonzero(gaps >= cut)
        if chosen.size > k:  # more gaps equal to the cut than places: the earliest of them stay
            equal = np.flatnonzero(gaps[chosen] == cut)
            chosen = np.delete(chosen, equal[equal.size - (chosen.size - k) :])
        return chosen

    def _merge(self, *candidates: np.ndarray) -> None:
        """Keep the first ``keep`` candidates by (largest gap, earliest position)."""
        gap, pos = candidates[0], candidates[1]
        if gap.size > self.keep:
            order = np.lexsort((pos, -gap))[: self.keep]
            # (The label arrays of an unlabelled reducer stay empty.)
            candidates = tuple(c[order] if c.size else c for c in candidates)
        (self.gap, self.pos, self.end_before, self.start_after, self.through, self.label_before, self.label_after) = (
            candidates
        )

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str] | None]:
        """(start, end, busy, labels) of the reduced lane, as :func:`reduce_segments` returns them."""
        n = self.count
        if n == 0:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty.copy(), empty.copy(), [] if self.labelled else None
        order = np.argsort(self.pos)
        pos = self.pos[order]
        start = np.concatenate([[self.first_start], self.start_after[order]]).astype(np.int64)
        end = np.concatenate([self.end_before[order], [self.last_end]]).astype(np.int64)
        busy = np.diff(np.concatenate([self.through[order], [self.busy]]).astype(np.int64), prepend=0)
        if not self.labelled:
            return start, end, busy, None
        heads = [0, *(pos + 1).tolist()]
        tails = [*pos.tolist(), n - 1]
        first = [self.first_label, *self.label_after[order].tolist()]
        last = [*self.label_before[order].tolist(), self.last_label]
        labels = [
            a if h == t else f"{a} … {b} ({t - h + 1})" for a, b, h, t in zip(first, last, heads, tails, strict=True)
        ]
        return start, end, busy, labels


def _lane(
    name: str,
    kind: str,
    start: np.ndarray,
    end: np.ndarray,
    origin: int,
    limit: int,
    *,
    collective: str | None = None,
    labels: Sequence[str] | None = None,
) -> dict[str, Any]:
    reducer = SegmentReducer(limit, labelled=labels is not None)
    reducer.feed(start, end, labels)
    return _reduced_lane(name, kind, reducer, origin, collective=collective)


def _reduced_lane(
    name: str, kind: str, reducer: SegmentReducer, origin: int, *, collective: str | None = None
) -> dict[str, Any]:
    """A lane from a reducer fed with all of its union's segments."""
    s, e, busy, kept = reducer.result()
    return {
        "name": name,
        "kind": kind,
        "collective": collective,
        "merged_from": int(reducer.count),
        "start": (s - origin).tolist(),
        "end": (e - origin).tolist(),
        "busy": busy.tolist(),
        "labels": kept,
    }


class SegmentStream:
    """:func:`union_intervals` of rows fed a chunk at a time, in start order across chunks: the
    same segments, with no array of all the rows (only the segments are kept).

    ``rows``: how many rows will be fed at most, when known: the segments (never more than the
    rows) are then written into arrays of that size, with no joining of pieces at the end."""

    def __init__(self, rows: int = 0) -> None:
        self.reach: int | None = None  # the running end of the open segment (None: none yet)
        self.last_start: int | None = None
        self.starts = np.empty(max(rows, 1), dtype=np.int64)
        self.ends = np.empty(max(rows, 1), dtype=np.int64)
        self.count = 0  # segments opened so far (the last one still open: no end yet)

    def _append(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Open ``starts``; close the previous segments at ``ends`` (one fewer when the first
        segment opens now)."""
        need = self.count + starts.size
        if need > self.starts.size:  # more rows than announced: grow
            size = max(need, 2 * self.starts.size)
            self.starts = np.resize(self.starts, size)
            self.ends = np.resize(self.ends, size)
        first_end = self.count - 1 if self.count else 0
        self.ends[first_end : first_end + ends.size] = ends
        self.starts[self.count : need] = starts
        self.count = need

    def feed(self, start: np.ndarray, end: np.ndarray) -> bool:
        """Add rows (starts ascending, none before the last fed); False, adding nothing, when
        they are out of order."""
        if start.size == 0:
            return True
        start = start.astype(np.int64, copy=False)
        if (self.last_start is not None and int(start[0]) < self.last_start) or not bool(
            np.all(start[1:] >= start[:-1])
        ):
            return False
        self.last_start = int(start[-1])
        reach = running_max(np.maximum(end.astype(np.int64, copy=False), start))
        opens = np.empty(start.size, dtype=bool)
        opens[0] = self.reach is None or int(start[0]) > self.reach
        if self.reach is not None:
            np.maximum(reach, self.reach, out=reach)
        np.greater(start[1:], reach[:-1], out=opens[1:])
        heads = np.flatnonzero(opens)
        if heads.size:
            # Each head closes the segment before it: at the previous row's reach, or (a head on
            # the first row) at the reach carried from the chunks before.
            closing = heads if self.reach is not None else heads[1:]
            ends = reach[np.maximum(closing - 1, 0)]
            if closing.size and closing[0] == 0:
                ends[0] = self.reach
            self._append(start[heads], ends)
        self.reach = int(reach[-1])
        return True

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self.reach is None:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        n = self.count
        self.ends[n - 1] = self.reach
        starts, ends = self.starts[:n], self.ends[:n]
        if 2 * n < self.starts.size:  # far fewer segments than rows: do not hold the rest
            starts, ends = starts.copy(), ends.copy()
        self.starts = self.ends = np.empty(0, dtype=np.int64)
        return starts, ends


def compute_union(ops: pl.DataFrame, mask: pl.Series | None) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per device (null → -1): :func:`union_intervals` of the compute (non-NCCL) kernels of
    ``ops`` (``kind``, ``is_nccl``, ``device``, ``start``, ``end``) that ``mask`` keeps, with
    ``start`` and ``end`` not null.

    Read in row slices, each device's kernels streamed in start order (a capture's kernel table
    is), so that no copy of the 10 M-row columns is made: only the segments are kept. A device
    whose kernels are out of order is gathered and sorted instead."""
    keep = (pl.col("kind") == "kernel") & ~pl.col("is_nccl").fill_null(False)
    keep = keep & pl.col("start").is_not_null() & pl.col("end").is_not_null()
    device_key = pl.col("device").fill_null(-1).cast(pl.Int64)
    columns = [device_key, pl.col("start"), pl.col("end")]
    # Kept rows per device first (one cheap pass): each device's segments then fill arrays of
    # that size, never joined from pieces (which would hold them twice for a moment).
    counts = ops.lazy().filter(keep if mask is None else keep & mask.fill_null(False)).group_by(device_key).len()
    streams = {int(dev): SegmentStream(int(n)) for dev, n in counts.collect().iter_rows()}
    unsorted: set[int] = set()
    for lo in range(0, ops.height, _SLICE_ROWS):
        # A slice of the frame is a view: only the slice's kept rows are copied.
        part = ops.slice(lo, _SLICE_ROWS)
        kept_rows = keep if mask is None else keep & mask.slice(lo, _SLICE_ROWS).fill_null(False)
        kept = part.lazy().filter(kept_rows).select(columns).collect()
        if kept.height == 0:
            continue
        device = kept["device"].to_numpy()
        start = kept["start"].to_numpy()
        end = kept["end"].to_numpy()
        one = int(device.min()) == int(device.max())
        for dev in [int(device[0])] if one else np.unique(device).tolist():
            if dev in unsorted:
                continue
            rows = None if one else np.flatnonzero(device == dev)
            stream = streams[dev]
            s, e = (start, end) if rows is None else (start[rows], end[rows])
            if not stream.feed(s, e):
                unsorted.add(dev)
                streams[dev] = SegmentStream()  # its arrays are not needed any more
    out = {dev: stream.result() for dev, stream in streams.items() if dev not in unsorted}
    for dev in sorted(unsorted):
        rows = keep & (pl.col("device").fill_null(-1) == dev)
        part = (
            ops.lazy().filter(rows if mask is None else rows & mask.fill_null(False)).select("start", "end").collect()
        )
        out[dev] = union_intervals(part["start"].to_numpy(), part["end"].to_numpy())
    return dict(sorted(out.items()))


#: Rows per slice when a whole column is streamed (:func:`compute_union`).
_SLICE_ROWS = 1 << 20


def _column(frame: pl.DataFrame, name: str) -> np.ndarray:
    return frame.get_column(name).to_numpy().astype(np.int64, copy=False)


def rank_timeline(
    rank: int,
    ops: pl.DataFrame,
    mask: pl.Series,
    nccl_ops: pl.DataFrame,
    step_rows: Sequence[dict[str, Any]],
    phases: pl.DataFrame,
    *,
    max_segments: int = MAX_SEGMENTS,
    compute: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
) -> dict[str, Any]:
    """The rank's lanes (module docstring). ``ops``: the attributed GPU ops (``kind``, ``device``,
    ``start``, ``end``, ``is_nccl``, ``phase_id``); ``mask``: the analysis window over them;
    ``nccl_ops``: the window's NCCL kernels with ``collective``; ``step_rows``: the step breakdown
    (``name``, ``gpu_start_ns``, ``gpu_span_ns``); ``phases``: ``phase_id`` and ``name``;
    ``compute``: :func:`compute_union` of ``ops`` and ``mask`` when the caller has it already."""
    compute_by_device = compute_union(ops, mask) if compute is None else compute
    lanes = window_lanes(ops, mask, phases, max_segments=max_segments)
    parts = with_compute(lanes, compute_by_device, max_segments=max_segments)
    return assemble_timeline(rank, parts, nccl_ops, step_rows, phases, max_segments=max_segments)


def window_lanes(
    ops: pl.DataFrame, mask: pl.Series, phases: pl.DataFrame, *, max_segments: int = MAX_SEGMENTS
) -> TimelineParts:
    """The :class:`TimelineParts` of :func:`rank_timeline` but the compute kernels' (an empty
    compute lane, no segments near NCCL: :func:`with_compute` adds them): the parts that read the
    10 M-row columns, which a caller can take beside its own work before the compute union is done."""
    # Only the window's few non-kernel rows are ever copied out of the 10 M-row columns (no
    # whole-column arrays).
    keep = mask.fill_null(False) & ops["start"].is_not_null() & ops["end"].is_not_null()
    row = ops.lazy().filter(keep).select(pl.col("start").min(), pl.col("end").max(), pl.len()).collect().row(0)
    kind = pl.col("kind").to_physical()
    window = ops.lazy().filter(keep)
    copies = window.filter(kind.is_in(_COPY_CODES)).select("start", "end").collect()
    graphs = window.filter(kind == _GRAPH).select("start", "end").collect()
    del keep, window
    extents = phase_extents(ops) if phases.height and "phase_id" in ops.columns else None
    copies_lane = SegmentReducer(max_segments)
    copies_lane.feed(*union_intervals(_column(copies, "start"), _column(copies, "end")))
    return TimelineParts(
        bounds=(row[0], row[1], int(row[2])),
        extents=extents,
        compute_lane=SegmentReducer(max_segments),
        graphs=union_intervals(_column(graphs, "start"), _column(graphs, "end")),
        compute_near_nccl={},
        copies_lane=copies_lane,
    )


def with_compute(
    parts: TimelineParts,
    compute_by_device: dict[int, tuple[np.ndarray, np.ndarray]],
    *,
    max_segments: int = MAX_SEGMENTS,
) -> TimelineParts:
    """``parts`` (:func:`window_lanes`') with the compute lane fed the union of every device's
    compute segments (:func:`compute_union`) and those segments kept for the exposed lane."""
    compute_lane = SegmentReducer(max_segments)
    if compute_by_device:
        pieces = list(compute_by_device.values())
        s, e = (
            pieces[0]
            if len(pieces) == 1
            else union_intervals(np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces]))
        )
        # A chunk at a time (the same lane): a 10 M-kernel union is 10 M segments, whose gaps and
        # their partition as whole arrays were 0.2 GB of fresh memory (0.07-0.49 s against 0.04).
        for lo in range(0, s.size, _LANE_CHUNK):
            compute_lane.feed(s[lo : lo + _LANE_CHUNK], e[lo : lo + _LANE_CHUNK])
    return replace(parts, compute_lane=compute_lane, compute_near_nccl=compute_by_device)


#: Segments fed to a lane's reducer at a time (:func:`with_compute`).
_LANE_CHUNK = 1 << 20


def phase_extents(ops: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per ``phase_id``: the first start and last end of the ops attributed to it (timed ones)."""
    return (
        ops.lazy()
        .filter(pl.col("phase_id").is_not_null() & pl.col("start").is_not_null() & pl.col("end").is_not_null())
        .group_by("phase_id")
        .agg(pl.col("start").min(), pl.col("end").max())
        .collect()
    )


@dataclass
class TimelineParts:
    """What the lanes read from the attributed ops of the window (the whole-file analysis takes
    them from the frame; the sliced one, traceguard.metrics.sliced, builds them a slice at a time)."""

    #: (first start, last end, count) of the window's timed ops.
    bounds: tuple[int | None, int | None, int]
    #: :func:`phase_extents` (None without phases).
    extents: pl.DataFrame | None
    #: A reducer fed with the union of the window's compute kernels over all devices.
    compute_lane: SegmentReducer
    #: The union of the window's CUDA graph executions.
    graphs: tuple[np.ndarray, np.ndarray]
    #: Per device: the compute union's segments, or at least every one that meets an NCCL kernel
    #: of the window (the exposed lane needs no others).
    compute_near_nccl: dict[int, tuple[np.ndarray, np.ndarray]]
    #: A reducer fed with the union of the window's memcpys and memsets.
    copies_lane: SegmentReducer


def assemble_timeline(
    rank: int,
    parts: TimelineParts,
    nccl_ops: pl.DataFrame,
    step_rows: Sequence[dict[str, Any]],
    phases: pl.DataFrame,
    *,
    max_segments: int = MAX_SEGMENTS,
) -> dict[str, Any]:
    """The lanes of :func:`rank_timeline` from its :class:`TimelineParts`."""
    first, last, count = parts.bounds
    if not count or first is None or last is None:
        return {"rank": rank, "origin_ns": None, "span_ns": 0, "lanes": []}
    origin = int(first)
    span = max(int(last), origin) - origin
    lanes: list[dict[str, Any]] = []

    spans = [s for s in step_rows if s.get("gpu_start_ns") is not None and s.get("gpu_span_ns") is not None]
    if spans:
        spans = sorted(spans, key=lambda s: s["gpu_start_ns"])
        step_start = np.array([s["gpu_start_ns"] for s in spans], dtype=np.int64)
        step_end = step_start + np.array([s["gpu_span_ns"] for s in spans], dtype=np.int64)
        lanes.append(
            _lane("steps", "step", step_start, step_end, origin, max_segments, labels=[s["name"] for s in spans])
        )
    if parts.extents is not None:
        extents = (
            parts.extents.lazy()
            .join(phases.lazy().select(pl.col("phase_id").cast(pl.Int64), "name"), on="phase_id", how="inner")
            .sort("start")
            .collect()
        )
        if extents.height:
            lanes.append(
                _lane(
                    "phases",
                    "phase",
                    _column(extents, "start"),
                    _column(extents, "end"),
                    origin,
                    max_segments,
                    labels=extents["name"].to_list(),
                )
            )

    empty = np.empty(0, dtype=np.int64)
    if parts.compute_lane.count:
        lanes.append(_reduced_lane("compute", "compute", parts.compute_lane, origin))
    if parts.graphs[0].size:
        lanes.append(_lane("cuda graphs", "graph", *parts.graphs, origin, max_segments))

    nccl_timed = nccl_ops.filter(pl.col("start").is_not_null() & pl.col("end").is_not_null())
    if nccl_timed.height:
        labelled = nccl_timed.select(
            pl.col("collective").cast(pl.String).fill_null(OTHER).alias("collective"),
            pl.col("device").fill_null(-1),
            "start",
            "end",
        )
        names = labelled["collective"].unique().to_list()
        order = {name: i for i, name in enumerate(COLLECTIVE_ORDER)}
        for name in sorted(names, key=lambda n: (order.get(n, len(order)), n)):
            part = labelled.filter(pl.col("collective") == name)
            s, e = union_intervals(_column(part, "start"), _column(part, "end"))
            lanes.append(_lane(f"nccl:{name}", "nccl", s, e, origin, max_segments, collective=name))
        exposed_s, exposed_e = [], []
        for dev in labelled["device"].unique().to_list():
            part = labelled.filter(pl.col("device") == dev)
            a_s, a_e = union_intervals(_column(part, "start"), _column(part, "end"))
            b_s, b_e = parts.compute_near_nccl.get(int(dev), (empty, empty))
            x_s, x_e = subtract_intervals(a_s, a_e, b_s, b_e)
            exposed_s.append(x_s)
            exposed_e.append(x_e)
        s, e = union_intervals(np.concatenate(exposed_s), np.concatenate(exposed_e))
        lanes.append(_lane("exposed", "exposed", s, e, origin, max_segments))

    if parts.copies_lane.count:
        lanes.append(_reduced_lane("memcpy", "memcpy", parts.copies_lane, origin))
    return {"rank": rank, "origin_ns": origin, "span_ns": span, "lanes": lanes}
