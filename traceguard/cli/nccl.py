"""nccl: NCCL's own account of how it connected the GPUs, from NCCL_DEBUG=INFO logs alone."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.markup import escape

from traceguard.cli.common import TopoOpt, app, err, write
from traceguard.errors import InputError, TraceguardError


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
    from traceguard.metrics.transport import nccl_document
    from traceguard.report.nccl import render_markdown

    try:
        side = load_side(SideFiles(nccl_log=list(logs), topo=list(topo or [])))
        if side.nccl is None:
            raise InputError("; ".join(side.errors) or "no NCCL log could be read")
    except TraceguardError as exc:
        err.print(f"[bold red]error[/]: {escape(exc.message)}")
        raise typer.Exit(exc.exit_code) from None
    if side.nccl.nccl_lines == 0:  # a log without connection lines is a partial log, not an error
        err.print("[bold red]error[/]: no NCCL log lines found; run the job with NCCL_DEBUG=INFO")
        raise typer.Exit(2)
    doc = nccl_document(side.nccl, nvlink_pairs=side.nvlink_pairs)
    if fmt is NcclFormat.json:
        write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n", out_path)
    else:
        write(render_markdown(doc), out_path)
