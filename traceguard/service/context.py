"""The opened store: settings, engine, session factory and blob store, made once per process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from traceguard.settings import Settings
from traceguard.store import BlobStore, make_engine, migrate, sessions
from traceguard.store.access import bootstrap
from traceguard.store.db import transaction


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
            migrate(engine)
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
