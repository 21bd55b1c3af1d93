"""Runs: create, list, show; upload files; start analysis; reports, steps, phases, compare."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool

from api.deps import ContextDep, PoolDep, Reader, SessionDep, Uploader
from api.errors import ApiError, not_found
from api.schemas import (
    CollectiveRow,
    Comparison,
    ConnectionRow,
    InspectorTables,
    LinkTables,
    PhaseHit,
    PhaseList,
    RunCreate,
    RunDetail,
    RunList,
    RunPublic,
    StepList,
    UploadResult,
)
from api.streaming import Received, parse_rank, receive_upload
from api.views import (
    collective_type_row,
    file_public,
    inspector_summary,
    inspector_window_row,
    job_public,
    peer_row,
    rank_link_row,
    rank_wait_row,
    run_detail,
    run_public,
    step_link_row,
    step_row,
)
from traceguard.checks.profiles import available
from traceguard.errors import InputError
from traceguard.metrics.collectives import COLLECTIVE_ORDER, OTHER
from traceguard.report import html as html_report
from traceguard.report import markdown
from traceguard.report.compare import compare
from traceguard.report.nccl import pair_transports
from traceguard.service.analysis import report_for
from traceguard.service.context import Context
from traceguard.service.intake import receive
from traceguard.store import jobs, results
from traceguard.store.db import transaction
from traceguard.store.runs import create_run, get_run, list_runs, parse_label_filter, run_files, run_jobs
from traceguard.store.tables import Run

router = APIRouter(prefix="/v1", tags=["runs"])
#: ``?collective=`` values, matched without regard to case.
COLLECTIVES = (*COLLECTIVE_ORDER, "Generic", OTHER)
CollectiveQuery = Annotated[
    str | None, Query(description="only this collective type: " + ", ".join(COLLECTIVES) + " (any case)")
]


def check_collective(name: str | None) -> str | None:
    """The canonical spelling of a ``?collective=`` value; InputError for an unknown one."""
    if name is None:
        return None
    for known in COLLECTIVES:
        if known.lower() == name.strip().lower():
            return known
    raise InputError(f"unknown collective {name!r}; one of {', '.join(COLLECTIVES)}")


ERRORS = {401: {"description": "no or bad token"}, 404: {"description": "no such run in this project"}}


def check_profile(name: str) -> str:
    """Only the profiles this service ships (never a path a caller names)."""
    if name not in available():
        raise InputError(f"unknown profile {name!r}", hint=f"profiles: {', '.join(sorted(available()))}")
    return name


def _visible(session: SessionDep, project_id: int, run_id: int) -> Run:
    run = get_run(session, project_id, run_id)
    if run is None:
        raise not_found(f"run {run_id}")
    return run


@router.post("/runs", status_code=201, responses=ERRORS)
def post_run(body: RunCreate, who: Uploader, session: SessionDep, response: Response) -> RunPublic:
    """Create a run (a training run whose captures will be uploaded) with its labels."""
    run = create_run(
        session,
        who.project_id,
        name=body.name,
        labels=body.labels,
        profile=check_profile(body.profile),
        step_patterns=body.step_patterns,
    )
    session.commit()
    response.headers["Location"] = f"/v1/runs/{run.id}"
    return run_public(run)


def _labels(label: list[str]) -> list[tuple[str, str]]:
    return [parse_label_filter(text) for text in label]


@router.get("/runs", responses=ERRORS)
def get_runs(
    who: Reader,
    session: SessionDep,
    label: Annotated[list[str], Query(description="key:value, repeatable (all must match)")] = [],  # noqa: B006
    status: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: str | None = None,
) -> RunList:
    """The project's runs, newest first, filtered by labels, status and creation time; paginated."""
    page = list_runs(
        session,
        who.project_id,
        labels=_labels(label),
        status=status,
        created_after=created_after,
        created_before=created_before,
        limit=limit,
        cursor=cursor,
    )
    return RunList(runs=[run_public(r) for r in page.runs], next_cursor=page.next_cursor)


@router.get("/runs/{run_id}", responses=ERRORS)
def get_one_run(run_id: int, who: Reader, session: SessionDep) -> RunDetail:
    """The run with its files, its analysis jobs and its verdict."""
    run = _visible(session, who.project_id, run_id)
    return run_detail(run, run_files(session, run.id), run_jobs(session, run.id))


def _store_upload(
    ctx: Context,
    run_id: int,
    project_id: int,
    received: Received,
    analyze: bool,
    profile: str | None,
    kinds: tuple[str, ...] | None = None,
) -> tuple[UploadResult, int]:
    with transaction(ctx.factory) as session:
        run = get_run(session, project_id, run_id)
        if run is None:
            raise not_found(f"run {run_id}")
        files, duplicates, skipped = [], [], []
        for item in received.files:
            intake = receive(ctx, session, run, item.writer, name=item.name, rank=item.rank, kinds=kinds)
            for row, created in intake.files:
                files.append(row)
                if not created:
                    duplicates.append(row.id)
            skipped.extend(intake.skipped)
        session.flush()
        job = None
        if analyze:
            job, _ = jobs.enqueue(session, run, profile)
        return (
            UploadResult(
                files=[file_public(f) for f in files],
                duplicates=duplicates,
                skipped=skipped,
                job=job_public(job) if job else None,
            ),
            sum(f.size for f in files),
        )


UPLOAD_RESPONSES = {
    **ERRORS,
    201: {"description": "stored, no analysis asked for", "model": UploadResult},
    413: {"description": "over the size limit"},
    415: {"description": "not a kind of file traceguard reads"},
    422: {"description": "damaged or unsafe content"},
}


def _upload_body(rank: bool) -> dict:
    fields: dict = {"file": {"type": "array", "items": {"type": "string", "format": "binary"}}}
    if rank:
        fields = {"rank": {"type": "integer", "description": "rank of the file parts that follow"}, **fields}
    return {
        "requestBody": {
            "content": {
                "multipart/form-data": {"schema": {"type": "object", "properties": fields}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
            "required": True,
        }
    }


async def _upload(
    run_id: int,
    request: Request,
    who: Uploader,
    ctx: ContextDep,
    pool: PoolDep,
    *,
    name: str | None,
    rank: int | None,
    analyze: bool,
    profile: str | None,
    kinds: tuple[str, ...] | None = None,
) -> JSONResponse:
    if profile is not None:
        check_profile(profile)
    with ctx.factory() as session:
        _visible(session, who.project_id, run_id)  # 404 before reading any body
    received = await receive_upload(
        request,
        ctx.blobs,
        file_limit=ctx.settings.max_file_bytes,
        request_limit=ctx.settings.max_request_bytes,
        name=name,
        rank=rank,
    )
    metrics = request.app.state.metrics
    try:
        result, size = await run_in_threadpool(
            _store_upload, ctx, run_id, who.project_id, received, analyze, profile, kinds
        )
    except Exception:
        metrics.uploads.labels("refused").inc(len(received.files))
        raise
    finally:
        received.discard()
    metrics.uploads.labels("stored").inc(len(result.files))
    metrics.upload_bytes.inc(size)
    headers = {}
    if result.job is not None:
        headers["Location"] = result.job.url
        if pool is not None:
            pool.wake()
    return JSONResponse(result.model_dump(mode="json"), status_code=202 if result.job else 201, headers=headers)


@router.post("/runs/{run_id}/files", status_code=202, responses=UPLOAD_RESPONSES, openapi_extra=_upload_body(True))
async def upload_files(
    run_id: int,
    request: Request,
    who: Uploader,
    ctx: ContextDep,
    pool: PoolDep,
    name: str | None = None,
    rank: str | None = None,
    analyze: bool = True,
    profile: str | None = None,
) -> JSONResponse:
    """Upload files (multipart, or one raw body with ``?name=``), streamed to disk.

    The kind is detected from the content: nsys SQLite (plain or gzip), .nsys-rep, Kineto JSON
    (plain or gzip), NCCL_DEBUG log, nvidia-smi dmon / topo -m / -q output, nccl-tests output, or
    a whole run bundle as .tar, .tar.gz or .zip. The same bytes uploaded again are not stored
    twice. Analysis starts at once as a background job (202 with the job's URL) unless
    ``analyze=false`` (201)."""
    return await _upload(
        run_id, request, who, ctx, pool, name=name, rank=parse_rank(rank), analyze=analyze, profile=profile
    )


@router.post("/runs/{run_id}/inspector", status_code=202, responses=UPLOAD_RESPONSES, openapi_extra=_upload_body(False))
async def upload_inspector(
    run_id: int,
    request: Request,
    who: Uploader,
    ctx: ContextDep,
    pool: PoolDep,
    name: str | None = None,
    analyze: bool = True,
) -> JSONResponse:
    """Send a long job's NCCL Inspector logs as they grow: the plugin's ``<host>-pid<PID>.log``
    files (plain or gzip, complete or still being written) or a tar/zip of its dump directory,
    multipart or one raw body with ``?name=``. Only Inspector logs are taken (an archive's other
    members are skipped and listed; a single file of another kind is refused, 415); each file's
    first lines must parse with a format version traceguard reads (else 415/422, nothing stored).
    The run is analysed again in the background (202 with the job's URL); its stored time windows
    are merged, not replaced: a window not stored yet is added, a stored one is replaced only when
    the logs now hold more of its lines. The same or an older copy sent again changes nothing."""
    return await _upload(
        run_id, request, who, ctx, pool, name=name, rank=None, analyze=analyze, profile=None, kinds=("nccl_inspector",)
    )


@router.post("/runs/{run_id}/analyze", status_code=202, responses=ERRORS)
def analyze_run(
    run_id: int, who: Uploader, session: SessionDep, pool: PoolDep, response: Response, profile: str | None = None
) -> UploadResult:
    """Analyse the run's current files (again) as a background job; the same input set and
    profile give the same job."""
    run = _visible(session, who.project_id, run_id)
    if not run_files(session, run.id):
        raise InputError(f"run {run_id} has no files yet", hint="upload captures first")
    job, _ = jobs.enqueue(session, run, check_profile(profile) if profile else None)
    session.commit()
    if pool is not None:
        pool.wake()
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return UploadResult(files=[], duplicates=[], skipped=[], job=job_public(job))


def _report_doc(ctx: Context, session: SessionDep, run: Run, profile: str | None) -> dict:
    if profile is None or profile == run.profile:
        stored = results.latest_report(session, run)
        if stored is not None:
            return stored.document
        if run.status in ("queued", "running", "created"):
            raise ApiError(409, "not_ready", f"run {run.id} has no analysis yet (status {run.status})")
        failed = run_jobs(session, run.id)[-1:]
        if failed and failed[0].status == "failed":  # do not redo a failing analysis on every read
            job = failed[0]
            raise ApiError(
                409,
                "analysis_failed",
                f"run {run.id} has no report: its analysis failed ({job.error_code}: {job.error_message})",
                hint=f"see /v1/jobs/{job.id}; upload corrected files, then POST /v1/runs/{run.id}/analyze",
            )
    return report_for(ctx, run, check_profile(profile or run.profile))


@router.get(
    "/runs/{run_id}/report",
    responses={
        **ERRORS,
        409: {"description": "not analysed yet"},
        200: {"content": {"text/html": {}, "text/markdown": {}}},
    },
)
def get_report(
    run_id: int,
    who: Reader,
    session: SessionDep,
    ctx: ContextDep,
    profile: str | None = None,
    format: Literal["json", "md", "html"] = "json",
) -> Response:
    """The run's report (docs/report.schema.json) under its own profile or any other (computed on
    first request and kept)."""
    run = _visible(session, who.project_id, run_id)
    doc = _report_doc(ctx, session, run, profile)
    if format == "md":
        return PlainTextResponse(markdown.render(doc), media_type="text/markdown; charset=utf-8")
    if format == "html":
        return HTMLResponse(html_report.render(doc, plotly_src="/static/plotly.min.js"))
    return JSONResponse(doc)


@router.get("/runs/{run_id}/steps", responses=ERRORS)
def get_steps(
    run_id: int,
    who: Reader,
    session: SessionDep,
    rank: int | None = None,
    phase: str | None = None,
    from_step: Annotated[int | None, Query(ge=0, description="first step index (time order within each rank)")] = None,
    to_step: Annotated[int | None, Query(ge=0, description="last step index, inclusive")] = None,
    collective: CollectiveQuery = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> StepList:
    """Step breakdown rows of the latest analysis, with their phases (only ``phase`` when given)
    and collectives by type (with ``collective``: only the steps that ran it, and only its rows)."""
    run = _visible(session, who.project_id, run_id)
    collective = check_collective(collective)
    steps = results.query_steps(
        session,
        run.id,
        rank=rank,
        from_step=from_step,
        to_step=to_step,
        collective=collective,
        limit=limit,
        offset=offset,
    )
    phases = results.phases_of_steps(session, run.id, steps, phase)
    by_step: dict[tuple[int, int], list] = {}
    for p in phases:
        by_step.setdefault((p.rank, p.step_index), []).append(p)
    types: dict[tuple[int, int | None], list] = {}
    for c in results.collective_types(session, run.id, collective=collective, steps=steps):
        types.setdefault((c.rank, c.step_index), []).append(c)
    rows = [step_row(s, by_step.get((s.rank, s.step_index), []), types.get((s.rank, s.step_index), [])) for s in steps]
    if phase is not None:
        rows = [r for r in rows if r.phases]
    return StepList(run_id=run.id, steps=rows)


@router.get("/phases", responses=ERRORS)
def get_phases(
    who: Reader,
    session: SessionDep,
    phase: str | None = None,
    min_nccl_share: Annotated[float | None, Query(ge=0, le=1)] = None,
    label: Annotated[list[str], Query(description="key:value, repeatable")] = [],  # noqa: B006
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    run_id: int | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> PhaseList:
    """Phase rows across the project's runs, e.g. ``?phase=backward&min_nccl_share=0.4&label=cluster:B
    &created_after=...``: which runs had NCCL above 40 % of the backward phase."""
    hits = results.query_phases(
        session,
        who.project_id,
        phase=phase,
        min_nccl_share=min_nccl_share,
        labels=_labels(label),
        created_after=created_after,
        created_before=created_before,
        run_id=run_id,
        limit=limit,
        offset=offset,
    )
    return PhaseList(
        phases=[
            PhaseHit(
                run_id=r.id,
                run_name=r.name,
                labels={lb.key: lb.value for lb in r.labels},
                rank=p.rank,
                step_index=p.step_index,
                phase=p.phase,
                cpu_ns=p.cpu_ns,
                gpu_ns=p.gpu_ns,
                nccl_ns=p.nccl_ns,
                nccl_share=p.nccl_share,
            )
            for p, r in hits
        ]
    )


@router.get("/compare", responses={**ERRORS, 409: {"description": "a run is not analysed yet"}})
def get_compare(
    base: int, head: int, who: Reader, session: SessionDep, ctx: ContextDep, profile: str | None = None
) -> Comparison:
    """Run-level metric deltas (head − base) and the checks whose status changed. Both runs are
    compared under one profile: ``profile``, else the head run's."""
    base_run = _visible(session, who.project_id, base)
    head_run = _visible(session, who.project_id, head)
    chosen = profile or head_run.profile
    base_doc = _report_doc(ctx, session, base_run, chosen)
    head_doc = _report_doc(ctx, session, head_run, chosen)
    return Comparison(base=base, head=head, profile=chosen, **compare(base_doc, head_doc))


#: Ranks per page of the links query, by default and at most.
LINK_PAGE_RANKS = 256
LINK_PAGE_MAX = 1024


@router.get("/runs/{run_id}/links", responses=ERRORS)
def get_links(
    run_id: int,
    who: Reader,
    session: SessionDep,
    rank: int | None = None,
    collective: CollectiveQuery = None,
    from_rank: Annotated[int, Query(ge=0, description="the first rank of the page")] = 0,
    ranks: Annotated[int, Query(ge=1, le=LINK_PAGE_MAX, description="ranks per page")] = LINK_PAGE_RANKS,
) -> LinkTables:
    """Collective statistics per rank and message size (latency, algbw/busbw), collectives by type
    (window totals per rank), the point-to-point rank × peer matrix, and the NCCL transport map
    (every channel connection from the NCCL_DEBUG logs, and the rank × peer transport matrix), and
    who waited for whom: per rank its NCCL time waiting for the last rank vs transfer, its last
    arrivals and clock, and the run's late rank (docs/collectives.md); the link counters (nsys GPU
    metrics): per rank its PCIe and NVLink load during its NCCL kernels and where NCCL's bytes went,
    per step its PCIe and NVLink load. ``collective`` keeps that type's rows (and the peer matrix
    only for a point-to-point type).

    A run of many ranks comes in pages of ranks: every per-rank table holds the ranks
    ``from_rank`` to ``from_rank + ranks - 1`` (the NCCL connections those ranks logged), and
    ``next_from_rank`` is where the next page starts (null on the last); ``rank`` asks for one rank
    instead. ``late_rank`` is the run's whichever page is asked for."""
    run = _visible(session, who.project_id, run_id)
    collective = check_collective(collective)
    peers_wanted = collective is None or collective in ("SendRecv", "Send", "Recv")
    page = (from_rank, ranks)
    links = results.connections(session, run.id, page=None if rank is not None else page)
    rows = results.rank_results(session, run.id, rank, page)
    matrix: dict[str, dict[str, str]] = {}
    for (rank_, peer), kinds in pair_transports((c.rank, c.peer, c.transport) for c in links).items():
        matrix.setdefault(str(rank_), {})[str(peer)] = kinds
    return LinkTables(
        run_id=run.id,
        collectives=[
            CollectiveRow.model_validate(c, from_attributes=True)
            for c in results.collectives(session, run.id, rank, collective, page)
        ],
        collectives_by_type=[
            collective_type_row(c)
            for c in results.collective_types(session, run.id, rank=rank, collective=collective, page=page)
        ],
        peers=[peer_row(p) for p in results.peer_traffic(session, run.id, rank, page)] if peers_wanted else [],
        connections=[ConnectionRow.model_validate(c, from_attributes=True) for c in links],
        transport_matrix=matrix,
        waits=[rank_wait_row(r) for r in rows],
        late_rank=results.late_rank(session, run.id),
        link_counters=[rank_link_row(r) for r in rows],
        link_steps=[
            step_link_row(s) for s in results.query_steps(session, run.id, rank=rank, limit=results.MAX_ROWS, page=page)
        ],
        from_rank=None if rank is not None else from_rank,
        next_from_rank=None if rank is not None else results.next_page(session, run.id, page),
    )


@router.get("/runs/{run_id}/inspector", responses=ERRORS)
def get_inspector(run_id: int, who: Reader, session: SessionDep, rank: int | None = None) -> InspectorTables:
    """The run's NCCL Inspector time windows as stored, oldest first (per window: matched instances
    and their lines, wait and transfer sums, wait share, late rank, last arrivals, bytes, median bus
    bandwidth on transfer time; merged across uploads, docs/inspector.md), and the latest analysis's
    run-level Inspector figures (wait / transfer split, late rank, matched / unmatched instances, per
    rank). ``rank`` keeps that rank's row of the summary; the windows are across ranks (each names
    its late rank), so they are all returned. No Inspector logs: no windows and a null summary."""
    run = _visible(session, who.project_id, run_id)
    windows = results.inspector_windows(session, run.id)
    stored = results.latest_report(session, run)
    section = stored.document.get("inspector") if stored is not None else None
    return InspectorTables(
        run_id=run.id,
        window_s=windows[0].window_s if windows else None,
        windows=[inspector_window_row(w) for w in windows],
        summary=inspector_summary(section, rank),
    )
