"""Shared test fixtures: real public captures from ../shared, unpacked per session."""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
PUBLIC = SHARED / "fixtures" / "public"
PUBLIC_NSYS = sorted((PUBLIC / "nsys-sqlite").glob("*.sqlite.gz"))
PUBLIC_KINETO = sorted((PUBLIC / "kineto").glob("*.json.gz"))
#: Captures this project made itself (GPU runs on the lent H200s), committed gzipped.
OWN = REPO / "tests" / "fixtures"


def needs_native(built: bool, module: str) -> None:
    """Skip a test of a C loop where ``module`` was not built (no compiler at install); fail it
    instead under ``TRACEGUARD_REQUIRE_NATIVE=1`` (``.ci/run``), so CI runs every such test."""
    if built:
        return
    if os.environ.get("TRACEGUARD_REQUIRE_NATIVE") == "1":
        pytest.fail(f"{module} was not built (TRACEGUARD_REQUIRE_NATIVE=1)", pytrace=False)
    pytest.skip(f"{module} was not built (no compiler at install)")


def public_nsys(fragment: str) -> Path:
    """The one public nsys fixture whose file name contains ``fragment``."""
    matches = [p for p in PUBLIC_NSYS if fragment in p.name]
    assert len(matches) == 1, f"{fragment!r} matches {matches}"
    return matches[0]


def diagnostics_besides_relaunches(manifest: dict, bundle: Path) -> list[str]:
    """A real-nsys bundle's diagnostics, less the notes of a start nsys itself failed and the
    harness retried (Debian's nsys 2022.4 on CI, now and then): those are checked here instead —
    the first launcher log was kept, and the note names it."""
    notes = []
    for relaunch in manifest.get("relaunches", []):
        assert (bundle / relaunch["launcher_log"]).is_file(), relaunch
        notes += [d for d in manifest["diagnostics"] if d.startswith(relaunch["why"])]
    return [d for d in manifest["diagnostics"] if d not in notes]


def public_kineto(fragment: str) -> Path:
    matches = [p for p in PUBLIC_KINETO if fragment in p.name]
    assert len(matches) == 1, f"{fragment!r} matches {matches}"
    return matches[0]


@pytest.fixture(scope="session")
def unpacked(tmp_path_factory: pytest.TempPathFactory):
    """Gunzip a committed/shared ``.gz`` capture once per session; fixtures are never modified."""
    cache: dict[Path, Path] = {}
    root = tmp_path_factory.mktemp("unpacked")

    def _unpack(path: Path) -> Path:
        if path not in cache:
            # Same file names live in different run folders (cap_0.sqlite.gz): keep them apart.
            folder = root / f"{len(cache)}-{path.parent.name}"
            folder.mkdir()
            target = folder / path.name.removesuffix(".gz")
            with gzip.open(path, "rb") as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            cache[path] = target
        return cache[path]

    return _unpack


#: Ranks of :func:`many_ranks`: above the 32 capture files a report is a summary by default.
MANY_RANKS = 40


@pytest.fixture(scope="session")
def many_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 40-rank run made by ``bench/make_run.py`` from the real 4×H200 captures (one copy each:
    5,308 kernels per rank, 10 nodes with their own clock offsets): a run reported by summary."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("many") / "run40"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/make_run.py"),
            "--ranks",
            str(MANY_RANKS),
            "--kernels-per-rank",
            "5308",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out
