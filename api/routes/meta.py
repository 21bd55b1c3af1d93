"""Profiles, tokens, health and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from api.deps import Admin, ContextDep, PoolDep, Reader, SessionDep
from api.errors import not_found
from api.schemas import ProfilePublic, TokenCreate, TokenCreated, TokenPublic
from api.views import token_public
from traceguard.checks.profiles import available, load_profile
from traceguard.store.access import create_token, list_tokens, revoke_token
from traceguard.store.db import ping, schema_is_current
from traceguard.store.tables import Project

router = APIRouter(tags=["service"])


@router.get("/v1/profiles", tags=["profiles"])
def get_profiles(_who: Reader) -> list[ProfilePublic]:
    """The checklist profiles this service can report under, with their resolved rules."""
    out = []
    for name in sorted(available()):
        profile = load_profile(name)
        out.append(
            ProfilePublic(
                name=profile.name,
                description=profile.description or None,
                chain=profile.chain,
                rules={
                    rule_id: {
                        "enabled": r.enabled,
                        "op": r.op,
                        "warn": r.warn,
                        "fail": r.fail,
                        **r.params,
                        **r.minimum,
                    }
                    for rule_id, r in sorted(profile.rules.items())
                },
            )
        )
    return out


@router.get("/v1/tokens", tags=["tokens"])
def get_tokens(who: Admin, session: SessionDep) -> list[TokenPublic]:
    """The project's tokens (never their secrets)."""
    return [token_public(t) for t in list_tokens(session, who.project_id)]


@router.post("/v1/tokens", status_code=201, tags=["tokens"])
def post_token(body: TokenCreate, who: Admin, session: SessionDep) -> TokenCreated:
    """A new token for this project; its secret is in this response only."""
    project = session.get(Project, who.project_id)
    assert project is not None
    token, secret = create_token(session, project, body.scopes, name=body.name)
    session.commit()
    return TokenCreated(**token_public(token).model_dump(), token=secret)


@router.delete("/v1/tokens/{token_id}", status_code=204, tags=["tokens"])
def delete_token(token_id: int, who: Admin, session: SessionDep) -> Response:
    if not revoke_token(session, who.project_id, token_id):
        raise not_found(f"token {token_id}")
    session.commit()
    return Response(status_code=204)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: ContextDep, pool: PoolDep) -> JSONResponse:
    """Readiness: the database answers at the newest schema, blobs are writable, workers run."""
    checks: dict[str, str] = {}
    try:
        ping(ctx.engine)
        checks["database"] = "ok" if schema_is_current(ctx.engine) else "schema is not at the newest migration"
    except Exception as exc:  # any driver error means not ready
        checks["database"] = f"unreachable: {type(exc).__name__}"
    checks["blobs"] = "ok" if ctx.blobs.writable() else "not writable"
    checks["workers"] = "ok" if pool is None or pool.alive else "stopped"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks}, status_code=200 if ready else 503
    )


@router.get("/metrics", include_in_schema=False)
def prometheus(request: Request) -> Response:
    return request.app.state.metrics.render()
