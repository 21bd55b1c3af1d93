"""Steps without a step marker (DESIGN.md, "Steps"; docs/steps.md): iterations **inferred** from
the capture's own periodic GPU work, or the rank's whole GPU **window** as one step.

A training (or inference) loop launches the same kernel sequence every iteration. Per process,
on its busiest device, the kernels in start order are a sequence of names; the iteration is
its period:

- **Candidate periods.** A name (or a run of 2 or 3 consecutive names) that occurs once per
  iteration recurs at a constant distance, the period, counted in kernels (at least
  ``MIN_PERIOD_KERNELS``). Names that occur several times per iteration (a transformer layer's
  kernels) recur at uneven distances and are ignored, so the period found is the iteration, not
  the layer. Each candidate is scored by the number of distinct names and runs that recur at
  it across at least ``COVERAGE`` of the capture.
- **Verification.** The period is accepted when the capture holds at least two periods and
  either at least ``MATCH_FLOOR`` of the kernels equal the kernel one period later, or at least
  ``MIN_STEADY_NAMES`` distinct names recur exactly one period apart three times or more (the
  element-wise match drops when the NCCL and compute streams interleave differently in each
  iteration; exact recurrences of single names do not).
- **Boundaries.** An iteration starts right after the optimizer's kernels when they are known
  by name (:data:`OPTIMIZER_KERNEL`), at the largest idle gap within ``max(2, period/20)``
  kernels after them; otherwise after the recurring idle gap: the kernel offset within the
  period whose preceding GPU idle time (no kernel of the device running) is largest on average.
  From there each next boundary is the position within ``±max(2, period/20)`` kernels of one
  period on where the next ``ALIGN_KERNELS`` kernels best repeat the current iteration's first
  ones, so an iteration with a kernel more or less does not shift the ones after it.
- **Steps.** Step *k* is the GPU time from the moment the device fell idle before its first
  kernel (the copies feeding the iteration run in that gap) to the moment it fell idle before
  the next step's first kernel (the last complete one: to its last kernel's end). Kernels before the first
  boundary, and a last iteration shorter than a period, belong to no step (partial iterations at
  the capture's edges). GPU work is attributed to these steps by its own GPU start time, since
  they are defined on the GPU's timeline (DESIGN.md's launch-time rule is for marker ranges).

``window``: no period found (or too few kernels): the process's whole GPU window, from its first
GPU op's start to its last GPU op's end, is one step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import polars as pl

from traceguard.metrics.intervals import running_max
from traceguard.model import holds_one_value

try:  # the C loops (traceguard/metrics/_breakdown.c); _align keeps the NumPy version
    from traceguard.metrics import _breakdown as _native
except ImportError:  # pragma: no cover - exercised where no compiler was at install
    _native = None

#: Name arrays the C _align reads (``name_id`` is Int32; int64 elsewhere).
_NATIVE_NAMES = (np.dtype(np.int32), np.dtype(np.int64))

#: Share of kernels that must equal the kernel one period later for a period to be accepted.
MATCH_FLOOR = 0.75
#: Periods (iterations) a capture must hold for one to be inferred.
MIN_PERIODS = 2
#: Kernels searched for the period (a prefix): enough for two iterations of a large model,
#: bounded so that a 10 M-kernel capture costs one O(n) pass, not a sort of every kernel.
SEARCH_PREFIX = 1 << 20
#: Distinct kernel names recurring at exactly the period, three times or more, that accept it
#: even when streams interleave differently each iteration (lowering the element-wise match).
MIN_STEADY_NAMES = 3
#: Kernels a boundary may move to reach the idle gap next to it (see ``_settle``).
SETTLE_KERNELS = 2
#: Kernels compared when aligning the next iteration's start with the current one's.
ALIGN_KERNELS = 32
#: Iterations whose exact repetition is checked at once (a bound on the work per check).
BULK_MARKS = 256
#: Share of the sequence an anchor's recurrences must span.
COVERAGE = 0.5
#: Kernels an iteration has at least: one kernel repeated is a kernel loop, not an iteration.
MIN_PERIOD_KERNELS = 2
#: Kernels of an optimizer step, by name (fused and foreach optimizers of PyTorch, Apex, DeepSpeed).
OPTIMIZER_KERNEL = r"(?i)multi_tensor_apply|adamw?|sgd|adagrad|rmsprop|lamb(?:[^d]|$)|\blion"
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


def _recurring_distances(tokens: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per token that recurs at one constant distance P across at least ``COVERAGE`` of the
    sequence: that distance P, and how often the token occurs (in no particular order).

    The gaps between a token's consecutive occurrences by a hash group-by that keeps each token's
    positions in order (Polars): a third of the time of grouping them by a stable sort."""
    frame = pl.DataFrame({"token": tokens, "at": np.arange(tokens.size, dtype=np.int64)})
    gaps = (
        frame.group_by("token")
        .agg(
            pl.len().cast(pl.Int64).alias("count"),
            pl.col("at").diff().min().alias("low"),
            pl.col("at").diff().max().alias("high"),
        )
        .filter(pl.col("count") >= 2)
    )
    low, high, counts = (gaps[c].to_numpy() for c in ("low", "high", "count"))
    # Constant up to the reordering of a kernel or two between streams.
    steady = (high - low) <= np.maximum(2, low // 100)
    period = (low + high) // 2
    steady &= period > 0
    period, counts = period[steady], counts[steady]
    # Recurring across most of the capture, not in one stretch of it (a trimmed capture may
    # lose the anchor in its first or last iterations).
    covering = (counts - 1) * period >= COVERAGE * n
    return period[covering], counts[covering]


def find_period(names: np.ndarray) -> Period | None:
    """The iteration of a kernel-name sequence (see the module docstring), or None."""
    names = names[:SEARCH_PREFIX]
    n = names.size
    if n < 2 * MIN_PERIODS:
        return None
    votes: dict[int, int] = {}
    #: Single names recurring at P three times or more: evidence that needs no element-wise match.
    steady_names: dict[int, int] = {}
    for length in TOKEN_LENGTHS:
        if n - length + 1 < 2:
            continue
        periods, counts = _recurring_distances(_tokens(names, length), n - length + 1)
        for period, count in zip(periods.tolist(), counts.tolist(), strict=True):
            votes[period] = votes.get(period, 0) + 1
            if length == 1 and count >= 3:
                steady_names[period] = steady_names.get(period, 0) + 1
    # Most anchors first; among equals the shorter period.
    for period, anchors in sorted(votes.items(), key=lambda item: (-item[1], item[0])):
        if period < MIN_PERIOD_KERNELS or period * MIN_PERIODS > n:
            continue
        match = float(np.mean(names[:-period] == names[period:]))
        if match >= MATCH_FLOOR or steady_names.get(period, 0) >= MIN_STEADY_NAMES:
            return Period(kernels=period, anchors=anchors, match=match)
    return None


def idle_before(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per kernel (in start order), the GPU idle time before it: its start minus the latest end
    of the kernels before it, at least 0; the first kernel gets 0."""
    idle = np.zeros(start.size, dtype=np.int64)
    if start.size > 1:
        idle[1:] = np.maximum(0, start[1:] - running_max(end)[:-1])
    return idle


def _idle_at(start: np.ndarray, ended: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """:func:`idle_before` of kernels ``lo``..``hi - 1``, from the running maximum of their ends."""
    idle = np.zeros(hi - lo, dtype=np.int64)
    first = max(lo, 1)
    idle[first - lo :] = np.maximum(0, start[first:hi] - ended[first - 1 : hi - 1])
    return idle


def _phase(idle: np.ndarray, period: int, optimizer: np.ndarray | None) -> int:
    """The kernel offset within the period at which iterations start (module docstring), from
    the idle gaps (and optimizer kernels) of the first kernels of the capture."""
    n = idle.size
    positions = np.arange(1, n)
    offset_of = positions % period
    totals = np.bincount(offset_of, weights=idle[1:], minlength=period)
    counts = np.bincount(offset_of, minlength=period)
    mean_idle = np.divide(totals, counts, out=np.zeros(period), where=counts > 0)
    if optimizer is None or not optimizer.any():
        return int(np.argmax(mean_idle))
    # The optimizer's kernels close an iteration: start after the end of their block (the
    # offset before the largest cyclic distance between optimizer offsets), at the largest idle
    # gap within the next ``slack`` kernels (zero_grad, a logging copy may come first).
    offsets = np.unique(np.flatnonzero(optimizer) % period)
    distances = np.diff(np.concatenate([offsets, offsets[:1] + period]))
    after_block = int(offsets[int(np.argmax(distances))] + 1) % period
    window = (after_block + np.arange(_slack(period) + 1)) % period
    return int(window[int(np.argmax(mean_idle[window]))])


def _slack(period: int) -> int:
    return max(2, period // 20)


def _align(names: np.ndarray, mark: int, target: int, lo: int, hi: int, *, differs: bool = False) -> int:
    """The next iteration's first kernel: the position in ``[lo, hi)`` where the kernels that
    follow best repeat those that began the iteration at ``mark`` (nearest ``target`` among
    equals), so an iteration with a kernel more or less does not shift the ones after it.
    ``differs``: the caller found the kernels at ``target`` not to repeat those at ``mark``.
    In C where built (``_breakdown.align``: 5.6 k boundaries of the base shape, 22 µs each here)."""
    length = min(ALIGN_KERNELS, target - mark)
    native = getattr(_native, "align", None)  # None: no C build, or one from before it
    if native is not None and names.dtype in _NATIVE_NAMES and names.flags.c_contiguous:
        found = native(names, names.itemsize, mark, target, lo, hi, length, differs)
        if found is not None:
            return int(found)
    # Too few kernels left to compare (the capture's last iteration): one period on it is.
    if not differs and (
        target + length > names.size or np.array_equal(names[target : target + length], names[mark : mark + length])
    ):
        return target
    hi = min(hi, names.size - length + 1)
    # Where the iteration's first kernel recurs, when it does: a few candidates, not the window.
    candidates = lo + np.flatnonzero(names[lo:hi] == names[mark])
    if candidates.size == 0:
        candidates = np.arange(lo, hi)
    if candidates.size == 0:
        return target
    window = names[candidates[:, None] + np.arange(length)[None, :]]
    score = (window == names[mark : mark + length][None, :]).sum(axis=1)
    best = np.flatnonzero(score == score.max())
    return int(candidates[best[np.argmin(np.abs(candidates[best] - target))]])


#: The moves :func:`_settle` tries, nearest first (the earlier of two equally near): among
#: equal idle gaps a boundary stays where it is, or moves the least.
_SETTLE_MOVES = np.array(sorted(range(-SETTLE_KERNELS, SETTLE_KERNELS + 1), key=lambda m: (abs(m), m)))


def _settle(marks: list[int], start: np.ndarray, ended: np.ndarray) -> list[int]:
    """Each boundary moved to the largest idle gap within ``SETTLE_KERNELS`` of it (the nearest
    such kernel among equals, the earlier of two equally near): the phase is an average over all
    iterations, so an iteration a kernel longer shifts it by one for the iterations before. A
    loop whose gaps are all equal (nsys-ai's ``healthy_1pct``: a gemm and an add, 10 µs apart)
    keeps its boundaries one period apart. The capture's first kernel has no gap before it to
    tell: a boundary the phase puts on it stays there (the capture opens on an iteration), and no
    other boundary moves to it (it would cut a step of the kernel or two before its mark)."""
    at = np.asarray(marks, dtype=np.int64)
    if start.size < 2 or (at.size > 1 and int(np.diff(at).min()) <= 2 * SETTLE_KERNELS):
        return _settle_one_by_one(marks, start, ended)  # windows that touch: each after the one before
    # Windows apart: all at once. Kernels outside the capture count as less idle than any.
    positions = at[:, None] + _SETTLE_MOVES[None, :]
    inside = (positions >= 0) & (positions < start.size)
    safe = np.clip(positions, 1, start.size - 1)
    idle = np.maximum(0, start[safe] - ended[safe - 1])
    idle = np.where(inside, idle, -1)
    idle = np.where(positions == 0, _first_gap(at)[:, None], idle)
    return (positions[np.arange(at.size), np.argmax(idle, axis=1)]).tolist()


def _first_gap(marks: np.ndarray) -> np.ndarray:
    """The idle gap :func:`_settle` counts before the capture's first kernel, per mark: more than
    any for the mark on it, less than any for the others (its true gap is not in the capture)."""
    return np.where(marks == 0, np.iinfo(np.int64).max, -1)


def _settle_one_by_one(marks: list[int], start: np.ndarray, ended: np.ndarray) -> list[int]:
    settled: list[int] = []
    for mark in marks:
        lo = max(settled[-1] + 1 if settled else 0, mark - SETTLE_KERNELS)
        hi = min(start.size, mark + SETTLE_KERNELS + 1)
        if lo >= hi:  # the boundary before took the last kernels it could move to: one iteration with it
            continue
        candidates = np.arange(lo, hi)
        idle = _idle_at(start, ended, lo, hi)
        if lo == 0:
            idle[0] = _first_gap(np.array([mark]))[0]
        # Largest gap; among equals the nearest to the mark, then the earlier (as :func:`_settle`).
        best = np.lexsort((candidates, np.abs(candidates - mark), -idle))[0]
        settled.append(int(candidates[best]))
    return settled


def boundaries(
    names: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    period: int,
    optimizer: np.ndarray | None = None,
    ended: np.ndarray | None = None,
) -> list[tuple[int, int]]:
    """Kernel index ranges ``[first, last)`` of the complete iterations (module docstring);
    ``optimizer`` marks the optimizer's kernels (of the first ``SEARCH_PREFIX`` kernels at
    least), when they are known by name; ``ended`` is the running maximum of ``end``."""
    n = start.size
    ended = running_max(end) if ended is None else ended
    prefix = min(n, max(SEARCH_PREFIX, 2 * period))
    first = _phase(_idle_at(start, ended, 0, prefix), period, None if optimizer is None else optimizer[:prefix])
    slack = _slack(period)
    marks = [first]
    # Where an iteration repeats the one before exactly (its first ``ALIGN_KERNELS`` kernels equal
    # those one period earlier), _align keeps the period: such marks are checked and taken in
    # batches that double while the repetition holds (one at a time where it does not).
    length = min(ALIGN_KERNELS, period)
    offsets = np.arange(length, dtype=np.int64)
    batch = 1
    while True:
        mark = marks[-1]
        if batch == 1:
            # One target (one iteration at a time, where they do not repeat exactly: the common
            # case): two slices compared, not the batch's gather, and _align not asked again.
            target = mark + period
            if target >= n:
                break
            if target + length > n or bool((names[target : target + length] == names[mark : mark + length]).all()):
                marks.append(target)
                batch = 2
                continue
            lo, hi = max(mark + 1, target - slack), min(n, target + slack + 1)
            if lo >= hi:
                break
            marks.append(_align(names, mark, target, lo, hi, differs=True))
            continue
        targets = mark + period * np.arange(1, batch + 1, dtype=np.int64)
        targets = targets[targets < n]
        if targets.size == 0:
            break
        whole = targets[targets + length <= n]  # a window past the end: _align keeps the period
        windows = names[whole[:, None] + offsets[None, :]] == names[(whole - period)[:, None] + offsets[None, :]]
        repeats = np.ones(targets.size, dtype=bool)
        repeats[: whole.size] = windows.all(axis=1)
        broken = np.flatnonzero(~repeats)
        if broken.size == 0:
            marks.extend(targets.tolist())
            batch = min(2 * batch, BULK_MARKS)
            continue
        marks.extend(targets[: broken[0]].tolist())
        batch = 1
        target = marks[-1] + period
        lo, hi = max(marks[-1] + 1, target - slack), min(n, target + slack + 1)
        if lo >= hi:
            break
        marks.append(_align(names, marks[-1], target, lo, hi))
    marks = _settle(marks, start, ended)
    steps = list(itertools.pairwise(marks))
    if n - marks[-1] >= period - slack:  # the last iteration is complete
        steps.append((marks[-1], n))
    return steps


def _busiest_device(kernels: pl.DataFrame) -> pl.DataFrame:
    # One device (a rank's usual case): the kernels as they are, not a filtered copy of them (10 M
    # kernels: 0.3 GB of fresh memory, whose first touch is most of the copy's cost on these VMs).
    several, device = _busiest(kernels["device"])
    chosen = kernels.filter(_on(device)) if several else kernels
    return chosen if chosen["start"].is_sorted() else chosen.sort("start")


def _busiest(devices: pl.Series) -> tuple[bool, object]:
    """Whether ``devices`` (a process's kernels') hold several values, and the one most kernels
    ran on (the lowest among equals; null last)."""
    if holds_one_value(devices):
        return False, None
    counts = devices.to_frame("device").group_by("device").len()
    counts = counts.sort(["len", "device"], descending=[True, False], nulls_last=True)
    return True, counts["device"][0]


def _on(device: object) -> pl.Expr:
    return pl.col("device").is_null() if device is None else pl.col("device") == device


class _Choice(NamedTuple):
    """Which of a process's kernels are its sequence (:func:`_busiest`: ``several`` devices, the
    one chosen) and whether they come in start order."""

    several: bool
    device: object
    ordered: bool


def _choice(kernels: pl.LazyFrame) -> _Choice:
    """:class:`_Choice` of a process's kernels, read a column at a time (device, then start)."""
    several, device = _busiest(kernels.select("device").collect()["device"])
    chosen = kernels.filter(_on(device)) if several else kernels
    return _Choice(several, device, chosen.select("start").collect()["start"].is_sorted())


def _searched_names(kernels: pl.LazyFrame, choice: _Choice) -> np.ndarray | None:
    """The names :func:`find_period` reads of a process's kernels (the first
    :data:`SEARCH_PREFIX` of :func:`_busiest_device`'s sequence), taken without that sequence
    whole: the prefix's names of the kernels ``choice`` picks. None when they are out of start
    order (the sequence is then sorted whole). A process whose prefix holds no period is not
    read further (the per-op NVTX shape: a rank's 6.6 M kernels, 0.18 GB of five columns, for
    nothing)."""
    if not choice.ordered:
        return None
    chosen = kernels.filter(_on(choice.device)) if choice.several else kernels
    name_ids = chosen.select("name_id").head(SEARCH_PREFIX).collect()["name_id"]
    return (name_ids.fill_null(-1) if name_ids.null_count() else name_ids).to_numpy()


def _ordered_sequence(kernels: pl.LazyFrame, choice: _Choice) -> pl.DataFrame:
    """:func:`_busiest_device`'s sequence of kernels in start order already (``choice``), only
    the columns inference reads of it: the process and device columns of 10 M kernels (80 MB)
    are not copied, nor the device and order found again."""
    chosen = kernels.filter(_on(choice.device)) if choice.several else kernels
    return chosen.select("start", "end", "name_id").collect()


def optimizer_name_ids(strings: pl.DataFrame) -> pl.Series:
    """Interned names of optimizer kernels (fused/foreach Adam, SGD, ... and
    ``multi_tensor_apply_kernel``, PyTorch's foreach optimizers)."""
    return strings.filter(pl.col("value").str.contains(OPTIMIZER_KERNEL))["id"]


def inferred_steps(gpu_ops: pl.DataFrame, strings: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, Period]]:
    """Inferred steps of every process of ``gpu_ops`` (a steps frame on the GPU timeline, ids
    negative so they never meet a range's), and the period found per process. ``strings`` names
    the kernels (to recognise the optimizer's)."""
    optimizer_ids = optimizer_name_ids(strings).cast(pl.Int32)
    first_starts = (
        gpu_ops.lazy()
        .filter(pl.col("pid").is_not_null())
        .group_by("pid")
        .agg(pl.col("start").min(), pl.col("rank").first())
        .collect()
    )
    of_process_ops_start = dict(zip(first_starts["pid"].to_list(), first_starts["start"].to_list(), strict=True))
    # The rank column is one value per process (ingest sets it per rank).
    rank_of = dict(zip(first_starts["pid"].to_list(), first_starts["rank"].to_list(), strict=True))
    kernels = (
        gpu_ops.lazy()
        .filter((pl.col("kind") == "kernel") & pl.col("start").is_not_null() & pl.col("end").is_not_null())
        .select("pid", "device", "start", "end", "name_id")
    )
    rows: list[dict[str, object]] = []
    periods: dict[int, Period] = {}
    pid_of_kernel = kernels.select("pid").collect()["pid"]
    pids = (
        pid_of_kernel.drop_nulls().head(1).to_list()
        if holds_one_value(pid_of_kernel)
        else pid_of_kernel.unique().drop_nulls().sort().to_list()
    )
    alone = len(pids) == 1 and not pid_of_kernel.null_count()
    del pid_of_kernel
    for pid in pids:
        # One process per rank is the rule: no filter of the kernels then.
        of_process = kernels if alone else kernels.filter(pl.col("pid") == pid)
        choice = _choice(of_process)
        searched = _searched_names(of_process, choice)
        period = find_period(searched) if searched is not None else None
        if searched is not None and period is None:
            continue
        sequence = _ordered_sequence(of_process, choice) if choice.ordered else _busiest_device(of_process.collect())
        name_ids = sequence["name_id"]
        names = (name_ids.fill_null(-1) if name_ids.null_count() else name_ids).to_numpy()
        period = period or find_period(names)  # the names searched are these names' prefix
        if period is None:
            continue
        start = sequence["start"].to_numpy().astype(np.int64, copy=False)
        end = sequence["end"].to_numpy().astype(np.int64, copy=False)
        prefix = sequence["name_id"].head(max(SEARCH_PREFIX, 2 * period.kernels))
        optimizer = prefix.is_in(optimizer_ids.implode()).fill_null(False).to_numpy()
        ended = running_max(end)
        spans = boundaries(names, start, end, period.kernels, optimizer, ended)
        if len(spans) < MIN_PERIODS:
            continue
        periods[pid] = period
        rank = rank_of[pid]
        # A step begins where the GPU fell idle before its first kernel: the copies that feed an
        # iteration (its input batch) run in that gap and belong to it.
        first_op = int(of_process_ops_start[pid])
        for number, (first, last) in enumerate(spans):
            step_start = int(ended[first - 1]) + 1 if first else min(first_op, int(start[0]))
            step_end = int(ended[last - 1])
            rows.append(
                {
                    "rank": rank,
                    "pid": pid,
                    "tid": None,
                    "range_id": -(len(rows) + 1),
                    "name": f"inferred {number}",
                    "start": step_start,
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
