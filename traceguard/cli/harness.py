"""harness and bench-collectives: run the instrumented DDP job, sweeps of its settings, and a collective sweep."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.markup import escape
from typer.core import TyperCommand

from traceguard.checks.profiles import DEFAULT_PROFILE
from traceguard.cli.common import ProfileOpt, app, err, out
from traceguard.errors import TraceguardError
from traceguard.pipeline import analyze

if TYPE_CHECKING:
    from typer._click import HelpFormatter  # typer's own click, the one its commands use


def with_parser_help(parser: Callable[[], argparse.ArgumentParser]) -> type[TyperCommand]:
    """A command class whose ``--help`` ends with the help of the argparse parser its other options go to.

    The harness and the benchmark define their options once, in argparse (they run as ``python -m``
    on GPU machines); the pass-through commands show them from there instead of a copy.
    """

    class PassThroughCommand(TyperCommand):
        def format_help(self, ctx: typer.Context, formatter: HelpFormatter) -> None:
            super().format_help(ctx, formatter)
            formatter.write("\n" + parser().format_help())

    return PassThroughCommand


def _bench_parser() -> argparse.ArgumentParser:
    from traceguard.capture.bench_options import build_parser

    return build_parser(prog="traceguard bench-collectives")


def _run_parser() -> argparse.ArgumentParser:
    from traceguard.capture import harness

    return harness.run_parser()


def _sweep_parser() -> argparse.ArgumentParser:
    from traceguard.capture import harness

    return harness.sweep_parser(with_job_options=True)


_PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("bench-collectives", context_settings=_PASS_THROUGH, cls=with_parser_help(_bench_parser))
def bench_collectives_command(
    ctx: typer.Context,
    nproc: Annotated[int | None, typer.Option("--nproc", help="Processes (GPUs) to use; default: all GPUs.")] = None,
) -> None:
    r"""Collective sweep printing nccl-tests output (needs traceguard\[harness]): the benchmark's options,
    listed below, pass through to `python -m traceguard.capture.bench_collectives` on every rank."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("torch") is None:
        err.print("[bold red]error[/]: bench-collectives needs torch: pip install 'traceguard\\[harness]'")
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


harness_app = typer.Typer(
    help=r"Run the instrumented job — DDP, pipeline, broadcast-reduce, FSDP, tensor parallel — (needs "
    r"traceguard\[harness]) and sweeps of settings.",
    no_args_is_help=True,
)
app.add_typer(harness_app, name="harness")


@harness_app.command("run", context_settings=_PASS_THROUGH, cls=with_parser_help(_run_parser))
def harness_run(ctx: typer.Context) -> None:
    """Run the job once into a bundle (the options below)."""
    from traceguard.capture import harness

    raise typer.Exit(harness.main(["run", *ctx.args]))


@harness_app.command("sweep", context_settings=_PASS_THROUGH, cls=with_parser_help(_sweep_parser))
def harness_sweep(ctx: typer.Context, profile: ProfileOpt = DEFAULT_PROFILE) -> None:
    """Run a matrix of settings (the options below), then write the results table (results.md,
    results.json) judged under --profile."""
    from traceguard.capture import harness

    known, _ = harness.sweep_parser().parse_known_args(ctx.args)  # exits 2 with argparse's message
    code = harness.main(["sweep", *ctx.args])
    harness_table(known.out, profile)
    raise typer.Exit(code)


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
        where = escape(str(sweep_dir / "sweep.json"))
        err.print(f"[bold red]error[/]: {where} is missing or not JSON ({escape(str(exc))})")
        raise typer.Exit(2) from None
    rows = []
    for setting in sweep["settings"]:
        bundle = sweep_dir / setting["bundle"]
        manifest = orjson.loads((bundle / "manifest.json").read_bytes()) if (bundle / "manifest.json").exists() else {}
        report = None
        if setting.get("refused"):  # the harness refused the combination before any rank started
            manifest = {"exit_status": setting.get("exit_status"), "refused": setting["refused"]}
        else:
            try:
                report = analyze([str(bundle)], profile=profile).report
            except TraceguardError as exc:
                err.print(f"[yellow]{escape(setting['name'])}[/]: {escape(exc.message)}")
        rows.append(row(setting["name"], setting["options"], manifest, report))
    (sweep_dir / "results.json").write_bytes(
        orjson.dumps({"profile": profile, "matrix": sweep["matrix"], "rows": rows}, option=orjson.OPT_INDENT_2)
    )
    text = render_markdown(rows, profile)
    (sweep_dir / "results.md").write_text(text)
    out.print(text)
