"""compare and export: two runs side by side (a CI gate between two commits, no server needed), and
a run's timeline as a Chrome / Perfetto trace.

``compare BASE HEAD`` exits 0 when no check regressed, 1 when the head warns or fails a check the
base passed (``--fail-on fail``: only when it fails it), 2 when an input is unusable.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.markup import escape

from traceguard.cli.common import (
    DataDirOpt,
    ReportFormat,
    StepPatternOpt,
    app,
    err,
    fail,
    format_for,
    run_analysis,
    step_patterns,
    warn_inputs,
    write,
)
from traceguard.cli.query import ServerOpt, TokenOpt, stored_report
from traceguard.errors import InputError, TraceguardError
from traceguard.report import compare as comparing
from traceguard.report.timeline import perfetto

#: Bytes at the head of a file that show it is a traceguard JSON report (its first key).
_REPORT_MARK = b'"schema_version"'


class FailOn(StrEnum):
    warn = "warn"
    fail = "fail"


def is_report_file(path: Path) -> bool:
    """A JSON report written by ``analyze -f json`` / ``check --json`` (not a Kineto trace)."""
    if not path.is_file() or path.suffix.lower() != ".json":
        return False
    with path.open("rb") as fh:
        return _REPORT_MARK in fh.read(256)


def report_of(
    ref: str,
    *,
    profile: str | None,
    patterns: list[str],
    data_dir: Path | None,
    server: str | None,
    token: str | None,
) -> dict[str, Any]:
    """The report of one side: ``run:ID`` (stored), a JSON report file, or captures (a capture
    file, a run directory) analysed now."""
    from traceguard.checks.profiles import DEFAULT_PROFILE

    if ref.startswith("run:"):
        return stored_report(ref, data_dir=data_dir, server=server, token=token, profile=profile)
    path = Path(ref)
    if not path.exists():
        raise InputError(f"{ref}: no such file or directory (give a capture, a run directory, a JSON report or run:ID)")
    if is_report_file(path):
        return orjson.loads(path.read_bytes())
    report = run_analysis([ref], profile or DEFAULT_PROFILE, None, patterns).report
    warn_inputs(report)
    return report


@app.command("compare")
def compare_command(
    base: Annotated[str, typer.Argument(help="Base: capture file, run directory, JSON report, or run:ID.")],
    head: Annotated[str, typer.Argument(help="Head: the same kinds as BASE.")],
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            "-p",
            help="Profile both sides are judged by (default: the default profile for captures, the run's own "
            "for stored runs).",
            show_default=False,
        ),
    ] = None,
    fmt: Annotated[
        ReportFormat | None,
        typer.Option(
            "--format", "-f", help="md, json or html (default: from --out's suffix, else md).", show_default=False
        ),
    ] = None,
    out_path: Annotated[Path | None, typer.Option("--out", "-o", help="Write the comparison here.")] = None,
    fail_on: Annotated[
        FailOn, typer.Option("--fail-on", help="Exit 1 when a check the base passed now warns (warn) or fails (fail).")
    ] = FailOn.warn,
    step_pattern: StepPatternOpt = None,
    data_dir: DataDirOpt = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Compare two runs: checks that changed status, metric deltas (shares in percentage points),
    per step and per collective type. Exit 1 when the head regresses a check the base passed."""
    patterns = step_patterns(step_pattern)
    try:
        reports = [
            report_of(ref, profile=profile, patterns=patterns, data_dir=data_dir, server=server, token=token)
            for ref in (base, head)
        ]
    except TraceguardError as exc:
        raise fail(exc) from None
    comparison = {"base_label": base, "head_label": head, **comparing.compare(*reports)}
    chosen = format_for(out_path, fmt)
    if chosen is ReportFormat.json:
        text = orjson.dumps(comparison, option=orjson.OPT_INDENT_2).decode() + "\n"
    elif chosen is ReportFormat.html:
        text = comparing.render_html(comparison)
    else:
        text = comparing.render_markdown(comparison)
    write(text, out_path)
    gate = comparison["regressions"] if fail_on is FailOn.warn else comparison["fail_regressions"]
    if gate:
        err.print(f"[bold red]regressed[/]: {escape(', '.join(gate))} (passed in {escape(base)})")
    raise typer.Exit(1 if gate else 0)


@app.command("export")
def export_command(
    captures: Annotated[
        list[str] | None,
        typer.Argument(help="Captures or a run directory (analysed now), or one JSON report.", show_default=False),
    ] = None,
    perfetto_path: Annotated[
        Path | None,
        typer.Option(
            "--perfetto",
            help="Write the timeline as Chrome/Perfetto trace-event JSON here (open in ui.perfetto.dev).",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[str | None, typer.Option("--profile", "-p", help="Profile (captures only).")] = None,
    step_pattern: StepPatternOpt = None,
) -> None:
    """Export a run's timeline lanes (per rank: steps, phases, compute, NCCL by type, exposed NCCL,
    memcpy) — the report's `timeline` section, aggregated to what a screen shows."""
    if perfetto_path is None:
        err.print("[bold red]error[/]: say what to export: --perfetto OUT.json")
        raise typer.Exit(2)
    given = captures or []
    if not given:
        err.print("[bold red]error[/]: give captures, a run directory, or a JSON report")
        raise typer.Exit(2)
    try:
        if len(given) == 1 and is_report_file(Path(given[0])):
            report = orjson.loads(Path(given[0]).read_bytes())
        else:
            from traceguard.checks.profiles import DEFAULT_PROFILE

            report = run_analysis(given, profile or DEFAULT_PROFILE, None, step_patterns(step_pattern)).report
            warn_inputs(report)
    except TraceguardError as exc:
        raise fail(exc) from None
    if not (report.get("timeline") or {}).get("ranks"):
        err.print("[yellow]note[/]: the report has no timeline (no GPU ops, or a report made before timelines)")
    trace = perfetto(report)
    perfetto_path.parent.mkdir(parents=True, exist_ok=True)
    perfetto_path.write_bytes(orjson.dumps(trace))
    events = sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
    err.print(f"wrote {escape(str(perfetto_path))} ({events} segments)")
