"""The report document's JSON-safe pass: the orjson fast path gives exactly what the plain
recursive pass gives, and hands anything it would change to that pass."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard.report.document import _clean, _json_safe

_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8)
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.dictionaries(st.text(max_size=6), _VALUES, max_size=6))
def test_the_fast_path_is_the_plain_pass(doc: dict[str, Any]) -> None:
    assert _json_safe(doc) == _clean(doc)


def test_nan_and_infinities_become_null_and_tuples_lists() -> None:
    doc = {"a": math.nan, "b": [math.inf, -math.inf, 1.5], "c": (1, (2.0, None)), "d": {"e": 2**63 - 1}}
    assert _json_safe(doc) == {"a": None, "b": [None, None, 1.5], "c": [1, [2.0, None]], "d": {"e": 2**63 - 1}}


def test_what_orjson_would_change_goes_to_the_plain_pass() -> None:
    when = datetime(2026, 11, 26, tzinfo=UTC)
    for doc in ({"rank": {3: 1.0}}, {"when": when}, {"big": 2**70}):
        assert _json_safe(doc) == _clean(doc)
    assert _json_safe({"when": when})["when"] is when  # not turned into a string


def test_numpy_scalars_become_python_numbers() -> None:
    out = _json_safe({"n": np.int64(7), "x": np.float64("nan"), "y": np.float32(0.5)})
    assert out == {"n": 7, "x": None, "y": 0.5} and type(out["n"]) is int


_ROW_VALUES = _VALUES | st.sampled_from([np.int64(3), np.float64("nan"), (1, 2)])
_ROWS = st.lists(st.dictionaries(st.text(max_size=6), _ROW_VALUES, max_size=5), max_size=6)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(steps=_ROWS, by_type_steps=_ROWS, other=_VALUES)
def test_step_rows_skip_the_round_trip_only_when_it_would_not_change_them(
    steps: list[dict[str, Any]], by_type_steps: list[dict[str, Any]], other: Any
) -> None:
    doc = {"ranks": [{"steps": steps, "collectives_by_type": {"steps": by_type_steps}, "other": other}]}
    before = repr(doc)
    out = _json_safe(doc)
    assert out == _clean(doc)
    assert repr(doc) == before  # the document it was given is left as it was


def test_plain_step_rows_are_kept_as_they_are() -> None:
    rows = [{"index": 0, "nccl_share": 0.5, "phases": {"forward": {"cpu_ns": 3}}, "lateness_ns": None}]
    out = _json_safe({"ranks": [{"steps": rows, "collectives_by_type": {"steps": []}}]})
    assert out["ranks"][0]["steps"] is rows
    nan_rows = [{"index": 0, "nccl_share": math.nan}]
    out = _json_safe({"ranks": [{"steps": nan_rows}]})
    assert out["ranks"][0]["steps"] == [{"index": 0, "nccl_share": None}]
