"""Distributions over ranks and rank × step matrices (metrics/distributions.py), against plain Python
computations of their definitions: sorted lists, ``statistics``, hand-made bins."""

from __future__ import annotations

import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard.metrics.distributions import HISTOGRAM_BINS, distribution, rank_step_matrix
from traceguard.metrics.rank import RankResult

values = st.dictionaries(
    st.integers(min_value=0, max_value=4095),
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=60,
)


def _percentile(data: list[float], q: float) -> float:
    ordered = sorted(data)
    at = (len(ordered) - 1) * q
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


@settings(max_examples=200, deadline=None)
@given(values)
def test_distribution_is_its_definition(by_rank: dict[int, float]) -> None:
    found = distribution(by_rank)
    data = list(by_rank.values())
    low, high = min(data), max(data)
    assert found["ranks"] == len(data)
    assert found["min"] == low and found["max"] == high
    assert found["p50"] == _approx(statistics.median(data), data)
    assert found["p95"] == _approx(_percentile(data, 0.95), data)
    assert found["min_rank"] == min(r for r, v in by_rank.items() if v == low)
    assert found["max_rank"] == min(r for r, v in by_rank.items() if v == high)
    edges, counts = found["histogram"]["edges"], found["histogram"]["counts"]
    assert sum(counts) == len(data) and len(edges) == len(counts) + 1
    if high > low:
        assert len(counts) == HISTOGRAM_BINS and edges[0] == low and edges[-1] == high
        for value in data:  # each value in its bin: [edge, next edge), the last bin closed
            at = next(i for i in range(len(counts)) if value < edges[i + 1] or i == len(counts) - 1)
            assert edges[at] <= value
    else:
        assert counts == [len(data)]


def _approx(expected: float, data: list[float]) -> object:
    import pytest

    scale = max(1.0, max(abs(v) for v in data))
    return pytest.approx(expected, abs=1e-9 * scale)


def test_no_known_value_is_an_empty_distribution() -> None:
    assert distribution({}) == {"ranks": 0}


def _rank(rank: int, steps: list[tuple[int, float | None]]) -> RankResult:
    return RankResult(
        rank=rank,
        metrics={},
        null_reasons={},
        steps=[{"index": i, "nccl_share": v} for i, v in steps],
        collectives=None,  # type: ignore[arg-type]
        gpu_to_cpu_offenders=[],
    )


def test_matrix_cells_are_the_ranks_own_steps_and_null_where_missing() -> None:
    ranks = [_rank(0, [(0, 0.1), (1, 0.2)]), _rank(3, [(1, 0.5), (2, None)])]
    found = rank_step_matrix(ranks, ["nccl_share"])
    assert found["ranks"] == [0, 3] and found["indices"] == [0, 1, 2] and not found["binned"]
    assert found["fields"]["nccl_share"] == [[0.1, 0.2, None], [None, 0.5, None]]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(0, 999), st.floats(0, 1, allow_nan=False)), max_size=40, unique_by=lambda t: t[0]
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(min_value=1, max_value=30),
)
def test_binned_cells_are_the_means_of_their_index_ranges(steps: list[list[tuple[int, float]]], columns: int) -> None:
    ranks = [_rank(r, s) for r, s in enumerate(steps)]
    found = rank_step_matrix(ranks, ["nccl_share"], max_columns=columns)
    indices = sorted({i for s in steps for i, _ in s})
    if not indices:
        assert found["indices"] == []
        return
    assert len(found["indices"]) <= columns
    width = found.get("bin_width", 1) if found["binned"] else 1
    assert found["binned"] == (len(indices) > columns)
    for row, own in zip(found["fields"]["nccl_share"], steps, strict=True):
        for at, start in enumerate(found["indices"]):
            inside = [v for i, v in own if start <= i < start + width]
            expected = statistics.fmean(inside) if inside else None
            assert (row[at] is None) == (expected is None)
            if expected is not None:
                assert math.isclose(row[at], expected, rel_tol=1e-9, abs_tol=1e-12)
