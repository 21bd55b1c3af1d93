"""runs and steps: stored runs queried from the terminal, in the embedded store (``--data-dir``, as
``record`` uses) or on a traceguard service (``--server``/``--token``, as ``upload`` uses), printed
as a table, CSV or JSON. What docs/service.md answers in SQL, without SQL.

:func:`stored_report` (a run's report from either place) is what ``compare run:ID`` uses.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from traceguard.cli.common import DataDirOpt, LabelOpt, app, err, fail, labels, out, settings_for
from traceguard.errors import InputError, TraceguardError
from traceguard.report.fields import LINK_STEP_FIELDS, WAIT_STEP_FIELDS
from traceguard.report.units import value_h

if TYPE_CHECKING:
    from traceguard.client import Client
    from traceguard.service.context import Context

ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server", envvar="TRACEGUARD_SERVER", help="Service URL (default: the embedded store).", show_default=False
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="TRACEGUARD_TOKEN", help="API token with the read scope.", show_default=False),
]
ProjectOpt = Annotated[str, typer.Option("--project", help="Project of the embedded store.")]


class TableFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


FormatOpt = Annotated[TableFormat, typer.Option("--format", "-f", help="Output: a table, CSV or JSON.")]


@contextmanager
def local_store(data_dir: Path | None) -> Iterator[Context]:
    """The embedded store (or $TRACEGUARD_DATABASE_URL's database), opened and closed."""
    from traceguard.service.context import Context

    ctx = Context.open(settings_for(data_dir))
    try:
        yield ctx
    finally:
        ctx.close()


@contextmanager
def service_client(server: str, token: str | None) -> Iterator[Client]:
    from traceguard.client import Client

    if not token:
        err.print("[bold red]error[/]: --server needs --token (or $TRACEGUARD_TOKEN)")
        raise typer.Exit(2)
    client = Client(server, token)
    try:
        yield client
    finally:
        client.close()


def run_id_of(ref: str) -> int:
    """``run:ID`` or ``ID`` → the id; InputError otherwise."""
    text = ref.removeprefix("run:")
    if not text.isdigit():
        raise InputError(f"{ref!r} is not a stored run: write run:ID (e.g. run:12)")
    return int(text)


def stored_report(
    ref: str, *, data_dir: Path | None, server: str | None, token: str | None, profile: str | None
) -> dict[str, Any]:
    """The report of a stored run (``run:ID``): on the server when given, else in the embedded
    store; under ``profile`` when given (computed and kept if the run has none under it), else the
    run's latest analysis."""
    run_id = run_id_of(ref)
    if server:
        with service_client(server, token) as client:
            return client.report(run_id, profile).json()
    from traceguard.service.analysis import report_for
    from traceguard.store import results
    from traceguard.store.tables import Run

    with local_store(data_dir) as ctx:
        with ctx.factory() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise InputError(f"run {run_id}: no such run in the store at {ctx.settings.data_dir}")
            stored = results.latest_report(session, run) if profile in (None, run.profile) else None
            if stored is not None:
                return stored.document
        return report_for(ctx, run, profile or run.profile)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return value_h(key, value) if key.endswith(("_ns", "_share", "bytes")) else str(value)


def emit(
    rows: list[dict[str, Any]],
    columns: list[str],
    fmt: TableFormat,
    title: str,
    *,
    headers: dict[str, str] | None = None,
    table_columns: list[str] | None = None,
    caption: str | None = None,
) -> None:
    """Rows as a Rich table (human units), CSV (raw values) or JSON (raw values, nested kept).
    The table shows ``table_columns`` (default: ``columns``) under ``headers`` (default: the
    column names) with ``caption`` below; CSV has every column under its own name."""
    if fmt is TableFormat.json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    if fmt is TableFormat.csv:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(row.get(k)) for k in columns})
        sys.stdout.write(buffer.getvalue())
        return
    shown = table_columns or columns
    compact = headers is not None
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD)
    for column in shown:
        numeric = compact and column.endswith(("_ns", "_share", "_pct"))
        table.add_column((headers or {}).get(column, column), justify="right" if numeric else "left")
    for row in rows:
        table.add_row(*(escape(_short(c, row.get(c)) if compact else _cell(c, row.get(c))) for c in shown))
    out.print(table)


def _short(key: str, value: Any) -> str:
    """A compact cell: ns as ms without the unit (the header says ms), shares as whole percents."""
    if value is None:
        return ""
    if key.endswith("_ns") and isinstance(value, int | float):
        return f"{value / 1e6:.2f}"
    if key.endswith("_share") and isinstance(value, int | float):
        return f"{value:.0%}"
    if key.endswith("_pct") and isinstance(value, int | float):
        return f"{value:.0f}"
    return _cell(key, value)


def _csv_value(value: Any) -> Any:
    if isinstance(value, dict):
        return ";".join(f"{k}={v}" for k, v in value.items())
    return value


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


RUN_COLUMNS = ["id", "name", "status", "verdict", "profile", "labels", "created_at"]


@app.command("runs")
def runs_command(
    label: LabelOpt = None,
    status: Annotated[
        str | None, typer.Option(help="created, queued, running, analysed or failed.", show_default=False)
    ] = None,
    since: Annotated[
        datetime | None, typer.Option("--since", help="Created at or after (ISO date/time, UTC).", show_default=False)
    ] = None,
    until: Annotated[
        datetime | None, typer.Option("--until", help="Created before (ISO date/time, UTC).", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=200, help="Newest runs to list.")] = 50,
    project: ProjectOpt = "default",
    fmt: FormatOpt = TableFormat.table,
    data_dir: DataDirOpt = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """List stored runs, newest first: every --label key=value must match; --status, --since, --until."""
    wanted = labels(label)
    try:
        if server:
            with service_client(server, token) as client:
                page = client.runs(
                    labels=wanted, status=status, created_after=_when(since), created_before=_when(until), limit=limit
                )
            rows = [{c: r.get(c) for c in RUN_COLUMNS} for r in page["runs"]]
        else:
            from traceguard.store.access import get_project
            from traceguard.store.runs import list_runs

            with local_store(data_dir) as ctx, ctx.factory() as session:
                found = get_project(session, project)
                runs = (
                    list_runs(
                        session,
                        found.id,
                        labels=list(wanted.items()),
                        status=status,
                        created_after=since,
                        created_before=until,
                        limit=limit,
                    ).runs
                    if found
                    else []
                )
                rows = [
                    {
                        "id": r.id,
                        "name": r.name,
                        "status": r.status,
                        "verdict": r.verdict,
                        "profile": r.profile,
                        "labels": {lb.key: lb.value for lb in r.labels},
                        "created_at": r.created_at.isoformat(),
                    }
                    for r in runs
                ]
    except TraceguardError as exc:
        raise fail(exc) from None
    emit(rows, RUN_COLUMNS, fmt, f"runs ({len(rows)})")


STEP_COLUMNS = [
    "rank",
    "step_index",
    "name",
    "cpu_ns",
    "gpu_span_ns",
    "nccl_ns",
    "nccl_share",
    "dtod_bytes",
    # Who waited for whom (docs/collectives.md): the NCCL kernel time of the step's matched
    # collectives split at the last rank's arrival, the step's GPU time broken down, its lateness.
    *WAIT_STEP_FIELDS,
    # The link counters (nsys GPU metrics): PCIe and NVLink load over the step and its NCCL kernels.
    *LINK_STEP_FIELDS,
]
#: Columns the terminal table leaves to CSV and JSON (which have every column), to stay readable.
STEP_TABLE_HIDDEN = (
    "cpu_ns",
    "dtod_bytes",
    "period_ns",
    "comm_wait_ns",
    "comm_transfer_ns",
    "copy_ns",
    "idle_other_ns",
    "phases",
)
#: Left out as well when --phase or --collective add their own columns.
STEP_NARROW = (
    *STEP_TABLE_HIDDEN,
    "nccl_transfer_ns",
    "compute_ns",
    "comm_ns",
    "lateness_ns",
    "pcie_avg_pct",
    "pcie_peak_pct",
    "nvlink_avg_pct",
    "nvlink_peak_pct",
)
#: The table's headers: times in ms (the cells are numbers), shares in %.
STEP_HEADERS = {
    "step_index": "step",
    "gpu_span_ns": "gpu span\nms",
    "nccl_ns": "nccl\nms",
    "nccl_share": "nccl\nshare",
    "nccl_wait_ns": "wait\nms",
    "nccl_transfer_ns": "transfer\nms",
    "compute_ns": "compute\nms",
    "comm_ns": "comm\nms",
    "idle_host_ns": "idle host\nms",
    "lateness_ns": "lateness\nms",
    "pcie_avg_pct": "pcie\navg %",
    "pcie_peak_pct": "pcie\npeak %",
    "nvlink_avg_pct": "nvlink\navg %",
    "nvlink_peak_pct": "nvlink\npeak %",
    "nccl_pcie_avg_pct": "pcie in\nnccl %",
    "nccl_nvlink_avg_pct": "nvlink in\nnccl %",
    "phase_cpu_ns": "phase cpu\nms",
    "phase_gpu_ns": "phase gpu\nms",
    "phase_nccl_ns": "phase nccl\nms",
    "phase_nccl_share": "phase nccl\nshare",
    "collective_count": "calls",
    "collective_time_ns": "coll. time\nms",
    "collective_exposed_ns": "exposed\nms",
    "collective_bytes": "coll. bytes",
}
STEP_CAPTION = (
    "wait / transfer: the NCCL time of the step's matched collectives spent waiting for the last rank / moving "
    "data. compute, comm (exposed NCCL), idle host (the GPU waited for its host): where the step's GPU time went. "
    "lateness: the rank's median arrival after the first rank's. pcie / nvlink (nsys GPU metrics): the link's load "
    "over the step and its NCCL kernels, % of its peak (shown when the capture has them). Empty: not known. CSV and "
    "JSON have every column (CPU time, DtoD bytes, the whole breakdown, phases); docs/collectives.md."
)


def flatten_steps(rows: list[dict[str, Any]], phase: str | None, collective: str | None) -> list[dict[str, Any]]:
    """One row per step; with ``phase``, that phase's times as ``phase_*``; with ``collective``,
    that type's count and times as ``collective_*``."""
    flat = []
    for row in rows:
        base = {k: row.get(k) for k in STEP_COLUMNS}
        if collective is not None:
            found = next((c for c in row.get("collectives", []) if c["collective"] == collective), None)
            for key in ("count", "time_ns", "exposed_ns", "bytes"):
                base[f"collective_{key}"] = found.get(key) if found else None
        if phase is None:
            base["phases"] = ", ".join(p["phase"] for p in row.get("phases", []))
            flat.append(base)
            continue
        for p in row.get("phases", []):
            if p["phase"] == phase:
                flat.append(base | {f"phase_{k}": p.get(k) for k in ("cpu_ns", "gpu_ns", "nccl_ns", "nccl_share")})
    return flat


@app.command("steps")
def steps_command(
    run: Annotated[str, typer.Argument(help="The stored run: run:ID or ID.", show_default=False)],
    rank: Annotated[int | None, typer.Option(help="Only this rank.", show_default=False)] = None,
    phase: Annotated[
        str | None, typer.Option(help="Only steps with this phase, with its times.", show_default=False)
    ] = None,
    collective: Annotated[
        str | None,
        typer.Option(
            help="Only steps that ran this collective type (e.g. AllReduce), with its times.", show_default=False
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10000, help="Steps to list at most.")] = 1000,
    fmt: FormatOpt = TableFormat.table,
    data_dir: DataDirOpt = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """The step breakdown of a stored run's latest analysis (per rank and step: CPU time, GPU span,
    NCCL time and share, DtoD bytes; the NCCL time of matched collectives split into waiting for
    the last rank and transfer; the step's GPU time broken down into compute, exposed communication,
    copies and idle time waiting for the host or otherwise; the rank's lateness at the step's
    collectives), filtered by --rank, --phase, --collective. CSV and JSON carry every column."""
    try:
        run_id = run_id_of(run)
        if collective is not None:
            collective = _collective_name(collective)
        if server:
            with service_client(server, token) as client:
                rows = client.steps(run_id, rank=rank, phase=phase, collective=collective, limit=limit)
        else:
            from traceguard.store import results
            from traceguard.store.tables import Run

            with local_store(data_dir) as ctx, ctx.factory() as session:
                if session.get(Run, run_id) is None:
                    raise InputError(f"run {run_id}: no such run in the store at {ctx.settings.data_dir}")
                rows = results.step_records(session, run_id, rank=rank, phase=phase, collective=collective, limit=limit)
    except TraceguardError as exc:
        raise fail(exc) from None
    if fmt is TableFormat.json:
        emit(rows, [], fmt, "")
        return
    flat = flatten_steps(rows, phase, collective)
    columns = list(flat[0]) if flat else STEP_COLUMNS
    # The link columns only where the capture had GPU metrics (most runs have none).
    unknown = {c for c in LINK_STEP_FIELDS if all(row.get(c) is None for row in flat)}
    emit(
        flat,
        columns,
        fmt,
        f"run {run_id} · steps ({len(flat)})",
        headers=STEP_HEADERS,
        table_columns=[
            c
            for c in columns
            if c not in (STEP_NARROW if phase or collective else STEP_TABLE_HIDDEN) and c not in unknown
        ],
        caption=STEP_CAPTION,
    )


def _collective_name(name: str) -> str:
    """The canonical spelling of a collective type (``allreduce`` → ``AllReduce``)."""
    from traceguard.metrics.collectives import COLLECTIVE_ORDER, OTHER

    for known in (*COLLECTIVE_ORDER, OTHER):
        if known.lower() == name.strip().lower():
            return known
    raise InputError(f"unknown collective {name!r}; one of {', '.join((*COLLECTIVE_ORDER, OTHER))}")
