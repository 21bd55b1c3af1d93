"""NCCL Inspector logs: the profiler plugin's per-collective JSON lines and its Prometheus textfiles.

The plugin (NVIDIA/nccl ``plugins/profiler/inspector``, enabled with ``NCCL_PROFILER_PLUGIN=...`` and
``NCCL_INSPECTOR_ENABLE=1``; docs/inspector.md) writes, per process, ``<host>-pid<PID>.log``: one JSON
object a line, one line per completed collective (``coll_perf``) or point-to-point operation
(``p2p_perf``) per communicator::

    {"header": {"id": "0xa19...", "comm_name": "...", "rank": 0, "n_ranks": 2, "nnodes": 1},
     "metadata": {"inspector_output_format_version": "v4.0", "dump_timestamp_us": ..., "hostname": ...,
                  "pid": ...},
     "coll_perf": {"coll": "AllGather", "coll_sn": 0, "coll_msg_size_bytes": ..., "coll_exec_time_us": ...,
                   "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": ..., "coll_busbw_gbs": ...,
                   "event_trace_ts": {...}}}   # event_trace_* only with NCCL_INSPECTOR_DUMP_VERBOSE=1

``header.rank`` is the rank *within the communicator*; the process is ``hostname`` + ``pid``. The
rank a process has in the run is its rank in the largest communicator it belongs to (the world
group; see :func:`process_ranks`).

Reading is streamed: the (optionally gzip) file is read in blocks of :data:`BLOCK_BYTES`, each
block's complete lines parsed by Polars' NDJSON reader with a fixed schema (unknown fields are
ignored) and reduced at once to the compact columns of :data:`OPS_SCHEMA` (about 90 bytes a line);
the text is never held whole. A last line without its newline that does not parse is a file
still being written: it is left out with a warning, not an error. A line that is not JSON in the
middle of a file is skipped and counted. Files whose ``inspector_output_format_version`` has a
major other than :data:`FORMAT_MAJOR` are refused (:class:`UnsupportedFormatError`).

With ``NCCL_INSPECTOR_PROM_DUMP=1`` the plugin writes instead one Prometheus textfile per GPU
(``nccl_inspector_metrics_<GPU UUID without "GPU-">.prom``), rewritten every dump interval (30 s at
least) and deleted when the process ends: per label set (communicator name, collective,
message-size bucket, algorithm_protocol, ...), the mean execution time and the geometric-mean bus
bandwidth of the operations since the previous dump. Its ``gpu`` label is the process's CUDA
ordinal (``GPU0`` in every process that sees one GPU), so the GPU is told by the UUID in the file
name. It has no sequence numbers, so it can only be summarised, not matched across ranks
(:func:`read_prom`). Copies taken while the job runs (``..._t051.prom`` or ``....prom_t051``: the
seconds since the start) are read as snapshots of their GPU's file: a copy identical to the
previous one of the same GPU (the plugin had not rewritten it yet) is read once
(:func:`read_inspector`).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from traceguard.errors import InputError, UnsupportedFormatError

#: The output format major this reader knows (``inspector_output_format_version`` "v4.x").
FORMAT_MAJOR = 4
#: Bytes of (decompressed) text parsed at a time: the reader's memory besides its compact rows.
BLOCK_BYTES = 16 << 20
GZIP_MAGIC = b"\x1f\x8b"
_VERSION = re.compile(r"^v?(\d+)(?:\.(\d+))?")

_KERNEL = pl.Struct({"channel_id": pl.Int32, "kernel_start_ts": pl.Int64, "kernel_stop_ts": pl.Int64})


def _perf(prefix: str) -> pl.Struct:
    return pl.Struct(
        {
            prefix: pl.String,
            f"{prefix}_sn": pl.Int64,
            **({"p2p_peer": pl.Int32} if prefix == "p2p" else {}),
            f"{prefix}_msg_size_bytes": pl.Int64,
            f"{prefix}_exec_time_us": pl.Int64,
            f"{prefix}_timing_source": pl.String,
            f"{prefix}_algobw_gbs": pl.Float64,
            f"{prefix}_busbw_gbs": pl.Float64,
            "event_trace_ts": pl.Struct(
                {f"{prefix}_start_ts": pl.Int64, f"{prefix}_stop_ts": pl.Int64, "kernel_events": pl.List(_KERNEL)}
            ),
        }
    )


#: What the NDJSON parse reads of a line (everything else is ignored).
LINE_SCHEMA = {
    "header": pl.Struct(
        {"id": pl.String, "comm_name": pl.String, "rank": pl.Int32, "n_ranks": pl.Int32, "nnodes": pl.Int32}
    ),
    "metadata": pl.Struct(
        {
            "inspector_output_format_version": pl.String,
            "dump_timestamp_us": pl.Int64,
            "hostname": pl.String,
            "pid": pl.Int64,
        }
    ),
    "coll_perf": _perf("coll"),
    "p2p_perf": _perf("p2p"),
}

#: One row per Inspector line (one operation on one rank of one communicator).
OPS_SCHEMA = {
    "host": pl.Categorical,
    "pid": pl.Int64,
    "comm_id": pl.UInt64,  # the communicator hash, ``header.id`` ("0x..." hex)
    "comm_name": pl.Categorical,
    "comm_rank": pl.Int32,  # header.rank: the rank within the communicator
    "n_ranks": pl.Int32,
    "nnodes": pl.Int32,
    "p2p": pl.Boolean,  # a Send/Recv (p2p_perf) rather than a collective (coll_perf)
    "coll": pl.Categorical,  # AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, Send, Recv ...
    "coll_sn": pl.Int64,  # the operation's sequence number on its communicator (p2p: p2p_sn)
    "peer": pl.Int32,  # p2p only: the peer's rank in the communicator
    "msg_bytes": pl.Int64,
    "exec_ns": pl.Int64,  # coll_exec_time_us × 1000
    "timing_source": pl.Categorical,  # kernel_gpu | kernel_cpu | collective_cpu
    "algbw_gbps": pl.Float64,
    "busbw_gbps": pl.Float64,
    "dump_us": pl.Int64,  # metadata.dump_timestamp_us: wall clock when the line was written
    "start_us": pl.Int64,  # verbose: the first channel's kernel start (wall clock, µs), else null
    "stop_us": pl.Int64,  # verbose: the last channel's kernel stop (wall clock, µs), else null
    "channels": pl.Int32,  # verbose: channels with a kernel start, else null
}


@dataclass
class InspectorFile:
    """What was read from one Inspector file (one process's log, or one GPU's Prometheus file)."""

    path: str
    kind: str  # "json" | "prom"
    version: str | None = None
    lines: int = 0
    verbose: bool = False
    partial_tail_bytes: int = 0  # a last line without newline that did not parse: still being written
    bad_lines: int = 0
    processes: list[tuple[str, int]] = field(default_factory=list)  # (host, pid)
    #: Per (host, pid, comm_id): n_ranks and the process's comm_rank (a few rows: what ranks need).
    comms: pl.DataFrame | None = None
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    #: A Prometheus snapshot identical to an earlier one of the same GPU: that one's path (read once).
    same_as: str | None = None


@dataclass
class InspectorData:
    """Every Inspector file of a run: the operations (JSON lines), the Prometheus snapshots."""

    ops: pl.DataFrame
    prom: pl.DataFrame
    files: list[InspectorFile]
    #: (host, pid) → the process's rank in the run (:func:`process_ranks`), with how it was found.
    ranks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame())

    @property
    def errors(self) -> list[str]:
        return [f.error for f in self.files if f.error]


def empty_ops() -> pl.DataFrame:
    return pl.DataFrame(schema=OPS_SCHEMA)


# --------------------------------------------------------------------------------------------
# recognising


def looks_like_inspector(head: bytes) -> bool:
    """Content sniffing on a file's first bytes (gunzipped): an Inspector JSON-lines log?"""
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if not text.startswith(b"{"):
        return False
    first = text.split(b"\n", 1)[0]
    return (
        b'"header"' in first
        and b'"metadata"' in first
        and (b'"inspector_output_format_version"' in first or b'"coll_perf"' in first or b'"p2p_perf"' in first)
    )


_PROM_LINE = re.compile(r"^(nccl_[a-z0-9_]+)\{(.*)\}\s+(\S+)\s*$")
PROM_METRICS = (
    "nccl_bus_bandwidth_gbs",
    "nccl_collective_exec_time_microseconds",
    "nccl_p2p_bus_bandwidth_gbs",
    "nccl_p2p_exec_time_microseconds",
)


def looks_like_inspector_prom(text: str) -> bool:
    """A Prometheus textfile the Inspector wrote: its first sample line is one of :data:`PROM_METRICS`."""
    for line in text.splitlines()[:20]:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _PROM_LINE.match(line)
        return bool(match and match.group(1) in PROM_METRICS)
    return False


def format_major(version: str | None) -> int | None:
    match = _VERSION.match(version or "")
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------------------------
# JSON lines


def _raw_chunks(path: Path, size: int) -> Iterator[bytes]:
    """The file's bytes, gunzipped when gzip (every member), a piece at a time. A gzip stream
    without its end (the writer's gzip still open) yields what it holds, then raises _Truncated."""
    with path.open("rb") as fh:
        if fh.read(2) != GZIP_MAGIC:
            fh.seek(0)
            while chunk := fh.read(size):
                yield chunk
            return
        fh.seek(0)
        inflate = zlib.decompressobj(wbits=31)
        while packed := fh.read(1 << 20):
            try:
                yield inflate.decompress(packed)
                while inflate.eof and inflate.unused_data:  # concatenated gzip members
                    rest = inflate.unused_data
                    inflate = zlib.decompressobj(wbits=31)
                    yield inflate.decompress(rest)
            except zlib.error as exc:
                raise _Truncated(f"corrupt gzip data: {exc}") from exc
        if not inflate.eof:
            raise _Truncated("the gzip stream has no end")


def iter_blocks(path: Path, block_bytes: int = BLOCK_BYTES) -> Iterator[tuple[bytes, bool]]:
    """The file's text in blocks of whole lines; the last item may be ``(tail, True)``: the bytes
    after the last newline (a line still being written, or the last line without its newline)."""
    carry = b""
    pending: list[bytes] = []
    held = 0
    try:
        for chunk in _raw_chunks(path, block_bytes):
            pending.append(chunk)
            held += len(chunk)
            if held < block_bytes:
                continue
            data = carry + b"".join(pending)
            pending, held = [], 0
            cut = data.rfind(b"\n")
            if cut < 0:
                carry = data
                continue
            carry = data[cut + 1 :]
            yield data[: cut + 1], False
    except _Truncated:
        data = carry + b"".join(pending)
        cut = data.rfind(b"\n")
        if cut >= 0:
            yield data[: cut + 1], False
        if data[cut + 1 :].strip():
            yield data[cut + 1 :], True
        raise
    data = carry + b"".join(pending)
    cut = data.rfind(b"\n")
    if cut >= 0:
        yield data[: cut + 1], False
    if data[cut + 1 :].strip():
        yield data[cut + 1 :], True


class _Truncated(Exception):
    pass


def _reduce(frame: pl.DataFrame) -> pl.DataFrame:
    """Parsed lines (LINE_SCHEMA) → compact rows (OPS_SCHEMA)."""
    header, meta = pl.col("header"), pl.col("metadata")
    p2p = pl.col("p2p_perf").is_not_null() & pl.col("coll_perf").is_null()

    def pick(name: str, dtype: Any = None) -> pl.Expr:
        expr = (
            pl.when(p2p)
            .then(pl.col("p2p_perf").struct.field(f"p2p{name}"))
            .otherwise(pl.col("coll_perf").struct.field(f"coll{name}"))
        )
        return expr.cast(dtype) if dtype is not None else expr

    events = (
        pl.when(p2p)
        .then(pl.col("p2p_perf").struct.field("event_trace_ts").struct.field("kernel_events"))
        .otherwise(pl.col("coll_perf").struct.field("event_trace_ts").struct.field("kernel_events"))
    )
    # A channel that never started reports 0: only real timestamps count.
    positive = pl.element().filter(pl.element() > 0)
    starts = events.list.eval(pl.element().struct.field("kernel_start_ts")).list.eval(positive)
    stops = events.list.eval(pl.element().struct.field("kernel_stop_ts")).list.eval(positive)
    return frame.select(
        meta.struct.field("hostname").alias("host"),
        meta.struct.field("pid").alias("pid"),
        header.struct.field("id")
        .str.strip_prefix("0x")
        .str.to_integer(base=16, dtype=pl.UInt64, strict=False)
        .alias("comm_id"),
        header.struct.field("comm_name").alias("comm_name"),
        header.struct.field("rank").alias("comm_rank"),
        header.struct.field("n_ranks").alias("n_ranks"),
        header.struct.field("nnodes").alias("nnodes"),
        p2p.alias("p2p"),
        pl.when(p2p)
        .then(pl.col("p2p_perf").struct.field("p2p"))
        .otherwise(pl.col("coll_perf").struct.field("coll"))
        .alias("coll"),
        pick("_sn").alias("coll_sn"),
        pl.col("p2p_perf").struct.field("p2p_peer").alias("peer"),
        pick("_msg_size_bytes").alias("msg_bytes"),
        (pick("_exec_time_us") * 1000).alias("exec_ns"),
        pick("_timing_source").alias("timing_source"),
        pick("_algobw_gbs").alias("algbw_gbps"),
        pick("_busbw_gbs").alias("busbw_gbps"),
        meta.struct.field("dump_timestamp_us").alias("dump_us"),
        starts.list.min().alias("start_us"),
        stops.list.max().alias("stop_us"),
        pl.when(events.is_not_null()).then(starts.list.len()).otherwise(None).cast(pl.Int32).alias("channels"),
        meta.struct.field("inspector_output_format_version").alias("_version"),
    ).cast({k: v for k, v in OPS_SCHEMA.items() if k not in ("comm_id",)})


def _parse_block(block: bytes, shown: str, record: InspectorFile) -> pl.DataFrame:
    """One block of whole lines → compact rows; a block with a non-JSON line is parsed line by line."""
    try:
        return _reduce(pl.read_ndjson(io.BytesIO(block), schema=LINE_SCHEMA, ignore_errors=False))
    except (pl.exceptions.ComputeError, pl.exceptions.PolarsError, ValueError):
        pass
    good: list[bytes] = []
    for line in block.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            record.bad_lines += 1
            continue
        if isinstance(obj, dict) and isinstance(obj.get("header"), dict):
            good.append(line)
        else:
            record.bad_lines += 1
    if not good:
        return _reduce(pl.DataFrame(schema=LINE_SCHEMA))
    try:
        return _reduce(pl.read_ndjson(io.BytesIO(b"\n".join(good)), schema=LINE_SCHEMA))
    except (pl.exceptions.PolarsError, ValueError):
        pass
    # JSON, but of other types than the plugin writes (a damaged file): line by line, the odd ones out.
    frames = []
    for line in good:
        try:
            frames.append(pl.read_ndjson(io.BytesIO(line), schema=LINE_SCHEMA))
        except (pl.exceptions.PolarsError, ValueError):
            record.bad_lines += 1
    return _reduce(pl.concat(frames) if frames else pl.DataFrame(schema=LINE_SCHEMA))


def _check_version(rows: pl.DataFrame, shown: str, record: InspectorFile) -> None:
    versions = rows["_version"].unique().to_list()
    for version in versions:
        major = format_major(version)
        if major != FORMAT_MAJOR:
            found = f"format version {version!r}" if version else "no inspector_output_format_version"
            raise UnsupportedFormatError(
                f"{shown}: NCCL Inspector output with {found}; traceguard reads format v{FORMAT_MAJOR}.x "
                "(NCCL 2.28's inspector plugin)",
                hint="use the plugin from the NCCL release the job ran with, or tell us the new format",
            )
    if record.version is None and versions:
        record.version = sorted(v for v in versions if v)[0]


def read_inspector_json(
    path: Path, *, shown: str | None = None, block_bytes: int = BLOCK_BYTES
) -> tuple[InspectorFile, pl.DataFrame]:
    """One Inspector JSON-lines file (plain or gzip, complete or still being written) → its record
    and compact rows (:data:`OPS_SCHEMA`). Raises InputError when nothing can be read and
    UnsupportedFormatError on an unknown format major."""
    shown = shown or str(path)
    record = InspectorFile(path=shown, kind="json")
    parts: list[pl.DataFrame] = []
    comms: list[pl.DataFrame] = []
    try:
        for block, is_tail in iter_blocks(path, block_bytes):
            if is_tail:
                try:
                    json.loads(block)
                except ValueError:
                    record.partial_tail_bytes = len(block)
                    record.warnings.append(
                        f"{shown}: the last line is incomplete ({len(block)} bytes, no newline): the file is "
                        "probably still being written; that line is left out"
                    )
                    continue
            rows = _parse_block(block, shown, record)
            if rows.height:
                _check_version(rows, shown, record)
                parts.append(rows.drop("_version"))
                comms.append(_comms(rows))
    except _Truncated as exc:
        record.warnings.append(f"{shown}: the gzip stream ends early ({exc}): read up to where it stops")
    except FileNotFoundError as exc:
        raise InputError(f"{shown}: no such file") from exc
    except OSError as exc:
        raise InputError(f"{shown}: cannot be read ({exc.strerror})") from exc
    # The blocks' frames as chunks of one frame (no copy: a copy would double the peak).
    ops = pl.concat(parts, how="vertical", rechunk=False) if parts else empty_ops()
    if record.bad_lines:
        record.warnings.append(f"{shown}: {record.bad_lines} line(s) are not Inspector JSON and were skipped")
    if ops.height == 0:
        raise InputError(f"{shown}: no NCCL Inspector line could be read")
    record.lines = ops.height
    record.verbose = bool(ops["channels"].is_not_null().any())
    record.comms = _comms(pl.concat(comms))
    record.processes = [
        (str(h), int(p)) for h, p in record.comms.select("host", "pid").unique(maintain_order=True).iter_rows()
    ]
    return record, ops


#: Bytes of text :func:`check_inspector_head` reads.
HEAD_BYTES = 1 << 20


def check_inspector_head(path: Path, *, head_bytes: int = HEAD_BYTES) -> None:
    """An upload's check before it is kept: the first complete lines (about ``head_bytes`` of text)
    of an Inspector JSON-lines file parse and carry a format version this reader knows. Raises
    InputError when no line of that head can be read, UnsupportedFormatError on another format
    major (messages without the path: the caller names the file). Prometheus textfiles pass (they
    are summarised as they are)."""
    if is_prom_file(path):
        return
    record = InspectorFile(path="", kind="json")
    rows = None
    try:
        for block, is_tail in iter_blocks(path, head_bytes):
            if is_tail:
                try:
                    json.loads(block)
                except ValueError:
                    break
            rows = _parse_block(block, "", record)
            break
    except _Truncated:
        pass
    except OSError as exc:
        raise InputError(f"cannot be read ({exc.strerror})") from exc
    if rows is None or rows.height == 0:
        raise InputError(
            f"no complete NCCL Inspector line could be read in its first {max(1, head_bytes >> 20)} MiB",
            hint="send the plugin's <host>-pid<PID>.log files (plain or gzip) as they are",
        )
    for version in rows["_version"].unique().to_list():
        if format_major(version) != FORMAT_MAJOR:
            found = f"format version {version!r}" if version else "no inspector_output_format_version"
            raise UnsupportedFormatError(
                f"NCCL Inspector output with {found}; traceguard reads format v{FORMAT_MAJOR}.x "
                "(NCCL 2.28's inspector plugin)",
                hint="use the plugin from the NCCL release the job ran with, or tell us the new format",
            )


# --------------------------------------------------------------------------------------------
# Prometheus textfile

PROM_SCHEMA = {
    "version": pl.String,  # the plugin's "v<profiler interface>.<prom format minor>", e.g. "v5.1"
    "slurm_job_id": pl.String,  # "unknown" outside Slurm
    "node": pl.String,
    "gpu": pl.String,  # "GPU<CUDA ordinal in the process>": not unique across processes
    "gpu_uuid": pl.String,  # from the file name (nccl_inspector_metrics_<UUID>.prom), else null
    "comm_name": pl.String,
    "n_nodes": pl.Int32,
    "n_ranks": pl.Int32,
    "p2p": pl.Boolean,
    "coll": pl.String,
    "message_size": pl.String,  # the plugin's bucket label, e.g. "32-33MB"
    "algo_proto": pl.String,
    "exec_mean_us": pl.Float64,  # mean execution time since the previous dump
    "busbw_gm_gbps": pl.Float64,  # geometric mean bus bandwidth since the previous dump
    "path": pl.String,
    "snapshot_s": pl.Int64,  # a copy's _tNNN suffix (s since the copying began), else null
    "latest": pl.Boolean,  # the last distinct snapshot of its GPU's file (read_inspector)
}
#: The plugin's file name, and a copy's suffix (``_t051.prom`` or ``.prom_t051``, optionally .gz).
_PROM_NAME = re.compile(r"^nccl_inspector_metrics_(?P<uuid>.+?)(?:_t(?P<t1>\d+))?\.prom(?:_t(?P<t2>\d+))?(?:\.gz)?$")


def prom_name(name: str) -> tuple[str | None, int | None]:
    """A Prometheus file's GPU UUID and snapshot second from its name (either may be None)."""
    match = _PROM_NAME.match(name)
    if not match:
        return None, None
    second = match.group("t1") or match.group("t2")
    return match.group("uuid"), int(second) if second is not None else None


_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prom(text: str, *, shown: str = "") -> pl.DataFrame:
    """The plugin's Prometheus textfile (inspector_prom.cc) → one row per label set."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    for line in text.splitlines():
        match = _PROM_LINE.match(line.strip())
        if not match or match.group(1) not in PROM_METRICS:
            continue
        name, labels, value = match.groups()
        tags = dict(_LABEL.findall(labels))
        p2p = name.startswith("nccl_p2p_")
        coll = tags.get("p2p_operation") if p2p else tags.get("collective")
        key = tuple(sorted((k, v) for k, v in tags.items()))
        row = rows.setdefault(
            key,
            {
                "version": tags.get("version"),
                "slurm_job_id": tags.get("slurm_job_id"),
                "node": tags.get("node"),
                "gpu": tags.get("gpu"),
                "gpu_uuid": None,
                "comm_name": tags.get("comm_name"),
                "n_nodes": _int(tags.get("n_nodes")),
                "n_ranks": _int(tags.get("nranks")),
                "p2p": p2p,
                "coll": coll,
                "message_size": tags.get("message_size"),
                "algo_proto": tags.get("algo_proto"),
                "exec_mean_us": None,
                "busbw_gm_gbps": None,
                "path": shown,
                "snapshot_s": None,
                "latest": True,
            },
        )
        try:
            number = float(value)
        except ValueError:
            continue
        if name.endswith("exec_time_microseconds"):
            row["exec_mean_us"] = number
        else:
            row["busbw_gm_gbps"] = number
    return pl.DataFrame(list(rows.values()), schema=PROM_SCHEMA, orient="row")


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def read_prom(path: Path, *, shown: str | None = None) -> tuple[InspectorFile, pl.DataFrame]:
    shown = shown or str(path)
    record = InspectorFile(path=shown, kind="prom")
    try:
        raw = path.read_bytes()
        if raw[:2] == GZIP_MAGIC:
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{shown}: cannot be read ({exc})") from exc
    frame = parse_prom(raw.decode("utf-8", errors="replace"), shown=shown)
    if frame.height == 0:
        raise InputError(f"{shown}: no NCCL Inspector Prometheus sample could be read")
    uuid, second = prom_name(path.name)
    frame = frame.with_columns(pl.lit(uuid, pl.String).alias("gpu_uuid"), pl.lit(second, pl.Int64).alias("snapshot_s"))
    record.lines = frame.height
    versions = sorted({v for v in frame["version"].to_list() if v})
    record.version = versions[0] if versions else None
    return record, frame


# --------------------------------------------------------------------------------------------
# a run's files


def _comms(rows: pl.DataFrame) -> pl.DataFrame:
    """The communicators of some rows: per (host, pid, comm_id) its size and the process's rank in it."""
    return rows.group_by("host", "pid", "comm_id", maintain_order=True).agg(
        pl.col("n_ranks").max(), pl.col("comm_rank").first()
    )


def process_ranks(comms: pl.DataFrame) -> pl.DataFrame:
    """From the files' communicators (:func:`_comms`): (host, pid) → ``rank``, the process's rank
    in its largest communicator (the world group: every process of the job is in it, and its
    ranks are the job's ranks), ``rank_comm`` that communicator's id and its ``n_ranks``. Two
    processes claiming one rank keep it; :func:`read_inspector` warns."""
    if comms.height == 0:
        return pl.DataFrame(
            schema={"host": pl.String, "pid": pl.Int64, "rank": pl.Int32, "rank_comm": pl.UInt64, "n_ranks": pl.Int32}
        )
    comms = _comms(comms)
    return (
        comms.sort(["n_ranks", "comm_id"], descending=[True, False])
        .group_by("host", "pid", maintain_order=True)
        .first()
        .select(
            pl.col("host").cast(pl.String),
            "pid",
            pl.col("comm_rank").alias("rank"),
            pl.col("comm_id").alias("rank_comm"),
            "n_ranks",
        )
        .sort("rank")
    )


def read_inspector(paths: list[Path], *, block_bytes: int = BLOCK_BYTES) -> InspectorData:
    """Every Inspector file of a run (JSON lines and Prometheus textfiles, by content). A file that
    cannot be read is a record with ``error``; the others still count."""
    files: list[InspectorFile] = []
    ops: list[pl.DataFrame] = []
    proms: list[tuple[Path, InspectorFile, pl.DataFrame]] = []
    for path in paths:
        try:
            if is_prom_file(path):
                record, frame = read_prom(path)
                proms.append((path, record, frame))
            else:
                record, frame = read_inspector_json(path, block_bytes=block_bytes)
                ops.append(frame)
        except InputError as exc:
            files.append(InspectorFile(path=str(path), kind="json", error=str(exc)))
            continue
        files.append(record)
    every = pl.concat(ops, how="vertical", rechunk=False) if ops else empty_ops()
    every = _once(every, [f for f in files if f.kind == "json" and not f.error])
    known = [f.comms for f in files if f.comms is not None]
    ranks = process_ranks(pl.concat(known) if known else _comms(empty_ops()))
    data = InspectorData(
        ops=every,
        prom=_snapshots(proms),
        files=files,
        ranks=ranks,
    )
    clash = ranks.filter(pl.col("rank").is_duplicated())
    if clash.height:
        first = clash.row(0, named=True)
        who = ", ".join(f"{h} pid {p}" for h, p in clash.select("host", "pid").iter_rows())
        warn = (
            f"rank {first['rank']} is claimed by {clash.height} processes ({who}): "
            "are the files of more than one job in this directory?"
        )
        for record in files:
            if not record.error:
                record.warnings.append(warn)
                break
    return data


#: What identifies one operation of one process: its line written twice is the same operation.
OP_KEY = ("host", "pid", "comm_id", "p2p", "coll", "coll_sn", "peer")


def _once(ops: pl.DataFrame, files: list[InspectorFile]) -> pl.DataFrame:
    """The operations with each read once where a process's lines are in more than one file: the
    same log sent again as it grew (an older, shorter copy beside the newer one), or sent in
    pieces that overlap. Files of distinct processes (the usual case) are returned as they are,
    with no copy."""
    seen: dict[tuple[str, int], str] = {}
    repeated: list[tuple[InspectorFile, str]] = []
    for record in files:
        for process in record.processes:
            if process in seen:
                repeated.append((record, seen[process]))
                break
        for process in record.processes:
            seen.setdefault(process, record.path)
    if not repeated:
        return ops
    once = ops.unique(subset=list(OP_KEY), keep="first", maintain_order=True)
    for record, earlier in repeated:
        record.warnings.append(
            f"{record.path}: holds lines of a process also in {earlier} (a log sent again as it grew?): "
            "each operation is read once"
        )
    if once.height < ops.height:
        repeated[0][0].warnings.append(f"{ops.height - once.height} repeated line(s) were read once")
    return once


def _snapshots(proms: list[tuple[Path, InspectorFile, pl.DataFrame]]) -> pl.DataFrame:
    """The Prometheus files' rows, snapshot by snapshot. Files of one GPU (the UUID in the name; a
    file without one is its own) are taken in snapshot order (the _tNNN suffix, else the file's
    modification time); a snapshot whose rows equal the previous distinct one's is a copy taken
    before the plugin rewrote the file: its record gets ``same_as`` and its rows are left out.
    ``latest`` marks the rows of each GPU's last distinct snapshot."""
    groups: dict[str, list[tuple[Path, InspectorFile, pl.DataFrame]]] = {}
    for item in proms:
        uuid = item[2]["gpu_uuid"][0]
        groups.setdefault(uuid if uuid is not None else str(item[0]), []).append(item)
    kept: list[pl.DataFrame] = []
    for items in groups.values():

        def order(item: tuple[Path, InspectorFile, pl.DataFrame]) -> tuple[float, str]:
            second = item[2]["snapshot_s"][0]
            if second is None:
                try:
                    second = item[0].stat().st_mtime
                except OSError:
                    second = 0.0
            return float(second), item[0].name

        distinct: list[tuple[InspectorFile, pl.DataFrame]] = []
        for _, record, frame in sorted(items, key=order):
            content = frame.drop("path", "snapshot_s", "latest")
            if distinct and content.equals(distinct[-1][1].drop("path", "snapshot_s", "latest")):
                record.same_as = distinct[-1][0].path
                continue
            distinct.append((record, frame))
        last = len(distinct) - 1
        kept += [frame.with_columns(pl.lit(i == last).alias("latest")) for i, (_, frame) in enumerate(distinct)]
    return pl.concat(kept, how="vertical") if kept else pl.DataFrame(schema=PROM_SCHEMA)


def is_prom_file(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
        if head[:2] == GZIP_MAGIC:
            with gzip.open(path, "rb") as fh:
                head = fh.read(4096)
    except (OSError, EOFError, zlib.error):
        return False
    return looks_like_inspector_prom(head.decode("utf-8", errors="replace"))
