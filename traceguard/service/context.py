"""The opened store: settings, engine, session factory and blob store, made once per process."""

from __future__ import annotations

import fcntl
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from traceguard.settings import Settings
from traceguard.store import BlobStore, make_engine, migrate, sessions
from traceguard.store.access import bootstrap
from traceguard.store.db import transaction

#: Key of the PostgreSQL advisory lock held while the schema is migrated (any fixed int64).
MIGRATION_LOCK = 0x7472_6163_6567_7264  # "tracegrd"


def _migrate_alone(engine: Engine, data_dir: Path) -> None:
    """Migrate with no other process migrating at the same time.

    An API process and its workers often start together on a new database; two Alembic upgrades
    at once would both create the tables and one would fail. On PostgreSQL an advisory lock
    (processes on any machine), on SQLite a lock file beside the database serialises them; the
    second finds the schema current and does nothing."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as holder:
            holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
            try:
                migrate(engine)
            finally:
                holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
                holder.commit()
        return
    with (data_dir / ".migrate.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            migrate(engine)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass
class Context:
    settings: Settings
    engine: Engine
    factory: sessionmaker[Session]
    blobs: BlobStore

    @classmethod
    def open(cls, settings: Settings, *, migrate_schema: bool = True) -> Context:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(settings.url)
        if migrate_schema:
            _migrate_alone(engine, settings.data_dir)
        return cls(settings, engine, sessions(engine), BlobStore(settings.data_dir / "blobs"))

    @property
    def jobs_dir(self) -> Path:
        path = self.settings.data_dir / "jobs"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def cache_dir(self) -> Path:
        return self.settings.data_dir / "cache"

    def bootstrap(self) -> str | None:
        """Project ``default`` and an admin token on an empty store; the token's secret, once."""
        with transaction(self.factory) as session:
            return bootstrap(session)

    def close(self) -> None:
        self.engine.dispose()
