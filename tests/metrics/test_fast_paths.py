"""The vectorized fast paths of the metrics agree with their plain Polars formulations.

``union_ns`` and ``union_segments`` (NumPy running max over packed group bands) against the
sort/cum_max/group_by version; the packed-key launch join against the two-column join, including repeated keys.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from traceguard import model
from traceguard.metrics import intervals, steps


@pytest.mark.parametrize("seed", range(40))
def test_union_ns_matches_polars(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    start = rng.integers(-1_000, 10_000, n)
    groups = pl.Series(rng.integers(0, 5, n))
    if seed % 3 == 0:
        groups = groups.set(pl.Series(rng.random(n) < 0.2), None)
    frame = pl.DataFrame(
        {
            "g": groups,
            "h": rng.integers(-2, 2, n),
            "name": rng.choice(["a", "b"], n),
            "start": start,
            "end": start + rng.integers(0, 500, n),
        }
    )
    for by in (["g"], ["g", "h"], ["name"], ["name", "g"]):
        fast = intervals.union_ns(frame, by).collect().sort(by, nulls_last=True)
        slow = intervals._union_ns_polars(frame, by).collect().sort(by, nulls_last=True)
        assert fast.equals(slow.select(fast.columns)), by


@pytest.mark.parametrize("seed", range(40))
def test_union_segments_match_polars(seed: int) -> None:
    """The segments themselves, not only their lengths: the same keys, starts and ends, in the
    same order, with null keys, tied starts, nested and touching intervals."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    start = rng.integers(-1_000, 3_000 if seed % 2 else 10_000, n)
    groups = pl.Series(rng.integers(0, 5, n))
    if seed % 3 == 0:
        groups = groups.set(pl.Series(rng.random(n) < 0.2), None)
    frame = pl.DataFrame(
        {
            "g": groups,
            "name": rng.choice(["AllReduce", "Broadcast"], n),
            "device": rng.integers(0, 2, n).astype(np.int32),
            "start": start,
            "end": start + rng.integers(0, 500, n),
        }
    )
    for by in (["g"], ["name", "device"], ["g", "name", "device"]):
        fast = intervals.union_segments(frame, by).collect()
        slow = intervals._union_segments_polars(frame, by).collect()
        assert fast.schema == slow.schema, by
        assert fast.equals(slow), by
        # Disjoint within a group, and every interval inside one segment of its group.
        ordered = fast.with_columns(pl.col("end").shift(1).over(by).alias("previous_end"))
        assert ordered.filter(pl.col("start") <= pl.col("previous_end")).height == 0, by


def _frames(repeat_key: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    ops = pl.DataFrame({"pid": [1, 1, 2, None, 1], "correlation_id": [10, 11, 10, 10, None], "start": [5, 6, 7, 8, 9]})
    calls = pl.DataFrame(
        {
            "pid": [1, 2, 1, 1, None],
            "tid": [3, 4, 3, 5, 6],
            "correlation_id": [10, 10, 12, 11 if not repeat_key else 10, 10],
            "start": [1, 2, 3, 4, 5],
            "name_id": [7, 8, 9, 10, 11],
        }
    )
    return model.conform(ops, model.GPU_OPS_SCHEMA), model.conform(calls, model.API_CALLS_SCHEMA)


def _two_column(ops: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    table = (
        calls.filter(pl.col("correlation_id").is_not_null())
        .select(
            "pid",
            "correlation_id",
            pl.col("start").alias("launch_start"),
            pl.col("tid").alias("launch_tid"),
            pl.col("name_id").alias("launch_name_id"),
        )
        .unique(["pid", "correlation_id"], keep="first", maintain_order=True)
    )
    return ops.join(table, on=["pid", "correlation_id"], how="left", maintain_order="left")


@pytest.mark.parametrize("repeat_key", [False, True])
def test_launch_join_matches_two_column_join(repeat_key: bool) -> None:
    ops, calls = _frames(repeat_key)
    got = steps.launches(ops, calls)
    assert got.equals(_two_column(ops, calls))


@pytest.mark.parametrize("offset", [1 << 32, 1 << 40, -(1 << 40)])
def test_launch_join_packs_ids_past_32_bits(offset: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Correlation ids past 2^32 (or below 0) whose span fits still take the packed search (a
    merged or scaled export: the per-op NVTX shape's ids reach 6.6e9), with the two-column
    join's answer."""
    for repeat_key in (False, True):
        ops, calls = _frames(repeat_key)
        ops = ops.with_columns(pl.col("correlation_id") + offset)
        calls = calls.with_columns(pl.col("correlation_id") + offset)
        assert steps._packable(ops) and model._key_packing(ops, calls) is not None
        with monkeypatch.context() as m:
            m.setattr(model, "_launch_rows_packed", lambda *a: pytest.fail("not packed"))
            with pytest.raises(pytest.fail.Exception):
                steps.launches(ops, calls)
        assert steps.launches(ops, calls).equals(_two_column(ops, calls))


def test_launch_join_out_of_packing_range() -> None:
    """Correlation ids spanning more than the packed key holds: the two-column join."""
    ops, calls = _frames(False)
    ops = ops.with_columns(
        pl.when(pl.col("start") > 6).then(1 << 62).otherwise(pl.col("correlation_id")).alias("correlation_id")
    )
    calls = calls.with_columns(
        pl.when(pl.col("start") > 2).then(1 << 62).otherwise(pl.col("correlation_id")).alias("correlation_id")
    )
    assert not steps._packable(ops) and model._key_packing(ops, calls) is None
    assert steps.launches(ops, calls).equals(_two_column(ops, calls))
