"""``intervals.running_max``: the C loop (``_breakdown.running_max``) gives NumPy's
``maximum.accumulate`` exactly, for int64 of any sign and size, contiguous or strided; other
dtypes go to NumPy."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard.metrics import intervals

if intervals._native is None and os.environ.get("TRACEGUARD_REQUIRE_NATIVE") == "1":
    pytest.fail("traceguard.metrics._breakdown was not built (TRACEGUARD_REQUIRE_NATIVE=1)", pytrace=False)
pytestmark = pytest.mark.skipif(intervals._native is None, reason="the C extension was not built")

INT64 = st.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(INT64, max_size=300), step=st.integers(1, 3))
def test_running_max_is_numpys(values: list[int], step: int) -> None:
    array = np.array(values, dtype=np.int64)[::step]
    out = intervals.running_max(array)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.maximum.accumulate(array))


def test_running_max_of_other_dtypes_is_numpys() -> None:
    for array in (np.array([3, 1, 5, 2], dtype=np.int32), np.array([0.5, -1.0, 2.5]), np.array([[1, 0], [0, 2]])):
        out = intervals.running_max(array)
        assert out.dtype == array.dtype
        np.testing.assert_array_equal(out, np.maximum.accumulate(array))


def test_running_max_checks_its_buffers() -> None:
    assert intervals._native is not None
    with pytest.raises(ValueError, match="one length"):
        intervals._native.running_max(np.arange(4, dtype=np.int64), np.empty(3, dtype=np.int64))
