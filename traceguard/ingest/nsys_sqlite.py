"""Read ``nsys export --type sqlite`` files of every schema generation into a :class:`Capture`.

Seen in the wild (../shared/fixtures/public): schema 2.9.1 (nsys 2022.2) to 3.25.0 (2026.2).
The schema version is the compatibility axis, but rather than branching on it we look at which
tables and columns a file actually has: tables come and go (newer exporters omit empty ones),
columns grow. Absent tables mean "not available"; unknown ones are ignored.

Speed: integer columns of the event tables are read by a small C loop straight into Arrow
buffers (:mod:`._int_scan`: ≈2.6 s for six columns of 10 M kernel rows on 2 cores, where ADBC
needs 4.8 s and sqlite3 ``fetchall`` several times that in time and memory); text goes through
ADBC into Arrow, and the small tables (metadata, enums, GPU info, processes) through
:mod:`sqlite3`. Without the compiled loop (no C compiler at install) ADBC reads everything. All
per-row work is vectorized in SQL or Polars. Safety: the file is opened read-only and hardened
(:mod:`.sqlite_safe`), only real tables are read (never views), and every failure becomes an
:class:`InputError`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import itertools
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import polars as pl

from traceguard import model
from traceguard.errors import InputError
from traceguard.ingest import gpu_metrics
from traceguard.ingest.cache import gunzip_cached
from traceguard.ingest.rows import LOWEST_ROWID, Rows, Skip, int_list
from traceguard.ingest.sqlite_safe import (
    SAFE_PRAGMAS,
    open_readonly,
    readonly_uri,
    real_tables,
    sqlite_limits,
    table_columns,
    wrap_sqlite_error,
)
from traceguard.memory import release_heap, usable_cores
from traceguard.model import Capture

try:  # the declared dependency; the sqlite3 path below is the (slow) fallback
    import adbc_driver_manager

    #: ADBC raises its own errors from execute and plain OSError from Arrow stream reads.
    _ADBC_ERRORS: tuple[type[Exception], ...] = (OSError, adbc_driver_manager.Error)
    #: Whether ADBC's SQLite driver is installed. Its DB-API module is imported when a read first
    #: needs it (:func:`_adbc_dbapi`): it imports pyarrow, 55 ms of every command's start, and the
    #: b-tree reader takes most reads without it.
    _HAS_ADBC = importlib.util.find_spec("adbc_driver_sqlite") is not None
except ImportError:  # pragma: no cover - adbc-driver-sqlite is a hard dependency
    _HAS_ADBC = False
    _ADBC_ERRORS = (OSError,)

try:  # built at install when a C compiler and SQLite's header are there (setup.py)
    from traceguard.ingest import _int_scan
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    _int_scan = None

#: What a failed read raises, whichever reader ran.
_READ_ERRORS: tuple[type[Exception], ...] = (*_ADBC_ERRORS, *((_int_scan.Error,) if _int_scan else ()))

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
#: One row per CUDA graph execution when nsys traced graphs as a whole (``--cuda-graph-trace=graph``,
#: its default); with ``=node`` the graph's kernels/copies are in the tables above instead.
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER = "CUPTI_ACTIVITY_KIND_DRIVER"
NVTX = "NVTX_EVENTS"
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # 2024.5+ name first, 2022.x second

NVTX_PUSH_POP = 59
NVTX_START_END = 60
NVTX_DOMAIN_CREATE = 75
#: The text of PyTorch's per-op NVTX ranges (``torch.autograd.profiler.emit_nvtx``, Lightning's
#: and NeMo's nsys modes: ``aten::addmm, seq = 12, op_id = 34``, one range per ATen operator
#: call, 95 % of such a capture's ranges). No metric reads them as rows, so they are counted per
#: thread and not kept (docs/steps.md, "Per-op ranges"): 48 M of them took 10.9 s and 3 GB to
#: read as strings, their count alone takes the b-tree walk. The same is done with the ranges
#: ``emit_nvtx`` opens for other operators and autograd nodes (:class:`~.rows.Skip`'s
#: ``operators``: ``c10d::alltoall_base_, op_id = 7``, ``FlashAttnFunc, seq = 3, op_id = 8``).
OP_RANGE_PREFIX = "aten::"

#: Synthetic names for copies and sets (nsys records no name for them). Negative ids cannot
#: collide with ``StringIds`` (which are non-negative).
MEMCPY_NAME_IDS: dict[str, int] = {kind: -(1 + i) for i, kind in enumerate(model.COPY_KINDS)}
MEMSET_NAME_ID = -(len(model.COPY_KINDS) + 1)
SYNTHETIC_STRINGS: dict[int, str] = {
    **{name_id: f"Memcpy {kind}" for kind, name_id in MEMCPY_NAME_IDS.items()},
    MEMSET_NAME_ID: "Memset",
}
#: Graph executions are named ``CUDA graph <graphId>``, interned below this id (one per graph).
GRAPH_NAME_BASE = -1_000_000

#: Environment variables of the profiled command worth keeping (rank resolution, NCCL tuning).
#: An allowlist on purpose: captured environments hold secrets (tokens, keys).
_ENV_KEEP_PREFIXES = ("NCCL_", "TORCH_NCCL_", "OMPI_COMM_WORLD_")
_ENV_KEEP = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "TORCHELASTIC_RUN_ID",
    "CUDA_VERSION",
    "NV_LIBNCCL_PACKAGE_VERSION",
    "PMI_RANK",
    "PMI_SIZE",
    "PMI_LOCAL_RANK",
    "PMI_LOCAL_SIZE",
    "PMIX_RANK",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NNODES",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
}
_ENV_SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL")

#: Rows per Arrow batch from ADBC. The driver's default (1024) spends ~30% of a 10 M-row read on
#: per-batch overhead; 256 k rows (~2 MB per column) removes that and keeps text batches small.
_BATCH_ROWS = 1 << 18
#: Integer-only reads come as one batch (one chunk per column, read as fast and with no more
#: memory): a frame whose columns share one chunk layout is never copied whole by Polars when a
#: column is added (see :func:`model.add_columns`). Text is batched: its offsets are 32-bit.
#: (The C reader always returns one chunk per column.)
_INT_BATCH_ROWS = 1 << 30
#: Above this many CUDA API rows (``max(rowid)``, exact enough) the API tables are read in a
#: second process while this one reads the GPU tables: the API tables are the largest in a capture
#: (2-3 rows per GPU op). Not a thread, though both readers release the GIL: on the 10 M-kernel
#: capture a thread read no faster (5.0-5.7 s against 5.0-5.2 s), though it saves the worker's
#: interpreter start; likely the two readers' page faults and one shared Polars pool.
PARALLEL_API_ROWS = 2_000_000
#: SQLite's largest rowid: a range's exclusive end cannot pass it.
_HIGHEST_ROWID = (1 << 63) - 1
#: What one piece of a :class:`_SharedRead` gives.
_Piece = TypeVar("_Piece")
#: Rowids of the NVTX table a piece of its read takes (:meth:`_Reader.help_read_nvtx`).
NVTX_PIECE_ROWS = 2_000_000
#: The worker's share of the largest API table. The worker starts an interpreter (≈0.5 s) and
#: reads only API rows; this process reads the GPU and NVTX tables (≈ as many bytes as 70% of the
#: API rows on real captures) and then the rest.
WORKER_SHARE = 0.7
#: The same for the launches-only read, where the worker's rows (filtered to launch calls) cost
#: it less; set so that both processes finish together on the 10 M-kernel capture (0.83 while this
#: process read its part through SQLite; both end within 0.02-0.16 s of each other at 0.78).
LAUNCHES_WORKER_SHARE = 0.78

#: CUDA API calls that put work on a GPU (kernel, cooperative and graph launches, every memcpy and
#: memset variant, runtime and driver, any version or ``_ptsz``/``_ptds`` suffix). The
#: launches-only read keeps just these rows; an op launched by any other call is still found (see
#: :meth:`_Reader.attach_launches`).
LAUNCH_API = re.compile(r"^cu(?:da)?(?:Launch|GraphLaunch|Memcpy|Memset)")
#: Correlation ids per SQL ``IN`` list: SQLite's lowered program size limit
#: (``SQLITE_LIMIT_VDBE_OP``, :mod:`.sqlite_safe`) refuses a list of 10,000 ("out of memory").
IN_LIST_IDS = 4096
#: More ids than this many lists: one pass over the table in rowid chunks of
#: :data:`ID_SCAN_ROWS` rows, the ids matched in memory (each list is a pass of its own).
IN_LISTS = 4
ID_SCAN_ROWS = 1 << 20

_INT = "int"
_TEXT = "text"
_BLOB = "blob"
_DTYPES: dict[str, pl.DataType] = {_INT: pl.Int64(), _TEXT: pl.String(), _BLOB: pl.Binary()}
#: Per correlation id, the process of the CUDA API call with that id (:meth:`_Reader.unnamed_ops_owner`).
_OWNER_SCHEMA: dict[str, pl.DataType] = {"correlation_id": pl.Int64(), "pid": pl.Int64()}
_UNSET = object()


#: An API table's columns the model reads: (alias, column).
_API_COLUMNS = (
    ("start", "start"),
    ("correlation_id", "correlationId"),
    ("name_id", "nameId"),
    ("global_tid", "globalTid"),
)


class TooManyRows(InputError):
    code = "too_many_rows"


def looks_like_nsys(conn: sqlite3.Connection) -> bool:
    """True when the database has nsys's string table and nsys's metadata or event tables."""
    return _looks_like_nsys(real_tables(conn))


def _looks_like_nsys(tables: set[str]) -> bool:
    if "StringIds" not in tables:
        return False
    return any(t in tables for t in (*META_TABLES, NVTX)) or any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in tables)


def _is_gzip(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(2) == b"\x1f\x8b"
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc


def read_nsys_sqlite(
    path: Path,
    *,
    source_path: str | None = None,
    launches_only: bool = False,
    keep_correlation: bool = True,
    nvtx_rows: tuple[pl.DataFrame, pl.DataFrame] | None = None,
    on_ops: Callable[[Capture], None] | None = None,
) -> Capture:
    """Read one nsys SQLite export (or a gzipped one) into the normalized model; rank stays null.

    ``source_path`` is what reports should call the file (e.g. the original ``.nsys-rep`` when
    this is a cached export); by default ``path`` itself.

    ``launches_only`` (what the analysis reads): only the CUDA API rows that can launch GPU work
    are read (:data:`LAUNCH_API`, plus a re-read by correlation id for any op they miss), each
    GPU op gets its launch as the :data:`model.LAUNCH_SCHEMA` columns, and ``api_calls`` is left
    empty. The launch columns are exactly what joining the full ``api_calls`` gives.

    ``keep_correlation=False`` (with ``launches_only``): ``correlation_id`` is null once the
    launches are joined. No metric reads it after that join, and at 10 M GPU ops the column is
    87 MB held through the whole analysis.

    ``nvtx_rows``: what another reader of the same file read of its NVTX table
    (:meth:`_Reader.nvtx_rows`), not read again (the sliced reader's look at a file it then
    hands to this read whole: a per-op capture's table is most of its file).

    ``on_ops``: called with the capture as read before the launches are joined to its ops (no
    launch columns yet, ``api_calls`` empty, everything else as returned), for work that needs
    only the ops and the ranges to start meanwhile (the analysis' step inference).
    """
    reader = open_reader(Path(path), source_path or str(path), launches_only, keep_correlation)
    reader._nvtx = nvtx_rows
    try:
        with read_errors(reader.shown):
            capture = reader.read(on_ops)
        _release_free_memory()
        return capture
    finally:
        reader.close()


def open_reader(path: Path, shown: str, launches_only: bool, keep_correlation: bool) -> _Reader:
    """A :class:`_Reader` on ``path`` (gunzipped into the cache when gzipped), opened read-only
    and hardened; ``shown`` names the file in messages. The caller closes it."""
    if not path.is_file():
        raise InputError(f"{shown}: no such file.")
    db = gunzip_cached(path) if _is_gzip(path) else path
    try:
        conn = open_readonly(db)
    except InputError as exc:
        raise InputError(exc.message.replace(str(db), shown, 1), hint=exc.hint) from exc
    try:
        return _Reader(conn, db, shown, launches_only=launches_only, keep_correlation=keep_correlation)
    except sqlite3.Error as exc:  # the schema itself is unreadable
        conn.close()
        raise wrap_sqlite_error(shown, exc) from exc


@contextlib.contextmanager
def read_errors(shown: str) -> Iterator[None]:
    """Every failure of a read of ``shown`` as an :class:`InputError`."""
    try:
        yield
    except sqlite3.Error as exc:
        raise wrap_sqlite_error(shown, exc) from exc
    except _READ_ERRORS as exc:
        raise wrap_sqlite_error(shown, exc) from exc
    except pl.exceptions.InvalidOperationError as exc:  # text or a blob where nsys writes integers
        reason = str(exc).split("\n", 1)[0]
        raise InputError(
            f"{shown} is a damaged nsys export: a column holds values of the wrong type ({reason})",
            hint="re-export it with `nsys export --type sqlite` or copy it again",
        ) from exc


#: The thread that reads GPU metrics samples beside a sliced read's op slices.
_LINK_READS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="traceguard-links")


class _Reader:
    """One read of one file: the sqlite3 connection for small tables, the C reader (or ADBC)
    for event tables' integers, ADBC for their text."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        db: Path,
        shown: str,
        *,
        launches_only: bool = False,
        keep_correlation: bool = True,
    ) -> None:
        self.launches_only = launches_only
        self.keep_correlation = keep_correlation
        #: Names of the graph executions read (:meth:`graph_executions`): synthetic id → text.
        self.graph_strings: dict[int, str] = {}
        self.conn = conn
        self._conn_lock = threading.Lock()
        self.db = db
        self.shown = shown
        self.tables = real_tables(conn)
        self._columns: dict[str, set[str]] = {}
        self._layouts: dict[str, tuple[int, dict[str, int]] | None] = {}
        self._adbc: Any = None
        #: :meth:`unnamed_ops_owner`, once found.
        self._owner: object = _UNSET
        #: Table → text values read that were not UTF-8 (read with U+FFFD: :func:`valid_utf8`).
        self.not_utf8: dict[str, int] = {}
        #: :meth:`nvtx_rows`, once read (or handed over from another reader of the file).
        self._nvtx: tuple[pl.DataFrame, pl.DataFrame] | None = None
        #: The NVTX table's read in progress, whose pieces other threads may take (:meth:`help_read_nvtx`).
        self._nvtx_read: _SharedRead[tuple[pl.DataFrame, list[tuple[int | None, int]]]] | None = None
        #: The file opened read-only for :meth:`first_row`'s b-tree seeks, once one is made.
        self._seek_fd: int | None = None

    # -- plumbing ------------------------------------------------------------------------------

    def close(self) -> None:
        if self._adbc is not None:
            self._adbc.close()
            self._adbc = None
        if self._seek_fd is not None:
            os.close(self._seek_fd)
            self._seek_fd = None
        self.conn.close()

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            with self._conn_lock:
                found = set(table_columns(self.conn, table)) if table in self.tables else set()
            self._columns[table] = found
        return self._columns[table]

    def small(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Small tables only (metadata, enums, GPU info): plain sqlite3, one query at a time (a
        sliced read probes and reads tables from several threads)."""
        with self._conn_lock:
            return self.conn.execute(sql, params).fetchall()

    def first_row(self, table: str, rowid: str, at: int, column: str) -> tuple[int, int | None] | None:
        """(rowid, value) of ``table``'s first row at rowid ``at`` or later, the value as
        ``CAST(column AS INTEGER)`` gives it (None for NULL); None when no row is there. A sliced
        read's every block boundary is a bisection of these (17.7 k of them on the per-op NVTX
        shape): the b-tree is walked from its root by the C reader (``_int_scan.seek``: a few
        page reads, 7 µs) where it can take the file exactly as SQLite would, else SQLite
        answers (a query through the shared connection: 15-20 µs alone, 30-60 µs beside the
        threads of a read)."""
        found = self._seek(table, rowid, at, column)
        if found is not False:
            return found
        quoted = table.replace('"', '""')
        sql = f'SELECT {rowid}, CAST({column} AS INTEGER) FROM "{quoted}" WHERE {rowid} >= ? ORDER BY {rowid} LIMIT 1'
        rows = self.small(sql, (at,))
        if not rows:
            return None
        return int(rows[0][0]), None if rows[0][1] is None else int(rows[0][1])

    def _seek(self, table: str, rowid: str, at: int, column: str) -> tuple[int, int | None] | bool | None:
        """:meth:`first_row` by the b-tree reader; False where it cannot answer (the caller asks SQLite)."""
        if _int_scan is None or not hasattr(_int_scan, "seek") or os.environ.get("TRACEGUARD_SQLITE_ONLY"):
            return False
        layout = self._table_layout(table)
        if layout is None or rowid not in _ROWID_NAMES or rowid in self.columns(table):
            return False
        root, positions = layout
        if positions.get(column, -1) < 0 or not LOWEST_ROWID <= at < -LOWEST_ROWID:
            return False
        if self._seek_fd is None:
            with self._conn_lock:
                if self._seek_fd is None:
                    self._seek_fd = os.open(self.db, os.O_RDONLY | os.O_CLOEXEC)
        found: tuple[int, int | None] | bool | None = _int_scan.seek(self._seek_fd, root, at, positions[column])
        return found

    def _adbc_conn(self) -> Any:
        if self._adbc is None:
            self._adbc = _adbc_connect(self.db)
        return self._adbc

    def bulk(
        self,
        table: str,
        spec: Sequence[tuple[str, str, str]],
        where: str | Rows = "",
        skipped: list[tuple[int | None, int]] | None = None,
    ) -> pl.DataFrame:
        """Read ``spec`` = [(alias, SQL expression over existing columns, kind)] from ``table``.

        ``where``: a SQL ``WHERE`` clause, or :class:`Rows` (every row when empty). Integer
        columns read as they are, of the rows :class:`Rows` says, go to the b-tree reader
        (:meth:`_table_read`) first; SQLite reads whatever it does not take. With ``Rows.skip``,
        ``skipped`` gets the rows it left out, as (``count_by`` value, rows) pairs.

        The C reader when it is built: integers as ``CAST(x AS INTEGER)`` takes a non-integer
        value, text and bytes as SQLite converts them (the same SQL as ADBC's below); text that is
        not UTF-8 goes to ADBC, which reads it with U+FFFD and counts it. Otherwise ADBC/Arrow.
        ADBC infers each column's type from the first rows and fails if a later row differs
        (NULLs first, text later), so text and blobs are made non-null in SQL (with a
        ``<alias>__null`` flag for text) and, on a type mismatch, integer columns are CAST
        explicitly and the query retried (≈25% slower, so not the default); both readers give the
        same values. (NVTX ranges of a per-op ``emit_nvtx`` capture: 4.8 M rows with text in about
        1.3 s by the C reader, 6 s through ADBC, which also held 1.4 GB of batches at once.)
        """
        types = {alias: _DTYPES[kind] for alias, _, kind in spec}
        types.update({f"{alias}__null": pl.Int64() for alias, _, kind in spec if kind == _TEXT})
        ints_only = all(kind == _INT for _, _, kind in spec)
        rows = Rows() if where == "" else where if isinstance(where, Rows) else None
        if rows is not None:
            where = rows.where()
            if (read := self._table_read(table, spec, rows, skipped)) is not None:
                return read if ints_only else read.cast({name: types[name] for name in read.columns})
            if rows.skip is not None:
                self._count_skipped(table, rows, skipped)
        assert isinstance(where, str)
        if ints_only and _int_scan is not None:
            return scan_ints(self.db, self._select(table, spec, where, cast=False))
        if _int_scan is not None:
            kinds = "".join(
                {_TEXT: "ti", _BLOB: "b"}.get(kind, "i") for _, _, kind in spec
            )  # a text column is followed by its __null flag
            frame = scan_columns(self.db, self._select(table, spec, where, cast=False), kinds)
            if frame is not None:
                return frame.cast({name: dtype for name, dtype in types.items() if name in frame.columns})
        for attempt in ("plain", "cast"):
            sql = self._select(table, spec, where, cast=attempt == "cast")
            try:
                frame = self._fetch(sql, _INT_BATCH_ROWS if ints_only else _BATCH_ROWS, table)
            except _ADBC_ERRORS as exc:
                if attempt == "plain" and "type mismatch" in str(exc).lower():
                    continue
                raise
            break
        return frame.cast({name: dtype for name, dtype in types.items() if name in frame.columns})

    def _table_layout(self, table: str) -> tuple[int, dict[str, int]] | None:
        """``table``'s root page and the record position of each column the b-tree reader may
        read (no default value, not part of the primary key; -1 for an INTEGER PRIMARY KEY,
        which is the rowid); None when it reads none of the
        table: not an ordinary rowid table, hidden or generated columns, or a journal or WAL file
        beside the database (rows SQLite would see that the file alone does not hold)."""
        if table in self._layouts:
            return self._layouts[table]
        layout: tuple[int, dict[str, int]] | None = None
        beside = [Path(f"{self.db}{suffix}") for suffix in ("-wal", "-journal")]
        found = self.small("SELECT rootpage, sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))
        if found and not any(p.exists() for p in beside):
            root, sql = found[0]
            info = self.small(f'PRAGMA table_xinfo("{table.replace(chr(34), chr(34) * 2)}")')
            plain = isinstance(root, int) and root > 1 and "WITHOUT ROWID" not in str(sql).upper()
            if plain and info and all(row[6] == 0 for row in info):
                positions = {row[1]: pos for pos, row in enumerate(info) if row[4] is None and row[5] == 0}
                keys = [row for row in info if row[5]]
                quoted = table.replace(chr(34), chr(34) * 2)
                # INTEGER PRIMARY KEY is the rowid, unless an index holds the key (PRIMARY KEY DESC).
                alias = len(keys) == 1 and str(keys[0][2]).upper() == "INTEGER"
                if alias and not any(row[3] == "pk" for row in self.small(f'PRAGMA index_list("{quoted}")')):
                    positions[keys[0][1]] = -1
                layout = (root, positions)
        self._layouts[table] = layout
        return layout

    def _count_skipped(self, table: str, rows: Rows, skipped: list[tuple[int | None, int]] | None) -> None:
        """SQLite's count of the rows ``rows.skip`` leaves out, into ``skipped`` (the C reader's pairs)."""
        assert rows.skip is not None
        by = rows.skip.count_by
        key = by if by is not None else "NULL"
        found = self.small(f"SELECT {key}, COUNT(*) FROM {table} {rows.where(skipped=True)} GROUP BY 1")
        if skipped is not None:
            skipped.extend((None if k is None else int(k), int(n)) for k, n in found if n)

    def _table_read(
        self,
        table: str,
        spec: Sequence[tuple[str, str, str]],
        rows: Rows,
        skipped: list[tuple[int | None, int]] | None = None,
    ) -> pl.DataFrame | None:
        """``spec``'s columns of ``rows`` by the b-tree reader (``_int_scan.table``), as
        :meth:`_select`'s SQL gives them (a text column with its ``__null`` flag), when every
        expression is a column it may read (or the rowid) and the file holds nothing it does not
        take exactly as SQLite would; None otherwise (the caller asks SQLite), also for text that
        is not UTF-8 (read on with U+FFFD there)."""
        if _int_scan is None or not hasattr(_int_scan, "table") or os.environ.get("TRACEGUARD_SQLITE_ONLY"):
            return None
        layout = self._table_layout(table)
        if layout is None:
            return None
        root, positions = layout
        columns = self.columns(table)
        wanted: list[int] = []
        names: list[str] = []
        kinds = ""
        for alias, expr, kind in spec:
            if expr in positions and (positions[expr] >= 0 or kind == _INT):
                at = positions[expr]
            elif kind == _INT and expr == rows.rowid and expr not in columns and expr.lower() in _ROWID_NAMES:
                at = -1
            else:
                return None
            wanted.append(at)
            names.append(alias)
            kinds += {_TEXT: "t", _BLOB: "b"}.get(kind, "i")
            if kind == _TEXT:  # ``(x) IS NULL AS <alias>__null``, as _select writes it
                wanted.append(at)
                names.append(f"{alias}__null")
                kinds += "n"
        if rows.rowid not in _ROWID_NAMES or rows.rowid in columns:
            return None
        filter_at = -1
        if rows.column is not None:
            if positions.get(rows.column, -1) < 0:
                return None
            filter_at = positions[rows.column]
        ranges = None if rows.ranges is None else [int(v) for span in rows.ranges for v in span]
        if ranges is not None and any(b < a for a, b in itertools.pairwise(ranges)):
            return None  # not in order (the C reader walks the ranges as the rowids rise)
        skip: tuple[int, bytes, int, bool] | tuple[()] = ()
        if rows.skip is not None:
            by = rows.skip.count_by
            if positions.get(rows.skip.column, -1) < 0 or (by is not None and positions.get(by, -1) < 0):
                return None
            skip = (
                positions[rows.skip.column],
                rows.skip.prefix.encode(),
                -1 if by is None else positions[by],
                rows.skip.operators,
            )
        values = sorted(set(rows.values))
        read = _int_scan.table(str(self.db), root, wanted, names, ranges, filter_at, values, kinds, *skip)
        if read is None:
            return None
        frame = int_frame(*read[:3], kinds.replace("n", "i"))
        if frame is not None and skip and skipped is not None:
            skipped.extend(read[3])
        return frame

    @staticmethod
    def _select(table: str, spec: Sequence[tuple[str, str, str]], where: str, *, cast: bool) -> str:
        parts: list[str] = []
        for alias, expr, kind in spec:
            if kind == _TEXT:
                parts.append(f"IFNULL(CAST({expr} AS TEXT), '') AS {alias}")
                parts.append(f"({expr}) IS NULL AS {alias}__null")
            elif kind == _BLOB:
                parts.append(f"IFNULL(CAST({expr} AS BLOB), X'') AS {alias}")
            else:
                parts.append(f"CAST({expr} AS INTEGER) AS {alias}" if cast else f"{expr} AS {alias}")
        quoted = table.replace('"', '""')
        return f'SELECT {", ".join(parts)} FROM "{quoted}" {where}'

    def _fetch(self, sql: str, batch_rows: int = _BATCH_ROWS, source: str = "") -> pl.DataFrame:
        """The rows of ``sql``; text that is not UTF-8 (``source`` names its table in the notes)
        is read with U+FFFD for the bad bytes (:func:`valid_utf8`)."""
        if not _HAS_ADBC:  # pragma: no cover - the sqlite3 connection decodes leniently itself
            cursor = self.conn.execute(sql)
            names = [d[0] for d in cursor.description]
            return pl.DataFrame(cursor.fetchall(), schema=names, orient="row", infer_schema_length=None)
        cursor = self._adbc_conn().cursor()
        try:
            cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(batch_rows)})
            cursor.execute(sql)
            table = cursor.fetch_arrow_table()
        finally:
            cursor.close()
        table, replaced = valid_utf8(table)
        if replaced:
            self.not_utf8[source] = self.not_utf8.get(source, 0) + replaced
        frame = pl.from_arrow(table, rechunk=False)
        assert isinstance(frame, pl.DataFrame)
        return frame

    # -- the model -----------------------------------------------------------------------------

    def read(self, on_ops: Callable[[model.Capture], None] | None = None) -> model.Capture:
        """The whole capture (:func:`read_nsys_sqlite`, whose ``on_ops`` this calls)."""
        self.check_nsys()
        self.check_row_limit()
        strings = self.strings()
        launch_ids = self.launch_name_ids(strings) if self.launches_only else None
        pending = self.start_api_calls(launch_ids)
        try:
            domains = self.domain_names()
            info = self.info(domains)
            gpu_ops = self.gpu_ops()
            ranges, folded = self.ranges(strings, domains)
            devices, processes, named = self.devices(), self.processes(), self.all_strings(strings)
            if on_ops is not None:
                on_ops(
                    model.Capture(
                        info=info,
                        gpu_ops=gpu_ops,
                        api_calls=model.empty(model.API_CALLS_SCHEMA),
                        ranges=ranges,
                        folded_ranges=folded,
                        devices=devices,
                        processes=processes,
                        strings=named,
                    )
                )
            api_calls = self.finish_api_calls(pending, launch_ids)
        finally:
            pending.close()
        if launch_ids is not None:
            gpu_ops = self.attach_launches(gpu_ops, api_calls)
            api_calls = model.empty(model.API_CALLS_SCHEMA)
            if not self.keep_correlation:  # a constant null column costs no memory
                gpu_ops = gpu_ops.with_columns(pl.lit(None, dtype=pl.Int64).alias("correlation_id"))
        capture = model.Capture(
            info=info,
            gpu_ops=gpu_ops,
            api_calls=api_calls,
            ranges=ranges,
            folded_ranges=folded,
            devices=devices,
            processes=processes,
            strings=named,
        )
        self.add_link_samples(capture)
        info.notes.extend(self.text_notes())
        return capture

    def add_link_samples(self, capture: model.Capture, *, background: bool = False) -> None:
        """The capture's nsys GPU metrics (traceguard.ingest.gpu_metrics), or why it has none.
        ``background``: the samples are read on another thread (``capture.pending_links``) when
        the C reader can (its own connection; it lets go of the GIL while SQLite scans)."""
        plan = gpu_metrics.plan_link_read(self, self.gpu_devices)
        if isinstance(plan, str):
            capture.info.gpu_metrics_reason = plan
            return
        if background and _int_scan is not None:
            capture.pending_links = _LINK_READS.submit(gpu_metrics.load_link_samples, plan, self.bulk)
            return
        samples, info, reason = gpu_metrics.load_link_samples(plan, self.bulk)
        capture.link_samples = samples
        capture.info.gpu_metrics = info
        capture.info.gpu_metrics_reason = reason or None

    def gpu_devices(self) -> dict[int, int]:
        """``TARGET_INFO_GPU``: GPU id → CUDA device (what GPU metrics and kernels call the GPU)."""
        if "TARGET_INFO_GPU" not in self.tables or not {"id", "cuDevice"} <= self.columns("TARGET_INFO_GPU"):
            return {}
        rows = self.small("SELECT CAST(id AS INTEGER), CAST(cuDevice AS INTEGER) FROM TARGET_INFO_GPU")
        return {int(i): int(d) for i, d in rows if i is not None and d is not None}

    def text_notes(self) -> list[str]:
        """What the read says about text that was not UTF-8 (none: nothing)."""
        if not self.not_utf8:
            return []
        total = sum(self.not_utf8.values())
        where = ", ".join(f"{table or 'a query'}: {count:,}" for table, count in sorted(self.not_utf8.items()))
        return [
            f"{total:,} text value{'s' if total != 1 else ''} ({where}) held bytes that are not UTF-8 "
            "(a damaged file or a writer other than nsys): read with U+FFFD in place of those bytes"
        ]

    def check_nsys(self) -> None:
        """Raise :class:`InputError` unless the file has nsys's tables."""
        if not _looks_like_nsys(self.tables):
            found = ", ".join(sorted(self.tables)[:8]) or "no tables"
            raise InputError(
                f"{self.shown} is a SQLite database but not an nsys export: it lacks nsys's "
                f"StringIds and metadata/CUPTI/NVTX tables (found: {found}).",
                hint="export the capture with `nsys export --type sqlite -o X.sqlite X.nsys-rep`",
            )

    def all_strings(self, strings: pl.DataFrame) -> pl.DataFrame:
        """``StringIds`` plus the synthetic copy/set names and the graph names read so far."""
        all_strings = pl.concat(
            [
                strings,
                pl.DataFrame(
                    {
                        "id": [*SYNTHETIC_STRINGS, *self.graph_strings],
                        "value": [*SYNTHETIC_STRINGS.values(), *self.graph_strings.values()],
                    },
                    schema=model.STRINGS_SCHEMA,
                ),
            ]
        )
        return model.conform(all_strings, model.STRINGS_SCHEMA)

    def strings(self) -> pl.DataFrame:
        frame = self.bulk("StringIds", [("id", "id", _INT), ("value", "value", _TEXT)])
        return model.conform(frame.drop("value__null"), model.STRINGS_SCHEMA)

    def meta(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for table in reversed(META_TABLES):  # newer table wins
            if table in self.tables and {"name", "value"} <= self.columns(table):
                for name, value in self.small(f"SELECT name, value FROM {table}"):
                    if isinstance(name, str) and value is not None:
                        values[name] = str(value)
        return values

    def domain_names(self) -> dict[int, str]:
        """domainId → name from NVTX domain-create rows (eventType 75)."""
        cols = self.columns(NVTX)
        if not {"eventType", "domainId"} <= cols:
            return {}
        events, _ = self.nvtx_rows()
        created = events.filter(pl.col("event") == NVTX_DOMAIN_CREATE) if events.height else events
        names: dict[int, str] = {}
        if created.height:
            # The name is the row's text, else its registered string (COALESCE(text, StringIds)).
            ids = created.filter(pl.col("text__null") == 1)["text_id"].drop_nulls().unique().to_list()
            registered: dict[Any, Any] = {}
            if ids and "StringIds" in self.tables:
                registered = dict(self.small(f"SELECT id, value FROM StringIds WHERE id IN ({int_list(ids)})"))
            for domain_id, text, null, text_id in created.select("domain_id", "text", "text__null", "text_id").rows():
                name = registered.get(text_id) if null else text
                if isinstance(domain_id, int) and isinstance(name, str):
                    names.setdefault(domain_id, name)
        # A capture cut to a time window (nsys-ai's fixtures) can lose the domain-create row; NCCL's
        # domain still shows in its payload schemas, which alone carry "NCCL communicator ID".
        table = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
        if table in self.tables and {"domainId", "name"} <= self.columns(table):
            sql = f"SELECT DISTINCT domainId FROM {table} WHERE name = 'NCCL communicator ID'"
            for (domain_id,) in self.small(sql):
                if isinstance(domain_id, int) and domain_id not in names:
                    names[domain_id] = "NCCL"
        return names

    def info(self, domains: dict[int, str]) -> model.CaptureInfo:
        meta = self.meta()
        env: dict[str, str] = {}
        capture_host = self.system_hostname()
        for key, target in (
            ("EXPORT_HOST", "export_host"),
            ("EXPORT_TIME_UTC", "export_time_utc"),
            ("EXPORT_PLATFORM", "export_platform"),
        ):
            if meta.get(key):
                env[target] = meta[key]
        if capture_host:
            env["capture_host"] = capture_host
        env.update(self.captured_environment())
        tables = self.tables
        capture_types = self.capture_event_types()
        notes: list[str] = []
        if "TARGET_INFO_GPU" not in tables:
            notes.append("no TARGET_INFO_GPU table: GPU names and bus ids are not available")
        clock_base = self.session_start_ns()
        unnamed = self.gpu_tables_without_pid()
        if unnamed:
            owner = self.unnamed_ops_owner()
            whose = (
                f"taken as process {owner}'s, the only one the capture names"
                if isinstance(owner, int)
                else "each taken as its launching CUDA call's process"
            )
            notes.append(f"{', '.join(unnamed)} name no process (no globalPid column): their GPU ops are {whose}")
        return model.CaptureInfo(
            path=self.shown,
            format="nsys-sqlite",
            tool="nsys",
            tool_version=meta.get("EXPORT_PRODUCT_VERSION"),
            schema_version=meta.get("EXPORT_SCHEMA_VERSION"),
            # The machine that ran the job (TARGET_INFO_SYSTEM_ENV) is what rank resolution
            # needs; EXPORT_HOST is where `nsys export` ran, often a laptop.
            host=capture_host or meta.get("EXPORT_HOST") or None,
            nvtx_domains=list(dict.fromkeys(domains.values())),
            has_gpu_trace=any(t in tables for t in (KERNEL, MEMCPY, MEMSET, GRAPH_TRACE)) or "Cuda" in capture_types,
            has_api_trace=any(t in tables for t in (RUNTIME, DRIVER)) or "Cuda" in capture_types,
            has_ranges=NVTX in tables or "NvtxEvents" in capture_types,
            env=env,
            notes=notes,
            clock_base_ns=clock_base,
            clock_source="nsys session start (utcEpochNs)" if clock_base is not None else None,
        )

    def session_start_ns(self) -> int | None:
        """UTC ns of the session start, the zero of every event time (``TARGET_INFO_SESSION_START_TIME``)."""
        table = "TARGET_INFO_SESSION_START_TIME"
        if table not in self.tables or "utcEpochNs" not in self.columns(table):
            return None
        rows = self.small(f"SELECT utcEpochNs FROM {table} WHERE typeof(utcEpochNs) = 'integer' LIMIT 1")
        return int(rows[0][0]) if rows and rows[0][0] > 0 else None

    def system_hostname(self) -> str | None:
        table = "TARGET_INFO_SYSTEM_ENV"
        if table not in self.tables or not {"name", "value"} <= self.columns(table):
            return None
        rows = self.small(f"SELECT value FROM {table} WHERE name = 'Hostname' AND value <> ''")
        return str(rows[0][0]) if rows else None

    def capture_event_types(self) -> set[str]:
        table = "META_DATA_CAPTURE"
        if table not in self.tables or not {"name", "value"} <= self.columns(table):
            return set()
        rows = self.small(f"SELECT value FROM {table} WHERE name = 'CAPTURE_EVENT_TYPE'")
        return {str(value) for (value,) in rows}

    def captured_environment(self) -> dict[str, str]:
        """Allowlisted variables of the profiled command, plus its command line."""
        table = "META_DATA_CAPTURE"
        if table not in self.tables or not {"name", "value"} <= self.columns(table):
            return {}
        rows = self.small(
            f"SELECT name, value FROM {table} WHERE name LIKE 'PROCESS_%' AND "
            "(name LIKE '%:ENVIRONMENT_VARIABLE' OR name LIKE '%:COMMAND' OR name LIKE '%:ARGUMENT_%')"
        )
        env: dict[str, str] = {}
        command: list[str] = []
        for name, value in rows:
            if not isinstance(name, str) or not isinstance(value, str):
                continue
            if name.endswith(":ENVIRONMENT_VARIABLE"):
                key, _, raw = value.partition("=")
                keep = key in _ENV_KEEP or key.startswith(_ENV_KEEP_PREFIXES)
                if keep and not any(word in key for word in _ENV_SECRET_WORDS):
                    env.setdefault(key, raw[1:-1] if raw[:1] == raw[-1:] == '"' else raw)
            elif name.startswith("PROCESS_0:"):
                command.append(value)
        if command:
            env["command"] = " ".join(command)
        return env

    # -- events ----------------------------------------------------------------------------------

    def _gpu_spec(
        self, table: str, extra: Sequence[tuple[str, str]], *, keyed: bool = True
    ) -> list[tuple[str, str, str]]:
        """Raw columns only: SQL expressions cost SQLite time per row, Polars does them in bulk.

        ``streamId`` is not read: no metric uses it (the model keeps the column, null here).
        ``keyed`` false: ``correlationId`` is not read either where ``globalPid`` names each op's
        process (without it, the id finds the process: :meth:`unnamed_ops_owner`).
        """
        cols = self.columns(table)
        skip = "correlationId" if not keyed and "globalPid" in cols else None
        return [
            (alias, column, _INT)
            for alias, column in (
                ("start", "start"),
                ("end", "end"),
                ("device", "deviceId"),
                ("correlation_id", "correlationId"),
                ("global_pid", "globalPid"),
                *extra,
            )
            if column in cols and column != skip
        ]

    def _gpu_bulk(
        self, table: str, extra: Sequence[tuple[str, str]], where: str | Rows = "", *, keyed: bool = True
    ) -> pl.DataFrame:
        frame = self.bulk(table, self._gpu_spec(table, extra, keyed=keyed), where)
        if "global_pid" in frame.columns:
            split = _split_ids(frame["global_pid"], pl.Int64(), with_tid=False)
            pid = _pid_of(pl.col("global_pid")) if split is None else split[0]
            return frame.with_columns(pid.alias("pid")).drop("global_pid")
        owner = self.unnamed_ops_owner()
        if isinstance(owner, int):
            return frame.with_columns(pl.lit(owner, dtype=pl.Int64).alias("pid"))
        if "correlation_id" in frame.columns:
            return frame.join(owner, on="correlation_id", how="left", maintain_order="left")
        return frame

    def gpu_tables_without_pid(self) -> list[str]:
        """The GPU activity tables of the file that name no process (no ``globalPid`` column)."""
        return [
            t for t in (KERNEL, MEMCPY, MEMSET, GRAPH_TRACE) if t in self.tables and "globalPid" not in self.columns(t)
        ]

    def unnamed_ops_owner(self) -> int | pl.DataFrame:
        """The process of the ops of a GPU table without ``globalPid`` (a hand-made or trimmed
        export, e.g. nsys-ai's ``healthy_1pct``; nsys itself always writes it): the capture's one
        process when it names exactly one (in its CUDA API calls, NVTX events or ``PROCESSES``),
        pid 0 when it names none (every op is then one unnamed process's), else per op the
        process of the API call with its correlation id (:data:`_OWNER_SCHEMA`, only the ids
        that one process alone has). Without a process, an op could be attributed to no step,
        and no step could be inferred from it nor drawn around it (issue 25)."""
        if self._owner is not _UNSET:
            return self._owner  # type: ignore[return-value]
        pids: set[int] = set()
        for table in (*self.api_tables(), NVTX):
            if "globalTid" in self.columns(table):
                quoted = table.replace('"', '""')
                sql = (
                    f'SELECT DISTINCT (globalTid >> 24) & 16777215 FROM "{quoted}" WHERE globalTid IS NOT NULL LIMIT 2'
                )
                pids.update(int(p) for (p,) in self.small(sql) if isinstance(p, int))
        pids.update(int(p) for p in self.processes()["pid"].drop_nulls().to_list())
        owner: int | pl.DataFrame
        if len(pids) <= 1:
            owner = next(iter(pids), 0)
        else:
            frames = [
                self.bulk(
                    table, [("correlation_id", "correlationId", _INT), ("pid", "(globalTid >> 24) & 16777215", _INT)]
                )
                for table in self.api_tables()
                if {"correlationId", "globalTid"} <= self.columns(table)
            ]
            calls = pl.concat(frames) if frames else pl.DataFrame(schema=_OWNER_SCHEMA)
            owner = (
                calls.drop_nulls()
                .group_by("correlation_id")
                .agg(pl.col("pid").unique())
                .filter(pl.col("pid").list.len() == 1)
                .select("correlation_id", pl.col("pid").list.first())
                .cast(_OWNER_SCHEMA)  # type: ignore[arg-type]
            )
        self._owner = owner
        return owner

    def enum_names(self, table: str) -> dict[int, str]:
        if table not in self.tables or not {"id", "name"} <= self.columns(table):
            return {}
        return {
            code: name
            for code, name in self.small(f"SELECT id, name FROM {table}")
            if isinstance(code, int) and isinstance(name, str)
        }

    def copy_kind_map(self) -> dict[int, str]:
        """copyKind code → model copy kind, from the file's own enum table when it has one."""
        names = self.enum_names("ENUM_CUDA_MEMCPY_OPER")
        if not names:  # 2022.x exports: the documented constants
            return dict(enumerate(model.COPY_KINDS))
        known = {kind.upper(): kind for kind in model.COPY_KINDS}
        out: dict[int, str] = {}
        for code, name in names.items():
            key = name.upper().removeprefix("CUDA_MEMCPY_KIND_").replace("UVM_", "UNIFIED_")
            out[code] = known.get(key, "unknown")
        return out

    def mem_kind_map(self) -> dict[int, str]:
        names = self.enum_names("ENUM_CUDA_MEM_KIND")
        if not names:
            return dict(enumerate(model.MEM_KINDS))
        known = set(model.MEM_KINDS)
        out: dict[int, str] = {}
        for code, name in names.items():
            key = name.upper().removeprefix("CUDA_MEMOPR_MEMORY_KIND_").lower()
            out[code] = key if key in known else "unknown"
        return out

    def gpu_ops(self) -> pl.DataFrame:
        frames = self.node_ops()
        if GRAPH_TRACE in self.tables:
            graphs = self.graph_executions(frames)
            if graphs.height:
                frames.append(graphs)
        return conform_ops(frames)

    def node_ops(
        self,
        where: Mapping[str, str | Rows] | None = None,
        *,
        sequence_only: bool = False,
        beside: Executor | None = None,
    ) -> list[pl.DataFrame]:
        """Kernels, memcpys and memsets, one frame per table the file has, in that order (not
        yet conformed: :func:`conform_ops`). ``where`` maps a table to the rows to read (SQL
        ``WHERE`` clause or :class:`Rows`; a table not named: every row). ``sequence_only``:
        only what step inference reads of an op (process, device, kind, start, end, name: the
        same values), the other columns left out (null once conformed): the per-op NVTX shape's
        13.2 M ops read in 2.4-2.7 s instead of 3.3-3.5 s, the correlation ids, bytes and memory
        kinds not decoded. ``beside``: the copies and sets are read there while this thread
        reads the kernels (the C reader and Polars let go of the GIL; its connections are its own)."""
        where = where or {}
        keyed = not sequence_only

        def kernel_frame() -> pl.DataFrame:
            cols = self.columns(KERNEL)
            name_col = next((c for c in ("shortName", "demangledName", "mangledName") if c in cols), None)
            extra = [("name_id", name_col)] if name_col else []
            kernels = self._gpu_bulk(KERNEL, extra, where.get(KERNEL, ""), keyed=keyed)
            return kernels.with_columns(pl.lit("kernel", dtype=model.OpKind).alias("kind"))

        def copy_frame() -> pl.DataFrame:
            # A copy's name is its copy kind's (_map_copies): the sequence reads that much of it.
            extra = [("copy_code", "copyKind")]
            if not sequence_only:
                extra = [("bytes", "bytes"), *extra, ("src_code", "srcKind"), ("dst_code", "dstKind")]
            return self._map_copies(self._gpu_bulk(MEMCPY, extra, where.get(MEMCPY, ""), keyed=keyed))

        def set_frame() -> pl.DataFrame:
            extra = [] if sequence_only else [("bytes", "bytes")]
            sets = self._gpu_bulk(MEMSET, extra, where.get(MEMSET, ""), keyed=keyed)
            return sets.with_columns(
                pl.lit("memset", dtype=model.OpKind).alias("kind"),
                pl.lit(MEMSET_NAME_ID, dtype=pl.Int64).alias("name_id"),
            )

        reads = [(table, read) for table, read in ((MEMCPY, copy_frame), (MEMSET, set_frame)) if table in self.tables]
        others = beside.submit(lambda: [read() for _table, read in reads]) if beside is not None and reads else None
        frames = [kernel_frame()] if KERNEL in self.tables else []
        frames += others.result() if others is not None else [read() for _table, read in reads]
        return frames

    def graph_executions(self, node_frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
        """CUDA graph executions traced whole, as GPU ops of kind ``graph`` (a small read of its own:
        one row per graph launch). Their correlation id is the ``cudaGraphLaunch`` call's, so they
        join their launch like any op. Names ``CUDA graph <graphId>`` (:attr:`graph_strings`). An
        execution whose launch also has node rows (kernels, copies) in ``node_frames`` is dropped:
        its time is already there, and must not count twice."""
        frame = self._gpu_bulk(GRAPH_TRACE, [("graph_id", "graphId")])
        if frame.height == 0:
            return frame
        if "correlation_id" in frame.columns and "pid" in frame.columns:
            launches = frame.select("pid", "correlation_id").drop_nulls().unique()
            wanted = launches["correlation_id"].implode()
            covered = [
                f.filter(pl.col("correlation_id").is_in(wanted)).select("pid", "correlation_id")
                for f in node_frames
                if {"pid", "correlation_id"} <= set(f.columns)
            ]
            if covered:
                done = pl.concat([c.cast({"pid": pl.Int64}) for c in covered]).unique()
                if done.height:
                    keys = done.cast({"pid": frame.schema["pid"]})
                    frame = frame.join(keys, on=["pid", "correlation_id"], how="anti")
        if "graph_id" not in frame.columns:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias("graph_id"))
        graph_ids = sorted(int(g) for g in frame["graph_id"].drop_nulls().unique().to_list())
        codes = {g: GRAPH_NAME_BASE - 1 - i for i, g in enumerate(graph_ids)}
        self.graph_strings = {GRAPH_NAME_BASE: "CUDA graph"} | {code: f"CUDA graph {g}" for g, code in codes.items()}
        name_id = pl.col("graph_id").replace_strict(codes, default=GRAPH_NAME_BASE, return_dtype=pl.Int64)
        kind = pl.lit("graph", dtype=model.OpKind).alias("kind")
        return frame.with_columns(kind, name_id.alias("name_id")).drop("graph_id")

    def _map_copies(self, copies: pl.DataFrame) -> pl.DataFrame:
        copy_map = self.copy_kind_map()
        mem_map = self.mem_kind_map()

        def mapped(code: str, mapping: dict[int, str], dtype: pl.Enum, alias: str) -> pl.Expr:
            if code not in copies.columns:
                return pl.lit(None, dtype=dtype).alias(alias)
            return pl.col(code).replace_strict(mapping, default="unknown", return_dtype=dtype).alias(alias)

        copies = copies.with_columns(
            mapped("copy_code", copy_map, model.CopyKind, "copy_kind"),
            mapped("src_code", mem_map, model.MemKind, "src_kind"),
            mapped("dst_code", mem_map, model.MemKind, "dst_kind"),
            pl.lit("memcpy", dtype=model.OpKind).alias("kind"),
        )
        # Enum physical code = index into COPY_KINDS, so the synthetic id is arithmetic.
        name_id = -(pl.col("copy_kind").to_physical().cast(pl.Int64) + 1)
        return copies.with_columns(name_id.fill_null(MEMCPY_NAME_IDS["unknown"]).alias("name_id"))

    def check_row_limit(self) -> None:
        """Refuse files whose event tables hold more rows than ``$TRACEGUARD_MAX_ROWS`` (the service
        sets it for untrusted uploads). Rows are counted from the rowid range: O(log n) per table."""
        limit = int(os.environ.get("TRACEGUARD_MAX_ROWS") or 0)
        if limit <= 0:
            return
        total = 0
        for table in (KERNEL, MEMCPY, MEMSET, NVTX, *self.api_tables()):
            if table not in self.tables:
                continue
            rowid = next((n for n in ("rowid", "_rowid_", "oid") if n not in self.columns(table)), None)
            if rowid is None:
                continue
            quoted = table.replace('"', '""')
            try:
                low = self.small(f'SELECT IFNULL(min({rowid}), 0) FROM "{quoted}"')[0][0]
                high = self.small(f'SELECT IFNULL(max({rowid}), -1) FROM "{quoted}"')[0][0]
            except sqlite3.Error:
                continue
            total += max(0, int(high) - int(low) + 1)
        if total > limit:
            raise TooManyRows(
                f"{self.shown} holds about {total:,} event rows, more than the limit of {limit:,}",
                hint="capture fewer steps (a shorter nsys --capture-range), or raise TRACEGUARD_MAX_ROWS",
            )

    def api_tables(self) -> list[str]:
        return [t for t in (RUNTIME, DRIVER) if t in self.tables]

    def launch_name_ids(self, strings: pl.DataFrame) -> list[int]:
        """``StringIds`` of the API calls :data:`LAUNCH_API` names."""
        hits = strings.filter(pl.col("value").str.contains(LAUNCH_API.pattern))
        return sorted(int(i) for i in hits["id"].to_list())

    def api_calls(
        self, parts: Sequence[tuple[str, str | Rows]] | None = None, launch_ids: Sequence[int] | None = None
    ) -> pl.DataFrame:
        """CUDA runtime/driver calls: every row of ``parts`` = [(table, SQL condition, :class:`Rows` or "")]
        (default: all API tables whole), in that order, and only launch calls when
        ``launch_ids`` is given. ``end`` is not read (no metric uses it)."""
        if parts is None:
            parts = [(table, "") for table in self.api_tables()]
        frames = [
            model.conform(self.api_table(table, cond, launch_ids), model.API_CALLS_SCHEMA) for table, cond in parts
        ]
        if not frames:
            return model.empty(model.API_CALLS_SCHEMA)
        return pl.concat(frames, how="vertical", rechunk=False)

    def api_table(
        self,
        table: str,
        condition: str | Rows = "",
        launch_ids: Sequence[int] | None = None,
        rowid: str | None = None,
    ) -> pl.DataFrame:
        """One API table's columns as the model types them, minus the null ones; rows meeting
        ``condition`` (SQL, or :class:`Rows`) and, with ``launch_ids``, only calls of those
        names. With ``rowid`` (the rowid's name in ``table``) also an Int64 ``rowid`` column."""
        cols = self.columns(table)
        where: str | Rows
        if isinstance(condition, Rows) or not condition:
            rows = condition if isinstance(condition, Rows) else Rows()
            if launch_ids is not None and "nameId" in cols:
                rows = Rows(rows.ranges, "nameId", tuple(int(i) for i in launch_ids), rows.rowid)
            where = rows
        else:
            conditions = [condition]
            if launch_ids is not None and "nameId" in cols:
                conditions.append(Rows(column="nameId", values=tuple(launch_ids)).where().removeprefix("WHERE "))
            where = "WHERE " + " AND ".join(f"({c})" for c in conditions)
        spec = [(alias, column, _INT) for alias, column in _API_COLUMNS if column in cols]
        if rowid is not None:
            spec.append(("rowid", rowid, _INT))
        return self._api_frame(self.bulk(table, spec, where))

    def api_table_walked(self, table: str, rows: Rows) -> pl.DataFrame | None:
        """:meth:`api_table` of ``rows`` by the b-tree reader alone; None where it gives way (the
        caller then reads otherwise: a long value list is more than one SQL ``IN`` takes)."""
        cols = self.columns(table)
        spec = [(alias, column, _INT) for alias, column in _API_COLUMNS if column in cols]
        frame = self._table_read(table, spec, rows)
        return None if frame is None else self._api_frame(frame)

    @staticmethod
    def _api_frame(frame: pl.DataFrame) -> pl.DataFrame:
        # Every column in its model type in one pass (one new array each, no intermediates).
        types = model.API_CALLS_SCHEMA
        columns: list[pl.Expr | pl.Series] = []
        for name in frame.columns:
            if name == "global_tid":
                split = _split_ids(frame[name], types["pid"], with_tid=True)
                if split is not None:
                    pid, tid = split
                    columns += [pid.alias("pid"), tid.alias("tid")]
                    continue
                global_tid = pl.col(name)
                columns.append(_pid_of(global_tid).cast(types["pid"]).alias("pid"))
                columns.append(_tid_of(global_tid).cast(types["tid"]).alias("tid"))
            elif name == "rowid":
                columns.append(pl.col(name))
            else:
                columns.append(pl.col(name).cast(types[name]))
        return frame.select(columns)

    def attach_launches(self, gpu_ops: pl.DataFrame, launches: pl.DataFrame) -> pl.DataFrame:
        """``gpu_ops`` plus the :data:`model.LAUNCH_SCHEMA` columns, from the launch rows read.

        An op whose (pid, correlation id) no launch row has was launched by a call outside
        :data:`LAUNCH_API`: the API rows with those correlation ids are read again, unfiltered,
        and joined to exactly those ops (their keys cannot match a launch row, so the first such
        call is the first in the full tables too). However many such ids there are, only their
        rows are held (:meth:`with_ids`): a capture whose first ops were launched before the
        capture began has ids with no API row at all, and scaled to 10 M kernels (the per-op NVTX
        shape, bench/README.md) reading and joining every API row for them held 4.2 GB.
        """
        rows = model.launch_rows(gpu_ops, launches)
        columns = model.gather_launches(launches, rows)
        keyed = gpu_ops["pid"].is_not_null() & gpu_ops["correlation_id"].is_not_null()
        missing = (rows.is_null() & keyed).arg_true()
        if missing.len() == 0:
            return model.add_columns(gpu_ops, columns)
        found = self.reread_launches(gpu_ops[missing])
        return model.add_columns(
            gpu_ops, (col.scatter(missing, extra) for col, extra in zip(columns, found, strict=True))
        )

    def reread_launches(self, ops: pl.DataFrame, launch_ids: Sequence[int] | None = None) -> list[pl.Series]:
        """The :data:`model.LAUNCH_SCHEMA` columns of ``ops`` from the API rows re-read by the ops'
        correlation ids (every API table scanned: :meth:`with_ids`): per op the
        first call with its (pid, correlation id), in table then rowid order; with
        ``launch_ids``, the first :data:`LAUNCH_API` call when there is one (what the
        launches-only read joins), else the first call of any name."""
        ids = ops["correlation_id"].drop_nulls().unique().sort().to_list()
        if not ids:
            return model.gather_launches(model.empty(model.API_CALLS_SCHEMA), pl.Series([None] * ops.height))
        frames: list[pl.DataFrame] = []
        for table in self.api_tables():  # table order; a key's rows keep their rowid order

            def read(condition: str, table: str = table) -> pl.DataFrame:
                return self.api_table(table, condition)

            def walk(rows: Rows, table: str = table) -> pl.DataFrame | None:
                return self.api_table_walked(table, rows)

            frame = model.conform(self.with_ids(table, ids, read, walk), model.API_CALLS_SCHEMA)
            if launch_ids is not None:
                # As :meth:`api_table` filters: a table without names holds launches only.
                named = "nameId" in self.columns(table)
                launch = pl.col("name_id").is_in(list(launch_ids)) if named else pl.lit(True)
                frame = frame.with_columns(launch.fill_null(False).alias("_launch"))
            frames.append(frame)
        others = pl.concat(frames, how="vertical") if frames else model.empty(model.API_CALLS_SCHEMA)
        if launch_ids is None:
            return model.gather_launches(others, model.launch_rows(ops, others))
        launches = others.filter(pl.col("_launch"))
        rows = model.launch_rows(ops, launches)
        columns = model.gather_launches(launches, rows)
        missing = rows.is_null().arg_true()
        if missing.len() == 0:
            return columns
        found = model.gather_launches(others, model.launch_rows(ops[missing], others))
        return [col.scatter(missing, extra) for col, extra in zip(columns, found, strict=True)]

    def with_ids(
        self,
        table: str,
        ids: Sequence[int],
        read: Callable[[str], pl.DataFrame],
        walk: Callable[[Rows], pl.DataFrame | None] | None = None,
    ) -> pl.DataFrame:
        """The rows of ``table`` whose ``correlationId`` is in ``ids``, as ``read(SQL condition)``
        gives them (a frame with ``correlation_id``): by ``walk`` (the b-tree reader: one pass,
        the ids looked up in C) when given and it takes the table; else :data:`IN_LIST_IDS` ids
        per ``IN`` list, or, for more than :data:`IN_LISTS` lists, one pass in rowid chunks matched
        in memory (SQLite: a pass of 18.6 M API rows is 2-3 s, and a sliced read of a capture whose
        copies lack launch rows made one per slice: 119 s of a 10 M-kernel file). The rows of one
        id keep their rowid order (rows of different ids may interleave)."""
        if walk is not None and ids and "correlationId" in self.columns(table):
            walked = walk(Rows(column="correlationId", values=tuple(sorted(set(ids)))))
            if walked is not None:
                return walked
        rowid = next((n for n in ("rowid", "_rowid_", "oid") if n not in self.columns(table)), None)
        if len(ids) <= IN_LISTS * IN_LIST_IDS or rowid is None or "correlationId" not in self.columns(table):
            chunks = range(0, len(ids), IN_LIST_IDS)
            parts = [read(f"correlationId IN ({int_list(ids[lo : lo + IN_LIST_IDS])})") for lo in chunks]
            return pl.concat(parts, how="vertical") if parts else read("0")
        quoted = table.replace('"', '""')
        low = int(self.small(f'SELECT IFNULL(min({rowid}), 0) FROM "{quoted}"')[0][0])
        high = int(self.small(f'SELECT IFNULL(max({rowid}), -1) FROM "{quoted}"')[0][0])
        wanted = pl.Series(ids, dtype=pl.Int64).implode()
        parts = []
        for lo in range(low, high + 1, ID_SCAN_ROWS):
            part = read(f"{rowid} >= {lo} AND {rowid} < {lo + ID_SCAN_ROWS}")
            parts.append(part.filter(pl.col("correlation_id").is_in(wanted)))
        return pl.concat(parts, how="vertical") if parts else read("0")

    def start_api_calls(self, launch_ids: Sequence[int] | None = None) -> _PendingApiCalls:
        """Start reading the API tables in a second process when they are big and a core is free.

        The worker takes the first :data:`WORKER_SHARE` of the largest API table's rowids; this
        process reads the rest of the API rows after its own tables (GPU activity, NVTX), which
        evens out the two processes' work. Rows keep their order: worker part, then the rest.
        """
        tables = self.api_tables()
        if (not _HAS_ADBC and _int_scan is None) or not sys.executable or _free_cores() < 2 or not tables:
            return _PendingApiCalls(None, [])
        bounds: dict[str, tuple[str, int, int]] = {}
        for table in tables:
            # The rowid under a name no column shadows (a crafted file could define "rowid").
            rowid = next((n for n in ("rowid", "_rowid_", "oid") if n not in self.columns(table)), None)
            if rowid is None:
                return _PendingApiCalls(None, [])
            quoted = table.replace('"', '""')
            try:
                # Two queries: SQLite answers a lone min() or max() of the rowid from the b-tree's
                # ends, but both in one query scan the whole table.
                low = self.small(f'SELECT IFNULL(min({rowid}), 0) FROM "{quoted}"')[0][0]
                high = self.small(f'SELECT IFNULL(max({rowid}), -1) FROM "{quoted}"')[0][0]
            except sqlite3.Error:  # e.g. a WITHOUT ROWID table: read it the plain way
                return _PendingApiCalls(None, [])
            bounds[table] = (rowid, int(low), int(high))
        if sum(high - low + 1 for _, low, high in bounds.values()) < PARALLEL_API_ROWS:
            return _PendingApiCalls(None, [])
        big = max(tables, key=lambda t: bounds[t][2] - bounds[t][1])
        rowid, low, high = bounds[big]
        share = WORKER_SHARE if launch_ids is None else LAUNCHES_WORKER_SHARE
        cut = low + int((high - low) * share)
        # The rest of the big table as a rowid range, which the b-tree reader takes (as SQL,
        # ``rowid > cut``, SQLite read it: 2.5x the worker's time a row on the 10 M-kernel capture).
        after_cut: str | Rows = f"{rowid} > {cut}"
        if high < _HIGHEST_ROWID:
            after_cut = Rows(((cut + 1, high + 1),), rowid=rowid)
        rest: list[tuple[str, str | Rows]] = [(table, after_cut if table == big else "") for table in tables]
        try:
            workdir = tempfile.mkdtemp(prefix="traceguard-", dir=_scratch_dir())
        except OSError:
            return _PendingApiCalls(None, [])
        # A fresh interpreter (not multiprocessing: its spawn re-imports the caller's __main__,
        # and fork is unsafe once Polars' threads run). Arguments only; no shell.
        target = str(Path(workdir) / "api.arrow")
        names = "-" if launch_ids is None else int_list(launch_ids)
        command = [sys.executable, "-c", _WORKER_CODE, str(self.db), target, big, rowid, str(cut), names]
        try:
            # Quiet: if the worker fails, this process reads everything and reports the error.
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        except OSError:
            shutil.rmtree(workdir, ignore_errors=True)
            return _PendingApiCalls(None, [])
        return _PendingApiCalls(process, rest, workdir, target)

    def finish_api_calls(self, pending: _PendingApiCalls, launch_ids: Sequence[int] | None = None) -> pl.DataFrame:
        """The worker's part plus the rest read here; on any failure of the worker, everything is
        read here (which raises the real error, as a single-process read would)."""
        if pending.process is None:
            return self.api_calls(None, launch_ids)
        rest = self.api_calls(pending.rest, launch_ids)
        mapped = pending.result()
        if mapped is None:
            return self.api_calls(None, launch_ids)
        first = model.conform(_mapped_ipc(mapped), model.API_CALLS_SCHEMA)
        return pl.concat([first, rest], how="vertical", rechunk=False)

    def payload_offsets(self) -> dict[int, int]:
        """domainId → byte offset of the uint64 "Message size [bytes]" field in ``binaryData``.

        Only domains whose schemas all agree on one offset: NVTX_EVENTS does not say which
        schema an event used, so a domain with conflicting offsets cannot be decoded safely.
        """
        table = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
        if table not in self.tables or not {"domainId", "name", "offset"} <= self.columns(table):
            return {}
        rows = self.small(f"SELECT DISTINCT domainId, offset FROM {table} WHERE name LIKE 'Message size%'")
        offsets: dict[int, set[int]] = {}
        for domain_id, offset in rows:
            if isinstance(domain_id, int) and isinstance(offset, int) and offset >= 0:
                offsets.setdefault(domain_id, set()).add(offset)
        return {d: next(iter(o)) for d, o in offsets.items() if len(o) == 1}

    def peer_offsets(self) -> dict[tuple[int, int], int]:
        """(domainId, schemaId) → byte offset of the int32 "Peer rank" field (NCCL's
        ``ncclSend``/``ncclRecv`` schemas). Decoded only where a blob's header names its schema:
        other NCCL schemas hold different fields at the same offset (the reduction op, the root)."""
        table = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
        if table not in self.tables or not {"domainId", "schemaId", "name", "offset"} <= self.columns(table):
            return {}
        rows = self.small(f"SELECT DISTINCT domainId, schemaId, offset FROM {table} WHERE name = 'Peer rank'")
        found: dict[tuple[int, int], set[int]] = {}
        for domain_id, schema_id, offset in rows:
            if all(isinstance(v, int) for v in (domain_id, schema_id, offset)) and offset >= 0:
                found.setdefault((domain_id, schema_id), set()).add(offset)
        return {key: next(iter(o)) for key, o in found.items() if len(o) == 1}

    def drop_nvtx_rows(self) -> None:
        """Forget :meth:`nvtx_rows`' memo (a later call reads the table again)."""
        self._nvtx = None

    def nvtx_rows(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """One read of ``NVTX_EVENTS`` for both its uses (memoized): the push/pop and start/end
        ranges and the domain-create rows (``event`` says which), and the ranges folded instead,
        counted per thread (:data:`model.FOLDED_RANGES_SCHEMA`): PyTorch's per-op ranges (own
        text starting with :data:`OP_RANGE_PREFIX`, or another operator's, :class:`~.rows.Skip`'s
        ``operators``) never become rows. A per-op capture's table is most of its file: the
        domains' own scan through SQLite took 1.9 s of 48 M rows."""
        if self._nvtx is not None:
            return self._nvtx
        folded = model.empty(model.FOLDED_RANGES_SCHEMA)
        cols = self.columns(NVTX)
        if NVTX not in self.tables or not {"start", "end", "eventType"} <= cols:
            self._nvtx = pl.DataFrame(), folded
            return self._nvtx
        spec: list[tuple[str, str, str]] = [("event", "eventType", _INT), ("start", "start", _INT)]
        spec.append(("end", "end", _INT))
        if "globalTid" in cols:
            spec.append(("global_tid", "globalTid", _INT))
        spec.append(("text", "text" if "text" in cols else "NULL", _TEXT))
        spec.append(("text_id", "textId" if "textId" in cols else "NULL", _INT))
        spec.append(("domain_id", "domainId" if "domainId" in cols else "NULL", _INT))
        offsets = self.payload_offsets()
        peer_offsets = self.peer_offsets()
        if (offsets or peer_offsets) and "binaryData" in cols:
            spec.append(("payload", "binaryData", _BLOB))
        thread = "globalTid" if "globalTid" in cols else None
        skip = Skip("text", OP_RANGE_PREFIX, thread, operators=True) if "text" in cols else None
        kinds = (NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE)
        frame, skipped = self._nvtx_in_pieces(spec, Rows(column="eventType", values=kinds, skip=skip))
        # (A domain whose name starts with the prefix would be folded with the ranges: PyTorch
        # names none so, and its ranges would be counted all the same.)
        if skipped:
            folded = pl.DataFrame(
                {"tid": [k for k, _ in skipped], "ranges": [n for _, n in skipped]},
                schema={"tid": pl.Int64, "ranges": pl.Int64},
            )
            folded = model.conform(
                folded.with_columns(_pid_of(pl.col("tid")).alias("pid"), _tid_of(pl.col("tid")).alias("tid"))
                .group_by("pid", "tid", maintain_order=True)
                .agg(pl.col("ranges").sum()),
                model.FOLDED_RANGES_SCHEMA,
            )
        self._nvtx = frame, folded
        return self._nvtx

    def _nvtx_in_pieces(
        self, spec: list[tuple[str, str, str]], rows: Rows
    ) -> tuple[pl.DataFrame, list[tuple[int | None, int]]]:
        """:meth:`bulk` of ``rows`` of the NVTX table, with its skipped pairs: in rowid pieces of
        :data:`NVTX_PIECE_ROWS` when the table spans more than two, which this thread takes in
        turn and so may another (:meth:`help_read_nvtx`), put together in rowid order (the same
        rows, and the same pairs once :meth:`nvtx_rows` adds them up by key). A per-op capture's
        table is most of its file, and its read is what the sliced map waits for once its other
        threads have read the kernel sequences (traceguard.mapreduce): on the per-op NVTX shape of
        ``bench/RESULTS.md`` (48 M rows, 24 pieces), the reading thread took 5-7 of them."""
        rowid = next((n for n in _ROWID_NAMES if n not in self.columns(NVTX)), None)
        span = self.rowid_bounds(NVTX, rowid) if rowid is not None else None
        if span is None or span[1] - span[0] + 1 <= 2 * NVTX_PIECE_ROWS or span[1] >= _HIGHEST_ROWID:
            skipped: list[tuple[int | None, int]] = []
            return self.bulk(NVTX, spec, rows, skipped), skipped

        def piece(lo: int, hi: int) -> Callable[[], tuple[pl.DataFrame, list[tuple[int | None, int]]]]:
            def read() -> tuple[pl.DataFrame, list[tuple[int | None, int]]]:
                mine: list[tuple[int | None, int]] = []
                return self.bulk(NVTX, spec, replace(rows, ranges=((lo, hi),), rowid=rowid), mine), mine

            return read

        first, last = span
        bounds = [*range(first, last + 1, NVTX_PIECE_ROWS), last + 1]
        shared = _SharedRead([piece(lo, hi) for lo, hi in itertools.pairwise(bounds)])
        self._nvtx_read = shared
        try:
            parts = shared.results()
        finally:
            self._nvtx_read = None
        frame = pl.concat([frame for frame, _ in parts], rechunk=True)
        skipped = [pair for _, pairs in parts for pair in pairs]
        # The pieces' columns came from the C heap a few MB at a time (one read's are mapped
        # and unmapped whole): freed in its arenas, they stayed resident beside the rest of the
        # analysis (+60-80 MB through the per-op NVTX shape's read) unless handed back now.
        del parts, shared
        release_heap()
        return frame, skipped

    def help_read_nvtx(self) -> None:
        """Take pieces of the NVTX table's read in progress on another thread (:meth:`nvtx_rows`)
        until none is left; nothing when none is in progress. A piece's error is raised by that
        read, not here."""
        shared = self._nvtx_read
        if shared is not None:
            shared.help()

    def rowid_bounds(self, table: str, rowid: str) -> tuple[int, int] | None:
        """``table``'s first and last rowid (None when it is empty or SQLite cannot say): two
        queries, each answered from one end of its b-tree (a lone min() or max() of the rowid)."""
        quoted = table.replace('"', '""')
        try:
            low = self.small(f'SELECT min({rowid}) FROM "{quoted}"')[0][0]
            high = self.small(f'SELECT max({rowid}) FROM "{quoted}"')[0][0]
        except sqlite3.Error:
            return None
        if not isinstance(low, int) or not isinstance(high, int):
            return None
        return low, high

    def ranges(
        self, strings: pl.DataFrame, domains: dict[int, str], *, keep_rows: bool = True
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The closed push/pop and start/end ranges (:data:`model.RANGES_SCHEMA`, nested), and
        those folded instead, counted per thread (:meth:`nvtx_rows`). ``keep_rows`` false: the
        caller wants no more of the table, so its rows are let go as the ranges are taken from
        them, not held under the ranges' build (the per-op NVTX shape: 0.14 GB off that peak)."""
        rows, folded = self.nvtx_rows()
        if not keep_rows:
            self._nvtx = None
        if rows.height == 0:
            return model.empty(model.RANGES_SCHEMA), folded
        # Ranges only (push/pop, start/end), and only closed ones (an open range has no end).
        frame = rows.filter(pl.col("event") != NVTX_DOMAIN_CREATE).drop("event")
        del rows
        if frame["end"].null_count():
            frame = frame.filter(pl.col("end").is_not_null())
        if frame.height == 0:
            return model.empty(model.RANGES_SCHEMA), folded
        if "global_tid" in frame.columns:
            tid = pl.col("global_tid")
            frame = frame.with_columns(_pid_of(tid).alias("pid"), _tid_of(tid).alias("tid")).drop("global_tid")
        # A range's name is its own text, else its registered string (``textId``): the strings are
        # looked up only where the text is null. A join of the whole frame copied every column,
        # its texts included (4.8 M per-op ranges: +0.4 GB at the peak, 0.3 s).
        by_id = frame["text__null"] == 1
        if by_id.any():
            ids = frame.select(pl.col("text_id").filter(by_id))
            found = ids.join(
                strings.select(pl.col("id").cast(pl.Int64).alias("text_id"), pl.col("value").alias("id_text")),
                on="text_id",
                how="left",
                maintain_order="left",
            )["id_text"]
            frame = frame.with_columns(frame["text"].scatter(by_id.arg_true(), found))
        name = pl.col("text")
        domain_id = pl.col("domain_id")
        # Each domain id named once (a registered name, else "domain <id>"; 0 is none), not a
        # formatted default and two string columns per row (2.6 M ranges: 0.1 GB at the peak).
        named = {
            key: None if key == 0 else domains.get(key, f"domain {key}")
            for key in frame["domain_id"].unique().drop_nulls().to_list()
        }
        domain = domain_id.replace_strict(named, default=None, return_dtype=pl.String)
        payload: pl.Expr | pl.Series = pl.lit(None, dtype=pl.Int64)
        peer: pl.Expr | pl.Series = pl.lit(None, dtype=pl.Int32)
        if "payload" in frame.columns:
            # Decoded only where there is a blob (a range without one, null or empty as the reader
            # gives it, has neither field): NCCL's ranges, not every range (the per-op NVTX shape:
            # 2.6 M ranges and no blob).
            with_blob = frame["payload"].bin.size().fill_null(0) > 0
            if with_blob.any():
                decoded = _decode_payloads(
                    frame.filter(with_blob).select("domain_id", "payload"),
                    self.payload_offsets(),
                    self.peer_offsets(),
                )
                at = with_blob.arg_true()
                payload = pl.Series(dtype=pl.Int64).extend_constant(None, frame.height)
                payload = payload.scatter(at, decoded["payload_bytes"])
                peer = pl.Series(dtype=pl.Int32).extend_constant(None, frame.height)
                peer = peer.scatter(at, decoded["payload_peer"])
            frame = frame.drop("payload")
        frame = frame.with_columns(
            name.alias("name"),
            domain.alias("domain"),
            payload.alias("payload_bytes"),
            peer.alias("payload_peer"),
            pl.int_range(pl.len(), dtype=pl.Int64).alias("range_id"),
        )
        # Handed over whole: the nesting lets the unsorted frame go once it has sorted it.
        holder = [model.conform(frame, model.RANGES_SCHEMA)]
        del frame
        return model.conform(model.nest_taken(holder), model.RANGES_SCHEMA), folded

    def devices(self) -> pl.DataFrame:
        table = "TARGET_INFO_GPU"
        cols = self.columns(table)
        if table not in self.tables or not ({"cuDevice", "id"} & cols):
            return model.empty(model.DEVICES_SCHEMA)
        device = "cuDevice" if "cuDevice" in cols else "id"
        if device == "cuDevice" and "id" in cols:
            device = "COALESCE(cuDevice, id)"
        # CASTs: SQLite keeps whatever type a cell was written with; a damaged file's blob or text
        # where nsys writes an integer must not stop the read.
        select = [f"CAST({device} AS INTEGER) AS device"]
        for alias, column, kind in (
            ("name", "name", "TEXT"),
            ("bus_id", "busLocation", "TEXT"),
            ("sm_count", "smCount", "INTEGER"),
        ):
            select.append(f"CAST({column} AS {kind}) AS {alias}" if column in cols else f"NULL AS {alias}")
        rows = self.small(f"SELECT DISTINCT {', '.join(select)} FROM {table}")
        frame = pl.DataFrame(
            rows,
            schema={"device": pl.Int64, "name": pl.String, "bus_id": pl.String, "sm_count": pl.Int64},
            orient="row",
            strict=False,
        )
        return model.conform(frame.unique("device", keep="first", maintain_order=True), model.DEVICES_SCHEMA)

    def processes(self) -> pl.DataFrame:
        table = "PROCESSES"
        cols = self.columns(table)
        if table not in self.tables or not ({"globalPid", "pid"} & cols):
            return model.empty(model.PROCESSES_SCHEMA)
        pid = "(globalPid >> 24) & 16777215" if "globalPid" in cols else "pid"
        name = "name" if "name" in cols else "NULL"
        rows = self.small(f"SELECT CAST({pid} AS INTEGER), CAST({name} AS TEXT) FROM {table}")
        frame = pl.DataFrame(rows, schema={"pid": pl.Int64, "name": pl.String}, orient="row", strict=False)
        return model.conform(frame.unique("pid", keep="first", maintain_order=True), model.PROCESSES_SCHEMA)


def _u64_at(blob: pl.Expr, offset: int) -> pl.Expr:
    return blob.bin.slice(offset, 8).bin.reinterpret(dtype=pl.UInt64, endianness="little").cast(pl.Int64)


def _decode_payloads(
    blobs: pl.DataFrame, offsets: dict[int, int], peer_offsets: dict[tuple[int, int], int]
) -> pl.DataFrame:
    """Per row of ``blobs`` (``domain_id``, ``payload``: a range's ``binaryData``), the message
    size (``payload_bytes``, by :meth:`_Reader.payload_offsets`) and the peer rank
    (``payload_peer``, by :meth:`_Reader.peer_offsets`) its payload holds; null where its
    domain (and schema) has no such field or the blob is too short."""
    payload = pl.lit(None, dtype=pl.Int64)
    peer = pl.lit(None, dtype=pl.Int32)
    domain_id = pl.col("domain_id")
    blobs = blobs.with_columns(_payload_base(pl.col("payload")).alias("payload_base"))
    bases = [b for b in blobs["payload_base"].unique().to_list() if b is not None]
    for domain_key, offset in offsets.items():  # one expression per domain and base, not per event
        for base in bases:
            value = (
                pl.col("payload")
                .bin.slice(base + offset, 8)
                .bin.reinterpret(dtype=pl.UInt64, endianness="little")
                .cast(pl.Int64, strict=False)
            )
            hit = (domain_id == domain_key) & (pl.col("payload_base") == base)
            hit = hit & (pl.col("payload").bin.size() >= base + offset + 8)
            payload = pl.when(hit).then(value).otherwise(payload)
    schema_id = _payload_schema(pl.col("payload"))
    for (domain_key, schema_key), offset in peer_offsets.items():  # per schema, not per event
        for base in bases:
            hit = (domain_id == domain_key) & (schema_id == schema_key) & (pl.col("payload_base") == base)
            hit = hit & (pl.col("payload").bin.size() >= base + offset + 4)
            field = pl.col("payload").bin.slice(base + offset, 4)
            value = field.bin.reinterpret(dtype=pl.Int32, endianness="little")
            peer = pl.when(hit).then(value).otherwise(peer)
    # with_columns, not select: a literal (no domain with the field) takes the frame's height.
    return blobs.with_columns(payload.alias("payload_bytes"), peer.alias("payload_peer")).select(
        "payload_bytes", "payload_peer"
    )


def _payload_base(blob: pl.Expr) -> pl.Expr:
    """Where the payload starts inside ``binaryData``.

    nsys 2025.3 (``--include-blobs=true``) stores the NVTX extended payload as a header —
    uint64 count, then per payload uint64 schema id, size, and the payload's offset in the
    blob — followed by the payload itself (seen: ``count=1``, offset 32). A blob without that
    header is taken as the bare payload.
    """
    has_header = (blob.bin.size() >= 32) & (_u64_at(blob, 0) == 1)
    header_offset = _u64_at(blob, 24)
    sane = has_header & (header_offset >= 32) & (header_offset < blob.bin.size())
    return pl.when(sane).then(header_offset).otherwise(pl.lit(0, dtype=pl.Int64))


def _payload_schema(blob: pl.Expr) -> pl.Expr:
    """The schema id a blob's header names (uint64 after the count; see :func:`_payload_base`),
    null for a blob without that header."""
    has_header = (blob.bin.size() >= 32) & (_u64_at(blob, 0) == 1)
    return pl.when(has_header).then(_u64_at(blob, 8))


def _release_free_memory() -> None:
    """Hand the C heap's free pages back to the OS (glibc only; elsewhere nothing).

    The read frees hundreds of MB of Arrow batches in pieces small enough for glibc to keep in
    its heap; returned now, they do not add to the analysis's peak memory."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def valid_utf8(table: Any) -> tuple[Any, int]:
    """``table`` (Arrow) with every text value valid UTF-8, and how many were not.

    SQLite stores TEXT as the writer gave it (and ``CAST(blob AS TEXT)`` keeps the blob's bytes),
    ADBC hands such bytes on unchecked, and Polars takes them as a string column that later
    panics in Rust (``PyObject pointer is null`` from ``to_dicts``) or fails at a string
    operation. Each text chunk is validated in Arrow (C++, one pass); only a chunk that fails is
    decoded in Python, its bad bytes replaced by U+FFFD."""
    import pyarrow as pa

    replaced = 0
    columns = []
    for column in table.columns:
        kind = column.type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            columns.append(column)
            continue
        chunks = []
        for chunk in column.chunks:
            try:
                chunk.validate(full=True)
            except pa.ArrowInvalid:
                raw = chunk.view(pa.large_binary() if pa.types.is_large_string(kind) else pa.binary()).to_pylist()
                text = []
                for value in raw:
                    if value is None:
                        text.append(None)
                        continue
                    try:
                        text.append(value.decode("utf-8"))
                    except UnicodeDecodeError:
                        text.append(value.decode("utf-8", errors="replace"))
                        replaced += 1
                chunk = pa.array(text, type=kind)
            chunks.append(chunk)
        columns.append(pa.chunked_array(chunks, type=kind))
    if not replaced:
        return table, 0
    return pa.Table.from_arrays(columns, names=table.column_names), replaced


def scan_ints(db: Path, sql: str) -> pl.DataFrame:
    """Every column of ``sql`` on ``db`` as Int64, by the C reader (opened read-only and
    hardened like :func:`.sqlite_safe.open_readonly`)."""
    assert _int_scan is not None
    frame = int_frame(*_int_scan.scan(readonly_uri(db), sql, SAFE_PRAGMAS, sqlite_limits()))
    assert frame is not None  # no text column to check
    return frame


def scan_columns(db: Path, sql: str, kinds: str) -> pl.DataFrame | None:
    """Every column of ``sql`` on ``db`` by the C reader, each as ``kinds`` says ('i' Int64, 't'
    String, 'b' Binary); None when a text column is not UTF-8 (the caller reads it otherwise)."""
    assert _int_scan is not None
    names, columns, rows = _int_scan.scan(readonly_uri(db), sql, SAFE_PRAGMAS, sqlite_limits(), kinds)
    return int_frame(names, columns, rows, kinds)


def int_frame(names: list[str], columns: list[tuple[Any, ...]], rows: int, kinds: str = "") -> pl.DataFrame | None:
    """The C reader's result as a frame over its buffers (no copy; one chunk per column); text
    columns ('t' in ``kinds``) checked for UTF-8: None when one is not."""
    import pyarrow as pa

    arrays = []
    for index, column in enumerate(columns):
        if len(column) == 2:
            data, valid = column
            buffers = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(data)]
            arrays.append(pa.Array.from_buffers(pa.int64(), rows, buffers))
            continue
        offsets, data, valid = column
        buffers = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
        array = pa.Array.from_buffers(pa.large_binary(), rows, buffers)
        if kinds[index : index + 1] == "t":
            try:
                array = array.cast(pa.large_string())  # checks the bytes are UTF-8
            except pa.ArrowInvalid:
                return None
        arrays.append(array)
    frame = pl.from_arrow(pa.Table.from_arrays(arrays, names=names), rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    return frame


def conform_ops(frames: Sequence[pl.DataFrame]) -> pl.DataFrame:
    """Per-table op frames (:meth:`_Reader.node_ops`, graph executions) as one ``gpu_ops`` frame
    of :data:`model.GPU_OPS_SCHEMA`, in the order given."""
    if not frames:
        return model.empty(model.GPU_OPS_SCHEMA)
    conformed = [model.conform(frame, model.GPU_OPS_SCHEMA) for frame in frames]
    return pl.concat(conformed, how="vertical", rechunk=False)


#: What SQLite calls a rowid table's rowid (unless a column takes the name).
_ROWID_NAMES = ("rowid", "_rowid_", "oid")


def _pid_of(global_id: pl.Expr) -> pl.Expr:
    """``(globalTid >> 24) & 0xFFFFFF`` as SQLite computes it (floor division = arithmetic shift)."""
    return (global_id // (1 << 24)) & 0xFFFFFF


def _tid_of(global_tid: pl.Expr) -> pl.Expr:
    return global_tid & 0xFFFFFF


def _split_ids(
    global_ids: pl.Series, pid_type: pl.DataType, *, with_tid: bool
) -> tuple[pl.Series, pl.Series | None] | None:
    """:func:`_pid_of` as ``pid_type`` (Int32 or Int64) and, with ``with_tid``, :func:`_tid_of` as
    Int32 of ``global_ids``, in one pass of the C reader's module (``_int_scan.split_ids``) into
    one array each: the expressions made four or five (a 20 M-call runtime table, read twice by
    the per-op NVTX shape: 0.5 GB of fresh memory each time, on Polars' pool). None where it does
    not apply (no C module, nulls, another type, several chunks): the caller uses the expressions."""
    if (
        _int_scan is None
        or not hasattr(_int_scan, "split_ids")
        or global_ids.dtype != pl.Int64
        or pid_type not in (pl.Int32, pl.Int64)
        or global_ids.n_chunks() != 1
        or global_ids.null_count()
    ):
        return None
    ids = global_ids.to_numpy()  # one chunk without nulls: no copy
    pid = np.empty(ids.size, dtype=np.int32 if pid_type == pl.Int32 else np.int64)
    tid = np.empty(ids.size, dtype=np.int32) if with_tid else None
    _int_scan.split_ids(ids, pid, tid)
    return pl.Series("pid", pid), None if tid is None else pl.Series("tid", tid)


def _adbc_dbapi() -> Any:
    """ADBC's SQLite DB-API module, imported on first use (:data:`_HAS_ADBC`)."""
    import adbc_driver_sqlite.dbapi

    return adbc_driver_sqlite.dbapi


def _adbc_connect(db: Path) -> Any:
    """ADBC connection opened read-only and hardened like :func:`.sqlite_safe.open_readonly`."""
    conn = _adbc_dbapi().connect(readonly_uri(db))
    cursor = conn.cursor()
    try:
        for pragma in SAFE_PRAGMAS:
            cursor.execute(pragma)
    except BaseException:
        cursor.close()
        conn.close()
        raise
    cursor.close()
    return conn


#: How many processes share this process's cores, each running reads of its own (1: this one
#: alone). Set by :func:`share_cores`.
_core_sharers = 1


def share_cores(processes: int) -> None:
    """Tell this process's reads that ``processes`` processes (this one included) run at once on
    its cores, each reading a capture: a read then keeps at most its share of the cores busy, so
    it starts no second reader (process or thread) when its share is one core.

    Why: a local pool of one map process per core already keeps every core busy. A second reader
    per map there only adds an interpreter start and a memory-mapped hand-over per capture, and
    doubles the processes alive at once (their memory counts in the run's peak)."""
    global _core_sharers
    _core_sharers = max(1, int(processes))


def _free_cores() -> int:
    """Cores one read of this process may keep busy: its share of the cores it may run on."""
    return max(1, usable_cores() // _core_sharers)


def _scratch_dir() -> str | None:
    """RAM-backed ``/dev/shm`` when there is one (the hand-over never touches a disk)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


_WORKER_CODE = (
    "import sys; from traceguard.ingest.nsys_sqlite import _api_calls_worker; _api_calls_worker(sys.argv[1:])"
)


def _mapped_ipc(path: str) -> pl.DataFrame:
    """An Arrow IPC file as a frame over the memory-mapped file (no copy, no parse)."""
    import pyarrow as pa
    import pyarrow.ipc

    with pa.memory_map(path) as source:
        table = pyarrow.ipc.open_file(source).read_all()
    frame = pl.from_arrow(table, rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    return frame


def _api_calls_worker(argv: list[str]) -> None:
    """In the child process: read ``table``'s rows up to rowid ``cut`` (same hardened read-only
    opening) and hand them over as an uncompressed Arrow IPC file, which the parent memory-maps
    instead of copying. ``argv`` = database, output file, table, rowid name, cut, and the launch
    name ids to keep (comma-separated; ``-`` for every row). The file is
    renamed into place only once complete, and the parent also checks the exit status."""
    db, target, table, rowid, cut, names = argv
    if rowid not in ("rowid", "_rowid_", "oid"):
        raise SystemExit(2)
    launch_ids = None if names == "-" else [int(i) for i in names.split(",") if i]
    path = Path(db)
    reader = _Reader(open_readonly(path), path, db)
    try:
        partial = Path(target).with_suffix(".partial")
        frame = reader.api_table(table, Rows(((LOWEST_ROWID, int(cut) + 1),), rowid=rowid), launch_ids)
        frame.write_ipc(partial, compression="uncompressed")
        partial.rename(target)
    finally:
        reader.close()


class _SharedRead(Generic[_Piece]):
    """One read cut into pieces that several threads take in turn: the thread that owns it
    (:meth:`results`) and any other that :meth:`help` s while pieces are left. The results come
    in piece order, whoever read them; an error is raised by :meth:`results` (the first in piece
    order), after every piece taken has ended. An interrupt (a ``BaseException`` that is not an
    ``Exception``: Ctrl-C) is raised at once on the thread it met as well, not after the rest."""

    def __init__(self, pieces: Sequence[Callable[[], _Piece]]) -> None:
        self._pieces = list(pieces)
        self._done: list[tuple[bool, Any]] = [(False, None)] * len(self._pieces)
        self._next = 0
        self._ended = 0
        self._lock = threading.Condition()

    def help(self) -> None:
        """Read pieces until none is left to take (errors are kept for :meth:`results`)."""
        while True:
            with self._lock:
                at = self._next
                if at >= len(self._pieces):
                    return
                self._next = at + 1
            try:
                outcome: tuple[bool, Any] = (True, self._pieces[at]())
            except BaseException as exc:  # raised by results(), on the owning thread
                outcome = (False, exc)
            with self._lock:
                self._done[at] = outcome
                self._ended += 1
                self._lock.notify_all()
            if not outcome[0] and not isinstance(outcome[1], Exception):
                raise outcome[1]

    def results(self) -> list[_Piece]:
        """Every piece's result in order, once each has been read (this thread reads too)."""
        self.help()
        with self._lock:
            self._lock.wait_for(lambda: self._ended == len(self._pieces))
        for ok, value in self._done:
            if not ok:
                raise value
        return [value for _ok, value in self._done]


class _PendingApiCalls:
    """A worker process reading part of the API tables (``rest`` is what it leaves), or none."""

    def __init__(
        self,
        process: subprocess.Popen[bytes] | None,
        rest: list[tuple[str, str | Rows]],
        workdir: str = "",
        target: str = "",
    ) -> None:
        self.process = process
        self.rest = rest
        self.workdir = workdir
        self.target = target

    def result(self) -> str | None:
        """The worker's file, or None when there is no worker or it failed."""
        if self.process is None:
            return None
        if self.process.wait() != 0 or not Path(self.target).is_file():
            return None
        return self.target

    def close(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:  # the parent failed first: stop the worker
                self.process.kill()
            self.process.wait()
            self.process = None
        if self.workdir:
            # Mapped files stay readable after their names are gone (POSIX).
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = ""
