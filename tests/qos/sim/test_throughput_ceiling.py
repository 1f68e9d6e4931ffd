"""The engine's throughput ceiling (``bench/throughput_ceiling.py``) against the simulator:
no policy, pausing or preempting, streams faster than the batch bound, and a
scheduler that keeps the batch full comes close to it."""

from __future__ import annotations

import sys

import pytest

from qos.latency import get_profile
from qos.policy.registry import STOCK_POLICIES, make_policy
from qos.sim.engine import simulate
from qos.sim.workload import build_workload, load_andes_trace
from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from throughput_ceiling import ceiling, kv_batch

REPLIES = 2000


@pytest.mark.parametrize(
    ("profile_name", "rate"), [("llama-3.1-8b-h100", 400.0), ("opt-66b-4xa100", 400.0)]
)
@pytest.mark.parametrize("policy_name", ["fcfs", "andes-tp"])
def test_no_policy_streams_faster_than_the_batch_bound(
    profile_name: str, rate: float, policy_name: str
) -> None:
    profile = get_profile(profile_name)
    entries = load_andes_trace()[:REPLIES]
    workload = build_workload(entries, rate, n=REPLIES)  # all of it waiting within 5 s
    pause = policy_name not in STOCK_POLICIES
    result = simulate(workload, make_policy(policy_name, profile), profile, pause=pause)
    busy_s = float(result.iterations["duration"].sum())
    tokens_per_s = sum(r.output_tokens for r in result.requests) / busy_s
    bound = ceiling(profile, entries, profile.max_batch)
    assert tokens_per_s <= bound.tok_s
    if profile_name == "llama-3.1-8b-h100":  # the batch limit binds: within 15 %
        assert tokens_per_s >= 0.85 * bound.tok_s


def test_the_kv_bound_is_the_batch_bound_where_the_cache_does_not_bind() -> None:
    entries = load_andes_trace()
    llama, opt = get_profile("llama-3.1-8b-h100"), get_profile("opt-66b-4xa100")
    assert kv_batch(llama, entries) >= llama.max_batch
    assert kv_batch(opt, entries) < opt.max_batch
    kv_bound = ceiling(opt, entries, kv_batch(opt, entries))
    assert kv_bound.tok_s < ceiling(opt, entries, opt.max_batch).tok_s
