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
``max_segments`` (the longest gaps — the idle time worth seeing — stay open). Every segment keeps
``busy``: the ns of the lane's union inside it, so a merged segment still says how full it was
(``busy == end - start`` for an unmerged one). ``merged_from`` is the lane's piece count before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from traceguard.metrics.collectives import COLLECTIVE_ORDER, OTHER
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
    reach = np.maximum.accumulate(end)
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
    """At most ``limit`` segments: close the shortest gaps. Returns (start, end, busy, labels);
    a merged run of labelled segments is labelled ``first … last (n)``."""
    busy = end - start
    n = start.size
    if n <= limit:
        return start, end, busy, list(labels) if labels is not None else None
    gaps = start[1:] - end[:-1]
    closed = np.zeros(n - 1, dtype=bool)
    closed[np.argpartition(gaps, n - limit - 1)[: n - limit]] = True
    heads = np.flatnonzero(np.concatenate([[True], ~closed]))
    tails = np.append(heads[1:] - 1, n - 1)
    merged_labels = None
    if labels is not None:
        merged_labels = [
            labels[h] if h == t else f"{labels[h]} … {labels[t]} ({t - h + 1})"
            for h, t in zip(heads.tolist(), tails.tolist(), strict=True)
        ]
    return start[heads], end[tails], np.add.reduceat(busy, heads), merged_labels


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
    s, e, busy, kept = reduce_segments(start, end, limit, labels)
    return {
        "name": name,
        "kind": kind,
        "collective": collective,
        "merged_from": int(start.size),
        "start": (s - origin).tolist(),
        "end": (e - origin).tolist(),
        "busy": busy.tolist(),
        "labels": kept,
    }


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
) -> dict[str, Any]:
    """The rank's lanes (module docstring). ``ops``: the attributed GPU ops (``kind``, ``device``,
    ``start``, ``end``, ``is_nccl``, ``phase_id``); ``mask``: the analysis window over them;
    ``nccl_ops``: the window's NCCL kernels with ``collective``; ``step_rows``: the step breakdown
    (``name``, ``gpu_start_ns``, ``gpu_span_ns``); ``phases``: ``phase_id`` and ``name``."""
    # Whole columns as arrays (no filtered copy of a 10 M-row frame); the window and the lanes
    # are boolean selections over them.
    keep = mask.fill_null(False).to_numpy()
    for name in ("start", "end"):
        if ops[name].null_count():
            keep &= ops[name].is_not_null().to_numpy()
    if not keep.any():
        return {"rank": rank, "origin_ns": None, "span_ns": 0, "lanes": []}
    kind = ops["kind"].to_physical().to_numpy()
    start = ops["start"].fill_null(0).to_numpy().astype(np.int64, copy=False)
    end = ops["end"].fill_null(0).to_numpy().astype(np.int64, copy=False)
    origin = int(np.min(start, where=keep, initial=np.iinfo(np.int64).max))
    span = int(np.max(end, where=keep, initial=origin)) - origin
    device_col = ops["device"].fill_null(-1)
    one_device = device_col.min() == device_col.max()
    device = None if one_device else device_col.to_numpy()

    compute = keep & (kind == _KERNEL) & ~ops["is_nccl"].fill_null(False).to_numpy()
    copies = keep & np.isin(kind, _COPY_CODES)
    graphs = keep & (kind == _GRAPH)
    del keep, kind
    lanes: list[dict[str, Any]] = []

    spans = [s for s in step_rows if s.get("gpu_start_ns") is not None and s.get("gpu_span_ns") is not None]
    if spans:
        spans = sorted(spans, key=lambda s: s["gpu_start_ns"])
        step_start = np.array([s["gpu_start_ns"] for s in spans], dtype=np.int64)
        step_end = step_start + np.array([s["gpu_span_ns"] for s in spans], dtype=np.int64)
        lanes.append(
            _lane("steps", "step", step_start, step_end, origin, max_segments, labels=[s["name"] for s in spans])
        )
    if phases.height and "phase_id" in ops.columns:
        extents = (
            ops.lazy()
            .filter(pl.col("phase_id").is_not_null() & pl.col("start").is_not_null() & pl.col("end").is_not_null())
            .group_by("phase_id")
            .agg(pl.col("start").min(), pl.col("end").max())
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
    if device is None:
        compute_by_device = {int(device_col[0]): union_intervals(start[compute], end[compute])} if compute.any() else {}
    else:
        compute_by_device = {
            int(dev): union_intervals(start[compute & (device == dev)], end[compute & (device == dev)])
            for dev in np.unique(device[compute]).tolist()
        }
    if compute_by_device:
        parts = list(compute_by_device.values())
        s, e = parts[0] if len(parts) == 1 else union_intervals(
            np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        )
        lanes.append(_lane("compute", "compute", s, e, origin, max_segments))
    if graphs.any():
        s, e = union_intervals(start[graphs], end[graphs])
        lanes.append(_lane("cuda graphs", "graph", s, e, origin, max_segments))

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
            b_s, b_e = compute_by_device.get(int(dev), (empty, empty))
            x_s, x_e = subtract_intervals(a_s, a_e, b_s, b_e)
            exposed_s.append(x_s)
            exposed_e.append(x_e)
        s, e = union_intervals(np.concatenate(exposed_s), np.concatenate(exposed_e))
        lanes.append(_lane("exposed", "exposed", s, e, origin, max_segments))

    if copies.any():
        s, e = union_intervals(start[copies], end[copies])
        lanes.append(_lane("memcpy", "memcpy", s, e, origin, max_segments))
    return {"rank": rank, "origin_ns": origin, "span_ns": span, "lanes": lanes}
