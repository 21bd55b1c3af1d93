"""The fuzz suite's budget and scratch space.

CI runs a small, fixed budget (deterministic seeds, the whole folder in about a minute on two
cores); the long run is the same tests with a larger budget::

    TRACEGUARD_FUZZ_EXAMPLES=10000 .venv/bin/python -m pytest -q tests/fuzz -k "mutation or properties"

or, with counts per reader and crashing inputs kept for triage, ``python -m tests.fuzz.run``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# The service fixtures (a fresh store on SQLite and on PostgreSQL) for the API tests here.
from tests.service.conftest import api, database_url, settings  # noqa: F401


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """gunzipped and exported copies of damaged inputs go to a scratch cache, not the user's."""
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "fuzz-cache"))
    yield


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path / "work"
