"""`traceguard profiles` shows each rule's minimum evidence, and errors keep their bracketed text
(a profile error names `[rules.x]`, which Rich would otherwise take for markup and drop)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from traceguard.checks.profiles import load_profile


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traceguard.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"},
    )


def test_profiles_lists_the_floors() -> None:
    listing = _cli("profiles")
    assert listing.returncode == 0, listing.stderr
    production = load_profile("production")
    for rule_id, rule in production.rules.items():
        for key in rule.minimum:
            assert key in listing.stdout, (rule_id, key)
    assert "min_bytes_per_step = 1,048,576" in listing.stdout


def test_profile_error_keeps_the_rule_table_name(tmp_path: Path) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text('name = "typo"\nextends = "production"\n[rules.allreduce_latency]\nmin_sizez = 3\n')
    result = _cli("analyze", str(tmp_path), "--profile", str(typo))
    assert result.returncode == 2
    said = " ".join(result.stderr.split())
    assert "[rules.allreduce_latency] has unknown floor(s) min_sizez" in said, said
