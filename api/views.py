"""ORM rows → response models (the only place that knows both)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from api.schemas import (
    CollectiveTypeRow,
    FilePublic,
    InspectorRankRow,
    InspectorSummary,
    InspectorWindowRow,
    JobError,
    JobPublic,
    PeerRow,
    PhaseRow,
    RankLinkRow,
    RankWaitRow,
    RunDetail,
    RunPublic,
    StepLinkRow,
    StepRow,
    TokenPublic,
)
from traceguard.store.results import LINK_RANK_COLUMNS, LINK_STEP_COLUMNS, WAIT_STEP_COLUMNS
from traceguard.store.tables import (
    CollectiveType,
    File,
    InspectorWindow,
    Job,
    PeerTraffic,
    Phase,
    RankResult,
    Run,
    Step,
    Token,
)


def job_public(job: Job) -> JobPublic:
    return JobPublic(
        id=job.id,
        run_id=job.run_id,
        status=job.status,
        profile=job.profile,
        attempts=job.attempts,
        ranks_done=job.ranks_done,
        ranks_total=job.ranks_total,
        error=JobError(code=job.error_code, message=job.error_message or "") if job.error_code else None,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        url=f"/v1/jobs/{job.id}",
    )


def file_public(f: File) -> FilePublic:
    return FilePublic(
        id=f.id,
        name=f.name,
        kind=f.kind,
        compressed=f.compressed,
        size=f.size,
        sha256=f.sha256,
        rank=f.rank,
        rank_source=f.rank_source,
        resolved_rank=f.resolved_rank,
        archive=f.archive,
        created_at=f.created_at,
    )


def run_public(run: Run) -> RunPublic:
    return RunPublic(
        id=run.id,
        name=run.name,
        profile=run.profile,
        step_patterns=list(run.step_patterns or []),
        status=run.status,
        verdict=run.verdict,
        labels={label.key: label.value for label in run.labels},
        created_at=run.created_at,
        updated_at=run.updated_at,
        url=f"/v1/runs/{run.id}",
    )


def run_detail(run: Run, files: list[File], jobs: list[Job]) -> RunDetail:
    return RunDetail(
        **run_public(run).model_dump(), files=[file_public(f) for f in files], jobs=[job_public(j) for j in jobs]
    )


def phase_row(p: Phase) -> PhaseRow:
    return PhaseRow(phase=p.phase, cpu_ns=p.cpu_ns, gpu_ns=p.gpu_ns, nccl_ns=p.nccl_ns, nccl_share=p.nccl_share)


def collective_type_row(c: CollectiveType) -> CollectiveTypeRow:
    return CollectiveTypeRow.model_validate(c, from_attributes=True)


def peer_row(p: PeerTraffic) -> PeerRow:
    return PeerRow.model_validate(p, from_attributes=True)


def rank_wait_row(r: RankResult) -> RankWaitRow:
    reasons = (r.metrics or {}).get("null_reasons") or {}
    return RankWaitRow(
        rank=r.rank,
        nccl_wait_ns=r.nccl_wait_ns,
        nccl_transfer_ns=r.nccl_transfer_ns,
        nccl_wait_share=r.nccl_wait_share,
        last_arrivals=r.last_arrivals,
        last_arrivals_of=r.last_arrivals_of,
        median_late_ns=r.median_late_ns,
        is_late_rank=r.is_late_rank,
        clock_offset_ns=r.clock_offset_ns,
        clock_residual_ns=r.clock_residual_ns,
        null_reason=reasons.get("nccl_wait_ns") if r.nccl_wait_ns is None else None,
    )


def rank_link_row(r: RankResult) -> RankLinkRow:
    reasons = (r.metrics or {}).get("null_reasons") or {}
    return RankLinkRow(
        rank=r.rank,
        **{column: getattr(r, column) for column in LINK_RANK_COLUMNS},
        null_reason=reasons.get("pcie_nccl_avg") if r.pcie_nccl_avg is None else None,
    )


def step_link_row(s: Step) -> StepLinkRow:
    return StepLinkRow(
        rank=s.rank,
        step_index=s.step_index,
        name=s.name,
        **{column: getattr(s, column) for column in LINK_STEP_COLUMNS},
    )


def step_row(s: Step, phases: list[Phase], collectives: Sequence[CollectiveType] = ()) -> StepRow:
    return StepRow(
        rank=s.rank,
        step_index=s.step_index,
        name=s.name,
        cpu_ns=s.cpu_ns,
        gpu_span_ns=s.gpu_span_ns,
        nccl_ns=s.nccl_ns,
        nccl_share=s.nccl_share,
        dtod_bytes=s.dtod_bytes,
        dtod_copies=s.dtod_copies,
        peer_bytes=s.peer_bytes,
        peer_copies=s.peer_copies,
        **{column: getattr(s, column) for column in WAIT_STEP_COLUMNS},
        **{column: getattr(s, column) for column in LINK_STEP_COLUMNS},
        phases=[phase_row(p) for p in phases],
        collectives=[collective_type_row(c) for c in collectives],
    )


def token_public(t: Token) -> TokenPublic:
    return TokenPublic(
        id=t.id,
        name=t.name,
        prefix=t.prefix,
        scopes=t.scopes.split(","),
        created_at=t.created_at,
        last_used_at=t.last_used_at,
        revoked_at=t.revoked_at,
    )


def inspector_window_row(w: InspectorWindow) -> InspectorWindowRow:
    return InspectorWindowRow.model_validate(w, from_attributes=True)


def inspector_summary(section: dict[str, Any] | None, rank: int | None = None) -> InspectorSummary | None:
    """The report's ``inspector`` section → its run-level figures (``rank``: that rank's row only)."""
    if not section:
        return None
    metrics = section.get("metrics") or {}
    late = section.get("late_rank") or {}
    rows = [
        InspectorRankRow(
            rank=r["rank"],
            host=r.get("host"),
            pid=r.get("pid"),
            collective_instances_matched=r["collective_instances_matched"],
            nccl_wait_ns=r["nccl_wait_ns"],
            nccl_transfer_ns=r["nccl_transfer_ns"],
            nccl_wait_share=r.get("nccl_wait_share"),
            last_arrivals=(r.get("last_arrivals") or {}).get("count") or 0,
            median_late_ns=(r.get("last_arrivals") or {}).get("median_late_ns"),
        )
        for r in section.get("ranks") or []
        if rank is None or r["rank"] == rank
    ]
    return InspectorSummary(
        nccl_wait_ns=metrics.get("nccl_wait_ns"),
        nccl_transfer_ns=metrics.get("nccl_transfer_ns"),
        nccl_wait_share=metrics.get("nccl_wait_share"),
        late_rank=metrics.get("late_rank"),
        late_rank_share=late.get("share"),
        collective_instances_matched=metrics.get("collective_instances_matched"),
        collective_instances_unmatched=metrics.get("collective_instances_unmatched"),
        matched_steps=metrics.get("matched_steps"),
        inspector_lines=metrics.get("inspector_lines"),
        arrival_source=section.get("arrival_source"),
        window_time=section.get("window_time"),
        null_reasons=dict(metrics.get("null_reasons") or {}),
        ranks=rows,
    )
