"""Interval arithmetic on frames: union length per group, vectorized (sort + running max)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import polars as pl

from traceguard.model import in_threads

try:  # the one-pass search, built at install with a C compiler (setup.py); NumPy otherwise
    from traceguard.metrics import _breakdown as _native
except ImportError:  # pragma: no cover - exercised where no compiler was at install
    _native = None


def running_max(values: np.ndarray) -> np.ndarray:
    """``np.maximum.accumulate(values)``: for int64 by the C loop (``_breakdown.running_max``,
    ≈1 ns an element against NumPy's ≈8 ns: 10 M kernel ends in 10 ms, not 80), else NumPy's."""
    native = getattr(_native, "running_max", None)  # None: no C build, or one from before it
    if native is None or values.dtype != np.int64 or values.ndim != 1:
        return np.maximum.accumulate(values)
    out = np.empty(values.size, dtype=np.int64)
    native(np.ascontiguousarray(values), out)
    return out


def grouped_running_max(values: np.ndarray, group: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Running maximum of int64 ``values`` restarting at each group (rows grouped contiguously;
    ``group`` numbers them from 0, ``first`` marks each group's first row): one
    :func:`running_max` over the values shifted into a band per group, where the bands fit in
    int64, else one per group."""
    if not first[1:].any():
        return running_max(values)
    low, high = int(values.min()), int(values.max())
    width = high - low + 1
    groups = int(group[-1]) + 1
    if groups * width < (1 << 62):
        offset = group * width - low  # group g's values land in [g·width, (g+1)·width)
        out = running_max(values + offset)
        out -= offset
        return out
    out = np.empty_like(values)  # pragma: no cover - int64-wide time bands
    bounds = [*np.flatnonzero(first).tolist(), values.size]
    for lo, hi in itertools.pairwise(bounds):
        out[lo:hi] = running_max(values[lo:hi])
    return out


def union_segments(frame: pl.LazyFrame | pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    """Merge overlapping ``[start, end)`` intervals per group into disjoint segments, in
    ``[*by, "start"]`` order.

    After sorting by start, an interval opens a new segment when it starts after every earlier
    interval of the group has ended (a running max of ``end``). One sort in Polars, the rest in
    NumPy (:func:`grouped_running_max`): Polars' window functions over 68 k groups (a CUDA-graph
    capture's NCCL kernels by step) took 0.26 s, this 0.02 s. A null time or no key: Polars."""
    data = frame.lazy().select([*by, "start", "end"]).sort([*by, "start"]).collect()
    if not by or data.height == 0 or data["start"].null_count() or data["end"].null_count():
        return _union_segments_polars(data, by)
    start = data["start"].to_numpy()
    end = data["end"].to_numpy()
    keys = pl.col(by[0]) if len(by) == 1 else pl.struct(by)
    group = data.select(keys.rle_id()).to_series().to_numpy().astype(np.int64)
    first = np.empty(len(group), dtype=bool)
    first[0] = True
    np.not_equal(group[1:], group[:-1], out=first[1:])
    running = grouped_running_max(end.astype(np.int64, copy=False), group, first)
    new = first.copy()
    np.greater(start[1:], running[:-1], out=new[1:])
    new |= first
    seg_first = np.flatnonzero(new)
    return (
        data.select(by)[seg_first]
        .with_columns(
            pl.Series("start", start[seg_first], dtype=data.schema["start"]),
            pl.Series("end", np.maximum.reduceat(end, seg_first), dtype=data.schema["end"]),
        )
        .lazy()
    )


def _union_segments_polars(frame: pl.LazyFrame | pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    """:func:`union_segments` by Polars' window functions (any nulls, any keys)."""
    lazy = frame.lazy().select([*by, "start", "end"]).sort([*by, "start"])
    open_until = pl.col("end").cum_max().shift(1).over(by) if by else pl.col("end").cum_max().shift(1)
    segment = pl.col("_new").cum_sum().over(by) if by else pl.col("_new").cum_sum()
    return (
        lazy.with_columns((open_until.is_null() | (pl.col("start") > open_until)).alias("_new"))
        .with_columns(segment.alias("_segment"))
        .group_by([*by, "_segment"])
        .agg(pl.col("start").min(), pl.col("end").max())
        .drop("_segment")
        .sort([*by, "start"])
    )


def union_ns(frame: pl.LazyFrame | pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    """Total length covered by the intervals of each group (overlaps counted once).

    One sort in Polars, the rest in NumPy: the running max of ``end`` restarts at every group,
    which a single ``maximum.accumulate`` does once each group's times are shifted into a band
    of their own (int64 permitting; otherwise per group, a loop over groups, not events).
    """
    data = frame.lazy().select([*by, "start", "end"]).collect()
    fast = _union_ns_np(data, by)
    if fast is not None:
        return fast.lazy()
    return union_ns_sorted(sort_groups(data.lazy(), by).collect(), by)


def union_ns_batched(frame: pl.LazyFrame | pl.DataFrame, by: list[str], batch_rows: int | None = None) -> pl.LazyFrame:
    """:func:`union_ns`, a batch of ``by[0]`` values at a time (about ``batch_rows`` rows each).

    Groups never span batches, so the result is the same; only one batch's rows are copied and
    sorted at a time, which keeps a 10 M-row frame from being copied whole."""
    rows = batch_rows or STREAM_ROWS
    lazy = frame.lazy().select([*by, "start", "end"])
    key = pl.col(by[0])
    counts = lazy.group_by(key).agg(pl.len().alias("_n")).sort(by[0], nulls_last=True).collect()
    if counts["_n"].sum() <= rows:
        return union_ns(lazy, by)
    values = counts[by[0]].to_list()
    sizes = counts["_n"].to_list()
    parts: list[pl.DataFrame] = []
    lo = 0
    while lo < len(values):
        if values[lo] is None:  # nulls last: their own batch
            parts.append(union_ns(lazy.filter(key.is_null()), by).collect())
            break
        hi, total = lo, sizes[lo]
        while hi + 1 < len(values) and values[hi + 1] is not None and total + sizes[hi + 1] <= rows:
            hi += 1
            total += sizes[hi]
        parts.append(union_ns(lazy.filter(key.is_between(values[lo], values[hi])), by).collect())
        lo = hi + 1
    return pl.concat(parts).lazy()


def _union_ns_np(data: pl.DataFrame, by: list[str]) -> pl.DataFrame | None:
    """:func:`union_ns` in NumPy on packed integer keys, sorting only when the rows are not in
    (group, start) order already; None where it does not apply (no keys, nulls, wide keys)."""
    if not by or data.height == 0 or data["start"].null_count() or data["end"].null_count():
        return None
    packed = pack_keys([data], by)
    if packed is None:
        return None
    code = packed[0]
    group = None if int(code.min()) == int(code.max()) else code
    start = data["start"].to_numpy().astype(np.int64, copy=False)
    end = data["end"].to_numpy().astype(np.int64, copy=False)
    order = group_order(group, start)
    firsts, totals = union_sorted_np(group, start, end, order=order)
    rows = firsts if order is None else order[firsts]
    keys = data.select(by)[pl.Series(rows)]
    return keys.with_columns(pl.Series("union_ns", totals, dtype=pl.Int64))


def sort_groups(frame: pl.LazyFrame, by: list[str]) -> pl.LazyFrame:
    """``frame`` sorted by ``[*by, "start"]`` as :func:`union_ns_sorted` needs it (groups
    contiguous, starts ascending within each). Done as a sort on ``start`` then a stable sort on
    one packed integer group key where the key columns allow it, which is several times faster
    than a multi-column sort; the groups come out in key order either way."""
    schema = frame.collect_schema()
    if not by or not all(schema[c].is_integer() for c in by):
        return frame.sort([*by, "start"])
    bounds = frame.select(
        *[pl.col(c).min().alias(f"{c}_min") for c in by], *[pl.col(c).max().alias(f"{c}_max") for c in by]
    ).collect()
    key = pl.lit(0, dtype=pl.Int64)
    size = 1
    for c in by:
        low, high = bounds[f"{c}_min"][0], bounds[f"{c}_max"][0]
        if low is None:  # all null: one value
            low = high = 0
        span = int(high) - int(low) + 2  # one more slot for null
        size *= span
        if size >= 1 << 62:
            return frame.sort([*by, "start"])
        value = (pl.col(c).cast(pl.Int64) - int(low)).fill_null(span - 1)
        key = key * span + value
    return frame.with_columns(key.alias("_group")).sort("start").sort("_group", maintain_order=True).drop("_group")


def union_ns_sorted(data: pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    """:func:`union_ns` of a frame already sorted by :func:`sort_groups` (sort once, use twice)."""
    data = data.select([*by, "start", "end"])
    if not by or data.height == 0 or data["start"].null_count() or data["end"].null_count():
        return _union_ns_polars(data, by)
    keys = pl.col(by[0]) if len(by) == 1 else pl.struct(by)
    group = data.select(keys.rle_id()).to_series().to_numpy().astype(np.int64)
    start = data["start"].to_numpy()
    end = data["end"].to_numpy()
    first = np.empty(len(group), dtype=bool)
    first[0] = True
    np.not_equal(group[1:], group[:-1], out=first[1:])
    running = grouped_running_max(end, group, first)
    # A new segment starts a group or starts after every earlier interval of its group ended.
    new = first.copy()
    np.greater(start[1:], running[:-1], out=new[1:])
    new |= first
    seg_first = np.flatnonzero(new)
    seg_len = np.maximum.reduceat(end, seg_first) - start[seg_first]
    totals = np.add.reduceat(seg_len, np.flatnonzero(first[seg_first]))
    keys = data.filter(pl.Series(first)).select(by)
    return keys.with_columns(pl.Series("union_ns", totals, dtype=pl.Int64)).lazy()


def _union_ns_polars(frame: pl.LazyFrame | pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    return _union_segments_polars(frame, by).group_by(by).agg((pl.col("end") - pl.col("start")).sum().alias("union_ns"))


#: Rows handled per NumPy pass here (bounds the temporaries).
_CHUNK = 1 << 21
#: Rows per slice where a frame is streamed rather than copied whole.
STREAM_ROWS = 1 << 20


def pack_keys(frames: list[pl.DataFrame], by: list[str]) -> list[np.ndarray] | None:
    """One int64 code per row of each frame for the integer key columns ``by`` (equal keys, equal
    codes, across all ``frames``), or None when a key is not an integer column, holds nulls, or
    the packed codes would not fit. Code order is key order."""
    if any(f[c].null_count() for f in frames for c in by):
        return None
    bounds = key_bounds(frames, by)
    if bounds is None:
        return None
    return [encode_keys(f, by, bounds) for f in frames]


def key_bounds(frames: list[pl.DataFrame], by: list[str]) -> list[tuple[int, int]] | None:
    """(lowest value, span) per key column over all ``frames`` (nulls ignored), for
    :func:`encode_keys`; None when a key is not an integer column or the codes would not fit."""
    bounds: list[tuple[int, int]] = []
    size = 1
    for c in by:
        if not all(f.schema[c].is_integer() for f in frames):
            return None
        lows = [v for f in frames if (v := f[c].min()) is not None]
        highs = [v for f in frames if (v := f[c].max()) is not None]
        low, high = (int(min(lows)), int(max(highs))) if lows else (0, 0)  # type: ignore[call-overload]
        span = high - low + 1
        size *= span
        if size >= 1 << 62:
            return None
        bounds.append((low, span))
    return bounds


def encode_keys(frame: pl.DataFrame, by: list[str], bounds: list[tuple[int, int]]) -> np.ndarray:
    """Mixed-radix int64 codes of ``frame``'s key columns (no nulls) under ``bounds``."""
    code = np.zeros(frame.height, dtype=np.int64)
    for c, (low, span) in zip(by, bounds, strict=True):
        code *= span
        np.add(code, frame[c].to_numpy(), out=code, casting="unsafe")  # within the span
        code -= low
    return code


def containing_rows(points: pl.DataFrame, point_col: str, intervals: pl.DataFrame, by: list[str]) -> np.ndarray | None:
    """Per point, the row of ``intervals`` (``start``, ``end``, keys ``by``) that is the
    latest-starting one of its group with ``start <= point``, if it also has ``point <= end``;
    -1 where none (or the point or one of its keys is null). No sort of the points: a binary
    search into the intervals sorted by (group, start), a chunk of points at a time. None when
    the rule is ambiguous here (two intervals of a group starting together) or the keys do not
    pack: the caller uses the as-of join."""
    n = points.height
    if intervals.height == 0 or n == 0:
        return np.full(n, -1, dtype=np.int64)
    if any(intervals[c].null_count() for c in ("start", "end", *by)):
        return None
    bounds = key_bounds([intervals, points], by)
    known = points[point_col].drop_nulls() if points[point_col].null_count() else points[point_col]
    if bounds is None or known.len() == 0:
        return None if bounds is None else np.full(n, -1, dtype=np.int64)
    icode = encode_keys(intervals, by, bounds)
    istart = intervals["start"].to_numpy().astype(np.int64, copy=False)
    iend = intervals["end"].to_numpy().astype(np.int64, copy=False)
    low = min(int(istart.min()), int(known.min()))  # type: ignore[arg-type]
    width = max(int(istart.max()), int(known.max())) - low + 1  # type: ignore[arg-type]
    groups = 1
    for _, span in bounds:
        groups *= span
    if groups * width >= 1 << 62:
        return None
    key = icode * width + (istart - low)
    order = np.argsort(key, kind="stable")
    key = key[order]
    if key.size > 1 and bool(np.any(key[1:] == key[:-1])):
        return None
    one_group = int(icode.min()) == int(icode.max())
    fill = {c: low_c for c, (low_c, _) in zip(by, bounds, strict=True)}
    out = np.empty(n, dtype=np.int64)
    if _native is not None:
        containing = _native_search(points, point_col, by, bounds, low)
        iend_c, icode_c, order_c = (np.ascontiguousarray(a, dtype=np.int64) for a in (iend, icode, order))
        key_c = np.ascontiguousarray(key, dtype=np.int64)

        def native_chunk(lo: int) -> None:
            p, valid, codes, code = containing(lo, _CHUNK)
            _native.contain(p, valid, codes, code, key_c, order_c, iend_c, icode_c, low, width, out[lo : lo + len(p)])

        in_threads(native_chunk, range(0, n, _CHUNK))
        return out

    def chunk(lo: int) -> None:  # a chunk of points: every temporary stays small
        part = points.slice(lo, _CHUNK)
        present = part[point_col].is_not_null()
        for c in by:
            present &= part[c].is_not_null()
        p = part[point_col].fill_null(low).to_numpy().astype(np.int64, copy=False)
        # No keys: one group (a frame of no columns has no rows to encode).
        g = np.zeros(len(p), np.int64)
        if by:
            g = encode_keys(part.select(pl.col(c).fill_null(fill[c]) for c in by), by, bounds)
        at = np.searchsorted(key, (p - low) if one_group and not icode[0] else g * width + (p - low), side="right")
        at -= 1
        row = order[np.maximum(at, 0)]
        ok = (at >= 0) & (p <= iend[row]) & present.to_numpy()
        ok &= icode[row] == g
        out[lo : lo + len(p)] = np.where(ok, row, -1)

    in_threads(chunk, range(0, n, _CHUNK))
    return out


def _native_search(
    points: pl.DataFrame, point_col: str, by: list[str], bounds: list[tuple[int, int]], low: int
) -> Callable[[int, int], tuple[np.ndarray, np.ndarray | None, np.ndarray | None, int]]:
    """For the C search: a function giving a chunk's (points, nulls filled; validity or None;
    group codes, or None with the one code when every point has the same keys), the frame's
    nulls and constant keys looked at once (the caller has checked every code × width fits)."""
    nulls = points[point_col].null_count() > 0 or any(points[c].null_count() for c in by)
    constant: int | None = None
    if not nulls or not by:  # no keys: every point is in the one group (a null point is not valid)
        ends = [(points[c].min(), points[c].max()) for c in by]
        if all(a is not None and a == b for a, b in ends):
            constant = 0
            for (value, _), (low_c, span) in zip(ends, bounds, strict=True):
                constant = constant * span + int(value) - low_c  # type: ignore[call-overload]
    fill = {c: low_c for c, (low_c, _) in zip(by, bounds, strict=True)}

    def chunk(lo: int, rows: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, int]:
        part = points.slice(lo, rows)
        p = np.ascontiguousarray(part[point_col].fill_null(low).to_numpy(), dtype=np.int64)
        valid = None
        if nulls:
            present = part.select(pl.all_horizontal(pl.col(point_col, *by).is_not_null())).to_series()
            valid = np.ascontiguousarray(present.to_numpy(), dtype=np.uint8)
        if constant is not None:
            return p, valid, None, constant
        codes = encode_keys(part.select(pl.col(c).fill_null(fill[c]) for c in by), by, bounds)
        return p, valid, np.ascontiguousarray(codes, dtype=np.int64), 0

    return chunk


def gather_rows(values: pl.Series, rows: np.ndarray) -> pl.Series:
    """``values[rows]`` with -1 → null. Integers without nulls (the ids searched for every op of
    a slice) are taken by NumPy and the misses nulled in one pass: 1.5 ms a million rows, where
    Polars' gather by a nullable Int64 index (converted and bounds-checked first) takes 4-5."""
    if not rows.size:
        return values.clear()
    if values.dtype.is_integer() and values.len() and not values.null_count():
        taken = pl.Series(values.name, np.take(values.to_numpy(), rows), dtype=values.dtype)
        missing = rows < 0
        if not missing.any():
            return taken
        return pl.select(pl.when(pl.Series(missing)).then(None).otherwise(taken)).to_series().alias(values.name)
    index = pl.Series(rows)
    return values.gather(index.set(index < 0, None))


def union_sorted_np(
    group: np.ndarray | None,
    start: np.ndarray,
    end: np.ndarray,
    keep: np.ndarray | None = None,
    order: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Union length per group of intervals sorted by (group, start), ``group`` non-decreasing
    integer codes (None: one group), over the rows ``keep`` marks (None: all): (position of each
    group's first kept row, union length). With ``order``, the rows are taken in that order
    (``start[order]`` is sorted; positions then index ``order``), without copying them.

    The rule of :func:`union_ns_sorted` (a segment's length is its largest end minus its first
    start), summed row by row: a row that opens a segment adds ``end - start``, any other row
    adds how far it pushes the running end. Each group's times are shifted into a band of its
    own (by its code) so that one running max serves all groups, and the rows are taken in
    chunks so that every temporary stays small (no 10 M-row scratch arrays)."""
    n = len(start)
    low = width = 0
    if group is not None and n:
        low = min(int(start.min()), int(end.min()))
        width = max(int(start.max()), int(end.max())) - low + 1
        top = int(group.max())
        if (top + 1) * width >= (1 << 62):  # pragma: no cover - needs int64-wide bands
            if order is not None:
                group, start, end = group[order], start[order], end[order]
                keep = None if keep is None else keep[order]
            return _union_by_group(group, start, end, keep)
    stream = UnionStream(low, width)
    for lo in range(0, n, _CHUNK):
        hi = min(lo + _CHUNK, n)
        if order is None:
            s, e = start[lo:hi], end[lo:hi]
            g = None if group is None else group[lo:hi]
            kept = None if keep is None else keep[lo:hi]
        else:
            at = order[lo:hi]
            s, e = start[at], end[at]
            g = None if group is None else group[at]
            kept = None if keep is None else keep[at]
        rows = None if kept is None else np.flatnonzero(kept)
        if rows is not None:
            s, e = s[rows], e[rows]
            g = None if g is None else g[rows]
        stream.feed(s, e, g, lo if rows is None else rows + lo)
    return stream.result()


class UnionStream:
    """:func:`union_sorted_np` fed a chunk at a time (rows in (group, start) order across
    chunks); ``low``/``width`` place each group's times in a band of its own (0, 0: one group)."""

    def __init__(self, low: int = 0, width: int = 0) -> None:
        self.low, self.width = low, width
        self.carry = 0  # the running end (shifted) before the next chunk
        self.last_group: int | None = None  # group of the last row so far (None: no row yet)
        self.firsts: list[np.ndarray] = []
        self.sums: list[np.ndarray] = []

    def feed(self, s: np.ndarray, e: np.ndarray, g: np.ndarray | None, positions: int | np.ndarray) -> None:
        """Rows ``s``/``e`` (group codes ``g``), at ``positions`` (an offset, or one each)."""
        m = len(s)
        if m == 0:
            return
        opens_group = np.zeros(m, dtype=bool)
        if g is not None:
            np.not_equal(g[1:], g[:-1], out=opens_group[1:])
            opens_group[0] = self.last_group is None or int(g[0]) != self.last_group
            self.last_group = int(g[-1])
            offset = g * self.width - self.low
            s, e = s + offset, e + offset
        else:
            opens_group[0] = self.last_group is None
            self.last_group = 0
        running = running_max(e)
        if not opens_group[0]:
            np.maximum(running, self.carry, out=running)
        opens = np.empty(m, dtype=bool)
        np.greater(s[1:], running[:-1], out=opens[1:])
        opens[0] = bool(s[0] > self.carry)
        opens |= opens_group
        added = np.empty(m, dtype=np.int64)
        np.subtract(running[1:], running[:-1], out=added[1:])
        added[0] = running[0] - self.carry
        np.copyto(added, e - s, where=opens)
        self.carry = int(running[-1])
        heads = np.flatnonzero(opens_group)
        bounds = heads if len(heads) and heads[0] == 0 else np.concatenate(([0], heads))
        part = np.add.reduceat(added, bounds)
        if not opens_group[0]:  # the first rows finish the previous chunk's last group
            self.sums[-1][-1] += part[0]
            part = part[1:]
        if len(part):
            self.firsts.append(heads + positions if isinstance(positions, int) else positions[heads])
            self.sums.append(part)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.sums:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(self.firsts), np.concatenate(self.sums)


def _union_by_group(
    group: np.ndarray, start: np.ndarray, end: np.ndarray, keep: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - needs int64-wide time bands
    firsts, totals = [], []
    bounds = [*np.flatnonzero(np.diff(group) != 0).tolist(), len(group) - 1]
    lo = 0
    for last in bounds:
        hi = last + 1
        part = None if keep is None else keep[lo:hi]
        f, t = union_sorted_np(None, start[lo:hi], end[lo:hi], part)
        if len(t):
            firsts.append(f[0] + lo)
            totals.append(t[0])
        lo = hi
    return np.asarray(firsts, dtype=np.int64), np.asarray(totals, dtype=np.int64)


def _pairs(starts: np.ndarray, n: int) -> list[tuple[int, int]]:
    return list(itertools.pairwise([*starts.tolist(), n]))


def group_order(group: np.ndarray | None, start: np.ndarray) -> np.ndarray | None:
    """Row order sorting by (group, start), or None when the rows already are (a real capture's
    tables come sorted by start, so this is usually a linear check and no copy)."""
    if group is None:
        key = start
    else:
        low, high = int(start.min()), int(start.max())
        width = high - low + 1
        if (int(group.max()) + 1) * width >= 1 << 62:
            return np.lexsort((start, group))
        key = np.empty(len(start), dtype=np.int64)
        for lo in range(0, len(start), _CHUNK):  # no full-size temporaries
            part = key[lo : lo + _CHUNK]
            np.multiply(group[lo : lo + _CHUNK], width, out=part)
            part += start[lo : lo + _CHUNK]
            part -= low
    if key.size < 2 or bool(np.all(key[1:] >= key[:-1])):
        return None
    return np.argsort(key, kind="stable")
