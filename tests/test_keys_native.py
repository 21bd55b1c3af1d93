"""``model.lower_bounds``: the C search (``_keys.lower_bounds``, a gallop from each process's last
answer) gives every key the bound and the hit the NumPy search gives: keys in order, out of
order, several processes' keys interleaved, more processes than it remembers, null keys (-1),
keys past either end; and the launch join over it matches a join by two columns."""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard import model

if model._native_keys is None and os.environ.get("TRACEGUARD_REQUIRE_NATIVE") == "1":
    pytest.fail("traceguard._keys was not built (TRACEGUARD_REQUIRE_NATIVE=1)", pytrace=False)
pytestmark = pytest.mark.skipif(model._native_keys is None, reason="the C extension was not built")

SHIFT = 6  # the process above bit 6, as the join packs (pid, correlation id)


def _packed(pairs: list[tuple[int, int]]) -> np.ndarray:
    return np.array([-1 if p < 0 else p << SHIFT | v for p, v in pairs], dtype=np.int64)


@settings(max_examples=400, deadline=None)
@given(
    haystack=st.lists(st.tuples(st.integers(-1, 90), st.integers(0, 63)), min_size=1, max_size=80),
    needles=st.lists(st.tuples(st.integers(-1, 90), st.integers(0, 63)), max_size=150),
    order=st.sampled_from(["as drawn", "by id", "by process then id"]),
    shift=st.sampled_from([SHIFT, None]),
)
def test_c_search_is_numpys(
    haystack: list[tuple[int, int]], needles: list[tuple[int, int]], order: str, shift: int | None
) -> None:
    """Up to 91 processes (more than the 64 the C search remembers), each process's keys in
    order or not, interleaved: the same bounds and hits as ``np.searchsorted`` and a gather."""
    if order == "by id":
        needles = sorted(needles, key=lambda pv: pv[1])
    elif order == "by process then id":
        needles = sorted(needles)
    sorted_keys = np.sort(_packed(haystack))
    keys = _packed(needles)
    at, hit = model.lower_bounds(sorted_keys, keys, shift)
    want_at = np.minimum(np.searchsorted(sorted_keys, keys, side="left"), sorted_keys.size - 1)
    np.testing.assert_array_equal(at, want_at)
    np.testing.assert_array_equal(hit, sorted_keys[want_at] == keys)
    py_at, py_hit = model.python_lower_bounds(sorted_keys, keys, shift)
    np.testing.assert_array_equal(at, py_at)
    np.testing.assert_array_equal(hit, py_hit)


def test_c_search_of_long_sequences_gallops_to_the_same_answers() -> None:
    """A million keys of two processes interleaved, each in id order with gaps and misses, over
    two million calls (the shape of a per-op capture's block): far jumps both ways included."""
    rng = np.random.default_rng(29)
    calls = [np.sort(rng.choice(1 << 30, 1_000_000, replace=False)) | (p << 34) for p in (3, 11)]
    sorted_keys = np.sort(np.concatenate(calls)).astype(np.int64)
    mine = [c[rng.integers(0, 200_000) :][::2] for c in calls]
    keys = np.empty(2 * min(m.size for m in mine), dtype=np.int64)
    keys[0::2], keys[1::2] = (m[: keys.size // 2] for m in mine)
    keys[::101] += 1  # not a call's key
    keys[::997] = -1  # a null key
    keys[5000:5100] = keys[5000:5100][::-1].copy()  # a stretch out of order
    keys[-3:] = [1 << 40, 0, 1 << 40]  # past the last process, before the first key
    at, hit = model.lower_bounds(sorted_keys, keys, 34)
    want_at = np.minimum(np.searchsorted(sorted_keys, keys, side="left"), sorted_keys.size - 1)
    np.testing.assert_array_equal(at, want_at)
    np.testing.assert_array_equal(hit, sorted_keys[want_at] == keys)


def test_c_search_refuses_mismatched_buffers() -> None:
    """A bad call is a clear ValueError, not a read past a buffer."""
    sorted_keys = np.arange(4, dtype=np.int64)
    keys = np.arange(3, dtype=np.int64)
    with pytest.raises(ValueError, match="lower_bounds"):
        model._native_keys.lower_bounds(sorted_keys, keys, 6, np.empty(2, np.int64), np.empty(3, np.uint8))
    with pytest.raises(ValueError, match="lower_bounds"):
        model._native_keys.lower_bounds(sorted_keys, keys, 63, np.empty(3, np.int64), np.empty(3, np.uint8))
    outputs = (np.empty(3, np.int64), np.empty(3, np.uint8))
    with pytest.raises(ValueError, match="lower_bounds"):  # float keys of the right byte length
        model._native_keys.lower_bounds(sorted_keys.astype(float), keys, 6, *outputs)
    with pytest.raises(ValueError, match="lower_bounds"):  # bytes standing for int64 keys
        model._native_keys.lower_bounds(sorted_keys.view(np.uint8), keys, 6, *outputs)
    at, hit = np.empty(3, np.int64), np.empty(3, np.bool_)
    model._native_keys.lower_bounds(sorted_keys, keys, 6, at, hit.view(np.uint8))
    assert at.tolist() == [0, 1, 2] and hit.all()


@pytest.mark.parametrize("seed", range(4))
def test_launch_join_of_interleaved_processes_matches_a_join_by_two_columns(seed: int) -> None:
    """Two processes' launches and ops interleaved (a slice of a two-rank file), some ops with no
    launch, some null keys: ``launch_rows`` (packed keys, the C search) gives each op the row a
    join on (pid, correlation id) gives, the first call of a repeated key."""
    rng = np.random.default_rng(seed)
    n_calls = 400
    calls = model.conform(
        pl.DataFrame(
            {
                "pid": pl.Series(rng.choice([101, 202], n_calls), dtype=pl.Int32),
                "tid": pl.Series([1] * n_calls, dtype=pl.Int32),
                "correlation_id": np.sort(rng.integers(0, 300, n_calls)),
                "start": np.arange(n_calls) * 10,
                "name_id": pl.Series([3] * n_calls, dtype=pl.Int32),
            }
        ),
        model.API_CALLS_SCHEMA,
    )
    n_ops = 600
    pids = rng.choice([101, 202, None], n_ops, p=[0.45, 0.45, 0.1])
    ops = model.conform(
        pl.DataFrame(
            {
                "pid": pl.Series(list(pids), dtype=pl.Int32),
                "correlation_id": np.sort(rng.integers(0, 320, n_ops)),
            }
        ),
        model.GPU_OPS_SCHEMA,
    )
    firsts = (
        calls.with_row_index("row")
        .group_by("pid", "correlation_id")
        .agg(pl.col("row").min())
        .select("pid", "correlation_id", "row")
    )
    want = ops.select("pid", "correlation_id").join(firsts, on=["pid", "correlation_id"], how="left")["row"]
    assert model.launch_rows(ops, calls).cast(pl.Int64).to_list() == want.cast(pl.Int64).to_list()
