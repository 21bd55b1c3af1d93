"""``metrics.table_rows``: the C builder (``_breakdown.dicts_from_columns``) gives the Python
one's dicts (keys in order, the columns' own objects), and ``frame_dicts`` is Polars'
``to_dicts`` for every column type the step tables hold."""

from __future__ import annotations

import os
from typing import Any

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceguard.metrics import table_rows

native = getattr(table_rows._native, "dicts_from_columns", None)
if native is None and os.environ.get("TRACEGUARD_REQUIRE_NATIVE") == "1":
    pytest.fail("traceguard.metrics._breakdown was not built (TRACEGUARD_REQUIRE_NATIVE=1)", pytrace=False)

VALUES = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@pytest.mark.skipif(native is None, reason="the C extension was not built")
@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(st.text(max_size=4), unique=True, max_size=6),
    rows=st.integers(0, 12),
    data=st.data(),
)
def test_dicts_from_columns_is_pythons(keys: list[str], rows: int, data: st.DataObject) -> None:
    columns = [data.draw(st.lists(VALUES, min_size=rows, max_size=rows)) for _ in keys]
    made = table_rows.dicts_from_columns(keys, columns)
    want = table_rows.python_dicts_from_columns(keys, columns)
    assert [list(r.items()) for r in made] == [list(r.items()) for r in want]
    for row, values in zip(made, zip(*columns, strict=True), strict=True):
        assert all(row[k] is v for k, v in zip(keys, values, strict=True))  # the objects, not copies


@pytest.mark.skipif(native is None, reason="the C extension was not built")
def test_dicts_from_columns_refuses_what_it_cannot_take() -> None:
    with pytest.raises(ValueError):
        table_rows.dicts_from_columns(["a", "b"], [[1, 2], [3]])
    with pytest.raises(ValueError):
        table_rows.dicts_from_columns(["a"], [[1], [2]])
    with pytest.raises(TypeError):
        table_rows.dicts_from_columns([1], [[1]])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        table_rows.dicts_from_columns(["a"], [(1,)])  # type: ignore[list-item]


def test_python_dicts_from_columns_checks_its_columns() -> None:
    with pytest.raises(ValueError):
        table_rows.python_dicts_from_columns(["a", "b"], [[1, 2], [3]])
    assert table_rows.python_dicts_from_columns([], []) == []


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.text(max_size=3)),
            st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
            st.one_of(st.none(), st.floats(allow_nan=True)),
            st.one_of(st.none(), st.booleans()),
            st.one_of(st.none(), st.integers(0, 2**32 - 1)),
        ),
        max_size=20,
    )
)
def test_frame_dicts_is_to_dicts(rows: list[tuple[Any, ...]]) -> None:
    frame = pl.DataFrame(
        rows,
        schema={"name": pl.String, "ns": pl.Int64, "share": pl.Float64, "flag": pl.Boolean, "count": pl.UInt32},
        orient="row",
    )
    made, want = table_rows.frame_dicts(frame), frame.to_dicts()
    assert [list(r.items()) for r in made] == [list(r.items()) for r in want] or _same_with_nan(made, want)


def _same_with_nan(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return [[(k, repr(v)) for k, v in r.items()] for r in a] == [[(k, repr(v)) for k, v in r.items()] for r in b]
