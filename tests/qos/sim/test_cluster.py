"""Replicas with prefix caches behind a router: the simulator of cache-aware routing."""

from __future__ import annotations

import pytest

from qos.latency import get_profile
from qos.policy.fcfs import FCFS
from qos.sim.cluster import ClusterSim, turn_seconds
from qos.sim.conversations import ChatShape, build_conversations, mean_turn
from qos.sim.engine import Engine
from qos.sim.workload import SimRequest

PROFILE = get_profile("llama-3.1-8b-h100")
SHAPE = ChatShape(apps=2, turns=(3, 5), think_s=2.0)


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    asked: list[str] = []

    def cached(request: SimRequest) -> int:
        asked.append(request.id)
        return 10_000  # more than the prompt: all but one token is held

    engine = Engine(FCFS(), PROFILE, record=True, cached_prefix=cached)
    engine.submit(SimRequest("a", 0.0, 2000, 3, 1.0, 4.8))
    first = engine.step(0.0)
    assert first.prefill_tokens == 1 and asked == ["a"]
    bare = Engine(FCFS(), PROFILE)  # the same request without a cache
    bare.submit(SimRequest("a", 0.0, 2000, 3, 1.0, 4.8))
    assert bare.step(0.0).prefill_tokens == 2000
    while engine.has_work():
        engine.step(engine.clock)
    assert asked == ["a"]  # asked once, at the first prefill only


def test_turns_resend_their_history() -> None:
    convs = build_conversations(SHAPE, 20, 1.0, seed=3)
    assert convs == build_conversations(SHAPE, 20, 1.0, seed=3)  # deterministic
    for conv in convs:
        for before, after in zip(conv.turns, conv.turns[1:], strict=False):
            assert (
                after.history_tokens
                == before.history_tokens + before.user_tokens + before.reply_tokens
            )
            chain = before.blocks(16, before.prompt_tokens + before.reply_tokens)
            assert after.blocks(16)[: len(chain)] == chain  # the history's blocks, named alike
    one, other = convs[0].turns[0], next(c for c in convs if c.app == convs[0].app).turns[0]
    shared = SHAPE.system_tokens // 16
    assert one.blocks(16)[:shared] == other.blocks(16)[:shared]  # one system prompt per app
    prompt, beyond, reply = mean_turn(convs)
    assert prompt > beyond > 0 and reply > 0
    assert turn_seconds(PROFILE, beyond, reply) < turn_seconds(PROFILE, prompt, reply)


@pytest.fixture(scope="module")
def runs() -> dict[str, object]:
    capacity = 1.0 / turn_seconds(PROFILE, *mean_turn(build_conversations(SHAPE, 200, 1.0))[1:])
    rate = 0.7 * 2 * capacity / 4  # 70 % of two replicas, four turns a conversation
    convs = build_conversations(SHAPE, 60, rate, seed=5)
    return {
        routing: ClusterSim(PROFILE, 2, routing).run(convs, SHAPE.ttft, SHAPE.tds)  # type: ignore[arg-type]
        for routing in ("round_robin", "least_waiting", "cache_aware")
    }


def test_cache_aware_routing_finds_the_history_where_least_waiting_does_not(runs) -> None:
    rr, lw, ca = runs["round_robin"], runs["least_waiting"], runs["cache_aware"]
    n = sum(len(c.turns) for c in build_conversations(SHAPE, 60, 1.0, seed=5))
    for run in (rr, lw, ca):
        assert run.result.n_requests == n and not run.result.unfinished
        # every request's queued prefill was released at its first token
        assert all(r.queued_prefill == 0 and r.in_flight == 0 for r in run.replicas)
    assert ca.hit_rate > lw.hit_rate + 0.05 and ca.hit_rate > rr.hit_rate + 0.05
    assert ca.hit_rate > 0.9
    assert (
        ca.result.summary()["iterations"]["prefill_tokens"]
        < lw.result.summary()["iterations"]["prefill_tokens"]
    )
    assert max(ca.load_ratio().values()) <= 1.25


def test_every_turn_of_a_conversation_stays_on_one_replica(runs) -> None:
    ca = runs["cache_aware"]
    homes: dict[str, set[int]] = {}
    for j, replica in enumerate(ca.replicas):
        for r in replica.engine.results:
            homes.setdefault(r.id.split("-")[0], set()).add(j)
    moved = sum(len(h) > 1 for h in homes.values())
    assert moved <= 0.15 * len(homes)  # only the bounded-load fallbacks move (few in flight)


def test_unknown_routing_is_refused() -> None:
    with pytest.raises(ValueError, match="routing"):
        ClusterSim(PROFILE, 2, "random")  # type: ignore[arg-type]


def test_gateway_replicas_with_their_own_indexes_find_less_than_one() -> None:
    # chats without a shared system prompt: every first turn is cold and goes where it
    # starts soonest, so a second turn at the other gateway misses it
    shape = ChatShape(apps=2, turns=(3, 5), think_s=2.0, system_tokens=0)
    capacity = 1.0 / turn_seconds(PROFILE, *mean_turn(build_conversations(shape, 200, 1.0))[1:])
    convs = build_conversations(shape, 60, 0.7 * 4 * capacity / 4, seed=3)
    one, two = (
        ClusterSim(PROFILE, 4, "cache_aware", gateways=g).run(convs, shape.ttft, shape.tds)
        for g in (1, 2)
    )
    lw = ClusterSim(PROFILE, 4, "least_waiting").run(convs, shape.ttft, shape.tds)
    assert lw.hit_rate < two.hit_rate < one.hit_rate
    with pytest.raises(ValueError, match="gateways"):
        ClusterSim(PROFILE, 2, "cache_aware", gateways=0)
