"""The C reader of integer, text and byte columns (``traceguard/ingest/_int_scan.c``) against SQLite itself.

Expected values come from plain ``sqlite3`` on the same file; the reader must agree value for
value (nulls included, also past its buffer growth), open files read-only, apply the hardening
it is given, and fail with SQLite's message. The whole nsys reader must give the same capture
with it as with its ADBC fallback, on every public fixture and on our own H200 captures.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from tests.conftest import OWN, PUBLIC_NSYS
from traceguard.errors import InputError
from traceguard.ingest import nsys_sqlite
from traceguard.ingest.sqlite_safe import SAFE_PRAGMAS, readonly_uri, sqlite_limits

_int_scan = nsys_sqlite._int_scan

if _int_scan is None and os.environ.get("TRACEGUARD_REQUIRE_NATIVE") == "1":
    pytest.fail(
        "traceguard.ingest._int_scan was not built (TRACEGUARD_REQUIRE_NATIVE=1): install gcc and "
        "libsqlite3-dev, then `pip install -e .` again",
        pytrace=False,
    )
pytestmark = pytest.mark.skipif(_int_scan is None, reason="the C reader was not built (no compiler at install)")

#: Rows the reader starts with before it grows its buffers (FIRST_ROWS in the C file).
FIRST_ROWS = 65536


def _scan(db: Path, sql: str, *, setup: tuple[str, ...] = SAFE_PRAGMAS, limits=None) -> pl.DataFrame:
    """The reader's result as a frame, through the same Arrow wrapping the nsys reader uses."""
    if setup is SAFE_PRAGMAS and limits is None:
        return nsys_sqlite.scan_ints(db, sql)
    limits = sqlite_limits() if limits is None else limits
    return nsys_sqlite.int_frame(*_int_scan.scan(readonly_uri(db), sql, setup, limits))


def _truth(db: Path, sql: str) -> pl.DataFrame:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        cursor = conn.execute(sql)
        names = [d[0] for d in cursor.description]
        rows = cursor.fetchall()
    finally:
        conn.close()
    return pl.DataFrame(rows, schema={name: pl.Int64 for name in names}, orient="row")


@pytest.fixture
def numbers(tmp_path: Path) -> Path:
    """300 k rows: one column never null, one null on a pattern that crosses every buffer growth
    (first null only after the first growth), one null from row 0, and extreme values."""
    db = tmp_path / "numbers.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (a INTEGER NOT NULL, b INTEGER, c INTEGER, d INTEGER)")
    conn.executemany(
        "INSERT INTO t VALUES (?, ?, ?, ?)",
        (
            (
                i * 7919 - 10**12,
                None if (i > FIRST_ROWS + 5 and i % 1009 == 3) else i,
                None if i % 3 == 0 else -i,
                (2**63 - 1) if i % 2 else -(2**63),
            )
            for i in range(300_000)
        ),
    )
    conn.commit()
    conn.close()
    return db


def test_values_and_nulls_match_sqlite(numbers: Path) -> None:
    sql = "SELECT a, b, c, d FROM t"
    got = _scan(numbers, sql)
    assert_frame_equal(got, _truth(numbers, sql))
    # The null pattern really started after the first growth and kept going past later ones.
    nulls = got["b"].is_null().arg_true()
    assert nulls.min() > FIRST_ROWS and nulls.max() > 4 * FIRST_ROWS
    assert got["a"].null_count() == 0 and got["c"].null_count() == 100_000


def test_filtered_expressions_and_empty_results(numbers: Path) -> None:
    for sql in (
        "SELECT a + d % 1000 AS mixed, b >> 2 AS shifted FROM t WHERE c IS NOT NULL AND a % 5 = 1",
        "SELECT a FROM t WHERE a > 10 AND a < 0",
        "SELECT count(*) AS n, sum(b) AS s FROM t",
    ):
        got = _scan(numbers, sql)
        assert_frame_equal(got, _truth(numbers, sql))
    assert _scan(numbers, "SELECT a, b FROM t WHERE 0").shape == (0, 2)


def test_non_integers_read_as_sql_cast_reads_them(tmp_path: Path) -> None:
    """Text, real and blob values where integers belong: the reader gives what
    ``CAST(x AS INTEGER)`` gives (what the ADBC path's retry with CAST gives)."""
    db = tmp_path / "mixed.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x)")
    values = [12, "12abc", "x", 2.5, -7.9, b"42", "  9 ", None, 2**62, "9223372036854775807"]
    conn.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    conn.commit()
    conn.close()
    assert_frame_equal(
        _scan(db, "SELECT x FROM t").rename({"x": "v"}),
        _truth(db, "SELECT CAST(x AS INTEGER) AS v FROM t"),
    )


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    """300 k rows of text of every length up to 300 bytes (the data buffer grows past 1 MB many
    times), non-ASCII text, numbers and blobs where text belongs, and nulls from row 5."""
    db = tmp_path / "texts.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (i INTEGER, x, y BLOB)")

    def value(i: int) -> object:
        return [f"aten::mm, op_id = {i}" * (i % 15), "é→✓ ncclAllReduce", i * 3, 2.5 + i, b"raw\x00bytes", None][i % 6]

    conn.executemany(
        "INSERT INTO t VALUES (?, ?, ?)",
        ((i, value(i), None if i % 7 == 5 else bytes(range(i % 256)) * (i % 3)) for i in range(300_000)),
    )
    conn.commit()
    conn.close()
    return db


def test_text_and_bytes_match_sqlite_s_casts(texts: Path) -> None:
    """A 't' column is what ``CAST(x AS TEXT)`` gives, a 'b' column what ``CAST(y AS BLOB)``
    gives, nulls kept; the SQL the nsys reader sends (IFNULL, the __null flag) likewise."""
    got = nsys_sqlite.scan_columns(texts, "SELECT i, x, y FROM t", "itb")
    assert got is not None and got.schema == {"i": pl.Int64, "x": pl.String, "y": pl.Binary}
    conn = sqlite3.connect(f"file:{texts}?mode=ro", uri=True)
    try:
        truth = conn.execute("SELECT i, CAST(x AS TEXT), CAST(y AS BLOB) FROM t").fetchall()
    finally:
        conn.close()
    assert got.rows() == truth
    assert got["x"].null_count() == 50_000 and got["x"].str.len_bytes().max() > 250
    sql = "SELECT IFNULL(CAST(x AS TEXT), '') AS x, (x) IS NULL AS x__null FROM t"
    flagged = nsys_sqlite.scan_columns(texts, sql, "ti")
    assert flagged is not None and flagged["x"].null_count() == 0
    assert flagged["x__null"].sum() == 50_000 and flagged["x"].to_list() == [row[1] or "" for row in truth]


def test_text_that_is_not_utf8_goes_to_the_reader_that_replaces_it(tmp_path: Path) -> None:
    """The C reader does not repair text: it says so (None), and the nsys reader's ADBC path
    reads the bytes with U+FFFD and counts them, as it always did."""
    db = tmp_path / "bad.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (x TEXT)")
    conn.execute("INSERT INTO t VALUES (CAST(X'6E63636CFF' AS TEXT)), ('fine')")
    conn.commit()
    conn.close()
    assert nsys_sqlite.scan_columns(db, "SELECT x FROM t", "t") is None
    reader = nsys_sqlite._Reader(sqlite3.connect(f"file:{db}?mode=ro", uri=True), db, "bad.sqlite")
    try:
        frame = reader.bulk("t", [("x", "x", nsys_sqlite._TEXT)])
    finally:
        reader.close()
    assert frame["x"].to_list() == ["nccl\ufffd", "fine"] and reader.not_utf8 == {"t": 1}


def test_buffers_outlive_the_call_and_frame(numbers: Path) -> None:
    """The Arrow arrays keep the reader's memory alive after every other reference is gone."""
    import gc

    frame = _scan(numbers, "SELECT a, c FROM t")
    series = frame["c"]
    del frame
    gc.collect()
    assert series.sum() == -sum(i for i in range(300_000) if i % 3)


def test_opens_read_only_whatever_the_uri_says(numbers: Path) -> None:
    before = numbers.read_bytes()
    uri = f"file:{numbers}?mode=rwc"
    with pytest.raises(_int_scan.Error, match="cannot open the database"):
        _int_scan.scan(uri, "SELECT a FROM t")
    with pytest.raises(_int_scan.Error, match="would write"):
        _int_scan.scan(readonly_uri(numbers), "DELETE FROM t RETURNING a")
    with pytest.raises(_int_scan.Error, match="cannot open the database"):
        _int_scan.scan(readonly_uri(numbers.with_name("absent.sqlite")), "SELECT 1")
    assert numbers.read_bytes() == before
    assert not numbers.with_name("absent.sqlite").exists()


def test_setup_statements_and_limits_apply(numbers: Path) -> None:
    with pytest.raises(_int_scan.Error, match="cannot prepare the connection: no such table"):
        _int_scan.scan(readonly_uri(numbers), "SELECT a FROM t", ("SELECT * FROM nowhere",))
    # The lowered SQL length limit (1 MB) refuses a longer query, as the sqlite3 connection does.
    long_sql = "SELECT a FROM t WHERE a IN (" + ",".join(["1"] * 600_000) + ")"
    with pytest.raises(_int_scan.Error, match=r"too big|too long"):
        _int_scan.scan(readonly_uri(numbers), long_sql, SAFE_PRAGMAS, sqlite_limits())
    got = _scan(numbers, "SELECT count(*) AS n FROM t", setup=("PRAGMA query_only=ON",), limits=[])
    assert got["n"].to_list() == [300_000]


def test_errors_carry_sqlite_s_message(numbers: Path, tmp_path: Path) -> None:
    with pytest.raises(_int_scan.Error, match="cannot prepare the query: no such table: nope"):
        _int_scan.scan(readonly_uri(numbers), "SELECT a FROM nope")
    with pytest.raises(_int_scan.Error, match="between 1 and 64 columns"):
        _int_scan.scan(readonly_uri(numbers), "SELECT " + ", ".join(["a"] * 65) + " FROM t")
    with pytest.raises(TypeError):
        _int_scan.scan(readonly_uri(numbers), "SELECT a FROM t", [1, 2])
    with pytest.raises(TypeError):
        _int_scan.scan(readonly_uri(numbers), "SELECT a FROM t", (), [("x", 1)])


def test_a_damaged_file_fails_as_input_error(tmp_path: Path, unpacked) -> None:
    """A file whose pages were overwritten mid-table: the reader stops with SQLite's error and
    the nsys reader turns it into an InputError, as it does for ADBC."""
    source = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    data = bytearray(source.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    conn = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone()[0]
    conn.close()
    start = root * page_size  # the page after the table's root: one of its interior or leaf pages
    data[start : start + page_size] = b"\xa5" * page_size
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(bytes(data))
    with pytest.raises(_int_scan.Error):
        _int_scan.scan(readonly_uri(broken), "SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(InputError, match=r"damaged|could not be read"):
        nsys_sqlite.read_nsys_sqlite(broken)


NSYS_FILES = [*PUBLIC_NSYS, *sorted(OWN.glob("h200/*_nsys*/cap_*.sqlite.gz"))]


@pytest.mark.parametrize("path", NSYS_FILES, ids=[f"{p.parent.name}/{p.name}" for p in NSYS_FILES])
@pytest.mark.parametrize("launches_only", [False, True], ids=["full", "launches"])
def test_the_nsys_reader_gives_the_same_capture_with_adbc(
    path: Path, launches_only: bool, unpacked, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = unpacked(path)
    with_c = nsys_sqlite.read_nsys_sqlite(db, launches_only=launches_only)
    monkeypatch.setattr(nsys_sqlite, "_int_scan", None)
    with_adbc = nsys_sqlite.read_nsys_sqlite(db, launches_only=launches_only)
    assert with_c.info == with_adbc.info
    for name in ("gpu_ops", "api_calls", "ranges", "devices", "processes", "strings"):
        assert_frame_equal(getattr(with_c, name), getattr(with_adbc, name), check_exact=True)


def test_reads_ahead_only_what_a_scan_reads_in_order(numbers: Path, tmp_path: Path) -> None:
    """The read-ahead VFS: a whole-table scan, a rowid window read from the middle (in order after
    its probe) and single-row probes all give SQLite's own rows; a file cut short while nothing
    reads it fails as SQLite says, never with rows of an earlier read."""
    for sql in (
        "SELECT a, b, c, d FROM t",
        "SELECT a, c FROM t WHERE rowid >= 150000 AND rowid < 150100",
        "SELECT a FROM t WHERE rowid = 299999",
        "SELECT d FROM t WHERE rowid IN (1, 70000, 140000, 210000, 280000)",
    ):
        assert_frame_equal(_scan(numbers, sql), _truth(numbers, sql))
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(numbers.read_bytes()[: numbers.stat().st_size // 2])
    with pytest.raises(_int_scan.Error):
        _scan(cut, "SELECT a, b, c, d FROM t")


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(
        st.one_of(
            st.integers(-(2**63), 2**63 - 1),
            st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**24 - 1, 2**24, -(2**24), 2**48 - 1, 2**48]),
            # what nsys writes: (pid << 24 | tid) and more above
            st.tuples(st.integers(0, 2**24 - 1), st.integers(0, 2**24 - 1), st.integers(0, 255)).map(
                lambda t: (t[2] << 48) | (t[0] << 24) | t[1]
            ),
        ),
        max_size=300,
    ),
    wide=st.booleans(),
)
def test_split_ids_are_sqlite_s_shift_and_mask(ids: list[int], wide: bool) -> None:
    """``split_ids`` (the process and thread of nsys's global ids, one C pass) gives what SQLite's
    ``(g >> 24) & 0xFFFFFF`` and ``g & 0xFFFFFF`` give, over int64's whole range, negatives
    included; so does the expression path it stands in for."""
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (g INTEGER)")
    conn.executemany("INSERT INTO t VALUES (?)", [(v,) for v in ids])
    truth = conn.execute("SELECT (g >> 24) & 16777215, g & 16777215 FROM t ORDER BY rowid").fetchall()
    conn.close()
    series = pl.Series("global_tid", ids, dtype=pl.Int64)
    split = nsys_sqlite._split_ids(series, pl.Int64() if wide else pl.Int32(), with_tid=True)
    assert split is not None
    pid, tid = split
    assert tid is not None
    assert pid.dtype == (pl.Int64 if wide else pl.Int32) and tid.dtype == pl.Int32
    assert list(zip(pid.to_list(), tid.to_list(), strict=True)) == truth
    by_expressions = pl.DataFrame([series]).select(
        nsys_sqlite._pid_of(pl.col("global_tid")), nsys_sqlite._tid_of(pl.col("global_tid")).alias("tid")
    )
    assert by_expressions.rows() == truth


def test_split_ids_leave_what_they_do_not_take_to_the_expressions() -> None:
    """Nulls, another type or several chunks: None (the reader then uses the expressions); the C
    function refuses outputs of another type or length."""
    assert nsys_sqlite._split_ids(pl.Series([1, None], dtype=pl.Int64), pl.Int32(), with_tid=True) is None
    assert nsys_sqlite._split_ids(pl.Series([1, 2], dtype=pl.Int32), pl.Int32(), with_tid=True) is None
    assert nsys_sqlite._split_ids(pl.Series([1, 2], dtype=pl.Int64), pl.Int16(), with_tid=True) is None
    chunked = pl.concat([pl.Series([1], dtype=pl.Int64), pl.Series([2], dtype=pl.Int64)], rechunk=False)
    assert nsys_sqlite._split_ids(chunked, pl.Int32(), with_tid=True) is None
    ids = np.array([1 << 24, 5], dtype=np.int64)
    with pytest.raises(ValueError, match="split_ids"):
        _int_scan.split_ids(ids, np.empty(2, dtype=np.float64), None)
    with pytest.raises(ValueError, match="split_ids"):
        _int_scan.split_ids(ids, np.empty(3, dtype=np.int32), None)
    with pytest.raises(ValueError, match="split_ids"):
        _int_scan.split_ids(ids, np.empty(2, dtype=np.int32), np.empty(2, dtype=np.int64))
    pid = np.empty(2, dtype=np.int32)
    _int_scan.split_ids(ids, pid, None)
    assert pid.tolist() == [1, 0]
