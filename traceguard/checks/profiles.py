"""Checklist profiles: TOML files with rule thresholds, merged rule by rule through ``extends``.

Thresholds live here and only here. A profile is looked up by name in ``$TRACEGUARD_PROFILES``
(if set), the repository's ``profiles/`` and the copy packaged with the wheel, or given as a path.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceguard.errors import ProfileError
from traceguard.metrics.steps import validate_patterns

DEFAULT_PROFILE = "production"
_OPS = (">", ">=", "<", "<=")


#: Numeric rule parameters a profile may set besides the bounds (hardware facts, not bounds).
PARAMS = (
    "peak_busbw_gbps",
    "rated_pcie_gbps",
    "expect_gpu",
    "small_bytes",
    "capture_pcie_share",
    "capture_nvlink_share",
    "inspector_window_s",
)
#: Keys that start so are a rule's minimum evidence (``min_steps``, ``min_bytes_per_step``...):
#: below the floor the rule is ``skip``. Which floors a rule has is the rule's own declaration
#: (``traceguard.checks.rules``); ``validate_profile`` rejects the rest.
FLOOR_PREFIX = "min_"


@dataclass(frozen=True)
class RuleConfig:
    enabled: bool = True
    op: str = ">"
    warn: float | None = None
    fail: float | None = None
    params: dict[str, float] = field(default_factory=dict)
    #: Minimum evidence: ``min_*`` key → floor (DESIGN.md, "Minimum evidence").
    minimum: dict[str, float] = field(default_factory=dict)


@dataclass
class Profile:
    name: str
    description: str = ""
    chain: list[str] = field(default_factory=list)  # this profile, then what it extends
    step_patterns: list[str] = field(default_factory=list)
    rules: dict[str, RuleConfig] = field(default_factory=dict)
    path: str | None = None

    def rule(self, rule_id: str) -> RuleConfig | None:
        return self.rules.get(rule_id)


def search_dirs() -> list[Path]:
    dirs = []
    if env := os.environ.get("TRACEGUARD_PROFILES"):
        dirs.append(Path(env))
    package = Path(__file__).resolve().parents[1]
    dirs += [package.parent / "profiles", package / "_profiles"]
    return [d for d in dirs if d.is_dir()]


def available() -> dict[str, Path]:
    """Profile name → file, first directory wins."""
    found: dict[str, Path] = {}
    for directory in search_dirs():
        for path in sorted(directory.glob("*.toml")):
            found.setdefault(path.stem, path)
    return found


def _locate(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" and candidate.is_file():
        return candidate
    profiles = available()
    if name_or_path in profiles:
        return profiles[name_or_path]
    raise ProfileError(
        f"unknown profile {name_or_path!r}",
        hint=f"choose one of {', '.join(sorted(profiles)) or '(none found)'} or give a .toml path",
    )


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ProfileError(f"profile {path} is not valid TOML: {exc}") from exc


def load_profile(name_or_path: str = DEFAULT_PROFILE) -> Profile:
    """Load a profile and everything it extends; child rule keys override the parent's."""
    chain: list[tuple[str, dict[str, Any], Path]] = []
    seen: set[Path] = set()
    current: str | None = name_or_path
    while current:
        try:
            path = _locate(current).resolve()
        except ProfileError as exc:
            if chain:  # a name in `extends`: say which profile names it
                exc.message = f"profile {chain[-1][2]}: `extends`: {exc.message}"
            raise
        if path in seen:
            raise ProfileError(f"profile {name_or_path!r}: `extends` loops back to {path.name}")
        seen.add(path)
        doc = _read(path)
        chain.append((doc.get("name", path.stem), doc, path))
        parent = doc.get("extends")
        if parent is not None and not isinstance(parent, str):
            raise ProfileError(f"profile {path}: `extends` must be a profile name")
        current = parent
    merged_rules: dict[str, dict[str, Any]] = {}
    patterns: list[str] = []
    for _, doc, path in reversed(chain):
        rules = doc.get("rules", {})
        if not isinstance(rules, dict):
            raise ProfileError(f"profile {path}: [rules] must be a table of rule tables")
        for rule_id, settings in rules.items():
            if not isinstance(settings, dict):
                raise ProfileError(f"profile {path}: [rules.{rule_id}] must be a table")
            merged_rules.setdefault(rule_id, {}).update(settings)
        if "steps" in doc:
            raise ProfileError(
                f"profile {path}: the [steps] table was replaced by a top-level `step_patterns = [...]` list",
                hint="known training-loop markers (Batch N, ProfilerStep#N, ...) need no pattern any more",
            )
        if "step_patterns" in doc:
            given = doc["step_patterns"]
            if not isinstance(given, list) or not all(isinstance(p, str) for p in given):
                raise ProfileError(f"profile {path}: `step_patterns` must be a list of regular expressions")
            try:
                validate_patterns(given)
            except ValueError as exc:
                raise ProfileError(f"profile {path}: step pattern {exc}") from None
            patterns = list(given)
    name, top, top_path = chain[0]
    return Profile(
        name=name,
        description=str(top.get("description", "")),
        chain=[n for n, _, _ in chain],
        step_patterns=patterns,
        rules={rule_id: _rule(rule_id, s, top_path) for rule_id, s in merged_rules.items()},
        path=str(top_path),
    )


def _rule(rule_id: str, settings: dict[str, Any], path: Path) -> RuleConfig:
    unknown = {k for k in settings if not k.startswith(FLOOR_PREFIX)} - {"enabled", "op", "warn", "fail", *PARAMS}
    if unknown:
        raise ProfileError(f"profile {path}: [rules.{rule_id}] has unknown keys {sorted(unknown)}")
    op = settings.get("op", ">")
    if op not in _OPS:
        raise ProfileError(f"profile {path}: [rules.{rule_id}] op must be one of {_OPS}, not {op!r}")
    bounds = {}
    for key in ("warn", "fail"):
        value = settings.get(key)
        if value is not None and not isinstance(value, int | float):
            raise ProfileError(f"profile {path}: [rules.{rule_id}] {key} must be a number")
        bounds[key] = float(value) if value is not None else None
    params = {}
    for key in PARAMS:
        if key in settings:
            if not isinstance(settings[key], int | float):  # bool is an int: expect_gpu = false
                raise ProfileError(f"profile {path}: [rules.{rule_id}] {key} must be a number or boolean")
            params[key] = float(settings[key])
    minimum = {}
    for key in sorted(k for k in settings if k.startswith(FLOOR_PREFIX)):
        value = settings[key]
        # bool is an int in Python: `min_steps = true` is a typo, not a floor of 1.
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ProfileError(f"profile {path}: [rules.{rule_id}] {key} must be a number >= 0, not {value!r}")
        minimum[key] = float(value)
    return RuleConfig(enabled=bool(settings.get("enabled", True)), op=op, params=params, minimum=minimum, **bounds)
