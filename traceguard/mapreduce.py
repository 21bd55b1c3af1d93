"""The analysis of a run as a map over its input files and a reduce over their ranks.

**Map** (:func:`map_input`, one task per input file): read the capture, find the ranks it holds,
and compute every per-rank metric (:func:`traceguard.metrics.rank.analyse_rank`). Only the
per-rank results leave the task (a few kB to a few MB per rank: metrics, step rows, aggregated
timeline), never the events, so the reducer's memory does not grow with the captures.

**Reduce** (:func:`traceguard.metrics.run.reduce_results`): run metrics and the cross-rank
checks (straggler, homogeneity, peer matrix), in the calling process.

Where the map runs (the *scheduler*, the same code path for each):

- ``serial``: in this process, one input after the other;
- ``local`` (the default): a pool of ``jobs`` processes on this machine (default: every core).
  Starting a process costs about a second (Python, Polars, traceguard imported afresh), so without
  an explicit ``jobs`` a run whose files hold less than :data:`LOCAL_POOL_MIN_BYTES` in all is
  mapped in this process;
- ``tcp://host:port`` (or ``tls://``): a ``dask.distributed`` scheduler (``pip install
  traceguard[dask]``); its workers must run the same traceguard and see the inputs at the same
  paths (a shared filesystem). ``TRACEGUARD_DASK_SCHEDULER`` sets it when no scheduler is given.

**Ranks.** A rank's number changes what is computed (the peer of a two-rank communicator, the
communicator size when the capture does not state it), so each task is given its ranks before it
analyses. They are planned from what each input states without reading it (``FILE:RANK``, the
manifest, a peek at the ``RANK`` nsys recorded or Kineto's ``distributedInfo``, the file name)
and checked against what the full read found (:func:`traceguard.ingest.resolve_ranks` over the
real facts, as when every capture is loaded at once). An input analysed under ranks the check does
not confirm (a file holding several GPU processes, a file that states another rank than its name,
an unreadable input shifting the position guesses) is analysed again under the confirmed ones, so
the report never depends on the scheduler.

A task that fails on the input (unreadable, truncated, not a capture) makes that input's
``error``; a task whose worker died (killed for memory, lost machine) is tried once more and then
becomes the input's ``error`` with code ``worker_lost``. The other inputs go on. An exception that
is neither is a bug and propagates, as it does without a scheduler.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import os
import re
import sqlite3
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path
from queue import Empty, Full, Queue
from typing import Any, NamedTuple, TypeVar

import polars as pl

from traceguard.errors import InputError, TraceguardError, native_panics
from traceguard.ingest import (
    GZIP_MAGIC,
    SQLITE_MAGIC,
    InputRecord,
    InputSpec,
    RankAssignment,
    RankFacts,
    apply_assignment,
    describe,
    gpu_processes,
    rank_parts,
    read_capture,
    resolve_ranks,
    stated_rank,
    with_rank,
    with_rank_hint,
)
from traceguard.ingest.nsys_rep import export_to_sqlite, is_nsys_rep
from traceguard.ingest.nsys_sqlite import share_cores
from traceguard.memory import (
    fewer_collections,
    polars_heap_released_every,
    release_polars_heap,
    tune_heap,
    usable_cores,
)
from traceguard.metrics.rank import RankResult, analyse_rank
from traceguard.model import GPU_OPS_SCHEMA, Capture, empty, holds_one_value

#: The environment variable naming a Dask scheduler when no ``--scheduler`` is given.
SCHEDULER_ENV = "TRACEGUARD_DASK_SCHEDULER"
LOCAL = "local"
SERIAL = "serial"
#: Addresses of a dask.distributed scheduler.
_DASK_ADDRESS = re.compile(r"^(tcp|tls|inproc|ucx|ws|wss)://\S+$")
#: How much of a Kineto file is searched for ``distributedInfo`` when planning (it precedes the events).
_KINETO_PEEK_BYTES = 1 << 20
_KINETO_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
#: Below this many bytes of input files in all, ``local`` maps in this process unless ``jobs`` is given.
LOCAL_POOL_MIN_BYTES = 64 << 20
#: Column order of the per-rank copy summary (:func:`copy_summary`).
COPY_GROUPS = ("kind", "copy_kind", "src_kind", "dst_kind")

#: (inputs done, inputs in all): called in the calling process as each input's map finishes.
RankProgress = Callable[[int, int], None]


class SchedulerError(InputError):
    """The scheduler named cannot be used (unknown form, dask not installed, unreachable)."""


#: GPU ops a sliced analysis reads at a time (:attr:`MapOptions.slice_rows`). 1 M, not 2 M: on the
#: benchmark's shapes right after another process freed its memory (bench/README.md, "Where
#: traceguard's nsys time goes") 12-15 % faster and 0.1-0.25 GB lower at the peak, with glibc's
#: own heap; the per-slice work that costs is fixed, not per op.
SLICE_ROWS = 1_000_000


#: How often Polars' freed pages are handed back while a file's NVTX table is read beside its
#: kernel sequences (:func:`traceguard.memory.polars_heap_released_every`). The per-op NVTX
#: shape: 0.1 s and 0.3 s both peak at 0.97-1.0 GB (1.03-1.06 GB without), 0.3 s with fewer
#: pages faulted in again (0.76 M against 0.93 M faults).
RELEASE_EVERY_S = 0.3


def fan_out_rows(slice_rows: int) -> int:
    """The GPU ops a read that feeds every rank of a file (:func:`_fan_out`) takes at a time:
    three quarters of a slice. That read holds one block while each rank analyses its part of
    the one before and has its part of the next queued: three blocks in flight, where a rank
    reading alone holds two (its slice and the one read ahead). On the per-op NVTX shape the
    read's level fell from 1.0-1.07 GB to 0.93-0.98 GB in the same time; half a slice held
    0.83-0.88 GB but took 0.2-1.0 s longer (bench/README.md, twentieth pass)."""
    return max(slice_rows * 3 // 4, 1)


@dataclass(frozen=True)
class MapOptions:
    """What every rank's analysis is told (the same for all inputs)."""

    step_patterns: tuple[str, ...] = ()
    step_sources: tuple[str, ...] | None = None
    small_bytes: int | None = None
    #: nsys exports of at least this many bytes are analysed in time slices (memory bounded by a
    #: slice, the same report; :mod:`traceguard.metrics.sliced`); None: :func:`sliced_above`'s default.
    sliced_above: int | None = None
    #: GPU ops per time slice of a sliced analysis.
    slice_rows: int = SLICE_ROWS


@dataclass
class MapTask:
    """One input to map: analyse it under ``assignment`` (None: only read and report its facts)."""

    index: int
    spec: InputSpec
    assignment: RankAssignment | None
    ranks_analysed: int
    options: MapOptions
    #: The caller's working directory: a relative input path is read from there (a Dask worker
    #: runs elsewhere), while the report keeps the path as given.
    base_dir: str = "."
    #: The run's only input: planned under other ranks than the file holds (several processes in
    #: one export), it confirms its own ranks at once (:func:`_replanned`) rather than being read
    #: again under them.
    only_input: bool = False


@dataclass
class MapOutcome:
    """What one input's map sends back: its record, the facts rank resolution needs, and the
    results of its ranks (empty when it was not analysed or could not be read)."""

    index: int
    record: InputRecord
    #: The rank the input states, and from where (None: unreadable).
    stated: tuple[int | None, str | None] | None = None
    #: GPU processes in the file (each becomes a rank).
    width: int = 1
    #: The ranks and the run's rank count the results were computed under.
    analysed_as: tuple[tuple[int, ...], int] | None = None
    #: False when no metric of this input read the number of ranks analysed (the capture states
    #: its world size): its results stand whatever the count.
    uses_rank_count: bool = True
    results: list[RankResult] = field(default_factory=list)
    #: Per rank: memcpys and memsets of the whole capture by kind and direction (:func:`copy_summary`).
    copies: list[pl.DataFrame] = field(default_factory=list)


@dataclass
class MappedRun:
    """The map's outcome for the whole run: input records (as the report lists them) and the
    per-rank results in rank order, with the per-rank copy summaries."""

    inputs: list[InputRecord]
    results: list[RankResult]
    copies: pl.DataFrame
    #: The inputs (by index) whose results are in ``results``: what a :data:`Keep` hook was handed
    #: last for them is what counts; anything it kept of other inputs is stale.
    used: frozenset[int] = frozenset()


#: Called in this process on each input's outcome as it arrives (and again when the input is mapped
#: again under other ranks): it may take the rows out of the results (a side output writes them)
#: and returns the outcome the reduce keeps. The streaming part of the reduce (issue 30).
Keep = Callable[[MapOutcome], MapOutcome]


def copy_summary(rank: int, capture: Any) -> pl.DataFrame:
    """Memcpys and memsets of the whole capture (not only the analysis window) by kind, copy kind
    and memory kinds: ``ops``, Σ ``bytes``, Σ ``time_ns`` (end − start); column ``rank``."""
    return copies_of(rank, capture.gpu_ops)


def copies_of(rank: int, gpu_ops: pl.DataFrame) -> pl.DataFrame:
    """:func:`copy_summary` of a frame of GPU ops (a time slice's, summed with :func:`add_copies`)."""
    ops = gpu_ops.filter(pl.col("kind").is_in(["memcpy", "memset"]))  # not graph executions
    return (
        ops.group_by(*COPY_GROUPS)
        .agg(
            pl.len().alias("ops"),
            pl.col("bytes").sum().alias("bytes"),
            (pl.col("end") - pl.col("start")).sum().alias("time_ns"),
        )
        .with_columns(pl.lit(rank).alias("rank"))
    )


def add_copies(parts: Sequence[pl.DataFrame], rank: int) -> pl.DataFrame:
    """The :func:`copies_of` summaries of a capture's time slices as one, as if of the whole."""
    if not parts:
        return copies_of(rank, empty(GPU_OPS_SCHEMA))
    summed = pl.concat(parts).group_by(*COPY_GROUPS).agg(pl.col("ops", "bytes", "time_ns").sum())
    return summed.with_columns(pl.lit(rank).alias("rank")).cast(parts[0].schema)  # type: ignore[arg-type]


#: NVTX rows from which a sliced read of a file of several processes reads the small capture
#: (mostly that table) on a thread while it reads their kernel sequences (:func:`_map_sliced`).
#: A file of one process reads its first slice meanwhile whatever the table's size
#: (:func:`_first_slice_meanwhile`).
OVERLAP_NVTX_ROWS = 1_000_000

#: The environment variable that sets :attr:`MapOptions.sliced_above` (bytes) when no option does.
SLICED_ABOVE_ENV = "TRACEGUARD_SLICED_ABOVE"


#: The default :func:`sliced_above` on a machine with 4 GiB of memory or more: exports from
#: 1 GiB on are analysed in slices, so that no default analysis peaks much above 1 GB (the
#: whole-file analysis peaks near 0.75× the export's size; the sliced one near 0.6-0.8 GB for
#: slices of :data:`SLICE_ROWS` ops, whatever the size) and, measured on 10 M kernels, no slower (bench/RESULTS.md).
SLICED_ABOVE_DEFAULT = 1 << 30


def sliced_above(options: MapOptions) -> int:
    """The size from which an nsys export is analysed in time slices: the option, else
    ``TRACEGUARD_SLICED_ABOVE``, else :data:`SLICED_ABOVE_DEFAULT` or a quarter of this
    machine's memory if less."""
    if options.sliced_above is not None:
        return options.sliced_above
    env = os.environ.get(SLICED_ABOVE_ENV)
    if env:
        return parse_size(env)
    return min(SLICED_ABOVE_DEFAULT, _memory_quarter())


def _memory_quarter() -> int:
    """A quarter of this machine's memory: what one whole-file analysis may take while leaving
    room for a pool of them."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not Linux
        return 4 << 30


def _may_read_whole(options: MapOptions, path: Path) -> bool:
    """Whether a sliced input may still be read whole when its steps must come from its kernel
    sequence: the sliced analysis then reads the file twice (traceguard.metrics.sliced), while
    the sequence alone grows with the capture anyway. Only under the default threshold (no
    option, no ``TRACEGUARD_SLICED_ABOVE``) and for an export below a quarter of memory; and
    :func:`_map_sliced` asks it only of a file of one process: the ranks of a file of several
    share one sliced read (:func:`_fan_out`), which beat the whole read on nsys-ai's two-rank
    capture scaled to 10 M kernels (19.1 s and 1.5 GB against 20.6 s and 2.9 GB)."""
    if options.sliced_above is not None or os.environ.get(SLICED_ABOVE_ENV):
        return False
    try:
        return path.stat().st_size < _memory_quarter()
    except OSError:
        return False


def _first_slice_meanwhile(task: MapTask, path: Path, several: bool) -> bool:
    """Whether a sliced input of one process reads its first slice on this thread while its small
    capture is read on another, whatever its NVTX table's size: not when its steps surely come
    from its kernel sequence (no step source before that one reads only ranges) and it may be read
    whole (:func:`_may_read_whole`), where that slice would be read for nothing. The small capture
    of the CUDA-graph shape of ``bench/RESULTS.md`` (365 k NVTX rows) took 0.33 s before the first
    slice's read began: its first pass began 0.2-0.35 s sooner this way (medians 0.97 against
    1.22 s from the map's start)."""
    from traceguard.metrics.sliced import steps_surely_from_sequence

    if several:
        return False
    return not (steps_surely_from_sequence(_rank_options(task)["step_sources"]) and _may_read_whole(task.options, path))


def parse_size(text: str) -> int:
    """Bytes from ``123``, ``512M``, ``4G``, ``1.5GB`` (powers of 1024)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        raise InputError(f"{text!r} is not a size", hint="give bytes, or a number with K, M, G or T (e.g. 4G)")
    scale = 1024 ** " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * scale)


def _sliced_source(path: Path, options: MapOptions) -> Path | None:
    """The SQLite file to analyse in time slices for this input, or None to read it whole: an
    nsys SQLite export at least :func:`sliced_above` bytes large, or the (cached) export of an
    ``.nsys-rep`` that is (a report is exported only when it is at least an eighth of the
    threshold: its export is rarely eight times its size, and a small one is exported by the read)."""
    threshold = sliced_above(options)
    try:
        if not path.is_file():  # a pipe is read once, whole
            return None
        with path.open("rb") as fh:
            head = fh.read(16)
        size = path.stat().st_size
        if head.startswith(SQLITE_MAGIC):
            return path if size >= threshold else None
        if size >= threshold // 8 and is_nsys_rep(path):
            exported = export_to_sqlite(path)
            return exported if exported.stat().st_size >= threshold else None
    except (OSError, TraceguardError):
        return None  # the whole read says what is wrong
    return None


def map_input(task: MapTask) -> MapOutcome:
    """The map step of one input (module docstring). Errors of the input become its record's
    ``error``; any other exception is a bug and propagates, a native library's panic as
    :class:`~traceguard.errors.NativePanic` (an ordinary exception, which a process pool can
    send back)."""
    tune_heap()
    with native_panics(), fewer_collections():
        return _map_input(task)


def _map_input(task: MapTask) -> MapOutcome:
    spec = task.spec
    record = InputRecord(path=str(spec.path))
    outcome = MapOutcome(task.index, record)
    path = Path(task.base_dir) / spec.path
    sliced = _sliced_source(path, task.options)
    nvtx_rows = None
    if sliced is not None:
        try:
            mapped = _map_sliced(task, sliced, outcome, report=sliced != path)
            if isinstance(mapped, MapOutcome):
                return mapped
            if sliced == path:  # the same file read whole: its NVTX rows are read already
                nvtx_rows = mapped.nvtx_rows
        except TraceguardError as exc:  # the slices are read as the analysis goes: a read error
            record.error, record.error_code = str(exc), exc.code
            return MapOutcome(task.index, record)
    with _EarlySteps(task) as early:
        try:
            capture = read_capture(
                path, shown=str(spec.path), keep_correlation=False, nvtx_rows=nvtx_rows, on_ops=early.start
            )
        except TraceguardError as exc:
            record.error, record.error_code = str(exc), exc.code
            return outcome
        describe(record, capture)
        pids = gpu_processes(capture)
        outcome.stated = stated_rank(spec, capture.info.rank_hint)
        outcome.width = max(len(pids), 1)
        outcome.uses_rank_count = capture.info.world_size is None
        task = _replanned(task, outcome)
        assignment = task.assignment
        if assignment is None or assignment.error or len(assignment.ranks) != outcome.width:
            return outcome  # planned under other ranks than the file holds: the reducer plans it again
        parts = rank_parts(capture, pids, assignment)
        for rank, part in parts:
            resolved = early.steps_of(rank) if len(parts) == 1 else None
            outcome.results.append(analyse_rank(rank, part, resolved_steps=resolved, **_rank_options(task)))
            outcome.copies.append(copy_summary(rank, part))
        outcome.analysed_as = (tuple(assignment.ranks), task.ranks_analysed)
        return outcome


class _EarlySteps:
    """The steps of a file of one rank read whole, inferred on a thread while the read joins its
    ops' launches (``read_capture``'s ``on_ops``; inference reads no launch column): on the
    10 M-kernel export, 0.3-0.5 s off ``--step-source inferred``, which reads it whole. Started
    only where the ranges do not settle the steps (then finding them is quick) and the file is
    planned as one rank; used only for the rank it was started for."""

    def __init__(self, task: MapTask) -> None:
        self.task = task
        self._pool: ThreadPoolExecutor | None = None
        self._steps: Future[Any] | None = None
        self._rank: int | None = None

    def start(self, capture: Capture) -> None:
        """Start the search (called inside the read: nothing of the analysis runs here, so a
        failure of it is raised by :meth:`steps_of`, not taken for a damaged file)."""
        assignment = self.task.assignment
        if assignment is None or assignment.error or len(assignment.ranks) != 1:
            return
        self._rank = assignment.ranks[0]
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="traceguard-steps")
        self._steps = self._pool.submit(self._search, capture, self._rank)

    def _search(self, capture: Capture, rank: int) -> Any | None:
        from traceguard.metrics.sliced import steps_from_ranges, steps_from_sequence

        options = _rank_options(self.task)
        patterns, sources = options["step_patterns"], options["step_sources"]
        if len(gpu_processes(capture)) > 1 or steps_from_ranges(capture, patterns, sources) is not None:
            return None  # several ranks, or steps the rank's analysis finds at once
        part = with_rank(capture, rank)  # what rank_parts gives a file of one process
        return steps_from_sequence(part, part.gpu_ops, patterns, sources)

    def steps_of(self, rank: int) -> Any | None:
        """The steps found early for ``rank`` (an error of that search raised here), else None
        (not searched, or left to the rank's analysis)."""
        return self._steps.result() if self._steps is not None and rank == self._rank else None

    def __enter__(self) -> _EarlySteps:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _replanned(task: MapTask, outcome: MapOutcome) -> MapTask:
    """``task`` as :func:`map_run`'s check would confirm it, when it is the run's only input and
    its read found another width than planned: the same rank resolution over the same facts
    (:func:`_confirm` of this one outcome), so its results stand and the file is read once.
    Otherwise ``task`` as it is (the reducer plans it again with every input's facts)."""
    assignment = task.assignment
    if not task.only_input or outcome.stated is None:
        return task
    if assignment is not None and not assignment.error and len(assignment.ranks) == outcome.width:
        return task
    confirmed, ranks_analysed = _confirm({task.index: outcome})
    mine = confirmed.get(task.index)
    if mine is None or mine.error:
        return task
    return replace(task, assignment=mine, ranks_analysed=ranks_analysed)


def _rank_options(task: MapTask) -> dict[str, Any]:
    """What every rank's analysis of this task is told (whole-file or sliced alike)."""
    from traceguard.metrics import small_collectives
    from traceguard.metrics.steps import STEP_SOURCES

    options = task.options
    return {
        "step_patterns": options.step_patterns,
        "step_sources": options.step_sources or STEP_SOURCES,
        "ranks_analysed": task.ranks_analysed,
        "small_bytes": options.small_bytes or small_collectives.DEFAULT_SMALL_BYTES,
    }


@dataclass
class _ReadWhole:
    """:func:`_map_sliced`'s answer for an input to read whole after all, with what its look at
    the file read of the NVTX table (the whole read does not read it again)."""

    nvtx_rows: tuple[pl.DataFrame, pl.DataFrame]


def _map_sliced(task: MapTask, path: Path, outcome: MapOutcome, *, report: bool = False) -> MapOutcome | _ReadWhole:
    """:func:`map_input` of an nsys export too large to hold: read and analysed in time slices
    (traceguard.metrics.sliced), the same outcome. ``report``: ``path`` is the export of the
    input, an ``.nsys-rep``. :class:`_ReadWhole`: read it whole after all (:func:`_may_read_whole`).

    The GPU processes (each a rank) are planned from the first slice and confirmed over every
    slice during the first rank's first pass; should they differ (a process whose GPU work starts
    later), the input is analysed again under the confirmed ones."""
    from traceguard.ingest.nsys_slices import open_sliced
    from traceguard.metrics.sliced import analyse_rank_sliced

    spec, record, options = task.spec, outcome.record, task.options
    with (
        open_sliced(path, shown=str(spec.path)) as source,
        ThreadPoolExecutor(2, "traceguard-small") as pool,
        _LaunchPasses() as launch_passes,  # stopped before the pool waits for them, on any exit
    ):
        several = source.processes_at_start() > 1
        # The first slice plans the ranks, then starts the first rank's first read (not read twice).
        # It needs nothing of the small capture, which runs on a thread meanwhile: where that read
        # is long (a range per op: 4.3 s of 47.7 M NVTX rows), and for a file of one process unless
        # it will surely be read whole (_first_slice_meanwhile); a file that is then read whole
        # wasted the first slice's read, on the core the NVTX read left idle.
        overlap = source.nvtx_rows_at_most() >= OVERLAP_NVTX_ROWS or _first_slice_meanwhile(task, path, several)
        # A file of several processes is never read whole (below): its NVTX rows need not stay.
        reading = functools.partial(source.small_capture, keep_nvtx_rows=not several)
        pending = pool.submit(reading) if overlap else None
        windows = source.op_slices(options.slice_rows)
        # A file of several ranks is never read whole. While its NVTX table is still being read,
        # its kernel sequences are read (wanted unless its ranges settle the steps: then that read
        # stops where it is and is let go) and its launch join's API passes are made; the first
        # block of the sequence read plans the ranks. Else the first slice is read meanwhile: it
        # plans the ranks and starts the first rank's first read (not read twice).
        early = _SequenceRead(source, options.slice_rows) if pending is not None and several else None
        first_read = pending is not None and early is None
        first = next(windows, None) if first_read else None
        try:
            if early is not None and pending is not None:
                busy = pending
                with polars_heap_released_every(RELEASE_EVERY_S):
                    early.read_while(lambda: not busy.done())
                    if early.read_all and not busy.done():
                        # The launch join's passes on a thread of their own, on past the NVTX
                        # read, beside the ranks' steps: on this thread they ran 0.25-0.3 s past
                        # it (the per-op NVTX shape). This thread, its sequences read, takes
                        # what is left of the NVTX table's pieces beside that read's own thread.
                        launch_passes.start(pool, source)
                        source.help_read_nvtx()
                    busy.result()
            elif pending is not None:
                source.help_read_nvtx()  # the first slice is read: this thread has nothing else to do
            small = with_rank_hint(pending.result() if pending is not None else reading())
            pending = busy = None  # the future no longer holds the capture (its ranges are let go below)
            if early is not None:
                # The NVTX table's read freed most of what it took, on its own thread: handed
                # back before the ranks' ranges are cut from the file's (traceguard.memory).
                release_polars_heap()
            needs_sequence = _needs_kernel_sequence(task, small)
        except BaseException:
            if early is not None:
                early.close()
            raise
        if early is not None and not needs_sequence:
            early.close()
            early = None
        if needs_sequence and _may_read_whole(options, path) and not several:
            windows.close()
            return _ReadWhole(source.nvtx_rows())
        source.drop_nvtx_rows()
        if report:
            small.info.format = "nsys-rep"
        describe(record, small)
        outcome.stated = stated_rank(spec, small.info.rank_hint)
        outcome.uses_rank_count = small.info.world_size is None
        started: list[Any] | None = None
        if early is not None:  # the ranks planned from the sequence read's first block
            windows.close()
            pids = gpu_processes(replace(small, gpu_ops=_census_frame(early.first_census)))
        else:
            if not first_read:
                first = next(windows, None)
            pids = gpu_processes(replace(small, gpu_ops=first)) if first is not None else []
            started = [first, windows] if first is not None else None
            del first
        # Every process's kernel sequence in one read without launches, not one read per rank.
        sequences = others = None
        if early is not None:
            if len(pids) <= 1:
                launch_passes.stop()  # the sequences may be read again (_SequenceRead.finish)
            sequences, others = early.finish(len(pids) > 1)
        elif needs_sequence:
            sequences = _kernel_sequences(source, options.slice_rows, len(pids) > 1)
        ranges_let_go = False
        for _attempt in range(2):
            outcome.width = max(len(pids), 1)
            outcome.results, outcome.copies = [], []
            task = _replanned(task, outcome)
            assignment = task.assignment
            if assignment is None or assignment.error or len(assignment.ranks) != outcome.width:
                return outcome  # planned under other ranks than the file holds: the reducer plans it again
            census: dict[int, int | None] = {}
            if ranges_let_go:  # a second attempt: the ranges the first let go read again
                small = replace(source.small_capture(keep_nvtx_rows=False), info=small.info)
            parts = list(rank_parts(small, pids, assignment))
            if len(parts) > 1:
                # Each rank holds its own ranges now: the file's are not held beside them through
                # the read (the per-op NVTX shape: 190 MB). A second attempt reads them again.
                small, ranges_let_go = replace(small, ranges=small.ranges.clear()), True
            owners = [pids[index] if len(pids) > 1 else None for index in range(len(parts))]
            # Each rank's steps from the one sequence read, which is then let go (a second
            # attempt under other processes lets each rank read its own again).
            # With each rank's steps, where the sequence read kept the copies and sets beside the
            # kernels, what pass 2 takes from pass 1 (traceguard.metrics.sliced.known_window).
            found: list[tuple[Any, Any]] = []
            for (rank, part), pid in zip(parts, owners, strict=True):
                if sequences is None:
                    found.append((None, None))
                    continue
                # What the NVTX table's read, the sequence read and the rank before freed is not
                # kept under this rank's steps (traceguard.memory: 0.2-0.3 GB each here).
                release_polars_heap()
                found.append(_sequence_steps(task, rank, part, pid, sequences, others))
            resolved = [steps for steps, _known in found]
            known = [window for _steps, window in found]
            sequences = others = found = None
            launch_passes.stop()  # the file is read again from here on
            fanned = _fan_out(task, source, parts, owners, resolved, known, census, started) if len(parts) > 1 else None
            if fanned is not None:
                started = None
                confirmed = gpu_processes(replace(small, gpu_ops=_census_frame(census)))
                if confirmed != pids:
                    pids = confirmed
                    continue
                for (rank, _part), (result, copies) in zip(parts, fanned, strict=True):
                    outcome.results.append(result)
                    outcome.copies.append(add_copies(copies, rank))
                outcome.analysed_as = (tuple(assignment.ranks), task.ranks_analysed)
                return outcome
            for index, (rank, part) in enumerate(parts):
                pid = owners[index]
                slices = _RankSlices(source, options.slice_rows, pid, rank, census if index == 0 else None)
                slices.started, started = started, None
                result = analyse_rank_sliced(
                    rank,
                    part,
                    slices,
                    on_slice=slices.add_copies,
                    resolved_steps=resolved[index],
                    known=known[index],
                    **_rank_options(task),
                )
                if index == 0:
                    confirmed = gpu_processes(replace(small, gpu_ops=_census_frame(census)))
                    if confirmed != pids:
                        pids = confirmed
                        break
                outcome.results.append(result)
                outcome.copies.append(add_copies(slices.copies, rank))
            else:
                outcome.analysed_as = (tuple(assignment.ranks), task.ranks_analysed)
                return outcome
        raise AssertionError("the GPU processes changed twice")  # pragma: no cover - the census is exact


_Item = TypeVar("_Item")


class _Packed(NamedTuple):
    """A piece of a kernel sequence held until its rank's steps are found, without the columns
    that hold one value in it (:func:`_packed`)."""

    frame: pl.DataFrame
    #: The piece's columns, in order.
    columns: tuple[str, ...]
    #: Each column left out: its value (None: every row null) and type.
    constants: dict[str, tuple[Any, pl.DataType]]


#: What :func:`traceguard.metrics.sliced.known_window` reads of a copy or set.
_OTHER_COLUMNS = ("pid", "start", "end")
#: The sequence's columns that are often one value in a process's piece: its process id, and its
#: device where the process drives one (every capture here does).
_PACKED_COLUMNS = ("pid", "device")


def _packed(frame: pl.DataFrame) -> _Packed:
    """``frame`` without those of :data:`_PACKED_COLUMNS` that hold one value in it: 8 bytes an
    op less while the sequences wait for the NVTX table (the per-op NVTX shape: 76 MB of the
    10 M kernels' 276 MB)."""
    constants: dict[str, tuple[Any, pl.DataType]] = {}
    for column in _PACKED_COLUMNS:
        if column not in frame.columns:
            continue
        values = frame[column]
        # A Python value, not a slice of the column: a slice would hold the whole column's buffer.
        if frame.height and holds_one_value(values):
            constants[column] = (values[0], values.dtype)
    return _Packed(frame.drop(list(constants)), tuple(frame.columns), constants)


def _unpacked(piece: _Packed) -> pl.DataFrame:
    """The frame :func:`_packed` was given."""
    frame, columns, constants = piece
    if not constants:
        return frame
    added = (pl.lit(value, dtype=dtype).alias(column) for column, (value, dtype) in constants.items())
    return frame.with_columns(added).select(columns)


def _kernel_sequences(source: Any, rows: int, by_pid: bool) -> dict[int | None, list[_Packed]]:
    """The ops as step inference reads them (the columns of
    :func:`traceguard.metrics.sliced.kernel_sequence` but ``rank``), from one read of the file without the
    ops' launches, per process when ``by_pid`` (else all under None): each rank's sequence is
    cut from these (:func:`_sequence_steps`) instead of each rank reading the file once more
    with its launches."""
    parts: dict[int | None, list[pl.DataFrame]] = {}
    _add_sequences(parts, _narrowed(_sequence_blocks(source, rows)), by_pid)
    return parts


def _sequence_blocks(source: Any, rows: int) -> Iterator[pl.DataFrame]:
    """The file's ops without launches, the next block read (the C reader, no GIL) while this
    one is narrowed."""
    from traceguard.metrics.sliced import prefetched

    return prefetched(source.op_slices(rows, launches=False))


def _add_sequences(parts: dict[int | None, list[_Packed]], narrowed: Iterable[pl.DataFrame], by_pid: bool) -> None:
    """Each block's kernel sequence added to ``parts``, by process when ``by_pid``."""
    for narrow in narrowed:
        if not by_pid:
            parts.setdefault(None, []).append(_packed(narrow))
            continue
        for (pid,), frame in narrow.partition_by("pid", as_dict=True).items():
            parts.setdefault(pid, []).append(_packed(frame))


def _narrowed(blocks: Iterable[pl.DataFrame]) -> Iterator[pl.DataFrame]:
    """Each block's kernel sequence without its ``rank`` column: :func:`_sequence_steps` sets
    the rank (10 M ops: 40 MB not held while the NVTX table is read)."""
    from traceguard.metrics.sliced import kernel_sequence

    for raw in blocks:
        yield kernel_sequence([raw]).drop("rank")
        del raw


class _SequenceRead:
    """:func:`_kernel_sequences`, read in two goes: as far as it gets while something else is
    read (:meth:`read_while`), then the rest (:meth:`finish`), or let go (:meth:`close`).

    Each block is split by process as it is narrowed, as :func:`_add_sequences` splits it: split
    at the end instead, every block was copied once more while the blocks were still held (the
    per-op NVTX shape's peak, +0.2 GB). The copies and sets are kept beside the sequences, their
    start and end by process (the per-op NVTX shape's 3.2 M: 51 MB), for the window of pass 2
    (:func:`_sequence_steps`)."""

    def __init__(self, source: Any, rows: int) -> None:
        self._source, self._rows = source, rows
        #: Per block, its kernel sequence by process, in block order.
        self._by_pid: list[dict[Any, _Packed]] = []
        self._blocks = _sequence_blocks(source, rows)
        #: The processes of the first block and their lowest devices (:func:`_count_processes`):
        #: what the first slice of a read with launches would plan the ranks from.
        self.first_census: dict[int, int | None] = {}
        self._first = True
        #: Per block, the copies and sets by process (pid, start, end: what
        #: :func:`traceguard.metrics.sliced.known_window` reads beside the kernel sequence);
        #: None once a graph execution was read (pass 2 then waits for pass 1).
        self._others: list[dict[Any, _Packed]] | None = []
        #: Whether every block was read (the file is not read again until :meth:`finish`).
        self.read_all = False

    def read_while(self, going_on: Callable[[], bool]) -> None:
        """Read and narrow blocks while ``going_on()`` (asked before each block is taken)."""
        while going_on():
            raw = next(self._blocks, None)
            if raw is None:
                self.read_all = True
                return
            self._take(raw)
            del raw

    def _take(self, raw: pl.DataFrame) -> None:
        if self._first:
            _count_processes(self.first_census, raw)
            self._first = False
        if self._others is not None:
            if raw.select((pl.col("kind") == "graph").any()).item():
                self._others = None
            else:
                moved = raw.filter(pl.col("kind") != "kernel").select(_OTHER_COLUMNS).partition_by("pid", as_dict=True)
                self._others.append({key: _packed(frame) for key, frame in moved.items()})
        for narrow in _narrowed([raw]):
            by_pid = narrow.partition_by("pid", as_dict=True)
            del narrow
            self._by_pid.append({key: _packed(frame) for key, frame in by_pid.items()})

    def finish(self, by_pid: bool) -> tuple[dict[int | None, list[_Packed]], dict[int | None, list[_Packed]] | None]:
        """:func:`_kernel_sequences`' answer, the rest read now, and the copies and sets by
        process likewise (None: a graph execution was read, or the sequences were read again)."""
        self.read_while(lambda: True)
        blocks, self._by_pid = self._by_pid, []
        moved, self._others = self._others, None
        if not by_pid and any(len(block) > 1 for block in blocks):
            # Planned as one process, yet a block holds several (the plan is confirmed over
            # every slice, and redone): the blocks whole are what it reads, so read them again.
            del blocks, moved
            return _kernel_sequences(self._source, self._rows, False), None
        parts: dict[int | None, list[_Packed]] = {}
        for block in _drained(blocks):
            for (pid,), frame in block.items():
                parts.setdefault(pid if by_pid else None, []).append(frame)
        others: dict[int | None, list[_Packed]] | None = None
        if moved is not None:
            others = {}
            for block in _drained(moved):
                for (pid,), frame in block.items():
                    others.setdefault(pid if by_pid else None, []).append(frame)
        return parts, others

    def close(self) -> None:
        """Stop the read and let go of what it read."""
        self._blocks.close()
        self._by_pid = []
        self._others = None


class _LaunchPasses:
    """The launch join's passes over the API tables (``SlicedNsys.prepare_launches``) made on a
    thread of their own while the file is otherwise not read: started once the kernel sequences
    are read, they go on while the NVTX read ends and the ranks' steps are found. :meth:`stop`
    before the file is read again: they stop at their next table (what is left is made when the
    read needs it) and are waited for; a context manager that stops them on exit."""

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._running: Future[None] | None = None

    def start(self, pool: ThreadPoolExecutor, source: Any) -> None:
        self._running = pool.submit(source.prepare_launches, lambda: not self._stopping.is_set())

    def stop(self) -> None:
        """Stop them and wait; their error (the file unreadable), if any, is raised here."""
        self._stopping.set()
        running, self._running = self._running, None
        if running is not None:
            running.result()

    def __enter__(self) -> _LaunchPasses:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()  # the pool waits for them next; an error then is the one raised


def _drained(frames: list[_Item]) -> Iterator[_Item]:
    """``frames`` in order, each let go by the list as it is taken."""
    frames.reverse()
    while frames:
        yield frames.pop()


def _sequence_steps(
    task: MapTask,
    rank: int,
    part: Any,
    pid: int | None,
    sequences: dict[int | None, list[_Packed]],
    others: dict[int | None, list[_Packed]] | None = None,
) -> tuple[Any, Any]:
    """The rank's steps as :func:`traceguard.metrics.sliced.analyse_rank_sliced` would find them
    from its own slices, from its process's kernel sequence (every op when the file is one rank:
    ``pid`` None), and with ``others`` (the copies and sets read beside the sequences) what pass 2
    takes from pass 1 (:func:`traceguard.metrics.sliced.known_window`; else None); its pieces are
    let go. Asked only where the file's ranges settle no steps
    (:func:`_needs_kernel_sequence`): a rank's ranges are some of the file's, so its own settle
    none either, and they are not searched again (0.06 s a rank of the per-op NVTX shape)."""
    from traceguard.metrics.sliced import kernel_sequence, known_window, steps_from_sequence

    options = _rank_options(task)
    patterns, sources = options["step_patterns"], options["step_sources"]
    ranked = pl.lit(rank, dtype=pl.Int32).alias("rank")
    # Each piece unpacked as it is taken, and let go by the list then.
    sequence = kernel_sequence(_unpacked(piece).with_columns(ranked) for piece in _drained(sequences.pop(pid, [])))
    resolved = steps_from_sequence(part, sequence, patterns, sources)
    if others is None:
        return resolved, None
    pieces = [_unpacked(piece) for piece in _drained(others.pop(pid, []))]
    moved = pl.concat(pieces) if pieces else sequence.select(_OTHER_COLUMNS).clear()
    del pieces
    return resolved, known_window(part, resolved, sequence, moved)


def _needs_kernel_sequence(task: MapTask, small: Any) -> bool:
    """Whether the input's steps must come from its kernel sequence: its ranges (all processes'
    together) settle no steps. Asked before the first slice is read, so a file read whole after
    all is not read in part first; a rank whose own ranges miss the steps another's have is
    still analysed right, sliced (it only reads its file twice)."""
    from traceguard.metrics.sliced import steps_from_ranges

    options = _rank_options(task)
    return steps_from_ranges(small, options["step_patterns"], options["step_sources"]) is None


@dataclass
class _RankSlices:
    """One rank's GPU ops of a sliced input, read afresh at each call; the first read also takes
    the file's process census (``census``: pid → lowest device) and the rank's copy summaries."""

    source: Any
    rows: int
    pid: int | None
    rank: int
    census: dict[int, int | None] | None
    copies: list[pl.DataFrame] = field(default_factory=list)
    #: [first slice, the read it came from] of a read already begun, taken by the first call.
    started: list[Any] | None = None

    def __call__(self) -> Iterator[pl.DataFrame]:
        from traceguard.metrics.sliced import iter_pid

        census, self.census = self.census, None
        started, self.started = self.started, None
        for raw in self.source.op_slices(self.rows) if started is None else _resumed(started):
            if census is not None:
                _count_processes(census, raw)
            yield from iter_pid([raw], self.pid, self.rank)

    def add_copies(self, ops: pl.DataFrame) -> None:
        self.copies.append(copies_of(self.rank, ops))


class _FedSlices:
    """One rank's GPU ops of a read that serves every rank of the file (:func:`_fan_out`): the
    slices come through a queue of one, so the read runs at the pace of the slowest rank and no
    rank holds more than a slice ahead."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.copies: list[pl.DataFrame] = []
        self._queue: Queue[Any] = Queue(maxsize=1)

    def __call__(self) -> Iterator[pl.DataFrame]:
        while (item := self._queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
            del item

    def put(self, item: Any, analysis: Future[Any]) -> None:
        """Hand on ``item`` once the rank has room; should its analysis have ended (an error),
        that error is raised here instead of waiting for a room that never comes."""
        while True:
            try:
                self._queue.put(item, timeout=_FEED_POLL_S)
                return
            except Full:
                if analysis.done():
                    analysis.result()
                    raise AssertionError("a rank's analysis ended before its slices did") from None

    def abort(self, error: BaseException) -> None:
        """End the rank's slices with ``error`` (a failed read), without waiting for room."""
        with contextlib.suppress(Empty):
            self._queue.get_nowait()
        with contextlib.suppress(Full):
            self._queue.put_nowait(error)

    def add_copies(self, ops: pl.DataFrame) -> None:
        self.copies.append(copies_of(self.rank, ops))


_END = object()
#: How often a blocked hand-on looks whether its rank's analysis ended (seconds).
_FEED_POLL_S = 0.05


def _fan_out(
    task: MapTask,
    source: Any,
    parts: list[tuple[int, Capture]],
    owners: list[int | None],
    resolved: list[Any],
    known: list[Any],
    census: dict[int, int | None],
    started: list[Any] | None,
) -> list[tuple[RankResult, list[pl.DataFrame]]] | None:
    """Every rank of a file of several processes from one read, instead of one read per rank:
    each slice is split by process and handed to its rank's analysis, which runs on a thread of
    its own; pass 2 and the assembly, where a rank's memory peaks, take turns. The read takes the
    process census. None (read nothing) when a rank's steps are not settled before its ops are
    read: its analysis would read them twice."""
    from traceguard.metrics.sliced import analyse_rank_sliced, iter_pid, steps_from_ranges

    options = _rank_options(task)
    settled = [
        steps if steps is not None else steps_from_ranges(part, options["step_patterns"], options["step_sources"])
        for steps, (_rank, part) in zip(resolved, parts, strict=True)
    ]
    if any(steps is None for steps in settled):
        return None
    feeds = [_FedSlices(rank) for rank, _part in parts]
    finishing = threading.Lock()
    release_polars_heap()  # the steps' search freed: not kept under the read (traceguard.memory)
    with ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="traceguard-rank") as pool:
        analyses = [
            pool.submit(
                analyse_rank_sliced,
                rank,
                part,
                feed,
                on_slice=feed.add_copies,
                resolved_steps=steps,
                finishing=finishing,
                read_ahead=False,  # the read runs on this thread, a slice ahead of each rank
                known=window,
                **options,
            )
            for (rank, part), feed, steps, window in zip(parts, feeds, settled, known, strict=True)
        ]
        try:
            read = source.op_slices(fan_out_rows(task.options.slice_rows)) if started is None else _resumed(started)
            for raw in read:
                _count_processes(census, raw)
                for feed, pid, analysis in zip(feeds, owners, analyses, strict=True):
                    feed.put(next(iter_pid([raw], pid, feed.rank)), analysis)
                del raw
            for feed, analysis in zip(feeds, analyses, strict=True):
                feed.put(_END, analysis)
        except BaseException as exc:
            for feed in feeds:
                feed.abort(exc)
            raise
        return [(analysis.result(), feed.copies) for analysis, feed in zip(analyses, feeds, strict=True)]


def _census_frame(census: dict[int, int | None]) -> pl.DataFrame:
    """The process census as :func:`gpu_processes` reads GPU ops: pid and (lowest) device."""
    return pl.DataFrame(
        {"pid": list(census), "device": list(census.values())}, schema={"pid": pl.Int64, "device": pl.Int64}
    )


def _resumed(started: list[Any]) -> Iterator[pl.DataFrame]:
    """The slices of a read whose first slice was taken already: ``[first, the read]``, emptied
    as it goes (the first slice is not held once handed on)."""
    read = started.pop()
    yield started.pop()
    yield from read


def _count_processes(census: dict[int, int | None], ops: pl.DataFrame) -> None:
    """Add a slice's processes with GPU work and their lowest device (:func:`gpu_processes`' rule)."""
    rows = ops.filter(pl.col("pid").is_not_null()).group_by("pid").agg(pl.col("device").min())
    for pid, device in rows.iter_rows():
        known = census.get(pid, device)
        census[pid] = device if known is None or (device is not None and device < known) else known


# -- planning ------------------------------------------------------------------------------------


def peek_rank(path: Path) -> int | None:
    """The rank a capture states, from a glance at it (no full read): the ``RANK`` an nsys export
    recorded for the profiled process, or Kineto's ``distributedInfo.rank`` near the top of the
    file. None when the glance does not tell; a plan only, checked against the full read."""
    if not path.is_file():  # a pipe (`<(zcat trace.json.gz)`) is read once, by its map
        return None
    try:
        with path.open("rb") as fh:
            head = fh.read(16)
            if head.startswith(SQLITE_MAGIC):
                return _peek_nsys_rank(path)
            fh.seek(0)
            if head.startswith(GZIP_MAGIC):
                with gzip.open(fh) as unzipped:
                    prefix = unzipped.read(_KINETO_PEEK_BYTES)
            else:
                prefix = fh.read(_KINETO_PEEK_BYTES)
    except (OSError, EOFError, ValueError, zlib.error):  # the full read says what is wrong
        return None
    match = _KINETO_RANK.search(prefix)
    return int(match.group(1)) if match else None


def _peek_nsys_rank(path: Path) -> int | None:
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error:
        return None
    try:
        rows = conn.execute(
            "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE' "
            "AND value LIKE 'RANK=%' LIMIT 1"
        ).fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    value = str(rows[0][0]).partition("=")[2].strip('"') if rows else ""
    return int(value) if value.isdigit() else None


def plan(specs: Sequence[InputSpec]) -> tuple[dict[int, RankAssignment], int]:
    """Each input's expected ranks (one process per file) and the run's expected rank count."""
    facts = []
    for index, spec in enumerate(specs):
        rank, source = stated_rank(spec, None if spec.rank is not None else peek_rank(spec.path))
        facts.append(RankFacts(index, index, spec.path, rank, source, 1))
    assignments = resolve_ranks(facts)
    return assignments, sum(len(a.ranks) for a in assignments.values())


# -- schedulers ----------------------------------------------------------------------------------


def chosen_scheduler(scheduler: str | None) -> str:
    """The scheduler to use: the one given, else ``TRACEGUARD_DASK_SCHEDULER``, else ``local``."""
    name = (scheduler or os.environ.get(SCHEDULER_ENV) or LOCAL).strip()
    if name in (LOCAL, SERIAL) or _DASK_ADDRESS.match(name):
        return name
    raise SchedulerError(
        f"unknown scheduler {name!r}",
        hint="use `local` (processes on this machine), `serial` (this process), "
        "or a Dask scheduler address such as tcp://host:8786",
    )


def default_jobs() -> int:
    """Processes of the local map: the cores this process may run on."""
    return usable_cores()


def _run_serial(tasks: Sequence[MapTask]) -> Iterator[tuple[MapTask, MapOutcome | BaseException]]:
    for task in tasks:
        yield task, map_input(task)


def map_pool(workers: int) -> ProcessPoolExecutor:
    """The local scheduler's pool: ``workers`` fresh processes (spawned: Polars' threads do not
    survive a fork), each reading with its share of the cores (:func:`nsys_sqlite.share_cores`)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    sharing = functools.partial(share_cores, workers)
    return ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=sharing)


def _run_local(tasks: Sequence[MapTask], jobs: int) -> Iterator[tuple[MapTask, MapOutcome | BaseException]]:
    """Tasks on a pool of processes. A dead worker breaks the whole pool and fails every task in it:
    those are tried again in a new pool; a task that was in two broken pools then runs alone, and
    if its pool breaks once more it is that input's error, so one input that kills its worker
    cannot take the others down."""
    losses: dict[int, int] = {}
    pending = list(tasks)
    while pending:
        suspects = [t for t in pending if losses.get(t.index, 0) >= 2]
        batch = suspects[:1] or pending
        with map_pool(min(jobs, len(batch))) as pool:
            running: dict[Future[MapOutcome], MapTask] = {pool.submit(map_input, t): t for t in batch}
            settled: set[int] = set()
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    task = running.pop(future)
                    try:
                        outcome = future.result()
                    except BrokenProcessPool as exc:
                        losses[task.index] = losses.get(task.index, 0) + 1
                        if losses[task.index] > 2:
                            settled.add(task.index)
                            yield task, exc
                        continue
                    settled.add(task.index)
                    yield task, outcome
        pending = [t for t in pending if t.index not in settled]


def _run_dask(tasks: Sequence[MapTask], address: str) -> Iterator[tuple[MapTask, MapOutcome | BaseException]]:
    try:
        from distributed import Client, as_completed
        from distributed.scheduler import KilledWorker
    except ImportError as exc:
        raise SchedulerError(
            f"the Dask scheduler {address} needs dask.distributed, which is not installed",
            hint="pip install 'traceguard[dask]', or use --scheduler local",
        ) from exc
    try:
        client = Client(address, timeout="10s", set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise SchedulerError(
            f"cannot reach the Dask scheduler at {address} ({exc})",
            hint="start it with `dask scheduler` (and workers with `dask worker ADDRESS`), or use --scheduler local",
        ) from exc
    with client:
        sharers = _threads_per_host(client)
        futures = {client.submit(_map_on_worker, task, sharers, pure=False): task for task in tasks}
        for future in as_completed(futures, loop=client.loop):
            task = futures[future]
            try:
                yield task, future.result()
            except KilledWorker as exc:
                yield task, exc
            finally:
                future.release()


def _threads_per_host(client: Any) -> dict[str, int]:
    """Per host, the Dask worker threads on it: how many maps may run there at once."""
    sharers: dict[str, int] = {}
    try:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    except TypeError:  # a distributed older than n_workers=: each read assumes it is alone
        return sharers
    for worker in workers.values():
        host = str(worker.get("host", ""))
        sharers[host] = sharers.get(host, 0) + int(worker.get("nthreads", 1))
    return sharers


def _map_on_worker(task: MapTask, sharers: dict[str, int]) -> MapOutcome:
    """:func:`map_input` on a Dask worker, its reads told how many maps share its host's cores."""
    from distributed import get_worker
    from distributed.comm.addressing import get_address_host

    with contextlib.suppress(ValueError):  # not in a worker (a synchronous client): alone
        share_cores(sharers.get(get_address_host(get_worker().address), 1))
    return map_input(task)


def _input_bytes(tasks: Sequence[MapTask]) -> int:
    total = 0
    for task in tasks:
        with contextlib.suppress(OSError):
            total += (Path(task.base_dir) / task.spec.path).stat().st_size
    return total


def _execute(
    tasks: Sequence[MapTask], scheduler: str, jobs: int | None
) -> Iterator[tuple[MapTask, MapOutcome | BaseException]]:
    if scheduler == LOCAL and jobs is None and _input_bytes(tasks) < LOCAL_POOL_MIN_BYTES:
        jobs = 1  # a process pool would not pay for its start-up
    jobs = jobs or default_jobs()
    if scheduler == SERIAL or (scheduler == LOCAL and (jobs <= 1 or len(tasks) <= 1)):
        return _run_serial(tasks)
    if scheduler == LOCAL:
        return _run_local(tasks, jobs)
    return _run_dask(tasks, scheduler)


def _lost(task: MapTask, exc: BaseException) -> MapOutcome:
    record = InputRecord(path=str(task.spec.path))
    record.error_code = "worker_lost"
    record.error = (
        f"{task.spec.path}: the process analysing this input died each time it was tried "
        f"({type(exc).__name__}); the usual cause is running out of memory"
    )
    return MapOutcome(task.index, record)


# -- the map over a run --------------------------------------------------------------------------


def map_run(
    specs: Sequence[InputSpec],
    options: MapOptions,
    *,
    scheduler: str | None = None,
    jobs: int | None = None,
    on_ranks: RankProgress | None = None,
    keep: Keep | None = None,
) -> MappedRun:
    """Map every input (module docstring) and return the confirmed records and rank results.

    ``on_ranks(done, total)`` is called as each input's map finishes (in this process); ``keep``
    (:data:`Keep`) is handed each outcome as it arrives, before the next is awaited, so the client
    holds what it returns rather than every rank's rows."""
    take = keep or (lambda outcome: outcome)
    name = chosen_scheduler(scheduler)
    assignments, expected_ranks = plan(specs)
    here = os.getcwd()
    tasks = [
        MapTask(i, spec, assignments.get(i), expected_ranks, options, here, only_input=len(specs) == 1)
        for i, spec in enumerate(specs)
    ]
    outcomes: dict[int, MapOutcome] = {}
    total = len(tasks)
    for task, result in _execute(tasks, name, jobs):
        outcomes[task.index] = take(_lost(task, result) if isinstance(result, BaseException) else result)
        if on_ranks:
            on_ranks(len(outcomes), total)

    # Check the plan against what the reads found; inputs analysed under other ranks go again.
    for _ in range(3):
        confirmed, ranks_analysed = _confirm(outcomes)
        again = [
            MapTask(index, specs[index], assignment, ranks_analysed, options, here)
            for index, assignment in confirmed.items()
            if not assignment.error and not _stands(outcomes[index], assignment, ranks_analysed)
        ]
        if not again:
            break
        for task, result in _execute(again, name, jobs):
            outcomes[task.index] = take(_lost(task, result) if isinstance(result, BaseException) else result)
    else:  # pragma: no cover - a plan that does not settle is a bug in resolve_ranks
        raise RuntimeError("rank resolution did not settle")

    records: list[InputRecord] = []
    results: list[RankResult] = []
    copies: list[pl.DataFrame] = []
    used: set[int] = set()
    for index in range(len(specs)):
        outcome = outcomes[index]
        record = outcome.record
        assignment = confirmed.get(index)
        if assignment is not None:
            apply_assignment(record, assignment)
            if not assignment.error:
                results.extend(outcome.results)
                copies.extend(outcome.copies)
                used.add(index)
        records.append(record)
    results.sort(key=lambda r: r.rank)
    return MappedRun(records, results, _concat_copies(copies), frozenset(used))


def _confirm(outcomes: dict[int, MapOutcome]) -> tuple[dict[int, RankAssignment], int]:
    facts: list[RankFacts] = []
    for index in sorted(outcomes):
        outcome = outcomes[index]
        if outcome.stated is None:
            continue
        rank, source = outcome.stated
        facts.append(RankFacts(index, len(facts), Path(outcome.record.path), rank, source, outcome.width))
    confirmed = resolve_ranks(facts)
    return confirmed, sum(len(a.ranks) for a in confirmed.values())


def _stands(outcome: MapOutcome, assignment: RankAssignment, ranks_analysed: int) -> bool:
    """Whether the input's results were computed under the confirmed ranks (and rank count, when
    a metric of it read the count)."""
    if outcome.analysed_as is None:
        return False
    ranks, count = outcome.analysed_as
    return ranks == tuple(assignment.ranks) and (count == ranks_analysed or not outcome.uses_rank_count)


def _concat_copies(parts: Iterable[pl.DataFrame]) -> pl.DataFrame:
    """The ranks' copy summaries as one frame (formats may type a column differently: relaxed)."""
    frames = [p for p in parts if p.height]
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()
