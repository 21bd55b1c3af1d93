"""record and upload: analyse captures into a run kept in the store, locally or on a traceguard service."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from traceguard.checks.profiles import DEFAULT_PROFILE, available
from traceguard.cli.common import (
    DataDirOpt,
    DmonOpt,
    LabelOpt,
    NcclLogOpt,
    NcclTestsOpt,
    ProfileOpt,
    SmiQOpt,
    StepPatternOpt,
    TopoOpt,
    app,
    err,
    fail,
    labels,
    out,
    print_checks,
    settings_for,
    side_paths,
    step_patterns,
    warn_inputs,
    where,
    write,
)
from traceguard.errors import InputError, TraceguardError
from traceguard.report import junit


@app.command("record")
def record_command(
    captures: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Capture files, side files (NCCL logs, nvidia-smi / nccl-tests output) and run bundles "
            "(directories or archives), all recognised by content.",
            show_default=False,
        ),
    ] = None,
    project: Annotated[str, typer.Option(help="Project to record the run in.")] = "default",
    name: Annotated[str, typer.Option(help="Run name.")] = "",
    label: LabelOpt = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    data_dir: DataDirOpt = None,
    nccl_log: NcclLogOpt = None,
    dmon: DmonOpt = None,
    nccl_tests: NcclTestsOpt = None,
    topo: TopoOpt = None,
    smi_q: SmiQOpt = None,
    step_pattern: StepPatternOpt = None,
) -> None:
    """Analyse captures and keep the run in the store (no server needed): the same intake and job
    the service runs. Exits like `check`."""
    from traceguard.service.analysis import execute
    from traceguard.service.context import Context
    from traceguard.service.intake import receive_path
    from traceguard.store import jobs, results
    from traceguard.store.access import get_or_create_project
    from traceguard.store.db import transaction
    from traceguard.store.runs import create_run
    from traceguard.store.tables import Job, Run

    if profile not in available():
        err.print(f"[bold red]error[/]: unknown profile {profile!r} (profiles: {', '.join(sorted(available()))})")
        raise typer.Exit(2)
    patterns = step_patterns(step_pattern)
    given = [*(captures or []), *side_paths(nccl_log, dmon, nccl_tests, topo, smi_q)]
    if not given:
        err.print("[bold red]error[/]: nothing to record: give capture files, a run directory, or side files")
        raise typer.Exit(2)
    # The intake classifies every file by content, so a side file given as an option is one more file.
    files = [p for c in given for p in (sorted(x for x in c.iterdir() if x.is_file()) if c.is_dir() else [c])]
    try:
        ctx = Context.open(settings_for(data_dir))
        with transaction(ctx.factory) as session:
            run = create_run(
                session,
                get_or_create_project(session, project).id,
                name=name,
                labels=labels(label),
                profile=profile,
                step_patterns=patterns,
            )
            for path in files:
                try:
                    intake = receive_path(ctx, session, run, path)
                except InputError as exc:
                    err.print(f"[yellow]skipped[/] {escape(exc.message)}")
                    continue
                for row, _ in intake.files:
                    err.print(f"stored {escape(row.name)} ({row.kind})")
            job, _ = jobs.enqueue(session, run)
            run_id, job_id = run.id, job.id
        with ctx.factory() as session:  # the same claim and lease a service worker takes
            jobs.claim(session, "cli", ctx.settings.job_lease_s, job_id=job_id)
        with err.status(f"analysing run {run_id}", spinner="dots"):
            status = execute(ctx, job_id, "cli")
        with ctx.factory() as session:
            job_row = session.get(Job, job_id)
            run_row = session.get(Run, run_id)
            stored = results.latest_report(session, run_row) if run_row else None
    except TraceguardError as exc:
        raise fail(exc) from None
    if status != "succeeded" or stored is None:
        err.print(f"[bold red]error[/]: run {run_id}: {job_row.error_code}: {escape(job_row.error_message or '')}")
        raise typer.Exit(2)
    report = stored.document
    warn_inputs(report)
    print_checks(report, f" · run {run_id}")
    err.print(f"run {run_id} recorded in {where(ctx.settings)}")
    ctx.close()
    raise typer.Exit(1 if report["verdict"] == "fail" else 0)


@app.command("upload")
def upload_command(
    server: Annotated[str, typer.Option(envvar="TRACEGUARD_SERVER", help="Service URL.")],
    token: Annotated[str, typer.Option(envvar="TRACEGUARD_TOKEN", help="API token with read and upload scopes.")],
    paths: Annotated[
        list[str] | None,
        typer.Argument(
            help="Captures and side files to upload, recognised by content by the service (FILE:RANK names a "
            "capture's rank); a run directory goes as one archive.",
            show_default=False,
        ),
    ] = None,
    label: LabelOpt = None,
    name: Annotated[str, typer.Option(help="Run name.")] = "",
    profile: ProfileOpt = DEFAULT_PROFILE,
    run_id: Annotated[int | None, typer.Option("--run", help="Add to this run instead of creating one.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the analysis.")] = 1800.0,
    junit_path: Annotated[Path | None, typer.Option("--junit", help="Write the checks as JUnit XML here.")] = None,
    baseline: Annotated[
        list[str] | None,
        typer.Option(
            "--baseline",
            help="Compare with the newest analysed run carrying this label key=value (repeatable, all must "
            "match), e.g. --baseline branch=main: checks that changed and the largest metric changes.",
        ),
    ] = None,
    nccl_log: NcclLogOpt = None,
    dmon: DmonOpt = None,
    nccl_tests: NcclTestsOpt = None,
    topo: TopoOpt = None,
    smi_q: SmiQOpt = None,
    step_pattern: StepPatternOpt = None,
) -> None:
    """Upload captures to a traceguard service, wait for its analysis, print the verdict, and exit
    like `check` (0 no failure, 1 a check fails, 2 nothing usable / service error)."""
    import tempfile

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from traceguard.client import Client, ServiceError, pack_bundle
    from traceguard.ingest import parse_spec

    patterns = step_patterns(step_pattern)
    if patterns and run_id:
        err.print(f"[bold red]error[/]: --step-pattern is kept with a new run; run {run_id} keeps the patterns it has")
        raise typer.Exit(2)
    # Side files given as options are more files to send: the service recognises them by content.
    given = [*(paths or []), *(str(p) for p in side_paths(nccl_log, dmon, nccl_tests, topo, smi_q))]
    if not given:
        err.print("[bold red]error[/]: nothing to upload: give capture files, a run directory, or side files")
        raise typer.Exit(2)
    specs = []
    scratch = tempfile.TemporaryDirectory(prefix="traceguard-upload-")
    for text in given:
        spec = parse_spec(text)
        if spec.path.is_dir():
            # A run bundle travels as one archive, so its manifest's ranks come with it.
            specs.append((pack_bundle(spec.path, Path(scratch.name)), None))
        elif spec.path.is_file():
            specs.append((spec.path, spec.rank))
        else:
            err.print(f"[bold red]error[/]: {escape(str(spec.path))}: no such file")
            raise typer.Exit(2)
    client = Client(server, token)
    try:
        run = (
            {"id": run_id}
            if run_id
            else client.create_run(name=name, labels=labels(label), profile=profile, step_patterns=patterns)
        )
        stored = 0
        with Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=err
        ) as progress:
            for path, rank in specs:
                task = progress.add_task(path.name, total=path.stat().st_size)
                try:
                    result = client.upload(
                        run["id"], path, rank=rank, on_bytes=lambda n, t=task: progress.advance(t, n)
                    )
                    stored += len(result["files"])
                    for skipped in result["skipped"]:
                        what = escape(f"{path.name}/{skipped['name']}: {skipped['reason']}")
                        progress.console.print(f"[dim]skipped[/] {what}")
                except ServiceError as exc:
                    if exc.status not in (415, 422):
                        raise
                    progress.console.print(f"[yellow]skipped[/] {escape(exc.message)}")
        if not stored:
            err.print("[bold red]error[/]: the service accepted none of the files")
            raise typer.Exit(2)
        job = client.analyze(run["id"], profile if run_id else None)
        label = f"analysing run {run['id']} (job {job['id']})"
        with err.status(label, spinner="dots") as status:

            def show(state: dict[str, Any]) -> None:
                done, total = state.get("ranks_done"), state.get("ranks_total")
                if state["status"] == "running" and total:
                    status.update(f"{label}: {done} of {total} files analysed")
                elif state["status"] == "queued":
                    status.update(f"{label}: queued")

            job = client.wait(job["id"], timeout=timeout, on_update=show)
        if job["status"] != "succeeded":
            err.print(
                f"[bold red]error[/]: job {job['id']} failed: {job['error']['code']}: {escape(job['error']['message'])}"
            )
            raise typer.Exit(2)
        report = client.report(run["id"]).json()
        comparison = None
        if baseline:
            base = client.newest_run(labels(baseline), exclude=run["id"])
            if base is None:
                err.print(f"[yellow]no baseline[/]: no other analysed run has {escape(', '.join(baseline))}")
            else:
                comparison = client.compare(base["id"], run["id"])
    except ServiceError as exc:
        raise fail(exc) from None
    finally:
        client.close()
        scratch.cleanup()
    warn_inputs(report)
    print_checks(report, f" · run {run['id']}")
    if comparison:
        _print_comparison(comparison)
    err.print(f"report: {server.rstrip('/')}/runs/{run['id']}")
    if junit_path:
        write(junit.render(report), junit_path)
    raise typer.Exit(1 if report["verdict"] == "fail" else 0)


def _print_comparison(comparison: dict[str, Any], top: int = 8) -> None:
    """Checks whose status changed, then the run metrics that moved most (shares in points)."""
    out.print(
        f"compared with run {comparison['base']} ({comparison['base_verdict']} → {comparison['head_verdict']}, "
        f"profile {comparison['profile']})"
    )
    for c in comparison["changed_checks"]:
        out.print(f"  check [bold]{c['id']}[/]: {c['base'] or '—'} → {c['head'] or '—'}")
    moved = [m for m in comparison["metrics"] if m["relative"] not in (None, 0)]
    # The headline metrics first (what the checks read), then whatever else moved most.
    headline = {"nccl_share_of_step", "gpu_to_cpu_copy_rate", "dtod_to_gradient_ratio", "straggler_spread"}
    moved.sort(key=lambda m: (m["metric"] not in headline, -abs(m["relative"])))
    for m in moved[:top]:
        out.print(f"  {m['metric']}: {m['base']} → {m['head']} ({100 * m['relative']:+.1f} %)")
