"""The sliced analysis (:mod:`traceguard.metrics.sliced`) gives the whole-file analysis' result,
field for field, however the ops are cut into time slices: on real public captures (nsys of
every generation here, Kineto), our 2×H200 and 4×H200 captures, CUDA-graph captures, with steps
from ranges, inferred and from the window; and its streamed unions equal the whole-array ones."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from tests.conftest import OWN, PUBLIC, needs_native
from traceguard.ingest import read_capture, with_rank
from traceguard.metrics import sliced
from traceguard.metrics.intervals import union_ns, union_segments
from traceguard.metrics.rank import RankResult, analyse_rank
from traceguard.metrics.sliced import GroupUnion, UnionDrain, analyse_rank_sliced
from traceguard.metrics.timeline import union_intervals

CAPTURES = [
    *sorted((PUBLIC / "nsys-sqlite").glob("*.sqlite.gz")),
    *sorted((PUBLIC / "kineto").glob("*.json.gz"))[:4],
    OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz",
    OWN / "h200" / "nobucketview_nsys_bucket25" / "cap_1.sqlite.gz",
    OWN / "h200x4" / "shm_nsys" / "cap_2.sqlite.gz",
    OWN / "sweep_h200" / "cpu_staged" / "cap_0.sqlite.gz",
    *sorted((OWN / "cuda_graphs").glob("*.sqlite*")),
]


def time_slices(ops: pl.DataFrame, count: int) -> Callable[[], Iterable[pl.DataFrame]]:
    """``ops`` cut at ``count`` - 1 start-time quantiles, each slice in the frame's own order
    (as the sliced reader gives them: start order across slices, table order inside)."""
    if ops.height == 0:
        return lambda: iter(())
    starts = ops["start"].sort()
    cuts = sorted({int(starts[int(i * (starts.len() - 1) / count)]) for i in range(1, count)})
    bounds: list[int | None] = [None, *cuts, None]

    def read() -> Iterable[pl.DataFrame]:
        for lo, hi in itertools.pairwise(bounds):
            keep = pl.lit(True)
            if lo is not None:
                keep = keep & (pl.col("start") >= lo)
            if hi is not None:
                keep = keep & (pl.col("start") < hi)
            yield ops.filter(keep)

    return read


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, pl.DataFrame):
        try:
            assert_frame_equal(a, b)
        except AssertionError as exc:
            return [f"{path}: {str(exc).splitlines()[0]}"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys differ {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} vs {b!r}"]


def result_differences(whole: RankResult, sliced: RankResult) -> list[str]:
    return [
        d
        for f in dataclasses.fields(RankResult)
        for d in differences(getattr(whole, f.name), getattr(sliced, f.name), f.name)
    ]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name[-48:])
def test_sliced_equals_whole(path: Path) -> None:
    capture = with_rank(read_capture(path, keep_correlation=False), 0)
    whole = analyse_rank(0, capture, ranks_analysed=2)
    for count in (1, 7, 60):
        sliced = analyse_rank_sliced(0, capture, time_slices(capture.gpu_ops, count), ranks_analysed=2)
        assert result_differences(whole, sliced) == [], count


@pytest.mark.parametrize("sources", [("inferred",), ("window",), ("pattern", "inferred")])
def test_sliced_equals_whole_with_steps_from_the_gpu(sources: tuple[str, ...]) -> None:
    capture = with_rank(read_capture(OWN / "h200" / "p2p_nsys" / "cap_1.sqlite.gz", keep_correlation=False), 1)
    whole = analyse_rank(1, capture, step_sources=sources)
    assert whole.step_source in ("inferred", "window")
    sliced = analyse_rank_sliced(1, capture, time_slices(capture.gpu_ops, 13), step_sources=sources)
    assert result_differences(whole, sliced) == []


@pytest.mark.parametrize(
    "path",
    [OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz", OWN / "sweep_h200" / "cpu_staged" / "cap_0.sqlite.gz"],
    ids=lambda p: p.parent.name,
)
def test_sliced_equals_whole_with_slices_spilled_in_small_pieces(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pass 2 reads the spill in pieces of about SPILL_ROWS cut by start time: a slice's tables
    (kernels, then copies) interleave in time, so pieces cut by row would hand pass 2's unions
    ops out of start order (the breakdown's copy time of a CUDA-graph shape went to 0 that way)."""
    capture = with_rank(read_capture(path, keep_correlation=False), 0)
    whole = analyse_rank(0, capture, ranks_analysed=2)
    monkeypatch.setattr(sliced, "SPILL_ROWS", 97)
    for count in (1, 7):
        cut = analyse_rank_sliced(0, capture, time_slices(capture.gpu_ops, count), ranks_analysed=2)
        assert result_differences(whole, cut) == [], count


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    starts=st.lists(st.one_of(st.none(), st.integers(0, 40)), min_size=0, max_size=80),
    rows=st.integers(1, 30),
)
def test_time_pieces_cut_a_slice_by_start_keeping_its_order(starts: list[int | None], rows: int) -> None:
    frame = pl.DataFrame(
        {"start": starts, "row": list(range(len(starts)))}, schema={"start": pl.Int64, "row": pl.Int64}
    )
    pieces = list(sliced.time_pieces(frame, rows))
    assert pl.concat(pieces).sort("row").equals(frame)  # every row once
    for piece in pieces:
        assert piece["row"].is_sorted()  # the slice's own order inside a piece
    known = [p["start"].drop_nulls() for p in pieces]
    for before, after in itertools.pairwise([k for k in known if k.len()]):
        assert before.max() < after.min()  # consecutive in time, as pass 2 needs
    assert all(p["start"].null_count() == 0 for p in pieces[1:])  # untimed rows go with the first
    if frame["start"].drop_nulls().len() and len(starts) > rows:
        assert len(pieces) > 1


def test_a_spilled_piece_reads_back_as_written_and_outlives_its_file(tmp_path: Path) -> None:
    """A piece of a real capture's attributed ops, written as pass 1 spills it, reads back (memory
    mapped) as ``pl.read_ipc`` reads it: every column, type (enums, booleans) and null; and its
    columns stay readable after the file is removed, as the spill is while pass 2 runs."""
    capture = with_rank(read_capture(OWN / "sweep_h200" / "cpu_staged" / "cap_0.sqlite.gz", keep_correlation=False), 0)
    ops = capture.gpu_ops.with_columns(
        pl.col("kind").eq("kernel").alias("is_nccl"),
        pl.when(pl.col("start") % 3 == 0).then(None).otherwise(pl.col("name_id")).alias("step_id"),
        pl.col("name_id").alias("launch_name_id"),
        pl.col("start").alias("launch_start"),
    ).select(sliced._SPILL_COLUMNS)
    assert ops["copy_kind"].null_count() and ops["copy_kind"].drop_nulls().len()  # kernels and copies both
    path = tmp_path / "000000.arrow"
    ops.write_ipc(path, compression="uncompressed")
    got = sliced.read_spilled(path)
    assert_frame_equal(got, pl.read_ipc(path))
    path.unlink()
    assert_frame_equal(got.sort("start", maintain_order=True), ops.sort("start", maintain_order=True))


def test_sliced_reads_the_source_once(tmp_path: Path) -> None:
    capture = with_rank(read_capture(OWN / "h200" / "shm_nsys" / "cap_0.sqlite.gz", keep_correlation=False), 0)
    seen: list[int] = []
    reads = 0
    slices = time_slices(capture.gpu_ops, 5)

    def counted() -> Iterable[pl.DataFrame]:
        nonlocal reads
        reads += 1
        return slices()

    analyse_rank_sliced(0, capture, counted, on_slice=lambda part: seen.append(part.height), spill_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # the spilled slices are gone
    assert reads == 1  # steps from ranges: pass 2 reads the slices pass 1 wrote
    assert sum(seen) == capture.gpu_ops.height


intervals = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(-5, 30)), min_size=0, max_size=60)
#: Durations of zero or more: with a negative one, the whole-frame sort may order rows of equal
#: start either way, and the union's length then depends on that order.
timed_intervals = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(0, 30)), min_size=0, max_size=60
)


@pytest.mark.parametrize("loop", ["c", "numpy"])
@settings(max_examples=300, deadline=None, derandomize=True)
@given(rows=timed_intervals, cuts=st.lists(st.integers(0, 60), max_size=5), clip=st.booleans())
def test_group_union_equals_union_ns(rows: list[tuple[int, int, int]], cuts: list[int], clip: bool, loop: str) -> None:
    """Both loops (the C one, ``_breakdown.group_union``, and the NumPy one it must equal)."""
    native = _native_or_numpy(loop)
    saved = sliced._native
    sliced._native = native
    try:
        _check_group_union(rows, cuts, clip)
    finally:
        sliced._native = saved


def _native_or_numpy(loop: str) -> Any:
    """``sliced._native`` as the loop asks (``numpy``: None), failing where the C one is required."""
    if loop == "c":
        needs_native(sliced._native is not None, "traceguard.metrics._breakdown")
    return sliced._native if loop == "c" else None


@pytest.mark.parametrize("loop", ["c", "numpy"])
@settings(max_examples=300, deadline=None, derandomize=True)
@given(rows=st.lists(st.tuples(st.integers(-2, 2), st.integers(-3, 3)), max_size=12), presort=st.booleans())
def test_rows_in_key_order_are_told_as_the_two_sorts_order_them(
    rows: list[tuple[int, int]], presort: bool, loop: str
) -> None:
    """GroupUnion skips its two stable sorts where the rows are in their order already: exactly
    where the sorts would leave every row where it is (ties included), taken as they come or
    through an order."""
    native = _native_or_numpy(loop)
    rows = sorted(rows) if presort else rows
    keys = np.array([r[0] for r in rows], dtype=np.int64)
    start = np.array([r[1] for r in rows], dtype=np.int64)
    order = np.argsort(start, kind="stable")
    order = order[np.argsort(keys[order], kind="stable")]
    shuffled = np.random.default_rng(len(rows)).permutation(len(rows))
    saved = sliced._native
    sliced._native = native
    try:
        assert sliced._in_key_order(keys, start) == bool(np.array_equal(order, np.arange(len(rows))))
        told = sliced._in_key_order(keys, start, shuffled)
    finally:
        sliced._native = saved
    assert told == bool(np.array_equal(keys[shuffled], keys[order]) and np.array_equal(start[shuffled], start[order]))


@pytest.mark.parametrize("loop", ["c", "numpy"])
@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    rows=st.lists(st.tuples(st.integers(-3, 3), st.integers(-4, 4)), max_size=40),
    runs=st.integers(1, 4),
    rising=st.booleans(),
)
def test_the_key_order_is_the_two_sorts_order(rows: list[tuple[int, int]], runs: int, rising: bool, loop: str) -> None:
    """key_order gives exactly the two stable sorts' order (None where that is the rows' own):
    rows as a slice brings them (runs in start order, keys rising with time where ``rising``) or
    in any order."""
    native = _native_or_numpy(loop)
    if rising:  # each run sorted by start, its key rising with start (a slice of one table each)
        parts = [sorted(rows[i::runs], key=lambda r: r[1]) for i in range(runs)]
        rows = [(start // 3, start) for part in parts for _, start in part]
    keys = np.array([r[0] for r in rows], dtype=np.int64)
    start = np.array([r[1] for r in rows], dtype=np.int64)
    expected = np.argsort(start, kind="stable")
    expected = expected[np.argsort(keys[expected], kind="stable")]
    saved = sliced._native
    sliced._native = native
    try:
        got = sliced.key_order(keys, start)
    finally:
        sliced._native = saved
    assert np.array_equal(np.arange(len(rows)) if got is None else got, expected)


def _check_group_union(rows: list[tuple[int, int, int]], cuts: list[int], clip: bool) -> None:
    frame = pl.DataFrame(
        {"g": [r[0] for r in rows], "start": [r[1] for r in rows], "end": [r[1] + r[2] for r in rows]},
        schema={"g": pl.Int64, "start": pl.Int64, "end": pl.Int64},
    ).sort("start", maintain_order=True)
    union = GroupUnion(clip=clip)
    bounds = [None, *sorted(set(cuts)), None]
    for lo, hi in itertools.pairwise(bounds):
        part = frame.filter((pl.col("start") >= (lo or 0)) & (pl.col("start") < (hi if hi is not None else 1 << 40)))
        union.feed(part["g"].to_numpy(), part["start"].to_numpy(), part["end"].to_numpy())
    keys, totals = union.result()
    got = dict(zip(keys.tolist(), totals.tolist(), strict=True))
    if clip:  # the bubble's rule: segments, each clipped at 0
        segments = union_segments(frame, ["g"]).collect()
        segments = segments.with_columns((pl.col("end") - pl.col("start")).clip(lower_bound=0).alias("n"))
        expected = dict(segments.group_by("g").agg(pl.col("n").sum()).iter_rows())
    else:
        expected = dict(union_ns(frame, ["g"]).collect().iter_rows()) if frame.height else {}
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(rows=intervals, cuts=st.lists(st.integers(0, 60), max_size=5))
def test_union_drain_equals_union_intervals(rows: list[tuple[int, int, int]], cuts: list[int]) -> None:
    start = np.array(sorted(r[1] for r in rows), dtype=np.int64)
    order = np.argsort([r[1] for r in rows], kind="stable")
    end = np.array([rows[i][1] + rows[i][2] for i in order], dtype=np.int64)
    drain = UnionDrain()
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    edges = [0, *sorted({int(np.searchsorted(start, c)) for c in cuts}), start.size]
    for lo, hi in itertools.pairwise(edges):
        parts.append(drain.feed(start[lo:hi], end[lo:hi]))
    parts.append(drain.finish())
    got_s = np.concatenate([p[0] for p in parts])
    got_e = np.concatenate([p[1] for p in parts])
    want_s, want_e = union_intervals(start, end)
    assert got_s.tolist() == want_s.tolist()
    assert got_e.tolist() == want_e.tolist()


def test_union_drain_refuses_rows_out_of_order() -> None:
    drain = UnionDrain()
    drain.feed(np.array([5, 9]), np.array([6, 10]))
    with pytest.raises(ValueError, match="start order"):
        drain.feed(np.array([7]), np.array([8]))


def test_the_read_ahead_holds_one_slice_beyond_the_one_taken() -> None:
    """``prefetched``: every slice in order; while the consumer holds slice i the reader has made
    at most slice i + 1 (a bounded queue alone let it make i + 2); its error is raised where the
    slice would have come; leaving early ends its thread."""
    import threading
    import time

    from traceguard.metrics.sliced import prefetched

    made = 0

    def source(n: int, fail_at: int | None = None) -> Iterable[int]:
        nonlocal made
        for i in range(n):
            if i == fail_at:
                raise ValueError("slice 3 could not be read")
            made += 1
            yield i

    taken = []
    for i in prefetched(source(8)):
        time.sleep(0.05)  # room for the reader to run ahead, if it would
        assert made <= i + 2, (i, made)
        taken.append(i)
    assert taken == list(range(8))

    with pytest.raises(ValueError, match="slice 3"):
        for _ in prefetched(source(8, fail_at=3)):
            pass

    for i in prefetched(source(100)):
        if i == 2:
            break
    time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name == "traceguard-slices"]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name[-48:])
def test_kernel_sequence_resolves_the_steps_all_ops_do(path: Path) -> None:
    """The kernel sequence keeps the kernels and, of the copies and sets, only each process's
    first-starting and last-ending per slice: inferred and window steps from it are those from
    every op (real captures, one to sixty slices)."""
    from traceguard.metrics.steps import resolve_steps

    capture = with_rank(read_capture(path, keep_correlation=False), 0)
    for sources in (("inferred",), ("window",)):
        whole = resolve_steps(capture.ranges, capture.gpu_ops, capture.strings, (), sources)
        for count in (1, 7, 60):
            sequence = sliced.kernel_sequence(time_slices(capture.gpu_ops, count)())
            assert sequence.height <= capture.gpu_ops.height
            cut = resolve_steps(capture.ranges, sequence, capture.strings, (), sources)
            assert_frame_equal(cut.steps, whole.steps)
            assert (cut.source, cut.period_kernels) == (whole.source, whole.period_kernels), (sources, count)


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name[-48:])
def test_steps_from_the_sequence_are_the_full_search(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the sources that read only ranges settle nothing (``steps_from_ranges`` None),
    ``steps_from_sequence`` starts at the first source that reads the ops: the steps of the full
    search over every source, and those ranges are not searched a second time."""
    from traceguard.metrics import steps as steps_module
    from traceguard.metrics.steps import STEP_SOURCES, resolve_steps

    capture = with_rank(read_capture(path, keep_correlation=False), 0)
    real = steps_module.find_steps
    searched: list[Any] = []

    def counted(ranges: pl.DataFrame, patterns: Any) -> pl.DataFrame:
        searched.append(list(patterns))
        return real(ranges, patterns)

    for patterns in ((), ("^no step is named this$",), ("Batch|step|Step|iteration",)):
        for sources in (STEP_SOURCES, ("pattern", "window"), ("convention", "inferred", "window"), ("window",)):
            whole = resolve_steps(capture.ranges, capture.gpu_ops, capture.strings, patterns, sources)
            if sliced.steps_from_ranges(capture, patterns, sources) is not None:
                continue  # the ranges settle them: the sequence is never read
            searched.clear()
            monkeypatch.setattr(steps_module, "find_steps", counted)
            found = sliced.steps_from_sequence(capture, capture.gpu_ops, patterns, sources)
            monkeypatch.setattr(steps_module, "find_steps", real)
            assert searched in ([], [[]])  # at most the empty frame of no steps, never a pattern again
            assert_frame_equal(found.steps, whole.steps)
            assert (found.source, found.period_kernels, found.convention) == (
                whole.source,
                whole.period_kernels,
                whole.convention,
            ), (patterns, sources)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["kernel", "memcpy", "memset", None]),
            st.one_of(st.none(), st.integers(1, 3)),
            st.one_of(st.none(), st.integers(0, 50)),
            st.one_of(st.none(), st.integers(0, 30)),
        ),
        max_size=40,
    ),
    cuts=st.integers(1, 5),
)
def test_kernel_sequence_keeps_every_process_bounds(ops: list[tuple[Any, ...]], cuts: int) -> None:
    """Per process, the first start and the last end of its ops with a start (what window and
    inferred steps read of the other ops) and every kernel, in order, whatever the slices."""
    frame = pl.DataFrame(
        {
            "rank": [0] * len(ops),
            "pid": [pid for _, pid, _, _ in ops],
            "device": [0] * len(ops),
            "kind": [kind for kind, _, _, _ in ops],
            "start": [start for _, _, start, _ in ops],
            "end": [None if start is None or length is None else start + length for _, _, start, length in ops],
            "name_id": list(range(len(ops))),
        },
        schema={c: sliced.GPU_OPS_SCHEMA[c] for c in sliced._SEQUENCE_COLUMNS},
    )
    parts = [frame[i * len(ops) // cuts : (i + 1) * len(ops) // cuts] for i in range(cuts)]
    sequence = sliced.kernel_sequence(parts)
    kernels = (pl.col("kind") == "kernel").fill_null(False)
    assert_frame_equal(sequence.filter(kernels), frame.filter(kernels))
    assert sequence["name_id"].is_sorted()  # the slices' order, kept

    def bounds(ops: pl.DataFrame) -> pl.DataFrame:
        timed = ops.filter(pl.col("pid").is_not_null() & pl.col("start").is_not_null())
        return timed.group_by("pid").agg(pl.col("start").min(), pl.col("end").max()).sort("pid")

    assert_frame_equal(bounds(sequence), bounds(frame))
