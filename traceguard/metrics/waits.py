"""Who waits for whom: the ranks on one clock, each collective split into waiting and transfer
(the reduce over ranks; DESIGN.md, "Across ranks: one clock, wait and transfer"; docs/collectives.md).

Fed only each rank's collective instances (traceguard.metrics.arrivals, a few columns per call) and
its clock base, never its events.

1. **One clock.** Each rank's times become wall-clock ns: its capture's base (nsys session start
   ``utcEpochNs``, Kineto ``baseTimeNanoseconds``) plus the event time. That is refined from the
   data: the members of one collective finish together (ring and tree kernels end within
   microseconds on every rank), so each rank's *offset* is the median, over its matched
   instances, of (the already-aligned ranks' end − its own end). The first rank is the reference
   (offset 0); ranks are aligned pass by pass through the instances they share. Each rank's
   *residual* is the median |its aligned end − the mean aligned end of the other members|. A
   residual above :data:`RESIDUAL_LIMIT_NS`, or fewer than :data:`MIN_MATCHED` matched instances,
   means the clocks cannot be trusted: the split is then null, with the reason. CPU collectives
   (gloo calls) do not end together, so their clocks stay on the base (same host: one clock).
2. **Matching.** An instance is one call of a collective kind (point-to-point: of one rank pair)
   on one rank. When every rank's steps come from markers (``pattern``/``convention``: the same
   index on every rank), instances match on (kind, pair, step, order within the step); otherwise on
   (kind, pair, order in the window), each rank's order shifted by the few calls (at most
   :data:`MAX_SHIFT`) that best line up the ends (windows cut a call on one rank and not on
   another). Only instances that every member rank holds are matched (the members of a kind: every
   rank that has it; of a pair: the two ranks); the rest are counted as unmatched.
3. **Split.** Per matched instance and rank: *arrival* = kernel start; *last arrival* = the latest
   member's; ``wait`` = last arrival − arrival (at most the kernel's duration); ``transfer`` = the
   rest of the kernel. Of the kernel's exposed time (no compute beside it), the part before the
   last arrival is *exposed wait*: exact when the rank's compute beside the kernel ended before the
   last arrival (``covered_until``; the usual case), otherwise the exposed time before that point
   is taken as lying last (compute overlaps a collective's start) and the instance is counted as
   ``estimated``.
4. **Late rank.** Per matched instance the member with the latest arrival is the *last to arrive*;
   how late = its arrival − the earliest member's (the longest wait it imposed). ``late_rank`` is
   the rank last most often. *Lateness* of a rank in an instance = its arrival − the earliest
   arrival; per step, the median over the step's instances (the rank × step lateness chart).
   *Held up* by the last rank of an instance = Σ over the members of (last arrival − their
   arrival): the member-time spent waiting for it. Per rank, ``held_up_ns`` sums it over its last
   arrivals; ``held_up_share`` divides by the run's total. The rank last most often is not always
   the costliest: a rank a few hundred µs late in most calls is "last" more often than one 30 ms
   late in a few (the 4-GPU late-rank run, bench/gpu/SWEEP.md); when another rank held the others
   up longest, ``late.longest_held_up_by`` names it (:func:`longest_held_up_by`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceguard.metrics.arrivals import POINT_TO_POINT

#: Above this median residual (ns) of matched ends the ranks' clocks are not trusted for the split.
RESIDUAL_LIMIT_NS = 100_000
#: Matched instances a rank needs before its clock offset (and so the split) is trusted.
MIN_MATCHED = 3
#: Calls by which one rank's window may start earlier or later than another's (order matching).
MAX_SHIFT = 4
#: Matched calls a rank's wait / transfer lane draws one by one (the timeline's segment budget).
LANE_CALLS = 1500
#: Event times this large are wall-clock already (old Kineto traces write µs since the epoch).
_EPOCH_SCALE_NS = 10**17
MARKER_SOURCES = frozenset({"pattern", "convention"})


@dataclass
class RankClock:
    """What the reduce needs of one rank besides its instances."""

    rank: int
    base_ns: int | None
    source: str | None
    host: str | None
    step_source: str | None


@dataclass
class WaitResult:
    """The reduce's answer (every field is in the JSON report; docs/report.schema.json)."""

    #: ``run.clock_alignment``.
    clock_alignment: dict[str, Any]
    #: Per rank: nccl_wait_ns, nccl_transfer_ns, nccl_wait_share, last_arrivals, matched/unmatched.
    per_rank: dict[int, dict[str, Any]] = field(default_factory=dict)
    #: Per rank and step index: nccl_wait_ns, nccl_transfer_ns, comm_wait_ns, comm_transfer_ns, lateness_ns.
    per_step: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    #: Run metrics: nccl_wait_ns, nccl_transfer_ns, nccl_wait_share, late_rank, matched and unmatched
    #: instances, arrival_spread.
    metrics: dict[str, Any] = field(default_factory=dict)
    null_reasons: dict[str, str] = field(default_factory=dict)
    #: The late rank in detail (None when there is none): rank, last_arrivals, of, median/p95 late_ns,
    #: phases it launched its late calls from, its idle-waiting-for-host per step.
    late: dict[str, Any] | None = None
    #: Per (rank, kind, bytes): median transfer ns of matched instances (for bandwidth).
    transfer_medians: pl.DataFrame | None = None
    #: Per step index: the latest rank's median lateness (for the straggler rule).
    arrival_steps: list[dict[str, Any]] = field(default_factory=list)
    #: Per rank, its matched calls for the timeline, on its own clock: {"start", "split", "end"}
    #: (split = start + wait), or {"null_reason"} when there are more than :data:`LANE_CALLS`.
    lanes: dict[int, dict[str, Any]] = field(default_factory=dict)


#: Rank metrics the reduce fills (null with a reason when it cannot).
RANK_METRICS = ("nccl_wait_ns", "nccl_transfer_ns", "nccl_wait_share", "collective_instances_matched")
RUN_METRICS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "nccl_wait_share",
    "late_rank",
    "collective_instances_matched",
    "collective_instances_unmatched",
    "arrival_spread",
    "matched_steps",
)


def reduce_waits(instances: Sequence[tuple[RankClock, pl.DataFrame]]) -> WaitResult:
    """The cross-rank split (module docstring) from each rank's clock and instances."""
    ranks = [clock.rank for clock, _ in instances]
    result = WaitResult(clock_alignment=_alignment_stub(instances))
    if len(ranks) < 2:
        return _all_null(result, ranks, "needs at least two ranks")
    frames = [frame.with_columns(pl.lit(clock.rank, dtype=pl.Int32).alias("rank")) for clock, frame in instances]
    every = pl.concat([f for f in frames if f.height], how="vertical") if any(f.height for f in frames) else None
    if every is None:
        return _all_null(
            result,
            ranks,
            "no rank has a collective call in its analysis window (on a CPU capture the calls are c10d's ranges, "
            "`gloo:all_reduce` ...: torch.profiler records them, nsys without GPU activity does not)",
        )
    cpu = every["exposed_ns"].null_count() == every.height
    bases = {clock.rank: _base_of(clock, frame) for clock, frame in instances}
    every = every.with_columns(
        (pl.col("start") + pl.col("rank").replace_strict(bases, return_dtype=pl.Int64)).alias("at_start"),
        (pl.col("end") + pl.col("rank").replace_strict(bases, return_dtype=pl.Int64)).alias("at_end"),
        (pl.col("covered_until") + pl.col("rank").replace_strict(bases, return_dtype=pl.Int64)).alias("at_until"),
        *_pair_columns(),
    )
    # Wall-clock ns are ~1.8e18: a float median of them is off by up to 256 ns. Times from the
    # run's first arrival are exact in float64 (below 2^53 ns, 104 days).
    origin = int(every["at_start"].min())  # type: ignore[arg-type]
    # Only what the matching and the split read, the repeated texts as categories: at 1,024 ranks
    # × 10 k calls every byte a row is 10 MB, and the joins below copy the frame a few times.
    every = every.select(
        pl.col("kind").cast(pl.Categorical),
        "peer",
        "step",
        "seq",
        "rank",
        "exposed_ns",
        "bytes",
        pl.col("phase").cast(pl.Categorical),
        "lo",
        "hi",
        pl.col("start").alias("own_start"),  # the rank's own clock: what its timeline lanes are on
        *(pl.col(c) - origin for c in ("at_start", "at_end", "at_until")),
    )
    by_step = all(c.step_source in MARKER_SOURCES for c, _ in instances) and every["step"].null_count() == 0
    if not by_step:
        every = _order_keys(every, cpu=cpu)
    keys = ["kind", "lo", "hi", "step", "seq"] if by_step else ["kind", "lo", "hi", "order"]
    every = _complete(every, keys)
    matched = every.filter(pl.col("complete"))
    unmatched = every.height - matched.height
    result.metrics["collective_instances_matched"] = (
        matched.select(pl.struct(keys).n_unique()).item() if matched.height else 0
    )
    result.metrics["collective_instances_unmatched"] = unmatched
    matching = "step, then order within the step" if by_step else "order in the window (shift-aligned)"
    if matched.height == 0:
        return _all_null(
            result,
            ranks,
            f"no collective call was matched on all of its ranks ({every.height} calls, matched by kind and "
            f"{matching}): the ranks' windows share no collective",
            unmatched=unmatched,
        )
    offsets, residuals, counts = ({r: 0 for r in ranks}, {}, {}) if cpu else _align(matched, keys, ranks)
    aligned = matched.with_columns(
        *(
            (pl.col(c) + pl.col("rank").replace_strict(offsets, default=0, return_dtype=pl.Int64)).alias(c)
            for c in ("at_start", "at_end", "at_until")
        )
    )
    if not cpu:
        residuals, counts = _residuals(aligned, keys)
    trust, why = _trusted(instances, residuals, counts, cpu=cpu)
    result.clock_alignment = _alignment(instances, bases, offsets, residuals, counts, cpu=cpu, trusted=trust, why=why)
    result.clock_alignment["matching"] = matching
    aligned = _arrivals(aligned, keys)
    _lateness(result, aligned, ranks)
    if not trust:
        # Arrivals on clocks that do not agree say nothing: no lateness, no late rank either.
        _null_split(result, ranks, str(why))
        result.late = None
        result.arrival_steps = []
        result.per_step = {}
        result.metrics["late_rank"] = None
        result.null_reasons["late_rank"] = str(why)
        for rank in ranks:
            result.per_rank[rank]["last_arrivals"] = None
        return result
    if cpu:
        reason = (
            "CPU collective calls (gloo): a call's return is not the collective's completion, so waiting and "
            "transfer cannot be told apart; the arrival lateness and the late rank are reported"
        )
        _null_split(result, ranks, reason)
        return result
    _split(result, aligned, ranks)
    return result


def _base_of(clock: RankClock, frame: pl.DataFrame) -> int:
    """The rank's clock base, unless its times are already wall-clock (or it has none)."""
    if clock.base_ns is None:
        return 0
    if frame.height and (frame["start"].max() or 0) > _EPOCH_SCALE_NS:  # type: ignore[operator]
        return 0
    return int(clock.base_ns)


def _pair_columns() -> list[pl.Expr]:
    """``lo``/``hi``: the rank pair of a point-to-point call whose peer is known, else null."""
    p2p = pl.col("kind").is_in(list(POINT_TO_POINT)) & pl.col("peer").is_not_null()
    rank = pl.col("rank").cast(pl.Int32)
    return [
        pl.when(p2p).then(pl.min_horizontal(rank, pl.col("peer"))).otherwise(None).alias("lo"),
        pl.when(p2p).then(pl.max_horizontal(rank, pl.col("peer"))).otherwise(None).alias("hi"),
    ]


def _order_keys(every: pl.DataFrame, *, cpu: bool) -> pl.DataFrame:
    """``order``: each call's position among its rank's calls of its kind and pair, shifted per rank
    so that the calls line up with the first rank's (the shift whose matched ends spread least;
    on CPU captures, whose calls do not end together, no shift)."""
    every = every.sort(["rank", "at_start"]).with_columns(
        pl.int_range(pl.len()).over(["rank", "kind", "lo", "hi"]).cast(pl.Int64).alias("order")
    )
    if cpu:
        return every
    shifts: dict[tuple[Any, ...], int] = {}
    for (kind, lo, hi), group in every.group_by(["kind", "lo", "hi"], maintain_order=True):
        by_rank = group.select("rank", "at_end").partition_by("rank", as_dict=True, include_key=False)
        ranks = sorted(key[0] for key in by_rank)
        reference = by_rank[(ranks[0],)]["at_end"].to_numpy()
        for rank in ranks[1:]:
            shifts[(kind, lo, hi, rank)] = _best_shift(reference, by_rank[(rank,)]["at_end"].to_numpy())
    if not shifts:
        return every
    table = pl.DataFrame(
        [(*k, v) for k, v in shifts.items()],
        schema={"kind": pl.String, "lo": pl.Int32, "hi": pl.Int32, "rank": pl.Int32, "shift": pl.Int64},
        orient="row",
    ).with_columns(pl.col("kind").cast(every.schema["kind"]))
    every = every.join(table, on=["kind", "lo", "hi", "rank"], how="left", nulls_equal=True, maintain_order="left")
    return every.with_columns((pl.col("order") - pl.col("shift").fill_null(0)).alias("order")).drop("shift")


def _best_shift(reference: np.ndarray, own: np.ndarray) -> int:
    """The shift d (own call i + d ↔ reference call i) whose end differences spread least; among
    those within 2× of the least spread, the one with the smallest offset (a periodic loop lines
    up one step late too: the base clocks are right to milliseconds, a step is longer)."""
    scored: list[tuple[float, float, int]] = []
    for shift in range(-MAX_SHIFT, MAX_SHIFT + 1):
        lo = max(0, -shift)
        hi = min(reference.size, own.size - shift)
        if hi - lo < min(MIN_MATCHED, reference.size, own.size) or hi <= lo:
            continue
        diff = reference[lo:hi] - own[lo + shift : hi + shift]
        offset = float(np.median(diff))
        scored.append((float(np.median(np.abs(diff - offset))), abs(offset), shift))
    if not scored:
        return 0
    best = min(s[0] for s in scored)
    return min((s for s in scored if s[0] <= 2 * best + 1_000), key=lambda s: (s[1], abs(s[2])))[2]


def _complete(every: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """``complete``: the call is held by every member rank of its kind (pair) and by one call each."""
    members = every.group_by(["kind", "lo", "hi"]).agg(pl.col("rank").n_unique().alias("_members"))
    held = every.group_by(keys).agg(pl.col("rank").n_unique().alias("_held"), pl.len().alias("_calls"))
    every = every.join(members, on=["kind", "lo", "hi"], how="left", nulls_equal=True)
    every = every.join(held, on=keys, how="left", nulls_equal=True)
    complete = (
        (pl.col("_held") == pl.col("_members")) & (pl.col("_calls") == pl.col("_members")) & (pl.col("_members") > 1)
    )
    return every.with_columns(complete.alias("complete")).drop("_members", "_held", "_calls")


def _align(
    matched: pl.DataFrame, keys: list[str], ranks: list[int]
) -> tuple[dict[int, int], dict[int, int], dict[int, int]]:
    """Per rank the offset that lines up its ends with the aligned ranks' (module docstring, 1)."""
    offsets: dict[int, int] = {min(ranks): 0}
    ends = matched.select(*keys, "rank", "at_end")
    for _ in range(len(ranks)):
        anchor = (
            ends.filter(pl.col("rank").is_in(list(offsets)))
            .with_columns(pl.col("at_end") + pl.col("rank").replace_strict(offsets, return_dtype=pl.Int64))
            .group_by(keys)
            .agg(pl.col("at_end").median().alias("_anchor"))
        )
        todo = ends.filter(~pl.col("rank").is_in(list(offsets))).join(anchor, on=keys, nulls_equal=True)
        if todo.height == 0:
            break
        found = todo.group_by("rank").agg((pl.col("_anchor") - pl.col("at_end")).median().alias("offset"))
        for rank, offset in found.iter_rows():
            offsets[int(rank)] = round(offset)
    return offsets, {}, {}


def _residuals(aligned: pl.DataFrame, keys: list[str]) -> tuple[dict[int, int], dict[int, int]]:
    """Per rank: the median |aligned end − mean of the other members' aligned ends|, and how many."""
    stats = aligned.with_columns(
        pl.col("at_end").sum().over(keys).alias("_sum"), pl.len().over(keys).alias("_n")
    ).with_columns(
        (pl.col("at_end") - (pl.col("_sum") - pl.col("at_end")) / (pl.col("_n") - 1)).abs().alias("_residual")
    )
    table = stats.group_by("rank").agg(pl.col("_residual").median(), pl.len().alias("_count"))
    residuals = {int(r): round(v) for r, v, _ in table.iter_rows()}
    counts = {int(r): int(n) for r, _, n in table.iter_rows()}
    return residuals, counts


def _trusted(
    instances: Sequence[tuple[RankClock, pl.DataFrame]], residuals: dict[int, int], counts: dict[int, int], *, cpu: bool
) -> tuple[bool, str | None]:
    clocks = [c for c, _ in instances]
    if cpu:
        hosts = {c.host for c in clocks}
        if any(c.base_ns is None for c in clocks):
            return False, "a rank's capture has no clock base (session start), and CPU calls cannot refine it"
        if len(hosts) > 1 or None in hosts:
            return False, "the ranks ran on different (or unnamed) hosts and CPU calls cannot refine their clocks"
        return True, None
    few = sorted(r for r, n in counts.items() if n < MIN_MATCHED)
    unaligned = sorted(c.rank for c in clocks if c.rank not in counts)
    if unaligned:
        return False, f"rank(s) {', '.join(map(str, unaligned))} share no matched collective with the others"
    if few:
        return (
            False,
            f"rank(s) {', '.join(map(str, few))} have fewer than {MIN_MATCHED} matched collectives to check the clocks",
        )
    loose = sorted(r for r, v in residuals.items() if v > RESIDUAL_LIMIT_NS)
    if loose:
        worst = max(residuals[r] for r in loose)
        return False, (
            f"the matched collectives' ends disagree by up to {worst / 1e3:.0f} µs (median, rank(s) "
            f"{', '.join(map(str, loose))}) after alignment, above {RESIDUAL_LIMIT_NS / 1e3:.0f} µs: the calls "
            "may be matched wrongly or the clocks drift, so waiting and transfer are not split"
        )
    return True, None


def _alignment_stub(instances: Sequence[tuple[RankClock, pl.DataFrame]]) -> dict[str, Any]:
    return {
        "method": None,
        "reference_rank": None,
        "trusted": False,
        "reason": None,
        "residual_limit_ns": RESIDUAL_LIMIT_NS,
        "ranks": [
            {
                "rank": c.rank,
                "base_source": c.source,
                "base_ns": c.base_ns,
                "offset_ns": None,
                "residual_ns": None,
                "matched": 0,
            }
            for c, _ in instances
        ],
    }


def _alignment(
    instances: Sequence[tuple[RankClock, pl.DataFrame]],
    bases: dict[int, int],
    offsets: dict[int, int],
    residuals: dict[int, int],
    counts: dict[int, int],
    *,
    cpu: bool,
    trusted: bool,
    why: str | None,
) -> dict[str, Any]:
    clocks = [c for c, _ in instances]
    has_base = all(bases[c.rank] or c.base_ns for c in clocks)
    if cpu:
        method = "capture clock base only (CPU collective calls do not end together)"
    elif has_base:
        method = "capture clock base, refined by the ends of matched collectives"
    else:
        method = "ends of matched collectives (no clock base in the captures)"
    return {
        "method": method,
        "reference_rank": min(c.rank for c in clocks),
        "trusted": trusted,
        "reason": why,
        "residual_limit_ns": RESIDUAL_LIMIT_NS,
        "ranks": [
            {
                "rank": c.rank,
                "base_source": c.source,
                "base_ns": c.base_ns,
                "offset_ns": offsets.get(c.rank),
                "residual_ns": residuals.get(c.rank),
                "matched": counts.get(c.rank, 0),
            }
            for c in clocks
        ],
    }


def _arrivals(aligned: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per matched call and rank: the first and last arrival of its instance and who was last."""
    last = pl.col("at_start").max().over(keys)
    return aligned.with_columns(
        last.alias("last_arrival"),
        pl.col("at_start").min().over(keys).alias("first_arrival"),
        pl.col("rank").sort_by("at_start").last().over(keys).alias("last_rank"),
        pl.struct(keys).rank("dense").alias("instance"),
    )


def _lateness(result: WaitResult, aligned: pl.DataFrame, ranks: list[int]) -> None:
    """Last arrivals per rank, the late rank, and the lateness per rank and step."""
    aligned = aligned.with_columns((pl.col("at_start") - pl.col("first_arrival")).alias("lateness_ns"))
    lasts = aligned.filter(pl.col("rank") == pl.col("last_rank"))
    instances = lasts.height
    held_up = dict(
        aligned.group_by("instance")
        .agg(pl.col("last_rank").first(), (pl.col("last_arrival") - pl.col("at_start")).sum().alias("held"))
        .group_by("last_rank")
        .agg(pl.col("held").sum())
        .iter_rows()
    )
    held_total = sum(held_up.values())
    # Per rank in one pass each (a loop of filters would read every rank's calls once per rank).
    held = dict(aligned.group_by("rank").len().iter_rows())
    stats = {
        rank: (count, median, p95)
        for rank, count, median, p95 in lasts.group_by("rank")
        .agg(
            pl.len(),
            pl.col("lateness_ns").median().alias("median"),
            pl.col("lateness_ns").quantile(0.95, "nearest").cast(pl.Float64).alias("p95"),
        )
        .iter_rows()
    }
    for rank in ranks:
        count, median, p95 = stats.get(rank, (0, None, None))
        result.per_rank.setdefault(rank, {})["last_arrivals"] = {
            "count": int(count),
            "of": int(held.get(rank, 0)),
            "median_late_ns": None if median is None else float(median),
            "p95_late_ns": None if p95 is None else float(p95),
            "held_up_ns": int(held_up.get(rank, 0)),
            "held_up_share": held_up.get(rank, 0) / held_total if held_total else None,
        }
        result.per_rank[rank]["collective_instances_matched"] = int(held.get(rank, 0))
    steps = aligned.filter(pl.col("step").is_not_null()).group_by(["rank", "step"]).agg(pl.col("lateness_ns").median())
    for rank, step, late in steps.iter_rows():
        result.per_step.setdefault(int(rank), {}).setdefault(int(step), {})["lateness_ns"] = float(late)
    counts = {r: result.per_rank[r]["last_arrivals"]["count"] for r in ranks}
    top = max(counts.values())
    if top == 0:
        result.metrics["late_rank"] = None
        result.null_reasons["late_rank"] = "every matched collective's members arrived together"
        return
    late_rank = min(r for r, n in counts.items() if n == top)
    result.metrics["late_rank"] = late_rank
    own = lasts.filter(pl.col("rank") == late_rank)
    # Most calls first; a tie by name (a group-by's order is arbitrary: the report must not vary).
    phases = (
        own.filter(pl.col("phase").is_not_null())
        .group_by("phase")
        .len()
        .sort(["len", "phase"], descending=[True, False])
    )
    result.late = {
        "rank": late_rank,
        "last_arrivals": top,
        "of": instances,
        "share": top / instances if instances else None,
        "median_late_ns": result.per_rank[late_rank]["last_arrivals"]["median_late_ns"],
        "p95_late_ns": result.per_rank[late_rank]["last_arrivals"]["p95_late_ns"],
        "steps_late": sorted({int(s) for s in own["step"].drop_nulls().to_list()}),
        "launched_in": [{"phase": p, "calls": int(n)} for p, n in phases.iter_rows()][:3],
        "held_up_ns": result.per_rank[late_rank]["last_arrivals"]["held_up_ns"],
        "held_up_share": result.per_rank[late_rank]["last_arrivals"]["held_up_share"],
        "longest_held_up_by": longest_held_up_by(late_rank, {r: result.per_rank[r]["last_arrivals"] for r in ranks}),
    }
    # Per step: the latest rank's median lateness (what the straggler rule judges besides spans);
    # ranks in order, so a tie goes to the lowest (ranks of one clock arrive together).
    per_step: dict[int, tuple[int, float]] = {}
    for rank, by_step in sorted(result.per_step.items()):
        for step, row in by_step.items():
            late = row.get("lateness_ns") or 0.0
            if step not in per_step or late > per_step[step][1]:
                per_step[step] = (rank, late)
    result.arrival_steps = [{"index": s, "latest_rank": r, "lateness_ns": v} for s, (r, v) in sorted(per_step.items())]


def longest_held_up_by(late_rank: int, last_arrivals: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The rank whose last arrivals held the others up longest, when it is not ``late_rank`` (the
    rank last most often); None when they are the same rank or nothing was held up. Ties: the
    lowest rank. Its ``last_arrivals`` figures are given with its rank."""
    held = {r: row.get("held_up_ns") or 0 for r, row in last_arrivals.items() if row}
    top = max(held.values(), default=0)
    if top <= 0:
        return None
    rank = min(r for r, n in held.items() if n == top)
    if rank == late_rank or held.get(late_rank, 0) == top:
        return None
    row = last_arrivals[rank]
    return {
        "rank": rank,
        "last_arrivals": row["count"],
        "median_late_ns": row["median_late_ns"],
        "p95_late_ns": row["p95_late_ns"],
        "held_up_ns": row["held_up_ns"],
        "held_up_share": row["held_up_share"],
    }


def _split(result: WaitResult, aligned: pl.DataFrame, ranks: list[int]) -> None:
    """Wait and transfer per call, summed per rank and step (module docstring, 3)."""
    duration = pl.col("at_end") - pl.col("at_start")
    wait = pl.min_horizontal(pl.max_horizontal(pl.col("last_arrival") - pl.col("at_start"), pl.lit(0)), duration)
    # Exposed time after the last arrival: all of it from covered_until on (no compute there).
    cut = pl.min_horizontal(pl.max_horizontal(pl.col("last_arrival"), pl.col("at_start")), pl.col("at_end"))
    exact = pl.col("at_until") <= cut
    before_until = pl.col("exposed_ns") - (pl.col("at_end") - pl.col("at_until"))
    exposed_wait_exact = pl.col("exposed_ns") - (pl.col("at_end") - cut)
    exposed_wait_estimate = before_until - pl.min_horizontal(before_until, pl.col("at_until") - cut)
    exposed_wait = pl.when(exact).then(exposed_wait_exact).otherwise(exposed_wait_estimate)
    exposed_wait = pl.min_horizontal(pl.max_horizontal(exposed_wait, pl.lit(0)), pl.col("exposed_ns"))
    calls = aligned.with_columns(
        wait.alias("wait_ns"),
        (duration - wait).alias("transfer_ns"),
        exposed_wait.alias("exposed_wait_ns"),
        (pl.col("exposed_ns") - exposed_wait).alias("exposed_transfer_ns"),
        (~exact).alias("estimated"),
    )
    sums = calls.group_by("rank").agg(
        pl.col("wait_ns").sum(), pl.col("transfer_ns").sum(), pl.col("estimated").sum().alias("estimated")
    )
    for (rank,), own in (
        calls.select("rank", "own_start", "wait_ns", "transfer_ns")
        .sort("own_start")
        .partition_by("rank", as_dict=True)
        .items()
    ):
        if own.height > LANE_CALLS:
            result.lanes[int(rank)] = {
                "null_reason": f"{own.height:,} matched calls on this rank, more than the {LANE_CALLS:,} the timeline "
                "draws one by one: the split is in the step rows"
            }
            continue
        start = own["own_start"]
        split = start + own["wait_ns"]
        result.lanes[int(rank)] = {
            "start": start.to_list(),
            "split": split.to_list(),
            "end": (split + own["transfer_ns"]).to_list(),
        }
    total_wait = total_transfer = 0
    for rank, wait_ns, transfer_ns, estimated in sums.iter_rows():
        row = result.per_rank.setdefault(int(rank), {})
        kernel = int(wait_ns) + int(transfer_ns)
        row.update(
            nccl_wait_ns=int(wait_ns),
            nccl_transfer_ns=int(transfer_ns),
            nccl_wait_share=(int(wait_ns) / kernel) if kernel else None,
            exposed_wait_estimated=int(estimated),
        )
        total_wait += int(wait_ns)
        total_transfer += int(transfer_ns)
    per_step = (
        calls.filter(pl.col("step").is_not_null())
        .group_by(["rank", "step"])
        .agg(
            pl.col("wait_ns").sum().alias("nccl_wait_ns"),
            pl.col("transfer_ns").sum().alias("nccl_transfer_ns"),
            pl.col("exposed_wait_ns").sum().alias("comm_wait_ns"),
            pl.col("exposed_transfer_ns").sum().alias("comm_transfer_ns"),
        )
    )
    for rank, step, *values in per_step.iter_rows():
        row = result.per_step.setdefault(int(rank), {}).setdefault(int(step), {})
        row.update(
            zip(("nccl_wait_ns", "nccl_transfer_ns", "comm_wait_ns", "comm_transfer_ns"), map(int, values), strict=True)
        )
    kernel = total_wait + total_transfer
    result.metrics.update(
        nccl_wait_ns=total_wait,
        nccl_transfer_ns=total_transfer,
        nccl_wait_share=total_wait / kernel if kernel else None,
        matched_steps=int(calls["step"].drop_nulls().n_unique()),
    )
    if not kernel:
        result.null_reasons["nccl_wait_share"] = "the matched collectives took no kernel time"
    result.transfer_medians = (
        calls.group_by(["rank", "kind", "bytes"])
        .agg(pl.col("transfer_ns").median().alias("transfer_median_ns"), pl.len().alias("matched"))
        .rename({"kind": "collective", "bytes": "msg_bytes"})
        .with_columns(pl.col("collective").cast(pl.String))
    )


def _null_split(result: WaitResult, ranks: list[int], reason: str) -> None:
    for key in ("nccl_wait_ns", "nccl_transfer_ns", "nccl_wait_share", "matched_steps"):
        result.metrics[key] = None
        result.null_reasons[key] = reason
    for rank in ranks:
        row = result.per_rank.setdefault(rank, {})
        for key in ("nccl_wait_ns", "nccl_transfer_ns", "nccl_wait_share"):
            row[key] = None
        row["null_reason"] = reason


def _all_null(result: WaitResult, ranks: list[int], reason: str, *, unmatched: int | None = None) -> WaitResult:
    for key in RUN_METRICS:
        result.metrics[key] = None
        result.null_reasons[key] = reason
    if unmatched is not None:
        result.metrics["collective_instances_unmatched"] = unmatched
        result.metrics["collective_instances_matched"] = 0
        result.null_reasons.pop("collective_instances_unmatched", None)
        result.null_reasons.pop("collective_instances_matched", None)
    result.clock_alignment["reason"] = reason
    for rank in ranks:
        row = result.per_rank.setdefault(rank, {})
        for key in RANK_METRICS:
            row[key] = None
        row["last_arrivals"] = None
        row["null_reason"] = reason
    return result


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
