"""Analysis results as rows, written from the JSON report (the stage before the store), and the
queries the API serves from them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Select, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from traceguard.errors import InputError
from traceguard.report.detail import rank_entries
from traceguard.report.fields import LINK_RANK_FIELDS, LINK_SPLIT_COLUMNS, LINK_STEP_FIELDS, WAIT_STEP_FIELDS
from traceguard.store.runs import with_labels
from traceguard.store.tables import (
    CheckResult,
    Collective,
    CollectiveType,
    Connection,
    File,
    InspectorWindow,
    Job,
    PeerTraffic,
    Phase,
    RankResult,
    Report,
    Run,
    Step,
)

RESULT_TABLES = (
    RankResult,
    Step,
    Phase,
    Collective,
    CollectiveType,
    PeerTraffic,
    Connection,
    CheckResult,
)
MAX_ROWS = 10_000
#: Ranks of a side output read and written at a time (save_results).
RANK_BATCH = 64
#: Step columns of who waited for whom (docs/collectives.md), as the report's step rows name them.
WAIT_STEP_COLUMNS = WAIT_STEP_FIELDS
#: Step columns of the link counters (nsys GPU metrics), as the report's step rows name them.
LINK_STEP_COLUMNS = LINK_STEP_FIELDS
#: Rank columns of the link counters: the rank metrics of its NCCL kernels, then the GPU and the
#: NCCL kernels' time split (from ``ranks[].links``).
LINK_RANK_COLUMNS = (*LINK_RANK_FIELDS, *LINK_SPLIT_COLUMNS)


def rank_link_values(rank: dict[str, Any]) -> dict[str, Any]:
    """The :data:`LINK_RANK_COLUMNS` of one of the report's ranks (null where it has none)."""
    metrics = rank.get("metrics") or {}
    values = {key: metrics.get(key) for key in LINK_RANK_FIELDS}
    for column, path in LINK_SPLIT_COLUMNS.items():
        node: Any = rank.get("links") or {}
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        values[column] = node
    return values


def _share(part: Any, whole: Any) -> float | None:
    if isinstance(part, int | float) and isinstance(whole, int | float) and whole > 0:
        return part / whole
    return None


def save_report(session: Session, *, run_id: int, job_id: int | None, input_key: str, doc: dict[str, Any]) -> Report:
    profile = doc["profile"]["name"]
    row = session.scalar(
        select(Report).where(Report.run_id == run_id, Report.profile == profile, Report.input_key == input_key)
    )
    if row is None:
        row = Report(run_id=run_id, profile=profile, input_key=input_key)
        try:
            with session.begin_nested():
                session.add(row)
                row.job_id, row.verdict, row.document = job_id, doc["verdict"], doc
                session.flush()
            return row
        except IntegrityError:  # the same report made concurrently (another request)
            row = session.scalar(
                select(Report).where(Report.run_id == run_id, Report.profile == profile, Report.input_key == input_key)
            )
            assert row is not None
    row.job_id, row.verdict, row.document = job_id, doc["verdict"], doc
    return row


def get_report(session: Session, run_id: int, profile: str, input_key: str) -> Report | None:
    return session.scalar(
        select(Report).where(Report.run_id == run_id, Report.profile == profile, Report.input_key == input_key)
    )


def latest_report(session: Session, run: Run) -> Report | None:
    """The report of the run's newest successful job (its own profile)."""
    job = session.scalar(
        select(Job).where(Job.run_id == run.id, Job.status == "succeeded").order_by(Job.id.desc()).limit(1)
    )
    if job is None:
        return None
    return get_report(session, run.id, job.profile, job.input_key)


def save_results(
    session: Session,
    run: Run,
    job: Job,
    doc: dict[str, Any],
    files: list[File],
    resolved: dict[int, int | None],
    *,
    detail_folder: Path | None = None,
    input_names: dict[str, str] | None = None,
) -> None:
    """Replace the run's result rows by those of ``doc`` (one transaction with the caller's);
    ``resolved`` maps file ids to the rank the analysis gave them. The Inspector time windows are
    merged instead (:func:`merge_inspector_windows`): a long job's trend only grows.

    A report by summary keeps only its worst ranks: every rank's rows then come from its side
    output ``detail_folder`` (traceguard.report.detail), :data:`RANK_BATCH` ranks at a time, each
    batch flushed before the next is read; ``input_names`` renames their inputs as the report
    names them (the service's scratch paths → uploaded names)."""
    for table in RESULT_TABLES:
        session.execute(delete(table).where(table.run_id == run.id))
    for file in files:
        if file.id in resolved:
            file.resolved_rank = resolved[file.id]
    summary = doc.get("run") or {}
    clocks = {c["rank"]: c for c in (summary.get("clock_alignment") or {}).get("ranks") or []}
    late_rank = (summary.get("metrics") or {}).get("late_rank")
    if (doc.get("detail") or {}).get("mode") == "summary":
        if detail_folder is None or not Path(detail_folder).is_dir():
            raise InputError(
                "this report is a summary: its ranks' rows are in its side output, which was not given",
                hint="store a summary together with the folder its analysis wrote (--detail-out)",
            )
        batches: Iterable[list[dict[str, Any]]] = rank_entries(Path(detail_folder), batch=RANK_BATCH)
    else:
        batches = [doc.get("ranks", [])]
    for batch in batches:
        if input_names:
            batch = [{**r, "input": input_names.get(r.get("input") or "", r.get("input"))} for r in batch]
        session.add_all(_rank_rows(run, job, batch, clocks, late_rank))
        session.flush()
    rows: list[Any] = []
    _save_run_rows(session, run, doc, rows)
    session.add_all(rows)


def _rank_rows(
    run: Run, job: Job, ranks: Iterable[dict[str, Any]], clocks: dict[int, Any], late_rank: int | None
) -> list[Any]:
    """The rank, step, phase, collective and peer rows of the report's rank entries."""
    rows: list[Any] = []
    for rank in ranks:
        metrics = rank["metrics"]
        arrivals = metrics.get("last_arrivals") or {}
        clock = clocks.get(rank["rank"], {})
        rows.append(
            RankResult(
                run_id=run.id,
                job_id=job.id,
                rank=rank["rank"],
                input=rank.get("input"),
                gpu_models=", ".join(rank.get("gpu_models") or []) or None,
                step_source=rank.get("step_source"),
                step_count=metrics.get("step_count"),
                gpu_ops=metrics.get("gpu_ops"),
                nccl_time_ns=metrics.get("nccl_time_ns"),
                nccl_share_of_step=metrics.get("nccl_share_of_step"),
                gpu_to_cpu_copy_rate=metrics.get("gpu_to_cpu_copy_rate"),
                dtod_bytes_per_step=metrics.get("dtod_bytes_per_step"),
                nccl_wait_ns=metrics.get("nccl_wait_ns"),
                nccl_transfer_ns=metrics.get("nccl_transfer_ns"),
                nccl_wait_share=metrics.get("nccl_wait_share"),
                last_arrivals=arrivals.get("count"),
                last_arrivals_of=arrivals.get("of"),
                median_late_ns=arrivals.get("median_late_ns"),
                is_late_rank=None if late_rank is None else late_rank == rank["rank"],
                clock_offset_ns=clock.get("offset_ns"),
                clock_residual_ns=clock.get("residual_ns"),
                **rank_link_values(rank),
                metrics=metrics,
            )
        )
        for index, step in enumerate(rank.get("steps", [])):
            rows.append(
                Step(
                    run_id=run.id,
                    rank=rank["rank"],
                    step_index=index,
                    name=step["name"],
                    cpu_ns=step.get("cpu_ns"),
                    gpu_span_ns=step.get("gpu_span_ns"),
                    nccl_ns=step.get("nccl_ns"),
                    nccl_share=step.get("nccl_share"),
                    dtod_bytes=step.get("dtod_bytes"),
                    dtod_copies=step.get("dtod_copies"),
                    peer_bytes=step.get("peer_bytes"),
                    peer_copies=step.get("peer_copies"),
                    **{key: step.get(key) for key in WAIT_STEP_COLUMNS},
                    **{key: step.get(key) for key in LINK_STEP_COLUMNS},
                )
            )
            for name, phase in (step.get("phases") or {}).items():
                rows.append(
                    Phase(
                        run_id=run.id,
                        rank=rank["rank"],
                        step_index=index,
                        phase=name,
                        cpu_ns=phase.get("cpu_ns"),
                        gpu_ns=phase.get("gpu_ns"),
                        nccl_ns=phase.get("nccl_ns"),
                        nccl_share=_share(phase.get("nccl_ns"), phase.get("gpu_ns")),
                    )
                )
        for c in rank.get("collectives", []):
            rows.append(
                Collective(
                    run_id=run.id,
                    rank=rank["rank"],
                    collective=c["collective"],
                    msg_bytes=c.get("msg_bytes"),
                    group_size=c.get("group_size"),
                    count=c["count"],
                    total_ns=c.get("total_ns"),
                    median_ns=c.get("median_ns"),
                    p95_ns=c.get("p95_ns"),
                    min_ns=c.get("min_ns"),
                    algbw_gbps=c.get("algbw_gbps"),
                    busbw_gbps=c.get("busbw_gbps"),
                    transfer_median_ns=c.get("transfer_median_ns"),
                    matched=c.get("matched"),
                    bandwidth_time=c.get("bandwidth_time"),
                )
            )
        by_type = rank.get("collectives_by_type") or {}
        for row in [*by_type.get("totals", []), *by_type.get("steps", [])]:
            rows.append(
                CollectiveType(
                    run_id=run.id,
                    rank=rank["rank"],
                    step_index=row.get("step_index"),
                    collective=row["collective"],
                    count=row["count"],
                    time_ns=row["time_ns"],
                    exposed_ns=row["exposed_ns"],
                    bytes=row.get("bytes"),
                    issued_as=row.get("issued_as"),
                )
            )
        for row in (rank.get("peers") or {}).get("rows", []):
            rows.append(
                PeerTraffic(
                    run_id=run.id,
                    rank=row["rank"],
                    peer=row["peer"],
                    kernels=row["kernels"],
                    time_ns=row["time_ns"],
                    sends=row.get("sends"),
                    recvs=row.get("recvs"),
                    bytes=row.get("bytes"),
                    source=row["source"],
                )
            )
    return rows


def _save_run_rows(session: Session, run: Run, doc: dict[str, Any], rows: list[Any]) -> None:
    """The run-wide rows: NCCL connections, Inspector windows (merged), check results."""
    for conn in (doc.get("nccl") or {}).get("connections", []):
        rows.append(
            Connection(
                run_id=run.id,
                comm=conn.get("comm"),
                rank=conn["rank"],
                peer=conn["peer"],
                channel=conn.get("channel"),
                direction=conn.get("direction"),
                transport=conn["transport"],
                detail=conn.get("detail"),
            )
        )
    merge_inspector_windows(session, run.id, doc.get("inspector"))
    for check in doc.get("checks", []):
        rows.append(
            CheckResult(
                run_id=run.id,
                profile=doc["profile"]["name"],
                rule_id=check["id"],
                status=check["status"],
                value=check.get("value") if isinstance(check.get("value"), int | float) else None,
                unit=check.get("unit"),
                warn=check.get("warn") if isinstance(check.get("warn"), int | float) else None,
                fail=check.get("fail") if isinstance(check.get("fail"), int | float) else None,
                message=check.get("message"),
                reason=check.get("reason"),
                remedy=check.get("remedy"),
                evidence=check.get("evidence") or [],
            )
        )


def _window_values(window: dict[str, Any], window_s: int) -> dict[str, Any]:
    return {
        "window_start_s": window["window_start_s"],
        "window_s": window_s,
        "instances": window["instances"],
        "wait_ns": window["wait_ns"],
        "transfer_ns": window["transfer_ns"],
        "nccl_wait_share": window.get("nccl_wait_share"),
        "late_rank": window.get("late_rank"),
        "last_arrivals": window.get("last_arrivals") or 0,
        "bytes": window.get("bytes"),
        "busbw_transfer_median_gbps": window.get("busbw_transfer_median_gbps"),
        "lines": window.get("lines"),
    }


def merge_inspector_windows(session: Session, run_id: int, inspector: dict[str, Any] | None) -> dict[str, int]:
    """Merge a report's ``inspector.windows`` into the run's stored windows (docs/service.md, "A long
    job's logs, as they grow"): a window not stored yet is added; a stored window (same start) is
    replaced only when the report has more Inspector ``lines`` for it (a stored row of unknown lines,
    from before migration 0009, is replaced); otherwise it stays as it is, so sending the same or an
    older copy of the logs again changes nothing and never duplicates a window. Windows of another
    length (the profile's ``inspector_window_s`` changed) cannot be compared: the report's replace
    them all. Returns how many windows were added, replaced and kept."""
    counts = {"added": 0, "replaced": 0, "kept": 0}
    windows = (inspector or {}).get("windows") or []
    if not windows:
        return counts
    window_s = int(inspector["window_s"])  # type: ignore[index]
    stored = {w.window_start_s: w for w in inspector_windows(session, run_id)}
    if any(w.window_s != window_s for w in stored.values()):
        session.execute(delete(InspectorWindow).where(InspectorWindow.run_id == run_id))
        stored = {}
    for window in windows:
        values = _window_values(window, window_s)
        row = stored.get(values["window_start_s"])
        if row is None:
            session.add(InspectorWindow(run_id=run_id, **values))
            counts["added"] += 1
        elif row.lines is None or (values["lines"] or 0) > row.lines:
            for key, value in values.items():
                setattr(row, key, value)
            counts["replaced"] += 1
        else:
            counts["kept"] += 1
    session.flush()
    return counts


def _page(query: Select[Any], limit: int, offset: int) -> Select[Any]:
    if not 1 <= limit <= MAX_ROWS:
        raise InputError(f"limit must be between 1 and {MAX_ROWS}")
    if offset < 0:
        raise InputError("offset must not be negative")
    return query.limit(limit).offset(offset)


def query_steps(
    session: Session,
    run_id: int,
    *,
    rank: int | None = None,
    from_step: int | None = None,
    to_step: int | None = None,
    collective: str | None = None,
    limit: int = 1000,
    offset: int = 0,
    page: RankPage | None = None,
) -> list[Step]:
    """Steps of the run in (rank, step index) order; ``from_step``/``to_step`` are inclusive step
    indexes (time order within each rank, from 0); ``collective``: only steps that ran it."""
    query = select(Step).where(Step.run_id == run_id)
    if collective is not None:
        ran = select(CollectiveType.id).where(
            CollectiveType.run_id == run_id,
            CollectiveType.rank == Step.rank,
            CollectiveType.step_index == Step.step_index,
            CollectiveType.collective == collective,
        )
        query = query.where(ran.exists())
    query = _in_ranks(query, Step.rank, rank, page)
    if from_step is not None:
        query = query.where(Step.step_index >= from_step)
    if to_step is not None:
        query = query.where(Step.step_index <= to_step)
    return list(session.scalars(_page(query.order_by(Step.rank, Step.step_index), limit, offset)))


def phases_of_steps(session: Session, run_id: int, steps: list[Step], phase: str | None = None) -> list[Phase]:
    if not steps:
        return []
    ranks = sorted({s.rank for s in steps})
    lo, hi = min(s.step_index for s in steps), max(s.step_index for s in steps)
    query = select(Phase).where(
        Phase.run_id == run_id, Phase.rank.in_(ranks), Phase.step_index >= lo, Phase.step_index <= hi
    )
    if phase is not None:
        query = query.where(Phase.phase == phase)
    return list(session.scalars(query.order_by(Phase.rank, Phase.step_index, Phase.id)))


def query_phases(
    session: Session,
    project_id: int,
    *,
    phase: str | None = None,
    min_nccl_share: float | None = None,
    labels: list[tuple[str, str]] = (),  # type: ignore[assignment]
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    run_id: int | None = None,
    limit: int = 1000,
    offset: int = 0,
) -> list[tuple[Phase, Run]]:
    """Phase rows across the project's runs ("which runs on cluster B had NCCL above 40 % of the
    backward phase last week?")."""
    query = select(Phase, Run).join(Run, Run.id == Phase.run_id).where(Run.project_id == project_id)
    if run_id is not None:
        query = query.where(Run.id == run_id)
    if phase is not None:
        query = query.where(Phase.phase == phase)
    if min_nccl_share is not None:
        query = query.where(Phase.nccl_share >= min_nccl_share)
    query = with_labels(query, labels)
    if created_after:
        query = query.where(Run.created_at >= created_after)
    if created_before:
        query = query.where(Run.created_at < created_before)
    query = query.order_by(Run.id.desc(), Phase.rank, Phase.step_index, Phase.id)
    return [(p, r) for p, r in session.execute(_page(query, limit, offset)).all()]


#: A page of ranks: (first rank, how many ranks); the links query's pages (issue 30).
RankPage = tuple[int, int]


def _in_ranks(query: Select[Any], column: Any, rank: int | None, page: RankPage | None) -> Select[Any]:
    """``query`` kept to ``rank``, else to the ranks of ``page`` (an indexed range on ``column``)."""
    if rank is not None:
        return query.where(column == rank)
    if page is not None:
        first, count = page
        return query.where(column >= first, column < first + count)
    return query


def next_page(session: Session, run_id: int, page: RankPage) -> int | None:
    """The first rank of the page after ``page``, or None when no stored rank lies beyond it."""
    beyond = select(RankResult.rank).where(RankResult.run_id == run_id, RankResult.rank >= page[0] + page[1]).limit(1)
    return page[0] + page[1] if session.scalar(beyond) is not None else None


def late_rank(session: Session, run_id: int) -> int | None:
    """The run's late rank as stored (whichever page of ranks is asked for)."""
    query = select(RankResult.rank).where(RankResult.run_id == run_id, RankResult.is_late_rank.is_(True)).limit(1)
    return session.scalar(query)


def collectives(
    session: Session,
    run_id: int,
    rank: int | None = None,
    collective: str | None = None,
    page: RankPage | None = None,
) -> list[Collective]:
    query = _in_ranks(select(Collective).where(Collective.run_id == run_id), Collective.rank, rank, page)
    if collective is not None:
        query = query.where(Collective.collective == collective)
    return list(session.scalars(query.order_by(Collective.rank, Collective.id)))


def collective_types(
    session: Session,
    run_id: int,
    *,
    rank: int | None = None,
    collective: str | None = None,
    steps: list[Step] | None = None,
    page: RankPage | None = None,
) -> list[CollectiveType]:
    """Collectives-by-type rows: with ``steps``, the rows of those steps; otherwise the ranks'
    window totals (``step_index`` null)."""
    query = _in_ranks(select(CollectiveType).where(CollectiveType.run_id == run_id), CollectiveType.rank, rank, page)
    if collective is not None:
        query = query.where(CollectiveType.collective == collective)
    if steps is None:
        query = query.where(CollectiveType.step_index.is_(None))
    elif not steps:
        return []
    else:
        ranks = sorted({s.rank for s in steps})
        lo, hi = min(s.step_index for s in steps), max(s.step_index for s in steps)
        query = query.where(
            CollectiveType.rank.in_(ranks), CollectiveType.step_index >= lo, CollectiveType.step_index <= hi
        )
    return list(session.scalars(query.order_by(CollectiveType.rank, CollectiveType.step_index, CollectiveType.id)))


def inspector_windows(session: Session, run_id: int) -> list[InspectorWindow]:
    """The run's NCCL Inspector time windows, oldest first (the trend of a long job)."""
    query = select(InspectorWindow).where(InspectorWindow.run_id == run_id).order_by(InspectorWindow.window_start_s)
    return list(session.scalars(query))


def rank_results(
    session: Session, run_id: int, rank: int | None = None, page: RankPage | None = None
) -> list[RankResult]:
    """The ranks' headline rows of the latest analysis (the wait / transfer split and clock included)."""
    query = _in_ranks(select(RankResult).where(RankResult.run_id == run_id), RankResult.rank, rank, page)
    return list(session.scalars(query.order_by(RankResult.rank)))


def peer_traffic(
    session: Session, run_id: int, rank: int | None = None, page: RankPage | None = None
) -> list[PeerTraffic]:
    query = _in_ranks(select(PeerTraffic).where(PeerTraffic.run_id == run_id), PeerTraffic.rank, rank, page)
    return list(session.scalars(query.order_by(PeerTraffic.rank, PeerTraffic.peer)))


def connections(session: Session, run_id: int, page: RankPage | None = None) -> list[Connection]:
    query = _in_ranks(select(Connection).where(Connection.run_id == run_id), Connection.rank, None, page)
    return list(session.scalars(query.order_by(Connection.id)))


def check_results(session: Session, run_id: int) -> list[CheckResult]:
    return list(session.scalars(select(CheckResult).where(CheckResult.run_id == run_id).order_by(CheckResult.id)))


def step_records(
    session: Session,
    run_id: int,
    *,
    rank: int | None = None,
    phase: str | None = None,
    collective: str | None = None,
    from_step: int | None = None,
    to_step: int | None = None,
    limit: int = 1000,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Step rows as ``GET /v1/runs/{id}/steps`` returns them (``traceguard steps`` on the embedded
    store): each with its ``phases`` (only ``phase`` when given; steps without it are left out) and
    its ``collectives`` by type (with ``collective``: only the steps that ran it, only its rows)."""
    steps = query_steps(
        session,
        run_id,
        rank=rank,
        from_step=from_step,
        to_step=to_step,
        collective=collective,
        limit=limit,
        offset=offset,
    )
    phases: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for p in phases_of_steps(session, run_id, steps, phase):
        phases.setdefault((p.rank, p.step_index), []).append(
            {"phase": p.phase, "cpu_ns": p.cpu_ns, "gpu_ns": p.gpu_ns, "nccl_ns": p.nccl_ns, "nccl_share": p.nccl_share}
        )
    types: dict[tuple[int, int | None], list[dict[str, Any]]] = {}
    for c in collective_types(session, run_id, collective=collective, steps=steps):
        types.setdefault((c.rank, c.step_index), []).append(
            {
                "rank": c.rank,
                "step_index": c.step_index,
                "collective": c.collective,
                "count": c.count,
                "time_ns": c.time_ns,
                "exposed_ns": c.exposed_ns,
                "bytes": c.bytes,
            }
        )
    rows = []
    for s in steps:
        key = (s.rank, s.step_index)
        if phase is not None and key not in phases:
            continue
        rows.append(
            {
                "rank": s.rank,
                "step_index": s.step_index,
                "name": s.name,
                "cpu_ns": s.cpu_ns,
                "gpu_span_ns": s.gpu_span_ns,
                "nccl_ns": s.nccl_ns,
                "nccl_share": s.nccl_share,
                "dtod_bytes": s.dtod_bytes,
                "dtod_copies": s.dtod_copies,
                "peer_bytes": s.peer_bytes,
                "peer_copies": s.peer_copies,
                **{column: getattr(s, column) for column in WAIT_STEP_COLUMNS},
                **{column: getattr(s, column) for column in LINK_STEP_COLUMNS},
                "phases": phases.get(key, []),
                "collectives": types.get(key, []),
            }
        )
    return rows
