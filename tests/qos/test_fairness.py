"""The Virtual Token Counter (qos/fairness.py): service, weights, the counter lift."""

from __future__ import annotations

import pytest

from qos.fairness import W_OUTPUT, W_PROMPT, VirtualTokenCounter


# -- VirtualTokenCounter ----------------------------------------------------------------
def test_vtc_service_and_weights():
    assert (W_PROMPT, W_OUTPUT) == (1.0, 2.0)
    vtc = VirtualTokenCounter()
    assert vtc.service(100, 10) == 120.0
    vtc.charge("a", 1.0, prompt_tokens=100, output_tokens=10)
    vtc.charge("b", 2.0, prompt_tokens=100, output_tokens=10)
    vtc.charge("c", 4.0, output_tokens=8)
    assert vtc.counter("a") == 120.0
    assert vtc.counter("b") == 60.0
    assert vtc.counter("c") == 4.0
    assert vtc.counter("nobody") == 0.0
    custom = VirtualTokenCounter(w_prompt=0.5, w_output=3.0)
    assert custom.service(10, 10) == 35.0
    with pytest.raises(ValueError, match="weight"):
        vtc.charge("a", 0.0, prompt_tokens=1)


def test_vtc_lift_to_min_queued_counter_when_others_are_queued():
    vtc = VirtualTokenCounter()
    vtc.enqueue("a")
    vtc.enqueue("b")
    vtc.charge("a", 1.0, output_tokens=50)  # a: 100
    vtc.charge("b", 1.0, output_tokens=20)  # b: 40
    vtc.enqueue("c")  # new: lifted to min(100, 40)
    assert vtc.counter("c") == 40.0
    vtc.charge("d", 1.0, output_tokens=100)  # d: 200, idle
    vtc.enqueue("d")  # already above the floor: keeps its own
    assert vtc.counter("d") == 200.0


def test_vtc_lift_to_last_leaver_when_nobody_is_queued():
    vtc = VirtualTokenCounter()
    vtc.enqueue("a")
    vtc.enqueue("b")
    vtc.charge("a", 1.0, output_tokens=10)  # 20
    vtc.charge("b", 1.0, output_tokens=30)  # 60
    vtc.dequeue("b")
    vtc.dequeue("a")  # a leaves last
    assert vtc.last_left == "a"
    vtc.enqueue("c")
    assert vtc.counter("c") == 20.0  # a's counter, not b's 60


def test_vtc_no_lift_while_active():
    vtc = VirtualTokenCounter()
    vtc.enqueue("a")
    vtc.enqueue("b")
    vtc.charge("b", 1.0, output_tokens=50)  # b: 100, a: 0
    vtc.enqueue("a")  # a is active already: no lift
    assert vtc.counter("a") == 0.0
    assert vtc.queued["a"] == 2


def test_vtc_first_tenant_starts_at_zero_and_dequeue_underflow_errors():
    vtc = VirtualTokenCounter()
    vtc.enqueue("a")
    assert vtc.counter("a") == 0.0
    vtc.dequeue("a")
    with pytest.raises(ValueError, match="tenant"):
        vtc.dequeue("a")
    with pytest.raises(ValueError, match="tenant"):
        vtc.dequeue("never-seen")
    assert vtc.queued["a"] == 0
