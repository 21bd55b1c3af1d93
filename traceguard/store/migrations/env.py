"""Alembic environment: migrations run against the engine the store hands over (or the URL of
``alembic.ini`` / ``TRACEGUARD_DATABASE_URL`` when run by hand)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine, create_engine

from traceguard.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _engine() -> Engine:
    given = config.attributes.get("engine")
    if given is not None:
        return given
    from traceguard.settings import get_settings

    return create_engine(config.get_main_option("sqlalchemy.url") or get_settings().url)


def run_migrations_online() -> None:
    engine = _engine()
    with engine.begin() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
