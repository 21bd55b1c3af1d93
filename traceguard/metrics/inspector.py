"""Metrics from NCCL Inspector logs (docs/inspector.md): per rank and communicator, and across ranks.

Fed the reader's compact rows (traceguard.ingest.nccl_inspector, one row per operation per rank),
never the text. Times are integer ns (the plugin writes µs); bandwidths GB/s as the plugin writes
them (10⁹ bytes/s).

**Per rank, communicator and type** (``by_type``): count, Σ bytes, Σ execution time, the median and
p95 of the execution time and of the plugin's own bus bandwidth (``coll_busbw_gbs``: bytes ÷ that
rank's execution time, so it includes the time the rank waited for the others), and the median
bus bandwidth on transfer time of the matched instances (below).

**Across ranks** (the same contract as traceguard.metrics.waits, with no clock needed):

1. *Instance*: one collective call on one communicator: lines whose (communicator ``id``, ``coll``,
   ``coll_sn``) agree. It is *matched* when every member rank wrote its line (``n_ranks`` distinct
   ``header.rank``, one line each); the rest are counted as unmatched (a rank's file cut short, a
   ring-buffer overflow, lines below ``NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES``). Point-to-point
   operations are counted, not matched (their sequence numbers are per rank, not per pair).
2. *Split*: the members of a collective finish together, so the shortest execution time over the
   members is the *transfer* (the last rank to arrive waited for nobody) and each rank's
   ``wait`` = its execution time − transfer. ``nccl_wait_ns`` / ``nccl_transfer_ns`` sum them;
   ``nccl_wait_share`` = Σ wait ÷ Σ execution time.
3. *Arrival and the late rank*: inferred from the split (arrival = common end − execution time, so
   the rank with the shortest execution time arrived last) when every matched line's execution
   time is GPU-timed (``coll_timing_source`` ``kernel_gpu``), verbose or not. The verbose dump's
   per-channel ``kernel_start_ts`` is the host's wall clock when the plugin *saw* the channel
   start, not the GPU's: on the real 2×H200 runs (tests/fixtures/h200x2_inspector, h200x2_links)
   it trails or leads the GPU start by 10 µs typically and by up to ~350 µs, where the execution
   times agree with nsys's kernel durations to ~5 µs. So the kernel starts are the arrival only
   when the execution times are host-timed (``kernel_cpu`` / ``collective_cpu``); otherwise they
   are compared with the split (``arrival_check``: how often both name the same last rank, and
   how far their lateness differs). *Lateness* = arrival − the earliest member's arrival. The *last to arrive* is the
   member with the greatest lateness, unless every member arrived within :data:`TOGETHER_NS` (or
   :data:`TOGETHER_SHARE` of the transfer time, whichever is more) of the first: the µs resolution
   and launch jitter make smaller differences noise, and such an instance has no last rank.
   ``late_rank`` = the rank last to arrive most often (ties: the lowest rank). *Held up* by an
   instance's last rank = Σ of its members' waits (the execution time beyond the transfer); per
   rank ``held_up_ns`` sums it over its last arrivals, and ``late.longest_held_up_by`` names the
   rank that held the others up longest when it is not ``late_rank`` (``metrics.waits``). On the
   4-GPU late-rank run a rank 0.2–0.4 ms late at 55 of 69 all-reduces is last most often, while
   the slowed rank, 2–31 ms late at 12, held the others up 6× longer (bench/gpu/SWEEP.md).
4. *Bandwidth on transfer time*: per instance, the plugin's bus bandwidth rescaled to the transfer
   time (busbw × exec ÷ transfer = the bus bandwidth of the member that did not wait).
5. *Time windows* (the logs have no steps): instances grouped by :data:`WINDOW_S` windows of wall
   clock, by the first kernel start with verbose dumps, else by the line's dump timestamp
   (``dump_timestamp_us``: when the plugin wrote it, at most one dump interval after completion).
   ``lines`` counts the Inspector lines of a window's matched instances (what the service compares
   when a long job's logs are sent again as they grow).
   ``matched_steps`` (the ``collective_wait`` rule's evidence floor) is the number of windows that
   hold matched instances.

Nothing here says whether the waiting cost step time: the logs hold no compute, so
``exposed_wait_share`` is null with that reason (``collective_wait`` then judges a pass only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceguard.ingest.nccl_inspector import InspectorData
from traceguard.metrics.waits import longest_held_up_by

#: Arrival differences up to this (ns) are noise: the plugin's µs resolution and launch jitter.
TOGETHER_NS = 10_000
#: ... or up to this share of the instance's transfer time, whichever is more.
TOGETHER_SHARE = 0.02
#: arrival_check: instances whose last rank (by the split) is later than this (ns) are "clear".
CLEAR_NS = 50_000
#: Length of a time window (s).
WINDOW_S = 60
#: Collective types preferred for p2p_utilization (the rule's all-reduce); else the largest of any.
_ALLREDUCE = "AllReduce"

RUN_METRICS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "nccl_wait_share",
    "late_rank",
    "collective_instances_matched",
    "collective_instances_unmatched",
    "matched_steps",
)


@dataclass
class InspectorResult:
    """What the Inspector logs say (every field is in the report's ``inspector`` section)."""

    metrics: dict[str, Any] = field(default_factory=dict)
    null_reasons: dict[str, str] = field(default_factory=dict)
    #: Per rank: host, pid, lines, nccl_wait_ns, nccl_transfer_ns, nccl_wait_share, last_arrivals.
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    by_type: list[dict[str, Any]] = field(default_factory=list)
    #: Per communicator, type and message size: matched instances, transfer and its bus bandwidth.
    transfer: list[dict[str, Any]] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)
    late: dict[str, Any] | None = None
    prom: list[dict[str, Any]] = field(default_factory=list)
    files: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: How arrivals were found: "kernel start (verbose)" | "shortest execution time" | None.
    arrival_source: str | None = None
    #: Verbose lines with GPU-timed executions: the kernel starts' arrivals against the split's.
    arrival_check: dict[str, Any] | None = None
    window_s: int = WINDOW_S
    window_time: str | None = None


def _hex(comm: int | None) -> str | None:
    return None if comm is None else f"0x{comm:x}"


def with_ranks(data: InspectorData) -> pl.DataFrame:
    """The operations with the process's run ``rank`` (traceguard.ingest.nccl_inspector.process_ranks)."""
    ranks = data.ranks.select(pl.col("host").cast(pl.Categorical), "pid", "rank")
    # Join only the key columns and add the result as a column: joining the whole frame would copy
    # every column of every line.
    rank = data.ops.select("host", "pid").join(ranks, on=["host", "pid"], how="left", maintain_order="left")["rank"]
    return data.ops.with_columns(rank)


def analyse_inspector(
    data: InspectorData, *, window_s: int = WINDOW_S, peak_busbw_gbps: float | None = None
) -> InspectorResult:
    result = InspectorResult(window_s=window_s)
    result.files = [
        {
            "path": f.path,
            "kind": f.kind,
            "version": f.version,
            "lines": f.lines,
            "verbose": f.verbose,
            "partial_tail_bytes": f.partial_tail_bytes,
            "bad_lines": f.bad_lines,
            "processes": [{"host": h, "pid": p} for h, p in f.processes],
            "warnings": f.warnings,
            "error": f.error,
            "same_as": f.same_as,
        }
        for f in data.files
    ]
    repeats = sum(1 for f in data.files if f.same_as)
    if repeats:
        result.notes.append(
            f"{repeats} Prometheus snapshot(s) repeat the previous one of their GPU (copied before the plugin "
            "rewrote its file: it does so every 30 s at most) and were read once"
        )
    result.prom = data.prom.to_dicts() if data.prom.height else []
    ops = with_ranks(data)
    m, null = result.metrics, result.null_reasons
    m["inspector_lines"] = ops.height
    m["inspector_ranks"] = data.ranks.height
    if data.prom.height and not ops.height:
        result.notes.append(
            "Prometheus textfiles only: means per label set since the last dump, no sequence numbers, so no "
            "instance is matched across ranks and no wait is split off"
        )
    result.by_type = _by_type(ops)
    colls = ops.filter(~pl.col("p2p")) if ops["p2p"].any() else ops  # no copy when all are collectives
    if ops.height and colls.height < ops.height:
        result.notes.append(
            f"{ops.height - colls.height} point-to-point operation(s) are counted per rank but not matched "
            "(their sequence numbers are per rank, not per pair)"
        )
    if data.ranks.height < 2:
        _null(
            result,
            "needs at least two ranks' Inspector logs"
            if ops.height
            else "no Inspector JSON lines (Prometheus textfiles carry no sequence numbers to match)"
            if data.prom.height
            else "no Inspector JSON lines",
        )
        _utilization(result, None, peak_busbw_gbps)
        return result
    keys = ["comm_id", "coll", "coll_sn"]
    verbose = colls["start_us"].null_count() == 0
    gpu_timed = bool((colls["timing_source"].cast(pl.String) == "kernel_gpu").fill_null(False).all())
    starts = verbose and not gpu_timed
    result.arrival_source = "kernel start (verbose)" if starts else "shortest execution time"
    result.window_time = "first kernel start" if verbose else "dump timestamp"
    # Arrival: relative to a common end, −execution time; or the first kernel start (ns).
    colls = colls.select(
        *keys,
        "rank",
        "comm_rank",
        "n_ranks",
        "exec_ns",
        "msg_bytes",
        "busbw_gbps",
        ((pl.col("start_us") * 1000) if starts else -pl.col("exec_ns")).alias("arrival"),
        pl.col("start_us" if verbose else "dump_us").alias("at_us"),
        *([(pl.col("start_us") * 1000).alias("_start")] if verbose and not starts else []),
    )
    # One pass over the lines for every per-instance figure (one group-by, not a window per figure).
    instances = colls.group_by(keys).agg(
        pl.len().alias("_lines"),
        pl.col("comm_rank").n_unique().alias("_members"),
        pl.col("n_ranks").max(),
        pl.col("exec_ns").min().alias("transfer_ns"),
        pl.col("exec_ns").sum().alias("exec_sum_ns"),
        pl.col("msg_bytes").max(),
        pl.col("busbw_gbps").max().alias("busbw_transfer_gbps"),
        pl.col("arrival").min().alias("first_arrival"),
        pl.col("arrival").max().alias("last_arrival"),
        pl.col("rank").get(pl.col("arrival").arg_max()).alias("last_rank"),  # ties: has_last is false
        pl.col("at_us").min(),
    )
    complete = (pl.col("_lines") == pl.col("n_ranks")) & (pl.col("_members") == pl.col("n_ranks"))
    singles = instances.filter(pl.col("n_ranks") <= 1).height
    tolerance = pl.max_horizontal(pl.lit(TOGETHER_NS), (pl.col("transfer_ns") * TOGETHER_SHARE).cast(pl.Int64))
    matched = (
        instances.filter(complete & (pl.col("n_ranks") > 1))
        .drop("_lines", "_members")
        .with_columns(
            (pl.col("last_arrival") - pl.col("first_arrival") > tolerance).alias("has_last"),
            ((pl.col("at_us") // (window_s * 1_000_000)) * window_s).alias("window_start_s"),
        )
    )
    m["collective_instances_matched"] = matched.height
    m["collective_instances_unmatched"] = instances.height - matched.height - singles
    if matched.height == 0:
        _null(
            result,
            f"no collective was found on all of its ranks ({instances.height} instances by communicator "
            "id + coll_sn): are all ranks' files given?",
        )
        m["collective_instances_matched"] = 0
        m["collective_instances_unmatched"] = instances.height - singles
        null.pop("collective_instances_matched", None)
        null.pop("collective_instances_unmatched", None)
        _utilization(result, None, peak_busbw_gbps)
        return result
    calls = (
        colls.select(*keys, "rank", "exec_ns", "arrival")
        .join(matched.select(*keys, "transfer_ns", "first_arrival", "last_rank", "has_last"), on=keys, how="inner")
        .select(
            "rank",
            "exec_ns",
            "transfer_ns",
            (pl.col("exec_ns") - pl.col("transfer_ns")).alias("wait_ns"),
            (pl.col("arrival") - pl.col("first_arrival")).alias("lateness_ns"),
            (pl.col("has_last") & (pl.col("last_rank") == pl.col("rank"))).alias("last_arrival"),
        )
    )
    _split(result, calls, data)
    if verbose and not starts:
        _arrival_check(result, colls, matched, keys)
    _windows(result, matched)
    _transfer_table(result, matched, colls)
    _late(result, matched)
    _utilization(result, matched, peak_busbw_gbps)
    null["exposed_wait_share"] = (
        "NCCL Inspector logs hold only NCCL's operations, not the compute beside them: whether the waiting "
        "cost step time is unknown"
    )
    return result


def _by_type(ops: pl.DataFrame) -> list[dict[str, Any]]:
    if ops.height == 0:
        return []
    table = (
        ops.group_by("rank", "comm_id", "coll", "p2p")
        .agg(
            pl.col("host").first(),
            pl.col("pid").first(),
            pl.col("comm_name").first(),
            pl.col("comm_rank").first(),
            pl.col("n_ranks").first(),
            pl.len().alias("count"),
            pl.col("msg_bytes").sum().alias("bytes"),
            pl.col("exec_ns").sum().alias("exec_ns"),
            pl.col("exec_ns").median().alias("exec_median_ns"),
            pl.col("exec_ns").quantile(0.95, "nearest").alias("exec_p95_ns"),
            pl.col("busbw_gbps").median().alias("busbw_median_gbps"),
            pl.col("busbw_gbps").quantile(0.95, "nearest").alias("busbw_p95_gbps"),
            pl.col("timing_source").cast(pl.String).drop_nulls().unique().sort().alias("timing_sources"),
        )
        .sort("rank", "comm_id", "coll")
        .with_columns(pl.col("host", "comm_name", "coll").cast(pl.String))
    )
    rows = table.to_dicts()
    for row in rows:
        row["comm_id"] = _hex(row["comm_id"])
    return rows


def _split(result: InspectorResult, calls: pl.DataFrame, data: InspectorData) -> None:
    m = result.metrics
    who = {int(r): (str(h), int(p)) for h, p, r in data.ranks.select("host", "pid", "rank").iter_rows()}
    per_rank = calls.group_by("rank").agg(
        pl.col("wait_ns").sum(),
        pl.col("transfer_ns").sum(),
        pl.col("exec_ns").sum(),
        pl.len().alias("matched"),
        pl.col("last_arrival").sum().alias("last"),
        pl.col("lateness_ns").filter(pl.col("last_arrival")).median().alias("median_late_ns"),
        pl.col("lateness_ns").filter(pl.col("last_arrival")).quantile(0.95, "nearest").alias("p95_late_ns"),
    )
    rows = []
    for row in per_rank.sort("rank").iter_rows(named=True):
        host, pid = who.get(row["rank"], (None, None))
        rows.append(
            {
                "rank": row["rank"],
                "host": host,
                "pid": pid,
                "collective_instances_matched": row["matched"],
                "nccl_wait_ns": int(row["wait_ns"]),
                "nccl_transfer_ns": int(row["transfer_ns"]),
                "nccl_wait_share": row["wait_ns"] / row["exec_ns"] if row["exec_ns"] else None,
                "last_arrivals": {
                    "count": int(row["last"]),
                    "of": int(row["matched"]),
                    "median_late_ns": row["median_late_ns"],
                    "p95_late_ns": None if row["p95_late_ns"] is None else float(row["p95_late_ns"]),
                },
            }
        )
    result.per_rank = rows
    wait = sum(r["nccl_wait_ns"] for r in rows)
    transfer = sum(r["nccl_transfer_ns"] for r in rows)
    m["nccl_wait_ns"] = wait
    m["nccl_transfer_ns"] = transfer
    m["nccl_wait_share"] = wait / (wait + transfer) if wait + transfer else None
    if m["nccl_wait_share"] is None:
        result.null_reasons["nccl_wait_share"] = "the matched collectives took no execution time"


def _arrival_check(result: InspectorResult, colls: pl.DataFrame, matched: pl.DataFrame, keys: list[str]) -> None:
    """The verbose kernel starts against the split, on the matched instances: per instance, whether
    both name the same last rank (or none, by the same tolerance), and per member the difference of
    its lateness by kernel start and by execution time."""
    tolerance = pl.max_horizontal(pl.lit(TOGETHER_NS), (pl.col("transfer_ns") * TOGETHER_SHARE).cast(pl.Int64))
    rows = colls.select(*keys, "rank", "arrival", "_start").join(
        matched.select(*keys, "transfer_ns", "first_arrival", "last_rank", "has_last"), on=keys, how="inner"
    )
    rows = rows.with_columns(
        (pl.col("arrival") - pl.col("first_arrival")).alias("_late_split"),
        (pl.col("_start") - pl.col("_start").min().over(keys)).alias("_late_start"),
    )
    per = rows.group_by(keys).agg(
        pl.col("last_rank").first(),
        pl.col("has_last").first(),
        pl.col("rank").get(pl.col("_start").arg_max()).alias("_last_start"),
        (pl.col("_late_start").max() > tolerance.first()).alias("_has_start"),
    )
    same = (pl.col("has_last") == pl.col("_has_start")) & (
        ~pl.col("has_last") | (pl.col("last_rank") == pl.col("_last_start"))
    )
    agree = int(per.select(same.sum()).item())
    # Instances where the split's last rank is clearly last: the host-observed starts agree there.
    clear = matched.filter(pl.col("last_arrival") - pl.col("first_arrival") > CLEAR_NS).select(keys)
    clear_per = per.join(clear, on=keys, how="semi")
    diff = (rows["_late_start"] - rows["_late_split"]).abs()
    result.arrival_check = {
        "instances": per.height,
        "same_last_rank": agree,
        "different_last_rank": per.height - agree,
        "clear_instances": clear_per.height,
        "clear_same_last_rank": int(clear_per.select(same.sum()).item()),
        "lateness_diff_median_ns": float(diff.median()),  # type: ignore[arg-type]
        "lateness_diff_p95_ns": float(diff.quantile(0.95, "nearest")),  # type: ignore[arg-type]
        "lateness_diff_max_ns": int(diff.max()),  # type: ignore[arg-type]
        "from": "kernel_start_ts (host wall clock when the plugin saw the first channel start) against the split",
    }


def _windows(result: InspectorResult, matched: pl.DataFrame) -> None:
    table = (
        matched.group_by("window_start_s")
        .agg(
            pl.len().alias("instances"),
            pl.col("n_ranks").sum().alias("lines"),  # the Inspector lines of its matched instances
            (pl.col("exec_sum_ns") - pl.col("n_ranks") * pl.col("transfer_ns")).sum().alias("wait_ns"),
            (pl.col("n_ranks") * pl.col("transfer_ns")).sum().alias("transfer_ns"),
            pl.col("exec_sum_ns").sum().alias("exec_ns"),
            (pl.col("n_ranks") * pl.col("msg_bytes")).sum().alias("bytes"),
            pl.col("last_rank").filter(pl.col("has_last")).mode().min().alias("late_rank"),
            pl.col("has_last").sum().alias("last_arrivals"),
            pl.col("busbw_transfer_gbps").median().alias("busbw_transfer_median_gbps"),
        )
        .sort("window_start_s")
        .with_columns((pl.col("wait_ns") / pl.col("exec_ns")).alias("nccl_wait_share"))
    )
    result.windows = table.to_dicts()
    result.metrics["matched_steps"] = table.height


def _transfer_table(result: InspectorResult, matched: pl.DataFrame, colls: pl.DataFrame) -> None:
    table = (
        matched.group_by("comm_id", "coll", "n_ranks", "msg_bytes")
        .agg(
            pl.len().alias("instances"),
            pl.col("transfer_ns").median().alias("transfer_median_ns"),
            pl.col("transfer_ns").quantile(0.95, "nearest").alias("transfer_p95_ns"),
            pl.col("busbw_transfer_gbps").median().alias("busbw_transfer_median_gbps"),
            pl.col("busbw_transfer_gbps").quantile(0.05, "nearest").alias("busbw_transfer_p5_gbps"),
        )
        .join(
            colls.group_by("comm_id", "coll", "msg_bytes").agg(
                pl.col("busbw_gbps").median().alias("busbw_reported_median_gbps")
            ),
            on=["comm_id", "coll", "msg_bytes"],
            how="left",
        )
        .sort("comm_id", "coll", "msg_bytes")
        .with_columns(pl.col("coll").cast(pl.String))
    )
    rows = table.to_dicts()
    for row in rows:
        row["comm_id"] = _hex(row["comm_id"])
    result.transfer = rows


def _late(result: InspectorResult, matched: pl.DataFrame) -> None:
    m, null = result.metrics, result.null_reasons
    counts = {row["rank"]: row["last_arrivals"]["count"] for row in result.per_rank}
    top = max(counts.values(), default=0)
    if top == 0:
        m["late_rank"] = None
        null["late_rank"] = (
            "every matched collective's members arrived together (within "
            f"{TOGETHER_NS / 1e3:.0f} µs or {TOGETHER_SHARE:.0%} of its transfer time)"
        )
        return
    late = min(r for r, n in counts.items() if n == top)
    m["late_rank"] = late
    row = next(r for r in result.per_rank if r["rank"] == late)
    with_last = int(matched["has_last"].sum())
    held = dict(
        matched.filter(pl.col("has_last"))
        .group_by("last_rank")
        .agg((pl.col("exec_sum_ns") - pl.col("n_ranks") * pl.col("transfer_ns")).sum())
        .iter_rows()
    )
    total = sum(held.values())
    for rank_row in result.per_rank:
        rank_row["last_arrivals"]["held_up_ns"] = int(held.get(rank_row["rank"], 0))
        rank_row["last_arrivals"]["held_up_share"] = held.get(rank_row["rank"], 0) / total if total else None
    result.late = {
        "rank": late,
        "host": row["host"],
        "pid": row["pid"],
        "last_arrivals": top,
        "of": with_last,
        "share": top / with_last if with_last else None,
        "median_late_ns": row["last_arrivals"]["median_late_ns"],
        "p95_late_ns": row["last_arrivals"]["p95_late_ns"],
        "arrival_source": result.arrival_source,
        "instances_together": m["collective_instances_matched"] - with_last,
        "held_up_ns": row["last_arrivals"]["held_up_ns"],
        "held_up_share": row["last_arrivals"]["held_up_share"],
        "longest_held_up_by": longest_held_up_by(late, {r["rank"]: r["last_arrivals"] for r in result.per_rank}),
    }


def _utilization(result: InspectorResult, matched: pl.DataFrame | None, peak_gbps: float | None) -> None:
    """p2p_utilization from production traffic: the bus bandwidth on transfer time (median over the
    instances) of the largest all-reduce, or of the largest collective of any type when there is no
    all-reduce (FSDP: all-gather / reduce-scatter), ÷ the expected peak."""
    m, null = result.metrics, result.null_reasons
    for key in ("p2p_utilization", "allreduce_largest_bytes", "allreduce_peak_busbw_gbps"):
        m[key] = None
    if matched is None or matched.height == 0:
        for key in ("p2p_utilization", "allreduce_largest_bytes", "allreduce_peak_busbw_gbps"):
            null[key] = "no collective of the Inspector logs was matched on all of its ranks"
        return
    pool = matched.filter(pl.col("coll") == _ALLREDUCE)
    if pool.height == 0:
        pool = matched
    largest = int(pool["msg_bytes"].max())  # type: ignore[arg-type]
    rows = pool.filter(pl.col("msg_bytes") == largest)
    busbw = float(rows["busbw_transfer_gbps"].median())  # type: ignore[arg-type]
    coll = str(rows["coll"].cast(pl.String).mode().sort()[0])
    m["allreduce_largest_bytes"] = largest
    m["allreduce_peak_busbw_gbps"] = busbw
    result.metrics["utilization_collective"] = coll
    if not peak_gbps:
        null["p2p_utilization"] = "no expected peak: give the NCCL log (GRAPH maxBw) or set peak_busbw_gbps"
        return
    m["p2p_utilization"] = busbw / peak_gbps
    result.metrics["utilization_evidence"] = {
        "collective": coll,
        "size_bytes": largest,
        "instances": rows.height,
        "busbw_gbps": busbw,
        "expected_gbps": peak_gbps,
        "from": "NCCL Inspector, bus bandwidth on transfer time (median over the instances)",
    }


def _null(result: InspectorResult, reason: str) -> None:
    for key in RUN_METRICS:
        result.metrics[key] = None
        result.null_reasons[key] = reason
    result.null_reasons["exposed_wait_share"] = reason
