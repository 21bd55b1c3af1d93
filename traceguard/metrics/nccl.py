"""NCCL kernels: time, exposed (non-overlapped) time, and per-collective latency/bandwidth.

- NCCL kernels are kernels whose name starts with ``nccl`` (``ncclKernel_*``, ``ncclDevKernel_*``),
  and NCCL's ``oneRankReduce`` (what a one-rank communicator runs for an AVG/PreMulSum reduction;
  its collective type is not in its name, so it is counted with no type).
- ``nccl_time_ns``: the union of NCCL kernel intervals per device, summed over devices.
- ``nccl_exposed_ns``: NCCL time not overlapped by compute (non-NCCL) kernels on the same device,
  i.e. |NCCL ∪ compute| − |compute| per device, summed.
- Collective bandwidth (nccl-tests definitions): algbw = bytes ÷ time; busbw = algbw × factor,
  factor 2(n−1)/n for AllReduce, (n−1)/n for AllGather/ReduceScatter/AllToAll, 1 for
  Broadcast/Reduce/SendRecv. Kernel time includes any wait for the slowest peer, so these are
  lower bounds of what the link delivered.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceguard.metrics.intervals import (
    STREAM_ROWS,
    UnionStream,
    group_order,
    pack_keys,
    sort_groups,
    union_ns,
    union_ns_sorted,
    union_sorted_np,
)

_COLLECTIVE = r"^nccl(?:Dev)?Kernel_([A-Za-z]+)"
#: NCCL's kernel for a reduction on a one-rank communicator (``ncclLaunchOneRank``): nsys names it
#: ``oneRankReduce``, Kineto by its mangled name (``..._onerank_cu_..._oneRankReduceI13FuncPreMulSum...``).
ONE_RANK_KERNEL = "oneRankReduce"
_ALIASES = {
    "allreduce": "AllReduce",
    "allgather": "AllGather",
    "reducescatter": "ReduceScatter",
    "reduce_scatter": "ReduceScatter",
    "broadcast": "Broadcast",
    "reduce": "Reduce",
    "sendrecv": "SendRecv",
    "send": "Send",
    "recv": "Recv",
    "alltoall": "AllToAll",
    "generic": "Generic",
}


#: The collectives :func:`mark_nccl` names (``collective`` column; cast to text for reports).
Collective = pl.Enum(sorted(set(_ALIASES.values())))


def nccl_name_ids(strings: pl.DataFrame) -> pl.DataFrame:
    """Interned names of NCCL kernels, with the collective they run."""
    is_nccl = pl.col("value").str.starts_with("nccl") | pl.col("value").str.contains(ONE_RANK_KERNEL, literal=True)
    return strings.filter(is_nccl).select(
        pl.col("id").alias("name_id"),
        pl.col("value")
        .str.extract(_COLLECTIVE, 1)
        .str.to_lowercase()
        .replace_strict(_ALIASES, default=None, return_dtype=pl.String)
        .alias("collective"),
    )


def mark_nccl(ops: pl.DataFrame, strings: pl.DataFrame, *, collective: bool = True) -> pl.DataFrame:
    """Add ``is_nccl`` (bool) and, unless told not to, ``collective`` (name or null) to GPU ops.

    ``collective=False`` leaves that column to :func:`with_collective` on the few NCCL rows a
    metric needs it for (10 M ops would carry one value each, nearly all null)."""
    # Expressions over the few NCCL name ids rather than a join: a join would rewrite every
    # column of ``ops``; this adds one or two.
    ids = nccl_name_ids(strings)
    name_ids = ids["name_id"].cast(ops.schema["name_id"])
    is_nccl = (pl.col("kind") == "kernel") & pl.col("name_id").is_in(name_ids.implode()).fill_null(False)
    marked = ops.with_columns(is_nccl.alias("is_nccl"))
    return with_collective(marked, strings) if collective else marked


def with_collective(ops: pl.DataFrame, strings: pl.DataFrame) -> pl.DataFrame:
    """Add ``collective``: the NCCL collective each op's kernel runs (null for other ops)."""
    ids = nccl_name_ids(strings)
    name_ids = ids["name_id"].cast(ops.schema["name_id"])
    collectives = dict(zip(name_ids.to_list(), ids["collective"].to_list(), strict=True))
    # An Enum, not text: one small code per op instead of a string view each.
    collective = pl.col("name_id").replace_strict(collectives, default=None, return_dtype=Collective)
    return ops.with_columns(collective.alias("collective"))


def nccl_time(ops: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Union of NCCL kernel time per ``by`` group, summed over devices → column ``nccl_ns``."""
    nccl = ops.lazy().filter(pl.col("is_nccl"))
    return union_ns(nccl, [*by, "device"]).group_by(by).agg(pl.col("union_ns").sum().alias("nccl_ns")).collect()


def exposed_time(ops: pl.DataFrame | pl.LazyFrame, mask: pl.Series | None = None) -> int:
    """|NCCL ∪ compute| − |compute| per device, summed: NCCL time with no compute beside it.

    Over the kernels of ``ops`` (those ``mask`` marks, when given). One (device, start) order of
    the kernels serves both unions (the compute kernels keep it). Kernels of one device already
    in start order (a real capture's kernel table) are streamed in slices, with no copy of them."""
    if isinstance(ops, pl.DataFrame):
        streamed = _exposed_streamed(ops, mask)
        if streamed is not None:
            return streamed
        lazy = ops.lazy() if mask is None else ops.lazy().filter(mask)
    else:
        lazy = ops if mask is None else ops.filter(mask)
    kernels = lazy.filter(pl.col("kind") == "kernel").select("device", "start", "end", "is_nccl").collect()
    packed = pack_keys([kernels], ["device"])
    if packed is None or kernels.height == 0 or kernels["start"].null_count() or kernels["end"].null_count():
        return _exposed_time_polars(kernels)
    code = packed[0]
    group = None if int(code.min()) == int(code.max()) else code
    start = kernels["start"].to_numpy().astype(np.int64, copy=False)
    end = kernels["end"].to_numpy().astype(np.int64, copy=False)
    compute = ~kernels["is_nccl"].fill_null(False).to_numpy()
    del kernels
    order = group_order(group, start)
    everything = int(union_sorted_np(group, start, end, order=order)[1].sum())
    computed = int(union_sorted_np(group, start, end, keep=compute, order=order)[1].sum())
    return everything - computed


def _exposed_streamed(ops: pl.DataFrame, mask: pl.Series | None) -> int | None:
    """:func:`exposed_time` in one pass over row slices, when the kept kernels are all of one
    device, in start order, without nulls; None otherwise (or when none is kept)."""
    keep = pl.col("kind") == "kernel"
    frame = ops.select("device", "start", "end", pl.col("is_nccl").fill_null(False), keep.alias("_keep"))
    if mask is not None:
        frame = frame.with_columns(pl.col("_keep") & mask)
    everything, compute = UnionStream(), UnionStream()
    device: int | None = None
    previous: int | None = None
    for part in frame.iter_slices(STREAM_ROWS):
        kept = part.filter(pl.col("_keep"))
        if kept.height == 0:
            continue
        if any(kept[c].null_count() for c in ("device", "start", "end")):
            return None
        devices = kept["device"]
        low, high = devices.min(), devices.max()
        if low != high or (device is not None and low != device):
            return None
        device = low  # type: ignore[assignment]
        start = kept["start"].to_numpy()
        end = kept["end"].to_numpy()
        if (previous is not None and int(start[0]) < previous) or not bool(np.all(start[1:] >= start[:-1])):
            return None
        previous = int(start[-1])
        everything.feed(start, end, None, 0)
        nccl = kept["is_nccl"].to_numpy()
        compute.feed(start[~nccl], end[~nccl], None, 0)
    if device is None:
        return None
    return int(everything.result()[1].sum()) - int(compute.result()[1].sum())


def _exposed_time_polars(kernels: pl.DataFrame) -> int:
    kernels = sort_groups(kernels.lazy(), ["device"]).collect()
    everything = union_ns_sorted(kernels, ["device"]).select(pl.col("union_ns").sum()).collect().item() or 0
    compute = kernels.filter(~pl.col("is_nccl"))  # filtering keeps the order
    computed = union_ns_sorted(compute, ["device"]).select(pl.col("union_ns").sum()).collect().item() or 0
    return int(everything - computed)


def bus_factor(collective: pl.Expr, n: pl.Expr) -> pl.Expr:
    n = n.cast(pl.Float64)
    return (
        pl.when(collective == "AllReduce")
        .then(2 * (n - 1) / n)
        .when(collective.is_in(["AllGather", "ReduceScatter", "AllToAll"]))
        .then((n - 1) / n)
        .when(collective.is_in(["Broadcast", "Reduce", "SendRecv", "Send", "Recv"]))
        .then(1.0)
        .otherwise(None)
    )


def collective_table(nccl_ops: pl.DataFrame, ranks_analysed: int) -> pl.DataFrame:
    """Per (rank, collective, message size): count, time percentiles, algbw/busbw in GB/s."""
    if nccl_ops.height == 0:
        return pl.DataFrame(
            schema={
                "rank": pl.Int32,
                "collective": pl.String,
                "msg_bytes": pl.Int64,
                "group_size": pl.Int32,
                "count": pl.UInt32,
                "total_ns": pl.Int64,
                "median_ns": pl.Float64,
                "p95_ns": pl.Float64,
                "min_ns": pl.Int64,
                "algbw_gbps": pl.Float64,
                "busbw_gbps": pl.Float64,
            }
        )
    n = pl.col("group_size").fill_null(ranks_analysed)
    table = (
        nccl_ops.lazy()
        .with_columns(pl.col("collective").cast(pl.String))
        .with_columns((pl.col("end") - pl.col("start")).alias("dur"), n.cast(pl.Int32).alias("group_size"))
        .group_by(["rank", "collective", "msg_bytes", "group_size"])
        .agg(
            pl.len().alias("count"),
            pl.col("dur").sum().alias("total_ns"),
            pl.col("dur").median().alias("median_ns"),
            pl.col("dur").quantile(0.95, "nearest").cast(pl.Float64).alias("p95_ns"),
            pl.col("dur").min().alias("min_ns"),
        )
        .with_columns(
            # bytes / ns == GB/s; the median kernel gives the typical bandwidth.
            (pl.col("msg_bytes") / pl.col("median_ns")).alias("algbw_gbps"),
        )
        .with_columns(
            (pl.col("algbw_gbps") * bus_factor(pl.col("collective"), pl.col("group_size"))).alias("busbw_gbps")
        )
        .sort(["rank", "collective", "msg_bytes"], nulls_last=True)
    )
    return table.collect()
