"""docs/report.schema.json describes every key of real reports, the cross-rank "who waits for whom"
fields (clock alignment, late rank, wait / transfer, the step breakdown) included: a key that a
report carries and the schema does not name fails here, as does a value outside its type or range.

Reports of real captures: 2×H200 DDP with 25 MB buckets under nsys (rank 0 late at 110 of 111
all-reduces), the same job under torch.profiler (rank 1 late), one rank alone (nothing to match),
and HTA's sampled pair of ranks, whose clocks cannot be trusted (every split field null).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.conftest import OWN, PUBLIC, REPO
from traceguard.pipeline import analyze

SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
H200 = OWN / "h200"
HTA = PUBLIC / "kineto" / "facebookresearch__HolisticTraceAnalysis__tests__data__trace_filter__sampled_rank-{}.json.gz"
#: Free-form by design: each rule writes its own evidence rows.
FREE_FORM = (".checks[].evidence[]",)

STEP_FIELDS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "period_ns",
    "compute_ns",
    "comm_ns",
    "comm_wait_ns",
    "comm_transfer_ns",
    "copy_ns",
    "idle_host_ns",
    "idle_other_ns",
    "lateness_ns",
)
RUN_METRICS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "nccl_wait_share",
    "late_rank",
    "collective_instances_matched",
    "collective_instances_unmatched",
    "matched_steps",
    "arrival_spread",
    "arrival_steps_compared",
    "straggler_worst",
    "straggler_evidence_steps",
)
RANK_METRICS = ("nccl_wait_ns", "nccl_transfer_ns", "nccl_wait_share", "collective_instances_matched", "last_arrivals")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        return {
            "nsys": analyze([str(H200 / "p2p_nsys_bucket25")]).report,
            "kineto": analyze([str(H200 / "p2p_torch")]).report,
            "one_rank": analyze([str(H200 / "p2p_nsys" / "cap_0.sqlite.gz")]).report,
            "untrusted": analyze([str(HTA).format(0), str(HTA).format(1)]).report,
        }


def _resolve(node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _branches(node: Any) -> list[dict]:
    node = _resolve(node)
    if not isinstance(node, dict):
        return []
    found = [node]
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in node.get(key, []):
            found += _branches(sub)
    return found


def undescribed(doc: Any, node: Any = SCHEMA, path: str = "") -> set[str]:
    """Paths of keys in ``doc`` that no schema branch at that place names (nor allows by
    ``additionalProperties``)."""
    if path.startswith(FREE_FORM):
        return set()
    missing: set[str] = set()
    branches = _branches(node)
    if isinstance(doc, dict):
        for key, value in doc.items():
            subs = []
            for branch in branches:
                if key in branch.get("properties", {}):
                    subs.append(branch["properties"][key])
                elif isinstance(branch.get("additionalProperties"), dict):
                    subs.append(branch["additionalProperties"])
            if not subs:
                missing.add(f"{path}.{key}")
            for sub in subs:
                missing |= undescribed(value, sub, f"{path}.{key}")
    elif isinstance(doc, list):
        for branch in branches:
            if "items" in branch:
                for value in doc:
                    missing |= undescribed(value, branch["items"], f"{path}[]")
    return missing


@pytest.mark.parametrize("name", ["nsys", "kineto", "one_rank", "untrusted"])
def test_every_key_is_described_and_valid(reports: dict[str, dict], name: str) -> None:
    report = reports[name]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(report)]
    assert errors == []
    assert undescribed(report) == set()


def _described(*path: str) -> dict:
    node: Any = SCHEMA
    for key in path:
        node = _resolve(node)
        node = node["items"] if key == "[]" else node["properties"][key]
    return _resolve(node)


def test_wait_fields_are_described_with_meaning_unit_and_null() -> None:
    """Each new field has a description that gives its unit (ns, a share, a count) and allows null."""
    for key in STEP_FIELDS:
        node = _described("ranks", "[]", "steps", "[]", key)
        assert "null" in node["type"] and "ns" in node["description"], key
    for key in RUN_METRICS:
        node = _described("run", "metrics", key)
        assert "null" in node["type"] and len(node["description"]) > 30, key
    for key in RANK_METRICS:
        node = _described("ranks", "[]", "metrics", key)
        assert "null" in node["type"] and len(node["description"]) > 30, key
    for key in ("clock_alignment", "late_rank"):
        assert "null" in _described("run", key)["type"]
    assert "residual_ns" in _described("run", "clock_alignment")["properties"]["ranks"]["items"]["required"]


def test_the_reports_carry_the_fields(reports: dict[str, dict]) -> None:
    """Every report has every field (null where it cannot be known), and nulls say why."""
    for name, report in reports.items():
        metrics = report["run"]["metrics"]
        assert set(RUN_METRICS) <= set(metrics), name
        for key in RUN_METRICS:
            if metrics[key] is None:
                assert key in metrics["null_reasons"], (name, key)
        assert {"clock_alignment", "late_rank", "arrival_steps"} <= set(report["run"]), name
        for rank in report["ranks"]:
            assert set(RANK_METRICS) <= set(rank["metrics"]), name
            for step in rank["steps"]:
                assert set(STEP_FIELDS) <= set(step), name
    nsys = reports["nsys"]
    assert nsys["run"]["late_rank"]["rank"] == 0 and nsys["run"]["clock_alignment"]["trusted"] is True
    assert reports["kineto"]["run"]["late_rank"]["rank"] == 1
    assert reports["one_rank"]["run"]["late_rank"] is None
    untrusted = reports["untrusted"]
    assert untrusted["run"]["clock_alignment"]["trusted"] is False and untrusted["run"]["clock_alignment"]["reason"]
    assert all(s["nccl_wait_ns"] is None and s["lateness_ns"] is None for r in untrusted["ranks"] for s in r["steps"])
