"""bench/run_bench.py's RESULTS.md carries the streaming numbers of NCCL Inspector logs
(bench/inspector_stream.json, measured apart by bench/inspector_stream.py), copied as they are."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def _run_bench():
    spec = importlib.util.spec_from_file_location("run_bench", BENCH / "run_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_md_copies_the_inspector_streaming_numbers(tmp_path: Path) -> None:
    run_bench = _run_bench()
    stream = json.loads((BENCH / "inspector_stream.json").read_text())
    out = tmp_path / "RESULTS.md"
    run_bench.write_markdown(json.loads((BENCH / "results.json").read_text()), out)
    text = out.read_text()
    section = text[text.index("## Streaming NCCL Inspector logs") :]
    ours, plain = stream["traceguard"], stream["json_loads"]
    assert f"**{ours['lines_per_s']:,.0f}**" in section and f"| {plain['lines_per_s']:,.0f} |" in section
    assert f"| {ours['peak_rss_after_read_mb']:,.0f} |" in section and f"| {plain['peak_rss_mb']:,.0f} |" in section
    assert f"measured {stream['date_utc']} UTC, traceguard git {stream['traceguard_git']}" in section
    assert f"{ours['lines_per_s'] / plain['lines_per_s']:.2f}× the lines a second" in section
    # The committed RESULTS.md is what write_markdown makes of the committed results.json.
    assert (BENCH / "RESULTS.md").read_text() == text


def test_no_streaming_section_without_its_numbers(tmp_path: Path) -> None:
    run_bench = _run_bench()
    out = tmp_path / "RESULTS.md"
    results = json.loads((BENCH / "results.json").read_text())
    run_bench.write_markdown(results, out, inspector_stream=tmp_path / "absent.json")
    assert "Streaming NCCL Inspector" not in out.read_text()
    assert run_bench.inspector_stream_section(tmp_path / "absent.json") == []
