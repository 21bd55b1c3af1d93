"""The ``traceguard`` command line: a thin typer adapter over :mod:`traceguard.pipeline`.

Exit codes: ``analyze`` 0 whenever it produced a report; ``check`` 0 when no check fails, 1 when
one does; both 2 when no input is usable or the invocation is wrong (with a message saying what).
"""

from __future__ import annotations

import os

# Polars' allocator (jemalloc) keeps freed pages for 10 s by default, which a one-shot run
# over a multi-GB capture would count in its peak RSS. Handing them back at once (0 ms) costs
# more: the next allocation faults them in again (~1.4 M page faults, ~5 s of system time at
# 10 M kernels). Two seconds keeps what the next step reuses and returns the rest (measured in
# bench/RESULTS.md). Must be set before polars is first imported.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:2000,muzzy_decay_ms:0")
# NumPy's OpenBLAS starts a spinning thread per core; traceguard does no linear algebra, and on
# a small machine those threads take cycles from the reader's two processes.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from traceguard import __version__
from traceguard.checks.profiles import DEFAULT_PROFILE, available, load_profile
from traceguard.errors import InputError, TraceguardError
from traceguard.ingest.sides import SideFiles, side_files
from traceguard.pipeline import Analysis, analyze
from traceguard.report import html, junit, markdown

if TYPE_CHECKING:
    from traceguard.settings import Settings

app = typer.Typer(
    name="traceguard",
    help="Is our GPU-to-GPU communication healthy, and if not, why? Analyses nsys / Kineto captures of "
    "distributed PyTorch training against a production checklist.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
out = Console()

_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


class ReportFormat(StrEnum):
    json = "json"
    md = "md"
    html = "html"


Captures = Annotated[
    list[str] | None,
    typer.Argument(
        help="Capture files (nsys .sqlite[.gz] / .nsys-rep, Kineto .json[.gz]) or run-bundle directories "
        "(their NCCL logs and nvidia-smi / benchmark files are found by content); FILE:RANK names the rank.",
        show_default=False,
    ),
]
Files = Annotated[list[Path] | None, typer.Option(show_default=False)]


def _sides(
    nccl_log: list[Path] | None,
    dmon: list[Path] | None,
    nccl_tests: list[Path] | None,
    topo: list[Path] | None,
    smi_q: list[Path] | None,
) -> SideFiles:
    return side_files(nccl_log or [], dmon or [], nccl_tests or [], topo or [], smi_q or [])


NcclLogOpt = Annotated[list[Path] | None, typer.Option("--nccl-log", help="NCCL_DEBUG=INFO log (repeatable).")]
DmonOpt = Annotated[list[Path] | None, typer.Option("--dmon", help="`nvidia-smi dmon -s t` output (repeatable).")]
NcclTestsOpt = Annotated[
    list[Path] | None,
    typer.Option("--nccl-tests", help="Collective benchmark output in nccl-tests format (repeatable)."),
]
TopoOpt = Annotated[list[Path] | None, typer.Option("--topo", help="`nvidia-smi topo -m` output.")]
SmiQOpt = Annotated[list[Path] | None, typer.Option("--smi-q", help="`nvidia-smi -q` output (PCIe link speed).")]
ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="Checklist profile name or .toml path.")]


def _version(value: bool) -> None:
    if value:
        out.print(f"traceguard {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    """traceguard command line."""


def _run(captures: list[str] | None, profile: str, sides: SideFiles | None = None) -> Analysis:
    try:
        with err.status("reading captures", spinner="dots") as status:
            return analyze(captures or [], profile=profile, side_files=sides, progress=lambda msg: status.update(msg))
    except TraceguardError as exc:
        err.print(f"[bold red]error[/]: {exc.message}")
        if exc.hint:
            err.print(f"  {exc.hint}")
        raise typer.Exit(exc.exit_code) from None


def render(report: dict[str, Any], fmt: ReportFormat) -> str:
    if fmt is ReportFormat.json:
        return orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt is ReportFormat.html:
        return html.render(report)
    return markdown.render(report)


def _write(text: str, target: Path | None) -> None:
    if target is None or str(target) == "-":
        sys.stdout.write(text)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        err.print(f"wrote {target}")


def _warn_inputs(report: dict[str, Any]) -> None:
    for problem in report["side_inputs"]["errors"]:
        err.print(f"[yellow]skipped[/] {problem}")
    for item in report["inputs"]:
        if item["error"]:
            err.print(f"[yellow]skipped[/] {item['path']}: {item['error']}")
        for warning in item["warnings"]:
            err.print(f"[dim]note[/] {item['path']}: {warning}")


def _print_checks(report: dict[str, Any], title: str = "") -> None:
    table = Table(
        title=f"traceguard{title} · profile {report['profile']['name']} · verdict {report['verdict'].upper()}"
    )
    for column in ("check", "status", "detail"):
        table.add_column(column)
    for c in report["checks"]:
        detail = c["reason"] if c["status"] == "skip" else c["message"]
        table.add_row(c["id"], f"[{_STYLE[c['status']]}]{c['status']}[/]", detail or "")
    out.print(table)
    for c in report["checks"]:
        if c["status"] == "fail" and c.get("remedy"):
            out.print(f"[bold red]{c['id']}[/]: {c['remedy']}")


def _format_for(target: Path | None, fmt: ReportFormat | None) -> ReportFormat:
    if fmt is not None:
        return fmt
    if target is not None:
        suffix = target.suffix.lower()
        if suffix == ".json":
            return ReportFormat.json
        if suffix in (".html", ".htm"):
            return ReportFormat.html
    return ReportFormat.md


@app.command("analyze")
def analyze_command(
    captures: Captures = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    fmt: Annotated[
        ReportFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="Report format (default: from --out's suffix, else md).",
            show_default=False,
        ),
    ] = None,
    out_path: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the report here instead of stdout.")
    ] = None,
) -> None:
    """Analyse captures of one run and print or write the report (exit 0 whenever a report is made)."""
    analysis = _run(captures, profile)
    _warn_inputs(analysis.report)
    _write(render(analysis.report, _format_for(out_path, fmt)), out_path)


@app.command("check")
def check_command(
    captures: Captures = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    junit_path: Annotated[Path | None, typer.Option("--junit", help="Write the checks as JUnit XML here.")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the JSON report here.")] = None,
    nccl_log: NcclLogOpt = None,
    dmon: DmonOpt = None,
    nccl_tests: NcclTestsOpt = None,
    topo: TopoOpt = None,
    smi_q: SmiQOpt = None,
) -> None:
    """The gate: exit 0 when no check fails, 1 when one does, 2 when no input is usable."""
    analysis = _run(captures, profile, _sides(nccl_log, dmon, nccl_tests, topo, smi_q))
    report = analysis.report
    _warn_inputs(report)
    _print_checks(report)
    if junit_path:
        _write(junit.render(report), junit_path)
    if json_path:
        _write(render(report, ReportFormat.json), json_path)
    raise typer.Exit(1 if report["verdict"] == "fail" else 0)


class NcclFormat(StrEnum):
    json = "json"
    md = "md"


@app.command("nccl")
def nccl_command(
    logs: Annotated[list[Path], typer.Argument(help="NCCL_DEBUG=INFO logs: one per rank, or one console log.")],
    fmt: Annotated[NcclFormat, typer.Option("--format", "-f", help="Output format.")] = NcclFormat.md,
    topo: TopoOpt = None,
    out_path: Annotated[Path | None, typer.Option("--out", "-o", help="Write here instead of stdout.")] = None,
) -> None:
    """NCCL's own account of how it connected the GPUs: transport matrix (rank × peer) and findings."""
    from traceguard.ingest.sides import SideFiles, load_side
    from traceguard.report.nccl import render_markdown

    try:
        side = load_side(SideFiles(nccl_log=list(logs), topo=list(topo or [])))
        if side.nccl is None:
            raise InputError("; ".join(side.errors) or "no NCCL log could be read")
    except TraceguardError as exc:
        err.print(f"[bold red]error[/]: {exc.message}")
        raise typer.Exit(exc.exit_code) from None
    doc = side.nccl.to_dict(nvlink_pairs=side.nvlink_pairs)
    if not (doc["connections"] or doc["versions"] or doc["warnings"]):
        err.print("[bold red]error[/]: no NCCL log lines found; run the job with NCCL_DEBUG=INFO")
        raise typer.Exit(2)
    if fmt is NcclFormat.json:
        _write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n", out_path)
    else:
        _write(render_markdown(doc), out_path)


@app.command(
    "bench-collectives",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def bench_collectives_command(
    ctx: typer.Context,
    nproc: Annotated[int | None, typer.Option("--nproc", help="Processes (GPUs) to use; default: all GPUs.")] = None,
) -> None:
    """Collective sweep printing nccl-tests output (needs traceguard[harness]); other options pass through
    to `python -m traceguard.capture.bench_collectives` (see its --help)."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("torch") is None:
        err.print("[bold red]error[/]: bench-collectives needs torch: pip install 'traceguard[harness]'")
        raise typer.Exit(2)
    if nproc is None:
        import torch

        nproc = torch.cuda.device_count() or 2
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "traceguard.capture.bench_collectives",
        *ctx.args,
    ]
    raise typer.Exit(subprocess.call(cmd))


harness_app = typer.Typer(help="Run the instrumented DDP job (needs traceguard[harness]) and sweeps of settings.")
app.add_typer(harness_app, name="harness")
_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@harness_app.command("run", context_settings=_PASS_THROUGH)
def harness_run(ctx: typer.Context) -> None:
    """Run the job once into a bundle: options of `python -m traceguard.capture.harness run --help`."""
    from traceguard.capture import harness

    raise typer.Exit(harness.main(["run", *ctx.args]))


@harness_app.command("sweep", context_settings=_PASS_THROUGH)
def harness_sweep(
    ctx: typer.Context,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for one bundle per setting.")],
    matrix: Annotated[str, typer.Option("--matrix", help="Named matrix: gpu or cpu.")] = "gpu",
    profile: ProfileOpt = DEFAULT_PROFILE,
) -> None:
    """Run a matrix of settings, then write the results table (results.md, results.json)."""
    from traceguard.capture import harness

    harness.main(["sweep", "--matrix", matrix, "--out", str(out_dir), *ctx.args])
    harness_table(out_dir, profile)


@harness_app.command("table")
def harness_table(
    sweep_dir: Annotated[Path, typer.Argument(help="A sweep directory (with sweep.json).")],
    profile: ProfileOpt = DEFAULT_PROFILE,
) -> None:
    """Analyse every bundle of a sweep and write its results table (results.md, results.json)."""
    from traceguard.report.sweep import render_markdown, row

    try:
        sweep = orjson.loads((sweep_dir / "sweep.json").read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        err.print(f"[bold red]error[/]: {sweep_dir}/sweep.json is missing or not JSON ({exc})")
        raise typer.Exit(2) from None
    rows = []
    for setting in sweep["settings"]:
        bundle = sweep_dir / setting["bundle"]
        manifest = orjson.loads((bundle / "manifest.json").read_bytes()) if (bundle / "manifest.json").exists() else {}
        try:
            report = analyze([str(bundle)], profile=profile).report
        except TraceguardError as exc:
            err.print(f"[yellow]{setting['name']}[/]: {exc.message}")
            report = None
        rows.append(row(setting["name"], setting["options"], manifest, report))
    (sweep_dir / "results.json").write_bytes(
        orjson.dumps({"profile": profile, "matrix": sweep["matrix"], "rows": rows}, option=orjson.OPT_INDENT_2)
    )
    text = render_markdown(rows, profile)
    (sweep_dir / "results.md").write_text(text)
    out.print(text)


@app.command("profiles")
def profiles_command() -> None:
    """List the checklist profiles and their rule bounds."""
    for name in sorted(available()):
        profile = load_profile(name)
        table = Table(
            title=f"{name} — {profile.description}"
            + (f" (extends {profile.chain[1]})" if len(profile.chain) > 1 else "")
        )
        for column in ("rule", "enabled", "op", "warn", "fail"):
            table.add_column(column)
        for rule_id, rule in profile.rules.items():
            table.add_row(rule_id, str(rule.enabled), rule.op, str(rule.warn), str(rule.fail))
        out.print(table)


# --------------------------------------------------------------------------------------------
# The service: serve, tokens, the local store, and the upload client (imports kept lazy so that
# the analysis commands start without SQLAlchemy or FastAPI).

DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Store directory (blobs, embedded SQLite). Default: $TRACEGUARD_DATA_DIR or ~/.local/share/traceguard; "
        "$TRACEGUARD_DATABASE_URL replaces the embedded database.",
        show_default=False,
    ),
]
LabelOpt = Annotated[list[str] | None, typer.Option("--label", "-l", help="Run label key=value (repeatable).")]


def _settings(data_dir: Path | None) -> Settings:
    from traceguard.settings import Settings

    return Settings(data_dir=data_dir) if data_dir else Settings()


def _where(settings) -> str:
    return (
        "the database at $TRACEGUARD_DATABASE_URL"
        if settings.database_url
        else str(settings.data_dir / "traceguard.db")
    )


def _labels(items: list[str] | None) -> dict[str, str]:
    labels = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            err.print(f"[bold red]error[/]: label {item!r} is not key=value")
            raise typer.Exit(2)
        labels[key] = value
    return labels


def _fail(exc: TraceguardError) -> typer.Exit:
    err.print(f"[bold red]error[/]: {exc.message}")
    if exc.hint:
        err.print(f"  {exc.hint}")
    return typer.Exit(exc.exit_code)


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    data_dir: DataDirOpt = None,
    workers: Annotated[int | None, typer.Option(help="Analysis worker threads (default 2).")] = None,
) -> None:
    """Run the service (API, web pages, background analysis). On an empty store it creates project
    `default` and prints an admin token, once."""
    import uvicorn

    from api.app import create_app
    from traceguard.service.context import Context

    settings = _settings(data_dir)
    if workers:
        settings.workers = workers
    try:
        ctx = Context.open(settings)
        secret = ctx.bootstrap()
        ctx.close()
    except TraceguardError as exc:
        raise _fail(exc) from None
    if secret:
        err.print(f"created project [bold]default[/]; its admin token (shown only now):\n{secret}")
    where = _where(settings)
    err.print(f"traceguard serving on http://{host}:{port} · store {where} · blobs {settings.data_dir / 'blobs'}")
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info", access_log=False)


token_app = typer.Typer(help="API tokens (scoped to one project).")
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    project: Annotated[str, typer.Option(help="Project the token may see (created if new).")],
    scope: Annotated[str, typer.Option(help="Comma-separated scopes: read, upload, admin.")] = "read",
    name: Annotated[str, typer.Option(help="A note saying what the token is for.")] = "",
    data_dir: DataDirOpt = None,
) -> None:
    """Create a token and print it (the store keeps only its hash)."""
    from traceguard.service.context import Context
    from traceguard.store.access import create_token, get_or_create_project, parse_scopes
    from traceguard.store.db import transaction

    try:
        scopes = parse_scopes(scope)
        ctx = Context.open(_settings(data_dir))
        with transaction(ctx.factory) as session:
            _, secret = create_token(session, get_or_create_project(session, project), scopes, name=name)
        ctx.close()
    except TraceguardError as exc:
        raise _fail(exc) from None
    sys.stdout.write(secret + "\n")


@app.command("record")
def record_command(
    captures: Annotated[
        list[Path], typer.Argument(help="Capture files, side files, run bundles (directories or archives).")
    ],
    project: Annotated[str, typer.Option(help="Project to record the run in.")] = "default",
    name: Annotated[str, typer.Option(help="Run name.")] = "",
    label: LabelOpt = None,
    profile: ProfileOpt = DEFAULT_PROFILE,
    data_dir: DataDirOpt = None,
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
    files = [p for c in captures for p in (sorted(x for x in c.iterdir() if x.is_file()) if c.is_dir() else [c])]
    try:
        ctx = Context.open(_settings(data_dir))
        with transaction(ctx.factory) as session:
            run = create_run(
                session, get_or_create_project(session, project).id, name=name, labels=_labels(label), profile=profile
            )
            for path in files:
                try:
                    intake = receive_path(ctx, session, run, path)
                except InputError as exc:
                    err.print(f"[yellow]skipped[/] {exc.message}")
                    continue
                for row, _ in intake.files:
                    err.print(f"stored {row.name} ({row.kind})")
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
        raise _fail(exc) from None
    where = _where(ctx.settings)
    if status != "succeeded" or stored is None:
        err.print(f"[bold red]error[/]: run {run_id}: {job_row.error_code}: {job_row.error_message}")
        raise typer.Exit(2)
    report = stored.document
    _warn_inputs(report)
    _print_checks(report, f" · run {run_id}")
    err.print(f"run {run_id} recorded in {where}")
    ctx.close()
    raise typer.Exit(1 if report["verdict"] == "fail" else 0)


@app.command("upload")
def upload_command(
    paths: Annotated[
        list[str],
        typer.Argument(help="Files to upload (FILE:RANK names the rank); a run directory goes as one archive."),
    ],
    server: Annotated[str, typer.Option(envvar="TRACEGUARD_SERVER", help="Service URL.")],
    token: Annotated[str, typer.Option(envvar="TRACEGUARD_TOKEN", help="API token with read and upload scopes.")],
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
) -> None:
    """Upload captures to a traceguard service, wait for its analysis, print the verdict, and exit
    like `check` (0 no failure, 1 a check fails, 2 nothing usable / service error)."""
    import tempfile

    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    from traceguard.client import Client, ServiceError, pack_bundle
    from traceguard.ingest import parse_spec

    specs = []
    scratch = tempfile.TemporaryDirectory(prefix="traceguard-upload-")
    for text in paths:
        spec = parse_spec(text)
        if spec.path.is_dir():
            # A run bundle travels as one archive, so its manifest's ranks come with it.
            specs.append((pack_bundle(spec.path, Path(scratch.name)), None))
        elif spec.path.is_file():
            specs.append((spec.path, spec.rank))
        else:
            err.print(f"[bold red]error[/]: {spec.path}: no such file")
            raise typer.Exit(2)
    client = Client(server, token)
    try:
        run = {"id": run_id} if run_id else client.create_run(name=name, labels=_labels(label), profile=profile)
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
                        progress.console.print(f"[dim]skipped[/] {path.name}/{skipped['name']}: {skipped['reason']}")
                except ServiceError as exc:
                    if exc.status not in (415, 422):
                        raise
                    progress.console.print(f"[yellow]skipped[/] {exc.message}")
        if not stored:
            err.print("[bold red]error[/]: the service accepted none of the files")
            raise typer.Exit(2)
        job = client.analyze(run["id"], profile if run_id else None)
        with err.status(f"analysing run {run['id']} (job {job['id']})", spinner="dots"):
            job = client.wait(job["id"], timeout=timeout)
        if job["status"] != "succeeded":
            err.print(f"[bold red]error[/]: job {job['id']} failed: {job['error']['code']}: {job['error']['message']}")
            raise typer.Exit(2)
        report = client.report(run["id"]).json()
        comparison = None
        if baseline:
            base = client.newest_run(_labels(baseline), exclude=run["id"])
            if base is None:
                err.print(f"[yellow]no baseline[/]: no other analysed run has {', '.join(baseline)}")
            else:
                comparison = client.compare(base["id"], run["id"])
    except ServiceError as exc:
        raise _fail(exc) from None
    finally:
        client.close()
        scratch.cleanup()
    _warn_inputs(report)
    _print_checks(report, f" · run {run['id']}")
    if comparison:
        _print_comparison(comparison)
    err.print(f"report: {server.rstrip('/')}/runs/{run['id']}")
    if junit_path:
        _write(junit.render(report), junit_path)
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
    for m in sorted(moved, key=lambda m: abs(m["relative"]), reverse=True)[:top]:
        out.print(f"  {m['metric']}: {m['base']} → {m['head']} ({100 * m['relative']:+.1f} %)")


def console_main() -> None:
    """Console entry point: run the command, then exit without interpreter teardown.

    Freeing a multi-GB capture object by object takes ~0.3 s after the report is already out.
    """
    try:
        app()
        code = 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
            code = 1
        else:
            code = exc.code or 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
