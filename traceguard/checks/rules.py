"""The checklist: each rule reads one run metric, compares it with the profile's bounds and
says why, with evidence rows and a remedy written for the engineer on call.

Rules know metric names and nothing of formats or SQL; bounds come only from the profile.
A metric that is ``None`` makes its rule ``skip`` with the metric's null reason — never ``pass``.

Minimum evidence (DESIGN.md): each rule declares its ``floors`` — a profile key (``min_*``) and
the run metric that holds the evidence (GPU ops, bytes per step, steps compared, samples...).
Below the profile's floor the rule is ``skip`` with a reason naming the evidence found and the
floor, so a handful of events never decides a verdict; a floor the profile does not set is not
applied. Most floors are evidence to judge at all (the denominator: GPU ops, the data path's
bytes); a *finding* floor is the evidence a warn or fail needs (the numerator: 4 pageable copies
of 784 B beside 50 GB of pinned ones are no finding), and a pass needs none. A verdict drawn
from steps that were inferred, or that are each rank's whole GPU window, says so in its message.
"""

from __future__ import annotations

import heapq
import operator
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import polars as pl

from traceguard.checks.profiles import Profile, RuleConfig
from traceguard.errors import ProfileError
from traceguard.metrics.run import RunResult

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


@dataclass
class CheckResult:
    id: str
    title: str
    status: str
    value: float | None
    warn: float | None
    fail: float | None
    op: str | None
    message: str
    reason: str | None
    evidence: list[dict[str, Any]] = field(default_factory=list)
    remedy: str | None = None
    #: How ``value`` reads: "share" (fraction), "ratio", "count", "us" or "problems" (the number of
    #: problems a check found in the capture, shown as such: ``capture_health``).
    unit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Floor:
    """One piece of minimum evidence a rule needs before its value may decide a verdict.

    ``key``: the profile's ``min_*`` key that sets it; ``metric``: the run metric holding the
    evidence (below the floor → ``skip``); ``unit``: how the floor reads ("bytes",
    "bytes_per_step", "ns", else the singular noun of a count); ``found``: the evidence in words,
    from the run; ``meaning``: why that little cannot be judged. ``finding``: the floor is what
    a warn or fail needs (the offending events), not what any verdict needs; a pass ignores it.
    """

    key: str
    metric: str
    unit: str
    found: Callable[[RunResult], str]
    meaning: str
    finding: bool = False


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    metric: str | None
    unit: str
    remedy: str
    evidence: Callable[[RunResult], list[dict[str, Any]]]
    floors: tuple[Floor, ...] = ()
    #: The value (or a floor) is computed per step: say so when the steps are inferred or windows.
    step_based: bool = False
    #: What the message adds after the value (e.g. the wait / transfer split), from the run.
    detail: Callable[[RunResult], str | None] | None = None
    #: The remedy chosen from the run (the cause found), when it depends on it; else ``remedy``.
    remedy_for: Callable[[RunResult], str | None] | None = None


def _pct(value: float) -> str:
    return f"{value:.2%}"


def format_value(value: float | None, unit: str | None) -> str:
    """A check value as people read it: shares in %, ratios with ×, latencies in µs."""
    if value is None:
        return "n/a"
    if unit == "share":
        return _pct(value)
    if unit == "ratio":
        return f"{value:.3f}×"
    if unit == "count":
        return f"{value:g}"
    if unit == "problems":  # a bare "0" beside "2 rank(s): 12086 GPU ops, ..." means nothing
        return f"{value:g} problem{'' if value == 1 else 's'} found"
    if unit == "us":
        return f"{value:.2f} µs"
    return f"{value:.4g}"


def format_bytes(value: float) -> str:
    """Bytes in binary units, as copy volumes are usually quoted: 272 B, 1 MiB, 1.142 GiB."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    step = 0
    while abs(value) >= 1024 and step < len(units) - 1:
        value /= 1024
        step += 1
    return f"{value:.0f} B" if step == 0 else f"{value:.4g} {units[step]}"


def format_ns(value: float) -> str:
    """Nanoseconds in the largest unit that keeps the number at least 1: 1 ms, 250 µs, 3.2 s."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if value >= scale:
            return f"{value / scale:.4g} {unit}"
    return f"{value:.0f} ns"


def _format_floor(value: float, unit: str) -> str:
    if unit == "bytes":
        return format_bytes(value)
    if unit == "bytes_per_step":
        return f"{format_bytes(value)} per step"
    if unit == "ns":
        return format_ns(value)
    if unit == "share":
        return _pct(value)
    return _plural(value, unit)


def _plural_noun(noun: str) -> str:
    head, per, tail = noun.partition(" per ")  # "copy per step" → "copies per step"
    return (f"{head[:-1]}ies" if head.endswith("y") else f"{head}s") + per + tail


def _plural(count: float, noun: str) -> str:
    """``1 step``, ``3 steps``, ``2 copies``, ``2 copies per step``."""
    return f"{count:g} {noun if count == 1 else _plural_noun(noun)}"


#: What a verdict drawn from these step sources must say (DESIGN.md, "Steps").
STEP_NOTES = {
    "inferred": "steps inferred from the capture's periodic GPU work, no step marker",
    "window": "one step = each rank's whole GPU window: no step marker, no periodic structure",
}


def step_note(result: RunResult) -> str | None:
    """How the steps were found when no marker gave them, naming the ranks if not all."""
    if _from_inspector(result) and not result.ranks:
        return f"no steps: NCCL Inspector logs, judged in {result.inspector.window_s}-s time windows"
    by_source: dict[str, list[int]] = {}
    for r in result.ranks:
        if r.step_source in STEP_NOTES:
            by_source.setdefault(r.step_source, []).append(r.rank)
    notes = []
    for source, ranks in by_source.items():
        if len(ranks) == len(result.ranks):
            notes.append(STEP_NOTES[source])
        else:
            notes.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: {STEP_NOTES[source]}")
    return "; ".join(notes) or None


def _rank_evidence(
    result: RunResult, metric: str, *, limit: int = 4, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    rows = [
        {"rank": r.rank, metric: r.metrics.get(metric), **{k: r.metrics.get(k) for k in extra}}
        for r in result.ranks
        if r.metrics.get(metric) is not None
    ]
    rows.sort(key=lambda row: row[metric], reverse=True)
    return rows[:limit]


def _worst_steps(result: RunResult, key: str, *, limit: int = 5) -> list[dict[str, Any]]:
    # nlargest is sorted(..., reverse=True)[:limit], ties in step order, without a row per step
    # (the CUDA-graph shape's 68 k steps: 66 ms for the rows).
    known = ((r.rank, s) for r in result.ranks for s in r.steps if s.get(key) is not None)
    return [
        {
            "rank": rank,
            "step": s["name"],
            "index": s["index"],
            key: s.get(key),
            "gpu_span_ns": s["gpu_span_ns"],
            "nccl_ns": s["nccl_ns"],
        }
        for rank, s in heapq.nlargest(limit, known, key=lambda pair: pair[1][key])
    ]


#: Per-rank evidence rows a check keeps at most: beyond, the worst (a run of 1,024 ranks would
#: otherwise list every rank in its evidence). Runs of this many ranks or fewer keep every row as found.
EVIDENCE_RANKS = 8


def _worst_rows(rows: list[dict[str, Any]], key: str, *, lowest: bool = False) -> list[dict[str, Any]]:
    """``rows`` as they are when :data:`EVIDENCE_RANKS` or fewer, else the worst by ``key`` (rank order on ties)."""
    if len(rows) <= EVIDENCE_RANKS:
        return rows
    known = [r for r in rows if isinstance(r.get(key), int | float)]
    known.sort(key=lambda r: (r[key] if lowest else -r[key], r.get("rank", 0)))
    return known[:EVIDENCE_RANKS]


def _copy_evidence(result: RunResult) -> list[dict[str, Any]]:
    rows = _rank_evidence(result, "gpu_to_cpu_copy_rate", extra=("gpu_to_cpu_copies", "gpu_to_cpu_bytes", "gpu_ops"))
    offenders = [{"rank": r.rank, **offender} for r in result.ranks for offender in r.gpu_to_cpu_offenders]
    return rows + _worst_rows(offenders, "copies")


def _dtod_evidence(result: RunResult) -> list[dict[str, Any]]:
    rows = _rank_evidence(
        result, "dtod_to_gradient_ratio", extra=("dtod_bytes_per_step", "gradient_reduction_bytes_per_step")
    )
    every = ((r.rank, s) for r in result.ranks for s in r.steps)
    steps = [
        {"rank": rank, "step": s["name"], "dtod_copies": s["dtod_copies"], "dtod_bytes": s["dtod_bytes"]}
        for rank, s in heapq.nlargest(3, every, key=lambda pair: pair[1]["dtod_bytes"])
    ]
    return rows + steps


def _nccl_evidence(result: RunResult) -> list[dict[str, Any]]:
    return _rank_evidence(
        result,
        "nccl_share_of_step",
        extra=("nccl_step_ns", "gpu_span_ns", "nccl_exposed_ns", "nccl_wait_ns", "nccl_transfer_ns", "nccl_wait_share"),
    ) + _worst_steps(result, "nccl_share")


def _late_rank_row(result: RunResult) -> dict[str, Any] | None:
    """The late rank as evidence: how often last, how late, what it launched from, and its GPU's
    idle time waiting for its host per step beside the other ranks'."""
    late = result.waits.late if result.waits else None
    if not late and _from_inspector(result) and result.inspector.late:
        late = result.inspector.late
        return {
            "late_rank": late["rank"],
            "last_arrivals": late["last_arrivals"],
            "of_matched": late["of"],
            "median_late_ns": late["median_late_ns"],
            "p95_late_ns": late["p95_late_ns"],
            "launched_in": None,
            "late_rank_idle_host_ns_per_step": None,
            "other_ranks_idle_host_ns_per_step": None,
            "host": late["host"],
            "pid": late["pid"],
            "arrival_from": f"NCCL Inspector: {late['arrival_source']}",
            **_held_up_fields(late),
        }
    if not late:
        return None
    idle = {r.rank: _median_of([s.get("idle_host_ns") for s in r.steps]) for r in result.ranks}
    others = [v for rank, v in idle.items() if rank != late["rank"] and v is not None]
    return {
        "late_rank": late["rank"],
        "last_arrivals": late["last_arrivals"],
        "of_matched": late["of"],
        "median_late_ns": late["median_late_ns"],
        "p95_late_ns": late["p95_late_ns"],
        "launched_in": ", ".join(p["phase"] for p in late["launched_in"]) or None,
        "late_rank_idle_host_ns_per_step": idle.get(late["rank"]),
        "other_ranks_idle_host_ns_per_step": statistics.median(others) if others else None,
        **_held_up_fields(late),
    }


def _held_up_fields(late: dict[str, Any]) -> dict[str, Any]:
    """How long the late rank held the others up, and the rank that held them up longest when that
    is another one (metrics.waits: last most often is not always costliest)."""
    other = late.get("longest_held_up_by")
    return {
        "held_up_ns": late.get("held_up_ns"),
        "held_up_share": late.get("held_up_share"),
        "longest_held_up_by_rank": other["rank"] if other else None,
        "longest_held_up_by_last_arrivals": other["last_arrivals"] if other else None,
        "longest_held_up_by_median_late_ns": other["median_late_ns"] if other else None,
        "longest_held_up_by_held_up_share": other["held_up_share"] if other else None,
    }


def _median_of(values: list[Any]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _from_inspector(result: RunResult) -> bool:
    """The run's wait / transfer split comes from NCCL Inspector logs (pipeline.merge_inspector)."""
    return result.metrics.get("wait_source") == "nccl_inspector" and result.inspector is not None


def _wait_evidence(result: RunResult) -> list[dict[str, Any]]:
    rows = [row] if (row := _late_rank_row(result)) else []
    if _from_inspector(result):
        keys = ("rank", "host", "pid", "nccl_wait_share", "nccl_wait_ns", "nccl_transfer_ns")
        ranked = sorted(result.inspector.per_rank, key=lambda r: r["nccl_wait_share"] or 0, reverse=True)
        return rows + [{k: r[k] for k in keys} for r in ranked[:4]]
    return rows + _rank_evidence(result, "nccl_wait_share", extra=("nccl_wait_ns", "nccl_transfer_ns"))


def late_rank_sentence(result: RunResult) -> str | None:
    """ "rank 1 arrived last at 360 of 360 matched collectives, median 30.1 ms late; its GPU waited
    for its host 30.2 ms per step (the others 0.1 ms)": the cause, in one sentence."""
    row = _late_rank_row(result)
    if row is None:
        return None
    text = (
        f"rank {row['late_rank']} arrived last at {row['last_arrivals']} of {row['of_matched']} matched "
        f"collectives, median {format_ns(row['median_late_ns'] or 0)} late"
    )
    if row["launched_in"]:
        text += f" (launched in `{row['launched_in']}`)"
    mine, others = row["late_rank_idle_host_ns_per_step"], row["other_ranks_idle_host_ns_per_step"]
    if mine is not None and others is not None:
        text += f"; its GPU waited for its host {format_ns(mine)} per step (the other ranks {format_ns(others)})"
    if row["longest_held_up_by_rank"] is not None:
        share, mine_share = row["longest_held_up_by_held_up_share"], row["held_up_share"]
        median = format_ns(row["longest_held_up_by_median_late_ns"] or 0)
        text += (
            f"; but rank {row['longest_held_up_by_rank']} held the others up longest: last at "
            f"{row['longest_held_up_by_last_arrivals']}, median {median} late, {share:.0%} of the waiting for "
            f"last ranks (rank {row['late_rank']}: {mine_share:.0%})"
        )
    return text


def _split_detail(result: RunResult) -> str | None:
    """The NCCL time's split into waiting for the last rank and transfer (metrics.waits)."""
    share = result.metrics.get("nccl_wait_share")
    if share is None:
        reason = result.null_reasons.get("nccl_wait_share")
        return f"wait / transfer not split: {reason}" if reason else None
    text = f"{share:.0%} of the NCCL kernel time waits for the last rank to arrive, {1 - share:.0%} is transfer"
    late = late_rank_sentence(result) if share >= 0.25 else None
    return text + (f" ({late})" if late else "")


LATE_RANK_REMEDY = (
    "The collectives wait for a late rank, not for the link: make {who} arrive on time. Look at what its "
    "host does before the collectives (the evidence names the phase and how long its GPU sat idle waiting for "
    "the host): a slow input pipeline (more DataLoader workers, `pin_memory=True`, prefetching), per-step host "
    "syncs (`.item()`, `.cpu()`, `torch.cuda.synchronize()`, logging every step), Python launch overhead (CUDA "
    "graphs, `torch.compile`), garbage-collection pauses (`gc.freeze()` after set-up, `gc.collect()` on a fixed "
    "step), CPU contention or affinity (pin each rank to its NUMA node's cores), or uneven work per rank. "
    "Tuning NCCL or the link will not shorten this wait."
)


def _late_remedy(result: RunResult) -> str:
    late = result.metrics.get("late_rank")
    row = _late_rank_row(result)
    costliest = row["longest_held_up_by_rank"] if row else None
    if costliest is not None:
        who = f"rank {costliest} (the longest waits) and rank {late} (the most frequent)"
    else:
        who = f"rank {late}" if late is not None else "the late rank"
    text = LATE_RANK_REMEDY.format(who=who)
    exposed = result.metrics.get("exposed_wait_share")
    if exposed is not None:
        text += (
            f" Of the waiting, {exposed:.1%} of the steps' GPU time has no compute beside it: that much is what "
            "the late rank costs the step (the rest overlaps the waiting ranks' own work)."
        )
    return text


def _share_remedy(result: RunResult) -> str | None:
    """nccl_step_share's remedy by the split: the late rank's host when most NCCL time is waiting."""
    share = result.metrics.get("nccl_wait_share")
    return _late_remedy(result) if share is not None and share >= 0.5 else None


def _exposed_wait_found(result: RunResult) -> str:
    share = _m(result, "exposed_wait_share")
    shown = "an unknown share" if share is None else _pct(share)
    return f"waiting with no compute beside it {shown} of the steps' GPU time"


def _matched_steps_found(result: RunResult) -> str:
    matched, steps = _m(result, "collective_instances_matched"), _m(result, "matched_steps") or 0
    if _from_inspector(result):
        window = f"{result.inspector.window_s}-s time window"
        return (
            f"{_plural(matched or 0, 'matched collective')} in {_plural(steps, window)} (NCCL Inspector logs have no "
            "steps: each time window counts as one)"
        )
    text = f"{_plural(matched or 0, 'matched collective')} in {_plural(steps, 'step')}"
    return text


def _pageable_evidence(result: RunResult) -> list[dict[str, Any]]:
    return _rank_evidence(result, "pageable_host_share", extra=("pageable_host_bytes", "host_device_bytes"))


def _gpu_evidence(result: RunResult) -> list[dict[str, Any]]:
    """Each rank's GPUs; above :data:`EVIDENCE_RANKS` ranks, each distinct GPU list once, with its
    first rank and how many ranks have it."""
    rows = [{"rank": r.rank, "gpus": r.gpu_models} for r in result.ranks if r.gpu_models]
    if len(rows) <= EVIDENCE_RANKS:
        return rows
    grouped: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in rows:
        found = grouped.setdefault(tuple(row["gpus"]), {"rank": row["rank"], "gpus": row["gpus"], "ranks": 0})
        found["ranks"] += 1
    return list(grouped.values())


def _straggler_evidence(result: RunResult) -> list[dict[str, Any]]:
    arrivals = [
        {
            "index": s["index"],
            "latest_rank": s["latest_rank"],
            "median_lateness_ns": s["lateness_ns"],
            "median_gpu_span_ns": s["median_gpu_span_ns"],
            "arrival_spread": s["spread"],
        }
        for s in (result.waits.arrival_steps[:5] if result.waits else [])
    ]
    spans = [
        {
            "index": s.index,
            "slowest_rank": s.slowest_rank,
            "slowest_gpu_span_ns": s.slowest_ns,
            "median_gpu_span_ns": s.median_ns,
            "spread": s.spread,
        }
        for s in result.straggler_steps[:5]
    ]
    # The cause first: a rank late on its host stretches the others' GPU spans (they wait for it),
    # so the span's slowest rank is then the victim, not the straggler.
    arrival, span = _m(result, "arrival_spread"), _m(result, "straggler_spread")
    return arrivals + spans if arrival is not None and (span is None or arrival >= span) else spans + arrivals


def _straggler_remedy(result: RunResult) -> str | None:
    """The late rank's remedy when arrival lateness, not a longer GPU span, is the straggling."""
    arrival, span = _m(result, "arrival_spread"), _m(result, "straggler_spread")
    if arrival is None or _m(result, "late_rank") is None or (span is not None and span > arrival):
        return None
    return _late_remedy(result)


def _straggler_detail(result: RunResult) -> str | None:
    arrival, span = _m(result, "arrival_spread"), _m(result, "straggler_spread")
    parts = []
    if span is not None:
        parts.append(f"GPU span spread {span:.1%}")
    if arrival is not None:
        parts.append(f"arrival spread {arrival:.1%} (latest rank's median lateness at the collectives ÷ the step)")
    if arrival is not None and (span is None or arrival >= span):
        late = late_rank_sentence(result)
        if late:
            parts.append(late)
    return "; ".join(parts) or None


def _utilization_evidence(result: RunResult) -> list[dict[str, Any]]:
    """The benchmark's rows, then the trace's own largest all-reduce per rank with its bus
    bandwidth from transfer time (waiting for the last rank taken out, metrics.waits) where its
    calls were matched across ranks, else from kernel time (a lower bound)."""
    rows = _link_evidence("p2p_utilization")(result)
    trace: list[dict[str, Any]] = []
    for r in result.ranks:
        table = r.collectives
        if table.height == 0 or "bandwidth_time" not in table.columns:
            continue
        sized = table.filter((pl.col("collective") == "AllReduce") & pl.col("msg_bytes").is_not_null())
        if sized.height:
            top = sized.sort("msg_bytes", descending=True).row(0, named=True)
            trace.append(
                {
                    "source": "trace",
                    "rank": r.rank,
                    "size_bytes": top["msg_bytes"],
                    "calls": top["count"],
                    "busbw_gbps": top["busbw_gbps"],
                    "bandwidth_time": top["bandwidth_time"],
                }
            )
    return rows + _worst_rows(trace, "busbw_gbps", lowest=True) + _capture_link_rows(result)


def _capture_link_rows(result: RunResult) -> list[dict[str, Any]]:
    """Per rank with nsys GPU metrics: its NVLink and PCIe load during its NCCL kernels."""
    rows = []
    for r in result.ranks:
        if (r.link_counters or {}).get("device") is None:
            continue
        m = r.metrics
        rows.append(
            {
                "source": "nsys GPU metrics",
                "rank": r.rank,
                "gpu": r.link_counters["device"],
                "during": "NCCL kernels",
                "nvlink_avg": m.get("nvlink_nccl_avg"),
                "nvlink_peak": m.get("nvlink_nccl_peak"),
                "pcie_avg": m.get("pcie_nccl_avg"),
                "pcie_peak": m.get("pcie_nccl_peak"),
                "nccl_on_nvlink": m.get("nccl_nvlink_share"),
                "nccl_on_pcie": m.get("nccl_pcie_share"),
                "samples": m.get("link_nccl_samples"),
            }
        )
    return _worst_rows(rows, "pcie_peak")


def _pcie_detail(result: RunResult) -> str | None:
    """Which source decided, and both sources' worst figures when both were given."""
    rows = result.links.evidence.get("pcie_saturation", []) if result.links else []
    parts = []
    captured = [r for r in rows if r.get("source") == "nsys GPU metrics" and r.get("peak") is not None]
    if captured:
        worst = max(captured, key=lambda r: r["peak"])
        parts.append(
            f"nsys GPU metrics during NCCL kernels: rank {worst['rank']} (GPU {worst['gpu']}) peak "
            f"{worst['peak']:.0%}, average {worst['avg']:.0%}"
        )
    dmon = [r for r in rows if r.get("source") == "nvidia-smi dmon" and r.get("peak") is not None]
    if dmon:
        worst = max(dmon, key=lambda r: r["peak"])
        parts.append(f"nvidia-smi dmon: GPU {worst['gpu']} peak {worst['peak']:.0%} of the rated speed")
    source = _m(result, "pcie_saturation_source")
    if len(parts) > 1 and source:
        parts.append(f"the verdict is the worse: {source}")
    return "; ".join(parts) or None


def _link_evidence(rule_id: str) -> Callable[[RunResult], list[dict[str, Any]]]:
    def evidence(result: RunResult) -> list[dict[str, Any]]:
        return list(result.links.evidence.get(rule_id, [])) if result.links else []

    return evidence


def _m(result: RunResult, key: str) -> Any:
    return result.metrics.get(key)


def _count(result: RunResult, key: str, noun: str) -> str:
    value = _m(result, key)
    return f"an unknown number of {_plural_noun(noun)}" if value is None else _plural(value, noun)


def _gpu_ops_found(result: RunResult) -> str:
    return f"{_count(result, 'gpu_to_cpu_copies', 'GPU→CPU copy')} among {_count(result, 'gpu_ops', 'GPU op')}"


def _copies_per_step_found(result: RunResult) -> str:
    steps, per_step = _m(result, "step_count") or 0, _m(result, "gpu_to_cpu_copies_per_step")
    text = f"{_count(result, 'gpu_to_cpu_copies', 'GPU→CPU copy')} over {_plural(steps, 'step')}"
    return text + (f" = {per_step:.3g} per step" if per_step is not None and steps > 1 else "")


def _pageable_found(result: RunResult) -> str:
    moved, steps = _m(result, "pageable_host_bytes"), _m(result, "step_count") or 0
    per_step = _m(result, "pageable_host_bytes_per_step")
    text = f"{format_bytes(moved) if moved is not None else 'an unknown volume'} of pageable host↔device copies"
    text += f" over {_plural(steps, 'step')}"
    return text + (f" = {format_bytes(per_step)} per step" if per_step is not None and steps > 1 else "")


def _gradient_found(result: RunResult) -> str:
    payload, carrier = _m(result, "gradient_reduction_bytes_per_step"), _m(result, "gradient_reduction_collective")
    shown = "unknown" if payload is None else format_bytes(payload)
    return f"gradient-reduction payload{f' ({carrier})' if carrier else ''} {shown} per step"


def _nccl_span_found(result: RunResult) -> str:
    span, steps = _m(result, "gpu_span_ns"), _m(result, "step_count") or 0
    return f"{format_ns(span) if span is not None else 'unknown'} of GPU work in {_plural(steps, 'step')}"


def _collective_calls_found(result: RunResult) -> str:
    text = _count(result, "collective_calls_sized", "sized collective call")
    steps, per_step = _m(result, "step_count"), _m(result, "collective_calls_per_step")
    if steps:
        text += f" over {_plural(steps, 'step')}"
        if per_step is not None and steps > 1:
            text += f" = {per_step:.3g} per step"
    return text


def _small_evidence(result: RunResult) -> list[dict[str, Any]]:
    """Per rank: small calls, their shares and per-step count; then the issuers of small calls."""
    rows = _rank_evidence(
        result,
        "small_collective_time_share",
        extra=(
            "small_collective_calls",
            "collective_calls_sized",
            "small_collective_share",
            "small_collectives_per_step",
        ),
    )
    offenders = [
        {"rank": r.rank, **offender}
        for r in result.ranks
        for offender in (r.small_collectives or {}).get("offenders", [])[:3]
    ]
    return rows + _worst_rows(offenders, "calls")


def _host_copies_found(result: RunResult) -> str:
    moved = _m(result, "host_device_bytes")
    steps, per_step = _m(result, "step_count"), _m(result, "host_device_bytes_per_step")
    text = _count(result, "host_device_copies", "host↔device copy")
    if moved is not None:
        text += f", {format_bytes(moved)}"
    if steps:
        text += f" over {_plural(steps, 'step')}"
        if per_step is not None and steps > 1:
            text += f" = {format_bytes(per_step)} per step"
    return text


def _gpu_model_ranks_found(result: RunResult) -> str:
    return f"{_plural(_m(result, 'gpu_model_ranks') or 0, 'rank')} with a named GPU model"


def _straggler_found(result: RunResult) -> str:
    return f"{_plural(_m(result, 'straggler_evidence_steps') or 0, 'step')} compared across ranks"


def _connections_found(result: RunResult) -> str:
    lines = _m(result, "nccl_connections")
    judged = (_m(result, "transport_observations") or 0) - (lines or 0)
    parts = [_plural(lines, "NCCL connection line")] if lines is not None else []
    if judged or lines is None:
        parts.append(f"{_plural(judged, 'rank pair')} of NVLink peers judged from the captures' link counters")
    return " and ".join(parts)


def _dmon_found(result: RunResult) -> str:
    samples = _plural(_m(result, "pcie_samples") or 0, "PCIe sample")
    if _m(result, "pcie_saturation_source") == "nsys GPU metrics":
        return f"{samples} during NCCL kernels (nsys GPU metrics) on the rank with the fewest"
    return f"{_plural(_m(result, 'pcie_samples') or 0, 'dmon PCIe sample')} on the GPU with the fewest"


def _largest_message_found(result: RunResult) -> str:
    size = _m(result, "allreduce_largest_bytes")
    shown = format_bytes(size) if size is not None else "unknown"
    if _m(result, "utilization_source") == "nccl_inspector":
        coll = (result.inspector.metrics.get("utilization_collective") if result.inspector else None) or "collective"
        return f"largest {coll} message in the NCCL Inspector logs {shown}"
    return f"largest all-reduce message in the benchmark {shown}"


def _small_sizes_found(result: RunResult) -> str:
    return f"{_plural(_m(result, 'allreduce_small_sizes') or 0, 'timed all-reduce size')} of at most 8 KiB"


RULES: dict[str, Rule] = {
    rule.id: rule
    for rule in (
        Rule(
            "gpu_to_cpu_copy_rate",
            "GPU→CPU copies",
            "gpu_to_cpu_copy_rate",
            "share",
            "Keep training data on the GPU: remove per-step host synchronisations (`loss.item()`, "
            "`.cpu()`, `.numpy()`, `print(tensor)`, metric logging every step — log every N steps "
            "instead) and never stage gradients through the CPU for all-reduce (`tensor.cpu()` → "
            "all_reduce → `.to(device)`); let DDP/NCCL reduce them on the GPU.",
            _copy_evidence,
            floors=(
                Floor(
                    "min_gpu_ops",
                    "gpu_ops",
                    "GPU op",
                    _gpu_ops_found,
                    "too few GPU ops for a rate: a single copy would cross the bounds",
                ),
                Floor(
                    "min_copies_per_step",
                    "gpu_to_cpu_copies_per_step",
                    "copy per step",
                    _copies_per_step_found,
                    "fewer than one per step is the every-N-steps habit the remedy recommends, not a per-step sync",
                    finding=True,
                ),
            ),
            step_based=True,
        ),
        Rule(
            "dtod_copy_volume",
            "Device-to-device copy volume per step",
            "dtod_to_gradient_ratio",
            "ratio",
            "Construct DDP with `gradient_as_bucket_view=True`: gradients then live in the all-reduce "
            "buckets instead of being copied into them every step. If copies remain, look for "
            "`.clone()`/`.contiguous()` on gradients and custom comm hooks; tune `bucket_cap_mb`.",
            _dtod_evidence,
            floors=(
                Floor(
                    "min_gradient_bytes_per_step",
                    "gradient_reduction_bytes_per_step",
                    "bytes_per_step",
                    _gradient_found,
                    "too small a payload to be gradients (a scalar or a flag), so no yardstick for DtoD volume",
                ),
            ),
            step_based=True,
        ),
        Rule(
            "nccl_step_share",
            "NCCL share of step time",
            "nccl_share_of_step",
            "share",
            "Find out why communication dominates: check the transport in `NCCL_DEBUG=INFO` (`via P2P` "
            "expected inside a node; unset `NCCL_P2P_DISABLE`, enlarge `/dev/shm` if SHM fails); let "
            "all-reduce overlap backward (`bucket_cap_mb` 25–100); on PCIe-bound nodes register a bf16 "
            "or fp16 compression hook, on slow links PowerSGD; a larger per-GPU batch amortises the "
            "all-reduce. NCCL kernel time includes waiting for the slowest rank: compare "
            "`nccl_exposed_ns` and the straggler check.",
            _nccl_evidence,
            floors=(
                Floor(
                    "min_gpu_span_ns",
                    "gpu_span_ns",
                    "ns",
                    _nccl_span_found,
                    "too little GPU work: one collective's launch and sync would decide the share",
                ),
            ),
            step_based=True,
            detail=_split_detail,
            remedy_for=_share_remedy,
        ),
        Rule(
            "collective_wait",
            "Collective time spent waiting for the last rank",
            "nccl_wait_share",
            "share",
            LATE_RANK_REMEDY.format(who="the late rank"),
            _wait_evidence,
            floors=(
                Floor(
                    "min_steps",
                    "matched_steps",
                    "step",
                    _matched_steps_found,
                    "too few steps with collectives matched across ranks: one slow step would decide",
                ),
                Floor(
                    "min_exposed_wait_share",
                    "exposed_wait_share",
                    "share",
                    _exposed_wait_found,
                    "the waiting is hidden behind the waiting ranks' own compute, so the late rank costs the "
                    "step next to nothing: no finding",
                    finding=True,
                ),
            ),
            step_based=True,
            detail=lambda result: late_rank_sentence(result),
            remedy_for=_late_remedy,
        ),
        Rule(
            "pageable_host_copies",
            "Host↔device copies from pageable memory",
            "pageable_host_share",
            "share",
            "Pin host memory: `DataLoader(pin_memory=True)`, `tensor.pin_memory()`, and copy with "
            "`.to(device, non_blocking=True)`; pageable copies are staged through a driver buffer and "
            "block the host.",
            _pageable_evidence,
            floors=(
                Floor(
                    "min_bytes_per_step",
                    "host_device_bytes_per_step",
                    "bytes_per_step",
                    _host_copies_found,
                    "too little to judge the data path",
                ),
                Floor(
                    "min_pageable_bytes_per_step",
                    "pageable_host_bytes_per_step",
                    "bytes_per_step",
                    _pageable_found,
                    "too little pageable traffic to cost anything measurable: no finding",
                    finding=True,
                ),
            ),
            step_based=True,
        ),
        Rule(
            "homogeneous_gpus",
            "One GPU model across ranks",
            "distinct_gpu_models",
            "count",
            "Schedule the job on one GPU model (node selector / partition): every collective runs at "
            "the pace of the slowest GPU.",
            _gpu_evidence,
            floors=(Floor("min_ranks", "gpu_model_ranks", "rank", _gpu_model_ranks_found, "nothing to compare"),),
        ),
        Rule(
            "straggler",
            "Straggler spread of step time",
            "straggler_worst",
            "share",
            "One rank is slower than the rest: compare its phases with the others' (data loading, CPU "
            "contention or affinity, a different GPU or NUMA placement, thermal or power throttling — "
            "`nvidia-smi -q -d CLOCK,PERFORMANCE`), and its NCCL transport.",
            _straggler_evidence,
            floors=(
                Floor(
                    "min_steps",
                    "straggler_evidence_steps",
                    "step",
                    _straggler_found,
                    "too few steps to tell a slow rank from one slow step (warm-up, a checkpoint, a GC pause)",
                ),
            ),
            step_based=True,
            detail=_straggler_detail,
            remedy_for=_straggler_remedy,
        ),
        Rule(
            "transport_p2p",
            "NCCL transport inside a node",
            "transport_fallback_pairs",
            "count",
            "GPUs of one node talk through shared memory or the network instead of P2P (NVLink/PCIe): "
            "unset `NCCL_P2P_DISABLE` / `NCCL_P2P_LEVEL` (and `NCCL_SHM_DISABLE`), check that the "
            "container sees every GPU of the node (`CUDA_VISIBLE_DEVICES`, `--ipc=host`, IOMMU/ACS "
            "settings that block peer access), and enlarge `/dev/shm` (`--shm-size`) if SHM set-up fails.",
            _link_evidence("transport_p2p"),
            floors=(
                Floor(
                    "min_connections",
                    "transport_observations",
                    "observation",
                    _connections_found,
                    "too little of the log or the link counters shows how the ranks talk",
                ),
            ),
        ),
        Rule(
            "pcie_saturation",
            "PCIe link saturation",
            "pcie_saturation",
            "share",
            "A GPU's PCIe link runs near its rated speed: communication or host copies are PCIe-bound. "
            "Keep gradients on NVLink (P2P), compress them (bf16/fp16 hook, PowerSGD), pin host memory "
            "and cut host↔device traffic (data on the GPU, no per-step `.cpu()`).",
            _link_evidence("pcie_saturation"),
            floors=(
                Floor(
                    "min_samples",
                    "pcie_samples",
                    "sample",
                    _dmon_found,
                    "too few samples: their peak is one burst, not the link's load",
                ),
            ),
            detail=_pcie_detail,
        ),
        Rule(
            "p2p_utilization",
            "Collective bus bandwidth vs expected peak",
            "p2p_utilization",
            "share",
            "Large all-reduces run below the links' expected bandwidth: compare the NCCL transport "
            "(`NCCL_DEBUG=INFO`), the algorithm/protocol (`NCCL_ALGO`, `NCCL_PROTO` left unset), channel "
            "count (`NCCL_MIN_NCHANNELS`), GPU clocks and link errors (`nvidia-smi nvlink -e`).",
            _utilization_evidence,
            floors=(
                Floor(
                    "min_message_bytes",
                    "allreduce_largest_bytes",
                    "bytes",
                    _largest_message_found,
                    "below the bandwidth plateau: bus bandwidth there measures the ramp-up, not the links",
                ),
            ),
        ),
        Rule(
            "allreduce_latency",
            "Small-message all-reduce latency",
            "allreduce_small_latency_us",
            "us",
            "Small all-reduces are slow: launch overhead or a slow transport. Capture the step in a CUDA "
            "graph, let NCCL pick LL/LL128 (`NCCL_PROTO` unset), check the transport, and fuse small "
            "tensors into larger buckets.",
            _link_evidence("allreduce_latency"),
            floors=(
                Floor(
                    "min_sizes",
                    "allreduce_small_sizes",
                    "size",
                    _small_sizes_found,
                    "too few sizes for a median: one noisy size would decide",
                ),
            ),
        ),
        Rule(
            "small_collectives",
            "Communication split into small collectives",
            "small_collective_time_share",
            "share",
            "Batch the communication into fewer, larger collectives: each launch pays a fixed latency and a "
            "message under a megabyte never reaches the link's bandwidth. DDP: raise `bucket_cap_mb` (25–100) "
            "and never all-reduce parameters one by one by hand; many tensors: "
            "`torch.distributed.all_reduce_coalesced` or a `_coalescing_manager` block (one launch for a "
            "group); FSDP: wrap larger units (`auto_wrap_policy` with a larger `min_num_params`, one unit per "
            "transformer block rather than per layer); metrics: sync them every N steps, or gather them in "
            "one tensor first.",
            _small_evidence,
            floors=(
                Floor(
                    "min_calls_per_step",
                    "collective_calls_per_step",
                    "call",
                    _collective_calls_found,
                    "too few collective calls per step to be split into many: no finding",
                    finding=True,
                ),
            ),
            step_based=True,
        ),
    )
}
CAPTURE_HEALTH = "capture_health"
KNOWN_RULES = frozenset({CAPTURE_HEALTH, *RULES})


def validate_profile(profile: Profile) -> None:
    """Reject rule ids no rule has, and floors (``min_*`` keys) the rule does not declare: a typo
    must not silently turn a check, or its minimum evidence, off."""
    unknown = sorted(set(profile.rules) - KNOWN_RULES)
    if unknown:
        raise ProfileError(
            f"profile {profile.name!r} configures unknown rule(s) {', '.join(unknown)}",
            hint=f"known rules: {', '.join(sorted(KNOWN_RULES))}",
        )
    for rule_id, config in profile.rules.items():
        declared = {floor.key for floor in RULES[rule_id].floors} if rule_id in RULES else set()
        stray = sorted(set(config.minimum) - declared)
        if stray:
            raise ProfileError(
                f"profile {profile.name!r}: [rules.{rule_id}] has unknown floor(s) {', '.join(stray)}",
                hint=f"{rule_id}'s floors: {', '.join(sorted(declared)) or 'none (it judges the capture itself)'}",
            )


CAPTURE_HEALTH_REMEDY = (
    "Capture GPU activity and step ranges: `nsys profile --trace=cuda,nvtx ...` (or torch.profiler with "
    "CUDA activity), and wrap every training step in an NVTX range named like `Batch N` (or call "
    "`prof.step()` with torch.profiler) with phases nested inside. With nsys 2022.4 use the Python "
    "`nvtx` package 0.2.11 or older (0.2.13+ ranges are invisible to it), or `torch.cuda.nvtx`."
)


def evaluate(result: RunResult, profile: Profile) -> list[CheckResult]:
    """Run every rule the profile knows, in a stable order: capture health first."""
    checks = [capture_health(result, profile.rule(CAPTURE_HEALTH) or RuleConfig())]
    for rule_id, rule in RULES.items():
        config = profile.rule(rule_id)
        if config is None:
            continue
        checks.append(_threshold_check(rule, config, result))
    return checks


def _threshold_check(rule: Rule, config: RuleConfig, result: RunResult) -> CheckResult:
    value = result.metrics.get(rule.metric) if rule.metric else None
    base = dict(
        id=rule.id, title=rule.title, value=value, warn=config.warn, fail=config.fail, op=config.op, unit=rule.unit
    )
    if not config.enabled:
        return CheckResult(**base, status=SKIP, message="disabled by the profile", reason="disabled by the profile")
    if value is None:
        reason = result.null_reasons.get(rule.metric or "", "not available from these inputs")
        return CheckResult(**base, status=SKIP, message=f"{rule.title}: not available", reason=reason)
    note = step_note(result) if rule.step_based else None
    crosses = _COMPARE[config.op]
    if config.fail is not None and crosses(value, config.fail):
        status, bound = FAIL, config.fail
    elif config.warn is not None and crosses(value, config.warn):
        status, bound = WARN, config.warn
    else:
        status, bound = PASS, None
    # Evidence to judge at all, then (for a warn or fail) the evidence the finding needs.
    short = _short_of_floor(rule, config, result, finding=False) or (
        _short_of_floor(rule, config, result, finding=True) if status != PASS else None
    )
    if short is not None:
        reason, row = short
        message = f"{rule.title}: {reason}" + (f" ({note})" if note else "")
        return CheckResult(**base, status=SKIP, message=message, reason=reason, evidence=[row])
    shown = format_value(value, rule.unit)
    if status == PASS:
        limits = " / ".join(
            f"{k} {config.op} {format_value(v, rule.unit)}"
            for k, v in (("warn", config.warn), ("fail", config.fail))
            if v is not None
        )
        message = f"{rule.title}: {shown} (within bounds: {limits})"
    else:
        message = f"{rule.title}: {shown} {config.op} {status} bound {format_value(bound, rule.unit)}"
    detail = rule.detail(result) if rule.detail else None
    if detail:
        message += f"; {detail}"
    if note:
        message += f" ({note})"
    evidence = rule.evidence(result) if status != PASS else []
    remedy = ((rule.remedy_for(result) if rule.remedy_for else None) or rule.remedy) if status != PASS else None
    return CheckResult(
        **base,
        status=status,
        message=message,
        reason=None,
        evidence=evidence,
        remedy=remedy,
    )


def _short_of_floor(
    rule: Rule, config: RuleConfig, result: RunResult, *, finding: bool
) -> tuple[str, dict[str, Any]] | None:
    """The first floor of the kind asked (``finding`` or not) that the profile sets and the run's
    evidence does not reach (or cannot show): the skip reason and its evidence row; None when
    every such floor is met."""
    for floor in rule.floors:
        minimum = config.minimum.get(floor.key)
        if minimum is None or floor.finding != finding:
            continue
        found = result.metrics.get(floor.metric)
        row = {"floor": floor.key, "minimum": minimum, "evidence_metric": floor.metric, "found": found}
        shown = _format_floor(minimum, floor.unit)
        if found is None:
            why = result.null_reasons.get(floor.metric, "not available from these inputs")
            return (
                f"{floor.found(result)}; {floor.metric} unknown ({why}), so the profile's {floor.key} "
                f"({shown}) cannot be checked",
                row,
            )
        if found < minimum:
            return f"{floor.found(result)} (< {shown}, the profile's {floor.key}): {floor.meaning}", row
    return None


def capture_health(result: RunResult, config: RuleConfig) -> CheckResult:
    """Fail: nothing usable. Warn: no steps, NVTX domains without ranges, clock anomalies."""
    base = dict(id=CAPTURE_HEALTH, title="Capture health", warn=None, fail=None, op=None, unit="problems")
    if not config.enabled:
        return CheckResult(
            **base,
            value=None,
            status=SKIP,
            message="disabled by the profile",
            reason="disabled by the profile",
        )
    if not result.ranks:
        reason = "no capture given: only side inputs were analysed"
        return CheckResult(**base, value=None, status=SKIP, message=reason, reason=reason)
    problems: list[dict[str, Any]] = []
    usable = 0
    for r in result.ranks:
        h = r.health
        if h["gpu_ops"] == 0 and h["ranges"] == 0:
            problems.append({"rank": r.rank, "severity": FAIL, "problem": "no GPU activity and no ranges"})
            continue
        usable += 1
        if h["steps"] == 0:
            problems.append(
                {"rank": r.rank, "severity": WARN, "problem": "no step ranges found", "ranges": h["ranges"]}
            )
        if h["domains_without_ranges"] and h["default_domain_ranges"] == 0:
            problems.append(
                {
                    "rank": r.rank,
                    "severity": WARN,
                    "problem": "NVTX domains were created but no ranges were recorded (an NVTX library "
                    "the profiler cannot read: Python nvtx >= 0.2.13 under nsys 2022.4)",
                    "domains": h["domains_without_ranges"],
                }
            )
        if not h["has_gpu_trace"] and config.params.get("expect_gpu", 1.0):
            problems.append({"rank": r.rank, "severity": WARN, "problem": "no GPU activity trace"})
        if h["negative_durations"]:
            problems.append(
                {
                    "rank": r.rank,
                    "severity": WARN,
                    "problem": "events end before they start",
                    "events": h["negative_durations"],
                }
            )
        if h.get("graph_executions"):
            problems.append(_graph_problem(r.rank, h))
    status = FAIL if usable == 0 else WARN if problems else PASS
    counts = {k: sum(r.health[k] for r in result.ranks) for k in ("gpu_ops", "ranges", "steps")}
    if status == PASS:
        message = (
            f"{len(result.ranks)} rank(s): {counts['gpu_ops']} GPU ops, {counts['ranges']} ranges, "
            f"{counts['steps']} steps"
        ) + _graph_note(result)
    else:
        message = "; ".join(f"rank {p['rank']}: {p['problem']}" for p in problems[:4])
    return CheckResult(
        **base,
        value=float(len(problems)),
        status=status,
        message=message,
        reason=None,
        evidence=_grouped_problems(problems),
        remedy=(CAPTURE_HEALTH_REMEDY + _graph_remedy(problems)) if status != PASS else None,
    )


def _grouped_problems(problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The problems as found, or above :data:`EVIDENCE_RANKS` each distinct one once: its first
    rank's row and how many ranks have it (``ranks``)."""
    if len(problems) <= EVIDENCE_RANKS:
        return problems
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for problem in problems:
        found = grouped.setdefault((problem["severity"], problem["problem"]), {**problem, "ranks": 0})
        found["ranks"] += 1
    return list(grouped.values())


def _share_of_busy(part: int, busy: int) -> str:
    return f" = {part / busy:.0%} of the GPU busy time" if busy else ""


def _graph_problem(rank: int, h: dict[str, Any]) -> dict[str, Any]:
    """CUDA graphs traced whole (metrics.graphs): how much GPU time they hide."""
    return {
        "rank": rank,
        "severity": WARN,
        "problem": f"{h['graph_executions']} CUDA graph executions ({format_ns(h['graph_ns'])}"
        f"{_share_of_busy(h['graph_ns'], h['gpu_busy_ns'])}) were traced whole (nsys --cuda-graph-trace=graph): "
        "the kernels, copies and NCCL collectives inside them are hidden, so the NCCL and copy checks skip",
        "cuda_graph_trace": h["cuda_graph_trace"],
        "graph_executions": h["graph_executions"],
        "graph_ns": h["graph_ns"],
        "gpu_busy_ns": h["gpu_busy_ns"],
    }


def _graph_note(result: RunResult) -> str:
    """For a healthy capture of graph replays: the trace mode and the GPU time graphs launched."""
    launched = [r.health for r in result.ranks if r.health.get("graph_launched_ops")]
    if not launched:
        return ""
    ops = sum(h["graph_launched_ops"] for h in launched)
    ns = sum(h["graph_launched_ns"] for h in launched)
    busy = sum(h["gpu_busy_ns"] for h in launched)
    share = _share_of_busy(ns, busy)
    return f"; CUDA graphs traced node by node: {ops} GPU ops in graph replays ({format_ns(ns)}{share})"


def _graph_remedy(problems: list[dict[str, Any]]) -> str:
    if not any(p.get("cuda_graph_trace") for p in problems):
        return ""
    return " For CUDA graph replays, `nsys profile --cuda-graph-trace=node` records the kernels inside each graph."


def verdict(checks: list[CheckResult]) -> str:
    statuses = {c.status for c in checks}
    return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS
