"""serve, worker and token: the service (API, web pages, background analysis), its analysis
workers as processes of their own, and its API tokens.

Imports stay lazy so that the analysis commands start without SQLAlchemy or FastAPI.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from traceguard.cli.common import DataDirOpt, app, err, fail, settings_for, where
from traceguard.errors import TraceguardError


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    data_dir: DataDirOpt = None,
    workers: Annotated[int | None, typer.Option(help="Analysis worker threads (default 2).")] = None,
    no_workers: Annotated[
        bool,
        typer.Option(
            "--no-workers",
            help="API and web pages only: uploads queue their analysis jobs for `traceguard worker` processes.",
        ),
    ] = False,
) -> None:
    """Run the service (API, web pages, background analysis). On an empty store it creates project
    `default` and prints an admin token, once."""
    import uvicorn

    from api.app import create_app
    from traceguard.service.context import Context

    settings = settings_for(data_dir)
    if workers:
        settings.workers = workers
    try:
        ctx = Context.open(settings)
        secret = ctx.bootstrap()
        ctx.close()
    except TraceguardError as exc:
        raise fail(exc) from None
    if secret:
        err.print(f"created project [bold]default[/]; its admin token (shown only now):\n{secret}")
    err.print(
        f"traceguard serving on http://{host}:{port} · store {where(settings)} · blobs {settings.data_dir / 'blobs'}"
        + (" · no workers: `traceguard worker` runs the analyses" if no_workers else "")
    )
    uvicorn.run(create_app(settings, workers=not no_workers), host=host, port=port, log_level="info", access_log=False)


@app.command("worker")
def worker_command(
    data_dir: DataDirOpt = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Analyses run at once (threads, each with its child).")
    ] = 1,
) -> None:
    """Run analysis jobs queued by `traceguard serve --no-workers`: the same store (TRACEGUARD_DATABASE_URL,
    or the embedded database of --data-dir) and blob directory. Any number may run, on any machines
    sharing them. SIGTERM or SIGINT stops it cleanly: running jobs go back to the queue."""
    import logging

    from traceguard.service import worker
    from traceguard.service.context import Context

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("alembic").setLevel(logging.WARNING)  # "Context impl ..." on every start says nothing
    settings = settings_for(data_dir)
    try:
        ctx = Context.open(settings)
    except TraceguardError as exc:
        raise fail(exc) from None
    try:
        code = worker.main(ctx, concurrency)
    finally:
        ctx.close()
    raise typer.Exit(code)


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
        ctx = Context.open(settings_for(data_dir))
        with transaction(ctx.factory) as session:
            _, secret = create_token(session, get_or_create_project(session, project), scopes, name=name)
        ctx.close()
    except TraceguardError as exc:
        raise fail(exc) from None
    sys.stdout.write(secret + "\n")
