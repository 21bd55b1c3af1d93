"""harness and bench-collectives: run the instrumented DDP job, sweeps of its settings, and a collective sweep."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer

from traceguard.checks.profiles import DEFAULT_PROFILE
from traceguard.cli.common import ProfileOpt, app, err, out
from traceguard.errors import TraceguardError
from traceguard.pipeline import analyze


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
