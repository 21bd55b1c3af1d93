"""The ``traceguard`` command line: a thin typer adapter over :mod:`traceguard.pipeline`.

Exit codes: ``analyze`` 0 whenever it produced a report; ``check`` 0 when no check fails, 1 when
one does; both 2 when no input is usable or the invocation is wrong (with a message saying what).
"""

from __future__ import annotations

import os

# Polars' allocator (jemalloc) keeps freed pages by default; a one-shot CLI run over a
# multi-GB capture should hand them back at once, or its peak RSS counts memory it no longer
# uses. Must be set before polars is first imported.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

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
    table = Table(title=f"traceguard · profile {analysis.profile.name} · verdict {report['verdict'].upper()}")
    for column in ("check", "status", "detail"):
        table.add_column(column)
    for c in report["checks"]:
        detail = c["reason"] if c["status"] == "skip" else c["message"]
        table.add_row(c["id"], f"[{_STYLE[c['status']]}]{c['status']}[/]", detail or "")
    out.print(table)
    for c in report["checks"]:
        if c["status"] == "fail" and c.get("remedy"):
            out.print(f"[bold red]{c['id']}[/]: {c['remedy']}")
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
