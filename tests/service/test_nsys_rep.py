"""An ``.nsys-rep`` uploaded to the service: recognised by its magic, exported by the server's
own ``nsys`` inside the job (cached in the data directory), analysed. Real nsys, CPU capture."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import Api
from traceguard.tools import find_importer, find_nsys

pytestmark = pytest.mark.slow

SCRIPT = """
import time
import nvtx
for step in range(3):
    with nvtx.annotate(f"Batch {step}"):
        with nvtx.annotate("forward"):
            time.sleep(0.02)
        with nvtx.annotate("backward"):
            time.sleep(0.03)
"""


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nsys = find_nsys()
    if nsys is None:
        if os.environ.get("TRACEGUARD_REQUIRE_NSYS") == "1":
            pytest.fail("nsys is not installed; scripts/setup.sh installs it from Debian non-free")
        pytest.skip("needs nsys")
    try:
        import nvtx  # noqa: F401 - the captured script's ranges
    except ImportError:
        if os.environ.get("TRACEGUARD_REQUIRE_NSYS") == "1":
            pytest.fail("the nvtx package is missing; scripts/setup.sh installs it with traceguard[harness]")
        pytest.skip("needs the nvtx package")
    folder = tmp_path_factory.mktemp("rep")
    done = subprocess.run(
        [
            nsys,
            "profile",
            "--trace=nvtx,osrt",
            "--sample=none",
            "--cpuctxsw=none",
            "-o",
            str(folder / "job"),
            sys.executable,
            "-c",
            SCRIPT,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    rep, qdstrm = folder / "job.nsys-rep", folder / "job.qdstrm"
    if not rep.is_file() and qdstrm.is_file():  # Debian's split layout: nsys cannot find its importer
        importer = find_importer(nsys)
        assert importer, done.stdout + done.stderr
        subprocess.run([importer, "-i", str(qdstrm)], capture_output=True, check=True, timeout=300)
    assert rep.is_file(), done.stdout + done.stderr
    return rep


def test_nsys_rep_upload_is_exported_and_analysed(api: Api, report_file: Path) -> None:
    run_id = api.new_run(profile="ci-cpu")
    response = api.upload_bytes(run_id, "renamed.bin", report_file.read_bytes())
    assert response.status_code == 202, response.text
    assert response.json()["files"][0]["kind"] == "nsys-rep"
    job = api.wait(response.json()["job"]["url"], timeout=300)
    assert job["status"] == "succeeded", job
    report = api.get(f"/v1/runs/{run_id}/report").json()
    assert [(i["path"], i["format"]) for i in report["inputs"]] == [("renamed.bin", "nsys-rep")]
    assert report["ranks"] and [s["name"] for s in report["ranks"][0]["steps"]] == ["Batch 0", "Batch 1", "Batch 2"]
    assert list((api.ctx.cache_dir).rglob("*.sqlite"))  # exported once, into the service's own cache
