"""The CI drop-ins in docs/ci run here as a CI system would run them: the GitHub workflow's gate step
and the GitLab job's script (read from the YAML files, with their environment), on the committed
H200 bundles and on a CPU capture made by the harness. A run of main is stored, a branch that
falls back to shared memory fails the gate with the checks it regressed, and the JUnit file holds
every check of the JSON report."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import OWN, REPO

CI = REPO / "docs" / "ci"
P2P = OWN / "h200" / "p2p_nsys"
SHM = OWN / "h200" / "shm_nsys"
BIN = Path(sys.executable).parent


def _github_gate() -> tuple[str, dict[str, str]]:
    workflow = yaml.safe_load((CI / "github-actions.yml").read_text())
    (step,) = [s for s in workflow["jobs"]["traceguard"]["steps"] if "traceguard-gate.sh" in s.get("run", "")]
    return step["run"], {k: str(v) for k, v in step["env"].items()}


def _gitlab_gate() -> tuple[str, dict[str, str]]:
    job = yaml.safe_load((CI / "gitlab-ci.yml").read_text())["traceguard"]
    assert job["artifacts"]["reports"]["junit"] == "traceguard-out/junit.xml"
    return "\n".join(job["script"]), {k: str(v) for k, v in job["variables"].items()}


def _expand(value: str, context: dict[str, str]) -> str:
    """GitHub's ${{ a || b }} and GitLab's $VAR, from the CI context the test plays."""

    def github(match: re.Match[str]) -> str:
        for name in match.group(1).split("||"):
            if context.get(name.strip()):
                return context[name.strip()]
        return ""

    value = re.sub(r"\$\{\{\s*(.+?)\s*\}\}", github, value)
    return re.sub(r"\$([A-Z_]+)", lambda m: context.get(m.group(1), m.group(0)), value)


def _run_gate(
    system: str, workdir: Path, branch: str, bundle: Path | None, extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CI step's shell text, in ``workdir`` (the checkout: the gate script at ci/, as the
    files tell users to copy it), with the step's environment."""
    (workdir / "ci").mkdir(parents=True, exist_ok=True)
    (workdir / "ci" / "traceguard-gate.sh").write_text((CI / "traceguard-gate.sh").read_text())
    script, env = _github_gate() if system == "github" else _gitlab_gate()
    context = {
        "github.head_ref": "" if branch == "main" else branch,
        "github.ref_name": branch,
        "github.sha": "0" * 40,
        "CI_COMMIT_REF_NAME": branch,
        "CI_DEFAULT_BRANCH": "main",
        "CI_COMMIT_SHA": "0" * 40,
    }
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TRACEGUARD_")}
    environment |= {k: _expand(v, context) for k, v in env.items()}
    environment |= {"PATH": f"{BIN}{os.pathsep}{environment['PATH']}", "COLUMNS": "200", **(extra or {})}
    environment["TRACEGUARD_CACHE_DIR"] = str(workdir / "cache")
    if bundle is not None:
        environment["TG_BUNDLE"] = str(bundle)
    return subprocess.run(
        ["bash", "-c", script], cwd=workdir, env=environment, capture_output=True, text=True, timeout=600
    )


def _junit_cases(path: Path) -> dict[str, str]:
    """Test case → outcome (passed, failed, skipped) of a JUnit XML file."""
    cases = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None:
            cases[case.get("name", "")] = "failed"
        else:
            cases[case.get("name", "")] = "skipped" if case.find("skipped") is not None else "passed"
    return cases


def _check_junit(out: Path) -> dict[str, Any]:
    report = json.loads((out / "report.json").read_text())
    cases = _junit_cases(out / "junit.xml")
    assert len(cases) == len(report["checks"])
    failed = {name for name, outcome in cases.items() if outcome == "failed"}
    assert len(failed) == sum(c["status"] == "fail" for c in report["checks"])
    return report


@pytest.mark.slow
def test_the_gate_on_committed_bundles(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    out = checkout / "traceguard-out"

    # main: no baseline yet; the checks pass; the run is kept as the baseline.
    done = _run_gate("github", checkout, "main", P2P)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to compare with" in (out / "compare.md").read_text()
    assert _check_junit(out)["verdict"] != "fail"
    assert (checkout / ".traceguard-store" / "traceguard.db").is_file()

    # A branch where NCCL fell back to shared memory (GitLab's job this time): the gate fails.
    done = _run_gate("gitlab", checkout, "feature/shm", SHM)
    assert done.returncode == 1, done.stdout + done.stderr
    report = _check_junit(out)
    comparison = json.loads((out / "compare.json").read_text())
    passed_on_main = {"transport_p2p", "pcie_saturation"}
    assert passed_on_main <= set(comparison["regressions"])
    assert all(c["status"] in ("warn", "fail") for c in report["checks"] if c["id"] in comparison["regressions"])
    assert "| transport_p2p | pass | fail | regression |" in (out / "compare.md").read_text()

    # The same branch back on P2P: nothing regressed, the gate passes; only main's run is stored.
    done = _run_gate("github", checkout, "feature/p2p", P2P)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((out / "compare.json").read_text())["regressions"] == []
    runs = subprocess.run(
        [str(BIN / "traceguard"), "runs", "--data-dir", str(checkout / ".traceguard-store"), "--format", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "TRACEGUARD_CACHE_DIR": str(tmp_path / "cache")},
        check=True,
    )
    assert [r["labels"]["branch"] for r in json.loads(runs.stdout)] == ["main"]


@pytest.mark.slow
def test_the_gate_captures_on_cpu(tmp_path: Path) -> None:
    """No bundle given: the harness captures a 2-rank gloo job with torch.profiler on the CPU."""
    pytest.importorskip("torch")
    checkout = tmp_path / "checkout"
    done = _run_gate("github", checkout, "main", None, {"TG_HARNESS_ARGS": "--steps 3"})
    assert done.returncode == 0, done.stdout + done.stderr
    out = checkout / "traceguard-out"
    assert sorted(p.name for p in (out / "bundle").glob("rank*.trace.json")) == ["rank0.trace.json", "rank1.trace.json"]
    report = _check_junit(out)
    assert {i["rank"] for i in report["inputs"]} == {0, 1}
