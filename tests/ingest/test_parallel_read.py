"""The two-process read of big nsys exports gives exactly the single-process result.

Big captures have their CUDA API rows read partly by a worker process (``nsys_sqlite``'s
``start_api_calls``); here the threshold is lowered so the public fixtures take that path, and
the frames are compared with a plain in-process read of the same file.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.conftest import OWN, PUBLIC_NSYS, needs_native, public_nsys
from traceguard.errors import InputError
from traceguard.ingest import nsys_sqlite
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite
from traceguard.ingest.sqlite_safe import open_readonly

FRAMES = ("gpu_ops", "api_calls", "ranges", "devices", "processes", "strings")
CASES = [public_nsys("h100_2gpu_1s"), public_nsys("saxpy"), OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"]


def force_worker(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Make every read use the worker process; returns the commands it was started with."""
    monkeypatch.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 0)
    monkeypatch.setattr(nsys_sqlite, "_free_cores", lambda: 2)
    return record_spawns(monkeypatch)


def record_spawns(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands of the worker processes reads start from now on (they still run)."""
    spawned: list[list[str]] = []
    real_popen = nsys_sqlite.subprocess.Popen

    def popen(command, **kwargs):
        spawned.append(command)
        return real_popen(command, **kwargs)

    monkeypatch.setattr(nsys_sqlite.subprocess, "Popen", popen)
    return spawned


def _serial(db: Path, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as m:
        m.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 10**18)
        return read_nsys_sqlite(db)


@pytest.mark.parametrize("gz", CASES, ids=lambda p: p.name)
@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_worker_read_is_identical(gz: Path, share: float, unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    db = unpacked(gz)
    serial = _serial(db, monkeypatch)
    monkeypatch.setattr(nsys_sqlite, "WORKER_SHARE", share)
    spawned = force_worker(monkeypatch)
    parallel = read_nsys_sqlite(db)
    assert spawned, "the worker was not used"
    for name in FRAMES:
        assert getattr(parallel, name).equals(getattr(serial, name)), name


def test_failed_worker_falls_back(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    db = unpacked(public_nsys("h100_2gpu_1s"))
    serial = _serial(db, monkeypatch)
    monkeypatch.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 0)
    monkeypatch.setattr(nsys_sqlite, "_free_cores", lambda: 2)
    monkeypatch.setattr(nsys_sqlite, "_WORKER_CODE", "import sys; sys.exit(3)")
    again = read_nsys_sqlite(db)
    for name in FRAMES:
        assert getattr(again, name).equals(getattr(serial, name)), name


def test_every_public_fixture_splits_the_same(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nsys_sqlite, "_free_cores", lambda: 2)
    for gz in PUBLIC_NSYS:
        db = unpacked(gz)
        serial = _serial(db, monkeypatch)
        with monkeypatch.context() as m:
            m.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 0)
            parallel = read_nsys_sqlite(db)
        assert parallel.api_calls.equals(serial.api_calls), gz.name


def test_a_read_that_shares_its_cores_starts_no_worker(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where as many map processes as cores read at once (``share_cores``), a read keeps to its
    one core: no second process, and the same frames as the read that starts one."""
    db = unpacked(public_nsys("h100_2gpu_1s"))
    serial = _serial(db, monkeypatch)
    monkeypatch.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 0)
    monkeypatch.setattr(nsys_sqlite.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(nsys_sqlite, "_core_sharers", 1)  # restored after the test
    spawned = record_spawns(monkeypatch)
    alone = read_nsys_sqlite(db)
    assert len(spawned) == 1, "alone on two cores, the read starts its worker"
    nsys_sqlite.share_cores(2)
    assert nsys_sqlite._free_cores() == 1
    shared = read_nsys_sqlite(db)
    assert len(spawned) == 1, "sharing two cores with another map, the read starts none"
    for name in FRAMES:
        assert getattr(shared, name).equals(getattr(serial, name)), name
        assert getattr(alone, name).equals(getattr(serial, name)), name
    nsys_sqlite.share_cores(0)  # nonsense counts as alone
    assert nsys_sqlite._free_cores() == 2


@pytest.mark.parametrize("launches_only", [False, True])
def test_this_process_reads_its_part_by_the_b_tree(launches_only: bool, unpacked, monkeypatch) -> None:
    """The rows the worker leaves are a rowid range that this process reads through the b-tree
    reader (as SQL, ``rowid > cut``, SQLite read them at 2.5x the worker's time a row)."""
    needs_native(hasattr(nsys_sqlite._int_scan, "table"), "traceguard.ingest._int_scan")
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    with monkeypatch.context() as m:
        m.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 10**18)
        serial = read_nsys_sqlite(db, launches_only=launches_only)
    force_worker(monkeypatch)
    by_sql: list[str] = []
    real_scan_ints = nsys_sqlite.scan_ints

    def scan_ints(path, sql):
        by_sql.append(sql)
        return real_scan_ints(path, sql)

    monkeypatch.setattr(nsys_sqlite, "scan_ints", scan_ints)
    parallel = read_nsys_sqlite(db, launches_only=launches_only)
    assert not [sql for sql in by_sql if nsys_sqlite.RUNTIME in sql], by_sql
    for name in FRAMES:
        assert getattr(parallel, name).equals(getattr(serial, name)), name


def test_a_table_up_to_the_largest_rowid_splits_the_same(unpacked, tmp_path: Path, monkeypatch) -> None:
    """A range's exclusive end cannot pass SQLite's largest rowid: where the API table holds
    it, the rest is read by its SQL condition, and the frames are still the single read's."""
    import shutil
    import sqlite3

    db = tmp_path / "largest_rowid.sqlite"
    shutil.copy(unpacked(public_nsys("h100_2gpu_1s")), db)
    with sqlite3.connect(db) as conn:
        table = nsys_sqlite.RUNTIME
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        last = conn.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY rowid DESC LIMIT 1").fetchone()
        conn.execute(
            f"INSERT INTO {table} (rowid, {', '.join(columns)}) VALUES ({(1 << 63) - 1}, "
            f"{', '.join('?' * len(columns))})",
            last,
        )
    serial = _serial(db, monkeypatch)
    spawned = force_worker(monkeypatch)
    parallel = read_nsys_sqlite(db)
    assert spawned, "the worker was not used"
    assert parallel.api_calls.height == serial.api_calls.height
    for name in FRAMES:
        assert getattr(parallel, name).equals(getattr(serial, name)), name


# -- the NVTX table read in pieces, by its own thread and another (``_Reader.help_read_nvtx``) --

NVTX_CASES = [*PUBLIC_NSYS, OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"]


def _nvtx_reader(db: Path) -> nsys_sqlite._Reader:
    return nsys_sqlite._Reader(open_readonly(db), db, str(db))


def _nvtx_read(db: Path, piece_rows: int, monkeypatch: pytest.MonkeyPatch, *, helped: bool = False):
    """``nvtx_rows`` of a fresh reader with pieces of ``piece_rows`` rowids, and the pieces read
    (one mark each); ``helped``: a second thread takes pieces as well while the read runs (as the
    sliced map's reading thread does), and the marks are the pieces it took."""
    with monkeypatch.context() as m:
        m.setattr(nsys_sqlite, "NVTX_PIECE_ROWS", piece_rows)
        reader = _nvtx_reader(db)
        taken: list[int] = []
        real_bulk = reader.bulk
        if not helped:

            def counted(*args, **kwargs):
                taken.append(1)
                return real_bulk(*args, **kwargs)

            m.setattr(reader, "bulk", counted)
            try:
                return reader.nvtx_rows(), taken
            finally:
                reader.close()
        started, go = threading.Event(), threading.Event()

        def bulk(*args, **kwargs):
            # Each piece waits until the helper runs, so that both threads take pieces.
            if threading.current_thread() is threading.main_thread():
                started.set()
                go.wait(5)
            else:
                taken.append(1)
            return real_bulk(*args, **kwargs)

        m.setattr(reader, "bulk", bulk)

        def helper() -> None:
            started.wait(5)
            go.set()
            reader.help_read_nvtx()

        thread = threading.Thread(target=helper)
        thread.start()
        try:
            return reader.nvtx_rows(), taken
        finally:
            thread.join()
            reader.close()


@pytest.mark.parametrize("gz", NVTX_CASES, ids=lambda p: p.name[-50:])
def test_nvtx_pieces_read_the_single_read_s_rows(gz: Path, unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read in rowid pieces (a few rows each, so that every real capture here has many), by one
    thread or by two, the NVTX table gives the single read's frame and folded counts exactly:
    nsys-ai's per-op captures fold 95 % of their rows, so the pieces' counts are summed per
    thread across pieces. A capture without NVTX rows (three of nsys-ai's and pipit's) is read
    once, whatever the piece size."""
    db = unpacked(gz)
    (whole_rows, whole_folded), _ = _nvtx_read(db, 10**12, monkeypatch)
    span = whole_rows.height + (whole_folded["ranges"].sum() if whole_folded.height else 0)
    if span == 0:
        (rows, folded), taken = _nvtx_read(db, 1, monkeypatch)
        assert rows.equals(whole_rows) and folded.equals(whole_folded)
        assert len(taken) <= 1
        return
    piece = max(1, span // 7)
    for helped in (False, True):
        (rows, folded), taken = _nvtx_read(db, piece, monkeypatch, helped=helped)
        assert rows.equals(whole_rows), helped
        assert folded.equals(whole_folded), helped
        assert len(taken) >= (1 if helped else 4), "not read in pieces, or not by both threads"


def test_a_piece_s_error_is_the_read_s(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece that fails (here the third, whichever thread reads it) fails the read on its own
    thread with that error, after the pieces other threads took have ended; the helping thread
    is not the one that raises."""
    db = unpacked(public_nsys("mfu_2gpu_before"))
    monkeypatch.setattr(nsys_sqlite, "NVTX_PIECE_ROWS", 50)
    reader = _nvtx_reader(db)
    calls: list[int] = []
    real_bulk = reader.bulk

    def bulk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise InputError("the third piece is damaged")
        return real_bulk(*args, **kwargs)

    monkeypatch.setattr(reader, "bulk", bulk)
    helped: list[BaseException] = []

    def helper() -> None:
        try:
            while not calls:
                time.sleep(0.001)
            reader.help_read_nvtx()
        except BaseException as exc:  # the test's own check: nothing may reach here
            helped.append(exc)

    thread = threading.Thread(target=helper)
    thread.start()
    try:
        with pytest.raises(InputError, match="third piece"):
            reader.nvtx_rows()
    finally:
        thread.join()
        reader.close()
    assert not helped
    assert reader._nvtx_read is None  # no read left to help


def test_a_shared_read_gives_pieces_in_order_and_raises_the_first_error() -> None:
    """Whoever reads them, the pieces come back in their order; errors wait for the pieces taken
    to end and the first in piece order is raised by the owner; an interrupt stops the thread it
    met at once (the owner raises it too)."""
    order = [lambda i=i: i for i in range(6)]
    shared = nsys_sqlite._SharedRead(order)
    helper = threading.Thread(target=shared.help)
    helper.start()
    assert shared.results() == list(range(6))
    helper.join()

    def fail(message: str):
        def piece():
            raise InputError(message)

        return piece

    with pytest.raises(InputError, match="second"):
        nsys_sqlite._SharedRead([lambda: 0, fail("second"), fail("third")]).results()

    def interrupt():
        raise KeyboardInterrupt

    ran: list[int] = []
    pieces = [interrupt, lambda: ran.append(1)]
    shared = nsys_sqlite._SharedRead(pieces)
    with pytest.raises(KeyboardInterrupt):
        shared.help()  # a helper meets the interrupt: raised here, the next piece left
    assert ran == []
    with pytest.raises(KeyboardInterrupt):
        shared.results()  # the owner reads what is left, then raises it as well
    assert ran == [1]
