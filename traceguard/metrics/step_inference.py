"""Steps without a step marker (DESIGN.md, "Steps"; docs/steps.md): iterations **inferred** from
the capture's own periodic GPU work, or the rank's whole GPU **window** as one step.

A training (or inference) loop launches the same kernel sequence every iteration. Per process,
on its busiest device, the kernels in start order are a sequence of names; the iteration is
its period:

- **Candidate periods.** A name (or a run of 2 or 3 consecutive names) that occurs once per
  iteration recurs at a constant distance, the period, counted in kernels. Names that occur
  several times per iteration (a transformer layer's kernels) recur at uneven distances and
  are ignored, so the period found is the iteration, not the layer. Each candidate is scored by
  the number of distinct names and runs that recur at it, in every period of the capture.
- **Verification.** The period is accepted when at least ``MATCH_FLOOR`` of the kernels equal
  the kernel one period later, and the capture holds at least two periods.
- **Boundaries.** An iteration starts after the recurring idle gap: the kernel offset within
  the period whose preceding GPU idle time (no kernel of the device running) is largest on
  average. From there each next boundary is the kernel with the largest idle gap before it
  within ``±max(2, period/20)`` kernels of one period on, so an iteration with a kernel more
  or less does not shift the ones after it.
- **Steps.** Step *k* is the GPU time from its first kernel's start to the next step's first
  kernel's start (the last complete one: to its last kernel's end). Kernels before the first
  boundary, and a last iteration shorter than a period, belong to no step (partial iterations at
  the capture's edges). GPU work is attributed to these steps by its own GPU start time, since
  they are defined on the GPU's timeline (DESIGN.md's launch-time rule is for marker ranges).

``window``: no period found (or too few kernels): the process's whole GPU window, from its first
GPU op's start to its last GPU op's end, is one step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import polars as pl

#: Share of kernels that must equal the kernel one period later for a period to be accepted.
MATCH_FLOOR = 0.75
#: Periods (iterations) a capture must hold for one to be inferred.
MIN_PERIODS = 2
#: Kernels searched for the period (a prefix): enough for two iterations of a large model,
#: bounded so that a 10 M-kernel capture costs one O(n) pass, not a sort of every kernel.
SEARCH_PREFIX = 1 << 20
#: Runs of consecutive kernel names used as tokens besides single names.
TOKEN_LENGTHS = (1, 2, 3)

STEP_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "pid": pl.Int32(),
    "tid": pl.Int32(),
    "range_id": pl.Int64(),
    "name": pl.String(),
    "start": pl.Int64(),
    "end": pl.Int64(),
    "depth": pl.Int32(),
}


@dataclass(frozen=True)
class Period:
    """The iteration found in a kernel sequence."""

    #: Kernels per iteration.
    kernels: int
    #: Distinct names and runs of names that recur exactly once per iteration.
    anchors: int
    #: Share of kernels equal to the kernel one period later.
    match: float


def _tokens(names: np.ndarray, length: int) -> np.ndarray:
    """One int64 hash per run of ``length`` consecutive names (wrapping arithmetic is intended)."""
    if length == 1:
        return names.astype(np.int64, copy=False)
    token = names[: names.size - length + 1].astype(np.int64)
    with np.errstate(over="ignore"):
        for offset in range(1, length):
            token = token * np.int64(1_000_003) + names[offset : names.size - length + 1 + offset].astype(np.int64)
    return token


def _recurring_distances(tokens: np.ndarray, n: int) -> np.ndarray:
    """Per token that recurs at one constant distance P in every period of the sequence (its
    occurrences number ⌊n/P⌋ or ⌈n/P⌉), that distance P."""
    _, inverse, counts = np.unique(tokens, return_inverse=True, return_counts=True)
    order = np.argsort(inverse, kind="stable")  # positions grouped by token, ascending
    group = inverse[order]
    gaps = np.diff(order)
    same = group[1:] == group[:-1]
    if not same.any():
        return np.empty(0, dtype=np.int64)
    gap_token = group[1:][same]
    gap = gaps[same]
    tokens_seen = counts.size
    low = np.full(tokens_seen, np.iinfo(np.int64).max)
    high = np.zeros(tokens_seen, dtype=np.int64)
    np.minimum.at(low, gap_token, gap)
    np.maximum.at(high, gap_token, gap)
    recurring = counts >= 2
    low, high, counts = low[recurring], high[recurring], counts[recurring]
    # Constant up to the reordering of a kernel or two between streams.
    steady = (high - low) <= np.maximum(2, low // 100)
    period = (low + high) // 2
    steady &= period > 0
    period, counts = period[steady], counts[steady]
    every_period = (counts >= n // np.maximum(period, 1)) & (counts <= -(-n // np.maximum(period, 1)))
    return period[every_period]


def find_period(names: np.ndarray) -> Period | None:
    """The iteration of a kernel-name sequence (see the module docstring), or None."""
    names = names[:SEARCH_PREFIX]
    n = names.size
    if n < 2 * MIN_PERIODS:
        return None
    votes: dict[int, int] = {}
    for length in TOKEN_LENGTHS:
        if n - length + 1 < 2:
            continue
        for period in _recurring_distances(_tokens(names, length), n - length + 1).tolist():
            votes[period] = votes.get(period, 0) + 1
    # Most anchors first; among equals the shorter period.
    for period, anchors in sorted(votes.items(), key=lambda item: (-item[1], item[0])):
        if period * MIN_PERIODS > n:
            continue
        match = float(np.mean(names[:-period] == names[period:]))
        if match >= MATCH_FLOOR:
            return Period(kernels=period, anchors=anchors, match=match)
    return None


def idle_before(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per kernel (in start order), the GPU idle time before it: its start minus the latest end
    of the kernels before it, at least 0; the first kernel gets 0."""
    idle = np.zeros(start.size, dtype=np.int64)
    if start.size > 1:
        idle[1:] = np.maximum(0, start[1:] - np.maximum.accumulate(end)[:-1])
    return idle


def boundaries(start: np.ndarray, end: np.ndarray, period: int) -> list[tuple[int, int]]:
    """Kernel index ranges ``[first, last)`` of the complete iterations (module docstring)."""
    n = start.size
    idle = idle_before(start, end)
    positions = np.arange(1, n)
    offset_of = positions % period
    totals = np.bincount(offset_of, weights=idle[1:], minlength=period)
    counts = np.bincount(offset_of, minlength=period)
    mean_idle = np.divide(totals, counts, out=np.zeros(period), where=counts > 0)
    first = int(np.argmax(mean_idle))
    slack = max(2, period // 20)
    marks = [first]
    while True:
        target = marks[-1] + period
        lo, hi = max(marks[-1] + 1, target - slack), min(n, target + slack + 1)
        if target >= n or lo >= hi:
            break
        marks.append(lo + int(np.argmax(idle[lo:hi])))
    steps = list(itertools.pairwise(marks))
    if n - marks[-1] >= period - slack:  # the last iteration is complete
        steps.append((marks[-1], n))
    return steps


def _busiest_device(kernels: pl.DataFrame) -> pl.DataFrame:
    counts = kernels.group_by("device").len().sort(["len", "device"], descending=[True, False], nulls_last=True)
    device = counts["device"][0]
    chosen = kernels.filter(pl.col("device").is_null() if device is None else pl.col("device") == device)
    return chosen if chosen["start"].is_sorted() else chosen.sort("start")


def inferred_steps(gpu_ops: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, Period]]:
    """Inferred steps of every process of ``gpu_ops`` (a steps frame on the GPU timeline, ids
    negative so they never meet a range's), and the period found per process."""
    kernels = (
        gpu_ops.lazy()
        .filter((pl.col("kind") == "kernel") & pl.col("start").is_not_null() & pl.col("end").is_not_null())
        .select("rank", "pid", "device", "start", "end", "name_id")
        .collect()
    )
    rows: list[dict[str, object]] = []
    periods: dict[int, Period] = {}
    for (pid,), of_process in kernels.partition_by("pid", as_dict=True, maintain_order=True).items():
        if pid is None:
            continue
        sequence = _busiest_device(of_process)
        period = find_period(sequence["name_id"].fill_null(-1).to_numpy())
        if period is None:
            continue
        start = sequence["start"].to_numpy().astype(np.int64, copy=False)
        end = sequence["end"].to_numpy().astype(np.int64, copy=False)
        spans = boundaries(start, end, period.kernels)
        if len(spans) < MIN_PERIODS:
            continue
        periods[pid] = period
        rank = sequence["rank"][0]
        for number, (first, last) in enumerate(spans):
            # Up to the next step's first kernel (exclusive), else to this step's last end.
            step_end = int(start[last]) - 1 if last < start.size else int(end[first:last].max())
            rows.append(
                {
                    "rank": rank,
                    "pid": pid,
                    "tid": None,
                    "range_id": -(len(rows) + 1),
                    "name": f"inferred {number}",
                    "start": int(start[first]),
                    "end": step_end,
                    "depth": 0,
                }
            )
    return pl.DataFrame(rows, schema=STEP_SCHEMA), periods


def window_steps(gpu_ops: pl.DataFrame) -> pl.DataFrame:
    """One step per process: its first GPU op's start to its last GPU op's end."""
    window = (
        gpu_ops.lazy()
        .filter(pl.col("pid").is_not_null() & pl.col("start").is_not_null())
        .group_by("pid")
        .agg(pl.col("rank").first(), pl.col("start").min(), pl.col("end").max())
        .sort("pid")
        .collect()
    )
    return window.select(
        "rank",
        "pid",
        pl.lit(None, dtype=pl.Int32).alias("tid"),
        (-(pl.int_range(pl.len(), dtype=pl.Int64) + 1)).alias("range_id"),
        pl.lit("window", dtype=pl.String).alias("name"),
        "start",
        pl.max_horizontal("start", "end").alias("end"),
        pl.lit(0, dtype=pl.Int32).alias("depth"),
    ).cast(STEP_SCHEMA)  # type: ignore[arg-type]
