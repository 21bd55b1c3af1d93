"""Measured figures in README.md and docs/ (issue 25): generated from the committed results files,
or dated with the commit they were measured at, so a reader can tell a current figure from an old
one (``bench/figures.py``)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import figures

#: A figure measured by hand says so in its sentence: "measured 2026-11-24 at 0aef7db".
DATED = re.compile(r"(?:measured |\()?\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2} UTC)?,? (?:at|git) [0-9a-f]{7}")
#: A quantity that reads as a measurement (time, size, ratio).
QUANTITY = re.compile(r"[~≈]?\b\d[\d,]*(?:\.\d+)?\s?(?:s|ms|µs|min|MB|GB|kB|×)(?!\w)")
#: Quantities in README that are settings or examples, not measurements.
NOT_MEASURED = {
    "900 s",  # TRACEGUARD_APT_LOCK_TIMEOUT's default
    "64 MB",  # the local scheduler's threshold
    "2000 MB",  # the published DDP study's bucket size
    "100 MB",  # its other bucket sizes
    "1 ms",  # a profile floor
    "50 GB",  # an example of a finding floor
    "100 µs",  # the clock residual above which the cross-rank split is not trusted (metrics.waits)
    "60 s",  # the NCCL Inspector analysis's default time window (inspector_window_s)
}


def test_every_figure_is_what_the_results_files_say() -> None:
    assert figures.stale() == [], "run `python bench/figures.py` and commit what it rewrote"


def test_the_documents_quote_generated_figures() -> None:
    readme = (REPO / "README.md").read_text()
    quoted = {m.group(1) for m in figures.MARKER.finditer(readme)}
    assert {"bench_10m", "bench_100m", "scale_out", "result_size", "sliced_peak"} <= quoted
    for name in quoted:
        text = figures.FIGURES[name]()
        assert re.search(r"\d", text), (name, text)
    # Each benchmark figure names its report, its date and its commit.
    assert re.search(r"`bench/RESULTS\.md`, \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC, git [0-9a-f]{7}", figures.bench_10m())


def test_a_figure_edited_by_hand_or_unknown_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    shutil.copyfile(REPO / "README.md", tmp_path / "README.md")
    text = (tmp_path / "README.md").read_text()
    edited = re.sub(r"(<!-- figure:bench_10m -->).*?(<!-- /figure -->)", r"\g<1>10 M kernels in 1 s\g<2>", text)
    (tmp_path / "README.md").write_text(edited)
    (tmp_path / "docs" / "x.md").write_text("a <!-- figure:no_such_figure -->1 s<!-- /figure --> b\n")
    found = figures.stale(tmp_path)
    assert any(f.startswith("README.md: bench_10m: '10 M kernels in 1 s'") for f in found), found
    assert "docs/x.md: unknown figure 'no_such_figure'" in found


def test_readme_quotes_no_measurement_without_its_date_and_commit() -> None:
    """Outside the generated figures, a time, size or ratio in README is a setting (listed above)
    or carries "measured <date> at <commit>" in its sentence."""
    text = (REPO / "README.md").read_text()
    text = figures.MARKER.sub("", text)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    undated = []
    for match in QUANTITY.finditer(text):
        if match.group() in NOT_MEASURED:
            continue
        sentence_end = min(
            (i for i in (text.find(". ", match.end()), text.find(".\n", match.end())) if i >= 0), default=len(text)
        )
        if not DATED.search(text[match.start() : sentence_end + 1]):
            line = text[: match.start()].count("\n") + 1
            undated.append(f"README line {line}: {match.group()!r}")
    assert undated == []


@pytest.mark.parametrize("document", ["docs/scale-out.md", "docs/reliability.md"])
def test_measurement_sections_of_the_docs_are_dated(document: str) -> None:
    """Every section of these pages that quotes measurements says when and at which commit."""
    text = (REPO / document).read_text()
    rendered, problems = figures.rendered(text)
    assert problems == []
    sections = re.split(r"\n(?=#{2,3} )", rendered)
    for section in sections:
        title = section.splitlines()[0]
        quantities = [m.group() for m in QUANTITY.finditer(re.sub(r"`[^`\n]*`", "", section))]
        measured = [q for q in quantities if re.search(r"[.,]\d|×", q)]  # decimals and ratios: measured values
        if len(measured) >= 3:
            assert DATED.search(section), f"{document}, {title!r}: {measured[:5]} without a date and commit"
