"""A run reported by summary (issue 30, ``docs/scale-out.md``): which ranks the report keeps whole,
and the run-wide parts that stand for the others.

Above :data:`SUMMARY_ABOVE_INPUTS` capture files (or when asked), the JSON report keeps the run's
metrics and cross-rank results as always, but only the ranks worth reading in full: the late rank
and the one that held the others up longest, the ranks every failing or warning check names in
its evidence, the slowest ranks of the worst straggler steps, and the highest rank of each key
per-rank metric that differs between ranks, at most :data:`WORST_RANKS` (:func:`chosen_ranks`,
each with why). Every rank is in ``rank_summary.distributions`` (min / p50 / p95 / max and a
histogram of each per-rank metric, :mod:`traceguard.metrics.distributions`), in the rank × step
heat maps (``rank_steps``) and in ``worst_steps``; every row is in the side output
(:mod:`traceguard.report.detail`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from traceguard.checks.rules import CheckResult
from traceguard.errors import InputError
from traceguard.metrics.distributions import rank_distributions, rank_step_matrix
from traceguard.metrics.rank import RankResult
from traceguard.metrics.run import RunResult
from traceguard.report.detail import scan

DETAIL_MODES = ("full", "summary", "auto")
#: More capture files than this: reported by summary unless the user asks for everything.
SUMMARY_ABOVE_INPUTS = 32
#: Ranks a summary report keeps whole.
WORST_RANKS = 16
#: Rows per list of worst steps, straggler steps and peer links in a summary.
WORST_ROWS = 20
#: Key per-rank metrics whose highest rank a summary keeps whole (higher is worse for each).
WORST_OF = (
    "nccl_share_of_step",
    "nccl_wait_share",
    "gpu_to_cpu_copy_rate",
    "dtod_bytes_per_step",
    "straggler_spread",
    "pageable_host_share",
)
#: Step fields drawn as rank × step heat maps: NCCL share, time waiting for the last rank, lateness,
#: GPU span.
HEATMAP_FIELDS = ("nccl_share", "nccl_wait_ns", "lateness_ns", "gpu_span_ns")
#: Step fields whose worst steps over all ranks a summary lists.
WORST_STEP_FIELDS = ("nccl_share", "nccl_wait_ns", "lateness_ns", "gpu_span_ns", "dtod_bytes")
_EVIDENCE_RANK_KEYS = ("rank", "late_rank", "slowest_rank")


def summary_wanted(mode: str, inputs: int) -> bool:
    """Whether a report of ``inputs`` capture files is by summary under ``mode`` (full/summary/auto)."""
    if mode not in DETAIL_MODES:
        raise InputError(f"--detail must be full, summary or auto, not {mode!r}")
    return mode == "summary" or (mode == "auto" and inputs > SUMMARY_ABOVE_INPUTS)


def chosen_ranks(result: RunResult, checks: Sequence[CheckResult], limit: int = WORST_RANKS) -> dict[int, list[str]]:
    """The ranks a summary keeps whole, in the order they were chosen, each with why (module docstring)."""
    present = {r.rank for r in result.ranks}
    why: dict[int, list[str]] = {}

    def add(rank: Any, reason: str) -> None:
        if isinstance(rank, int) and rank in present and (rank in why or len(why) < limit):
            reasons = why.setdefault(rank, [])
            if reason not in reasons:
                reasons.append(reason)

    late = result.waits.late if result.waits else None
    if late:
        add(late.get("rank"), "late rank")
        add(late.get("longest_held_up_by"), "held the others up longest")
    for status in ("fail", "warn"):
        for check in checks:
            if check.status != status:
                continue
            for row in check.evidence:
                for key in _EVIDENCE_RANK_KEYS:
                    add(row.get(key), f"{check.id} ({status}) evidence")
    for step in result.straggler_steps[:3]:
        add(step.slowest_rank, f"slowest at step {step.index}")
    for key in WORST_OF:
        known = [(r.metrics[key], -r.rank, r.rank) for r in result.ranks if _number(r.metrics.get(key))]
        if known and max(known)[0] > min(known)[0]:  # the same on every rank: no rank stands out
            add(max(known)[2], f"highest {key}")
    if not why and result.ranks:
        add(result.ranks[0].rank, "first rank")
    return why


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def worst_steps(ranks: Sequence[RankResult], limit: int = WORST_ROWS) -> dict[str, list[dict[str, Any]]]:
    """Per :data:`WORST_STEP_FIELDS` field, the ``limit`` steps of all ranks with the largest value
    (ties: lower rank, then lower step index)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name in WORST_STEP_FIELDS:
        rows = [
            {
                "rank": r.rank,
                "index": s.get("index"),
                "step": s.get("name"),
                name: s[name],
                "gpu_span_ns": s.get("gpu_span_ns"),
                "nccl_ns": s.get("nccl_ns"),
            }
            for r in ranks
            for s in r.steps
            if _number(s.get(name))
        ]
        rows.sort(key=lambda row: (-row[name], row["rank"], row["index"] if row["index"] is not None else -1))
        out[name] = rows[:limit]
    return out


def rank_summary(result: RunResult, chosen: dict[int, list[str]], metric_keys: Sequence[str]) -> dict[str, Any]:
    """``rank_summary``: how many ranks, the ones kept whole and why, every per-rank metric's distribution."""
    return {
        "ranks": len(result.ranks),
        "in_report": [{"rank": rank, "why": reasons} for rank, reasons in chosen.items()],
        "distributions": rank_distributions(result.ranks, metric_keys),
    }


def rank_steps(result: RunResult) -> dict[str, Any]:
    """The rank × step heat maps of :data:`HEATMAP_FIELDS` (metrics.distributions.rank_step_matrix)."""
    return rank_step_matrix(result.ranks, HEATMAP_FIELDS)


def reload(folder: Path, ranks: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The rows the streaming reduce dropped (steps' phases, collectives per step, timeline) of a
    few ranks, read back from the side output: {rank: {"phases": {position: {...}}, ...}}."""
    wanted = list(ranks)
    out: dict[int, dict[str, Any]] = {rank: {"phases": {}, "collective_steps": [], "timeline": {}} for rank in wanted}
    phases = scan(folder, "phases")
    if phases is not None:
        frame = phases.filter(pl.col("rank").is_in(wanted)).collect().sort(["rank", "position"], maintain_order=True)
        for row in frame.drop("input_index").to_dicts():
            rank, position, name = row.pop("rank"), row.pop("position"), row.pop("phase")
            row.pop("index", None)
            out[rank]["phases"].setdefault(position, {})[name] = row
    by_type = scan(folder, "collective_steps")
    if by_type is not None:
        frame = by_type.filter(pl.col("rank").is_in(wanted)).collect()
        for row in frame.drop("input_index").to_dicts():
            out[row.pop("rank")]["collective_steps"].append(row)
    timelines = scan(folder, "timelines")
    if timelines is not None:
        for rank, text in timelines.filter(pl.col("rank").is_in(wanted)).select("rank", "timeline").collect().rows():
            out[rank]["timeline"] = json.loads(text)
    return out


def restored(result: RankResult, rows: dict[str, Any]) -> RankResult:
    """A lightened rank with its reloaded rows put back (steps' phases, collectives per step,
    timeline): the rank as the reduce had it before :func:`traceguard.metrics.run.lighten`."""
    phases = rows.get("phases", {})
    steps = [{**step, "phases": phases.get(position, {})} for position, step in enumerate(result.steps)]
    by_type = dict(result.collectives_by_type or {})
    if by_type:
        by_type["steps"] = rows.get("collective_steps", [])
    return replace(result, steps=steps, collectives_by_type=by_type, timeline=rows.get("timeline") or {})
