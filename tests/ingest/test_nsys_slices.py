"""The sliced nsys read against the whole read.

``open_sliced`` must give, on every real export, the whole read's small frames and, slice by
slice, exactly its ``gpu_ops`` (launch columns included) in start order, with memory bounded by
the slice. The block machinery (binary search over rowids, the launch cache across blocks, API
tables split into runs, dropped launches re-read) only runs when a file holds more ops than a
block, so it is also run with blocks of one op and a short launch lag. A GPU table out of start
order must be refused, as must a launch key order the slices cannot resolve.
"""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from tests.conftest import OWN, PUBLIC_NSYS, needs_native, public_nsys
from traceguard import model
from traceguard.errors import InputError
from traceguard.ingest import nsys_slices, nsys_sqlite
from traceguard.ingest.nsys_slices import OpSlice, open_sliced
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite
from traceguard.ingest.rows import Rows

OWN_NSYS = sorted(OWN.glob("h200/*/cap_*.sqlite.gz"))
GRAPHS = sorted((OWN / "cuda_graphs").glob("*.sqlite.gz"))
CAPTURES = PUBLIC_NSYS + OWN_NSYS + GRAPHS
#: Two API runs (a late-written block per process), duplicated keys, a CUDA graph capture, one
#: of ours: the files that exercise the launch join's special cases.
SPECIAL = [
    public_nsys("h100_2gpu_1s"),
    public_nsys("mfu_2gpu_before"),
    public_nsys("saxpy"),
    OWN / "cuda_graphs" / "graph_level.sqlite.gz",
    OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz",
]
SMALL = ("ranges", "devices", "processes", "strings")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


def _ident(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _whole(db: Path, keep_correlation: bool = False) -> model.Capture:
    return read_nsys_sqlite(db, launches_only=True, keep_correlation=keep_correlation)


def _by_start(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort("start", maintain_order=True)


def _check_slices(windows: list[OpSlice], whole: pl.DataFrame, max_rows: int) -> None:
    """Every op once, the whole read's values and types, slices consecutive and in start
    order, at most ``max_rows`` ops unless they share one start."""
    for piece in windows:
        assert piece.ops.schema == whole.schema
        assert piece.lo < piece.hi
        if piece.ops.height:
            starts = piece.ops["start"]
            assert piece.lo <= starts.min() and starts.max() < piece.hi  # type: ignore[operator]
            assert piece.ops.height <= max_rows or starts.n_unique() == 1
    for before, after in itertools.pairwise(windows):
        assert before.hi == after.lo
    got = pl.concat([w.ops for w in windows]) if windows else whole.clear()
    assert_frame_equal(_by_start(got), _by_start(whole))


@pytest.mark.parametrize("gz", CAPTURES, ids=[_ident(p) for p in CAPTURES])
def test_slices_match_whole_read(gz: Path, unpacked) -> None:
    db = unpacked(gz)
    whole = _whole(db)
    with open_sliced(db) as sliced:
        small = sliced.small_capture()
        assert small.info == whole.info
        for name in SMALL:
            assert_frame_equal(getattr(small, name), getattr(whole, name))
        assert small.gpu_ops.height == 0 and small.gpu_ops.schema == whole.gpu_ops.schema
        assert small.api_calls.height == 0 and small.api_calls.schema == whole.api_calls.schema
        for max_rows in (1, 7, 1000, 10**7):
            windows = list(sliced.op_windows(max_rows))
            _check_slices(windows, whole.gpu_ops, max_rows)
            again = list(sliced.op_slices(max_rows))  # a second pass reads the file again
            assert len(again) == len(windows)
            for first, second in zip(windows, again, strict=True):
                assert_frame_equal(first.ops, second)


#: What a read without launches keeps of an op: what step inference reads of it (its kernel
#: sequence), besides the order its start checks.
_SEQUENCE = ["pid", "device", "kind", "start", "end", "name_id"]


@pytest.mark.parametrize("gz", CAPTURES, ids=[_ident(p) for p in CAPTURES])
def test_slices_without_launches_hold_what_step_inference_reads(gz: Path, unpacked) -> None:
    """A read without launches (the kernel sequence's) decodes only an op's process, device,
    kind, start, end and name: those are the whole read's, in the whole read's slices, and every
    other column it leaves null."""
    db = unpacked(gz)
    with open_sliced(db) as sliced:
        for max_rows in (7, 10**7):
            full = list(sliced.op_windows(max_rows))
            narrow = list(sliced.op_windows(max_rows, launches=False))
            assert [(w.lo, w.hi) for w in narrow] == [(w.lo, w.hi) for w in full]
            for cut, whole in zip(narrow, full, strict=True):
                assert cut.ops.schema == whole.ops.schema
                assert_frame_equal(cut.ops.select(_SEQUENCE), whole.ops.select(_SEQUENCE))
                graph = (cut.ops["kind"] == "graph").to_numpy()  # graph executions are read whole
                rest = cut.ops.filter(~pl.Series(graph)).drop(_SEQUENCE, "rank", "copy_kind")
                assert all(rest[c].null_count() == rest.height for c in rest.columns)
                copies = pl.col("kind") == "memcpy"
                assert_frame_equal(
                    cut.ops.filter(copies).select("copy_kind"), whole.ops.filter(copies).select("copy_kind")
                )


def _count_rereads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    rereads: list[int] = []
    reread = nsys_sqlite._Reader.reread_launches

    def counted(self: nsys_sqlite._Reader, ops: pl.DataFrame, launch_ids: list[int] | None = None) -> list[pl.Series]:
        rereads.append(ops.height)
        return reread(self, ops, launch_ids)

    monkeypatch.setattr(nsys_sqlite._Reader, "reread_launches", counted)
    return rereads


@pytest.mark.parametrize("limit", [nsys_slices.OTHER_KEYS_LIMIT, 0])
def test_ops_without_any_api_row_are_not_reread(limit: int, unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """nsys-ai's 2-rank capture has 31 ops whose (process, correlation id) no API row has
    (launched before the capture began; plain SQL below). With the keys of the
    non-launch API rows at hand they are known to have none and no slice re-reads the API tables
    for them; without (limit 0: too many keys to hold) each block re-reads. The ops are the
    whole read's either way."""
    db = unpacked(public_nsys("mfu_2gpu_before"))
    with sqlite3.connect(db) as conn:
        orphans = sum(
            conn.execute(
                f"SELECT count(*) FROM {table} o WHERE NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                "WHERE r.correlationId = o.correlationId AND r.globalTid >> 24 = o.globalPid >> 24)"
            ).fetchone()[0]
            for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
        )
    assert orphans == 31
    whole = _whole(db).gpu_ops
    assert whole["launch_start"].null_count() == orphans
    monkeypatch.setattr(nsys_slices, "MIN_BLOCK_ROWS", 1)
    monkeypatch.setattr(nsys_slices, "OTHER_KEYS_LIMIT", limit)
    rereads = _count_rereads(monkeypatch)
    with open_sliced(db) as sliced:
        _check_slices(list(sliced.op_windows(500)), whole, 500)
    assert (rereads == []) if limit else sum(rereads) >= orphans


def test_ops_launched_by_an_unlisted_call_are_still_reread(unpacked, tmp_path: Path, monkeypatch) -> None:
    """Memsets launched by a call outside LAUNCH_API: their keys are among the non-launch API
    rows', so the slices re-read them, and join them as the whole read does."""
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    copy = tmp_path / "renamed.sqlite"
    shutil.copyfile(db, copy)
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE StringIds SET value = 'someUnlistedCall_v1' WHERE value = 'cudaMemsetAsync_v3020'")
    whole = _whole(copy).gpu_ops
    memsets = whole.filter(pl.col("kind") == "memset")
    assert memsets.height == 513 and memsets["launch_start"].null_count() == 0
    monkeypatch.setattr(nsys_slices, "MIN_BLOCK_ROWS", 1)
    rereads = _count_rereads(monkeypatch)
    with open_sliced(copy) as sliced:
        _check_slices(list(sliced.op_windows(1000)), whole, 1000)
    assert sum(rereads) == 513


@pytest.mark.parametrize("gz", CAPTURES, ids=[_ident(p) for p in CAPTURES])
def test_small_blocks_match_whole_read(gz: Path, unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of ``max_rows`` ops: each block found by binary search, launches joined from the
    rows read so far (the API tables split into runs where they are out of order)."""
    db = unpacked(gz)
    whole = _whole(db).gpu_ops
    monkeypatch.setattr(nsys_slices, "MIN_BLOCK_ROWS", 1)
    with open_sliced(db) as sliced:
        for max_rows in (100, 1000):
            _check_slices(list(sliced.op_windows(max_rows)), whole, max_rows)


@pytest.mark.parametrize("gz", SPECIAL, ids=[_ident(p) for p in SPECIAL])
def test_dropped_launches_are_reread(gz: Path, unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch cache that keeps launches 1 µs or 3 blocks' rows at most: ops whose launch was
    dropped (or may share a key with one dropped) take the exact re-read, by short IN lists or a
    chunked scan."""
    db = unpacked(gz)
    whole = _whole(db).gpu_ops
    monkeypatch.setattr(nsys_slices, "MIN_BLOCK_ROWS", 1)
    monkeypatch.setattr(nsys_slices, "LAUNCH_LAG_NS", 1_000)
    monkeypatch.setattr(nsys_slices, "LAUNCH_CACHE_FACTOR", 3)
    monkeypatch.setattr(nsys_sqlite, "IN_LIST_IDS", 5)  # re-reads by several IN lists,
    monkeypatch.setattr(nsys_sqlite, "IN_LISTS", 2)  # or, past 10 ids, by a scan in chunks
    monkeypatch.setattr(nsys_sqlite, "ID_SCAN_ROWS", 1000)
    rereads = _count_rereads(monkeypatch)
    with open_sliced(db) as sliced:
        for max_rows in (2, 5) if whole.height < 100 else (20, 200):  # several blocks in every file
            _check_slices(list(sliced.op_windows(max_rows)), whole, max_rows)
    assert rereads  # the fallback ran


@pytest.mark.parametrize("reader", ["c", "adbc", "one core"])
def test_readers(unpacked, monkeypatch: pytest.MonkeyPatch, reader: str) -> None:
    """The same slices whether launch rows are read on a second thread (the C reader, two
    cores), on this one, or by ADBC (no C reader)."""
    db = unpacked(public_nsys("mfu_2gpu_before"))
    whole = _whole(db).gpu_ops
    monkeypatch.setattr(nsys_slices, "MIN_BLOCK_ROWS", 1)
    monkeypatch.setattr(nsys_sqlite, "_free_cores", lambda: 1 if reader == "one core" else 2)
    if reader == "adbc":
        monkeypatch.setattr(nsys_sqlite, "_int_scan", None)
    with open_sliced(db) as sliced:
        _check_slices(list(sliced.op_windows(500)), whole, 500)


@pytest.mark.parametrize("way", ["b-tree walk", "sqlite"])
def test_reread_of_many_ids(unpacked, way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """12,000 correlation ids: the b-tree reader looks them up in one pass; in one SQL IN list
    they exceed the hardened connection's program size limit, so through SQLite the re-read
    splits them (or scans). Either way: the same launches as a join of all calls."""
    walked: list[int] = []
    if way == "sqlite":
        monkeypatch.setattr(nsys_sqlite._Reader, "api_table_walked", lambda self, table, rows: None)
    elif nsys_sqlite._int_scan is None:
        needs_native(False, "traceguard.ingest._int_scan")  # CI: the walk must be tested
    else:
        walk = nsys_sqlite._Reader.api_table_walked

        def counted(self: nsys_sqlite._Reader, table: str, rows: Rows) -> pl.DataFrame | None:
            frame = walk(self, table, rows)
            walked.append(len(rows.values) if frame is not None else 0)
            return frame

        monkeypatch.setattr(nsys_sqlite._Reader, "api_table_walked", counted)
    db = unpacked(public_nsys("h100_2gpu_1s"))
    full = read_nsys_sqlite(db)
    ops = full.gpu_ops.filter(pl.col("correlation_id").is_not_null())
    extra = pl.DataFrame({"pid": [ops["pid"][0]] * 12_000, "correlation_id": range(10**9, 10**9 + 12_000)})
    ops = pl.concat([ops.select("pid", "correlation_id"), extra.cast(ops.select("pid", "correlation_id").schema)])
    expected = model.gather_launches(full.api_calls, model.launch_rows(ops, full.api_calls))
    reader = nsys_sqlite.open_reader(db, str(db), launches_only=False, keep_correlation=True)
    try:
        found = reader.reread_launches(ops)
    finally:
        reader.close()
    for got, want in zip(found, expected, strict=True):
        assert got.equals(want)
    assert found[0].tail(extra.height).null_count() == extra.height  # the made-up ids have no call
    if way == "b-tree walk":
        assert walked and max(walked) > 12_000  # every id in one pass of the b-tree reader
    assert found[0].head(ops.height - extra.height).null_count() < ops.height - extra.height


def test_keep_correlation(unpacked) -> None:
    db = unpacked(public_nsys("h100_2gpu_1s"))
    whole = _whole(db, keep_correlation=True).gpu_ops
    assert whole["correlation_id"].null_count() < whole.height
    with open_sliced(db, keep_correlation=True) as sliced:
        _check_slices(list(sliced.op_windows(1000)), whole, 1000)


def _copy(db: Path, tmp_path: Path) -> Path:
    target = tmp_path / db.name
    shutil.copyfile(db, target)
    return target


def _swap_rows(db: Path, table: str, first: int, second: int) -> None:
    """Swap every column of two rows of ``table`` (their rowids stay)."""
    conn = sqlite3.connect(db)
    try:
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        rows = {
            rowid: conn.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
            for rowid in (first, second)
        }
        sets = ", ".join(f"{c} = ?" for c in columns)
        for rowid, other in ((first, second), (second, first)):
            conn.execute(f"UPDATE {table} SET {sets} WHERE rowid = ?", (*rows[other], rowid))
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize(("max_rows", "block_rows"), [(10, 1), (10, nsys_slices.MIN_BLOCK_ROWS), (10**7, 1)])
def test_kernels_out_of_order_are_refused(
    unpacked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_rows: int, block_rows: int
) -> None:
    monkeypatch.setattr(nsys_slices, "MIN_BLOCK_ROWS", block_rows)
    db = _copy(unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"), tmp_path)
    table = nsys_sqlite.KERNEL
    _swap_rows(db, table, 100, 200)
    whole = _whole(db).gpu_ops  # the whole read takes the file as it is
    assert whole.height
    with open_sliced(db) as sliced:
        assert sliced.small_capture().gpu_ops.height == 0
        with pytest.raises(InputError, match=f"{table} is not in time order") as caught:
            list(sliced.op_slices(max_rows))
    assert "cannot be read in slices" in caught.value.message
    assert caught.value.hint.startswith("analyse it whole: give --sliced-above")


def test_launch_key_order_unresolvable_in_slices_is_refused(
    unpacked, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h100_2gpu_1s's API table is two runs, one per process. Give a launch row from the middle
    of the first run the key of an early launch of the second: the whole read joins that row
    (first in rowid order) to the early op. Once the runs are known (after a first pass, which
    reads the first run whole when it meets the second), slices of 100 ops join the early launch
    before that row is read, so they refuse; one block holding everything does not."""
    db = _copy(unpacked(public_nsys("h100_2gpu_1s")), tmp_path)
    conn = sqlite3.connect(db)
    try:
        table = nsys_sqlite.RUNTIME
        starts = [row[0] for row in conn.execute(f"SELECT start FROM {table} ORDER BY rowid")]
        split = next(i for i in range(1, len(starts)) if starts[i] < starts[i - 1]) + 1  # rowid of the 2nd run
        kernels = nsys_sqlite.KERNEL
        pid_of = "(globalTid >> 24) & 16777215"
        early = conn.execute(  # the second run's launch row of its process's first kernel
            f"SELECT r.rowid, r.correlationId, r.globalTid, k.start FROM {table} r JOIN {kernels} k "
            f"ON k.correlationId = r.correlationId AND (k.globalPid >> 24) & 16777215 = {pid_of} "
            f"WHERE r.rowid >= ? ORDER BY k.start LIMIT 1",
            (split,),
        ).fetchone()
        last = conn.execute(f"SELECT max(start) FROM {kernels}").fetchone()[0]
        late = conn.execute(  # a launch row of the first run halfway between that kernel and the last
            f"SELECT rowid FROM {table} WHERE rowid < ? AND start > ? AND start < ? AND "
            f"nameId = (SELECT nameId FROM {table} WHERE rowid = ?) ORDER BY rowid DESC LIMIT 1",
            (split, (early[3] + last) // 2, last, early[0]),
        ).fetchone()
        conn.execute(
            f"UPDATE {table} SET correlationId = ?, globalTid = ? WHERE rowid = ?", (early[1], early[2], late[0])
        )
        conn.commit()
    finally:
        conn.close()
    whole = _whole(db).gpu_ops
    monkeypatch.setattr(nsys_slices, "MIN_BLOCK_ROWS", 1)
    monkeypatch.setattr(nsys_slices, "LAUNCH_CACHE_FACTOR", 1000)  # every launch row stays cached
    with open_sliced(db) as sliced:  # runs not known: the first run is read whole when the second is met
        _check_slices(list(sliced.op_windows(100)), whole, 100)
    with open_sliced(db) as sliced:
        _check_slices(list(sliced.op_windows(10**7)), whole, 10**7)  # one block; finds the runs
        with pytest.raises(InputError, match="cannot resolve"):
            list(sliced.op_slices(100))


def test_max_rows_must_be_positive(unpacked) -> None:
    with open_sliced(unpacked(public_nsys("mock"))) as sliced, pytest.raises(ValueError):
        next(sliced.op_slices(0))


def test_the_glance_at_a_file_counts_its_processes_and_bounds_its_nvtx_rows(unpacked) -> None:
    """``processes_at_start`` tells nsys-ai's two-rank export from a one-rank capture without a
    read (the plan itself is the census over every slice), and ``nvtx_rows_at_most`` bounds the
    NVTX table by its rowids; the rows kept for a whole read are read again once let go."""
    with open_sliced(unpacked(public_nsys("mfu_2gpu_before")), shown="two") as two:
        assert two.processes_at_start() == 2
        rows = two.nvtx_rows_at_most()
        frame, _folded = two.nvtx_rows()
        assert rows >= frame.height > 0
        two.drop_nvtx_rows()
        again, _ = two.nvtx_rows()
        assert again is not frame and again.equals(frame)
    with open_sliced(unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"), shown="one") as one:
        assert one.processes_at_start() == 1


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(st.none() | st.integers(0, 40), st.none() | st.integers(0, 60)), max_size=40),
    marks=st.dictionaries(st.integers(0, 40), st.integers(0, 60), max_size=24),
)
def test_at_most_compares_as_the_join_does(rows: list[tuple[int | None, int | None]], marks: dict[int, int]) -> None:
    """``_at_most`` by comparisons (a few pids) gives what its join gives (any number of them):
    a row is doubtful when its pid has a mark and its correlation id is at most that mark."""
    frame = pl.DataFrame(rows, schema={"pid": pl.Int64, "correlation_id": pl.Int64}, orient="row")
    expected = [pid in marks and corr is not None and corr <= marks[pid] for pid, corr in rows]
    assert nsys_slices._at_most(frame, marks).to_list() == expected


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(0, 40)), st.one_of(st.none(), st.integers(-5, 10**12)), st.booleans()
        ),
        max_size=60,
    ),
    before=st.dictionaries(st.integers(0, 40), st.integers(-5, 10**12), max_size=5),
    masked=st.booleans(),
)
def test_marks_are_the_largest_id_per_process(
    rows: list[tuple[int | None, int | None, bool]], before: dict[int, int], masked: bool
) -> None:
    """The launch join's marks (largest correlation id per process, raised): each process's
    largest id over the rows picked, nulls counting for nothing, with more processes than are
    compared one by one (40 here, 16 compared) grouped instead."""
    import numpy as np

    pids = pl.Series([r[0] for r in rows], dtype=pl.Int32)
    ids = pl.Series([r[1] for r in rows], dtype=pl.Int64)
    where = np.array([r[2] for r in rows], dtype=bool) if masked else None
    want = dict(before)
    for pid, cid, picked in rows:
        if pid is not None and cid is not None and (picked or not masked):
            want[pid] = max(want.get(pid, cid), cid)
    marks = dict(before)
    nsys_slices._raise_marks(marks, pids, ids, where)
    assert marks == want


@pytest.mark.parametrize("path", PUBLIC_NSYS, ids=lambda p: p.name[-48:])
def test_the_non_launch_keys_pass_finds_the_runs_the_runs_pass_does(path: Path, unpacked) -> None:
    """The pass that reads the non-launch API keys also finds each API table's runs (rowid
    ranges in start order) on the way: the runs of the pass that reads only starts, on real
    exports (nsys-ai's two-rank capture writes its API table in thousands of runs)."""
    db = unpacked(path)
    with open_sliced(db) as sliced:
        sliced._other_keys()
        found = dict(sliced._runs)
        reader = sliced._reader
        for name in reader.api_tables():
            rowid, _first, _last = nsys_slices._rowid_bounds(reader, name, sliced.shown)
            expected = nsys_slices._find_runs(reader, name, rowid)
            columns = reader.columns(name)
            if {"nameId", "correlationId", "globalTid"} <= columns:
                assert found[name] == expected
            else:
                assert name not in found  # left to the runs pass
    with open_sliced(db) as sliced:
        sliced.prepare_launches(lambda: True)  # one pass where it can, the runs pass for the rest
        reader = sliced._reader
        for name in reader.api_tables():
            rowid, _first, _last = nsys_slices._rowid_bounds(reader, name, sliced.shown)
            assert sliced._runs[name] == nsys_slices._find_runs(reader, name, rowid)
            if "mfu_2gpu_before" in path.name:
                assert len(sliced._runs[name]) > 1


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 400), max_size=120), st.data(), st.sampled_from([2, 3, 256]))
def test_the_launch_cache_merges_by_slices_as_a_sort_by_rowid_would(
    rowids: set[int], data: st.DataObject, pieces: int
) -> None:
    """Rows read for a block join the launch cache in rowid order: put together from slices of
    the held and the new rows (no copy), or sorted when they interleave in more pieces than
    ``most`` (the cache's: ``_MERGE_PIECES``); either way the frame a stable sort by rowid gives."""
    ordered = sorted(rowids)
    held_mask = data.draw(st.lists(st.booleans(), min_size=len(ordered), max_size=len(ordered)))
    schema = {"rowid": pl.Int64, "start": pl.Int64}

    def frame(ids: list[int]) -> pl.DataFrame:
        return pl.DataFrame({"rowid": ids, "start": [i * 3 for i in ids]}, schema=schema)

    held = frame([r for r, h in zip(ordered, held_mask, strict=True) if h])
    new = frame([r for r, h in zip(ordered, held_mask, strict=True) if not h])
    merged = nsys_slices._merged_by_rowid(held, new, most=pieces)
    assert_frame_equal(merged, pl.concat([held, new]).sort("rowid", maintain_order=True))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), max_size=200), st.sampled_from([2, 256]))
def test_what_the_launch_cache_keeps_is_what_a_filter_keeps(keep: list[bool], pieces: int) -> None:
    """The rows the cache keeps after an eviction, taken as slices where they are few runs of
    rows (each API run's newest rows), else filtered: the filter's frame either way."""
    frame = pl.DataFrame({"rowid": list(range(len(keep)))}, schema={"rowid": pl.Int64})
    mask = np.array(keep, dtype=bool)
    kept = nsys_slices._kept(frame, mask, most=pieces)
    assert_frame_equal(kept, frame.filter(pl.Series(mask, dtype=pl.Boolean)))
