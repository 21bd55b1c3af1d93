"""`traceguard analyze` / `check` on NCCL Inspector logs: a directory of them alone, and a run
bundle whose inspector/ folder holds them (traceguard harness run --nccl-inspector)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from tests.conftest import REPO, SHARED
from traceguard.cli import app

FIXTURES = SHARED / "fixtures" / "nccl-inspector"
CPU_BUNDLE = REPO / "tests" / "fixtures" / "slow_rank_cpu" / "torch"
VALIDATOR = Draft202012Validator(json.loads((REPO / "docs" / "report.schema.json").read_text()))
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures/nccl-inspector not present")
runner = CliRunner()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


def _invoke(*args: object):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def _valid(report: dict) -> dict:
    errors = sorted(VALIDATOR.iter_errors(report), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]]
    return report


def _inspector_dir(tmp_path: Path, run: str) -> Path:
    folder = tmp_path / f"inspector-{run}"
    folder.mkdir()
    for path in sorted(FIXTURES.glob(f"fsdp2_{run}_rank*.log.gz")):
        # As the plugin names them: <host>-pid<PID>.log (plain, as it writes them).
        with gzip.open(path, "rt") as fh:
            meta = json.loads(fh.readline())["metadata"]
        (folder / f"{meta['hostname']}-pid{meta['pid']}.log").write_bytes(gzip.decompress(path.read_bytes()))
    return folder


def test_analyze_a_directory_of_inspector_logs_alone(tmp_path: Path) -> None:
    folder = _inspector_dir(tmp_path, "p2p")
    out = tmp_path / "report.json"
    result = _invoke("analyze", folder, "--out", out)
    assert result.exit_code == 0, result.output
    report = _valid(json.loads(out.read_text()))
    run = report["run"]["metrics"]
    assert run["wait_source"] == "nccl_inspector"
    assert run["late_rank"] == 0 and run["collective_instances_matched"] == 540
    assert run["nccl_wait_share"] == report["inspector"]["metrics"]["nccl_wait_share"] > 0.5
    assert report["inspector"]["window_time"] == "dump timestamp"
    assert sorted(report["side_inputs"]["sources"]["nccl_inspector"]) == sorted(str(p) for p in folder.iterdir())
    wait = next(c for c in report["checks"] if c["id"] == "collective_wait")
    # One minute-window of matched collectives: below the profile's three, with windows named.
    assert wait["status"] == "skip" and "time window" in wait["message"]
    md = _invoke("analyze", folder, "--format", "md").output
    assert "## NCCL Inspector" in md and "time windows" in md


def test_check_on_inspector_logs_judges_the_wait_in_short_windows(tmp_path: Path) -> None:
    profile = tmp_path / "short.toml"
    profile.write_text(
        'name = "short"\nextends = "production"\n[rules.collective_wait]\ninspector_window_s = 1\nmin_steps = 1\n'
    )
    folder = _inspector_dir(tmp_path, "shm")
    out = tmp_path / "report.json"
    result = _invoke("check", folder, "--profile", profile, "--json", out)
    report = _valid(json.loads(out.read_text()))
    wait = next(c for c in report["checks"] if c["id"] == "collective_wait")
    # SHM: both ranks arrive together, the time is transfer: a pass (no exposed-wait floor for a pass).
    assert wait["status"] == "pass", wait
    assert result.exit_code == 0


def test_bundle_reads_its_inspector_folder(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(CPU_BUNDLE, bundle)
    shutil.copytree(_inspector_dir(tmp_path, "shm"), bundle / "inspector")
    out = tmp_path / "report.json"
    assert _invoke("analyze", bundle, "--out", out).exit_code == 0
    report = _valid(json.loads(out.read_text()))
    assert len(report["ranks"]) == 2  # the captures
    assert report["inspector"]["metrics"]["collective_instances_matched"] == 540
    assert len(report["side_inputs"]["sources"]["nccl_inspector"]) == 2


def test_unknown_format_version_is_reported_not_read(tmp_path: Path) -> None:
    folder = _inspector_dir(tmp_path, "p2p")
    for path in folder.iterdir():
        path.write_bytes(path.read_bytes().replace(b'"v4.0"', b'"v9.1"'))
    result = _invoke("analyze", folder, "--format", "json")
    assert result.exit_code == 2
    assert "v9.1" in result.output and "v4.x" in result.output


def test_every_key_of_an_inspector_report_is_described(tmp_path: Path) -> None:
    from tests.report.test_waits_report import undescribed

    out = tmp_path / "report.json"
    assert _invoke("analyze", _inspector_dir(tmp_path, "p2p"), "--out", out).exit_code == 0
    assert undescribed(_valid(json.loads(out.read_text()))) == set()


def test_html_report_has_the_inspector_section(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert _invoke("analyze", _inspector_dir(tmp_path, "p2p"), "--out", out).exit_code == 0
    page = out.read_text()
    assert "id='inspector'" in page and "id='inspector-windows'" in page and "Late rank: <b>0</b>" in page
