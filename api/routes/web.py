"""Web pages: a login form that exchanges a token for an HttpOnly session cookie, the runs list,
and each run's report with its charts."""

from __future__ import annotations

import html
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import plotly
import plotly.graph_objects as go
from fastapi import APIRouter, Form, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session

from api.deps import SESSION_COOKIE, ContextDep, Principal, SessionDep, principal
from api.errors import ApiError
from traceguard.checks.profiles import available
from traceguard.errors import TraceguardError
from traceguard.report import html as html_report
from traceguard.report.compare import change_text, compare
from traceguard.report.units import value_h
from traceguard.service.analysis import report_for
from traceguard.store import access, results
from traceguard.store.runs import RUN_STATUSES, get_run, list_runs, parse_label_filter, run_files, run_jobs
from traceguard.store.tables import InspectorWindow, Project

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).resolve().parent.parent / "templates"))
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _who(request: Request, session: Session) -> Principal | None:
    try:
        who = principal(request, session)
    except ApiError:
        return None
    return who if "read" in who.scopes else None


def _to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target)}", status_code=303)


def _safe_next(target: str) -> str:
    """Only paths on this site (no scheme, no //host) may follow a login."""
    return target if target.startswith("/") and not target.startswith("//") and "\\" not in target else "/runs"


@router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse("/runs", status_code=303)


@router.get("/favicon.ico")
def favicon() -> Response:
    return Response(status_code=204, headers={"Cache-Control": "public, max-age=86400"})


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"})


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/runs") -> HTMLResponse:
    return templates.TemplateResponse(request, "login.html", {"error": None, "next": _safe_next(next)})


@router.post("/login")
def login(
    request: Request,
    ctx: ContextDep,
    session: SessionDep,
    token: Annotated[str, Form()],
    next: Annotated[str, Form()] = "/runs",
) -> Response:
    found = access.authenticate(session, token.strip())
    if found is None or not access.has_scope(found, "read"):
        return templates.TemplateResponse(
            request,
            "login.html",
            {"error": "That token is not valid here, or lacks the read scope.", "next": _safe_next(next)},
            status_code=401,
        )
    secret = access.create_web_session(session, found, ctx.settings.session_hours)
    session.commit()
    response = RedirectResponse(_safe_next(next), status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=int(ctx.settings.session_hours * 3600),
        httponly=True,
        secure=ctx.settings.secure_cookies or request.url.scheme == "https",
        samesite="strict",
        path="/",
    )
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep) -> RedirectResponse:
    if cookie := request.cookies.get(SESSION_COOKIE):
        access.end_web_session(session, cookie)
        session.commit()
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def _project_name(session: Session, who: Principal) -> str:
    project = session.get(Project, who.project_id)
    return project.name if project else "?"


@router.get("/runs", response_class=HTMLResponse)
def runs_page(
    request: Request,
    session: SessionDep,
    label: str | None = None,
    status: str | None = None,
    cursor: str | None = None,
) -> Response:
    who = _who(request, session)
    if who is None:
        return _to_login(request)
    try:
        page = list_runs(
            session,
            who.project_id,
            labels=[parse_label_filter(label)] if label else [],
            status=status or None,
            cursor=cursor,
        )
    except TraceguardError as exc:
        return HTMLResponse(f"<p>{exc}</p><a href='/runs'>back</a>", status_code=422)
    return templates.TemplateResponse(
        request,
        "runs.html",
        {
            "runs": page.runs,
            "next_cursor": page.next_cursor,
            "label": label,
            "status": status,
            "statuses": RUN_STATUSES,
            "project": _project_name(session, who),
        },
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(
    request: Request,
    run_id: int,
    session: SessionDep,
    ctx: ContextDep,
    profile: str | None = None,
    collective: str | None = None,
) -> Response:
    who = _who(request, session)
    if who is None:
        return _to_login(request)
    run = get_run(session, who.project_id, run_id)
    if run is None:
        return HTMLResponse("<h1>Not found</h1><p>No such run in this project. <a href='/runs'>Runs</a></p>", 404)
    chosen = profile if profile in available() else run.profile
    context = {
        "run": run,
        "files": run_files(session, run.id),
        "profile": chosen,
        "profiles": sorted(available()),
        "project": _project_name(session, who),
    }
    doc = None
    stored = results.latest_report(session, run)
    if chosen == run.profile:
        doc = stored.document if stored else None
    elif stored is not None:
        try:
            doc = report_for(ctx, run, chosen)
        except TraceguardError as exc:
            return HTMLResponse(f"<p>{exc}</p>", status_code=422)
    if doc is None:
        jobs = run_jobs(session, run.id)
        return templates.TemplateResponse(request, "run_pending.html", {**context, "job": jobs[-1] if jobs else None})
    # The collective types this run ran, for the header's filter links; an unknown one shows all.
    present = list(dict.fromkeys(row["collective"] for row in doc["run"].get("collectives_by_type") or []))
    chosen_collective = next((c for c in present if collective and c.lower() == collective.strip().lower()), None)
    header = templates.get_template("run_header.html").render(
        **context, collectives=present, collective=chosen_collective
    )
    header += inspector_trend(results.inspector_windows(session, run.id))
    return HTMLResponse(
        html_report.render(doc, plotly_src="/static/plotly.min.js", header_html=header, collective=chosen_collective)
    )


def inspector_trend(windows: list[InspectorWindow]) -> str:
    """The run's stored NCCL Inspector windows as a trend (merged across uploads, so a long job's
    logs sent as they grow extend it): the wait share per window and the late rank per window, as a
    chart (one point per window) and a table. Empty when the run has no windows."""
    if not windows:
        return ""
    starts = [datetime.fromtimestamp(w.window_start_s, UTC).strftime("%Y-%m-%d %H:%M:%S") for w in windows]
    share = [None if w.nccl_wait_share is None else 100 * w.nccl_wait_share for w in windows]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=starts,
            y=share,
            name="wait share (%)",
            mode="lines+markers",
            customdata=[[w.instances, w.wait_ns / 1e6, w.transfer_ns / 1e6] for w in windows],
            hovertemplate="%{x} UTC: waiting %{y:.1f} % of the NCCL time<br>%{customdata[0]} instances, "
            "wait %{customdata[1]:.1f} ms, transfer %{customdata[2]:.1f} ms<extra></extra>",
        )
    )
    late = [(start, w) for start, w in zip(starts, windows, strict=True) if w.late_rank is not None]
    fig.add_trace(
        go.Scatter(
            x=[start for start, _ in late],
            y=[w.late_rank for _, w in late],
            name="late rank",
            mode="markers+text",
            text=[f"rank {w.late_rank}" for _, w in late],
            textposition="top center",
            marker={"symbol": "diamond", "size": 11},
            yaxis="y2",
            hovertemplate="%{x} UTC: rank %{y} arrived last most often<extra></extra>",
        )
    )
    ranks = [w.late_rank for _, w in late] or [0]
    fig.update_layout(
        title=f"NCCL Inspector: wait share and late rank per {windows[0].window_s}-s window (UTC)",
        height=340,
        margin={"t": 60},
        yaxis={"title": "wait share (%)", "range": [0, 105]},
        yaxis2={
            "title": "late rank",
            "overlaying": "y",
            "side": "right",
            "dtick": 1,
            "range": [min(ranks) - 0.5, max(ranks) + 0.5],
            "showgrid": False,
        },
        legend={"orientation": "h", "y": -0.2},
    )
    rows = "".join(
        f"<tr data-window='{w.window_start_s}'><td>{html.escape(start)}</td><td>{w.instances}</td>"
        f"<td>{'' if w.lines is None else w.lines}</td>"
        f"<td>{'' if pct is None else f'{pct:.1f} %'}</td>"
        f"<td class='late-rank'>{'' if w.late_rank is None else w.late_rank}</td></tr>"
        for w, start, pct in zip(windows, starts, share, strict=True)
    )
    return (
        "<section id='inspector-trend-section'><h2>NCCL Inspector trend</h2>"
        "<p class='muted'>Stored time windows, merged across uploads of the job's logs "
        f"(<a href='/v1/runs/{windows[0].run_id}/inspector'>JSON</a>): the share of the NCCL time spent "
        "waiting for the last rank, and the rank that arrived last most often.</p>"
        + fig.to_html(full_html=False, include_plotlyjs=False, div_id="inspector-trend")
        + "<table id='inspector-trend-table'><tr><th>window (UTC)</th><th>instances</th><th>lines</th>"
        f"<th>wait share</th><th>late rank</th></tr>{rows}</table></section>"
    )


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, session: SessionDep, ctx: ContextDep, base: int, head: int, profile: str | None = None
) -> Response:
    """Two runs side by side under one profile (the head run's unless given)."""
    who = _who(request, session)
    if who is None:
        return _to_login(request)
    runs = [get_run(session, who.project_id, run_id) for run_id in (base, head)]
    if runs[0] is None or runs[1] is None:
        return HTMLResponse("<h1>Not found</h1><p>No such run in this project. <a href='/runs'>Runs</a></p>", 404)
    chosen = profile if profile in available() else runs[1].profile
    try:
        docs = [report_for(ctx, run, chosen) for run in runs]
    except TraceguardError as exc:
        return HTMLResponse(f"<p>{html.escape(str(exc))}</p><a href='/runs'>Runs</a>", status_code=422)
    comparison = compare(docs[0], docs[1])
    for m in comparison["metrics"]:
        m["base_text"], m["head_text"] = value_h(m["metric"], m["base"]), value_h(m["metric"], m["head"])
        m["change_text"] = change_text(m["metric"], m["delta"], m["relative"])  # shares in points
    return templates.TemplateResponse(
        request,
        "compare.html",
        {
            "base": runs[0],
            "head": runs[1],
            "profile": chosen,
            "comparison": comparison,
            "project": _project_name(session, who),
        },
    )
