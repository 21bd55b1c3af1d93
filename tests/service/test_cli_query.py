"""`traceguard runs`, `steps` and `compare run:ID` on stored runs: the embedded store on both engines
(SQLite and the machine's PostgreSQL), and a live service (`--server`), checked against plain SQL."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from tests.service.conftest import P2P, SHM
from tests.service.live import LiveServer
from traceguard.cli import app
from traceguard.store.results import WAIT_STEP_COLUMNS

runner = CliRunner()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


def _cli(*args: str | Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"crashed: {result.exception!r}\n{result.output}"
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def store(tmp_path: Path, database_url: str | None) -> Iterator[tuple[Path, dict[str, str], sa.Engine]]:
    """A store with two recorded runs: P2P (branch=main) and SHM (branch=feature)."""
    data = tmp_path / "store"
    env = {"TRACEGUARD_DATABASE_URL": database_url or ""}
    for folder, branch in ((P2P, "main"), (SHM, "feature")):
        code, _, err = _cli("record", folder, "--data-dir", data, "--label", f"branch={branch}", env=env)
        assert code in (0, 1), err
    engine = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://") if database_url else
                              f"sqlite:///{data / 'traceguard.db'}")
    yield data, env, engine
    engine.dispose()


def _sql(engine: sa.Engine, query: str, **params: object) -> list[tuple]:
    with engine.connect() as db:
        return [tuple(row) for row in db.execute(sa.text(query), params)]


@pytest.mark.slow
def test_runs_steps_and_compare_on_the_embedded_store(store: tuple[Path, dict[str, str], sa.Engine]) -> None:
    data, env, engine = store
    ids = dict(
        _sql(engine, "SELECT l.value, r.id FROM runs r JOIN run_labels l ON l.run_id = r.id WHERE l.key = 'branch'")
    )

    code, stdout, _ = _cli("runs", "--data-dir", data, "--label", "branch=main", "-f", "json", env=env)
    assert code == 0
    listed = json.loads(stdout)
    assert [(r["id"], r["verdict"], r["labels"]) for r in listed] == [
        (ids["main"], *_sql(engine, "SELECT verdict FROM runs WHERE id = :i", i=ids["main"])[0], {"branch": "main"})
    ]
    code, stdout, _ = _cli("runs", "--data-dir", data, "--status", "analysed", "-f", "csv", env=env)
    rows = list(csv.DictReader(io.StringIO(stdout)))
    assert [int(r["id"]) for r in rows] == [i for (i,) in _sql(engine, "SELECT id FROM runs ORDER BY id DESC")]
    code, stdout, _ = _cli("runs", "--data-dir", data, "--since", "2999-01-01", "-f", "json", env=env)
    assert code == 0 and json.loads(stdout) == []
    code, stdout, _ = _cli("runs", "--data-dir", data, env=env)
    assert code == 0 and "branch=feature" in stdout

    head = ids["feature"]
    code, stdout, _ = _cli("steps", f"run:{head}", "--rank", "1", "--data-dir", data, "-f", "json", env=env)
    assert code == 0
    got = [(s["rank"], s["step_index"], s["name"], s["gpu_span_ns"], s["nccl_ns"]) for s in json.loads(stdout)]
    assert got == _sql(
        engine,
        "SELECT rank, step_index, name, gpu_span_ns, nccl_ns FROM steps WHERE run_id = :r AND rank = 1 "
        "ORDER BY step_index",
        r=head,
    )
    # Who waited for whom: every step column in JSON and CSV, as stored; the table's short headers.
    waits = ", ".join(WAIT_STEP_COLUMNS)
    stored = _sql(
        engine, f"SELECT rank, step_index, {waits} FROM steps WHERE run_id = :r ORDER BY rank, step_index", r=head
    )
    assert stored and all(row[-1] is not None for row in stored)  # lateness known on every step (two ranks)
    code, stdout, _ = _cli("steps", f"run:{head}", "--data-dir", data, "-f", "json", env=env)
    assert [(s["rank"], s["step_index"], *(s[c] for c in WAIT_STEP_COLUMNS)) for s in json.loads(stdout)] == stored
    code, stdout, _ = _cli("steps", f"run:{head}", "--data-dir", data, "-f", "csv", env=env)
    rows = list(csv.DictReader(io.StringIO(stdout)))
    assert [(int(r["rank"]), int(r["step_index"]), *(float(r[c]) for c in WAIT_STEP_COLUMNS)) for r in rows] == [
        (rank, index, *(float(v) for v in values)) for rank, index, *values in stored
    ]
    code, stdout, _ = _cli("steps", f"run:{head}", "--rank", "0", "--data-dir", data, env=env)
    assert code == 0
    header = " ".join(stdout.split())
    for label in ("wait", "transfer", "compute", "comm", "idle host", "lateness", "waiting for the last rank"):
        assert label in header, label
    idle_ms = [f"{row[2 + WAIT_STEP_COLUMNS.index('idle_host_ns')] / 1e6:.2f}" for row in stored if row[0] == 0]
    assert all(value in stdout for value in idle_ms)

    code, stdout, _ = _cli("steps", str(head), "--phase", "backward", "--data-dir", data, "-f", "csv", env=env)
    rows = list(csv.DictReader(io.StringIO(stdout)))
    assert [(int(r["rank"]), int(r["step_index"]), int(r["phase_nccl_ns"])) for r in rows] == _sql(
        engine,
        "SELECT rank, step_index, nccl_ns FROM phases WHERE run_id = :r AND phase = 'backward' "
        "ORDER BY rank, step_index",
        r=head,
    )
    code, stdout, _ = _cli("steps", str(head), "--collective", "allreduce", "--data-dir", data, "-f", "json", env=env)
    steps = json.loads(stdout)
    expected = _sql(
        engine,
        "SELECT rank, step_index, time_ns FROM collective_types WHERE run_id = :r AND collective = 'AllReduce' "
        "AND step_index IS NOT NULL ORDER BY rank, step_index",
        r=head,
    )
    assert [(s["rank"], s["step_index"], s["collectives"][0]["time_ns"]) for s in steps] == expected
    code, _, stderr = _cli("steps", str(head), "--collective", "allmix", "--data-dir", data, env=env)
    assert code == 2 and "unknown collective" in stderr
    code, _, stderr = _cli("steps", "run:99999", "--data-dir", data, env=env)
    assert code == 2 and "no such run" in stderr

    # The gate between two stored runs: SHM regresses checks P2P passed (exit 1); the other way, none.
    base = ids["main"]
    code, stdout, stderr = _cli("compare", f"run:{base}", f"run:{head}", "--data-dir", data, "-f", "json", env=env)
    assert code == 1, stderr
    comparison = json.loads(stdout)
    statuses = dict(_sql(engine, "SELECT rule_id, status FROM check_results WHERE run_id = :r", r=head))
    assert comparison["regressions"] and all(statuses[c] in ("warn", "fail") for c in comparison["regressions"])
    # SHM → P2P: no link check regresses. The faster link leaves rank 1's lateness as most of the
    # NCCL time, so only the cross-rank checks may get worse (docs/collectives.md).
    code, stdout, _ = _cli("compare", f"run:{head}", f"run:{ids['main']}", "--data-dir", data, "-f", "json", env=env)
    assert code in (0, 1) and set(json.loads(stdout)["regressions"]) <= {"collective_wait", "straggler"}


@pytest.mark.slow
def test_runs_steps_and_compare_on_a_server(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data").start()
    try:
        assert server.admin_token
        auth = ["--server", server.url, "--token", server.admin_token]
        for folder, branch in ((P2P, "main"), (SHM, "feature")):
            code, _, err = _cli("upload", *auth, folder, "--label", f"branch={branch}")
            assert code in (0, 1), err
        code, stdout, _ = _cli("runs", *auth, "--label", "branch=feature", "-f", "json")
        (head,) = json.loads(stdout)
        code, stdout, _ = _cli("runs", *auth, "--label", "branch=main", "-f", "json")
        (base,) = json.loads(stdout)
        engine = sa.create_engine(f"sqlite:///{server.data_dir / 'traceguard.db'}")
        code, stdout, _ = _cli("steps", f"run:{head['id']}", *auth, "-f", "csv")
        rows = [
            (int(r["rank"]), int(r["step_index"]), int(r["nccl_ns"]), int(r["nccl_wait_ns"]), int(r["idle_host_ns"]))
            for r in csv.DictReader(io.StringIO(stdout))
        ]
        assert rows == _sql(
            engine,
            "SELECT rank, step_index, nccl_ns, nccl_wait_ns, idle_host_ns FROM steps WHERE run_id = :r "
            "ORDER BY rank, step_index",
            r=head["id"],
        )
        engine.dispose()
        code, stdout, _ = _cli("compare", f"run:{base['id']}", f"run:{head['id']}", *auth, "-f", "json")
        assert code == 1 and "transport_p2p" in json.loads(stdout)["regressions"]
        code, stdout, _ = _cli("compare", f"run:{head['id']}", f"run:{base['id']}", *auth, "-f", "json")
        assert code in (0, 1) and set(json.loads(stdout)["regressions"]) <= {"collective_wait", "straggler"}
        code, _, stderr = _cli("runs", "--server", server.url)
        assert code == 2 and "--token" in stderr
    finally:
        server.stop()
