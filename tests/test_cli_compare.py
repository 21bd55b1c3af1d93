"""`traceguard compare` between two captures / run directories / JSON reports (the CI gate without
a server) and `traceguard export --perfetto` (the timeline as Chrome trace-event JSON), through the
real command line on the committed H200 bundles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import OWN
from traceguard.cli import app
from traceguard.ingest.kineto import read_kineto

P2P = OWN / "h200" / "p2p_nsys"
SHM = OWN / "h200" / "shm_nsys"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


def _cli(*args: str | Path) -> tuple[int, str, str]:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"crashed: {result.exception!r}\n{result.output}"
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("reports")
    out = {}
    for name, run in (("p2p", P2P), ("shm", SHM)):
        out[name] = folder / f"{name}.json"
        code, _, err = _cli("check", run, "--json", out[name])
        assert code in (0, 1), err
    return out


def test_compare_gate_exit_codes_on_run_directories(tmp_path: Path, reports: dict[str, Path]) -> None:
    """P2P → SHM regresses what P2P passed (exit 1); SHM → P2P regresses no link check, only the
    cross-rank ones that the faster link exposes (rank 1's lateness becomes most of the NCCL time)."""
    base, head = (json.loads(reports[n].read_text()) for n in ("p2p", "shm"))
    passed = {c["id"] for c in base["checks"] if c["status"] == "pass"}
    worse = [c["id"] for c in head["checks"] if c["id"] in passed and c["status"] in ("warn", "fail")]
    failed = [c["id"] for c in head["checks"] if c["id"] in passed and c["status"] == "fail"]
    assert worse and failed

    code, stdout, stderr = _cli("compare", P2P, SHM, "--format", "json")
    assert code == 1 and "regressed" in stderr
    comparison = json.loads(stdout)
    assert comparison["regressions"] == worse and comparison["fail_regressions"] == failed
    assert (comparison["base_verdict"], comparison["head_verdict"]) == (base["verdict"], head["verdict"])
    # Per collective type and per step, from the two reports.
    (allreduce,) = comparison["collectives"]
    base_type = base["run"]["collectives_by_type"][0]
    head_type = head["run"]["collectives_by_type"][0]
    assert allreduce["time_ns_delta"] == head_type["time_ns"] - base_type["time_ns"]
    steps = {(r["rank"], s["index"]): s for r in head["ranks"] for s in r["steps"]}
    for row in comparison["steps"]:
        assert row["nccl_ns_head"] == steps[(row["rank"], row["index"])]["nccl_ns"]
        assert row["nccl_share_delta_pp"] == pytest.approx(100 * (row["nccl_share_head"] - row["nccl_share_base"]))

    code, stdout, _ = _cli("compare", SHM, P2P, "--format", "json")
    assert code == 1 and set(json.loads(stdout)["regressions"]) == {"collective_wait"}
    assert json.loads(stdout)["fail_regressions"] == []
    # Only failures gate with --fail-on fail; a warn-only regression would pass.
    code, _, _ = _cli("compare", P2P, SHM, "--fail-on", "fail")
    assert code == 1
    # The same gate from the JSON reports `check --json` wrote (e.g. main's, kept as an artifact).
    code, stdout, _ = _cli("compare", reports["p2p"], reports["shm"])
    assert code == 1 and "| transport_p2p | pass | fail | regression |" in stdout
    code, _, _ = _cli("compare", reports["p2p"], reports["p2p"])
    assert code == 0
    out = tmp_path / "diff.html"
    code, _, _ = _cli("compare", reports["p2p"], reports["shm"], "--out", out)
    assert code == 1 and "<table id='checks-that-changed'>" in out.read_text()


def test_compare_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    code, _, stderr = _cli("compare", tmp_path / "missing", P2P)
    assert code == 2 and "no such file" in " ".join(stderr.split())  # rich wraps long temp paths
    code, _, stderr = _cli("compare", "run:abc", P2P)
    assert code == 2 and "run:ID" in stderr


def test_export_perfetto_round_trip(tmp_path: Path, reports: dict[str, Path]) -> None:
    """The trace holds one thread per lane and one complete event per segment, in µs, in the
    trace-event format; the traceguard Kineto reader (a JSON trace reader) decodes it."""
    report = json.loads(reports["p2p"].read_text())
    target = tmp_path / "trace.json"
    code, _, stderr = _cli("export", reports["p2p"], "--perfetto", target)
    assert code == 0, stderr
    trace = json.loads(target.read_text())
    events = trace["traceEvents"]
    assert all(isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["ph"] in ("X", "M") for e in events)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    complete = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["name"], str) for e in complete)
    origin = min(r["origin_ns"] for r in report["timeline"]["ranks"])
    for rank in report["timeline"]["ranks"]:
        assert processes[rank["rank"]] == f"rank {rank['rank']}"
        for lane in rank["lanes"]:
            tid = next(t for (p, t), name in threads.items() if p == rank["rank"] and name == lane["name"])
            mine = [e for e in complete if (e["pid"], e["tid"]) == (rank["rank"], tid)]
            assert len(mine) == len(lane["start"])
            first = rank["origin_ns"] - origin + lane["start"][0]
            assert mine[0]["ts"] == pytest.approx(first / 1e3) and mine[0]["cat"] == lane["kind"]
    decoded = read_kineto(target)
    assert decoded.info.format == "kineto"

    # From captures (analysed now), the same trace.
    again = tmp_path / "again.json"
    code, _, _ = _cli("export", P2P, "--perfetto", again)
    assert code == 0
    assert sum(e["ph"] == "X" for e in json.loads(again.read_text())["traceEvents"]) == len(complete)
    code, _, stderr = _cli("export", P2P)
    assert code == 2 and "--perfetto" in stderr
