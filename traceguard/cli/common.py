"""What every command group shares: the typer app, the consoles, option types and the output helpers."""

from __future__ import annotations

import gc
import os
import sys
import traceback
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from traceguard import __version__
from traceguard.errors import TraceguardError
from traceguard.ingest.sides import SideFiles, side_files
from traceguard.memory import fewer_collections
from traceguard.pipeline import Analysis, analyze
from traceguard.report import html, markdown

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
        help="Capture files (nsys .sqlite[.gz] / .nsys-rep, Kineto .json[.gz]), run-bundle directories, and side "
        "files (NCCL_DEBUG logs, NCCL Inspector logs or a directory of them, nvidia-smi dmon / topo -m / -q "
        "output, nccl-tests output), all recognised by content; FILE:RANK names a capture's rank.",
        show_default=False,
    ),
]
Files = Annotated[list[Path] | None, typer.Option(show_default=False)]


def sides(
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
StepPatternOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--step-pattern",
        metavar="REGEX",
        help="NVTX / record_function range name that marks one training step (regular expression, repeatable); "
        "tried before the profile's patterns and the known training-loop conventions.",
        show_default=False,
    ),
]


StepSourceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--step-source",
        metavar="SOURCE",
        help="Where steps may come from, tried in the order given (repeatable): pattern, convention, inferred, "
        "window. Default: all four in that order. E.g. `--step-source inferred` shows the steps the capture's own "
        "periodic GPU work gives, markers ignored.",
        show_default=False,
    ),
]


SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        "--scheduler",
        metavar="SCHEDULER",
        help="Where the per-file analyses run: `local` (processes on this machine, the default), `serial` (this "
        "process, one file at a time), or a Dask scheduler address such as tcp://host:8786 (needs the dask "
        "extra of traceguard; workers must see the files at the same paths). Default: TRACEGUARD_DASK_SCHEDULER "
        "when set, else local. The report is the same whichever runs it.",
        show_default=False,
    ),
]
JobsOpt = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        min=1,
        help="Processes of the local scheduler (default: one per core).",
        show_default=False,
    ),
]
SlicedAboveOpt = Annotated[
    str | None,
    typer.Option(
        "--sliced-above",
        metavar="SIZE",
        help="Analyse nsys SQLite exports of at least SIZE (bytes, or e.g. 512M, 4G) in time slices, with memory "
        "bounded by a slice instead of growing with the file; the report is the same. Default: "
        "TRACEGUARD_SLICED_ABOVE when set, else 1G (a quarter of this machine's memory if less; an export "
        "whose steps must come from its kernel sequence is then sliced only above that quarter).",
        show_default=False,
    ),
]

DetailOpt = Annotated[
    str,
    typer.Option(
        "--detail",
        metavar="MODE",
        help="What the report holds: `full` (every rank and step), `summary` (the run, distributions over ranks, "
        "rank x step heat maps and the worst ranks whole; every row goes to a Parquet side output, see "
        "--detail-out) or `auto` (summary above 32 capture files).",
    ),
]
DetailOutOpt = Annotated[
    Path | None,
    typer.Option(
        "--detail-out",
        metavar="DIR",
        help="Write the Parquet side output (every rank's and step's rows, one folder per table) here. Default "
        "for a summary: REPORT.detail beside --out, else ./traceguard-detail (a previous side output there is "
        "replaced). Given with a full report, the full report gets one too.",
        show_default=False,
    ),
]


def default_detail_folder(out_path: Path | None) -> Path:
    """Where a summary's side output goes without ``--detail-out`` (:data:`DetailOutOpt`)."""
    return out_path.with_name(out_path.name + ".detail") if out_path else Path("traceguard-detail")


def side_paths(
    nccl_log: list[Path] | None,
    dmon: list[Path] | None,
    nccl_tests: list[Path] | None,
    topo: list[Path] | None,
    smi_q: list[Path] | None,
) -> list[Path]:
    """Every side file given as an option, for the commands that classify files by content (record, upload)."""
    return [*(nccl_log or []), *(dmon or []), *(nccl_tests or []), *(topo or []), *(smi_q or [])]


def step_patterns(patterns: list[str] | None) -> list[str]:
    """The ``--step-pattern`` values, each compiled by the engine that will match it
    (:func:`traceguard.metrics.steps.validate_patterns`); a bad one exits 2 naming it."""
    from traceguard.metrics.steps import validate_patterns

    try:
        validate_patterns(patterns or [])
    except ValueError as exc:
        err.print(f"[bold red]error[/]: --step-pattern {escape(str(exc))}")
        raise typer.Exit(2) from None
    return list(patterns or [])


def step_sources(sources: list[str] | None) -> list[str] | None:
    """The ``--step-source`` values, checked against the known sources (exit 2 naming a wrong one)."""
    from traceguard.metrics.steps import STEP_SOURCES

    for source in sources or []:
        if source not in STEP_SOURCES:
            err.print(f"[bold red]error[/]: --step-source {source!r}: choose from {', '.join(STEP_SOURCES)}")
            raise typer.Exit(2)
    return list(sources) if sources else None


def debugging() -> bool:
    """``--debug`` was given (it sets ``TRACEGUARD_DEBUG``) or ``TRACEGUARD_DEBUG`` is set to a true value."""
    return os.environ.get("TRACEGUARD_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def show_error(exc: TraceguardError) -> None:
    """The project's error as the user sees it: the message and the hint; the traceback under ``--debug``."""
    if debugging():
        traceback.print_exception(exc)
    err.print(f"[bold red]error[/]: {escape(exc.message)}")
    if exc.hint:
        err.print(f"  {escape(exc.hint)}")


def _version(value: bool) -> None:
    if value:
        out.print(f"traceguard {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug", help="Print the Python traceback of an error (also TRACEGUARD_DEBUG=1); for bug reports."
        ),
    ] = False,
) -> None:
    """traceguard command line."""
    if debug:
        os.environ["TRACEGUARD_DEBUG"] = "1"


#: Set by the console entry point, which ends the process without interpreter teardown.
EXITS_WITHOUT_TEARDOWN = False
_kept_until_exit: list[Any] = []


def keep_until_exit(value: Any) -> None:
    """Hold ``value`` until the process ends, where it ends without teardown
    (:data:`EXITS_WITHOUT_TEARDOWN`): a large analysis is otherwise freed object by object as the
    command returns (the CUDA-graph shape's 68 k steps: 0.11 s after its report is written).
    What is alive then is also left out of later garbage collections (``gc.freeze``): it is
    freed by the exit, and walking it once more cost 76 ms while the report was rendered.
    Elsewhere (tests calling the app in process, the service) nothing is held or frozen."""
    if EXITS_WITHOUT_TEARDOWN:
        _kept_until_exit.append(value)
        gc.freeze()


def run_analysis(
    captures: list[str] | None,
    profile: str,
    side: SideFiles | None = None,
    patterns: list[str] | None = None,
    sources: list[str] | None = None,
    scheduler: str | None = None,
    jobs: int | None = None,
    sliced_above: str | None = None,
    detail: str = "auto",
    detail_out: Path | None = None,
    out_path: Path | None = None,
) -> Analysis:
    """The analysis behind analyze and check, with a progress bar of the files analysed."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from traceguard.mapreduce import parse_size

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    task = bar.add_task("reading captures", total=None)
    try:
        slice_bytes = parse_size(sliced_above) if sliced_above is not None else None
        # Collected as the analysing process is (traceguard.memory), until the analysis is held
        # to the exit: the collection that would walk its objects once the thresholds came back
        # (76-87 ms of the CUDA-graph shape) never comes.
        with bar, fewer_collections():
            analysis = analyze(
                captures or [],
                profile=profile,
                side_files=side,
                step_patterns=patterns,
                step_sources=sources,
                progress=lambda msg: bar.update(task, description=msg),
                scheduler=scheduler,
                jobs=jobs,
                sliced_above=slice_bytes,
                detail=detail,
                detail_dir=detail_out,
                detail_default_dir=default_detail_folder(out_path),
                on_ranks=lambda done, total: bar.update(
                    task, description="analysing files", completed=done, total=total
                ),
            )
            keep_until_exit(analysis)
        return analysis
    except TraceguardError as exc:
        show_error(exc)
        raise typer.Exit(exc.exit_code) from None


def render(report: dict[str, Any], fmt: ReportFormat) -> str | bytes:
    """The report as ``fmt``; JSON as UTF-8 bytes, written as they are (a 100 MB report of 68 k
    steps spent 0.5 s decoding them to a str and encoding it back)."""
    if fmt is ReportFormat.json:
        return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    if fmt is ReportFormat.html:
        return html.render(report)
    return markdown.render(report)


def write(text: str | bytes, target: Path | None) -> None:
    if target is None or str(target) == "-":
        if isinstance(text, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(text)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(text)
    else:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(text, bytes):
                target.write_bytes(text)
            else:
                target.write_text(text)
        except OSError as exc:  # where the user asked to write, not a bug
            err.print(f"[bold red]error[/]: cannot write {escape(str(target))}: {escape(exc.strerror or str(exc))}")
            raise typer.Exit(2) from None
        err.print(f"wrote {escape(str(target))}")


def warn_inputs(report: dict[str, Any]) -> None:
    for problem in report["side_inputs"]["errors"]:
        err.print(f"[yellow]skipped[/] {escape(problem)}")
    for item in report["inputs"]:
        if item["error"]:
            err.print(f"[yellow]skipped[/] {escape(item['path'])}: {escape(item['error'])}")
        for warning in item["warnings"]:
            err.print(f"[dim]note[/] {escape(item['path'])}: {escape(warning)}")


def print_checks(report: dict[str, Any], title: str = "") -> None:
    table = Table(
        title=f"traceguard{title} · profile {report['profile']['name']} · verdict {report['verdict'].upper()}"
    )
    for column in ("check", "status", "detail"):
        table.add_column(column)
    for c in report["checks"]:
        detail = c["reason"] if c["status"] == "skip" else c["message"]
        table.add_row(c["id"], f"[{_STYLE[c['status']]}]{c['status']}[/]", escape(detail or ""))
    out.print(table)
    for c in report["checks"]:
        if c["status"] == "fail" and c.get("remedy"):
            out.print(f"[bold red]{c['id']}[/]: {escape(c['remedy'])}")


def format_for(target: Path | None, fmt: ReportFormat | None) -> ReportFormat:
    if fmt is not None:
        return fmt
    if target is not None:
        suffix = target.suffix.lower()
        if suffix == ".json":
            return ReportFormat.json
        if suffix in (".html", ".htm"):
            return ReportFormat.html
    return ReportFormat.md


# The service side (serve, tokens, the local store, uploads) keeps its imports lazy so that the
# analysis commands start without SQLAlchemy or FastAPI.

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


def settings_for(data_dir: Path | None) -> Settings:
    from traceguard.settings import Settings

    return Settings(data_dir=data_dir) if data_dir else Settings()


def where(settings: Settings) -> str:
    return (
        "the database at $TRACEGUARD_DATABASE_URL"
        if settings.database_url
        else str(settings.data_dir / "traceguard.db")
    )


def labels(items: list[str] | None) -> dict[str, str]:
    parsed = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            err.print(f"[bold red]error[/]: label {escape(repr(item))} is not key=value")
            raise typer.Exit(2)
        parsed[key] = value
    return parsed


def fail(exc: TraceguardError) -> typer.Exit:
    show_error(exc)
    return typer.Exit(exc.exit_code)
