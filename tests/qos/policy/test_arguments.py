"""Policy constructors refuse arguments out of range, naming them."""

from __future__ import annotations

import math

import pytest

from qos.fairness import VirtualTokenCounter
from qos.policy.andes import Andes
from qos.policy.round_robin import RoundRobin
from tests.support.policy import FAST


# -- constructor validation -------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: RoundRobin(interval=0), "interval"),
        (lambda: Andes(FAST, objective="fastest"), "objective"),
        (lambda: Andes(FAST, qoe="linear"), "qoe"),
        (lambda: Andes(FAST, kv_watermark=0.0), "kv_watermark"),
        (lambda: Andes(FAST, kv_watermark=1.5), "kv_watermark"),
        (lambda: Andes(FAST, kv_watermark=math.nan), "kv_watermark"),
        (lambda: Andes(FAST, preemption_cap=-1.0), "preemption_cap"),
        (lambda: Andes(FAST, batch_candidates=0), "batch_candidates"),
        (lambda: Andes(FAST, fair_share_slack=-1.0), "fair_share_slack"),
        (lambda: Andes(FAST, fair_share_slack=math.nan), "fair_share_slack"),
    ],
)
def test_invalid_constructor_arguments_raise_value_error_naming_them(make, argument):
    with pytest.raises(ValueError, match=argument):
        make()


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: Andes(FAST, horizon_s=0.0), "horizon_s"),
        (lambda: Andes(FAST, horizon_s=-5.0), "horizon_s"),
        (lambda: VirtualTokenCounter(w_prompt=-1.0), "w_prompt"),
        (lambda: VirtualTokenCounter(w_output=0.0), "w_output"),
    ],
)
def test_unvalidated_constructor_arguments(make, argument):
    """Regression: these constructors accept nonsense silently (a horizon at or before now makes
    every gain 0; a non-positive VTC weight makes service lower a counter)."""
    with pytest.raises(ValueError, match=argument):
        make()
