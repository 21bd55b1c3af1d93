"""`traceguard record` and `traceguard token create` on the embedded store (no server)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.service.conftest import SHM
from tests.service.live import REPO
from traceguard.pipeline import analyze


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEGUARD_DATA")} | {"COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "traceguard.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_record_keeps_the_run_queryable(tmp_path: Path) -> None:
    data = tmp_path / "store"
    done = _cli("record", str(SHM), "--data-dir", str(data), "--label", "cluster=B", "--profile", "h200-nvlink")
    assert done.returncode == 1, done.stdout + done.stderr  # nccl_step_share and transport_p2p fail
    assert "verdict FAIL" in done.stdout and f"recorded in {data / 'traceguard.db'}" in done.stderr
    assert "skipped stdout.txt" in done.stderr
    expected = analyze([str(p) for p in sorted(SHM.glob("cap_*.sqlite.gz"))], profile="h200-nvlink").report
    with sqlite3.connect(f"file:{data / 'traceguard.db'}?mode=ro", uri=True) as db:
        assert db.execute("SELECT status, verdict, profile FROM runs").fetchall() == [
            ("analysed", "fail", "h200-nvlink")
        ]
        assert db.execute("SELECT key, value FROM run_labels").fetchall() == [("cluster", "B")]
        steps = db.execute("SELECT rank, step_index, name, nccl_ns FROM steps ORDER BY rank, step_index").fetchall()
        assert steps == [
            (r["rank"], i, s["name"], s["nccl_ns"]) for r in expected["ranks"] for i, s in enumerate(r["steps"])
        ]
        statuses = dict(db.execute("SELECT rule_id, status FROM check_results").fetchall())
        assert statuses["transport_p2p"] == "fail" and statuses["nccl_step_share"] == "fail"
        transports = db.execute("SELECT DISTINCT transport FROM connections").fetchall()
        assert transports == [("SHM",)]


def test_token_create_validates_scopes(tmp_path: Path) -> None:
    bad = _cli("token", "create", "--project", "p", "--scope", "read,root", "--data-dir", str(tmp_path))
    assert bad.returncode == 2 and "unknown scope(s) root" in bad.stderr
    good = _cli("token", "create", "--project", "p", "--scope", "upload,read", "--data-dir", str(tmp_path))
    assert good.returncode == 0 and good.stdout.startswith("tg_")
    with sqlite3.connect(tmp_path / "traceguard.db") as db:
        assert db.execute("SELECT scopes FROM tokens").fetchall() == [("read,upload",)]
