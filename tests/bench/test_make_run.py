"""bench/make_run.py: an N-rank run from the real 4×H200 captures, checked with sqlite and traceguard."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = [REPO / "tests/fixtures/h200x4/p2p_nsys" / f"cap_{i}.sqlite.gz" for i in range(4)]


def _env(db: Path) -> dict[str, str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE'"
        ).fetchall()
    return dict(v.split("=", 1) for (v,) in rows if "=" in v)


def _first_kernel(db: Path) -> tuple[int, int]:
    """(start, end) of the earliest kernel."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute('SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1').fetchone()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run8"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench/make_run.py"),
            "--ranks",
            "8",
            "--kernels-per-rank",
            "6000",
            "--skew-us",
            "300",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out


def test_manifest_states_every_rank_its_node_and_source(run: Path) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    captures = manifest["captures"]
    assert [c["rank"] for c in captures] == list(range(8))
    assert [c["node"] for c in captures] == [0, 0, 0, 0, 1, 1, 1, 1]
    # Each node's four local ranks are the four distinct real ranks of the source job.
    assert [c["source"] for c in captures[:4]] == [str(p.relative_to(REPO)) for p in SOURCES]
    assert captures[5]["source"] == captures[1]["source"]
    assert len({c["source_sha256"] for c in captures}) == 4
    # 5,308 kernels per source rank: 6,000 rounds up to 2 whole copies.
    assert {c["kernels"] for c in captures} == {2 * 5308}
    assert manifest["kernels_total"] == 8 * 2 * 5308
    assert all(abs(c["clock_offset_ns"]) <= 300_000 for c in captures)
    assert len({c["clock_offset_ns"] for c in captures}) == 2  # one clock per node
    assert (run / "README.md").read_text().count("h200x4/p2p_nsys/cap_") == 4


def test_rank_files_carry_the_new_rank_and_the_node_clock(run: Path, tmp_path: Path) -> None:
    manifest = json.loads((run / "manifest.json").read_text())
    entry = manifest["captures"][6]
    db = run / entry["path"]
    env = _env(db)
    assert env["RANK"] == '"6"' and env["LOCAL_RANK"] == '"2"' and env["GROUP_RANK"] == '"1"'
    assert env["WORLD_SIZE"] == '"8"' and env["LOCAL_WORLD_SIZE"] == '"4"'
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        host = conn.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'").fetchone()[0]
        kernels = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert host == "node01" and kernels == 2 * 5308
    source = tmp_path / "source.sqlite"
    source.write_bytes(gzip.decompress(SOURCES[2].read_bytes()))
    start, end = _first_kernel(source)
    assert _first_kernel(db) == (start + entry["clock_offset_ns"], end + entry["clock_offset_ns"])


def test_traceguard_reads_the_run_as_eight_ranks(run: Path, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    subprocess.run(
        [str(Path(sys.executable).parent / "traceguard"), "analyze", str(run), "--format", "json", "-o", str(report)],
        check=True,
        capture_output=True,
    )
    doc = json.loads(report.read_text())
    assert [(i["rank"], i["rank_source"], i["error"]) for i in doc["inputs"]] == [
        (r, "manifest", None) for r in range(8)
    ]
    assert doc["run"]["metrics"]["ranks"] == 8
    # A rank file alone states its own rank (the RANK nsys recorded): no manifest needed.
    single = tmp_path / "single.json"
    subprocess.run(
        [
            str(Path(sys.executable).parent / "traceguard"),
            "analyze",
            str(run / "rank005.sqlite"),
            "--format",
            "json",
            "-o",
            str(single),
        ],
        check=True,
        capture_output=True,
    )
    assert [(i["rank"], i["rank_source"]) for i in json.loads(single.read_text())["inputs"]] == [(5, "file")]
