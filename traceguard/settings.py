"""Where the store lives and the limits the service enforces, read once from the environment.

``serve``, ``token create`` and the app factory all resolve the database the same way:
``--data-dir`` / ``TRACEGUARD_DATA_DIR`` names the directory (blobs, job scratch, and the embedded
SQLite file), and ``TRACEGUARD_DATABASE_URL`` (e.g. ``postgresql://user@host/db``) replaces the
embedded database. ``traceguard worker`` reads the same settings, so API and worker processes
given the same environment share one queue and one blob store.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

GiB = 1 << 30
MiB = 1 << 20


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "traceguard"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TRACEGUARD_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    #: "development" allows plain-HTTP cookies without the Secure flag; anything else refuses
    #: to send session cookies over plain HTTP unless ``cookie_secure`` is set explicitly.
    environment: str = "development"
    cookie_secure: bool | None = None
    session_hours: float = 12.0

    # Untrusted uploads (DESIGN.md "Service").
    max_file_bytes: int = 8 * GiB
    max_request_bytes: int = 16 * GiB
    max_archive_members: int = 4096
    max_archive_bytes: int = 32 * GiB
    max_side_file_bytes: int = 256 * MiB
    upload_chunk_bytes: int = 1 * MiB

    # Background analysis.
    workers: int = 2
    job_timeout_s: float = 1800.0
    job_lease_s: float = 60.0
    job_max_attempts: int = 3
    poll_interval_s: float = 0.5
    max_rows: int = 200_000_000
    #: Where a job's per-rank map runs (``analyze(scheduler=...)``): "local" (a process pool in the
    #: job's analysis process; runs under 64 MB of inputs map in that process unless
    #: ``analysis_jobs`` is set), "serial" (one input at a time: one core per job, the choice when
    #: several jobs share a machine), or "tcp://host:port" (a dask.distributed scheduler). None:
    #: the analysis's own default (``local``).
    dask_scheduler: str | None = None
    #: Processes of the "local" scheduler per job (None: all cores).
    analysis_jobs: int | None = None

    @model_validator(mode="after")
    def _normalise(self) -> Settings:
        self.data_dir = self.data_dir.expanduser().resolve()
        if self.workers < 1:
            raise ValueError("TRACEGUARD_WORKERS must be at least 1")
        if self.analysis_jobs is not None and self.analysis_jobs < 1:
            raise ValueError("TRACEGUARD_ANALYSIS_JOBS must be at least 1")
        self.dask_scheduler = self.dask_scheduler or None  # an empty variable means unset
        return self

    @property
    def url(self) -> str:
        """The database URL: the configured one (PostgreSQL via psycopg 3) or the embedded SQLite."""
        if self.database_url:
            url = self.database_url
            for prefix in ("postgresql://", "postgres://"):
                if url.startswith(prefix):
                    return "postgresql+psycopg://" + url[len(prefix) :]
            return url
        return f"sqlite:///{self.data_dir / 'traceguard.db'}"

    @property
    def embedded(self) -> bool:
        return self.url.startswith("sqlite")

    @property
    def secure_cookies(self) -> bool:
        if self.cookie_secure is not None:
            return self.cookie_secure
        return self.environment != "development"


@lru_cache
def get_settings() -> Settings:
    return Settings()
