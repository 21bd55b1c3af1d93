"""Read an nsys SQLite export's GPU ops in time slices, with memory bounded by the slice size.

:func:`read_nsys_sqlite` holds every GPU op at once (≈100 bytes each: 10 GB at 100 M kernels).
:func:`open_sliced` reads the same export as the small frames (:meth:`SlicedNsys.small_capture`)
plus the ops in consecutive time slices (:meth:`SlicedNsys.op_slices`): concatenated and
stable-sorted by start, the slices are exactly the whole read's ``gpu_ops``
(``launches_only=True, keep_correlation=False``), launch columns included.

How a slice is found without reading the file whole: nsys writes each GPU activity table
(kernels, memcpys, memsets) in start order, so the rows of a time window are one rowid range,
found by binary search on the rowid (``SELECT start ... WHERE rowid >= ? LIMIT 1``, a b-tree
probe). The order is checked on every row read; a table out of order raises :class:`InputError`.
CUDA graph executions are few (one row per graph launch) and kept in memory.

Launches: an op's launch (the first :data:`LAUNCH_API` call with its (pid, correlation id), in
table then rowid order; see :func:`model.launch_rows`) starts before the op, possibly long
before. Before a slice [lo, hi) is joined, the launch rows starting before ``hi`` are read, by
the same binary search, on a second thread while the slice's GPU rows are read. The CUDA API
tables are only nearly in start order (a late-written block per process or thread): a table is
taken as one run until the rows read say otherwise, then split into runs in start order (one
pass over its ``start`` column, remembered for later passes), each read up to ``hi``. Launch rows
stay in a cache, in table then rowid order, until they are :data:`LAUNCH_LAG_NS` older than the
slice (or the cache passes its row bound). An op is joined from the cache only when that is
certainly what the whole read joins: its key is in the cache and no row that could have the
same key was dropped from it (per pid, the largest correlation id dropped). Every other op
(launched by a call outside :data:`LAUNCH_API`, launched before the capture, or whose launch was
dropped) is joined by an exact re-read of the API tables by correlation id
(:meth:`_Reader.reread_launches`). Where rows read later can come ahead in table order (two API
tables, or runs), a launch row with the key of a join already made and ahead of it (a duplicated
key whose earlier row starts after the op: never seen in nsys exports, where correlation ids
are unique per process) would have changed that join: it raises :class:`InputError`.

One difference from the whole read remains, only for a (pid, correlation id) shared by several
CUDA calls: the whole read's second process, reading the larger API table's first part, puts that
part first.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import numpy as np
import polars as pl

from traceguard import model
from traceguard.errors import InputError
from traceguard.ingest import nsys_sqlite
from traceguard.ingest.nsys_sqlite import (
    GRAPH_TRACE,
    KERNEL,
    MEMCPY,
    MEMSET,
    Rows,
    _Reader,
    conform_ops,
    open_reader,
    read_errors,
)

#: Stands for a null ``start`` in the API tables' order: such a row sorts first (read with the
#: first slice), as it can match an op at any time.
_NULL_START = -(1 << 63)
#: Rows per block read from the GPU tables at the least: smaller slices are cut from a block in
#: memory (a block costs a few SQLite queries and a launch join; at one op per slice those would
#: dominate).
MIN_BLOCK_ROWS = 1 << 16
#: Launch rows are kept this long (ns, by their start) after the slice that read them: a GPU op
#: can run long after its launch (a deep queue), and a later op can share a launch (graph nodes).
LAUNCH_LAG_NS = 30_000_000_000
#: :meth:`SlicedNsys._probe` results kept at most (about 100 bytes each).
_PROBES_KEPT = 100_000
#: The launch cache holds at most this many rows per block row (the oldest go first); with
#: :data:`LAUNCH_LAG_NS` this bounds it in time and in memory.
LAUNCH_CACHE_FACTOR = 2
#: At most this many keys of API rows outside :data:`~.nsys_sqlite.LAUNCH_API` are held (64 MB):
#: with more, every slice's ops that no launch row matches are re-read by id as before.
OTHER_KEYS_LIMIT = 8_000_000
#: Rows per read of the pass that collects those keys.
OTHER_KEYS_CHUNK = 1 << 20
#: Rows per query of the one pass that splits an API table into runs in start order.
RUN_SCAN_ROWS = 1 << 20
#: Rowid ranges per query when reading launch rows (an OR of ranges; SQLite's expression depth
#: limit is 100, :mod:`.sqlite_safe`).
_RANGES_PER_QUERY = 32
#: A launch-cache row: the columns :func:`model.launch_rows` and :func:`model.gather_launches`
#: read, typed as the whole read's API frame types them, plus the row's rowid and whether an op
#: was joined to it.
_CACHE_SCHEMA: dict[str, pl.DataType] = {
    "pid": pl.Int32(),
    "tid": pl.Int32(),
    "start": pl.Int64(),
    "name_id": pl.Int32(),
    "correlation_id": pl.Int64(),
    "rowid": pl.Int64(),
    "used": pl.Boolean(),
}
#: A joined launch row dropped from the cache: its API table (index), rowid and key.
_JOINED_SCHEMA: dict[str, pl.DataType] = {
    "table": pl.Int32(),
    "rowid": pl.Int64(),
    "pid": pl.Int32(),
    "correlation_id": pl.Int64(),
}
#: Slices at most that :func:`_merged_by_rowid` puts together (rows of many runs interleaved: a sort).
_MERGE_PIECES = 256
#: Joined rows dropped from the cache that are still checked exactly against rows read later
#: (where order is checked); older ones only by their correlation ids per pid.
JOINED_RECORD_ROWS = 1 << 18
_NODE_TABLES = (KERNEL, MEMCPY, MEMSET)


class OpSlice(NamedTuple):
    """The GPU ops that start in [``lo``, ``hi``) ns; consecutive slices share a bound."""

    lo: int
    hi: int
    ops: pl.DataFrame


def open_sliced(path: Path, *, shown: str | None = None, keep_correlation: bool = False) -> SlicedNsys:
    """Open one nsys SQLite export (or a gzipped one) for a sliced read; close it after use
    (a context manager). ``shown`` names the file in messages (default: ``path``).
    ``keep_correlation`` as :func:`read_nsys_sqlite`'s (default: null, as the analysis reads)."""
    path = Path(path)
    name = shown or str(path)
    reader = open_reader(path, name, launches_only=True, keep_correlation=keep_correlation)
    try:
        with read_errors(name):
            return SlicedNsys(reader)
    except BaseException:
        reader.close()
        raise


@dataclass
class _GpuTable:
    """One GPU activity table during an iteration: its rows not yet read are rowids >= ``cursor``."""

    name: str
    rowid: str
    end: int  #: one past the last rowid
    cursor: int
    last_start: int | None = None  #: start of the last row read (the order check across blocks)


@dataclass
class _Run:
    """Rowids [``lo``, ``end``) of an API table in start order (``first_start``/``last_start``:
    its first and last rows' starts, None when not known); ``cursor``: the first rowid not read."""

    lo: int
    end: int
    first_start: int | None
    last_start: int | None
    cursor: int = 0


@dataclass
class _ApiTable:
    """An API table during an iteration. Until a pass over it found its runs (``split``), it is
    taken as one run and checked on the rows read: out of order, it is split then."""

    name: str
    rowid: str
    runs: list[_Run]
    split: bool
    last_start: int | None = None  #: start of the last launch row read (the check while one run)


class SlicedNsys:
    """An nsys export opened for a sliced read (:func:`open_sliced`)."""

    def __init__(self, reader: _Reader) -> None:
        self._reader = reader
        self.shown = reader.shown
        reader.check_nsys()
        reader.check_row_limit()
        self._strings = reader.strings()
        self._launch_ids = reader.launch_name_ids(self._strings)
        self._graphs: pl.DataFrame | None = None  # conformed graph executions, once read
        #: API table → its runs (lo, end, first start, last start), once a table was found out of order.
        self._runs: dict[str, list[tuple[int, int, int, int]]] = {}
        #: :meth:`_other_keys`, once asked for: [keys or None].
        self._other: list[np.ndarray | None] | None = None
        #: (table, rowid) → :func:`_probe`'s answer (the file is read-only: it cannot change).
        self._probed: dict[tuple[str, int], tuple[int, int] | None] = {}

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> SlicedNsys:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- the small frames ----------------------------------------------------------------------

    def small_capture(self, *, keep_nvtx_rows: bool = True) -> model.Capture:
        """What ``read_nsys_sqlite(path, launches_only=True, keep_correlation=...)`` returns, but
        with ``gpu_ops`` empty (its schema, launch columns included). ``keep_nvtx_rows`` false:
        the file will not be read whole, so :meth:`nvtx_rows` is not wanted (it would read the
        table again) and its rows are not held under the ranges' build."""
        reader = self._reader
        with read_errors(self.shown):
            domains = reader.domain_names()
            info = reader.info(domains)
            self._graph_ops()  # names the graphs (reader.graph_strings)
            ranges, folded = reader.ranges(self._strings, domains, keep_rows=keep_nvtx_rows)
            capture = model.Capture(
                info=info,
                gpu_ops=model.empty({**model.GPU_OPS_SCHEMA, **model.LAUNCH_SCHEMA}),
                api_calls=model.empty(model.API_CALLS_SCHEMA),
                ranges=ranges,
                folded_ranges=folded,
                devices=reader.devices(),
                processes=reader.processes(),
                strings=reader.all_strings(self._strings),
            )
            # Read on a thread beside the op slices (the first pass), waited for when needed.
            reader.add_link_samples(capture, background=True)
            info.notes.extend(reader.text_notes())  # the GPU tables hold no text
            return capture

    def drop_nvtx_rows(self) -> None:
        """Let go of what the read kept of the NVTX table for :meth:`nvtx_rows` once the file is
        analysed in slices after all (its ranges are in the small capture): 205 MB of 2.6 M rows
        on the per-op NVTX shape, held through the whole analysis otherwise."""
        self._reader.drop_nvtx_rows()

    def nvtx_rows_at_most(self) -> int:
        """How many rows the NVTX table may hold (its rowid span; 0 without one): how long the
        :meth:`small_capture` read will take, without reading it."""
        if nsys_sqlite.NVTX not in self._reader.tables:
            return 0
        with read_errors(self.shown):
            _rowid, first, last = _rowid_bounds(self._reader, nsys_sqlite.NVTX, self.shown)
        return max(last - first + 1, 0)

    def processes_at_start(self, rows: int = 100_000) -> int:
        """How many processes have GPU ops among the first ``rows`` rows of each GPU table: a
        glance that tells a file of several ranks (they work from the start) without a read,
        not the plan (the census over every slice is that)."""
        reader, seen = self._reader, set()
        with read_errors(self.shown):
            for table in self._gpu_tables():
                if "globalPid" not in reader.columns(table.name):
                    continue
                quoted = table.name.replace('"', '""')
                first = f'SELECT globalPid FROM "{quoted}" WHERE {table.rowid} >= ? ORDER BY {table.rowid} LIMIT ?'
                pids = f"SELECT DISTINCT (globalPid >> 24) & 16777215 FROM ({first})"
                found = reader.small(pids, (table.cursor, rows))
                seen.update(pid for (pid,) in found if pid is not None)
        return len(seen)

    def help_read_nvtx(self) -> None:
        """Take pieces of the NVTX table's read that :meth:`small_capture` is making on another
        thread, until none is left (``_Reader.help_read_nvtx``; nothing when it is not reading)."""
        self._reader.help_read_nvtx()

    def nvtx_rows(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """What this read read of the NVTX table (``_Reader.nvtx_rows``): for a whole read of the
        same file (``read_nsys_sqlite(nvtx_rows=...)``), which then does not read it again."""
        with read_errors(self.shown):
            return self._reader.nvtx_rows()

    def _graph_ops(self) -> pl.DataFrame:
        """The CUDA graph executions the whole read keeps, conformed (empty when none). An
        execution with node rows is dropped (:meth:`_Reader.graph_executions`): those rows are
        found by one scan of each node table for the executions' correlation ids."""
        if self._graphs is not None:
            return self._graphs
        reader = self._reader
        graphs = model.empty(model.GPU_OPS_SCHEMA)
        if GRAPH_TRACE in reader.tables:
            ids: list[int] = []
            if "correlationId" in reader.columns(GRAPH_TRACE):
                found = reader.bulk(GRAPH_TRACE, [("id", "correlationId", "int")], "WHERE correlationId IS NOT NULL")
                ids = sorted({int(i) for i in found["id"].to_list()})
            covered: list[pl.DataFrame] = []
            for table in _NODE_TABLES:
                if ids and table in reader.tables and "correlationId" in reader.columns(table):

                    def read(condition: str, table: str = table) -> pl.DataFrame:
                        return reader._gpu_bulk(table, [], f"WHERE {condition}")

                    covered.append(reader.with_ids(table, ids, read))
            executions = reader.graph_executions(covered)
            if executions.height:
                graphs = model.conform(executions, model.GPU_OPS_SCHEMA)
                if graphs["start"].null_count():
                    raise _not_in_order(self.shown, GRAPH_TRACE, "rows without a start time")
        self._graphs = graphs
        return graphs

    # -- the ops, in slices --------------------------------------------------------------------

    def op_slices(self, max_rows: int = 2_000_000, *, launches: bool = True) -> Iterator[pl.DataFrame]:
        """The whole read's ``gpu_ops`` in time slices (see :meth:`op_windows`)."""
        for piece in self.op_windows(max_rows, launches=launches):
            yield piece.ops

    def op_windows(self, max_rows: int = 2_000_000, *, launches: bool = True) -> Iterator[OpSlice]:
        """Every GPU op once, in consecutive time slices [lo, hi) of at most about ``max_rows``
        ops (more only when more ops share one start), in start order; within a slice in the
        whole read's order (kernels, memcpys, memsets, graph executions, each in rowid order).
        Columns, types and launch columns as the whole read's ``gpu_ops``; with ``launches``
        false no API row is read and only what step inference reads of an op is (the kernel
        sequence: process, device, kind, start, end, name): the launch columns, correlation ids,
        bytes and memory kinds are null. Each call reads the file again;
        memory follows ``max(max_rows, MIN_BLOCK_ROWS)``, not the file."""
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        with read_errors(self.shown):
            yield from self._windows(max_rows, launches)

    def _windows(self, max_rows: int, with_launches: bool = True) -> Iterator[OpSlice]:
        block_rows = max(max_rows, MIN_BLOCK_ROWS)
        graphs = self._graph_ops()
        tables = self._gpu_tables()
        launches = _Launches(
            self._reader, self._api_tables(), self._launch_ids, block_rows, self._split, self._other_keys
        )
        graph_starts = np.sort(graphs["start"].to_numpy()) if graphs.height else np.empty(0, dtype=np.int64)
        firsts = [s for t in tables if (s := self._start_at(t, t.cursor)) is not None]
        if graph_starts.size:
            firsts.append(int(graph_starts[0]))
        if not firsts:
            return
        lo = min(firsts)
        lasts = [self._last_start(t) for t in tables if t.cursor < t.end]
        if graph_starts.size:
            lasts.append(int(graph_starts[-1]))
        top = max(lasts) + 1  # one past every start, when the tables are in order
        # The launch rows of a block are read, and added to the launch cache, on a second thread
        # while this one reads its GPU rows (the C reader releases the GIL; its connections are
        # its own). The cache is not touched here meanwhile: the last block's join is done, this
        # one's waits for the addition.
        parallel = nsys_sqlite._int_scan is not None and nsys_sqlite._free_cores() >= 2
        with (
            ThreadPoolExecutor(max_workers=1) if parallel else contextlib.nullcontext() as pool,
            # A block's copies and sets are read beside its kernels (with launches: the read
            # is the thread every rank waits on).
            ThreadPoolExecutor(1, "traceguard-tables")
            if parallel and with_launches
            else contextlib.nullcontext() as beside,
        ):
            while True:
                hi = self._next_hi(tables, graph_starts, lo, top, block_rows)
                last = hi >= top
                ranges = {
                    t.name: (t.cursor, t.end if last else self._lower_bound(t, hi, t.cursor, t.end)) for t in tables
                }
                if with_launches:
                    plans = launches.plan(hi)
                    pending = pool.submit(launches.read_plans, plans, hi) if pool is not None else None
                    ops = self._read_block(tables, ranges, graphs, lo, hi, beside=beside)
                    if pending is not None:
                        pending.result()
                    else:
                        launches.read_plans(plans, hi)
                    ops = launches.attach(ops, hi)
                else:
                    ops = self._read_block(tables, ranges, graphs, lo, hi, sequence_only=True)
                    ops = ops.with_columns(pl.lit(None, dtype=d).alias(c) for c, d in model.LAUNCH_SCHEMA.items())
                if not self._reader.keep_correlation:
                    ops = ops.with_columns(pl.lit(None, dtype=pl.Int64).alias("correlation_id"))
                if last and with_launches:
                    launches.drain()  # before the last slice goes out: a conflict raises first
                if max_rows >= block_rows:
                    yield OpSlice(lo, hi, ops)
                else:
                    yield from _cut(ops, lo, hi, max_rows)
                del ops  # the block is the consumer's now: not held while the next one is read
                if last:
                    return
                lo = hi

    def _read_block(
        self,
        tables: list[_GpuTable],
        ranges: dict[str, tuple[int, int]],
        graphs: pl.DataFrame,
        lo: int,
        hi: int,
        *,
        sequence_only: bool = False,
        beside: Executor | None = None,
    ) -> pl.DataFrame:
        """The ops of rowid ``ranges`` (one per GPU table) and the graph executions starting in
        [lo, hi), through the whole read's own code; each table's starts checked in order.
        ``sequence_only``: only the columns step inference reads; ``beside``: where the copies
        and sets are read meanwhile (``_Reader.node_ops``)."""
        where: dict[str, str | Rows] = {}
        for table in tables:
            where[table.name] = Rows((ranges[table.name],), rowid=table.rowid)
        frames = self._reader.node_ops(where, sequence_only=sequence_only, beside=beside)
        for table, frame in zip(tables, frames, strict=True):
            self._check_order(table, frame, lo, hi)
            table.cursor = ranges[table.name][1]
        if graphs.height:
            frames.append(graphs.filter((pl.col("start") >= lo) & (pl.col("start") < hi)))
        return conform_ops(frames)

    def _check_order(self, table: _GpuTable, frame: pl.DataFrame, lo: int, hi: int) -> None:
        if frame.height == 0:
            return
        if "start" not in frame.columns or frame["start"].null_count():
            raise _not_in_order(self.shown, table.name, "rows without a start time")
        starts = frame["start"]
        first, final = int(starts[0]), int(starts[-1])
        ordered = bool((starts.diff().drop_nulls() >= 0).all())
        after = table.last_start is None or first >= table.last_start
        if not (ordered and after and first >= lo and final < hi):
            raise _not_in_order(self.shown, table.name, "rows out of start order")
        table.last_start = final

    def _gpu_tables(self) -> list[_GpuTable]:
        """The node tables the file has (the order :meth:`_Reader.node_ops` returns them in), each
        with its rowid range."""
        reader = self._reader
        out = []
        for name in _NODE_TABLES:
            if name not in reader.tables:
                continue
            rowid, first, last = _rowid_bounds(reader, name, self.shown)
            out.append(_GpuTable(name, rowid, last + 1, first))
        return out

    def _api_tables(self) -> list[_ApiTable]:
        """The API tables at the start of an iteration: as runs where a pass split them, else
        as one run."""
        out = []
        for name in self._reader.api_tables():
            rowid, first, last = _rowid_bounds(self._reader, name, self.shown)
            if name in self._runs:
                runs = [_Run(lo, end, first_start, final, lo) for lo, end, first_start, final in self._runs[name]]
                out.append(_ApiTable(name, rowid, runs, split=True))
            else:
                out.append(_ApiTable(name, rowid, [_Run(first, last + 1, None, None, first)], split=False))
        return out

    def _other_keys(self) -> dict[int, np.ndarray] | None:
        """Per process, the sorted correlation ids of every API row whose name is not a launch
        (:data:`~.nsys_sqlite.LAUNCH_API`), read once per file on first need (one pass over the
        API tables in :data:`OTHER_KEYS_CHUNK`-row reads) and shared by every rank and pass; None
        with more than :data:`OTHER_KEYS_LIMIT` of them. An op no launch row matches can only be
        matched by such a row: an op whose key is not here has no API row at all (launched
        before the capture began), and re-reading the API tables for it is a whole pass that
        finds nothing: one per slice, per rank (the per-op NVTX shape at 10 M kernels spent
        about half its sliced time there)."""
        if self._other is not None:
            return self._other[0]
        parts: dict[int, list[np.ndarray]] = {}
        held = 0
        launch = pl.Series(self._launch_ids, dtype=pl.Int64).implode()
        for table in self._api_tables():
            columns = self._reader.columns(table.name)
            if "nameId" not in columns:
                continue  # a table without names holds launches only (as api_table reads it)
            if "correlationId" not in columns or "globalTid" not in columns:
                continue  # its rows have no (pid, correlation id): no op can match them
            lo = min(run.lo for run in table.runs)
            end = max(run.end for run in table.runs)
            # The same pass finds the table's runs where no pass has (:func:`_find_runs`' answer).
            runs = None if table.name in self._runs else _RunFinder(lo, end)
            for first in range(lo, end, OTHER_KEYS_CHUNK):
                rows = Rows(ranges=((first, min(first + OTHER_KEYS_CHUNK, end)),), rowid=table.rowid)
                frame = self._reader.api_table(table.name, rows, rowid=table.rowid if runs is not None else None)
                if runs is not None:
                    runs.feed(frame)
                # Only the keys are copied out of the chunk: its other columns are not wanted here.
                others = (
                    frame.lazy()
                    .select("pid", "correlation_id", "name_id")
                    .filter(
                        ~pl.col("name_id").cast(pl.Int64).is_in(launch).fill_null(False)
                        & pl.col("pid").is_not_null()
                        & pl.col("correlation_id").is_not_null()
                    )
                    .select("pid", "correlation_id")
                    .collect()
                )
                del frame
                held += others.height
                if held > OTHER_KEYS_LIMIT:
                    self._other = [None]
                    return None
                for (pid,), group in others.partition_by("pid", as_dict=True).items():
                    parts.setdefault(int(pid), []).append(group["correlation_id"].cast(pl.Int64).to_numpy())
            if runs is not None:
                self._runs[table.name] = runs.result()
        # Sorted, duplicates kept (a membership test needs no more); a process's ids come nearly
        # in order in table order, which the stable (run-adaptive) sort takes in one pass.
        keys = {pid: np.sort(np.concatenate(arrays), kind="stable") for pid, arrays in parts.items()}
        self._other = [keys]
        return keys

    def prepare_launches(self, going_on: Callable[[], bool]) -> None:
        """Read now, while ``going_on()`` (asked before each read), what the launch join reads at
        a file's first slice when it needs it: each API table's runs in start order and the keys
        of the non-launch API rows (one pass over the API tables finds both where they hold
        names and keys: 0.8 s on the per-op NVTX shape's 18.6 M rows). For a caller with a core
        idle meanwhile; both are remembered for every later read of the file, and what is not
        read here is read when needed."""
        with read_errors(self.shown):
            if going_on():
                self._other_keys()  # finds the runs of the tables it reads on the way
            for name in self._reader.api_tables():
                if not going_on():
                    return
                if name not in self._runs:
                    rowid, _first, _last = _rowid_bounds(self._reader, name, self.shown)
                    self._runs[name] = _find_runs(self._reader, name, rowid)

    def _split(self, table: _ApiTable) -> None:
        """Split ``table`` into runs (one pass), remembered for later iterations; the rows before
        the table's single cursor count as read."""
        (single,) = table.runs
        runs = _find_runs(self._reader, table.name, table.rowid)
        self._runs[table.name] = runs
        table.runs = [
            _Run(lo, end, first_start, final, min(max(single.cursor, lo), end)) for lo, end, first_start, final in runs
        ]
        table.split = True

    def _probe(self, table: str, rowid: str, at: int) -> tuple[int, int] | None:
        """(rowid, start) of the first row at rowid ``at`` or later; a null start as
        :data:`_NULL_START`. Remembered: a block's end is a bisection over time whose every step
        bisects each table's rowids from the same cursor, so the steps share most of their
        probes (about 2,400 SQL probes a block of the CUDA-graph shape, a fifth of its read)."""
        key = (table, at)
        if key in self._probed:
            return self._probed[key]
        if len(self._probed) >= _PROBES_KEPT:
            self._probed.clear()
        found = self._probed[key] = _probe(self._reader, table, rowid, at)
        return found

    def _start_at(self, table: _GpuTable, at: int) -> int | None:
        row = self._probe(table.name, table.rowid, at)
        return None if row is None or row[0] >= table.end else row[1]

    def _last_start(self, table: _GpuTable) -> int:
        quoted = table.name.replace('"', '""')
        sql = f'SELECT CAST(start AS INTEGER) FROM "{quoted}" ORDER BY {table.rowid} DESC LIMIT 1'
        if "start" not in self._reader.columns(table.name):
            raise _not_in_order(self.shown, table.name, "rows without a start time")
        rows = self._reader.small(sql)
        if not rows or rows[0][0] is None:
            raise _not_in_order(self.shown, table.name, "rows without a start time")
        return int(rows[0][0])

    def _lower_bound(self, table: _GpuTable, value: int, first: int, end: int) -> int:
        return _lower_bound(
            self._reader,
            table.name,
            table.rowid,
            value,
            first,
            end,
            probe=partial(self._probe, table.name, table.rowid),
        )

    def _count(self, tables: list[_GpuTable], graph_starts: np.ndarray, lo: int, value: int, limit: int) -> int:
        """Ops not yet read that start before ``value`` (rowid distances: gaps count as rows);
        each table's count is cut at ``limit + 1``."""
        total = 0
        for table in tables:
            end = min(table.end, table.cursor + limit + 1)
            total += self._lower_bound(table, value, table.cursor, end) - table.cursor
        if graph_starts.size:
            total += int(np.searchsorted(graph_starts, value) - np.searchsorted(graph_starts, lo))
        return total

    def _next_hi(self, tables: list[_GpuTable], graph_starts: np.ndarray, lo: int, top: int, rows: int) -> int:
        """The end of the block starting at ``lo``: the largest time with at most ``rows`` ops
        not yet read before it, or ``lo + 1`` when more than ``rows`` ops start at ``lo``;
        ``top`` when everything left fits."""
        if self._count(tables, graph_starts, lo, top, rows) <= rows:
            return top
        high = top  # more than ``rows`` ops start before it
        for table in tables:  # narrow it: the start of each table's (rows+1)-th row
            at = table.cursor + rows
            if at < table.end and (start := self._start_at(table, at)) is not None and lo < start + 1 < high:
                high = start + 1
        low = lo + 1
        if self._count(tables, graph_starts, lo, low, rows) > rows:
            return low
        while high - low > 1:  # count(low) <= rows < count(high)
            mid = (low + high) // 2
            if self._count(tables, graph_starts, lo, mid, rows) <= rows:
                low = mid
            else:
                high = mid
        return low


def _cut(ops: pl.DataFrame, lo: int, hi: int, max_rows: int) -> Iterator[OpSlice]:
    """A block's ops as consecutive slices of at most ``max_rows`` ops (or all ops of one start),
    each keeping the block's row order."""
    if ops.height == 0:
        yield OpSlice(lo, hi, ops)
        return
    starts = ops["start"].to_numpy()
    ordered = np.sort(starts)
    bounds = [lo]
    at = 0
    while at < ordered.size:
        first = int(ordered[at])
        nxt = at + max_rows
        if nxt >= ordered.size:
            break
        cut = int(ordered[nxt])
        if cut == first:  # more than max_rows ops start at ``first``: one slice for them all
            cut = first + 1
        bounds.append(cut)
        at = int(np.searchsorted(ordered, cut, side="left"))
    bounds.append(hi)
    part = np.searchsorted(np.asarray(bounds[1:-1], dtype=np.int64), starts, side="right")
    ordered_ops = ops.with_columns(pl.Series("_part", part, dtype=pl.Int64)).sort("_part", maintain_order=True)
    counts = np.bincount(part, minlength=len(bounds) - 1)
    offset = 0
    for index, count in enumerate(counts.tolist()):
        piece = ordered_ops.slice(offset, count).drop("_part")
        offset += count
        yield OpSlice(bounds[index], bounds[index + 1], piece)


class _Launches:
    """The launch join of one iteration: the launch rows read so far (:data:`_CACHE_SCHEMA`, one
    frame per API table, rowid order) and what was dropped from them."""

    def __init__(
        self,
        reader: _Reader,
        tables: list[_ApiTable],
        launch_ids: list[int],
        block_rows: int,
        split: Callable[[_ApiTable], None],
        other_keys: Callable[[], np.ndarray | None] | None = None,
    ) -> None:
        self.reader = reader
        self.other_keys = other_keys
        self.tables = tables
        self.launch_ids = launch_ids
        self.split = split
        self.cache = [model.empty(_CACHE_SCHEMA) for _ in tables]
        #: pid → the largest correlation id of a launch row dropped from the cache.
        self.dropped: dict[int, int] = {}
        self.limit = LAUNCH_CACHE_FACTOR * block_rows
        #: Joined rows dropped from the cache (table index, rowid, key), the latest
        #: :data:`JOINED_RECORD_ROWS`; pid → the largest correlation id of those forgotten.
        self.joined = model.empty(_JOINED_SCHEMA)
        self.forgotten: dict[int, int] = {}
        #: pid → the largest correlation id of any op joined from the cache so far (where order is
        #: checked): a row read later whose key is above it cannot be any joined row's.
        self.joined_above: dict[int, int] = {}

    @property
    def check_order(self) -> bool:
        """Whether a row read later can come ahead of a row read before in table order (then
        the rows read are checked against the joins made): several API tables, or a table in
        several runs."""
        return len(self.tables) > 1 or any(len(t.runs) > 1 for t in self.tables)

    def attach(self, ops: pl.DataFrame, hi: int) -> pl.DataFrame:
        """``ops`` (all starting before ``hi``) plus the :data:`model.LAUNCH_SCHEMA` columns the
        whole read gives them; every launch row starting before ``hi`` must have been read
        (:meth:`read_until`)."""
        rows, columns = self.join(ops)
        keyed = ops["pid"].is_not_null() & ops["correlation_id"].is_not_null()
        doubtful = self.doubtful(ops)
        unsure = (rows.is_null() | doubtful) & keyed
        if unsure.any() and self.other_keys is not None and (others := self.other_keys()) is not None:
            # Once every table's runs are known, every launch row starting before ``hi`` is in
            # the cache or was dropped (``doubtful``); an op neither joined nor doubtful can then
            # only match a non-launch row, and when none has its key there is nothing to re-read.
            if not all(table.split for table in self.tables):
                self.split_all(hi)
                rows, columns = self.join(ops)
                unsure = (rows.is_null() | doubtful) & keyed
            # Only the ops still in question are looked up (a whole slice's: 20 ms a block).
            asked = (unsure & ~doubtful).arg_true()
            known = pl.Series(np.zeros(ops.height, dtype=bool))
            if asked.len():
                known = known.scatter(asked, _key_in(ops[asked], others))
            unsure &= doubtful | known
        if unsure.any():
            missing = unsure.arg_true()
            found = self.reader.reread_launches(ops[missing], self.launch_ids)
            columns = [col.scatter(missing, extra) for col, extra in zip(columns, found, strict=True)]
            rows = rows.scatter(missing, None)
        if self.check_order:  # the flags serve only the order checks
            self.mark_used(rows)
            _raise_marks(self.joined_above, ops["pid"], ops["correlation_id"], rows.is_not_null().to_numpy())
        self.evict(hi)
        return model.add_columns(ops, columns)

    def join(self, ops: pl.DataFrame) -> tuple[pl.Series, list[pl.Series]]:
        """Each op's row among the cached launch rows (null: none) and its launch columns."""
        calls = pl.concat(self.cache, how="vertical", rechunk=False)
        rows = model.launch_rows(ops, calls)
        return rows, model.gather_launches(calls, rows)

    def split_all(self, hi: int) -> None:
        """Split every table still taken as one run into its runs (one pass each, remembered for
        later iterations) and read each run up to ``hi``, as :meth:`merge` does for a table
        found out of order: afterwards every launch row starting before ``hi`` has been read."""
        for index, table in enumerate(self.tables):
            if not table.split:
                self.split(table)
                self.merge(self.fetch(self.plan(hi, only=index)), hi)

    def doubtful(self, ops: pl.DataFrame) -> pl.Series:
        """Ops whose key a dropped launch row may have had (its correlation id at most the
        largest dropped for its pid)."""
        if not self.dropped:
            return pl.Series([False] * ops.height, dtype=pl.Boolean)
        return _at_most(ops, self.dropped)

    def read_until(self, hi: int | None) -> None:
        """Read every launch row starting before ``hi`` not read yet (each run up to ``hi``;
        None: to its end)."""
        self.read_plans(self.plan(hi), hi)

    def read_plans(self, plans: list[tuple[int, list[tuple[int, int]]]], hi: int | None) -> None:
        """The rows of ``plans`` (:meth:`plan`) read and added to the cache (:meth:`merge`):
        on the read's second thread, the merge's concatenations, order checks and sorts are not
        on the thread the ranks wait for (the per-op NVTX shape: 0.67 s of it)."""
        self.merge(self.fetch(plans), hi)

    def plan(self, hi: int | None, only: int | None = None) -> list[tuple[int, list[tuple[int, int]]]]:
        """Per API table (index; ``only`` that one) the rowid ranges of the launch rows starting
        before ``hi`` not read yet (each run up to ``hi``; None: to its end); the cursors move
        past them."""
        plans = []
        for index, table in enumerate(self.tables):
            if only is not None and index != only:
                continue
            ranges: list[tuple[int, int]] = []
            for run in table.runs:
                if run.cursor >= run.end:
                    continue
                if hi is None or (run.last_start is not None and run.last_start < hi):
                    stop = run.end
                elif run.cursor == run.lo and run.first_start is not None and run.first_start >= hi:
                    continue  # nothing of it yet: no probe
                else:
                    stop = _lower_bound(self.reader, table.name, table.rowid, hi, run.cursor, run.end)
                if stop > run.cursor:
                    if ranges and ranges[-1][1] == run.cursor:
                        ranges[-1] = (ranges[-1][0], stop)
                    else:
                        ranges.append((run.cursor, stop))
                run.cursor = stop
            if ranges:
                plans.append((index, ranges))
        return plans

    def fetch(self, plans: list[tuple[int, list[tuple[int, int]]]]) -> list[tuple[int, pl.DataFrame]]:
        """The launch rows of ``plans`` (:data:`_CACHE_SCHEMA`, rowid order). Touches no shared
        state: it may run on another thread while the GPU rows are read."""
        out = []
        for index, ranges in plans:
            table = self.tables[index]
            frames = []
            for lo in range(0, len(ranges), _RANGES_PER_QUERY):
                cond = Rows(tuple(ranges[lo : lo + _RANGES_PER_QUERY]), rowid=table.rowid)
                read = self.reader.api_table(table.name, cond, self.launch_ids, rowid=table.rowid)
                frames.append(model.conform(read.with_columns(pl.lit(False).alias("used")), _CACHE_SCHEMA))
            new = pl.concat(frames, how="vertical", rechunk=False)
            if not new["rowid"].is_sorted():
                new = new.sort("rowid", maintain_order=True)
            out.append((index, new))
        return out

    def merge(self, fetched: list[tuple[int, pl.DataFrame]], hi: int | None) -> None:
        """Add rows :meth:`fetch` read to the cache (checked against the joins made where
        order is checked); a table taken as one run and found out of order is split into runs
        and each read up to ``hi``."""
        for index, new in fetched:
            if new.height == 0:
                continue
            table = self.tables[index]
            if self.check_order:
                self.check_new(index, new)
            self.cache[index] = _merged_by_rowid(self.cache[index], new)
            if table.split:
                continue
            starts = new["start"].fill_null(_NULL_START)
            first, final = int(starts[0]), int(starts[-1])
            in_order = bool((starts.diff().drop_nulls() >= 0).all())
            if in_order and (table.last_start is None or first >= table.last_start):
                table.last_start = final
            else:  # a late-written block: find the runs, read each up to ``hi``
                # Rows read so far are a rowid prefix: every row read after the split comes
                # after them in table order, so the joins made so far stand.
                self.split(table)
                self.merge(self.fetch(self.plan(hi, only=index)), hi)

    def drain(self) -> None:
        """After the last slice: read the launch rows left (they start after every op) where
        they can come ahead of a joined row in table order, for :meth:`check_new`."""
        if self.check_order:
            self.evict(None)  # keep no more than a block's worth while reading the rest
            self.read_until(None)

    def check_new(self, index: int, new: pl.DataFrame) -> None:
        """Raise when a launch row just read (of table ``index``) comes, in table order, ahead
        of a row an op was joined to with the same key (that op's join would have been this
        row), or may (its key at most a forgotten join's)."""
        if not bool(_at_most(new, self.joined_above).any()):
            # Every key above the largest joined for its pid (a process's correlation ids grow
            # with its launches' starts, and rows come in start order): no joined or forgotten
            # row has it. The exact check (a join with every joined row) only otherwise.
            return
        keys = ["pid", "correlation_id"]
        joined = [self.joined]
        for other, cached in enumerate(self.cache):
            used = cached.filter(pl.col("used"))
            if used.height:
                joined.append(
                    used.select(pl.lit(other, dtype=pl.Int32).alias("table"), "rowid", *keys).cast(
                        {"pid": pl.Int32, "correlation_id": pl.Int64}
                    )
                )
        earlier = pl.concat(joined, how="vertical").rename({"rowid": "_joined_rowid"})
        hits = new.select(*keys, "rowid").join(earlier, on=keys, how="inner")
        ahead = (pl.col("table") > index) | ((pl.col("table") == index) & (pl.col("rowid") < pl.col("_joined_rowid")))
        if hits.filter(ahead).height or (self.forgotten and bool(_at_most(new, self.forgotten).any())):
            raise InputError(
                f"{self.reader.shown}: CUDA API rows share a (process, correlation id) key in an "
                "order that a sliced read cannot resolve",
                hint="analyse the file whole",
            )

    def mark_used(self, rows: pl.Series) -> None:
        """Flag the cache rows ``rows`` (indices into the tables' caches, concatenated) as joined."""
        # NumPy on this thread, repeats and all (a flag set twice is set): a Polars unique and
        # scatter waited on the pool that the ranks' analyses keep busy (24 ms a block, not 4).
        picked = rows.drop_nulls().to_numpy()
        if picked.size == 0:
            return
        offset = 0
        for index, cached in enumerate(self.cache):
            end = offset + cached.height
            mine = picked if len(self.cache) == 1 else picked[(picked >= offset) & (picked < end)] - offset
            if mine.size:
                flags = cached["used"].to_numpy().copy()
                flags[mine] = True
                self.cache[index] = cached.with_columns(pl.Series("used", flags))
            offset = end

    def evict(self, hi: int | None) -> None:
        """Drop launch rows :data:`LAUNCH_LAG_NS` older than ``hi``, then the oldest beyond the
        cache's bound (``hi`` None: all), remembering per pid the largest correlation id dropped
        and, where order is checked, the joined rows dropped."""
        cutoff = (1 << 63) - 1 if hi is None else hi - LAUNCH_LAG_NS
        total = sum(c.height for c in self.cache)
        if total > self.limit:
            starts = np.concatenate([c["start"].fill_null(_NULL_START).to_numpy() for c in self.cache])
            cutoff = max(cutoff, int(np.partition(starts, total - self.limit)[total - self.limit]))
        for index, cached in enumerate(self.cache):
            old = cached["start"].fill_null(_NULL_START).to_numpy() < cutoff
            if not old.any():
                continue
            # Only the dropped rows' keys are needed: no copy of them is made.
            _raise_marks(self.dropped, cached["pid"], cached["correlation_id"], old)
            dropping = pl.Series(old)
            if self.check_order:
                used = cached.filter(dropping & cached["used"])
                used = used.select(pl.lit(index, dtype=pl.Int32).alias("table"), "rowid", "pid", "correlation_id")
                self.joined = pl.concat([self.joined, used.cast(_JOINED_SCHEMA)], how="vertical")
            self.cache[index] = _kept(cached, ~old)
        if self.joined.height > JOINED_RECORD_ROWS:  # forget the oldest: keep their marks only
            excess = self.joined.height - JOINED_RECORD_ROWS
            oldest = self.joined.head(excess)
            _raise_marks(self.forgotten, oldest["pid"], oldest["correlation_id"])
            self.joined = self.joined.slice(excess)


def _kept(frame: pl.DataFrame, keep: np.ndarray, most: int = _MERGE_PIECES) -> pl.DataFrame:
    """``frame``'s rows where ``keep``, in order: as slices where they are at most ``most`` runs of
    rows (a run's oldest rows go first, so what the cache keeps of each run is its end), else
    filtered."""
    edges = np.flatnonzero(np.diff(keep.astype(np.int8))) + 1
    if keep.size == 0 or edges.size >= most:
        return frame.filter(pl.Series(keep))
    bounds = [0, *edges.tolist(), keep.size]
    pieces = [frame.slice(lo, hi - lo) for lo, hi in itertools.pairwise(bounds) if keep[lo]]
    return pl.concat(pieces, how="vertical", rechunk=False) if pieces else frame.clear()


def _merged_by_rowid(held: pl.DataFrame, new: pl.DataFrame, most: int = _MERGE_PIECES) -> pl.DataFrame:
    """``held`` and ``new`` (each in rowid order; a rowid in one of them only) as one frame in
    rowid order. A table's launch rows come in runs, and the rows a block adds to a run all follow
    the rows held of it, so the result is a few slices of each, put together without a copy. A
    sort copied the whole cache at each block where two runs interleave (the per-op NVTX shape:
    13 merges of 15, 1.5 M rows each); with :func:`_kept`, the CUDA-graph shape took 0.6-0.9 s of
    CPU less. With more than ``most`` slices, a sort."""
    if held.height == 0 or new.height == 0:
        return new if held.height == 0 else held
    at = np.searchsorted(held["rowid"].to_numpy(), new["rowid"].to_numpy())  # each new row's place
    cuts = np.flatnonzero(np.diff(at)) + 1  # where the new rows' place changes
    if cuts.size >= most:
        return pl.concat([held, new], how="vertical", rechunk=False).sort("rowid", maintain_order=True)
    pieces = []
    done = 0  # held rows placed so far
    for first, end in zip([0, *cuts.tolist()], [*cuts.tolist(), new.height], strict=True):
        place = int(at[first])
        if place > done:
            pieces.append(held.slice(done, place - done))
            done = place
        pieces.append(new.slice(first, end - first))
    if done < held.height:
        pieces.append(held.slice(done, held.height - done))
    return pl.concat(pieces, how="vertical", rechunk=False)


def _raise_marks(marks: dict[int, int], pids: pl.Series, ids: pl.Series, where: np.ndarray | None = None) -> None:
    """``marks[pid]`` raised to the largest correlation id with that pid, over the rows of
    ``pids`` and ``ids`` (one frame's columns) that ``where`` picks (None: all); rows with
    either null count for nothing. NumPy, for the first :data:`_MARKS_COMPARED` processes (a
    file's few) one masked maximum each over the columns as they are, with no copy of the rows
    picked (a million ops of two processes: 18 ms, where the copies took 33); on the calling
    thread: a Polars group-by here waited on the pool that the ranks' analyses keep busy."""
    if pids.null_count() or ids.null_count():
        left = (pids.is_not_null() & ids.is_not_null()).to_numpy()
        if where is not None:
            left &= where
        pids, ids = pids.fill_null(0), ids.fill_null(0)
    else:
        left = np.ones(pids.len(), dtype=bool) if where is None else where.copy()
    if not left.any():
        return
    pid_values = pids.to_numpy()
    id_values = ids.to_numpy()
    lowest = np.iinfo(id_values.dtype).min
    for _ in range(_MARKS_COMPARED):
        at = int(np.argmax(left))  # the first row not yet counted
        if not left[at]:
            return
        pid = int(pid_values[at])
        mine = left & (pid_values == pid)
        top = int(np.max(id_values, where=mine, initial=lowest))
        marks[pid] = max(marks.get(pid, top), top)
        left &= ~mine
    if left.any():  # more processes than that: grouped
        rest = pl.DataFrame({"pid": pid_values[left], "correlation_id": id_values[left]})
        for pid, top in rest.group_by("pid").agg(pl.col("correlation_id").max()).iter_rows():
            marks[pid] = max(marks.get(pid, top), top)


#: Up to how many pids :func:`_at_most` compares one by one rather than joins.
_MARKS_COMPARED = 16


def _at_most(frame: pl.DataFrame, marks: dict[int, int]) -> pl.Series:
    """Per row of ``frame``: its correlation id is at most ``marks`` of its pid. A few pids (a
    file's processes) by one comparison each (1 M ops: 0.7 ms, where a join took 12 ms), more by
    a join."""
    if not marks:
        return pl.repeat(False, frame.height, dtype=pl.Boolean, eager=True).alias("correlation_id")
    if len(marks) <= _MARKS_COMPARED:
        hit = pl.lit(False)
        for pid, mark in marks.items():
            hit = hit | ((pl.col("pid") == pid) & (pl.col("correlation_id") <= mark))
        return frame.select(hit.fill_null(False).alias("correlation_id")).to_series()
    table = pl.DataFrame(
        {"pid": list(marks), "_mark": list(marks.values())},
        schema={"pid": frame.schema["pid"], "_mark": pl.Int64},
    )
    joined = frame.select("pid", "correlation_id").join(table, on="pid", how="left", maintain_order="left")
    return (joined["correlation_id"] <= joined["_mark"]).fill_null(False)


def _rowid_bounds(reader: _Reader, table: str, shown: str) -> tuple[str, int, int]:
    """(rowid name, first rowid, last rowid) of ``table`` (last < first when empty)."""
    rowid = next((n for n in ("rowid", "_rowid_", "oid") if n not in reader.columns(table)), None)
    if rowid is None:
        raise _not_in_order(shown, table, "no rowid")
    quoted = table.replace('"', '""')
    # Two queries: a lone min() or max() of the rowid is read from the b-tree's ends.
    low = reader.small(f'SELECT IFNULL(min({rowid}), 0) FROM "{quoted}"')[0][0]
    high = reader.small(f'SELECT IFNULL(max({rowid}), -1) FROM "{quoted}"')[0][0]
    return rowid, int(low), int(high)


def _probe(reader: _Reader, table: str, rowid: str, at: int) -> tuple[int, int] | None:
    if "start" not in reader.columns(table):
        quoted = table.replace('"', '""')
        rows = reader.small(f'SELECT {rowid} FROM "{quoted}" WHERE {rowid} >= ? ORDER BY {rowid} LIMIT 1', (at,))
        return (int(rows[0][0]), _NULL_START) if rows else None
    found = reader.first_row(table, rowid, at, "start")
    if found is None:
        return None
    return found[0], _NULL_START if found[1] is None else found[1]


def _lower_bound(
    reader: _Reader,
    table: str,
    rowid: str,
    value: int,
    first: int,
    end: int,
    probe: Callable[[int], tuple[int, int] | None] | None = None,
) -> int:
    """The first rowid position in [``first``, ``end``) whose row starts at ``value`` or later
    (``end`` when none), by binary search: the rows there must be in start order. ``probe``:
    :func:`_probe` of this table by rowid, when the caller remembers them."""
    low, high = first, end
    while low < high:
        mid = (low + high) // 2
        row = probe(mid) if probe is not None else _probe(reader, table, rowid, mid)
        if row is None or row[0] >= high or row[1] >= value:
            high = mid  # no row in [mid, row's rowid) exists: position mid is the same place
        else:
            low = row[0] + 1
    return low


def _find_runs(reader: _Reader, table: str, rowid: str) -> list[tuple[int, int, int, int]]:
    """``table`` split into rowid ranges [lo, end) each in start order, with the starts of their
    first and last rows, by one pass over its starts, :data:`RUN_SCAN_ROWS` rows at a time (a null
    start as :data:`_NULL_START`). An empty table: no runs."""
    quoted = table.replace('"', '""')
    first = int(reader.small(f'SELECT IFNULL(min({rowid}), 0) FROM "{quoted}"')[0][0])
    last = int(reader.small(f'SELECT IFNULL(max({rowid}), -1) FROM "{quoted}"')[0][0])
    start = "start" if "start" in reader.columns(table) else "NULL"
    spec = [("rowid", rowid, "int"), ("start", start, "int")]
    runs = _RunFinder(first, last + 1)
    for lo in range(first, last + 1, RUN_SCAN_ROWS):
        # Rowid ranges, which the b-tree reader takes (a WHERE text goes through SQLite: 3x slower).
        runs.feed(reader.bulk(table, spec, Rows(((lo, lo + RUN_SCAN_ROWS),), rowid=rowid)))
    return runs.result()


class _RunFinder:
    """:func:`_find_runs`' pass, fed the table's rows in rowid order a frame at a time (columns
    ``rowid`` and ``start``; a frame without ``start``: all null) from ``first`` to ``end``."""

    def __init__(self, first: int, end: int) -> None:
        self.end = end
        self.runs: list[tuple[int, int, int, int]] = []
        self.run_lo, self.run_first = first, 0
        self.previous: int | None = None

    def feed(self, part: pl.DataFrame) -> None:
        if part.height == 0:
            return
        starts = (
            part["start"].fill_null(_NULL_START).to_numpy()
            if "start" in part.columns
            else np.full(part.height, _NULL_START, dtype=np.int64)
        )
        rowids = part["rowid"].to_numpy()
        breaks = np.flatnonzero(starts[1:] < starts[:-1]) + 1
        if self.previous is None:
            self.run_first = int(starts[0])
        elif starts[0] < self.previous:
            breaks = np.concatenate(([0], breaks))
        for at in breaks.tolist():
            final = self.previous if at == 0 else int(starts[at - 1])
            self.runs.append((self.run_lo, int(rowids[at]), self.run_first, final))  # type: ignore[arg-type]
            self.run_lo, self.run_first = int(rowids[at]), int(starts[at])
        self.previous = int(starts[-1])

    def result(self) -> list[tuple[int, int, int, int]]:
        """The runs (lo, end, first start, last start); none for an empty table."""
        if self.previous is None:
            return list(self.runs)
        return [*self.runs, (self.run_lo, self.end, self.run_first, self.previous)]


def _not_in_order(shown: str, table: str, what: str) -> InputError:
    return InputError(
        f"{shown}: the export's {table} is not in time order ({what}), so it cannot be read in slices",
        hint="analyse it whole: give --sliced-above (or TRACEGUARD_SLICED_ABOVE) a size above the file's, "
        "on a machine with memory for it",
    )


def _key_in(ops: pl.DataFrame, keys: dict[int, np.ndarray]) -> pl.Series:
    """Whether each op's correlation id is among ``keys[its pid]`` (sorted ids; False where
    either is null or the pid has none)."""
    found = np.zeros(ops.height, dtype=bool)
    pids = ops["pid"].to_numpy()
    ids = ops["correlation_id"].to_numpy()
    for pid, known in keys.items():
        mine = np.flatnonzero(pids == pid)
        if mine.size == 0 or known.size == 0:
            continue
        wanted = ids[mine]
        at = np.minimum(np.searchsorted(known, wanted), known.size - 1)
        found[mine] = known[at] == wanted
    return pl.Series(found)
