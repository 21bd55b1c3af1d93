"""analyze, check and profiles: the analysis of one run's captures, and the checklists it is judged by."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from traceguard.checks.profiles import DEFAULT_PROFILE, available, load_profile
from traceguard.cli.common import (
    Captures,
    DetailOpt,
    DetailOutOpt,
    DmonOpt,
    JobsOpt,
    NcclLogOpt,
    NcclTestsOpt,
    ProfileOpt,
    ReportFormat,
    SchedulerOpt,
    SlicedAboveOpt,
    SmiQOpt,
    StepPatternOpt,
    StepSourceOpt,
    TopoOpt,
    app,
    format_for,
    out,
    print_checks,
    render,
    run_analysis,
    sides,
    step_patterns,
    step_sources,
    warn_inputs,
    write,
)
from traceguard.report import junit


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
    nccl_log: NcclLogOpt = None,
    dmon: DmonOpt = None,
    nccl_tests: NcclTestsOpt = None,
    topo: TopoOpt = None,
    smi_q: SmiQOpt = None,
    step_pattern: StepPatternOpt = None,
    step_source: StepSourceOpt = None,
    scheduler: SchedulerOpt = None,
    jobs: JobsOpt = None,
    sliced_above: SlicedAboveOpt = None,
    detail: DetailOpt = "auto",
    detail_out: DetailOutOpt = None,
) -> None:
    """Analyse captures of one run and print or write the report (exit 0 whenever a report is made)."""
    patterns, sources = step_patterns(step_pattern), step_sources(step_source)
    side = sides(nccl_log, dmon, nccl_tests, topo, smi_q)
    analysis = run_analysis(
        captures, profile, side, patterns, sources, scheduler, jobs, sliced_above, detail, detail_out, out_path
    )
    warn_inputs(analysis.report)
    write(render(analysis.report, format_for(out_path, fmt)), out_path)


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
    step_pattern: StepPatternOpt = None,
    step_source: StepSourceOpt = None,
    scheduler: SchedulerOpt = None,
    jobs: JobsOpt = None,
    sliced_above: SlicedAboveOpt = None,
    detail: DetailOpt = "auto",
    detail_out: DetailOutOpt = None,
) -> None:
    """The gate: exit 0 when no check fails, 1 when one does, 2 when no input is usable."""
    patterns, sources = step_patterns(step_pattern), step_sources(step_source)
    side = sides(nccl_log, dmon, nccl_tests, topo, smi_q)
    analysis = run_analysis(
        captures, profile, side, patterns, sources, scheduler, jobs, sliced_above, detail, detail_out, json_path
    )
    report = analysis.report
    warn_inputs(report)
    print_checks(report)
    if junit_path:
        write(junit.render(report), junit_path)
    if json_path:
        write(render(report, ReportFormat.json), json_path)
    raise typer.Exit(1 if report["verdict"] == "fail" else 0)


@app.command("profiles")
def profiles_command() -> None:
    """List the checklist profiles and their rule bounds."""
    for name in sorted(available()):
        profile = load_profile(name)
        table = Table(
            title=f"{name} — {profile.description}"
            + (f" (extends {profile.chain[1]})" if len(profile.chain) > 1 else "")
        )
        for column in ("rule", "enabled", "op", "warn", "fail", "minimum evidence"):
            table.add_column(column)
        for rule_id, rule in profile.rules.items():
            floors = ", ".join(
                f"{key} = {value:,.0f}" if float(value).is_integer() else f"{key} = {value:g}"
                for key, value in sorted(rule.minimum.items())
            )
            table.add_row(rule_id, str(rule.enabled), rule.op, str(rule.warn), str(rule.fail), floors or "—")
        out.print(table)
        if profile.step_patterns:
            out.print(f"step patterns: {escape(', '.join(profile.step_patterns))}")
