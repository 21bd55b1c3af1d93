"""Range nesting (``model.nest_ranges``): the binary search per level gives each range the parent
the per-level forward-fill expression gives, on nested push/pop ranges, overlapping start/end
ranges and many threads; and on a real per-op ``emit_nvtx`` capture."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from tests.conftest import public_nsys
from traceguard import model
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite


def _by_expression(ranges: pl.DataFrame) -> pl.DataFrame:
    """nest_ranges with the parents from the expression (its fallback) instead of the search."""
    nested = model.nest_ranges(ranges)
    if nested.height == 0:
        return nested
    return nested.with_columns(model._parents_by_levels(int(nested["depth"].max() or 0)).alias("parent"))


@st.composite
def _ranges(draw: st.DrawFn) -> pl.DataFrame:
    rows = []
    for thread in range(draw(st.integers(1, 4))):
        clock = 0
        open_ends: list[int] = []
        for _ in range(draw(st.integers(0, 40))):
            step = draw(st.integers(0, 5))
            clock += step
            while open_ends and open_ends[-1] <= clock:
                open_ends.pop()
            limit = open_ends[-1] if open_ends and draw(st.booleans()) else clock + 60
            end = draw(st.integers(clock, max(clock, limit)))  # nested in the open one, or not
            open_ends.append(end)
            rows.append((thread % 2, thread, clock, end))
    frame = pl.DataFrame(rows, schema=["pid", "tid", "start", "end"], orient="row")
    return frame.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("range_id")).cast(
        {"pid": pl.Int32, "tid": pl.Int32, "start": pl.Int64, "end": pl.Int64}
    )


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_ranges())
def test_the_search_gives_the_expression_s_parents(ranges: pl.DataFrame) -> None:
    got = model.nest_ranges(ranges)
    assert_frame_equal(got, _by_expression(ranges))


def test_a_thread_s_first_ranges_have_no_parent_of_another_thread() -> None:
    ranges = pl.DataFrame(
        {"pid": [1, 1, 1], "tid": [1, 2, 2], "start": [0, 5, 6], "end": [100, 50, 7], "range_id": [0, 1, 2]}
    ).cast({"pid": pl.Int32, "tid": pl.Int32})
    got = model.nest_ranges(ranges).sort("range_id")
    assert got["depth"].to_list() == [0, 0, 1] and got["parent"].to_list() == [None, None, 1]


def test_per_op_nvtx_ranges_of_a_real_capture(unpacked) -> None:
    """nsys-ai's 2-GPU capture (PyTorch's emit_nvtx, 19 k ranges, one per op): the 696 it keeps
    nest three deep (NCCL's calls in c10d's annotations in ``record_param_comms``)."""
    ranges = read_nsys_sqlite(unpacked(public_nsys("mfu_2gpu_before"))).ranges
    plain = ranges.drop("depth", "parent")
    assert ranges.height == 696
    assert int(ranges["depth"].max()) == 2 and ranges["parent"].null_count() < ranges.height
    assert_frame_equal(
        model.nest_ranges(plain).select(ranges.columns).sort("range_id"),
        _by_expression(plain).select(ranges.columns).sort("range_id"),
    )
    assert np.all(ranges.filter(pl.col("depth") == 0)["parent"].is_null().to_numpy())


def test_nesting_a_frame_handed_over_takes_it_and_nests_it_alike(unpacked) -> None:
    """``nest_taken`` (the nsys reader hands its ranges over, so the unsorted frame is let go
    once sorted) takes the frame out of the holder and gives what ``nest_ranges`` gives."""
    plain = read_nsys_sqlite(unpacked(public_nsys("mfu_2gpu_before"))).ranges.drop("depth", "parent")
    holder = [plain.clone()]
    got = model.nest_taken(holder)
    assert holder == []
    assert_frame_equal(got, model.nest_ranges(plain))
