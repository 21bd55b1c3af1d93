"""`GET /v1/profiles` carries every rule's bounds, parameters and minimum evidence."""

from __future__ import annotations

from tests.service.conftest import Api
from traceguard.checks.profiles import load_profile


def test_profiles_route_has_the_floors(api: Api) -> None:
    profiles = {p["name"]: p for p in api.get("/v1/profiles").json()}
    production = load_profile("production")
    for rule_id, rule in production.rules.items():
        served = profiles["production"]["rules"][rule_id]
        assert {k: served[k] for k in rule.minimum} == rule.minimum
        assert (served["warn"], served["fail"]) == (rule.warn, rule.fail)
