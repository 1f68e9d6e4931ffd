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
    assert shipped.guard is not None and shipped.preemption_cost == 4.0
    assert shipped.preemption_cap is None  # the guard decides who runs: no cap acts
    unguarded = make_policy("andes-tp-unguarded", FAST)
    assert (unguarded.preemption_cap, unguarded.wait_for_room) == (0.3, True)
    paper = make_policy("andes", FAST)
    assert (paper.preemption_cap, paper.preemption_cost) == (1.0, 0.0)
    with pytest.raises(ValueError, match="unknown 'lifo'; use one of fcfs, round-robin"):
        make_policy("lifo", FAST)


@pytest.mark.parametrize("option", [{"preemption_cap": 0.3}, {"wait_for_room": True}])
@pytest.mark.parametrize("name", ["andes-tp", "andes-tp-unweighted"])
def test_a_setting_the_guarded_policy_would_ignore_is_refused(name, option):
    """The cap and the claims act on the solver's preemptions; with the reader guard the
    guard decides who runs, so either would change nothing: refused, naming the
    policies where they act."""
    from qos.policy.registry import make_policy

    with pytest.raises(ValueError, match="andes-tp-unguarded") as refused:
        make_policy(name, FAST, **option)
    assert next(iter(option)) in str(refused.value)


def test_a_setting_the_named_policy_would_not_read_is_refused():
    """FCFS, round robin and VTC read no settings; the Andes policies without the reader
    guard read none of the guard's: each refused, naming the setting and where it acts."""
    from qos.policy.reader import GuardSettings
    from qos.policy.registry import make_policy

    for name in ("fcfs", "round-robin", "vtc"):
        with pytest.raises(ValueError, match=f"kv_watermark: policy '{name}' reads no settings"):
            make_policy(name, FAST, kv_watermark=0.9)
    for name in ("andes", "andes-p0.3", "andes-monotone", "andes-tp-unguarded"):
        with pytest.raises(ValueError, match="lend_after_s: the reader guard's settings") as err:
            make_policy(name, FAST, guard=GuardSettings(lend_after_s=10.0))
        assert "andes-tp, andes-tp-unweighted" in str(err.value)
    guarded = make_policy("andes-tp", FAST, guard=GuardSettings(lend_after_s=10.0))
    assert guarded.guard is not None and guarded.guard.settings.lend_after_s == 10.0


def test_the_policies_with_the_guard_and_with_andes_settings_are_named_rightly():
    from qos.policy.andes import Andes
    from qos.policy.registry import ANDES_POLICIES, GUARDED, POLICIES, make_policy

    for name in POLICIES:
        policy = make_policy(name, FAST)
        assert isinstance(policy, Andes) == (name in ANDES_POLICIES), name
        assert (getattr(policy, "guard", None) is not None) == (name in GUARDED), name
