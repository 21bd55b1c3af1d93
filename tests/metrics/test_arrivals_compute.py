"""``arrivals._against_compute``: each NCCL kernel's time with no compute beside it and the end of
the last compute overlapping it, taken over only the segments some kernel overlaps (when they
are few), equal the sums over every segment, and the overlap by brute force."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard.metrics import arrivals


def _brute(start: int, end: int, segments: list[tuple[int, int]]) -> tuple[int, int]:
    overlap = sum(max(0, min(e, end) - max(s, start)) for s, e in segments)
    meeting = [(s, e) for s, e in segments if s < end and e > start]
    return end - start - overlap, min(meeting[-1][1], end) if meeting else start


@settings(max_examples=400, deadline=None)
@given(
    cuts=st.lists(st.integers(0, 2_000), unique=True, max_size=120),
    kernels=st.lists(st.tuples(st.integers(-50, 2_050), st.integers(0, 400)), max_size=30),
    empty_at=st.lists(st.integers(0, 59), max_size=3),
)
def test_against_compute_is_the_sum_over_every_segment(
    cuts: list[int], kernels: list[tuple[int, int]], empty_at: list[int]
) -> None:
    bounds = sorted(cuts)[: len(cuts) // 2 * 2]
    seg_start = np.array(bounds[0::2], dtype=np.int64)
    seg_end = np.array(bounds[1::2], dtype=np.int64)
    for k in empty_at:  # zero-length segments stay sorted and disjoint
        if k < seg_start.size:
            seg_end[k] = seg_start[k]
    start = np.array([s for s, _ in kernels], dtype=np.int64)
    end = start + np.array([d for _, d in kernels], dtype=np.int64)
    exposed, until = arrivals._against_compute(start, end, seg_start, seg_end)
    every = arrivals._against_all(start, end, seg_start, seg_end)
    np.testing.assert_array_equal(exposed, every[0])
    np.testing.assert_array_equal(until, every[1])
    segments = list(zip(seg_start.tolist(), seg_end.tolist(), strict=True))
    for i, (s, e) in enumerate(zip(start.tolist(), end.tolist(), strict=True)):
        assert (int(exposed[i]), int(until[i])) == _brute(s, e, segments)
