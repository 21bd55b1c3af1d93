"""The store: SQLAlchemy 2 tables (SQLite embedded by default, PostgreSQL in production), Alembic
migrations, a content-addressed blob store, and the queries the service and the CLI share.

It knows the report document (the stage before it), never the analysis internals.
"""

from traceguard.store.blobs import BlobStore
from traceguard.store.db import make_engine, migrate, sessions, transaction

__all__ = ["BlobStore", "make_engine", "migrate", "sessions", "transaction"]
