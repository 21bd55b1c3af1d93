"""traceguard from Python: ``traceguard.analyze(paths) -> Analysis``, results as Polars frames.

A thin layer over :func:`traceguard.pipeline.analyze` (the function the CLI and the service run):
the numbers are the report's (``docs/report.schema.json``, definitions in DESIGN.md), laid out as
one row per rank × step, phase, collective type, peer, check, lane segment. Example::

    import traceguard
    run = traceguard.analyze("tests/fixtures/h200/p2p_nsys")
    run.verdict                                    # "pass" | "warn" | "fail"
    run.steps.sort("nccl_share", descending=True)  # the steps with the most NCCL time
    run.checks.filter(pl.col("status") != "pass")
    run.to_html("report.html")
    traceguard.compare(base_run, run)              # what changed between two runs
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import polars as pl

from traceguard import pipeline
from traceguard.checks.profiles import DEFAULT_PROFILE, Profile
from traceguard.ingest.sides import side_files
from traceguard.mapreduce import parse_size
from traceguard.report import compare as report_compare
from traceguard.report import html, markdown

PathLike = str | Path

#: Schemas of the frames, so that an empty frame still has its columns.
STEP_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step_index": pl.Int64(),
    "name": pl.String(),
    "cpu_ns": pl.Int64(),
    "gpu_span_ns": pl.Int64(),
    "nccl_ns": pl.Int64(),
    "nccl_share": pl.Float64(),
    "dtod_bytes": pl.Int64(),
    "dtod_copies": pl.Int64(),
    "peer_bytes": pl.Int64(),
    "peer_copies": pl.Int64(),
    # Who waited for whom (docs/collectives.md): the matched NCCL kernel time's split, the step's
    # GPU time broken down over its period, the rank's lateness at the step's collectives.
    "nccl_wait_ns": pl.Int64(),
    "nccl_transfer_ns": pl.Int64(),
    "period_ns": pl.Int64(),
    "compute_ns": pl.Int64(),
    "comm_ns": pl.Int64(),
    "comm_wait_ns": pl.Int64(),
    "comm_transfer_ns": pl.Int64(),
    "copy_ns": pl.Int64(),
    "idle_host_ns": pl.Int64(),
    "idle_other_ns": pl.Int64(),
    "lateness_ns": pl.Float64(),
}
WAIT_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "nccl_wait_ns": pl.Int64(),
    "nccl_transfer_ns": pl.Int64(),
    "nccl_wait_share": pl.Float64(),
    "collective_instances_matched": pl.Int64(),
    "last_arrivals": pl.Int64(),
    "last_arrivals_of": pl.Int64(),
    "median_late_ns": pl.Float64(),
    "p95_late_ns": pl.Float64(),
    "is_late_rank": pl.Boolean(),
    "clock_base_source": pl.String(),
    "clock_base_ns": pl.Int64(),
    "clock_offset_ns": pl.Int64(),
    "clock_residual_ns": pl.Int64(),
    "clock_matched": pl.Int64(),
    "null_reason": pl.String(),
}
#: The rank metrics ``waits`` takes as they are (the rest it unpacks or joins).
WAIT_METRICS = ("nccl_wait_ns", "nccl_transfer_ns", "nccl_wait_share", "collective_instances_matched")
ARRIVAL_SCHEMA: dict[str, pl.DataType] = {
    "step_index": pl.Int64(),
    "latest_rank": pl.Int64(),
    "lateness_ns": pl.Float64(),
    "median_gpu_span_ns": pl.Float64(),
    "spread": pl.Float64(),
}
PHASE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step_index": pl.Int64(),
    "step": pl.String(),
    "phase": pl.String(),
    "cpu_ns": pl.Int64(),
    "gpu_ns": pl.Int64(),
    "nccl_ns": pl.Int64(),
    "nccl_share": pl.Float64(),
}
COLLECTIVE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "step_index": pl.Int64(),
    "collective": pl.String(),
    "count": pl.Int64(),
    "time_ns": pl.Int64(),
    "exposed_ns": pl.Int64(),
    "bytes": pl.Int64(),
    "bytes_known": pl.Int64(),
}
COPY_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "kind": pl.String(),
    "copy_kind": pl.String(),
    "src_kind": pl.String(),
    "dst_kind": pl.String(),
    "ops": pl.Int64(),
    "bytes": pl.Int64(),
    "time_ns": pl.Int64(),
}
PEER_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "peer": pl.Int64(),
    "kernels": pl.Int64(),
    "time_ns": pl.Int64(),
    "sends": pl.Int64(),
    "recvs": pl.Int64(),
    "bytes": pl.Int64(),
    "source": pl.String(),
}
CHECK_SCHEMA: dict[str, pl.DataType] = {
    "id": pl.String(),
    "status": pl.String(),
    "value": pl.Float64(),
    "unit": pl.String(),
    "op": pl.String(),
    "warn": pl.Float64(),
    "fail": pl.Float64(),
    "message": pl.String(),
    "reason": pl.String(),
    "remedy": pl.String(),
}
METRIC_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "metric": pl.String(),
    "value": pl.Float64(),
    "null_reason": pl.String(),
}
TIMELINE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int64(),
    "lane": pl.String(),
    "kind": pl.String(),
    "collective": pl.String(),
    "start_ns": pl.Int64(),
    "end_ns": pl.Int64(),
    "busy_ns": pl.Int64(),
    "label": pl.String(),
}


def _frame(rows: list[dict[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame([{k: row.get(k) for k in schema} for row in rows], schema=schema, orient="row")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass
class Analysis:
    """One run's analysis: the JSON report (``report``) and its tables as Polars frames.

    Frames are built on first access and kept. Times are integer ns, sizes bytes, shares
    fractions in [0, 1]; ``rank`` is the run's rank, ``step_index`` the step's index in time order
    within its rank (from 0). ``raw`` is the pipeline's result (normalized captures, per-rank
    metrics) when the analysis was run here; None for a report loaded with :meth:`from_report`.
    """

    report: dict[str, Any]
    raw: pipeline.Analysis | None = field(default=None, repr=False)

    @classmethod
    def from_report(cls, report: dict[str, Any] | PathLike) -> Analysis:
        """An Analysis of a JSON report (a dict, or a file ``traceguard analyze -f json`` wrote)."""
        if not isinstance(report, dict):
            import orjson

            report = orjson.loads(Path(report).read_bytes())
        return cls(report=report)

    @cached_property
    def ranks(self) -> list[dict[str, Any]]:
        """Every rank's report entry: the report's ``ranks``, or for a report by summary (issue 30)
        every rank read back from its Parquet side output (``detail.folder``) while that exists;
        the frames below are built from these."""
        from traceguard.report.detail import rank_entries

        detail = self.report.get("detail") or {}
        folder = Path(detail["folder"]) if detail.get("mode") == "summary" and detail.get("folder") else None
        if folder is None or not folder.is_dir():
            return list(self.report["ranks"])
        return [entry for batch in rank_entries(folder) for entry in batch]

    def __repr__(self) -> str:
        ranks = (self.report.get("rank_summary") or {}).get("ranks", len(self.report["ranks"]))
        return f"<traceguard.Analysis verdict={self.verdict} ranks={ranks} profile={self.report['profile']['name']}>"

    @property
    def verdict(self) -> str:
        """``pass``, ``warn`` or ``fail``: the worst check status (skips count as pass)."""
        return str(self.report["verdict"])

    @cached_property
    def steps(self) -> pl.DataFrame:
        """One row per rank × step (the report's ``ranks[].steps``): CPU time of the step range,
        GPU span, NCCL time (union of NCCL kernels), NCCL share of the span, DtoD / peer copies;
        the NCCL time of the step's matched collectives split into waiting for the last rank and
        transfer (``nccl_wait_ns``, ``nccl_transfer_ns``); the step's GPU time over its period
        (``period_ns``) broken down into ``compute_ns``, ``comm_ns`` (exposed NCCL: ``comm_wait_ns``
        + ``comm_transfer_ns``), ``copy_ns``, ``idle_host_ns`` (the GPU waited for its host) and
        ``idle_other_ns``; ``lateness_ns``, the rank's median arrival after the first rank's at the
        step's collectives. Null where the report is (one rank, nothing matched, clocks not trusted).

        The rank × step lateness table: ``run.steps.pivot("rank", index="step_index", values="lateness_ns")``.
        """
        rows = [
            {**step, "rank": rank["rank"], "step_index": step["index"]}
            for rank in self.ranks
            for step in rank["steps"]
        ]
        return _frame(rows, STEP_SCHEMA)

    @cached_property
    def waits(self) -> pl.DataFrame:
        """Who waited for whom, one row per rank (docs/collectives.md): its matched NCCL kernel time
        split into waiting for the last rank and transfer (``nccl_wait_share`` = wait ÷ both), the
        matched collective instances it is in, how often it arrived last (``last_arrivals`` of
        ``last_arrivals_of``) and how late (median, p95), whether it is the run's late rank, and its
        clock: the capture's base and where it came from, the offset that aligned it and the residual
        (how well its collective ends agree with the others' after alignment). ``null_reason``: why
        the split is null for the rank."""
        late = (self.report["run"].get("metrics") or {}).get("late_rank")
        clocks = {c["rank"]: c for c in (self.clock_alignment or {}).get("ranks") or []}
        rows = []
        for rank in self.ranks:
            metrics = rank["metrics"]
            arrivals = metrics.get("last_arrivals") or {}
            clock = clocks.get(rank["rank"], {})
            rows.append(
                {
                    **{k: metrics.get(k) for k in WAIT_METRICS},
                    "rank": rank["rank"],
                    "last_arrivals": arrivals.get("count"),
                    "last_arrivals_of": arrivals.get("of"),
                    "median_late_ns": arrivals.get("median_late_ns"),
                    "p95_late_ns": arrivals.get("p95_late_ns"),
                    "is_late_rank": None if late is None else late == rank["rank"],
                    "clock_base_source": clock.get("base_source"),
                    "clock_base_ns": clock.get("base_ns"),
                    "clock_offset_ns": clock.get("offset_ns"),
                    "clock_residual_ns": clock.get("residual_ns"),
                    "clock_matched": clock.get("matched"),
                    "null_reason": (metrics.get("null_reasons") or {}).get("nccl_wait_ns"),
                }
            )
        return _frame(rows, WAIT_SCHEMA)

    @cached_property
    def arrivals(self) -> pl.DataFrame:
        """Per step index (the report's ``run.arrival_steps``: the 20 with the largest spread, largest
        first): the rank with the largest median lateness at the step's matched collectives, that
        lateness, the step's median GPU span across ranks and their ratio (the arrival spread)."""
        rows = [{**row, "step_index": row["index"]} for row in self.report["run"].get("arrival_steps") or []]
        return _frame(rows, ARRIVAL_SCHEMA)

    @property
    def late_rank(self) -> dict[str, Any] | None:
        """The rank the others waited for (``run.late_rank``): rank, last_arrivals, of, share,
        median / p95 lateness (ns), the steps it was late in and the phases it launched its late
        calls from; None when there is none (the reason: ``run.metrics`` ``late_rank``)."""
        return self.report["run"].get("late_rank")

    @property
    def clock_alignment(self) -> dict[str, Any] | None:
        """How the ranks were put on one clock (``run.clock_alignment``): method, reference rank,
        ``trusted`` and the ``reason`` when not, the residual limit, per rank base / offset / residual."""
        return self.report["run"].get("clock_alignment")

    @cached_property
    def phases(self) -> pl.DataFrame:
        """One row per rank × step × phase (NVTX ranges directly inside a step): CPU time of the
        range, GPU time and NCCL time of the ops launched in it; ``nccl_share`` = nccl ÷ gpu."""
        rows = [
            {
                "rank": rank["rank"],
                "step_index": step["index"],
                "step": step["name"],
                "phase": name,
                **times,
                "nccl_share": times["nccl_ns"] / times["gpu_ns"] if times.get("gpu_ns") else None,
            }
            for rank in self.ranks
            for step in rank["steps"]
            for name, times in step["phases"].items()
        ]
        return _frame(rows, PHASE_SCHEMA)

    @cached_property
    def collectives(self) -> pl.DataFrame:
        """Collectives by type (DESIGN.md): per rank, a totals row over the window
        (``step_index`` null) and one row per step that ran the type: kernel count, time (union),
        exposed time (no compute beside it), bytes (null unless every kernel's size is known)."""
        rows: list[dict[str, Any]] = []
        for rank in self.ranks:
            by_type = rank.get("collectives_by_type") or {}
            rows += [{**t, "rank": rank["rank"], "step_index": None} for t in by_type.get("totals", [])]
            rows += [{**t, "rank": rank["rank"]} for t in by_type.get("steps", [])]
        return _frame(rows, COLLECTIVE_SCHEMA)

    @cached_property
    def peers(self) -> pl.DataFrame:
        """The point-to-point rank × peer matrix (send/recv kernels), one row per (rank, peer)."""
        rows = [row for rank in self.ranks for row in (rank.get("peers") or {}).get("rows", [])]
        return _frame(rows, PEER_SCHEMA)

    @cached_property
    def copies(self) -> pl.DataFrame:
        """Every memcpy and memset of the captures (the whole capture, not only the analysis
        window the metrics count), per rank, kind and direction: ops, Σ bytes, Σ durations.

        Needs the captures: available on an Analysis run here, not on one :meth:`from_report` made
        (ValueError)."""
        if self.raw is None:
            raise ValueError("copies need the captures: this Analysis was loaded from a report")
        if self.raw.copies.height == 0:
            return pl.DataFrame(schema=COPY_SCHEMA)
        frame = self.raw.copies.select([pl.col(name).cast(dtype) for name, dtype in COPY_SCHEMA.items()])
        return frame.sort("rank", "kind", "copy_kind", "src_kind", "dst_kind", nulls_last=True)

    @cached_property
    def checks(self) -> pl.DataFrame:
        """One row per check: status (pass/warn/fail/skip), value and its bounds, the message,
        the reason a check was skipped, and the remedy of a failing one."""
        rows = [{**c, "value": _number(c.get("value"))} for c in self.report["checks"]]
        return _frame(rows, CHECK_SCHEMA)

    @cached_property
    def metrics(self) -> pl.DataFrame:
        """Numeric metrics, run-level (``rank`` null) then per rank, with the reason of a null one."""
        rows: list[dict[str, Any]] = []
        scopes = [(None, self.report["run"]["metrics"])] + [(r["rank"], r["metrics"]) for r in self.ranks]
        for rank, metrics in scopes:
            reasons = metrics.get("null_reasons", {})
            for name, value in metrics.items():
                if name == "null_reasons" or (value is not None and _number(value) is None):
                    continue
                rows.append({"rank": rank, "metric": name, "value": _number(value), "null_reason": reasons.get(name)})
        return _frame(rows, METRIC_SCHEMA)

    @cached_property
    def timeline(self) -> pl.DataFrame:
        """The timeline's segments (metrics/timeline.py): per rank and lane, start/end in ns on the
        capture's clock, the lane's busy ns inside the segment, and a step or phase name."""
        rows: list[dict[str, Any]] = []
        for rank in (self.report.get("timeline") or {}).get("ranks", []):
            origin = rank["origin_ns"] or 0
            for lane in rank["lanes"]:
                labels = lane.get("labels") or [None] * len(lane["start"])
                for start, end, busy, label in zip(lane["start"], lane["end"], lane["busy"], labels, strict=True):
                    rows.append(
                        {
                            "rank": rank["rank"],
                            "lane": lane["name"],
                            "kind": lane["kind"],
                            "collective": lane.get("collective"),
                            "start_ns": origin + start,
                            "end_ns": origin + end,
                            "busy_ns": busy,
                            "label": label,
                        }
                    )
        return _frame(rows, TIMELINE_SCHEMA)

    def to_html(self, path: PathLike | None = None) -> str:
        """The HTML report (plotly.js embedded, opens offline); also written to ``path`` if given."""
        page = html.render(self.report)
        if path is not None:
            Path(path).write_text(page)
        return page

    def to_markdown(self) -> str:
        return markdown.render(self.report)

    def _repr_html_(self) -> str:
        """In a notebook: the verdict and the checks table (the full report is :meth:`to_html`)."""
        table = self.checks.select("id", "status", "value", "message")._repr_html_()
        return f"<p><b>traceguard verdict: {self.verdict}</b></p>{table}"


def analyze(
    paths: PathLike | Iterable[PathLike],
    *,
    profile: str | Profile = DEFAULT_PROFILE,
    step_pattern: str | Sequence[str] | None = None,
    step_source: str | Sequence[str] | None = None,
    nccl_log: PathLike | Sequence[PathLike] | None = None,
    dmon: PathLike | Sequence[PathLike] | None = None,
    nccl_tests: PathLike | Sequence[PathLike] | None = None,
    topo: PathLike | None = None,
    smi_q: PathLike | None = None,
    scheduler: str | None = None,
    jobs: int | None = None,
    sliced_above: int | str | None = None,
    detail: str = "auto",
    detail_dir: PathLike | None = None,
) -> Analysis:
    """Analyse one run: capture files (nsys ``.sqlite[.gz]``/``.nsys-rep``, Kineto ``.json[.gz]``),
    run directories, and side files (NCCL logs, nvidia-smi output), as ``traceguard analyze`` does.

    ``profile``: a checklist name (``traceguard profiles``) or ``.toml`` path. ``step_pattern``:
    regex(es) naming your step ranges, tried before the profile's; ``step_source``: the step
    sources to try, in order (``pattern``, ``convention``, ``inferred``, ``window``). Side files
    can also be given among ``paths`` (recognised by content). ``scheduler`` / ``jobs``: where the
    per-file analyses run, as ``--scheduler`` / ``--jobs`` (``local``, ``serial``, a Dask address;
    :mod:`traceguard.mapreduce`); a script that uses the local process pool needs the
    ``if __name__ == "__main__":`` guard. ``sliced_above``: nsys exports of at least this size
    (bytes, or ``"4G"``) are analysed in time slices with bounded memory, as ``--sliced-above``.
    ``detail`` / ``detail_dir``: ``--detail`` / ``--detail-out`` (above 32 capture files the report
    is a summary and every rank's rows go to a Parquet side output, by default in a new temporary
    folder: ``report["detail"]["folder"]``; the frames below still hold every rank, read from it).

    Raises :class:`traceguard.errors.NoUsableInputError` (naming each file and what is wrong with it)
    when nothing given can be read, :class:`traceguard.errors.ProfileError` for a bad profile.
    """
    items = [paths] if isinstance(paths, str | Path) else list(paths)

    def listed(value: PathLike | Sequence[PathLike] | None) -> list[Path]:
        if value is None:
            return []
        return [Path(value)] if isinstance(value, str | Path) else [Path(v) for v in value]

    patterns = [step_pattern] if isinstance(step_pattern, str) else list(step_pattern or [])
    sources = [step_source] if isinstance(step_source, str) else (list(step_source) if step_source else None)
    sides = side_files(listed(nccl_log), listed(dmon), listed(nccl_tests), listed(topo), listed(smi_q))
    raw = pipeline.analyze(
        [str(p) for p in items],
        profile=profile,
        side_files=sides,
        step_patterns=patterns,
        step_sources=sources,
        scheduler=scheduler,
        jobs=jobs,
        sliced_above=parse_size(sliced_above) if isinstance(sliced_above, str) else sliced_above,
        detail=detail,
        detail_dir=Path(detail_dir) if detail_dir is not None else None,
    )
    return Analysis(report=raw.report, raw=raw)


def compare(base: Analysis | dict[str, Any], head: Analysis | dict[str, Any]) -> dict[str, Any]:
    """What changed from ``base`` to ``head`` (:func:`traceguard.report.compare.compare`): checks
    that changed status (``regressions``: those the base passed), run metric deltas (shares also
    in percentage points), per step and per collective type."""
    return report_compare.compare(
        base.report if isinstance(base, Analysis) else base, head.report if isinstance(head, Analysis) else head
    )
