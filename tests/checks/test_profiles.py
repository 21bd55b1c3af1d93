"""Checklist profiles: every shipped profile loads, ``extends`` merges rule by rule, production
carries DESIGN.md's bounds, and malformed profiles fail with a ProfileError that says what to fix.

Expected values are DESIGN.md's table (written out below) and the TOML files read with
``tomllib``, never the loader's own output.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO
from traceguard.checks.profiles import DEFAULT_PROFILE, available, load_profile
from traceguard.checks.rules import CAPTURE_HEALTH, RULES
from traceguard.errors import ProfileError

PROFILES = REPO / "profiles"
SHIPPED = sorted(PROFILES.glob("*.toml"))

#: DESIGN.md "Checks and profiles", production defaults for the rules traceguard implements:
#: rule → (op, warn, fail).
DESIGN_PRODUCTION = {
    "gpu_to_cpu_copy_rate": (">=", 0.0005, 0.001),
    "dtod_copy_volume": (">=", 0.5, 1.0),
    "nccl_step_share": (">", 0.20, 0.35),
    "pageable_host_copies": (">", 0.0, 0.5),
    "homogeneous_gpus": (">", None, 1.0),
    "straggler": (">", 0.05, 0.15),
}
#: The shipped profiles add no step pattern: known markers are conventions (metrics/steps.py).
DESIGN_STEP_PATTERNS: list[str] = []


def _toml(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_profile_loads_by_name_and_by_path(path: Path) -> None:
    by_name = load_profile(path.stem)
    by_path = load_profile(str(path))
    doc = _toml(path)
    assert by_name.name == doc.get("name", path.stem) == path.stem
    assert by_name.description == doc["description"]
    assert by_name.rules == by_path.rules
    assert by_name.step_patterns == DESIGN_STEP_PATTERNS  # all inherit production's step patterns
    # Every rule a profile names is one traceguard implements: a typo would silently do nothing.
    assert set(by_name.rules) <= set(RULES) | {CAPTURE_HEALTH}
    for rule_id, rule in by_name.rules.items():
        assert rule.op in (">", ">=", "<", "<="), rule_id
        if rule.warn is not None and rule.fail is not None:
            # The fail bound is at least as bad as the warn bound on the op's bad side.
            assert rule.fail >= rule.warn if rule.op.startswith(">") else rule.fail <= rule.warn, rule_id


def test_available_finds_every_file_in_profiles() -> None:
    names = available()
    assert {p.stem for p in SHIPPED} <= set(names)
    assert DEFAULT_PROFILE == "production" and "production" in names


def test_production_carries_design_bounds() -> None:
    production = load_profile("production")
    assert production.chain == ["production"]
    for rule_id, (op, warn, fail) in DESIGN_PRODUCTION.items():
        rule = production.rules[rule_id]
        assert (rule.op, rule.warn, rule.fail) == (op, warn, fail), rule_id
        assert rule.enabled, rule_id
    # The file itself, read with tomllib, says the same (no default filled in silently).
    raw = _toml(PROFILES / "production.toml")["rules"]
    for rule_id, (op, warn, fail) in DESIGN_PRODUCTION.items():
        assert raw[rule_id]["op"] == op
        assert raw[rule_id].get("warn") == warn
        assert raw[rule_id]["fail"] == fail
    assert production.rules[CAPTURE_HEALTH].enabled
    assert production.step_patterns == DESIGN_STEP_PATTERNS


def test_h200_nvlink_overrides_nccl_bounds_and_keeps_the_rest_of_production() -> None:
    h200, production = load_profile("h200-nvlink"), load_profile("production")
    own = _toml(PROFILES / "h200-nvlink.toml")
    assert own["extends"] == "production"
    assert h200.chain == ["h200-nvlink", "production"]
    nccl, base = h200.rules["nccl_step_share"], production.rules["nccl_step_share"]
    stated = own["rules"]["nccl_step_share"]
    assert (nccl.warn, nccl.fail) == (stated["warn"], stated["fail"])
    assert (nccl.warn, nccl.fail) != (base.warn, base.fail)
    assert "op" not in stated and nccl.op == base.op  # not restated, inherited
    overridden = set(own["rules"])
    for rule_id in overridden:  # every rule the file states takes its bounds, the rest inherit
        stated_rule = own["rules"][rule_id]
        assert (h200.rules[rule_id].warn, h200.rules[rule_id].fail) == (stated_rule["warn"], stated_rule["fail"])
    others = set(production.rules) - overridden
    assert {k: h200.rules[k] for k in others} == {k: production.rules[k] for k in others}
    assert set(h200.rules) == set(production.rules)
    assert h200.step_patterns == production.step_patterns


def test_ci_cpu_disables_homogeneous_gpus_but_keeps_its_bounds() -> None:
    ci, production = load_profile("ci-cpu"), load_profile("production")
    assert not ci.rules["homogeneous_gpus"].enabled
    assert ci.rules["homogeneous_gpus"].fail == production.rules["homogeneous_gpus"].fail
    own = _toml(PROFILES / "ci-cpu.toml")["rules"]["straggler"]
    assert (ci.rules["straggler"].warn, ci.rules["straggler"].fail) == (own["warn"], own["fail"])


def test_extends_merges_key_by_key_within_a_rule(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "team",
        'extends = "production"\ndescription = "team"\n[rules.straggler]\nwarn = 0.1\n',
    )
    team = load_profile(str(path))
    assert team.name == "team"  # no `name` key: the file stem
    assert team.chain == ["team", "production"]
    assert team.rules["straggler"].warn == 0.1
    assert team.rules["straggler"].fail == DESIGN_PRODUCTION["straggler"][2]  # inherited
    assert team.rules["straggler"].op == ">"


def test_child_step_patterns_replace_the_parents(tmp_path: Path) -> None:
    path = _write(tmp_path, "steps", "extends = \"production\"\nstep_patterns = ['^train_step_\\d+$']\n")
    assert load_profile(str(path)).step_patterns == [r"^train_step_\d+$"]


def test_old_steps_table_and_bad_step_patterns_are_refused(tmp_path: Path) -> None:
    old = _write(tmp_path, "old", "extends = \"production\"\n[steps]\npatterns = ['^x$']\n")
    with pytest.raises(ProfileError, match="step_patterns"):
        load_profile(str(old))
    bad = _write(tmp_path, "bad", "extends = \"production\"\nstep_patterns = ['(unclosed']\n")
    with pytest.raises(ProfileError, match=r"\(unclosed.*not a valid regular expression"):
        load_profile(str(bad))


def test_extends_by_path(tmp_path: Path) -> None:
    base = _write(tmp_path, "base", "[rules.straggler]\nwarn = 0.3\nfail = 0.6\n")
    child = _write(tmp_path, "child", f'extends = "{base}"\n[rules.straggler]\nfail = 0.9\n')
    profile = load_profile(str(child))
    assert profile.chain == ["child", "base"]
    assert (profile.rules["straggler"].warn, profile.rules["straggler"].fail) == (0.3, 0.9)


# ---------------------------------------------------------------- errors


def _error(name_or_path: str) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        load_profile(name_or_path)
    assert info.value.exit_code == 2 and info.value.code == "invalid_profile"
    return info.value


def test_unknown_profile_name_lists_the_choices() -> None:
    error = _error("no-such-profile")
    assert "no-such-profile" in error.message
    assert error.hint and all(p.stem in error.hint for p in SHIPPED)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken", "[rules.straggler\nwarn = \n")
    error = _error(str(path))
    assert str(path) in error.message and "TOML" in error.message


def test_extends_loop_is_detected(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text(f'extends = "{b}"\n')
    b.write_text(f'extends = "{a}"\n')
    error = _error(str(a))
    assert "loops" in error.message and "a.toml" in error.message


def test_profile_extending_itself_is_a_loop(tmp_path: Path) -> None:
    me = tmp_path / "me.toml"
    me.write_text(f'extends = "{me}"\n')
    assert "loops" in _error(str(me)).message


def test_extends_an_unknown_parent(tmp_path: Path) -> None:
    path = _write(tmp_path, "orphan", 'extends = "no-such-parent"\n')
    assert "no-such-parent" in _error(str(path)).message


def test_unknown_rule_key_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, "typo", 'extends = "production"\n[rules.straggler]\nthreshold = 0.1\n')
    error = _error(str(path))
    assert "threshold" in error.message and "straggler" in error.message


@pytest.mark.parametrize("op", ["=>", "==", "gt"])
def test_bad_op_lists_the_valid_ones(tmp_path: Path, op: str) -> None:
    path = _write(tmp_path, "badop", f'[rules.nccl_step_share]\nop = "{op}"\nwarn = 0.1\n')
    error = _error(str(path))
    assert repr(op) in error.message and "'>='" in error.message


def test_non_numeric_bound(tmp_path: Path) -> None:
    path = _write(tmp_path, "word", '[rules.nccl_step_share]\nwarn = "high"\n')
    error = _error(str(path))
    assert "warn" in error.message and "number" in error.message


@pytest.mark.parametrize(
    "text",
    ['rules = "all"\n', "[rules]\nstraggler = 0.1\n", "extends = 3\n"],
    ids=["rules-not-a-table", "rule-not-a-table", "extends-not-a-name"],
)
def test_malformed_structure(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, "shape", text)
    assert str(path) in _error(str(path)).message
