"""``report.rows``: the C loops (``_rows.plain_rows``, ``_rows.project_rows``) give the Python
ones' answers for any rows: values of every JSON-relevant type (NaN, infinities, bools, numpy
scalars, tuples, str subclasses), dicts nested at every depth, keys that are not str."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard.report import rows

if rows._native is None and os.environ.get("TRACEGUARD_REQUIRE_NATIVE") == "1":
    pytest.fail("traceguard.report._rows was not built (TRACEGUARD_REQUIRE_NATIVE=1)", pytrace=False)
pytestmark = pytest.mark.skipif(rows._native is None, reason="the C extension was not built")


class Name(str):
    """A str subclass: JSON-able, but not plain (it would come back as a str)."""


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.sampled_from([np.int64(3), np.float64(1.5), (1, 2), Name("x"), b"x"]),
)
KEYS = st.one_of(st.text(max_size=3), st.sampled_from([1, Name("k"), None]))
VALUES = st.recursive(SCALARS, lambda inner: st.dictionaries(KEYS, inner, max_size=3), max_leaves=12)
ROWS = st.lists(st.one_of(st.dictionaries(KEYS, VALUES, max_size=5), SCALARS), max_size=6)


@settings(max_examples=500, deadline=None)
@given(ROWS)
def test_plain_rows_is_pythons(candidate: list[Any]) -> None:
    assert rows.plain_rows(candidate) is rows.python_plain_rows(candidate)


PLAIN_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3)
)
#: Plain values as deep as a row may hold them: a row's dict (a step's phases) of dicts (a phase).
PLAIN_VALUES = st.one_of(
    PLAIN_SCALARS,
    st.dictionaries(
        st.text(max_size=3), st.one_of(PLAIN_SCALARS, st.dictionaries(st.text(max_size=3), PLAIN_SCALARS, max_size=3))
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.text(max_size=3), PLAIN_VALUES, max_size=4), max_size=5))
def test_rows_of_plain_values_are_plain(candidate: list[dict[str, Any]]) -> None:
    assert rows.plain_rows(candidate)


def test_plain_rows_depth_and_types() -> None:
    step = {"name": "step", "index": 1, "share": 0.5, "flag": True, "none": None, "phases": {"fwd": {"gpu_ns": 3}}}
    assert rows.plain_rows([step])
    assert not rows.plain_rows([{**step, "share": float("nan")}])
    assert not rows.plain_rows([{**step, "share": float("-inf")}])
    assert not rows.plain_rows([{**step, "index": np.int64(1)}])
    assert not rows.plain_rows([{**step, "phases": {"fwd": {"deeper": {"x": 1}}}}])  # three levels below
    assert not rows.plain_rows([step, (1, 2)])
    assert not rows.plain_rows([{1: "not a str key"}])


ROW_KEYS = st.sampled_from(["name", "index", "cpu_ns", "graph_ns", "other"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.dictionaries(ROW_KEYS, VALUES, max_size=5), max_size=6),
    st.lists(ROW_KEYS, unique=True, max_size=5).map(tuple),
    st.dictionaries(ROW_KEYS, SCALARS, max_size=3),
)
def test_project_rows_is_pythons(
    candidate: list[dict[str, Any]], keys: tuple[str, ...], defaults: dict[str, Any]
) -> None:
    native, python = rows.project_rows(candidate, keys, defaults), rows.python_project_rows(candidate, keys, defaults)
    assert [list(r.items()) for r in native] == [list(r.items()) for r in python]  # same keys in the same order
    for made, row in zip(native, candidate, strict=True):
        assert made is not row
        assert all(made[k] is (row[k] if k in row else defaults.get(k)) for k in keys)  # the objects, not copies


def test_project_rows_refuses_what_it_cannot_take() -> None:
    with pytest.raises(TypeError):
        rows.project_rows([{"a": 1}, [("a", 1)]], ("a",), {})  # type: ignore[list-item]
    with pytest.raises(TypeError):
        rows.project_rows([{"a": 1}], (1,), {})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rows.project_rows([{"a": 1}], ["a"], {})  # type: ignore[arg-type]
