"""The classes benchmark's configurations are the shipped preset with its parts taken away: each one builds,
and each takes away what it says."""

from __future__ import annotations

import pytest

from gateway.config.policy import parse_policy_text
from gateway.core.types import InstanceClass
from gateway.sched.plugins import default_registry
from gateway.sched.plugins.placement.instance_class import InstanceClassFilter
from loadgen.bench.scheduling.classes import CONFIGS, policy_text


def _class_filter(config: str) -> InstanceClassFilter | None:
    pol = parse_policy_text(policy_text(config), f"{config}.toml", default_registry())
    found = [f for f in pol.profile.filters if isinstance(f, InstanceClassFilter)]
    return found[0] if found else None


@pytest.mark.parametrize("config", CONFIGS)
def test_every_configuration_builds(config: str) -> None:
    parse_policy_text(policy_text(config), f"{config}.toml", default_registry())


@pytest.mark.parametrize(
    ("config", "borrows", "reserve", "by_class"),
    [
        pytest.param("d-berth", True, True, True, id="berth"),
        pytest.param("e-no-borrow", False, False, False, id="no-borrow"),
        pytest.param("f-no-reserve", True, False, True, id="no-reserve"),
    ],
)
def test_variants_take_away_what_they_say(config: str, borrows: bool, reserve: bool, by_class: bool) -> None:
    text = policy_text(config)
    filt = _class_filter(config)
    assert filt is not None
    assert (InstanceClass.INTERACTIVE in filt._order[filt._slo.class_of("batch").kind]) is borrows
    assert ("reserve = {" in text) is reserve
    assert ("by_class = true" in text) is by_class
