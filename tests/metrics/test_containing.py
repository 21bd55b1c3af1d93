"""The binary-search containment (``intervals.containing_rows``) agrees with the as-of join it
replaces, null points and keys included; the launch join by binary search agrees with a join."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard import model
from traceguard.metrics import intervals, steps


def _intervals(rng: np.random.Generator, groups: int) -> pl.DataFrame:
    rows = []
    for g in range(groups):
        t = int(rng.integers(0, 50))
        for i in range(int(rng.integers(0, 8))):
            start = t + int(rng.integers(1, 20))
            end = start + int(rng.integers(0, 30))
            rows.append((g, start, end, g * 100 + i))
            if rng.random() < 0.3:  # a nested one
                rows.append((g, start + 1, max(start + 1, end - 1), g * 100 + 50 + i))
            t = end
    return pl.DataFrame(
        rows, schema={"pid": pl.Int32, "start": pl.Int64, "end": pl.Int64, "rid": pl.Int64}, orient="row"
    )


@pytest.mark.parametrize("seed", range(25))
def test_containing_ids_matches_asof(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    ranges = _intervals(rng, 3)
    n = 300
    points = pl.DataFrame(
        {
            "pid": pl.Series(rng.integers(0, 4, n), dtype=pl.Int32),
            "p": pl.Series(rng.integers(0, 300, n)),
        }
    ).with_columns(
        pl.when(pl.Series(rng.random(n) < 0.1)).then(None).otherwise(pl.col("p")).alias("p"),
        pl.when(pl.Series(rng.random(n) < 0.05)).then(None).otherwise(pl.col("pid")).alias("pid"),
    )
    monkeypatch.setattr(intervals, "_CHUNK", 7)
    fast = steps.containing_ids(points, "p", ranges, "rid", ["pid"])
    with monkeypatch.context() as m:
        m.setattr(steps, "containing_rows", lambda *a: None)
        m.setattr(steps, "FEW_INTERVALS", 0)
        slow = steps.containing_ids(points, "p", ranges, "rid", ["pid"])
    assert fast.to_list() == slow.to_list()


@settings(max_examples=150, deadline=None)
@given(
    bounds=st.lists(st.tuples(st.integers(-3, 40), st.integers(-3, 40)), min_size=1, max_size=steps.FEW_INTERVALS + 1),
    groups=st.sampled_from([["pid"], ["pid", "step_id"], []]),
    points=st.lists(
        st.tuples(st.none() | st.integers(0, 5), st.none() | st.integers(0, 2), st.none() | st.integers(-5, 45)),
        max_size=60,
    ),
)
def test_intervals_alone_in_their_group_are_searched_by_comparison_as_by_search(
    bounds: list[tuple[int, int]], groups: list[str], points: list[tuple[int | None, int | None, int | None]]
) -> None:
    """A few intervals, none sharing a group (the window steps: one a process), answered by one
    comparison each (``steps._one_per_group``): the ids the search and the as-of join give, null
    points and keys, points on either bound, an end before its start, keys no interval has."""
    rows = [(k, k % 3, start, end, 100 + k) for k, (start, end) in enumerate(bounds)]
    if not groups:
        rows = rows[:1]
    intervals_frame = pl.DataFrame(
        rows,
        schema={"pid": pl.Int32, "step_id": pl.Int64, "start": pl.Int64, "end": pl.Int64, "rid": pl.Int32},
        orient="row",
    )
    frame = pl.DataFrame(points, schema={"pid": pl.Int32, "step_id": pl.Int64, "p": pl.Int64}, orient="row")
    few = steps._one_per_group(frame, "p", intervals_frame, "rid", groups)
    assert (few is not None) == (len(rows) <= steps.FEW_INTERVALS)
    rows_found = intervals.containing_rows(frame, "p", intervals_frame, groups)
    native, intervals._native = intervals._native, None  # the NumPy search: the C one's reference
    try:
        rows_numpy = intervals.containing_rows(frame, "p", intervals_frame, groups)
    finally:
        intervals._native = native
    assert (rows_found is None and rows_numpy is None) or np.array_equal(rows_found, rows_numpy)  # type: ignore[arg-type]
    searched = intervals.gather_rows(intervals_frame["rid"], rows_found).to_list() if rows_found is not None else None
    if few is not None:
        assert few.dtype == pl.Int32 and few.len() == frame.height
        if searched is not None:
            assert few.to_list() == searched

        def brute_force(pid: int | None, step_id: int | None, p: int | None) -> int | None:
            """The interval of the point's group that holds it, by reading the rule."""
            point = {"pid": pid, "step_id": step_id}
            for key, step, start, end, rid in rows:
                interval = {"pid": key, "step_id": step}
                same_group = all(point[c] is not None and point[c] == interval[c] for c in groups)
                if p is not None and same_group and start <= p <= end:
                    return rid
            return None

        assert few.to_list() == [brute_force(*point) for point in points]


@pytest.mark.parametrize("seed", range(10))
def test_launch_rows_match_join(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(model, "_JOIN_CHUNK", 5)
    n_calls, n_ops = 60, 80
    calls = pl.DataFrame(
        {
            "pid": pl.Series(rng.integers(1, 3, n_calls), dtype=pl.Int32),
            "tid": pl.Series(rng.integers(1, 9, n_calls), dtype=pl.Int32),
            "correlation_id": rng.integers(0, 40, n_calls) if seed % 2 else np.sort(rng.integers(0, 40, n_calls)),
            "start": rng.integers(0, 1000, n_calls),
            "name_id": pl.Series(rng.integers(0, 5, n_calls), dtype=pl.Int32),
        }
    )
    ops = pl.DataFrame(
        {
            "pid": pl.Series(rng.integers(1, 3, n_ops), dtype=pl.Int32),
            "correlation_id": pl.Series(rng.integers(0, 45, n_ops)),
        }
    ).with_columns(pl.when(pl.Series(rng.random(n_ops) < 0.1)).then(None).otherwise(pl.col("correlation_id")))
    ops, calls = model.conform(ops, model.GPU_OPS_SCHEMA), model.conform(calls, model.API_CALLS_SCHEMA)
    table = (
        calls.with_row_index("_call")
        .filter(pl.col("correlation_id").is_not_null())
        .unique(["pid", "correlation_id"], keep="first", maintain_order=True)
        .select("pid", "correlation_id", pl.col("_call").cast(pl.Int64))
    )
    want = ops.join(table, on=["pid", "correlation_id"], how="left", maintain_order="left")["_call"]
    assert model.launch_rows(ops, calls).to_list() == want.to_list()


@pytest.mark.parametrize("seed", range(40))
def test_phases_searched_by_process_first_match_the_search_by_step(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``steps._phase_ids`` (the process's phases first, the rest by step) is the search by
    (process, step): nested phases, gaps between them, points of another step, nulls."""
    rng = np.random.default_rng(seed)
    rows = []
    phase_id = 0
    for pid in range(2):
        t = 0
        for step in range(int(rng.integers(1, 5))):
            for _ in range(int(rng.integers(0, 4))):
                start = t + int(rng.integers(0, 6))
                end = start + int(rng.integers(0, 12))
                rows.append((pid, step + 10 * pid, start, end, phase_id))
                phase_id += 1
                if rng.random() < 0.3:  # a phase nested in it
                    rows.append((pid, step + 10 * pid, start + 1, max(start + 1, end - 2), phase_id))
                    phase_id += 1
                t = end - int(rng.integers(0, 3))  # may overlap the next step's first phase
    phases = pl.DataFrame(
        rows,
        schema={"pid": pl.Int32, "step_id": pl.Int32, "start": pl.Int64, "end": pl.Int64, "phase_id": pl.Int32},
        orient="row",
    )
    n = 400
    step_ids = rng.integers(0, 15, n)
    points = pl.DataFrame(
        {
            "pid": pl.Series(rng.integers(0, 2, n), dtype=pl.Int32),
            "_p": pl.Series(rng.integers(0, 60, n)),
            "step_id": pl.Series(step_ids, dtype=pl.Int32),
        }
    ).with_columns(
        pl.when(pl.Series(rng.random(n) < 0.1)).then(None).otherwise(pl.col("step_id")).alias("step_id"),
        pl.when(pl.Series(rng.random(n) < 0.05)).then(None).otherwise(pl.col("_p")).alias("_p"),
    )
    monkeypatch.setattr(intervals, "_CHUNK", 13)
    expected = steps.containing_ids(points, "_p", phases, "phase_id", ["pid", "step_id"])
    assert steps._phase_ids(points, phases).to_list() == expected.to_list()


@settings(max_examples=300, deadline=None)
@given(
    sorted_keys=st.lists(st.integers(-5, 40), max_size=30).map(lambda v: np.array(sorted(v), dtype=np.int64)),
    runs=st.lists(st.tuples(st.integers(-8, 45), st.integers(1, 12)), max_size=25),
)
def test_search_by_runs_is_numpys(sorted_keys: np.ndarray, runs: list[tuple[int, int]]) -> None:
    """``model._search_runs``: a search per run of equal keys (long runs: a graph launch's
    kernels) or per key (short ones) gives ``np.searchsorted`` exactly."""
    keys = np.array([key for key, length in runs for _ in range(length)], dtype=np.int64)
    np.testing.assert_array_equal(model._search_runs(sorted_keys, keys), np.searchsorted(sorted_keys, keys))


@pytest.mark.parametrize("seed", range(6))
def test_launch_rows_of_graph_launches_match_join(seed: int) -> None:
    """Ops in runs sharing a correlation id (the kernels of one graph launch), some without a call."""
    rng = np.random.default_rng(seed)
    calls = model.conform(
        pl.DataFrame(
            {
                "pid": pl.Series([7] * 30, dtype=pl.Int32),
                "tid": pl.Series([1] * 30, dtype=pl.Int32),
                "correlation_id": np.arange(0, 60, 2),
                "start": np.arange(30) * 10,
                "name_id": pl.Series([3] * 30, dtype=pl.Int32),
            }
        ),
        model.API_CALLS_SCHEMA,
    )
    ids = np.repeat(rng.integers(0, 62, 12), rng.integers(1, 40, 12))
    ops = model.conform(
        pl.DataFrame({"pid": pl.Series([7] * ids.size, dtype=pl.Int32), "correlation_id": ids}), model.GPU_OPS_SCHEMA
    )
    want = [int(i) // 2 if i % 2 == 0 and i < 60 else None for i in ids]
    assert model.launch_rows(ops, calls).to_list() == want


@settings(max_examples=300, deadline=None)
@given(
    haystack=st.lists(st.integers(-50, 50), max_size=40),
    needles=st.lists(st.integers(-60, 60), min_size=2, max_size=80),
    interleave=st.booleans(),
)
def test_searches_in_sorted_order_are_searchsorted(haystack: list[int], needles: list[int], interleave: bool) -> None:
    """``model._search_each`` (keys much out of order searched in their sorted order, the answers
    put back) and ``model._search_runs`` are ``np.searchsorted(..., side="left")``: keys in
    order, out of order, two ascending sequences interleaved (two processes' launches)."""
    sorted_keys = np.sort(np.array(haystack, dtype=np.int64))
    keys = np.array(needles, dtype=np.int64)
    if interleave:
        keys = np.empty(2 * len(needles), dtype=np.int64)
        keys[0::2] = np.sort(needles)
        keys[1::2] = np.sort(needles)[::-1] + 1000
    want = np.searchsorted(sorted_keys, keys, side="left")
    assert np.array_equal(model._search_each(sorted_keys, keys), want)
    assert np.array_equal(model._search_runs(sorted_keys, keys), want)


@settings(max_examples=300, deadline=None)
@given(
    haystack=st.lists(st.tuples(st.integers(-1, 3), st.integers(0, 60)), max_size=60),
    needles=st.lists(st.tuples(st.integers(-1, 3), st.integers(0, 60)), min_size=2, max_size=120),
    in_order=st.booleans(),
    processes=st.integers(1, 20),
)
def test_searches_by_process_are_searchsorted(
    haystack: list[tuple[int, int]], needles: list[tuple[int, int]], in_order: bool, processes: int
) -> None:
    """Keys packed as the launch join packs them (process above bit 6, a null key -1), several
    processes' keys interleaved, each process's in order or not, up to more processes than are
    searched one at a time: searched by process (``shift``) they are still ``np.searchsorted``."""

    def pack(pairs: list[tuple[int, int]], spread: int) -> np.ndarray:
        return np.array([-1 if p < 0 else ((p * spread) % processes) << 6 | v for p, v in pairs], dtype=np.int64)

    sorted_keys = np.sort(pack(haystack, 1))
    rows = sorted(needles, key=lambda pv: pv[1]) if in_order else needles
    keys = pack(rows, 7)
    want = np.searchsorted(sorted_keys, keys, side="left")
    assert np.array_equal(model._search_each(sorted_keys, keys, 6), want)
    assert np.array_equal(model._search_runs(sorted_keys, keys, 6), want)
    many = np.concatenate([np.arange(40, dtype=np.int64) << 6, keys])  # 40 processes, then these
    assert np.array_equal(model._search_each(sorted_keys, many, 6), np.searchsorted(sorted_keys, many))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    numbers=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=12),
    null_at=st.one_of(st.none(), st.integers(0, 11)),
    picks=st.lists(st.integers(-1, 11), max_size=40),
    dtype=st.sampled_from([pl.Int32, pl.Int64, pl.UInt16, pl.String]),
)
def test_gathered_rows_are_polars_gather(
    numbers: list[int], null_at: int | None, picks: list[int], dtype: pl.DataType
) -> None:
    """gather_rows is ``values[rows]`` with -1 → null, as Polars' gather by a nullable index gives
    it, whichever way it takes them (NumPy for integers without nulls), the dtype kept."""
    values: list[int | None] = [v % (1 << 16) if dtype == pl.UInt16 else v for v in numbers]
    if null_at is not None and null_at < len(values):
        values[null_at] = None
    cells = [None if v is None else (str(v) if dtype == pl.String else v) for v in values]
    series = pl.Series("ids", cells, dtype=dtype)
    rows = np.array([p for p in picks if p < len(values)], dtype=np.int64)
    index = pl.Series(rows)
    expected = series.gather(index.set(index < 0, None)) if rows.size else series.clear()
    got = intervals.gather_rows(series, rows)
    assert got.dtype == series.dtype and got.name == "ids"
    assert got.to_list() == expected.to_list()


@given(
    pids=st.lists(st.integers(0, (1 << 24) - 1), min_size=1, max_size=40),
    ids=st.lists(st.integers(0, 1 << 36), min_size=1, max_size=40),
    chunks=st.integers(1, 4),
    nulls=st.booleans(),
)
@settings(max_examples=200, deadline=None)
def test_packed_keys_are_the_expression(pids: list[int], ids: list[int], chunks: int, nulls: bool) -> None:
    """``_packed_key``'s NumPy path (integer keys without nulls) gives what its Polars expression
    gives, over frames of several chunks and any slice of them; with nulls, the expression's
    keys and null flags."""
    n = min(len(pids), len(ids))
    ids_column: list[int | None] = list(ids[:n])
    if nulls:
        ids_column[n // 2] = None
    frame = pl.DataFrame(
        {"pid": pl.Series(pids[:n], dtype=pl.Int32), "correlation_id": pl.Series(ids_column, dtype=pl.Int64)}
    )
    cut = [n * k // chunks for k in range(chunks + 1)]
    frame = pl.concat([frame.slice(a, b - a) for a, b in itertools.pairwise(cut)], rechunk=False)
    packing = model._key_packing(frame)
    assert packing is not None
    for lo, hi in ((0, n), (n // 3, n), (0, max(1, n // 2))):
        key, null = model._packed_key(frame, packing, lo, hi)
        part = frame.slice(lo, hi - lo)
        want = part.select(
            (pl.col("pid").cast(pl.Int64) - packing.pid_low) * (1 << packing.corr_bits)
            + (pl.col("correlation_id") - packing.corr_low)
        ).to_series()
        assert key.dtype == np.int64
        assert key.tolist() == want.fill_null(-1).to_list()
        assert (null is None) == (want.null_count() == 0)
        if null is not None:
            assert null.tolist() == want.is_null().to_list()
