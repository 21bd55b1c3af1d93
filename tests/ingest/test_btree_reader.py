"""The b-tree reader (``_int_scan.table``, through ``_Reader._table_read``) against SQLite itself.

It reads integer columns of a rowid table by walking the file's pages, so it must give exactly
SQLite's rows — on every table of every real capture at hand (public ones of several nsys
generations, our own H200 exports), for whole tables, rowid ranges and value filters — and give
way to SQLite (return None) wherever the file holds what it does not take exactly as SQLite
would. A damaged or hostile file must never crash it or make it read what SQLite would not.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import OWN, PUBLIC_NSYS
from traceguard.ingest import nsys_sqlite
from traceguard.ingest.rows import Rows, Skip
from traceguard.ingest.sqlite_safe import open_readonly

if (nsys_sqlite._int_scan is None or not hasattr(nsys_sqlite._int_scan, "table")) and os.environ.get(
    "TRACEGUARD_REQUIRE_NATIVE"
) == "1":
    pytest.fail("traceguard.ingest._int_scan was not built (TRACEGUARD_REQUIRE_NATIVE=1)", pytrace=False)
pytestmark = pytest.mark.skipif(nsys_sqlite._int_scan is None, reason="the C reader was not built")

CAPTURES = [*PUBLIC_NSYS, *sorted(OWN.glob("h200/*_nsys*/cap_0.sqlite.gz"))]


def _reader(db: Path) -> nsys_sqlite._Reader:
    return nsys_sqlite._Reader(open_readonly(db), db, str(db))


def _sqlite(db: Path, table: str, columns: list[str], rows: Rows) -> pl.DataFrame:
    quoted = ", ".join(f'"{c}" AS "{c}"' if c != rows.rowid else f"{c} AS {c}" for c in columns)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        cursor = conn.execute(f'SELECT {quoted} FROM "{table}" {rows.where()}')
        got = cursor.fetchall()
    finally:
        conn.close()
    return pl.DataFrame(got, schema={c: pl.Int64 for c in columns}, orient="row")


def _integer_only(db: Path, table: str, column: str) -> bool:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        kinds = {k for (k,) in conn.execute(f'SELECT DISTINCT typeof("{column}") FROM "{table}"')}
    finally:
        conn.close()
    return kinds <= {"integer", "null"}


def _read(reader: nsys_sqlite._Reader, table: str, columns: list[str], rows: Rows) -> pl.DataFrame | None:
    return reader._table_read(table, [(c, c, "int") for c in columns], rows)


@pytest.mark.parametrize("path", CAPTURES, ids=[f"{p.parent.name}/{p.name}"[-60:] for p in CAPTURES])
def test_every_integer_column_of_every_table_is_sqlite_s(path: Path, unpacked) -> None:
    """Every table of a real capture, every column the reader may take: the whole table, three
    rowid ranges, and a value filter on the first column give SQLite's rows, value for value; a
    column holding anything but integers sends the read to SQLite (None)."""
    db = unpacked(path)
    reader = _reader(db)
    checked = 0
    try:
        for table in sorted(reader.tables):
            layout = reader._table_layout(table)
            if layout is None:
                continue
            columns = sorted(layout[1], key=layout[1].__getitem__)
            whole = Rows()
            for column in columns:
                read = _read(reader, table, [column, "rowid"], whole)
                if not _integer_only(db, table, column):
                    assert read is None, (table, column)
                    continue
                assert read is not None, (table, column)
                expected = _sqlite(db, table, [column, "rowid"], whole)
                assert read.equals(expected), (table, column)
                checked += 1
                if read.height < 3:
                    continue
                rowids = read["rowid"]
                first, third, half = (int(rowids[i]) for i in (0, len(rowids) // 3, len(rowids) // 2))
                ranged = Rows(((first - 5, first + 1), (max(third, first + 1), half + 1), (half + 3, 1 << 62)))
                assert _read(reader, table, [column, "rowid"], ranged).equals(
                    _sqlite(db, table, [column, "rowid"], ranged)
                ), (table, column)
                values = tuple(sorted({int(v) for v in read[column].drop_nulls().head(3)}))
                if values and layout[1][column] >= 0:  # an INTEGER PRIMARY KEY (the rowid) is not a filter
                    only = Rows(column=column, values=values)
                    assert _read(reader, table, ["rowid", column], only).equals(
                        _sqlite(db, table, ["rowid", column], only)
                    ), (table, column)
    finally:
        reader.close()
    assert checked > 0


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 k rows over a three-level b-tree (small pages), rowids with gaps, nulls and extremes."""
    db = tmp_path_factory.mktemp("btree") / "deep.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA page_size = 512")
    conn.execute("CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER)")
    extremes = (-(1 << 63), (1 << 63) - 1, 0, 1, -1, 127, -128, 1 << 40, -(1 << 47))
    conn.executemany(
        "INSERT INTO t (rowid, a, b, c) VALUES (?, ?, ?, ?)",
        (
            (3 * i + (i % 7), extremes[i % len(extremes)], None if i % 5 == 0 else i * 1_000_003, i % 11)
            for i in range(300_000)
        ),
    )
    conn.commit()
    conn.close()
    return db


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    cuts=st.lists(st.integers(-10, 950_000), max_size=8),
    values=st.none() | st.lists(st.integers(-2, 12), max_size=4),
)
def test_ranges_and_filters_on_a_deep_tree_are_sqlite_s(deep: Path, cuts: list[int], values: list[int] | None) -> None:
    bounds = sorted(cuts)
    spans = tuple(zip(bounds[::2], bounds[1::2], strict=False))
    rows = Rows(spans if cuts else None, "c" if values is not None else None, tuple(values or ()))
    _read_deep_as_sqlite_does(deep, rows)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    values=st.lists(
        st.sampled_from((-(1 << 63), (1 << 63) - 1, 0, 1, -1, 127, -128, 1 << 40, -(1 << 47))) | st.integers(-200, 200),
        min_size=1,
        max_size=6,
        unique=True,
    )
)
def test_value_filters_of_any_span_are_sqlite_s(deep: Path, values: list[int]) -> None:
    """A filter whose values span less than 65,536 is tested by one bit, a wider one by a
    binary search: both keep SQLite's rows, on a column holding the extremes of int64."""
    _read_deep_as_sqlite_does(deep, Rows(None, "a", tuple(sorted(values))))


def _read_deep_as_sqlite_does(deep: Path, rows: Rows) -> pl.DataFrame:
    """``rows`` of the deep tree's table by the b-tree reader, asserted equal to SQLite's."""
    reader = _reader(deep)
    try:
        read = _read(reader, "t", ["rowid", "a", "b", "c"], rows)
    finally:
        reader.close()
    assert read is not None
    assert read.equals(_sqlite(deep, "t", ["rowid", "a", "b", "c"], rows))
    return read


@pytest.mark.parametrize(
    "spans",
    [
        ((0, 1 << 40),),  # far more rowids than rows: the columns start at the 4 M-row hint
        ((950_000, 2_000_000),),  # past the last row: no rows, the hinted columns given back
        ((0, 70_000), (70_000, 140_001)),  # over FIRST_ROWS (65,536) in two ranges, nulls in b
    ],
)
def test_a_ranged_read_sized_from_its_ranges_is_sqlite_s(deep: Path, spans: tuple[tuple[int, int], ...]) -> None:
    """A rowid-ranged read without a filter starts its columns at the rows its ranges can hold
    (at most 4 M), not at 65,536 doubled: the rows, nulls and types are SQLite's all the same."""
    read = _read_deep_as_sqlite_does(deep, Rows(spans))
    # The deep table's rowids are 3 i + i % 7 for i < 300,000 (its fixture): every one in a range is read.
    assert read.height == sum(1 for i in range(300_000) if any(lo <= 3 * i + i % 7 < hi for lo, hi in spans))


#: The integers around each size SQLite stores one in (1, 2, 3, 4, 6 and 8 bytes, two's
#: complement, big-endian): each side of every boundary, and the extremes.
_SIZE_EDGES = sorted(
    {
        edge + step
        for bits in (8, 16, 24, 32, 48, 64)
        for edge in (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        for step in (-1, 0, 1)
        if -(1 << 63) <= edge + step < (1 << 63)
    }
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    values=st.lists(
        st.sampled_from(_SIZE_EDGES) | st.integers(-(1 << 63), (1 << 63) - 1) | st.none(), min_size=1, max_size=200
    )
)
def test_integers_of_every_stored_size_are_sqlite_s(tmp_path_factory: pytest.TempPathFactory, values: list) -> None:
    """Every integer SQLite can store, whatever its size in the record (the reader decodes each
    size by whole loads: a sign or byte-order slip would show at a size's edge), reads as SQLite
    reads it; nulls stay null."""
    db = tmp_path_factory.mktemp("sizes") / "sizes.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE t (a INTEGER, b INTEGER)")
    conn.executemany(
        "INSERT INTO t (a, b) VALUES (?, ?)", ((v, None if v is None else -v if v > -(1 << 63) else 0) for v in values)
    )
    conn.commit()
    conn.close()
    reader = _reader(db)
    try:
        read = _read(reader, "t", ["rowid", "a", "b"], Rows())
    finally:
        reader.close()
    assert read is not None
    assert read.equals(_sqlite(db, "t", ["rowid", "a", "b"], Rows()))
    assert read["a"].to_list() == values


def _made(tmp_path: Path, *statements: str) -> Path:
    db = tmp_path / "made.sqlite"
    conn = sqlite3.connect(db)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return db


def test_what_it_does_not_take_goes_to_sqlite(tmp_path: Path) -> None:
    """A float or a text in a column read or filtered, a value needed on an overflow page, a
    WITHOUT ROWID table, a generated column, a WAL file beside the database: None (SQLite
    reads those rows); a column with a default or in a primary key other than the rowid is not
    offered (INTEGER PRIMARY KEY is the rowid, but not with DESC nor as INT). A row
    whose spilled part holds nothing needed is read from its page."""
    db = _made(
        tmp_path,
        "CREATE TABLE f (a INTEGER, b INTEGER)",
        "INSERT INTO f VALUES (1, 2), (2.5, 3), (4, 5)",
        "CREATE TABLE s (a, b INTEGER)",  # no type: the text stays text
        "INSERT INTO s VALUES (1, 2), ('7', 3)",
        "CREATE TABLE big (a INTEGER, blob BLOB)",
        "INSERT INTO big VALUES (1, zeroblob(10000))",
        "CREATE TABLE spilled (blob BLOB, a INTEGER)",
        "INSERT INTO spilled VALUES (zeroblob(10000), 1)",
        "CREATE TABLE w (k INTEGER PRIMARY KEY, v INTEGER) WITHOUT ROWID",
        "INSERT INTO w VALUES (1, 2)",
        "CREATE TABLE g (a INTEGER, b INTEGER GENERATED ALWAYS AS (a * 2) VIRTUAL)",
        "INSERT INTO g (a) VALUES (1)",
        "CREATE TABLE d (a INTEGER, b INTEGER DEFAULT 7, id INTEGER PRIMARY KEY)",
        "INSERT INTO d (a) VALUES (1)",
        "CREATE TABLE desc_key (id INTEGER PRIMARY KEY DESC, v INTEGER)",  # not the rowid: a key of its own
        "INSERT INTO desc_key VALUES (5, 1)",
        "CREATE TABLE int_key (id INT PRIMARY KEY, v INTEGER)",  # INT, not INTEGER: not the rowid either
        "INSERT INTO int_key VALUES (6, 1)",
    )
    reader = _reader(db)
    try:
        assert _read(reader, "f", ["b"], Rows()) is not None  # the float is in another column
        assert _read(reader, "f", ["a"], Rows()) is None
        assert _read(reader, "f", ["b"], Rows(column="a", values=(1,))) is None
        assert _read(reader, "s", ["a"], Rows()) is None
        assert _read(reader, "big", ["a"], Rows()).equals(_sqlite(db, "big", ["a"], Rows()))  # a spilled blob after
        assert _read(reader, "spilled", ["a"], Rows()) is None  # the value itself on an overflow page
        assert reader._table_layout("w") is None
        assert reader._table_layout("g") is None
        assert _read(reader, "d", ["a", "rowid"], Rows()) is not None
        assert _read(reader, "d", ["b"], Rows()) is None
        assert _read(reader, "d", ["id"], Rows()).equals(_sqlite(db, "d", ["id"], Rows()))  # the rowid itself
        for keyed in ("desc_key", "int_key"):
            assert _read(reader, keyed, ["id"], Rows()) is None
            assert _read(reader, keyed, ["v", "rowid"], Rows()).equals(_sqlite(db, keyed, ["v", "rowid"], Rows()))
    finally:
        reader.close()
    (tmp_path / "made.sqlite-wal").write_bytes(b"")
    reader = _reader(db)
    try:
        assert _read(reader, "f", ["b"], Rows()) is None
    finally:
        reader.close()


def test_a_column_added_later_reads_null_in_older_rows(tmp_path: Path) -> None:
    """Rows written before ``ALTER TABLE ADD COLUMN`` end early; SQLite gives NULL there."""
    db = _made(
        tmp_path,
        "CREATE TABLE t (a INTEGER)",
        "INSERT INTO t VALUES (1), (2)",
        "ALTER TABLE t ADD COLUMN b INTEGER",
        "INSERT INTO t VALUES (3, 30)",
    )
    reader = _reader(db)
    try:
        read = _read(reader, "t", ["a", "b"], Rows())
    finally:
        reader.close()
    assert read is not None and read.equals(_sqlite(db, "t", ["a", "b"], Rows()))
    assert read["b"].to_list() == [None, None, 30]


@pytest.mark.parametrize("serial_type", [10, 11])
def test_a_reserved_serial_type_is_never_read(tmp_path: Path, serial_type: int) -> None:
    """A record header naming a reserved serial type (10, 11: no value size is defined for them)
    before or at a column read: the reader gives way (None), as SQLite calls that record corrupt.
    Each header byte is looked up in a table of one-byte types, so both are checked."""
    db = _made(tmp_path, "CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER)", "INSERT INTO t VALUES (5, 6, 7)")
    data = bytearray(db.read_bytes())
    record = bytes([4, 1, 1, 1, 5, 6, 7])  # header length 4, three 1-byte integers, then 5, 6, 7
    at = data.index(record)
    data[at + 2] = serial_type  # column b's type
    db.write_bytes(bytes(data))
    reader = _reader(db)
    try:
        assert _read(reader, "t", ["a"], Rows()).equals(_sqlite(db, "t", ["a"], Rows()))  # before it: read
        assert _read(reader, "t", ["b"], Rows()) is None
        assert _read(reader, "t", ["c"], Rows()) is None
    finally:
        reader.close()


def test_a_folded_row_is_decided_by_its_text_and_thread_alone(tmp_path: Path) -> None:
    """A row is kept or folded on the columns that decide it (the text, the thread it counts
    by); the rest of its header is parsed only for a row kept, as SQLite, which parses a header
    only as far as the columns a query reads, counts it too. A reserved serial type after them
    in a folded row: folded and counted like SQLite; in a kept row, read: the reader gives way."""
    db = _made(
        tmp_path,
        "CREATE TABLE t (a INTEGER, s TEXT, k INTEGER, c INTEGER)",
        "INSERT INTO t VALUES (5, 'aten::x', 7, 9), (6, 'forward', 7, 9), (8, 'aten::y', 7, 9)",
    )
    data = bytearray(db.read_bytes())
    folded = bytes([5, 1, 13 + 2 * 7, 1, 1, 5]) + b"aten::x"  # header length 5: int, 7-byte text, int, int
    at = data.index(folded)
    data[at + 4] = 10  # column c's type: reserved
    db.write_bytes(bytes(data))
    spec = [("a", "a", "int"), ("c", "c", "int")]
    rows = Rows(skip=Skip("s", "aten::", "k"))
    reader = _reader(db)
    try:
        skipped: list[tuple[int | None, int]] = []
        read = reader._table_read("t", spec, rows, skipped)
        assert read is not None and read.to_dicts() == [{"a": 6, "c": 9}]
        assert skipped == [(7, 2)] == _sql_skipped(reader, "t", rows)
    finally:
        reader.close()
    data[data.index(bytes([5, 1, 13 + 2 * 7, 1, 1, 6]) + b"forward") + 4] = 10  # the kept row's c
    db.write_bytes(bytes(data))
    reader = _reader(db)
    try:
        assert reader._table_read("t", spec, rows, []) is None  # as SQLite calls that record corrupt
    finally:
        reader.close()


@pytest.fixture(scope="module")
def small_capture(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real export's bytes (the smallest own H200 capture) to damage."""
    import gzip

    return gzip.decompress((OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz").read_bytes())


def _damaged(capture: bytes, table: str, hits: list[tuple[float, int]], run: int, db: Path) -> Path:
    """``capture`` written to ``db`` with runs of ``run`` bytes of one value overwritten at ``hits``
    (fractions of the file) from ``table``'s root page on."""
    data = bytearray(capture)
    page = int.from_bytes(data[16:18], "big")
    conn = sqlite3.connect(":memory:")
    conn.deserialize(bytes(data))
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    conn.close()
    lo = (root - 1) * page
    for where, value in hits:
        at = lo + int(where * (len(data) - lo - run))
        data[at : at + run] = bytes([value]) * run
    db.write_bytes(bytes(data))
    return db


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    hits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=30),
    run=st.integers(1, 64),
)
def test_a_damaged_file_never_crashes_it_nor_reads_what_sqlite_would_not(
    small_capture: bytes, tmp_path_factory: pytest.TempPathFactory, hits: list[tuple[float, int]], run: int
) -> None:
    """Bytes overwritten anywhere in the kernel table's pages (runs of one value): the reader
    returns None or rows; when SQLite also reads the table, the rows are the same."""
    table = nsys_sqlite.KERNEL
    db = _damaged(small_capture, table, hits, run, tmp_path_factory.mktemp("damaged") / "cap.sqlite")
    columns = ["start", "end", "deviceId", "correlationId"]
    try:
        reader = _reader(db)
    except Exception:  # the damage reached what opening checks: nothing for the b-tree reader to read
        return
    try:
        layout = reader._table_layout(table)
        read = _read(reader, table, columns, Rows()) if layout else None
    finally:
        reader.close()
    if read is None:
        return
    try:
        expected = _sqlite(db, table, columns, Rows())
    except (sqlite3.DatabaseError, TypeError, OverflowError, ValueError):
        return  # SQLite calls it damaged (or holds non-integers): the analysis fails there anyway
    assert read.equals(expected)


def _sql_spec(reader: nsys_sqlite._Reader, table: str, spec: list[tuple[str, str, str]], rows: Rows) -> pl.DataFrame:
    """The same columns by SQLite (the reader's own SQL for them), typed as ``bulk`` types them."""
    frame = nsys_sqlite.scan_columns(
        reader.db,
        reader._select(table, spec, rows.where(), cast=False),
        "".join({"text": "ti", "blob": "b"}.get(kind, "i") for _, _, kind in spec),
    )
    assert frame is not None
    return frame


@pytest.mark.parametrize("path", CAPTURES, ids=[f"{p.parent.name}/{p.name}"[-60:] for p in CAPTURES])
def test_text_and_bytes_are_sqlite_s(path: Path, unpacked) -> None:
    """The NVTX ranges' text (with its null flag) and payload bytes, and the string table, as the
    nsys reader asks for them: the b-tree reader's rows are SQLite's, or it gives way."""
    db = unpacked(path)
    reader = _reader(db)
    try:
        cases = [("StringIds", [("id", "id", "int"), ("value", "value", "text")], Rows())]
        cols = reader.columns(nsys_sqlite.NVTX)
        if {"start", "text", "eventType"} <= cols:
            spec = [("start", "start", "int"), ("text", "text", "text")]
            if "binaryData" in cols:
                spec.append(("payload", "binaryData", "blob"))
            cases.append((nsys_sqlite.NVTX, spec, Rows(column="eventType", values=(59, 60))))
        for table, spec, rows in cases:
            if table not in reader.tables:
                continue
            read = reader._table_read(table, spec, rows)
            if read is None:
                continue  # given way: SQLite reads it (the whole-capture test covers that path)
            assert read.equals(_sql_spec(reader, table, spec, rows)), table
    finally:
        reader.close()


def test_text_columns_as_sql_casts_give_them(tmp_path: Path) -> None:
    """NULL text reads '' with its flag set; text and blobs read as their bytes; a number in a text
    column, or a database storing text as UTF-16, goes to SQLite."""
    db = _made(
        tmp_path,
        "CREATE TABLE t (a INTEGER, s TEXT, b BLOB)",
        "INSERT INTO t VALUES (1, 'x', X'00ff'), (2, NULL, NULL), (3, '', 'text in a blob column')",
        "INSERT INTO t VALUES (4, CAST(X'C3A9' AS TEXT), zeroblob(3))",
        "CREATE TABLE n (s)",
        "INSERT INTO n VALUES ('a'), (7)",
    )
    spec = [("a", "a", "int"), ("s", "s", "text"), ("b", "b", "blob")]
    reader = _reader(db)
    try:
        read = reader._table_read("t", spec, Rows())
        assert read is not None
        assert read.equals(_sql_spec(reader, "t", spec, Rows()))
        assert read["s"].to_list() == ["x", "", "", "é"] and read["s__null"].to_list() == [0, 1, 0, 0]
        assert reader._table_read("n", [("s", "s", "text")], Rows()) is None
    finally:
        reader.close()
    wide = tmp_path / "utf16.sqlite"
    conn = sqlite3.connect(wide)
    conn.execute("PRAGMA encoding = 'UTF-16le'")
    conn.execute("CREATE TABLE t (a INTEGER, s TEXT)")
    conn.execute("INSERT INTO t VALUES (1, 'x')")
    conn.commit()
    conn.close()
    reader = _reader(wide)
    try:
        assert reader._table_read("t", [("s", "s", "text")], Rows()) is None
        assert reader._table_read("t", [("a", "a", "int")], Rows()) is not None  # integers have no encoding
    finally:
        reader.close()


def _sql_skipped(reader: nsys_sqlite._Reader, table: str, rows: Rows) -> list[tuple[int | None, int]]:
    found: list[tuple[int | None, int]] = []
    reader._count_skipped(table, rows, found)
    return found


@pytest.mark.parametrize("operators", [False, True], ids=["aten", "operators"])
@pytest.mark.parametrize("path", CAPTURES, ids=[f"{p.parent.name}/{p.name}"[-60:] for p in CAPTURES])
def test_folded_per_op_ranges_are_sqlite_s(
    path: Path, operators: bool, unpacked, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranges the nsys reader keeps (those not starting ``aten::``; with ``operators``, nor
    in another operator's form either) are SQLite's rows under :meth:`Rows.where`'s ``NOT (...)``,
    and the ones it folds are counted per thread as SQLite counts them (nsys-ai's fixtures hold
    95 % per-op ranges; the others, none), by the b-tree reader and by ``bulk`` (which reads
    through SQLite where the b-tree reader gives way). A capture without NVTX text folds nothing."""
    db = unpacked(path)
    reader = _reader(db)
    try:
        cols = reader.columns(nsys_sqlite.NVTX)
        if not {"start", "text", "eventType", "globalTid"} <= cols:
            assert reader.nvtx_rows()[1].height == 0
            return
        spec = [("start", "start", "int"), ("global_tid", "globalTid", "int"), ("text", "text", "text")]
        for by in ("globalTid", None):
            skip = Skip("text", nsys_sqlite.OP_RANGE_PREFIX, by, operators=operators)
            rows = Rows(column="eventType", values=(59, 60, 75), skip=skip)
            expected = _sql_spec(reader, nsys_sqlite.NVTX, spec, rows)
            counted = sorted(_sql_skipped(reader, nsys_sqlite.NVTX, rows), key=str)
            assert not expected["text"].str.starts_with("aten::").any()
            assert not operators or not expected["text"].str.contains(", seq = ", literal=True).any()
            skipped: list[tuple[int | None, int]] = []
            read = reader._table_read(nsys_sqlite.NVTX, spec, rows, skipped)
            if read is not None:
                assert read.equals(expected)
                assert sorted(skipped, key=str) == counted
            for sqlite_only in ("", "1"):  # bulk as it reads, and with every read sent to SQLite
                monkeypatch.setenv("TRACEGUARD_SQLITE_ONLY", sqlite_only)
                through_bulk: list[tuple[int | None, int]] = []
                bulk = reader.bulk(nsys_sqlite.NVTX, spec, rows, through_bulk)
                assert bulk.select(expected.columns).equals(expected)
                assert sorted(through_bulk, key=str) == counted
    finally:
        reader.close()


def test_folding_counts_nulls_gives_way_where_it_cannot_tell(tmp_path: Path) -> None:
    """Skipped rows whose count column is NULL count under None; a prefix longer than a text, or
    a number or blob in the text column, is not skipped; a prefix on an overflow page, or more
    than 4,096 values to count by, gives way to SQLite."""
    db = _made(
        tmp_path,
        "CREATE TABLE t (a INTEGER, k INTEGER, s TEXT)",
        "INSERT INTO t VALUES (1, 7, 'aten::mm, op_id = 1'), (2, NULL, 'aten::add'), (3, 7, 'aten:'),"
        " (4, 8, 'forward'), (5, 7, X'6174656e3a3a'), (6, 8, 'aten::to'), (7, 8, NULL)",
    )
    spec = [("a", "a", "int"), ("s", "s", "text")]
    reader = _reader(db)
    try:
        rows = Rows(skip=Skip("s", "aten::", "k"))
        skipped: list[tuple[int | None, int]] = []
        read = reader._table_read("t", spec, rows, skipped)
        assert read is not None
        assert read["a"].to_list() == [3, 4, 5, 7]  # a short text, another name, a blob, a NULL: kept
        assert read.equals(_sql_spec(reader, "t", spec, rows))
        assert sorted(skipped, key=str) == sorted([(7, 1), (None, 1), (8, 1)], key=str)
        assert sorted(_sql_skipped(reader, "t", rows), key=str) == sorted(skipped, key=str)
        everything: list[tuple[int | None, int]] = []
        assert reader._table_read("t", spec, Rows(skip=Skip("s", "aten::")), everything) is not None
        assert everything == [(None, 3)]
    finally:
        reader.close()
    (tmp_path / "spilled").mkdir()
    spilled = _made(tmp_path / "spilled", "CREATE TABLE t (a INTEGER, s TEXT)")
    conn = sqlite3.connect(spilled)
    conn.execute("INSERT INTO t VALUES (1, ?)", ("x" * 9000 + "aten::",))  # the text spills past the page
    conn.execute("CREATE TABLE w (a INTEGER, k INTEGER, s TEXT)")
    conn.executemany("INSERT INTO w VALUES (?, ?, 'aten::x')", [(i, i) for i in range(4100)])
    conn.commit()
    conn.close()
    reader = _reader(spilled)
    try:
        assert reader._table_read("t", [("a", "a", "int")], Rows(skip=Skip("s", "x" * 5000))) is None
        assert reader._table_read("w", [("a", "a", "int")], Rows(skip=Skip("s", "aten::", "k"))) is None
        assert reader._table_read("w", [("a", "a", "int")], Rows(skip=Skip("s", "aten::"))) is not None
    finally:
        reader.close()
    with pytest.raises(ValueError, match="ASCII"):
        Skip("s", "it's")


def test_operator_forms_are_folded_as_sqlite_folds_them(tmp_path: Path) -> None:
    """``Skip(operators=True)``: the texts ``emit_nvtx`` writes for operators and autograd nodes
    are folded (a ``, seq = `` anywhere; a lowercase namespace then ``::`` with an ``, op_id = ``),
    scopes and annotations are kept (an uppercase or dotted namespace, c10d's single-colon
    ``nccl:``, a namespace without ``emit_nvtx``'s op id, an empty one), by the C reader as by
    SQLite. A kept text continued on an overflow page, where a marker may lie, gives way to
    SQLite; one whose marker is on its own page is folded there."""
    texts = {
        "c10d::alltoall_base_, op_id = 7": True,
        "flash_attn::_flash_attn_forward, op_id = 8": True,
        "FlashAttnFunc, seq = 3, op_id = 9": True,
        "autograd::engine::evaluate_function: MmBackward0, seq = 4, op_id = 10": True,
        "_c10d_functional::all_reduce, op_id = 11, sizes = [[8]]": True,
        "aten::mm": True,
        "FSDP::pre_forward (blocks.3), op_id = 12": False,
        "nccl:all_to_all, op_id = 13": False,
        "record_param_comms, op_id = 14": False,
        "ProfilerStep#3, op_id = 15": False,
        "c10d::alltoall_base_": False,
        "::x, op_id = 16": False,
        "a.b::c, op_id = 17": False,
        "nccl:x::y, op_id = 18": False,
        "forward": False,
    }
    db = _made(tmp_path, "CREATE TABLE t (a INTEGER, k INTEGER, s TEXT)")
    conn = sqlite3.connect(db)
    conn.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, i % 2, text) for i, text in enumerate(texts)])
    conn.execute("INSERT INTO t VALUES (100, 0, NULL), (101, 1, X'2c20736571203d20')")  # NULL; a blob: kept
    conn.commit()
    conn.close()
    spec = [("a", "a", "int"), ("s", "s", "text")]
    rows = Rows(skip=Skip("s", "aten::", "k", operators=True))
    reader = _reader(db)
    try:
        skipped: list[tuple[int | None, int]] = []
        read = reader._table_read("t", spec, rows, skipped)
        assert read is not None and read.equals(_sql_spec(reader, "t", spec, rows))
        kept = [text for text, folded in texts.items() if not folded]
        assert read["s"].to_list() == [*kept, "", ", seq = "]
        assert sorted(skipped) == sorted(_sql_skipped(reader, "t", rows)) == [(0, 3), (1, 3)]
    finally:
        reader.close()
    long_kept, long_folded = "scope " + "x" * 9000 + ", seq = 1", "c10d::x, op_id = 1, sizes = " + "9" * 9000
    (tmp_path / "spilled").mkdir()
    spilled = _made(tmp_path / "spilled", "CREATE TABLE t (a INTEGER, s TEXT)")
    conn = sqlite3.connect(spilled)
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, long_folded), (2, "forward")])
    conn.commit()
    conn.close()
    reader = _reader(spilled)
    try:
        rows = Rows(skip=Skip("s", "aten::", operators=True))
        everything: list[tuple[int | None, int]] = []
        read = reader._table_read("t", [("a", "a", "int")], rows, everything)
        assert read is not None and read["a"].to_list() == [2] and everything == [(None, 1)]
        conn = sqlite3.connect(spilled)
        conn.execute("INSERT INTO t VALUES (3, ?)", (long_kept,))  # its ", seq = " past the first page
        conn.commit()
        conn.close()
        assert reader._table_read("t", [("a", "a", "int")], rows, []) is None
        through_sqlite: list[tuple[int | None, int]] = []
        assert reader.bulk("t", [("a", "a", "int")], rows, through_sqlite)["a"].to_list() == [2]
        assert through_sqlite == [(None, 2)]
    finally:
        reader.close()


@pytest.fixture(scope="module")
def per_op_capture() -> bytes:
    """nsys-ai's public per-op capture (18,088 ``aten::`` ranges of 19,118), to damage."""
    import gzip

    return gzip.decompress(next(p for p in PUBLIC_NSYS if "mfu_2gpu_before" in p.name).read_bytes())


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    hits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=30),
    run=st.integers(1, 64),
)
def test_a_damaged_per_op_table_never_crashes_the_folding_nor_folds_what_sqlite_would_not(
    per_op_capture: bytes, tmp_path_factory: pytest.TempPathFactory, hits: list[tuple[float, int]], run: int
) -> None:
    """Bytes overwritten anywhere from the NVTX table's root on: the folding read returns None or
    rows and counts; when SQLite also reads the table, both are SQLite's."""
    db = _damaged(per_op_capture, nsys_sqlite.NVTX, hits, run, tmp_path_factory.mktemp("damaged") / "cap.sqlite")
    spec = [("start", "start", "int"), ("text", "text", "text")]
    skip = Skip("text", nsys_sqlite.OP_RANGE_PREFIX, "globalTid", operators=True)
    rows = Rows(column="eventType", values=(59, 60), skip=skip)
    try:
        reader = _reader(db)
    except Exception:  # the damage reached what opening checks: nothing for the b-tree reader to read
        return
    skipped: list[tuple[int | None, int]] = []
    try:
        read = (
            reader._table_read(nsys_sqlite.NVTX, spec, rows, skipped)
            if reader._table_layout(nsys_sqlite.NVTX)
            else None
        )
        if read is None:
            return
        try:
            expected = _sql_spec(reader, nsys_sqlite.NVTX, spec, rows)
            counted = _sql_skipped(reader, nsys_sqlite.NVTX, rows)
        except Exception:  # SQLite calls it damaged (or reads text it would not): fails there anyway
            return
    finally:
        reader.close()
    assert read.equals(expected)
    assert sorted(skipped, key=str) == sorted(counted, key=str)


# -- seek: one row by rowid (``_int_scan.seek``, through ``_Reader.first_row``) -------------------


def _first_row_by_sqlite(db: Path, table: str, column: str, at: int) -> tuple[int, int | None] | None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = conn.execute(
            f'SELECT rowid, CAST("{column}" AS INTEGER) FROM "{table}" WHERE rowid >= ? ORDER BY rowid LIMIT 1', (at,)
        ).fetchone()
    finally:
        conn.close()
    return None if row is None else (row[0], row[1])


@pytest.mark.parametrize("path", CAPTURES, ids=[f"{p.parent.name}/{p.name}"[-60:] for p in CAPTURES])
def test_a_seek_finds_sqlite_s_row_in_every_table_of_real_captures(path: Path, unpacked) -> None:
    """The first row at a rowid or later, by the b-tree walk, in every table of a real capture and
    every column it may read: before the first row, at 40 rowids between, past the last; SQLite's
    row each time, or the walk gives way (False) where the value found is not an integer or NULL."""
    db = unpacked(path)
    reader = _reader(db)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    seeks = 0
    try:
        for table in sorted(reader.tables):
            layout = reader._table_layout(table)
            if layout is None:
                continue
            low, high = conn.execute(f'SELECT IFNULL(min(rowid), 0), IFNULL(max(rowid), 0) FROM "{table}"').fetchone()
            for column, position in layout[1].items():
                if position < 0:
                    continue
                sql = (
                    f'SELECT rowid, CAST("{column}" AS INTEGER), typeof("{column}") FROM "{table}"'
                    " WHERE rowid >= ? ORDER BY rowid LIMIT 1"
                )
                for at in (low - 5, *range(low, high + 1, max(1, (high - low) // 40)), high, high + 1):
                    found = reader._seek(table, "rowid", at, column)
                    row = conn.execute(sql, (at,)).fetchone()
                    if found is False:
                        assert row is not None and row[2] not in ("integer", "null"), (table, column, at)
                        continue
                    assert found == (None if row is None else (row[0], row[1])), (table, column, at)
                    seeks += 1
    finally:
        conn.close()
        reader.close()
    assert seeks > 0


@settings(max_examples=80, deadline=None, derandomize=True)
@given(at=st.integers(-10, 950_000) | st.sampled_from([-(1 << 63), (1 << 63) - 1]), column=st.sampled_from("abc"))
def test_a_seek_on_a_deep_tree_with_gaps_is_sqlite_s(deep: Path, at: int, column: str) -> None:
    """Three levels of small pages, rowids with gaps, nulls and 64-bit extremes: the walk's row is
    SQLite's for any rowid, from below the first to past the last."""
    reader = _reader(deep)
    try:
        assert reader._seek("t", "rowid", at, column) == _first_row_by_sqlite(deep, "t", column, at)
        assert reader.first_row("t", "rowid", at, column) == _first_row_by_sqlite(deep, "t", column, at)
    finally:
        reader.close()


def test_a_seek_passes_children_whose_rows_were_deleted(tmp_path: Path) -> None:
    """Rows deleted (not vacuumed) leave interior keys above every rowid their child still holds,
    and whole leaves empty: a child without a row at or after the rowid sought passes the search
    on to the next, as SQLite's cursor does."""
    db = _made(tmp_path, "PRAGMA page_size = 512", "CREATE TABLE t (a INTEGER)")
    conn = sqlite3.connect(db)
    conn.executemany("INSERT INTO t (rowid, a) VALUES (?, ?)", ((i, i * 7) for i in range(1, 20_001)))
    conn.execute("DELETE FROM t WHERE rowid BETWEEN 5000 AND 9000 OR rowid % 10 = 3 OR rowid > 19990")
    conn.commit()
    conn.close()
    reader = _reader(db)
    try:
        for at in (*range(4990, 9012), *range(19980, 20003), 0, -1, 13, 23):
            assert reader._seek("t", "rowid", at, "a") == _first_row_by_sqlite(db, "t", "a", at), at
    finally:
        reader.close()


def test_a_seek_gives_way_where_sqlite_would_convert_or_spill(tmp_path: Path) -> None:
    """A float or a text at the row found, or its value on an overflow page: False (``first_row``
    then asks SQLite and gives its answer); a record that ends before the column (added later):
    NULL; a WAL file beside the database: False."""
    db = _made(
        tmp_path,
        "CREATE TABLE f (a, b INTEGER)",  # no type: the float and the text stay as they are
        "INSERT INTO f VALUES (1, 2), (2.5, 3), ('7', 4), (5, 6)",
        "CREATE TABLE spilled (blob BLOB, a INTEGER)",
        "INSERT INTO spilled VALUES (zeroblob(10000), 1)",
        "CREATE TABLE later (a INTEGER)",
        "INSERT INTO later VALUES (1)",
        "ALTER TABLE later ADD COLUMN b INTEGER",
        "INSERT INTO later VALUES (2, 20)",
    )
    reader = _reader(db)
    try:
        assert reader._seek("f", "rowid", 1, "a") == (1, 1)
        assert reader._seek("f", "rowid", 2, "a") is False
        assert reader._seek("f", "rowid", 3, "a") is False
        assert reader._seek("f", "rowid", 2, "b") == (2, 3)
        assert reader._seek("f", "rowid", 5, "a") is None
        for at in (2, 3):
            assert reader.first_row("f", "rowid", at, "a") == _first_row_by_sqlite(db, "f", "a", at)
        assert reader._seek("spilled", "rowid", 1, "a") is False
        assert reader.first_row("spilled", "rowid", 1, "a") == (1, 1)
        assert reader._seek("later", "rowid", 1, "b") == (1, None)
        assert reader._seek("later", "rowid", 2, "b") == (2, 20)
    finally:
        reader.close()
    (tmp_path / "made.sqlite-wal").write_bytes(b"")
    reader = _reader(db)
    try:
        assert reader._seek("f", "rowid", 1, "a") is False
        assert reader.first_row("f", "rowid", 1, "a") == (1, 1)
    finally:
        reader.close()


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    hits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=30),
    run=st.integers(1, 64),
    ats=st.lists(st.integers(-5, 6_000), min_size=1, max_size=20),
)
def test_a_seek_in_a_damaged_file_never_crashes_nor_finds_what_sqlite_would_not(
    small_capture: bytes,
    tmp_path_factory: pytest.TempPathFactory,
    hits: list[tuple[float, int]],
    run: int,
    ats: list[int],
) -> None:
    """Bytes overwritten anywhere in the kernel table's pages: the walk gives a row, None or
    False, never a crash; where SQLite finds a row, a row the walk found is the same."""
    table = nsys_sqlite.KERNEL
    db = _damaged(small_capture, table, hits, run, tmp_path_factory.mktemp("damaged_seek") / "cap.sqlite")
    try:
        reader = _reader(db)
    except Exception:  # the damage reached what opening checks
        return
    try:
        found = [reader._seek(table, "rowid", at, "start") if reader._table_layout(table) else False for at in ats]
    finally:
        reader.close()
    for at, row in zip(ats, found, strict=True):
        if row is False:
            continue
        try:
            expected = _first_row_by_sqlite(db, table, "start", at)
        except (sqlite3.DatabaseError, TypeError, OverflowError, ValueError):
            continue  # SQLite calls it damaged: the analysis fails there anyway
        assert row == expected, at
