"""The bulk paths of step inference give what the one-at-a-time definitions give.

``boundaries`` takes the marks of iterations that repeat the one before exactly in bulk, and
``_settle`` moves boundaries whose windows do not touch all at once; both must equal the plain
loops (``_align`` per iteration, ``_settle_one_by_one``) on any sequence. ``_busiest_device``
tells one device without a group-by: it must pick what the group-by picks.
"""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.conftest import needs_native
from traceguard.metrics import step_inference as si


def _boundaries_by_loop(names: np.ndarray, start: np.ndarray, end: np.ndarray, period: int) -> list[tuple[int, int]]:
    """``boundaries`` as first written: one ``_align`` per iteration, then the settling loop."""
    n = start.size
    ended = np.maximum.accumulate(end)
    prefix = min(n, max(si.SEARCH_PREFIX, 2 * period))
    first = si._phase(si._idle_at(start, ended, 0, prefix), period, None)
    slack = si._slack(period)
    marks = [first]
    while True:
        target = marks[-1] + period
        lo, hi = max(marks[-1] + 1, target - slack), min(n, target + slack + 1)
        if target >= n or lo >= hi:
            break
        marks.append(si._align(names, marks[-1], target, lo, hi))
    marks = si._settle_one_by_one(marks, start, ended)
    steps = list(itertools.pairwise(marks))
    if n - marks[-1] >= period - slack:
        steps.append((marks[-1], n))
    return steps


@st.composite
def sequences(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """An iteration of ``period`` kernel names repeated, with some names changed, kernels
    dropped or added here and there, and random durations and gaps."""
    period = draw(st.integers(2, 40))
    repeats = draw(st.integers(2, 30))
    base = draw(st.lists(st.integers(0, 12), min_size=period, max_size=period))
    names = np.array(base * repeats, dtype=np.int64)
    for _ in range(draw(st.integers(0, 8))):
        at = draw(st.integers(0, names.size - 1))
        edit = draw(st.sampled_from(["change", "drop", "add"]))
        if edit == "change":
            names[at] = draw(st.integers(0, 12))
        elif edit == "drop" and names.size > 2 * period:
            names = np.delete(names, at)
        elif edit == "add":
            names = np.insert(names, at, draw(st.integers(0, 12)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gaps = rng.integers(0, 50, names.size)
    durations = rng.integers(1, 100, names.size)
    start = np.cumsum(gaps + np.concatenate([[0], durations[:-1]]))
    return names, start.astype(np.int64), (start + durations).astype(np.int64), period


@settings(max_examples=300, deadline=None)
@given(sequences())
def test_boundaries_equal_the_one_by_one_loop(sequence: tuple[np.ndarray, np.ndarray, np.ndarray, int]) -> None:
    names, start, end, period = sequence
    assert si.boundaries(names, start, end, period) == _boundaries_by_loop(names, start, end, period)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(2 * si.SETTLE_KERNELS + 1, 40), min_size=1, max_size=30), st.integers(0, 2**32 - 1))
def test_settle_at_once_equals_one_by_one(spacing: list[int], seed: int) -> None:
    """Boundaries as ``boundaries`` makes them: more than a settling window apart (closer ones
    are settled one by one by ``_settle`` itself)."""
    marks = np.cumsum(spacing).tolist()
    marks = [m - marks[0] + spacing[0] % 3 for m in marks]  # the first one at 0, 1 or 2
    rng = np.random.default_rng(seed)
    n = max(marks) + rng.integers(1, 5)
    start = np.cumsum(rng.integers(0, 30, n)).astype(np.int64)
    end = start + rng.integers(1, 60, n)
    ended = np.maximum.accumulate(end)
    assert si._settle(marks, start, ended) == si._settle_one_by_one(marks, start, ended)


def _busiest_by_group_by(kernels: pl.DataFrame) -> pl.DataFrame:
    """``_busiest_device`` as first written: the device with most kernels (ties: the lowest, a
    null last), by a group-by, whatever the column holds."""
    counts = kernels.group_by("device").len().sort(["len", "device"], descending=[True, False], nulls_last=True)
    device = counts["device"][0]
    chosen = kernels.filter(pl.col("device").is_null() if device is None else pl.col("device") == device)
    return chosen if chosen["start"].is_sorted() else chosen.sort("start")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 2)), min_size=1, max_size=40), st.booleans())
def test_the_busiest_device_is_the_group_by_s(devices: list[int | None], shuffled: bool) -> None:
    starts = list(range(len(devices)))
    kernels = pl.DataFrame(
        {"pid": [7] * len(devices), "device": devices, "start": starts[::-1] if shuffled else starts},
        schema={"pid": pl.Int32, "device": pl.Int32, "start": pl.Int64},
    )
    assert si._busiest_device(kernels).equals(_busiest_by_group_by(kernels))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 2)), st.one_of(st.none(), st.integers(0, 4))), max_size=40),
    st.booleans(),
    st.integers(1, 12),
)
def test_the_names_searched_are_the_sequences_prefix(
    rows: list[tuple[int | None, int | None]], shuffled: bool, prefix: int
) -> None:
    """``_searched_names`` reads the kernels column by column: what it gives is the prefix of the
    sequence ``_busiest_device`` builds whole, and it gives nothing only where that sequence had
    to be sorted; where it did not, ``_ordered_sequence`` is that sequence's start, end and name."""
    starts = list(range(len(rows)))
    kernels = pl.DataFrame(
        {
            "pid": [7] * len(rows),
            "device": [device for device, _name in rows],
            "start": starts[::-1] if shuffled else starts,
            "end": [start + 1 for start in starts],
            "name_id": [name for _device, name in rows],
        },
        schema={"pid": pl.Int32, "device": pl.Int32, "start": pl.Int64, "end": pl.Int64, "name_id": pl.Int32},
    )
    original = si.SEARCH_PREFIX
    si.SEARCH_PREFIX = prefix
    try:
        choice = si._choice(kernels.lazy())
        searched = si._searched_names(kernels.lazy(), choice)
    finally:
        si.SEARCH_PREFIX = original
    several, device = si._busiest(kernels["device"])
    chosen = kernels.filter(si._on(device)) if several else kernels
    if not chosen["start"].is_sorted():
        assert searched is None and not choice.ordered
        return
    sequence = si._busiest_device(kernels)
    assert searched is not None
    assert searched.tolist() == sequence["name_id"].fill_null(-1).head(prefix).to_list()
    # The sequence taken in order is the whole one's columns that inference reads.
    assert si._ordered_sequence(kernels.lazy(), choice).equals(sequence.select("start", "end", "name_id"))


@st.composite
def align_calls(draw: st.DrawFn) -> tuple[np.ndarray, int, int, int, int, bool]:
    """``_align``'s arguments as ``boundaries`` passes them: names (a short pattern of few names
    repeated with a few changed, so that ties of score and of distance are common, or any names),
    a mark, a target ahead of it (before the end where the kernels there are known to differ),
    and a window around the target from after the mark."""
    if draw(st.booleans()):
        pattern = draw(st.lists(st.integers(0, 2), min_size=1, max_size=4))
        names = (pattern * 90)[: draw(st.integers(2, 90))]
        for _ in range(draw(st.integers(0, 4))):
            names[draw(st.integers(0, len(names) - 1))] = draw(st.integers(0, 3))
    else:
        names = draw(st.lists(st.integers(0, 4), min_size=2, max_size=90))
    n = len(names)
    differs = draw(st.booleans())
    mark = draw(st.integers(0, n - 2))
    target = draw(st.integers(mark + 1, (n - 1) if differs else mark + 45))
    lo = max(mark + 1, target - draw(st.integers(0, 12)))
    hi = min(n, target + draw(st.integers(1, 12)))
    dtype = draw(st.sampled_from([np.int32, np.int64]))
    return np.array(names, dtype=dtype), mark, target, lo, max(hi, lo + 1), differs


@settings(max_examples=1000, deadline=None, derandomize=True)
@given(call=align_calls())
def test_the_c_align_is_the_numpy_one(call: tuple[np.ndarray, int, int, int, int, bool]) -> None:
    """``_align`` in C (``_breakdown.align``) gives the NumPy version's position for int32 and
    int64 names, near the ends of the sequence included."""
    needs_native(getattr(si._native, "align", None) is not None, "traceguard.metrics._breakdown")
    names, mark, target, lo, hi, differs = call
    assume(hi <= names.size)  # else no window is left after the mark: boundaries stops there
    got = si._align(names, mark, target, lo, hi, differs=differs)
    saved = si._native
    si._native = None
    try:
        expected = si._align(names, mark, target, lo, hi, differs=differs)
    finally:
        si._native = saved
    assert got == expected
