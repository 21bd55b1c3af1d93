"""The service image has no torch: the whole service (API, intake, analysis child process) must
work with torch impossible to import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.service.live import REPO

BLOCKER = """
import sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("torch is not installed in the service image", name=name)
        return None

sys.meta_path.insert(0, _NoTorch())
"""

SCRIPT = """
import sys, time
from fastapi.testclient import TestClient
from api.app import create_app
from traceguard.settings import Settings
from traceguard.store.access import create_token, get_or_create_project
from traceguard.store.db import transaction

folder = "tests/fixtures/h200/p2p_nsys/"
with TestClient(create_app(Settings(data_dir=sys.argv[1], workers=1))) as client:
    ctx = client.app.state.ctx
    with transaction(ctx.factory) as session:
        _, secret = create_token(session, get_or_create_project(session, "default"), ["read", "upload"])
    headers = {"Authorization": f"Bearer {secret}"}
    run = client.post("/v1/runs", json={}, headers=headers).json()
    names = ["cap_0.sqlite.gz", "cap_1.sqlite.gz", "nccl.vm.1734.log"]
    files = [("file", (n, open(folder + n, "rb").read())) for n in names]
    job = client.post(f"/v1/runs/{run['id']}/files", files=files, headers=headers).json()["job"]
    for _ in range(600):
        state = client.get(job["url"], headers=headers).json()
        if state["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.1)
    print(state["status"], client.get(f"/v1/runs/{run['id']}", headers=headers).json()["verdict"])
    print("torch loaded:", "torch" in sys.modules)
"""


def test_service_runs_without_torch(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(BLOCKER))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "not installed in the service image" in probe.stderr
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "data")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["succeeded warn", "torch loaded: False"]
