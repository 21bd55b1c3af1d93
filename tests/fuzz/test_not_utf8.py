"""Text that is not UTF-8 in every string column of real captures (issue 25).

A real nsys export with some ``StringIds.value`` rows replaced by ``x'00ff'`` crashed
``traceguard check``: Polars took the bytes as a string column, printed a ``UnicodeDecodeError``
and panicked (``PyObject pointer is null``) in the GPU→CPU offenders table; the CLI exited 1 (the
code for a failed check) with a traceback, the service failed the job as ``analysis_crashed``
with the traceback as its message. Here every string-bearing column of every table of real
exports of each nsys generation (2022.2 → 2026.2, and this project's H200 captures) and every
string of real Kineto traces is made not UTF-8, and the whole analysis must run, say what it
replaced, and render every format.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import OWN, PUBLIC_KINETO, PUBLIC_NSYS
from tests.fuzz import mutate
from traceguard.ingest import read_capture
from traceguard.model import Capture
from traceguard.pipeline import analyze
from traceguard.report import html, junit, markdown

#: Every public export (nsys 2022.2 to 2026.2) and our H200 captures: the one whose GPU→CPU copies
#: fill the offenders table where the issue's panic was (CPU-staged all-reduce), and an NCCL one.
EXPORTS = [
    *PUBLIC_NSYS,
    OWN / "sweep_h200" / "cpu_staged" / "cap_0.sqlite.gz",
    OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz",
]


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}" if path.is_relative_to(OWN) else path.name.split("__")[-1][:-10]


def _damaged(source: Path, target: Path, variant: str, every: int = 1) -> int:
    target.write_bytes(gzip.decompress(source.read_bytes()))
    conn = sqlite3.connect(target, isolation_level=None)
    conn.text_factory = bytes
    try:
        return mutate.inject_not_utf8(conn, variant, mutate.string_columns(conn), every)
    finally:
        conn.close()


def _ranges_seen(capture: Capture) -> int:
    return capture.ranges.height + int(capture.folded_ranges["ranges"].sum() or 0)


def _all_text_is_utf8(doc: object) -> None:
    """The report, as the JSON contract writes it, is valid UTF-8 (no lone surrogates either)."""
    json.dumps(doc, ensure_ascii=False).encode("utf-8")


@pytest.mark.parametrize("variant", mutate.NOT_UTF8_VARIANTS)
@pytest.mark.parametrize("export", EXPORTS, ids=_name)
def test_every_string_column_not_utf8_is_analysed(export: Path, variant: str, tmp_path: Path) -> None:
    damaged = tmp_path / "rank0.sqlite"
    cells = _damaged(export, damaged, variant)
    assert cells > 0
    plain = tmp_path / "plain.sqlite"
    plain.write_bytes(gzip.decompress(export.read_bytes()))
    # The reader: every event is still read; every text value of every frame is UTF-8.
    before, after = read_capture(plain), read_capture(damaged)
    assert after.gpu_ops.height == before.gpu_ops.height
    # Ranges kept or folded (per-op ones, ``aten::...``, are counted, not kept; a damaged text no
    # longer reads so and is kept): every one is still there.
    assert _ranges_seen(after) == _ranges_seen(before)
    for frame in (after.strings, after.ranges, after.devices, after.processes):
        for column, dtype in frame.schema.items():
            if dtype == pl.String:
                frame[column].to_list()  # a value that is not UTF-8 panics here
    # The whole analysis, and every renderer.
    analysis = analyze([str(damaged)], scheduler="serial")
    report = analysis.report
    (record,) = report["inputs"]
    assert record["error"] is None, record["error"]
    # StringIds, read in bulk, is in every export: the note says what was replaced there.
    assert any("StringIds: " in w and "not UTF-8" in w and "U+FFFD" in w for w in record["warnings"]), record
    _all_text_is_utf8(report)
    for render in (markdown.render, html.render, junit.render):
        render(report).encode("utf-8")
    # Events are never lost to the damage (the steps may differ: the step ranges' names are gone).
    assert (report["ranks"] and report["ranks"][0]["metrics"]["gpu_ops"] > 0) or not before.gpu_ops.height


def test_the_issues_capture_checks_as_the_undamaged_one_with_a_note(tmp_path: Path) -> None:
    """The issue's case through the real command line: StringIds rows of a real H200 export
    replaced by x'00ff'. `check` gave a Rust panic and exit 1; now it exits as the undamaged file
    does (this CPU-staged capture fails gpu_to_cpu_copy_rate, so 1 for that reason), every check
    has the undamaged file's status, and a note says how many values were replaced."""
    source = OWN / "sweep_h200" / "cpu_staged" / "cap_0.sqlite.gz"
    damaged = tmp_path / "damaged" / "cap_0.sqlite"
    damaged.parent.mkdir()
    damaged.write_bytes(gzip.decompress(source.read_bytes()))
    conn = sqlite3.connect(damaged)
    replaced = conn.execute("UPDATE StringIds SET value = x'00ff' WHERE id % 3 = 0").rowcount
    conn.commit()
    conn.close()
    plain = tmp_path / "plain" / "cap_0.sqlite"
    plain.parent.mkdir()
    plain.write_bytes(gzip.decompress(source.read_bytes()))

    def check(path: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
        out = path.with_suffix(".json")
        done = subprocess.run(
            [sys.executable, "-m", "traceguard.cli", "check", "--json", str(out), str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "COLUMNS": "200", "TRACEGUARD_CACHE_DIR": str(tmp_path / "cache")},
        )
        return done, json.loads(out.read_text())

    done, report = check(damaged)
    expected, baseline = check(plain)
    assert "Traceback" not in done.stderr and "panicked" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == expected.returncode == 1  # the capture's own failing check, not a crash
    assert {c["id"]: c["status"] for c in report["checks"]} == {c["id"]: c["status"] for c in baseline["checks"]}
    assert f"{replaced:,} text values (StringIds: {replaced:,}) held bytes that are not UTF-8" in " ".join(
        done.stderr.split()
    )
    assert report["ranks"][0]["gpu_to_cpu_offenders"]  # the table the panic was in
    _all_text_is_utf8(report)


# -- Kineto: names and args -------------------------------------------------------------------------

_SENTINEL = "\u0001NOT-UTF8\u0001"


def _strings_not_utf8(doc: object, every: int) -> int:
    """Mark every ``every``-th event name and string argument of the trace in place (not the
    categories and phases that say what an event is: those would change the trace, not its text)."""
    count = 0
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    for event in events:
        if not isinstance(event, dict):
            continue
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        for node, key in [(event, "name"), *((args, k) for k in args)]:
            if isinstance(node.get(key), str):
                count += 1
                if count % every == 0:
                    node[key] += _SENTINEL
    return count


#: The fuzz suite's Kineto seeds: ROCm, a 128-rank job's rank, NCCL collectives with sizes.
KINETO = [p for p in PUBLIC_KINETO if any(seed in p.name for seed in ("mi250", "sampled_rank-0", "nccl_data"))]


@pytest.mark.parametrize("form", ["raw_bytes", "lone_surrogates"])
@pytest.mark.parametrize("trace", KINETO, ids=lambda p: p.name.split("__")[-1].removesuffix(".json.gz")[:40])
def test_kineto_strings_not_utf8_are_analysed(trace: Path, form: str, tmp_path: Path) -> None:
    """Bytes that are not UTF-8 (a damaged file) or escaped lone surrogates (Python's json.dumps of a
    string decoded with surrogateescape) in a third of the names and args: the trace was refused
    whole; now it is analysed as the undamaged one is, with U+FFFD in those strings and a note."""
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    _strings_not_utf8(doc, 3)
    text = json.dumps(doc).encode()
    bad = b"\xff\xfe" if form == "raw_bytes" else b"\\udcff"
    damaged = tmp_path / trace.name.removesuffix(".gz")
    damaged.write_bytes(text.replace(json.dumps(_SENTINEL)[1:-1].encode(), bad))
    capture = read_capture(damaged)
    assert any("not UTF-8" in note for note in capture.info.notes), capture.info.notes
    report = analyze([str(damaged)], scheduler="serial").report
    baseline = analyze([str(trace)], scheduler="serial").report
    assert report["inputs"][0]["error"] is None
    _all_text_is_utf8(report)
    for render in (markdown.render, html.render, junit.render):
        render(report).encode("utf-8")
    assert [r["metrics"]["gpu_ops"] for r in report["ranks"]] == [r["metrics"]["gpu_ops"] for r in baseline["ranks"]]


def test_the_sliced_read_says_the_same_as_the_whole_read(tmp_path: Path) -> None:
    """An export read in time slices (larger than memory) decodes its text the same way: the same
    notes and the same report as the whole read."""
    from traceguard.ingest.nsys_slices import open_sliced
    from traceguard.ingest.nsys_sqlite import read_nsys_sqlite

    damaged = tmp_path / "cap_0.sqlite"
    _damaged(OWN / "sweep_h200" / "cpu_staged" / "cap_0.sqlite.gz", damaged, "replaced", every=3)
    whole = read_nsys_sqlite(damaged, launches_only=True, keep_correlation=False)
    with open_sliced(damaged) as sliced:
        small = sliced.small_capture()
    assert small.info.notes == whole.info.notes and any("not UTF-8" in n for n in whole.info.notes)
    assert small.strings.equals(whole.strings) and small.ranges.equals(whole.ranges)
    by_slices = analyze([str(damaged)], scheduler="serial", sliced_above=1).report
    by_whole = analyze([str(damaged)], scheduler="serial").report
    assert by_slices["ranks"] == by_whole["ranks"] and by_slices["inputs"] == by_whole["inputs"]
