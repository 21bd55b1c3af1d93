"""``intervals.containing_rows``: the C search (``_breakdown.contain``) gives every point the row
the NumPy search gives, with null points and keys, one group or many, keys constant or not."""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard.metrics import intervals

if intervals._native is None and os.environ.get("TRACEGUARD_REQUIRE_NATIVE") == "1":
    pytest.fail("traceguard.metrics._breakdown was not built (TRACEGUARD_REQUIRE_NATIVE=1)", pytrace=False)
pytestmark = pytest.mark.skipif(intervals._native is None, reason="the C extension was not built")


@st.composite
def _case(draw: st.DrawFn) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    by = draw(st.sampled_from([["pid"], ["pid", "step_id"]]))
    groups = draw(st.integers(1, 3))
    rows = []
    for g in range(groups):
        t = draw(st.integers(-50, 50))
        for _ in range(draw(st.integers(0, 12))):
            t += draw(st.integers(1, 20))  # distinct starts per group
            rows.append((g % 2 + 7, g, t, t + draw(st.integers(-3, 30))))
    spans = pl.DataFrame(rows, schema=["pid", "step_id", "start", "end"], orient="row").cast(pl.Int64)
    n = draw(st.integers(0, 200))
    nullable = st.none() | st.integers(-80, 400)
    pids = [7, 8, None] if draw(st.booleans()) else [7]  # or every point of one process
    points = pl.DataFrame(
        {
            "pid": draw(st.lists(st.sampled_from(pids), min_size=n, max_size=n)),
            "step_id": draw(st.lists(st.sampled_from([0, 1, 2, None]), min_size=n, max_size=n)),
            "p": draw(st.lists(nullable, min_size=n, max_size=n)),
        },
        schema={"pid": pl.Int32, "step_id": pl.Int32, "p": pl.Int64},
    )
    return points, spans, by


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_case())
def test_the_c_search_is_the_numpy_search(case: tuple[pl.DataFrame, pl.DataFrame, list[str]]) -> None:
    points, spans, by = case
    native = intervals.containing_rows(points, "p", spans, by)
    saved, intervals._native = intervals._native, None
    try:
        plain = intervals.containing_rows(points, "p", spans, by)
    finally:
        intervals._native = saved
    if plain is None:
        assert native is None
    else:
        assert native is not None and np.array_equal(native, plain)


def test_chunks_and_threads_cover_every_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Points past one chunk, on two threads: each chunk writes its own slice of the answer."""
    monkeypatch.setattr(intervals, "_CHUNK", 1000)
    rng = np.random.default_rng(3)
    starts = np.sort(rng.choice(10**6, 500, replace=False))
    spans = pl.DataFrame({"pid": 1, "start": starts, "end": starts + 1500})
    points = pl.DataFrame({"pid": np.ones(25_000, dtype=np.int64), "p": rng.integers(0, 10**6, 25_000)})
    rows = intervals.containing_rows(points, "p", spans, ["pid"])
    assert rows is not None
    p = points["p"].to_numpy()
    at = np.searchsorted(starts, p, side="right") - 1
    expected = np.where((at >= 0) & (p <= starts[np.maximum(at, 0)] + 1500), at, -1)
    assert np.array_equal(rows, expected) and (rows >= 0).sum() > 10_000
