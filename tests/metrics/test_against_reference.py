"""traceguard's run metrics equal the naive reference (tests/reference.py) on every real capture:
the public fixtures of ../shared and our own 2×H200 captures."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests import reference
from tests.conftest import OWN, PUBLIC_KINETO, PUBLIC_NSYS
from traceguard.pipeline import analyze

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "report.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())

OWN_NSYS = sorted(OWN.glob("h200/*/cap_*.sqlite.gz"))
OWN_KINETO = sorted(OWN.glob("h200/*/rank*.trace.json.gz"))
NO_INFERENCE = ("pattern", "convention", "window")


def _compare(report: dict, exp: reference.Expected) -> None:
    VALIDATOR.validate(report)
    m = report["run"]["metrics"]
    assert m["step_count"] == exp.steps
    assert m["gpu_ops"] == exp.gpu_ops
    assert (m["gpu_to_cpu_copies"], m["gpu_to_cpu_bytes"]) == (exp.dtoh, exp.dtoh_bytes)
    assert (m["dtod_copies"], m["dtod_bytes"]) == (exp.dtod, exp.dtod_bytes)
    assert m["peer_copies"] == exp.peer
    assert m["nccl_kernels"] == exp.nccl_kernels
    if exp.gpu_ops:
        assert m["gpu_to_cpu_copy_rate"] == pytest.approx(exp.dtoh / exp.gpu_ops)
    if exp.nccl_share is None:
        assert m["nccl_share_of_step"] is None
        assert "nccl_share_of_step" in m["null_reasons"]
    else:
        assert m["nccl_share_of_step"] == pytest.approx(exp.nccl_share, rel=1e-9, abs=1e-12)
        assert m["gpu_span_ns"] == exp.span_ns


@pytest.mark.parametrize("path", PUBLIC_NSYS + OWN_NSYS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nsys_capture_matches_reference(path: Path, unpacked) -> None:
    plain = unpacked(path)
    # Inferred steps have their own tests (tests/metrics/test_step_sources.py); here a capture
    # without markers gets the window step, which the reference computes from the definition.
    report = analyze([str(plain)], step_sources=NO_INFERENCE).report
    _compare(report, reference.expected(reference.read_nsys(plain), window_steps=True))


@pytest.mark.parametrize("path", PUBLIC_KINETO + OWN_KINETO, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_kineto_trace_matches_reference(path: Path) -> None:
    report = analyze([str(path)], step_sources=NO_INFERENCE).report
    _compare(report, reference.expected(reference.read_kineto(path), window_steps=True))
