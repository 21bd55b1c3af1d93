"""A lane reduced a chunk at a time (:class:`timeline.SegmentReducer`) equals the one-shot
:func:`timeline.reduce_segments` and a plain reference of the rule: the ``limit - 1`` largest gaps
stay open, the earlier among equal gaps; busy time and ``first … last (n)`` labels of the runs.
Small integer coordinates make many equal gaps, so ties sit at the cut."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard.metrics.timeline import SegmentReducer, reduce_segments

Lane = tuple[np.ndarray, np.ndarray, np.ndarray, list[str] | None]


def _reference(start: list[int], end: list[int], limit: int, labels: list[str] | None) -> Lane:
    """The rule written plainly: gap i (between segments i and i + 1) ordered by (largest,
    earliest); the first ``limit - 1`` stay open; each run between open gaps is one segment."""
    n = len(start)
    gaps = [start[i + 1] - end[i] for i in range(n - 1)]
    open_gaps = set(sorted(range(n - 1), key=lambda i: (-gaps[i], i))[: limit - 1])
    runs: list[tuple[int, int]] = []
    head = 0
    for i in range(n):
        if i == n - 1 or i in open_gaps:
            runs.append((head, i))
            head = i + 1
    out_labels = None
    if labels is not None:
        out_labels = [labels[h] if h == t else f"{labels[h]} … {labels[t]} ({t - h + 1})" for h, t in runs]
    return (
        np.array([start[h] for h, _ in runs], dtype=np.int64),
        np.array([end[t] for _, t in runs], dtype=np.int64),
        np.array([sum(end[j] - start[j] for j in range(h, t + 1)) for h, t in runs], dtype=np.int64),
        out_labels,
    )


def _chunked(start: np.ndarray, end: np.ndarray, limit: int, labels: list[str] | None, cuts: list[int]) -> Lane:
    """Feed the lane in the chunks between ``cuts`` (sorted; repeated cuts give empty chunks)."""
    reducer = SegmentReducer(limit, labelled=labels is not None)
    bounds = [0, *cuts, start.size]
    for lo, hi in itertools.pairwise(bounds):
        reducer.feed(start[lo:hi], end[lo:hi], labels[lo:hi] if labels is not None else None)
        assert reducer.gap.size <= limit - 1  # only candidate open gaps are held
    return reducer.result()


def _assert_same(got: Lane, want: Lane) -> None:
    for g, w in zip(got[:3], want[:3], strict=True):
        assert g.dtype == np.int64 and g.tolist() == w.tolist()
    assert got[3] == want[3]


@st.composite
def _lanes(draw: st.DrawFn) -> tuple[list[int], list[int], int, list[str] | None, list[int]]:
    n = draw(st.integers(0, 40))
    # Gaps of 0 (touching) to 3 ns and lengths of 0 to 3 ns: many equal gaps.
    gaps = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    start, end, t = [], [], draw(st.integers(-5, 5))
    for gap, length in zip(gaps, lengths, strict=True):
        t += gap
        start.append(t)
        t += length
        end.append(t)
    limit = draw(st.integers(1, n + 3))
    labels = [f"s{i}" for i in range(n)] if draw(st.booleans()) else None
    # Cut points anywhere, repeated ones included: empty chunks, 1-segment chunks, one chunk.
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=12)))
    return start, end, limit, labels, cuts


@settings(max_examples=600, deadline=None)
@given(_lanes())
def test_chunked_equals_one_shot_equals_reference(
    lane: tuple[list[int], list[int], int, list[str] | None, list[int]],
) -> None:
    start, end, limit, labels, cuts = lane
    s, e = np.array(start, dtype=np.int64), np.array(end, dtype=np.int64)
    want = _reference(start, end, limit, labels)
    _assert_same(reduce_segments(s, e, limit, labels), want)
    _assert_same(_chunked(s, e, limit, labels, cuts), want)
    _assert_same(_chunked(s, e, limit, labels, list(range(len(start)))), want)  # one segment per chunk


def test_equal_gaps_keep_the_earliest_open() -> None:
    # Six segments, five gaps all of 2 ns: limit 3 keeps gaps 0 and 1 open.
    start = np.arange(6, dtype=np.int64) * 3
    s, e, busy, labels = reduce_segments(start, start + 1, 3, list("abcdef"))
    assert s.tolist() == [0, 3, 6] and e.tolist() == [1, 4, 16] and busy.tolist() == [1, 1, 4]
    assert labels == ["a", "b", "c … f (4)"]
    # A larger gap later wins over the earlier equal ones; ties then go to the earliest.
    start[5] += 1
    s, _, _, labels = reduce_segments(start, start + 1, 3, list("abcdef"))
    assert s.tolist() == [0, 3, 16] and labels == ["a", "b … e (4)", "f"]


def test_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SegmentReducer(0)
    reducer = SegmentReducer(4)
    reducer.feed(np.array([0, 10]), np.array([5, 20]))
    with pytest.raises(ValueError, match="before the last end"):
        reducer.feed(np.array([19]), np.array([30]))
    with pytest.raises(ValueError, match="labelled"):
        reducer.feed(np.array([40]), np.array([50]), ["x"])
    with pytest.raises(ValueError, match="2 labels for 1"):
        SegmentReducer(4, labelled=True).feed(np.array([0]), np.array([1]), ["x", "y"])
    s, e, busy, labels = SegmentReducer(4, labelled=True).result()
    assert s.size == e.size == busy.size == 0 and labels == []


def test_big_lane_chunked_equals_one_shot() -> None:
    """2 M segments with gaps of 1 to 20 ns (about 100 k of each: ties at the cut), limit 1500:
    fed in random chunks (empty and 1-segment ones among them) equals one shot, and the open gaps
    are the first 1499 by (largest, earliest) of all gaps."""
    rng = np.random.default_rng(7)
    n, limit = 2_000_000, 1500
    gaps = rng.integers(1, 21, n)
    lengths = rng.integers(0, 1000, n)
    start = np.cumsum(gaps + np.concatenate([[0], lengths[:-1]])).astype(np.int64)
    end = start + lengths
    labels = [f"k{i}" for i in range(n)]
    one_shot = reduce_segments(start, end, limit, labels)
    sizes = np.concatenate([rng.integers(0, 300_000, 12), [0, 1, 0, 1, 1]])
    cuts = np.sort(np.minimum(np.cumsum(rng.permutation(sizes)), n)).tolist()
    _assert_same(_chunked(start, end, limit, labels, cuts), one_shot)
    # The rule on all gaps at once, vectorized: sort by (-gap, position), keep limit - 1 open.
    all_gaps = start[1:] - end[:-1]
    opened = np.sort(np.lexsort((np.arange(n - 1), -all_gaps))[: limit - 1])
    heads = np.concatenate([[0], opened + 1])
    tails = np.append(opened, n - 1)
    busy = np.add.reduceat(end - start, heads)
    assert one_shot[0].tolist() == start[heads].tolist() and one_shot[1].tolist() == end[tails].tolist()
    assert one_shot[2].tolist() == busy.tolist() and int(busy.sum()) == int((end - start).sum())
    assert one_shot[3] == [
        f"k{h}" if h == t else f"k{h} … k{t} ({t - h + 1})" for h, t in zip(heads.tolist(), tails.tolist(), strict=True)
    ]
