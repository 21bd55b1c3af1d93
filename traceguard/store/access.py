"""Projects, API tokens and web sessions. Secrets are shown once and kept only as SHA-256.

Tokens are 256-bit random strings, so a plain SHA-256 is enough at rest (no password stretching
needed); lookups are by the hash, compared in the database index.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from traceguard.errors import InputError
from traceguard.store.tables import Project, Token, WebSession, utcnow

SCOPES = ("read", "upload", "admin")
TOKEN_PREFIX = "tg_"
DEFAULT_PROJECT = "default"
_LAST_USED_EVERY = timedelta(minutes=1)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def parse_scopes(text: str | list[str]) -> list[str]:
    items = text.split(",") if isinstance(text, str) else text
    scopes = {s.strip() for s in items if s.strip()}
    unknown = sorted(s for s in scopes if s not in SCOPES)
    if unknown or not scopes:
        raise InputError(
            f"unknown scope(s) {', '.join(unknown) or '(none given)'}",
            hint=f"scopes are a comma-separated subset of {', '.join(SCOPES)}",
        )
    return [s for s in SCOPES if s in scopes]


def has_scope(token: Token, scope: str) -> bool:
    granted = token.scopes.split(",")
    return scope in granted or "admin" in granted


def get_project(session: Session, name: str) -> Project | None:
    return session.scalar(select(Project).where(Project.name == name))


def get_or_create_project(session: Session, name: str) -> Project:
    if not name or len(name) > 200:
        raise InputError("a project name is 1 to 200 characters")
    project = get_project(session, name)
    if project is None:
        project = Project(name=name)
        session.add(project)
        session.flush()
    return project


def create_token(session: Session, project: Project, scopes: list[str], name: str = "") -> tuple[Token, str]:
    """A new token for ``project``; returns the row and the secret (shown once, never stored)."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = Token(
        project_id=project.id,
        name=name,
        prefix=secret[:10],
        token_hash=hash_secret(secret),
        scopes=",".join(parse_scopes(scopes)),
    )
    session.add(token)
    session.flush()
    return token, secret


def authenticate(session: Session, secret: str) -> Token | None:
    """The live token ``secret`` names, or None."""
    if not secret or len(secret) > 200:
        return None
    token = session.scalar(select(Token).where(Token.token_hash == hash_secret(secret), Token.revoked_at.is_(None)))
    if token is not None:
        now = utcnow()
        if token.last_used_at is None or now - token.last_used_at > _LAST_USED_EVERY:
            token.last_used_at = now
    return token


def revoke_token(session: Session, project_id: int, token_id: int) -> bool:
    token = session.get(Token, token_id)
    if token is None or token.project_id != project_id or token.revoked_at is not None:
        return False
    token.revoked_at = utcnow()
    session.query(WebSession).filter(WebSession.token_id == token.id).delete()
    return True


def list_tokens(session: Session, project_id: int) -> list[Token]:
    return list(session.scalars(select(Token).where(Token.project_id == project_id).order_by(Token.id)))


def create_web_session(session: Session, token: Token, hours: float) -> str:
    secret = secrets.token_urlsafe(32)
    session.add(
        WebSession(token_id=token.id, session_hash=hash_secret(secret), expires_at=utcnow() + timedelta(hours=hours))
    )
    session.execute(delete(WebSession).where(WebSession.expires_at < utcnow()))
    return secret


def session_token(session: Session, secret: str) -> Token | None:
    if not secret or len(secret) > 200:
        return None
    row = session.scalar(
        select(WebSession).where(WebSession.session_hash == hash_secret(secret), WebSession.expires_at > utcnow())
    )
    if row is None or row.token.revoked_at is not None:
        return None
    return row.token


def end_web_session(session: Session, secret: str) -> None:
    session.execute(delete(WebSession).where(WebSession.session_hash == hash_secret(secret)))


def bootstrap(session: Session) -> str | None:
    """On an empty store: project ``default`` and an admin token, whose secret is returned (once).
    Returns None when the store already has a project."""
    if session.scalar(select(func.count()).select_from(Project)):
        return None
    project = get_or_create_project(session, DEFAULT_PROJECT)
    _, secret = create_token(session, project, ["admin"], name="bootstrap admin")
    return secret
