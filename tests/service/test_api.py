"""The API end to end on real H200 captures, against SQLite and PostgreSQL.

Every number checked here is compared with the CLI's own analysis of the same files (the service
must say exactly what `traceguard analyze` says), not with constants.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from tests.service.conftest import P2P, P2P_FILES, SHM, SHM_FILES, Api
from traceguard.pipeline import analyze
from traceguard.store.results import query_steps


@pytest.fixture(scope="module")
def cli_reports() -> dict[str, dict]:
    """What the CLI says about the same files under the H200 profile."""
    return {
        name: analyze([str(folder / f) for f in files if "sqlite" in f], profile="h200-nvlink").report
        for name, folder, files in (("p2p", P2P, P2P_FILES), ("shm", SHM, SHM_FILES))
    }


def test_upload_analyse_and_query(api: Api, cli_reports: dict[str, dict]) -> None:
    run_id = api.new_run({"cluster": "B", "model": "vit-l-32", "git_sha": "abc123"}, profile="h200-nvlink", name="shm")
    response = api.upload(run_id, SHM, SHM_FILES)
    assert response.status_code == 202, response.text
    body = response.json()
    assert response.headers["location"] == body["job"]["url"]
    assert sorted(f["kind"] for f in body["files"]) == ["dmon", "nccl_log", "nccl_log", "nsys-sqlite", "nsys-sqlite"]
    job = api.wait(body["job"]["url"])
    assert job["status"] == "succeeded" and job["error"] is None

    run = api.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "analysed" and run["verdict"] == "fail"
    assert run["labels"] == {"cluster": "B", "model": "vit-l-32", "git_sha": "abc123"}
    assert {f["name"]: f["resolved_rank"] for f in run["files"] if f["kind"] == "nsys-sqlite"} == {
        "cap_0.sqlite.gz": 0,
        "cap_1.sqlite.gz": 1,
    }
    report = api.get(f"/v1/runs/{run_id}/report").json()
    assert sorted(i["path"] for i in report["inputs"]) == ["cap_0.sqlite.gz", "cap_1.sqlite.gz"]
    assert str(api.ctx.settings.data_dir) not in json.dumps(report)  # no server paths in what users see
    expected = cli_reports["shm"]
    assert report["run"]["metrics"]["nccl_share_of_step"] == pytest.approx(
        expected["run"]["metrics"]["nccl_share_of_step"]
    )
    assert {c["id"]: c["status"] for c in report["checks"]}["transport_p2p"] == "fail"  # from the uploaded NCCL logs
    assert report["nccl"]["transports"] == ["SHM"]

    # Step rows: the same steps, in time order per rank, as the CLI's report.
    steps = api.get(f"/v1/runs/{run_id}/steps", params={"rank": 1}).json()["steps"]
    cli_rank1 = next(r for r in expected["ranks"] if r["rank"] == 1)["steps"]
    assert [(s["name"], s["nccl_ns"], s["gpu_span_ns"]) for s in steps] == [
        (s["name"], s["nccl_ns"], s["gpu_span_ns"]) for s in cli_rank1
    ]
    assert [s["step_index"] for s in steps] == list(range(len(cli_rank1)))
    window = api.get(f"/v1/runs/{run_id}/steps", params={"from_step": 1, "to_step": 1, "phase": "backward"}).json()
    assert {(s["rank"], s["step_index"]) for s in window["steps"]} == {(0, 1), (1, 1)}
    for row in window["steps"]:
        assert [p["phase"] for p in row["phases"]] == ["backward"]
        phase = row["phases"][0]
        assert phase["nccl_share"] == pytest.approx(phase["nccl_ns"] / phase["gpu_ns"])


def test_phase_query_across_runs(api: Api) -> None:
    """ "Which runs on cluster B had NCCL above x % of the backward phase?" — SHM does, P2P doesn't."""
    shm = api.analysed(SHM, SHM_FILES, labels={"cluster": "B"})
    p2p = api.analysed(P2P, P2P_FILES, labels={"cluster": "B"})
    elsewhere = api.analysed(SHM, SHM_FILES, labels={"cluster": "A"})
    rows = api.get("/v1/phases", params={"phase": "backward", "label": "cluster:B", "min_nccl_share": 0.4}).json()
    hits = {row["run_id"] for row in rows["phases"]}
    assert shm in hits and p2p not in hits and elsewhere not in hits
    assert all(row["nccl_share"] >= 0.4 and row["labels"]["cluster"] == "B" for row in rows["phases"])
    # and the query agrees with the stored step rows it summarises
    with api.ctx.factory() as session:
        assert len(query_steps(session, shm)) == 6


def test_list_filter_and_paginate(api: Api) -> None:
    ids = [api.new_run({"branch": "main" if i % 2 else "dev", "cluster": "B"}) for i in range(5)]
    first = api.get("/v1/runs", params={"label": ["cluster:B", "branch:main"], "limit": 1}).json()
    second = api.get(
        "/v1/runs", params={"label": ["cluster:B", "branch:main"], "limit": 1, "cursor": first["next_cursor"]}
    )
    assert [r["id"] for r in first["runs"]] == [ids[3]]
    assert [r["id"] for r in second.json()["runs"]] == [ids[1]] and second.json()["next_cursor"] is None
    assert [r["id"] for r in api.get("/v1/runs", params={"status": "created"}).json()["runs"]] == ids[::-1]
    assert api.get("/v1/runs", params={"status": "analysed"}).json()["runs"] == []
    assert api.get("/v1/runs", params={"created_after": "2100-01-01T00:00:00Z"}).json()["runs"] == []
    bad = api.get("/v1/runs", params={"cursor": "garbage"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_input"


def test_report_formats_profiles_and_compare(api: Api, cli_reports: dict[str, dict]) -> None:
    base = api.analysed(P2P, P2P_FILES, profile="h200-nvlink")
    head = api.analysed(SHM, SHM_FILES, profile="h200-nvlink")
    markdown = api.get(f"/v1/runs/{head}/report", params={"format": "md"})
    assert markdown.headers["content-type"].startswith("text/markdown") and "FAIL" in markdown.text
    page = api.get(f"/v1/runs/{head}/report", params={"format": "html"})
    assert page.headers["content-type"].startswith("text/html") and "/static/plotly.min.js" in page.text
    # Another profile: computed on request, then kept.
    production = api.get(f"/v1/runs/{head}/report", params={"profile": "production"}).json()
    assert production["profile"]["name"] == "production"
    assert {c["id"]: c["status"] for c in production["checks"]}["nccl_step_share"] == "warn"  # 34.7 % vs 35 %
    unknown = api.get(f"/v1/runs/{head}/report", params={"profile": "../../etc/passwd"})
    assert unknown.status_code == 422 and "unknown profile" in unknown.json()["error"]["message"]

    comparison = api.get("/v1/compare", params={"base": base, "head": head}).json()
    assert comparison["profile"] == "h200-nvlink"
    # P2P warns: rank 1 reaches the all-reduce 7-9 ms late in two of three steps (collective_wait,
    # straggler's arrival spread; docs/collectives.md).
    assert (comparison["base_verdict"], comparison["head_verdict"]) == ("warn", "fail")
    share = next(m for m in comparison["metrics"] if m["metric"] == "nccl_share_of_step")
    expected = (
        cli_reports["shm"]["run"]["metrics"]["nccl_share_of_step"]
        - cli_reports["p2p"]["run"]["metrics"]["nccl_share_of_step"]
    )
    assert share["delta"] == pytest.approx(expected)
    changed = {c["id"]: (c["base"], c["head"]) for c in comparison["changed_checks"]}
    assert changed["nccl_step_share"] == ("pass", "fail") and changed["transport_p2p"] == ("pass", "fail")


def test_reupload_is_idempotent(api: Api) -> None:
    run_id = api.new_run()
    first = api.upload(run_id, P2P, ["cap_0.sqlite.gz"]).json()
    api.wait(first["job"]["url"])
    again = api.upload(run_id, P2P, ["cap_0.sqlite.gz"]).json()
    assert again["duplicates"] == [first["files"][0]["id"]]
    assert again["job"]["id"] == first["job"]["id"]  # same input set, same profile: same job
    run = api.get(f"/v1/runs/{run_id}").json()
    assert len(run["files"]) == 1 and len(run["jobs"]) == 1
    blobs = [p for p in (api.ctx.blobs.root).rglob("*") if p.is_file() and ".incoming" not in p.parts]
    assert len(blobs) == 1


def test_bundle_archive_with_manifest_ranks(api: Api, tmp_path: Path) -> None:
    """A run bundle as .tar.gz: ranks from its manifest (swapped here, to prove they are used)."""
    archive = tmp_path / "bundle.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name in [*P2P_FILES, "stdout.txt"]:
            tar.add(P2P / name, arcname=f"run/{name}")
        manifest = b'{"captures": [{"path": "cap_0.sqlite.gz", "rank": 1}, {"path": "cap_1.sqlite.gz", "rank": 0}]}'
        info = tarfile.TarInfo("run/manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    run_id = api.new_run()
    response = api.post(f"/v1/runs/{run_id}/files", files=[("file", ("bundle.tar.gz", archive.read_bytes()))])
    assert response.status_code == 202, response.text
    body = response.json()
    assert {s["name"] for s in body["skipped"]} == {"run/stdout.txt", "run/manifest.json"}
    ranks = {f["name"]: (f["rank"], f["rank_source"], f["archive"]) for f in body["files"]}
    assert ranks["cap_0.sqlite.gz"] == (1, "manifest", "bundle.tar.gz")
    assert api.wait(body["job"]["url"])["status"] == "succeeded"
    report = api.get(f"/v1/runs/{run_id}/report").json()
    assert {i["path"]: i["rank"] for i in report["inputs"]} == {
        "cap_0.sqlite.gz": 1,
        "cap_1.sqlite.gz": 0,
    }


def test_raw_body_upload_with_rank(api: Api) -> None:
    run_id = api.new_run()
    data = (P2P / "cap_1.sqlite.gz").read_bytes()
    response = api.post(
        f"/v1/runs/{run_id}/files",
        content=data,
        params={"name": "weird name.sqlite.gz", "rank": 5, "analyze": "false"},
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 201, response.text
    stored = response.json()["files"][0]
    assert (stored["rank"], stored["rank_source"], stored["size"]) == (5, "argument", len(data))
    assert response.json()["job"] is None
    job = api.post(f"/v1/runs/{run_id}/analyze").json()["job"]
    assert api.wait(job["url"])["status"] == "succeeded"
    assert [r["rank"] for r in api.get(f"/v1/runs/{run_id}/report").json()["ranks"]] == [5]


def test_profiles_health_metrics_openapi(api: Api) -> None:
    profiles = {p["name"]: p for p in api.get("/v1/profiles").json()}
    assert {"production", "ci-cpu", "h200-nvlink"} <= set(profiles)
    assert profiles["h200-nvlink"]["chain"][-1] == "production"
    assert profiles["production"]["rules"]["nccl_step_share"]["fail"] == 0.35
    health = api.client.get("/healthz")
    assert health.json() == {"status": "ok"}
    assert health.headers["x-content-type-options"] == "nosniff" and health.headers["x-frame-options"] == "DENY"
    ready = api.client.get("/readyz").json()
    assert ready["status"] == "ok" and ready["checks"] == {"database": "ok", "blobs": "ok", "workers": "ok"}
    api.analysed(P2P, ["cap_0.sqlite.gz"])
    metrics = api.client.get("/metrics").text
    assert 'traceguard_jobs{status="succeeded"} 1.0' in metrics
    assert 'traceguard_uploads_total{outcome="stored"} 1.0' in metrics
    assert 'route="/v1/runs/{run_id}/files",status="202"' in metrics
    spec = api.client.get("/openapi.json").json()
    for path in ("/v1/runs", "/v1/runs/{run_id}/files", "/v1/jobs/{job_id}", "/v1/runs/{run_id}/steps", "/v1/compare"):
        assert path in spec["paths"]


def test_tokens_admin_only_and_revocation(api: Api) -> None:
    assert api.post("/v1/tokens", who="uploader", json={"scopes": ["read"]}).status_code == 403
    created = api.post("/v1/tokens", who="admin", json={"scopes": ["read"], "name": "grafana"})
    assert created.status_code == 201
    secret, token_id = created.json()["token"], created.json()["id"]
    listed = api.get("/v1/tokens", who="admin").json()
    assert all("token" not in t for t in listed) and any(t["name"] == "grafana" for t in listed)
    assert api.client.get("/v1/runs", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    assert api.client.delete(f"/v1/tokens/{token_id}", headers=api.headers("admin")).status_code == 204
    assert api.client.get("/v1/runs", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    from sqlalchemy import text

    with api.ctx.engine.connect() as connection:  # secrets are never stored, only their hashes
        stored = [row[0] for row in connection.execute(text("SELECT token_hash FROM tokens"))]
    assert secret not in stored and all(len(h) == 64 for h in stored)


def test_job_under_another_profile_keeps_the_runs_verdict(api: Api) -> None:
    captures = ["cap_0.sqlite.gz", "cap_1.sqlite.gz"]
    run_id = api.analysed(SHM, captures, profile="h200-nvlink")
    assert api.get(f"/v1/runs/{run_id}").json()["verdict"] == "fail"  # 34.7 % > 25 %
    job = api.post(f"/v1/runs/{run_id}/analyze", params={"profile": "production"}).json()["job"]
    assert job["profile"] == "production" and api.wait(job["url"])["status"] == "succeeded"
    run = api.get(f"/v1/runs/{run_id}").json()
    assert (run["status"], run["verdict"], run["profile"]) == ("analysed", "fail", "h200-nvlink")
    assert api.get(f"/v1/runs/{run_id}/report", params={"profile": "production"}).json()["verdict"] == "warn"
    with api.ctx.factory() as session:
        from traceguard.store.results import check_results

        assert {c.profile for c in check_results(session, run_id)} == {"h200-nvlink"}


def test_links_collectives_and_transport_map(api: Api, cli_reports: dict[str, dict]) -> None:
    run_id = api.analysed(SHM, SHM_FILES)
    links = api.get(f"/v1/runs/{run_id}/links").json()
    assert links["transport_matrix"] == {"0": {"1": "SHM"}, "1": {"0": "SHM"}}
    report = api.get(f"/v1/runs/{run_id}/report").json()
    assert [(c["rank"], c["peer"], c["channel"], c["transport"]) for c in links["connections"]] == [
        (c["rank"], c["peer"], c["channel"], c["transport"]) for c in report["nccl"]["connections"]
    ]
    key = ("rank", "collective", "msg_bytes", "count")
    expected = sorted(cli_reports["shm"]["run"]["collectives"], key=lambda c: tuple(str(c[k]) for k in key))
    stored = sorted(links["collectives"], key=lambda c: tuple(str(c[k]) for k in key))
    assert [tuple(c[k] for k in key) for c in stored] == [tuple(c[k] for k in key) for c in expected]
    assert [c["busbw_gbps"] for c in stored] == pytest.approx([c["busbw_gbps"] for c in expected])
    rank1 = api.get(f"/v1/runs/{run_id}/links", params={"rank": 1}).json()["collectives"]
    assert rank1 and {c["rank"] for c in rank1} == {1}


def test_run_step_patterns_reach_the_analysis_and_the_store(api: Api) -> None:
    """`--step-pattern` through the service: kept with the run, used by its jobs, and each rank's
    step source stored; a pattern that is no regex answers 422 naming it."""
    from sqlalchemy import select

    from traceguard.store.tables import RankResult

    response = api.post("/v1/runs", json={"name": "fwd", "step_patterns": [r"^forward$"]})
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]
    assert response.json()["step_patterns"] == [r"^forward$"]
    upload = api.upload(run_id, P2P, P2P_FILES[:2])
    assert api.wait(upload.json()["job"]["url"])["status"] == "succeeded"
    report = api.get(f"/v1/runs/{run_id}/report").json()
    assert {r["step_source"] for r in report["ranks"]} == {"pattern"}
    assert {s["name"] for r in report["ranks"] for s in r["steps"]} == {"forward"}
    with api.ctx.factory() as session:
        stored = session.scalars(select(RankResult.step_source).where(RankResult.run_id == run_id)).all()
    assert sorted(stored) == ["pattern", "pattern"]
    assert api.get(f"/v1/runs/{run_id}").json()["step_patterns"] == [r"^forward$"]

    bad = api.post("/v1/runs", json={"name": "bad", "step_patterns": ["(unclosed"]})
    assert bad.status_code == 422
    assert "(unclosed" in bad.json()["error"]["message"]
