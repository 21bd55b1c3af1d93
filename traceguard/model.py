"""The normalized event model every ingester produces and every metric reads.

Whatever the source (nsys SQLite of any schema generation, Kineto JSON), a capture becomes a
:class:`Capture`: a few Polars frames with the fixed schemas below plus :class:`CaptureInfo`.
Times are int64 nanoseconds on the capture's own clock. Kernel and API names are interned:
frames carry ``name_id`` and ``Capture.strings`` maps ids to text (a 10-million-kernel capture
has a few thousand distinct names, so rows stay narrow). Ids are as narrow as their values allow
(pids and tids int32: Linux keeps them below 2^22; name ids int32), which counts at 10 M rows.

``rank`` is null when a reader returns a capture; :mod:`traceguard.ingest` fills it in when it
resolves the run's ranks (DESIGN.md, "Ranks").
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceguard.errors import InputError
from traceguard.memory import usable_cores

try:  # the optional C extension (setup.py); the NumPy searches below otherwise
    from traceguard import _keys as _native_keys
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _native_keys = None

#: Copy directions, indexed by nsys's ``ENUM_CUDA_MEMCPY_OPER`` codes (identical in every export
#: that has the table, and the documented constants for 2022.x exports that lack it).
COPY_KINDS: tuple[str, ...] = (
    "unknown",
    "HtoD",
    "DtoH",
    "HtoA",
    "AtoH",
    "AtoA",
    "AtoD",
    "DtoA",
    "DtoD",
    "HtoH",
    "PtoP",
    "unified_HtoD",
    "unified_DtoH",
    "unified_DtoD",
)
#: Memory kinds, indexed by nsys's ``ENUM_CUDA_MEM_KIND`` codes (not CUPTI's numbering).
MEM_KINDS: tuple[str, ...] = (
    "pageable",
    "pinned",
    "device",
    "array",
    "managed",
    "device_static",
    "managed_static",
    "unknown",
)
#: ``graph``: one execution of a CUDA graph as a whole (nsys ``--cuda-graph-trace=graph``, the
#: default): a GPU interval launched by a ``cudaGraphLaunch`` whose kernels, copies and collectives
#: the capture does not show (traceguard.metrics.graphs). Appended last: the codes of the other
#: kinds are unchanged.
OP_KINDS: tuple[str, ...] = ("kernel", "memcpy", "memset", "graph")

CopyKind = pl.Enum(list(COPY_KINDS))
MemKind = pl.Enum(list(MEM_KINDS))
OpKind = pl.Enum(list(OP_KINDS))

#: Kernels, memcpys, memsets and graph executions. ``bytes`` is null for kernels and graphs; ``copy_kind``/``src_kind``/
#: ``dst_kind`` only for memcpys. ``msg_bytes``/``group_size`` are the collective's message size
#: (nccl-tests convention: the larger of input and output buffers) and communicator size when the
#: source records them (Kineto args, NCCL NVTX payloads), else null. ``peer`` is the other rank of a
#: point-to-point op (send/recv) when the source names it (Kineto ``Dst Rank``/``Src Rank``); the
#: nsys reader leaves it null and the metrics take it from NCCL's ranges (``payload_peer``).
GPU_OPS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "pid": pl.Int32(),
    "device": pl.Int32(),
    "stream": pl.Int64(),
    "kind": OpKind,
    "start": pl.Int64(),
    "end": pl.Int64(),
    "name_id": pl.Int32(),
    "correlation_id": pl.Int64(),
    "bytes": pl.Int64(),
    "copy_kind": CopyKind,
    "src_kind": MemKind,
    "dst_kind": MemKind,
    "msg_bytes": pl.Int64(),
    "group_size": pl.Int32(),
    "peer": pl.Int32(),
}

#: Optional columns of ``gpu_ops``: the op's launching API call (start, thread, name), null when
#: no call matched. A reader that joins launches itself (the nsys reader with
#: ``launches_only=True``) appends them after :data:`GPU_OPS_SCHEMA`'s columns and may then leave
#: ``api_calls`` empty; without them the metrics join ``api_calls`` (:func:`join_launches`).
LAUNCH_SCHEMA: dict[str, pl.DataType] = {
    "launch_start": pl.Int64(),
    "launch_tid": pl.Int32(),
    "launch_name_id": pl.Int32(),
}

#: CUDA runtime/driver API calls (the launches GPU ops are joined to on ``correlation_id``).
API_CALLS_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "pid": pl.Int32(),
    "tid": pl.Int32(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "name_id": pl.Int32(),
    "correlation_id": pl.Int64(),
}

#: NVTX push/pop and start/end ranges, or Kineto user annotations and ``ProfilerStep#N``.
#: ``depth``/``parent`` describe nesting among ranges of the same (pid, tid); ``domain`` is null
#: for the default domain. ``payload_bytes`` is an NCCL range's message size when recorded (or, in
#: Kineto, the input size of PyTorch's ``nccl:<op>`` annotation of a call whose input is the message);
#: ``payload_peer`` the "Peer rank" of an NCCL ``ncclSend``/``ncclRecv`` range (its rank in the
#: communicator) when the export carries NCCL's NVTX payloads (``--include-blobs=true``).
RANGES_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "pid": pl.Int32(),
    "tid": pl.Int32(),
    "range_id": pl.Int64(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "name": pl.String(),
    "domain": pl.String(),
    "depth": pl.Int32(),
    "parent": pl.Int64(),
    "payload_bytes": pl.Int64(),
    "payload_peer": pl.Int32(),
}

#: NVTX ranges counted but not kept, per thread: PyTorch's per-op ranges, ``aten::`` and other
#: operators' (:data:`traceguard.ingest.nsys_sqlite.OP_RANGE_PREFIX`; docs/steps.md, "Per-op ranges").
FOLDED_RANGES_SCHEMA: dict[str, pl.DataType] = {"pid": pl.Int32(), "tid": pl.Int32(), "ranges": pl.Int64()}

#: GPUs the capture describes (a rank's nsys file lists every GPU of its node).
DEVICES_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "device": pl.Int32(),
    "name": pl.String(),
    "bus_id": pl.String(),
    "sm_count": pl.Int32(),
}

PROCESSES_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "pid": pl.Int32(),
    "name": pl.String(),
}

STRINGS_SCHEMA: dict[str, pl.DataType] = {"id": pl.Int32(), "value": pl.String()}

#: The link counters nsys samples with ``--gpu-metrics-devices`` (traceguard.ingest.gpu_metrics),
#: one row per sample time and GPU, reduced to a small normalized set: each value is a whole
#: percentage of the counter's peak (nsys's ``[Throughput %]``, recorded as integers), null when
#: the GPU's metric set lacks it. One byte each: a 10 kHz capture holds 10 k rows a second.
#: ``device`` is the CUDA device the sample belongs to (``TARGET_INFO_GPU.cuDevice``); ``time`` the
#: sample's time on the capture's clock (ns), the end of the interval it averages.
LINK_METRICS: tuple[str, ...] = (
    "pcie_rx_pct",
    "pcie_tx_pct",
    "nvlink_rx_pct",
    "nvlink_tx_pct",
    "sm_active_pct",
    "dram_bw_pct",
)
LINK_SAMPLES_SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int32(),
    "time": pl.Int64(),
    **{name: pl.UInt8() for name in LINK_METRICS},
}


@dataclass
class CaptureInfo:
    """Facts about one capture file: where it came from and what it could record."""

    path: str
    format: str  # "nsys-sqlite" | "nsys-rep" | "kineto"
    tool: str  # "nsys" | "torch.profiler"
    tool_version: str | None = None
    schema_version: str | None = None
    host: str | None = None
    #: The rank the file itself states (Kineto ``distributedInfo.rank``), if any.
    rank_hint: int | None = None
    world_size: int | None = None
    nccl_version: str | None = None
    #: NVTX domains the capture saw created (nsys eventType 75); a domain with no ranges at all
    #: is the signature of an NVTX library nsys cannot read (see NSYS.md).
    nvtx_domains: list[str] = field(default_factory=list)
    #: Which event families the source could hold at all (absent tables mean "not available").
    has_gpu_trace: bool = True
    has_api_trace: bool = True
    has_ranges: bool = True
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: Wall-clock time (ns since the Unix epoch) of the capture's time 0, so that ranks can be put
    #: on one clock: nsys ``TARGET_INFO_SESSION_START_TIME.utcEpochNs`` (event times count from the
    #: session start), Kineto ``baseTimeNanoseconds`` (``ts`` counts from it). None when the file
    #: does not say; ``clock_source`` names where it came from.
    clock_base_ns: int | None = None
    clock_source: str | None = None
    #: What the capture says of GPU metrics (traceguard.ingest.gpu_metrics.GpuMetricsInfo as a
    #: dict: source table, raw metric names per normalized one, GPUs, rate), or None with
    #: ``gpu_metrics_reason`` saying why there are none.
    gpu_metrics: dict[str, Any] | None = None
    gpu_metrics_reason: str | None = None


@dataclass
class Capture:
    """One input file, normalized."""

    info: CaptureInfo
    gpu_ops: pl.DataFrame
    api_calls: pl.DataFrame
    ranges: pl.DataFrame
    devices: pl.DataFrame
    processes: pl.DataFrame
    strings: pl.DataFrame
    #: nsys GPU metrics samples (:data:`LINK_SAMPLES_SCHEMA`); empty when the capture has none.
    link_samples: pl.DataFrame = field(default_factory=lambda: empty(LINK_SAMPLES_SCHEMA))
    #: Ranges counted, not kept (:data:`FOLDED_RANGES_SCHEMA`): PyTorch's per-op ``aten::`` ranges.
    folded_ranges: pl.DataFrame = field(default_factory=lambda: empty(FOLDED_RANGES_SCHEMA))
    #: A read of the samples still running on another thread (a Future of (samples, info dict,
    #: reason)): the sliced reader starts it beside the op slices; :meth:`resolve_links` waits.
    pending_links: Any = None

    def resolve_links(self) -> None:
        """Wait for a pending read of the link samples and take its result (idempotent)."""
        if self.pending_links is None:
            return
        samples, info, reason = self.pending_links.result()
        self.link_samples = samples
        self.info.gpu_metrics = info
        self.info.gpu_metrics_reason = reason or None
        self.pending_links = None

    def name_of(self) -> dict[int, str]:
        """Id → text for the (few thousand) interned names."""
        return dict(zip(self.strings["id"].to_list(), self.strings["value"].to_list(), strict=True))


def conform(frame: pl.DataFrame, schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """Return ``frame`` with exactly ``schema``'s columns, in order, cast; missing ones null.

    Every ingester ends with this, so a metric can rely on names and dtypes whatever the source.
    """
    columns = []
    for name, dtype in schema.items():
        if name in frame.columns:
            columns.append(pl.col(name).cast(dtype))
        else:
            columns.append(pl.lit(None, dtype=dtype).alias(name))
    if not frame.width:
        return pl.DataFrame(schema=dict(schema))
    try:
        return frame.select(columns)
    except pl.exceptions.InvalidOperationError as exc:  # a value the column's type cannot hold
        reason = str(exc).split("\n", 1)[0]
        raise InputError(f"a value is out of range for its column ({reason})") from exc


def add_columns(frame: pl.DataFrame, columns: Iterable[pl.Series]) -> pl.DataFrame:
    """``frame.with_columns(columns)``, each new column first cut to the frame's chunk layout.

    Why: a column chunked differently from the others makes Polars rechunk the whole frame at
    its next ``with_columns`` or filter — a full copy, ~1 GB at 10 M GPU ops. Slices are views,
    so cutting costs nothing; the frame keeps one layout for the whole analysis.
    """
    lengths = _chunk_lengths(frame)
    return frame.with_columns(_cut(column, lengths) for column in columns)


def _chunk_lengths(frame: pl.DataFrame) -> list[int]:
    """The chunk layout of ``frame``'s first materialized column (constant columns have none)."""
    for name in frame.columns:
        lengths = frame.get_column(name).chunk_lengths()
        if len(lengths) > 1:
            return lengths
    return []


def _cut(column: pl.Series, lengths: list[int]) -> pl.Series:
    if len(lengths) <= 1 or column.chunk_lengths() == lengths or column.len() != sum(lengths):
        return column
    parts, offset = [], 0
    for length in lengths:
        parts.append(column.slice(offset, length))
        offset += length
    return pl.concat(parts, rechunk=False)


def holds_one_value(values: pl.Series) -> bool:
    """Whether ``values`` holds one value (all null counts as one; so does no value at all), told
    from its null count, minimum and maximum rather than by hashing it: a rank's 5 M kernels'
    group-by took 0.06 s and 0.09 GB more."""
    nulls = values.null_count()
    return nulls == values.len() or (nulls == 0 and values.min() == values.max())


def empty(schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=dict(schema))


def nest_ranges(ranges: pl.DataFrame) -> pl.DataFrame:
    """Fill ``depth`` and ``parent`` for ranges nested per (pid, tid).

    Push/pop ranges nest properly on their thread, so a range's depth is the number of earlier
    ranges (in start-ascending, end-descending order) still open at its start. Per thread that is
    ``position - #(ends <= start)``: one sort and one binary search, no per-event Python. The
    parent is the latest earlier range one level up. Start/end ranges may overlap without
    nesting; for them the same rule gives the number of ranges open at the start.
    """
    return nest_taken([ranges])


def nest_taken(holder: list[pl.DataFrame]) -> pl.DataFrame:
    """:func:`nest_ranges` of the one frame in ``holder``, which it takes out: where the caller
    holds no other reference, the frame is let go once sorted, not held beside its sorted copy
    (2.6 M ranges of the per-op NVTX shape: 0.16 GB off the peak of their build)."""
    ranges = holder.pop()
    if ranges.height == 0:
        return ranges
    ordered = ranges.sort(["pid", "tid", "start", "end"], descending=[False, False, False, True])
    del ranges
    pid = ordered["pid"].to_numpy()
    tid = ordered["tid"].to_numpy()
    start = ordered["start"].to_numpy()
    end = ordered["end"].to_numpy()
    depth = np.zeros(ordered.height, dtype=np.int32)
    boundary = np.flatnonzero((np.diff(pid) != 0) | (np.diff(tid) != 0)) + 1
    del pid, tid
    bounds = np.concatenate(([0], boundary, [ordered.height]))
    for lo, hi in itertools.pairwise(bounds):  # one iteration per thread
        ends = np.sort(end[lo:hi])
        closed = np.searchsorted(ends, start[lo:hi], side="right")
        depth[lo:hi] = np.arange(hi - lo) - closed
        del ends, closed
    del start, end
    np.maximum(depth, 0, out=depth)
    ordered = ordered.with_columns(pl.Series("depth", depth, dtype=pl.Int32))
    if not any(ordered[c].null_count() for c in ("pid", "tid", "range_id")):
        thread = np.zeros(ordered.height, dtype=np.int32)
        thread[boundary] = 1
        np.cumsum(thread, out=thread)
        return ordered.with_columns(_parents(depth, thread, ordered["range_id"]))
    return ordered.with_columns(_parents_by_levels(int(depth.max())).alias("parent"))


def _parents(depth: np.ndarray, thread: np.ndarray, range_id: pl.Series) -> pl.Series:
    """Per range (in nesting order, ``thread`` its thread's code), the ``range_id`` of the latest
    earlier range of its thread one level up; null at level 0 or when there is none. The rule of
    :func:`_parents_by_levels`, by a binary search per level over the row positions grouped by
    depth: O(n log n) in all, where the expression is O(levels × n) (seconds at 4.8 M per-op
    ``emit_nvtx`` ranges)."""
    rows = np.argsort(depth, kind="stable")  # by depth, each level's rows in order
    first = np.concatenate(([0], np.cumsum(np.bincount(depth))))
    ids = range_id.to_numpy()
    parent = np.full(depth.size, -1, dtype=np.int64)
    for level in range(1, first.size - 1):
        above, here = rows[first[level - 1] : first[level]], rows[first[level] : first[level + 1]]
        if above.size == 0:
            continue
        before = np.searchsorted(above, here)  # rows one level up earlier in the order
        latest = above[np.maximum(before - 1, 0)]
        found = (before > 0) & (thread[latest] == thread[here])
        parent[here[found]] = ids[latest[found]]
    series = pl.Series("parent", parent)
    return series.set(series < 0, None).cast(pl.Int64)


def _parents_by_levels(max_depth: int) -> pl.Expr:
    """The parent rule as one expression (a forward fill per level over each thread): used where
    a key is null, which the binary search does not group as ``over`` does."""
    parent = pl.lit(None, dtype=pl.Int64)
    for level in range(1, max_depth + 1):
        last_at_level_above = (
            pl.when(pl.col("depth") == level - 1).then(pl.col("range_id")).forward_fill().over(["pid", "tid"])
        )
        parent = pl.when(pl.col("depth") == level).then(last_at_level_above).otherwise(parent)
    return parent


def intern(names: pl.Series) -> tuple[pl.Series, pl.DataFrame]:
    """Intern a column of names: returns (``name_id`` column, ``strings`` frame), vectorized.

    For readers that see names as text (Kineto); ids are dense, in first-seen order.
    """
    names = names.cast(pl.String).fill_null("")
    uniques = names.unique(maintain_order=True)
    strings = pl.DataFrame(
        {"id": pl.int_range(uniques.len(), eager=True, dtype=pl.Int32), "value": uniques},
        schema=STRINGS_SCHEMA,
    )
    ids = (
        names.to_frame("value")
        .join(strings, on="value", how="left", maintain_order="left")
        .get_column("id")
        .alias("name_id")
    )
    return ids, strings


def launch_rows(gpu_ops: pl.DataFrame, api_calls: pl.DataFrame) -> pl.Series:
    """Per GPU op, the row of ``api_calls`` that launched it (null when none): the first call,
    in frame order, with the op's (pid, correlation id). Null keys match nothing.

    Where both frames' keys pack into one int64 (:func:`_key_packing`: the spans of their pids
    and of their correlation ids fit 62 bits together, as nsys's 24-bit pids and CUPTI's 32-bit
    ids always do) they are matched by a binary search into the calls' packed keys in a stable
    order (calls come nearly sorted by correlation id, so that sort is close to a linear pass);
    otherwise a two-column join. Only keys and row numbers are handled; callers gather what they
    need. The row numbers are Polars' index type (UInt32) where they fit it, else Int64.
    """
    n = gpu_ops.height
    out = pl.repeat(None, n, dtype=pl.Int64, eager=True).alias("_launch_row")
    if n == 0 or api_calls.height == 0:
        return out
    packing = _key_packing(gpu_ops, api_calls)
    if packing is not None:
        return _launch_rows_packed(gpu_ops, api_calls, packing)
    keys = ["pid", "correlation_id"]
    not_null = pl.all_horizontal([pl.col(k).is_not_null() for k in keys])
    left = gpu_ops.lazy().select(keys).with_row_index("_row").filter(not_null)
    right = api_calls.lazy().select(keys).with_row_index("_call").filter(not_null)
    right = right.group_by(keys).agg(pl.col("_call").min())  # the first call of a repeated key
    matched = left.join(right, on=keys, how="inner").select("_row", "_call").collect()
    if matched.height:
        out = out.scatter(matched["_row"], matched["_call"].cast(pl.Int64))
    return out


#: Ops matched per NumPy pass in :func:`launch_rows` (bounds the temporaries).
_JOIN_CHUNK = 1 << 21


@dataclass(frozen=True)
class KeyPacking:
    """(pid, correlation id) as one int64 that orders as the pair: ``(pid - pid_low) <<
    corr_bits | (correlation id - corr_low)`` (:func:`_key_packing`)."""

    pid_low: int
    corr_low: int
    corr_bits: int


#: Bits a packed key may use: keys stay at least 0, so -1 (a null key) matches none.
_KEY_BITS = 62


def _key_packing(*frames: pl.DataFrame) -> KeyPacking | None:
    """The packing of every (pid, correlation id) of ``frames`` (nulls aside) into one int64,
    or None when the spans of their pids and of their correlation ids need more than
    :data:`_KEY_BITS` bits together (then they are joined by two columns). Offsets rather than
    fixed 32-bit fields: CUPTI's ids fit 32 bits, but those of a merged or scaled export (the
    benchmark's per-op NVTX shape: 6.6e9) may not, while their span still fits."""
    spans: dict[str, tuple[int, int]] = {}  # column -> (lowest, highest) over every frame
    for frame in frames:
        for column in ("pid", "correlation_id"):
            low, high = frame.select(pl.col(column).min().alias("low"), pl.col(column).max().alias("high")).row(0)
            if low is not None:
                known = spans.get(column, (low, high))
                spans[column] = (min(known[0], low), max(known[1], high))
    pid_low, pid_high = spans.get("pid", (0, 0))
    corr_low, corr_high = spans.get("correlation_id", (0, 0))
    corr_bits = int(corr_high - corr_low).bit_length()
    if int(pid_high - pid_low).bit_length() + corr_bits > _KEY_BITS:
        return None
    return KeyPacking(int(pid_low), int(corr_low), corr_bits)


def _packable(frame: pl.DataFrame) -> bool:
    """Whether ``frame``'s own (pid, correlation id) pack into one int64 (:func:`_key_packing`)."""
    return _key_packing(frame) is not None


def _packed_key(
    frame: pl.DataFrame, packing: KeyPacking, lo: int = 0, hi: int | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The packed (pid, correlation id) of rows ``lo:hi`` (:class:`KeyPacking`), and where
    either is null (None: nowhere)."""
    part = frame.slice(lo, (frame.height if hi is None else hi) - lo)
    pids, ids = part["pid"], part["correlation_id"]
    if not pids.null_count() and not ids.null_count() and pids.dtype.is_integer() and ids.dtype.is_integer():
        # NumPy on the calling thread: a Polars expression here queued behind the ranks'
        # analyses on its pool (the launch join of the per-op NVTX shape's read thread).
        key = pids.to_numpy().astype(np.int64)
        key -= packing.pid_low
        key *= 1 << packing.corr_bits
        key += ids.to_numpy()
        key -= packing.corr_low
        return key, None
    key = part.select(
        (
            (pl.col("pid").cast(pl.Int64) - packing.pid_low) * (1 << packing.corr_bits)
            + (pl.col("correlation_id").cast(pl.Int64) - packing.corr_low)
        ).alias("k")
    ).to_series()
    nulls = key.is_null()
    if nulls.any():
        return key.fill_null(-1).to_numpy(), nulls.to_numpy()
    return key.to_numpy(), None


def _whole_packed_key(frame: pl.DataFrame, packing: KeyPacking) -> tuple[np.ndarray, np.ndarray | None]:
    """:func:`_packed_key` of every row, built a slice at a time into one array (the key of a
    many-chunk frame as one expression would exist twice: its chunks and their joined copy)."""
    n = frame.height
    if n <= _JOIN_CHUNK:
        return _packed_key(frame, packing)
    key = np.empty(n, dtype=np.int64)
    nulls: np.ndarray | None = None
    for lo in range(0, n, _JOIN_CHUNK):
        hi = min(lo + _JOIN_CHUNK, n)
        part, part_nulls = _packed_key(frame, packing, lo, hi)
        key[lo:hi] = part
        if part_nulls is not None:
            if nulls is None:
                nulls = np.zeros(n, dtype=bool)
            nulls[lo:hi] = part_nulls
    return key, nulls


def _launch_rows_packed(gpu_ops: pl.DataFrame, api_calls: pl.DataFrame, packing: KeyPacking) -> pl.Series:
    calls, call_nulls = _whole_packed_key(api_calls, packing)
    rows = None if call_nulls is None else np.flatnonzero(~call_nulls)
    if rows is not None:
        calls = calls[rows]
    order = None
    if calls.size > 1 and not bool(np.all(calls[1:] >= calls[:-1])):  # nsys: already sorted
        order = np.argsort(calls, kind="stable")  # equal keys keep frame order: first comes first
        calls = calls[order]
    n = gpu_ops.height
    if calls.size == 0:  # no launch call has a key: no op has a launch
        return pl.Series("_launch_row", [None] * n, dtype=pl.Int64)
    # Row numbers in Polars' own index type when they fit (what a gather takes without a
    # converted copy; half the size of int64 at 10 M ops).
    narrow = api_calls.height < (1 << 32) and pl.get_index_type() == pl.UInt32
    found = np.empty(n, dtype=np.uint32 if narrow else np.int64)
    missed = np.zeros(n, dtype=bool)

    def chunk(lo: int) -> None:  # a chunk of ops, to bound the temporaries
        hi = min(lo + _JOIN_CHUNK, n)
        ops, op_nulls = _packed_key(gpu_ops, packing, lo, hi)
        at, hit = lower_bounds(calls, ops, packing.corr_bits)
        if op_nulls is not None:
            hit &= ~op_nulls
        if order is not None:
            at = order[at]
        found[lo:hi] = at if rows is None else rows[at]
        np.logical_not(hit, out=missed[lo:hi])

    in_threads(chunk, range(0, n, _JOIN_CHUNK))
    index = pl.Series("_launch_row", found, dtype=pl.UInt32 if narrow else pl.Int64)
    return index.set(pl.Series(missed), None) if bool(missed.any()) else index


def lower_bounds(sorted_keys: np.ndarray, keys: np.ndarray, shift: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per key, ``np.searchsorted(sorted_keys, keys, side="left")`` clipped to the last sorted
    key, and whether the key is there (``sorted_keys`` not empty; ``shift``: the bit where a
    packed key's process starts, :class:`KeyPacking`). In C where built (``_keys.c``: each key
    searched from its process's last answer, galloping: 2.9 ms a block of the per-op NVTX shape,
    0.9 M ops of two processes over 4 M calls, against 53.6 ms); else :func:`_search_runs` and a
    gather."""
    if _native_keys is not None:
        sorted_keys = np.ascontiguousarray(sorted_keys, dtype=np.int64)
        keys = np.ascontiguousarray(keys, dtype=np.int64)
        at = np.empty(keys.size, dtype=np.int64)
        hit = np.empty(keys.size, dtype=np.bool_)
        _native_keys.lower_bounds(sorted_keys, keys, -1 if shift is None else shift, at, hit.view(np.uint8))
        return at, hit
    return python_lower_bounds(sorted_keys, keys, shift)


def python_lower_bounds(
    sorted_keys: np.ndarray, keys: np.ndarray, shift: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`lower_bounds` without the extension."""
    at = _search_runs(sorted_keys, keys, shift=shift)
    np.minimum(at, len(sorted_keys) - 1, out=at)
    return at, sorted_keys[at] == keys


def _search_runs(sorted_keys: np.ndarray, keys: np.ndarray, shift: int | None = None) -> np.ndarray:
    """``np.searchsorted(sorted_keys, keys, side="left")``, searching each run of equal
    consecutive keys once where runs are long: the kernels a CUDA graph launch ran share its
    correlation id (the CUDA-graph shape: 19 ms a million ops by one search each, 4 ms by run).
    Where most keys differ from the one before (a launch per kernel), one search each
    (:func:`_search_each`; ``shift``: the keys' low bits below the process, as packed)."""
    if keys.size < 2:
        return np.searchsorted(sorted_keys, keys, side="left")
    heads = np.flatnonzero(keys[1:] != keys[:-1])
    if heads.size * 4 > keys.size:
        return _search_each(sorted_keys, keys, shift)
    starts = np.empty(heads.size + 1, dtype=np.int64)
    starts[0] = 0
    np.add(heads, 1, out=starts[1:])
    found = np.searchsorted(sorted_keys, keys[starts], side="left")
    return np.repeat(found, np.diff(starts, append=keys.size))


#: Keys out of order more often than one in this many are searched in sorted order (:func:`_search_each`).
_UNORDERED_KEYS = 16
#: Up to how many processes :func:`_search_by_process` searches one at a time.
_PROCESSES_SEARCHED = 16


def _search_each(sorted_keys: np.ndarray, keys: np.ndarray, shift: int | None = None) -> np.ndarray:
    """``np.searchsorted(sorted_keys, keys, side="left")``, one search a key. Keys much out of
    order (two processes' launches interleaved in a slice) are searched a process at a time
    where ``shift`` says where the process starts in a key and each process's keys are in
    order (:func:`_search_by_process`), else in their sorted order, the answers put back: each
    search then starts near the last one's answer, where it ends (the per-op NVTX shape's
    blocks: 35 -> 25 ms a million ops; a million keys of two processes interleaved at random:
    58 ms sorted, 27 ms by process)."""
    if np.count_nonzero(keys[1:] < keys[:-1]) * _UNORDERED_KEYS <= keys.size:
        return np.searchsorted(sorted_keys, keys, side="left")
    if shift is not None and (by_process := _search_by_process(sorted_keys, keys, shift)) is not None:
        return by_process
    order = np.argsort(keys, kind="stable")
    found = np.empty(keys.size, dtype=np.intp)
    found[order] = np.searchsorted(sorted_keys, keys[order], side="left")
    return found


def _search_by_process(sorted_keys: np.ndarray, keys: np.ndarray, shift: int) -> np.ndarray | None:
    """:func:`_search_each` of keys whose bits from ``shift`` up name a process (a null key,
    -1, is one more), a process's keys at a time where each is in order as a whole: no sort.
    None where there are more than :data:`_PROCESSES_SEARCHED` or one is much out of order."""
    processes = keys >> shift
    found = np.empty(keys.size, dtype=np.intp)
    left = np.ones(keys.size, dtype=bool)
    for _ in range(_PROCESSES_SEARCHED):
        at = int(np.argmax(left))  # the first key not yet searched
        if not left[at]:
            return found
        rows = np.flatnonzero(left & (processes == processes[at]))
        mine = keys[rows]
        if np.count_nonzero(mine[1:] < mine[:-1]) * _UNORDERED_KEYS > mine.size:
            return None
        found[rows] = np.searchsorted(sorted_keys, mine, side="left")
        left[rows] = False
    return None if left.any() else found


def gather_launches(api_calls: pl.DataFrame, rows: pl.Series) -> list[pl.Series]:
    """The :data:`LAUNCH_SCHEMA` columns for ``rows`` of ``api_calls`` (null rows → null)."""
    if api_calls.height == 0:
        return [pl.repeat(None, rows.len(), dtype=d, eager=True).alias(c) for c, d in LAUNCH_SCHEMA.items()]
    taken = api_calls.select(
        pl.col("start").gather(rows).cast(pl.Int64).alias("launch_start"),
        pl.col("tid").gather(rows).cast(pl.Int32).alias("launch_tid"),
        pl.col("name_id").gather(rows).cast(pl.Int32).alias("launch_name_id"),
    )
    return taken.get_columns()


def join_launches(gpu_ops: pl.DataFrame, api_calls: pl.DataFrame) -> pl.DataFrame:
    """``gpu_ops`` with the :data:`LAUNCH_SCHEMA` columns from ``api_calls`` (replacing any)."""
    ops = gpu_ops.drop([c for c in LAUNCH_SCHEMA if c in gpu_ops.columns])
    return ops.with_columns(gather_launches(api_calls, launch_rows(ops, api_calls)))


def in_threads(work: Callable[[int], None], items: Iterable[int]) -> None:
    """``work(item)`` for every item, on up to two threads (NumPy and Polars release the GIL in
    the heavy calls); the items must touch disjoint data. Exceptions propagate."""
    items = list(items)
    if len(items) < 2 or _threads() < 2:
        for item in items:
            work(item)
        return
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(work, item) for item in items]:
            future.result()


def _threads() -> int:
    return usable_cores()
