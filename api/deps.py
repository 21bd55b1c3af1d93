"""Request dependencies as ``Annotated`` aliases, so routes read like plain functions."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api.errors import ApiError
from traceguard.service.context import Context
from traceguard.service.worker import WorkerPool
from traceguard.store.access import authenticate, has_scope, session_token
from traceguard.store.tables import Token

SESSION_COOKIE = "tg_session"


def get_context(request: Request) -> Context:
    return request.app.state.ctx


def get_pool(request: Request) -> WorkerPool | None:
    return request.app.state.pool


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.ctx.factory() as session:
        yield session


ContextDep = Annotated[Context, Depends(get_context)]
PoolDep = Annotated[WorkerPool | None, Depends(get_pool)]
SessionDep = Annotated[Session, Depends(get_session)]


@dataclass(frozen=True)
class Principal:
    """Who is asking: a token of one project, with its scopes."""

    project_id: int
    token_id: int
    scopes: tuple[str, ...]
    via_cookie: bool = False


def _token_from(request: Request, session: Session) -> tuple[Token | None, bool]:
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, secret = header.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise ApiError(
                401,
                "unauthorized",
                "the Authorization header must be 'Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return authenticate(session, secret.strip()), False
    cookie = request.cookies.get(SESSION_COOKIE)
    if cookie:
        return session_token(session, cookie), True
    return None, False


def principal(request: Request, session: Session) -> Principal:
    token, via_cookie = _token_from(request, session)
    if token is None:
        raise ApiError(
            401,
            "unauthorized",
            "a valid API token is required (Authorization: Bearer <token>)",
            hint="create one with `traceguard token create --project P --scope read,upload`",
            headers={"WWW-Authenticate": "Bearer"},
        )
    scopes = tuple(s for s in ("read", "upload", "admin") if has_scope(token, s))
    session.commit()  # last_used_at
    return Principal(token.project_id, token.id, scopes, via_cookie)


def require(scope: str):
    def dependency(request: Request, session: SessionDep) -> Principal:
        who = principal(request, session)
        if scope not in who.scopes:
            raise ApiError(403, "forbidden", f"this token lacks the '{scope}' scope")
        return who

    return dependency


Reader = Annotated[Principal, Depends(require("read"))]
Uploader = Annotated[Principal, Depends(require("upload"))]
Admin = Annotated[Principal, Depends(require("admin"))]
