"""Policies by name (qos/policy/registry.py)."""

from __future__ import annotations

import pytest

from qos.policy.base import Policy
from tests.support.policy import FAST


def test_registry_builds_every_named_policy_and_names_the_choices():
    from qos.policy.registry import POLICIES, make_policy

    for name in POLICIES:
        assert isinstance(make_policy(name, FAST), Policy)
    shipped = make_policy("andes-tp", FAST)
    assert (shipped.preemption_cap, shipped.preemption_cost) == (0.3, 4.0)
    paper = make_policy("andes", FAST)
    assert (paper.preemption_cap, paper.preemption_cost) == (1.0, 0.0)
    with pytest.raises(ValueError, match="unknown 'lifo'; use one of fcfs, round-robin"):
        make_policy("lifo", FAST)
