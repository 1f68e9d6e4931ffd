"""Cache-aware routing: a conversation's turns go where its history is cached, within a
bound on each backend's load, the same at every gateway replica."""

from __future__ import annotations

import time
from typing import Any

import httpx

from gateway.backends import Backend
from gateway.backends.prefix import prompt_chain
from gateway.backends.routing import Router
from gateway.context import RequestContext, ResolvedTier
from qos.routing import Candidate, PromptDemand, cache_aware_order, delayed_start_qoe, load_bound
from tests.support.cluster import cluster_config, replicas
from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, backend_entry, gateway, make_config

SYSTEM = "You are a careful assistant for the accounts team. " * 40  # ~2,000 characters


class _Dummy(Backend):
    def __init__(self, name: str) -> None:
        self.name, self.models, self.throughput_tps = name, (MODEL,), None

    async def open_stream(self, endpoint, body, ctx):  # pragma: no cover - not called
        raise NotImplementedError

    async def complete(self, endpoint, body, ctx):  # pragma: no cover - not called
        raise NotImplementedError


def conversation(n: int, turns: int, reply: str = "Certainly. " * 30) -> dict[str, Any]:
    """Turn ``turns`` of conversation ``n``: the system prompt, the history, a new question."""
    messages: list[dict[str, str]] = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        if t:
            messages.append({"role": "assistant", "content": f"{reply} ({n}/{t})"})
        messages.append({"role": "user", "content": f"Conversation {n}, question {t}: " * 20})
    return {"model": MODEL, "messages": messages, "stream": True}


def ctx(tier: ResolvedTier | None = None, expected: int = 256) -> RequestContext:
    return RequestContext(
        request_id="r",
        tenant="acme",
        weight=1.0,
        tier=tier or ResolvedTier("chat", 1.0, 4.8, 1),
        endpoint="chat.completions",
        model=MODEL,
        stream=True,
        received_at=time.monotonic(),
        expected_tokens=expected,
    )


def router(n: int, **routing: Any) -> Router:
    return Router([_Dummy(f"b{i}") for i in range(n)], make_config([], routing=routing))


def send(r: Router, body: dict[str, Any], **kw: Any) -> str:
    """Route ``body`` as admission does (the first in order) and hold it there."""
    routed = r.routed(body, ctx(**kw))
    state = r.ranked(MODEL, routed=routed)[0]
    r.acquire(state, 256, routed)
    return state.name


# -- the prompt chain ---------------------------------------------------------------


def test_turns_of_a_conversation_share_their_history_and_name() -> None:
    one, two = prompt_chain(conversation(1, 1), 256), prompt_chain(conversation(1, 2), 256)
    other = prompt_chain(conversation(2, 2), 256)
    assert one.blocks and two.blocks[: len(one.blocks)] == one.blocks  # turn 1 is a prefix
    assert one.anchor == two.anchor != other.anchor  # the conversation's name stays
    # the history in tokens by chars/4, to the end of the last reply, not in whole blocks
    history = conversation(1, 2)["messages"][:3]
    chars = sum(len(f"{m['role']}:{m['content']}\x1e") for m in history)
    assert one.history_tokens == 0 and two.history_tokens == round(chars / 4)
    assert two.history_tokens > two.tokens_of(chars // 256)
    shared = len(SYSTEM) // 256  # the system prompt's whole blocks are shared
    assert two.blocks[:shared] == other.blocks[:shared]
    assert two.blocks[shared + 1] != other.blocks[shared + 1]
    assert two.tokens_of(len(two.blocks)) <= two.tokens
    # a completion prompt: named by its first block, no history
    text = {"model": MODEL, "prompt": "x" * 1000}
    chain = prompt_chain(text, 256)
    assert len(chain.blocks) == 3 and chain.history_tokens == 0
    assert chain.anchor == prompt_chain({"model": MODEL, "prompt": "x" * 256}, 256).anchor


# -- the order ----------------------------------------------------------------------


def test_qoe_of_a_late_first_token_follows_the_derivation() -> None:
    assert delayed_start_qoe(0.9, 1.0, 4.8, 100) == 1.0
    # 1 s late at 4.8 tokens/s over 96 tokens: 96 / (96 + 2 * 4.8 * 1) = 10/11
    assert abs(delayed_start_qoe(2.0, 1.0, 4.8, 96) - 96 / 105.6) < 1e-12
    assert delayed_start_qoe(3.0, 1.0, 4.8, 96) < delayed_start_qoe(2.0, 1.0, 4.8, 96)
    assert load_bound(0, 2, 1.25) == 1 and load_bound(7, 4, 1.25) == 3
    assert load_bound(3, 4, 1.0) == 1


def test_turn_two_goes_where_turn_one_was_served_even_when_it_is_busier() -> None:
    r = router(2)
    first = send(r, conversation(7, 1))
    other = next(s for s in r.states if s.name != first)
    # the other backend is idle; the cached one has one request of 0.256 s of work more,
    # well inside the chat tier's 1 s TTFT: the cache wins
    assert send(r, conversation(7, 2)) == first
    assert r.state(first).in_flight == 2 and other.in_flight == 0
    assert r.state(first).cached_tokens > 0.8 * prompt_chain(conversation(7, 1), 256).tokens


def test_a_cache_hit_is_not_worth_a_late_first_token() -> None:
    r = router(2, prefill_tps=1e9)  # prefill is free: a hit saves nothing
    first = send(r, conversation(3, 1))
    busy = r.state(first)
    busy.outstanding_tokens = 5000  # 5 s of queued work at 1000 tokens/s
    assert send(r, conversation(3, 2)) != first
    # with a slow prefill the 5 s wait is the better deal than recomputing the history
    slow = router(2, prefill_tps=50.0)
    first = send(slow, conversation(3, 1))
    slow.state(first).outstanding_tokens = 5000
    slow.state(first).queued_prefill_tokens = 0  # turn 1's first token came back
    assert send(slow, conversation(3, 2)) == first


def test_bounded_load_falls_back_from_a_hot_conversation() -> None:
    r = router(4, load_factor=1.25)
    for s in r.states:  # two requests of other conversations on each backend
        r.acquire(s, 256)
        r.acquire(s, 256)
    home = send(r, conversation(1, 1))
    placed = []
    for t in range(2, 14):  # a hot conversation: none of its turns finishes
        total = sum(s.in_flight for s in r.states)
        placed.append(send(r, conversation(1, t)))
        assert max(s.in_flight for s in r.states) <= load_bound(total, 4, 1.25)
    assert placed[0] == home  # within the bound it stays home
    assert len(set(placed)) > 1  # the overflow went elsewhere
    loads = [s.in_flight for s in r.states]
    assert max(loads) <= 1.25 * sum(loads) / 4 + 1
    # a backend a turn spilled to holds the history now: it is cached there too
    assert all(s.cached_tokens > 0 for s in r.states if s.name in placed[1:] and s.name != home)


def test_unhealthy_backends_come_last_and_the_order_is_the_rendezvous_one() -> None:
    demand = PromptDemand(1000, 0, 256, 1.0, 4.8)

    def cand(affinity: int, healthy: bool = True) -> Candidate:
        return Candidate(healthy, 0.0, 0, 0, 8000.0, affinity)

    assert cache_aware_order([cand(1), cand(3), cand(2)], demand, 1.25) == [1, 2, 0]
    assert cache_aware_order([cand(1), cand(3, False), cand(2)], demand, 1.25) == [2, 0, 1]
    assert cache_aware_order([], demand, 1.25) == []
    # the preferred backend is taken to hold the history: it wins over an equal one
    later = PromptDemand(1000, 800, 256, 0.1, 4.8)
    slow = [Candidate(True, 0.0, 0, 0, 1000.0, 5), Candidate(True, 0.0, 0, 0, 1000.0, 9)]
    assert cache_aware_order(slow, later, 1.25) == [1, 0]


def test_a_cold_prompt_goes_where_it_starts_soonest() -> None:
    # no history, nothing held anywhere: every replica meets the tier's TTFT and would
    # compute the whole prompt; the wait decides, then the requests in flight, as
    # least_waiting does, not the rendezvous weight
    demand = PromptDemand(1000, 0, 256, 1.0, 4.8)
    busy, idle = Candidate(True, 0.4, 2, 0, 8000.0, 9), Candidate(True, 0.1, 2, 0, 8000.0, 1)
    assert cache_aware_order([busy, idle], demand, 4.0) == [1, 0]
    fuller = Candidate(True, 0.1, 3, 0, 8000.0, 9)
    assert cache_aware_order([fuller, idle], demand, 4.0) == [1, 0]
    # a prompt held somewhere is not cold: the preferred replica keeps its turn
    warm = PromptDemand(1000, 600, 256, 1.0, 4.8)
    assert cache_aware_order([busy, idle], warm, 4.0) == [0, 1]
    # through the router: a single prompt skips its preferred backend when it is busier
    r = router(2)
    single = {"model": MODEL, "messages": [{"role": "user", "content": "one question " * 200}]}
    preferred, other = r.ranked(MODEL, routed=r.routed(single, ctx()))
    preferred.outstanding_tokens = 200  # 0.2 s of work: well inside the tier's TTFT
    assert r.ranked(MODEL, routed=r.routed(single, ctx()))[0] is other


def test_prefills_queued_on_a_backend_count_in_its_wait() -> None:
    # equal decode queues; 2,000 uncached prompt tokens wait on the first at 1,000
    # tokens/s: its wait is 2 s longer, for a cold prompt and for a late warm one alike
    queued = Candidate(True, 0.1, 1, 0, 1000.0, 9, queued_prefill_tokens=2000)
    free = Candidate(True, 0.1, 1, 0, 1000.0, 1)
    assert queued.wait_s == 2.1 and free.wait_s == 0.1
    assert cache_aware_order([queued, free], PromptDemand(500, 0, 256, 1.0, 4.8), 4.0) == [1, 0]
    assert cache_aware_order([queued, free], PromptDemand(1000, 600, 256, 1.0, 4.8), 4.0) == [
        1,
        0,
    ]
    # through the router: a request's uncached prompt waits on its backend until its
    # first token comes back, and moves with it on failover
    r = router(2)
    routed = r.routed(conversation(7, 1), ctx())
    first, second = r.ranked(MODEL, routed=routed)
    lease = r.acquire(first, 256, routed)
    assert first.queued_prefill_tokens == routed.prompt.tokens == lease.prefill
    lease.move(second)
    assert first.queued_prefill_tokens == 0 and second.queued_prefill_tokens == lease.prefill
    lease.tokens(1)
    assert second.queued_prefill_tokens == 0 == lease.prefill
    again = r.acquire(second, 256, r.routed(conversation(7, 1), ctx()))
    assert 0 <= second.queued_prefill_tokens == again.prefill < routed.prompt.tokens  # held
    again.release()
    assert second.queued_prefill_tokens == 0


def test_a_backend_known_to_hold_the_conversation_beats_the_one_assumed_to() -> None:
    # the preferred replica (weight 9) is only assumed to hold the 800 tokens of history;
    # the router's index holds 600 of them on the other, its own text included
    demand = PromptDemand(1000, 800, 256, 1.0, 4.8)
    assumed = Candidate(True, 0.0, 0, 0, 8000.0, 9)
    known = Candidate(True, 0.0, 0, 600, 8000.0, 1, holds_conversation=True)
    assert cache_aware_order([assumed, known], demand, 1.25) == [1, 0]
    # a replica holding only what many conversations share (a system prompt) is not known
    # to hold this one: the preferred replica keeps the turn
    shared = Candidate(True, 0.0, 0, 600, 8000.0, 1)
    assert cache_aware_order([assumed, shared], demand, 1.25) == [0, 1]
    # past the tier's TTFT, the preferred replica's shorter queue does not win the turn
    # on history it is only assumed to hold: there it would compute all 1,000 tokens
    # (1.0 s at 1,000 tokens/s, first token at 2.0 s), the known holder 200 (at 1.7 s)
    assumed = Candidate(True, 1.0, 0, 0, 1000.0, 9)
    known = Candidate(True, 1.5, 0, 600, 1000.0, 1, holds_conversation=True)
    assert cache_aware_order([assumed, known], demand, 1.25) == [1, 0]
    # with no replica known to hold the conversation, the assumption stands
    unknown = Candidate(True, 1.5, 0, 600, 1000.0, 1)
    assert cache_aware_order([assumed, unknown], demand, 1.25) == [0, 1]
    # through the router: turn 1 spills from its preferred backend past the load bound;
    # turn 2 goes where turn 1 was served, not back to the preferred one
    r = router(2, load_factor=1.0)
    preferred = r.ranked(MODEL, routed=r.routed(conversation(5, 1), ctx()))[0]
    other = r.acquire(preferred, 256)  # another conversation's request fills it
    routed = r.routed(conversation(5, 1), ctx())
    served = r.ranked(MODEL, routed=routed)[0]
    assert served is not preferred
    turn_one = r.acquire(served, 256, routed)
    other.release()
    turn_one.release()
    assert send(r, conversation(5, 2)) == served.name
    # the system prompt alone (another conversation's turn) does not count as the history
    assert prompt_chain(conversation(5, 2), 256).own_block == len(f"system:{SYSTEM}\x1e") // 256


def test_least_waiting_ignores_prompts_and_refuses_cache_keys() -> None:
    r = router(2, policy="least_waiting")
    assert r.routed(conversation(1, 2), ctx()) is None
    assert [send(r, conversation(1, t)) for t in (1, 2, 3, 4)] == ["b0", "b1", "b0", "b1"]
    try:
        make_config([], routing={"policy": "least_waiting", "load_factor": 2.0})
    except Exception as exc:
        assert "load_factor" in str(exc) and "cache_aware" in str(exc)
    else:  # pragma: no cover - the assertion's message
        raise AssertionError("a cache-aware key under least_waiting was accepted")


def test_single_prompts_spread_as_evenly_as_round_robin() -> None:
    r = router(4)
    for n in range(400):
        send(r, {"model": MODEL, "messages": [{"role": "user", "content": f"q{n} " * 300}]})
        if n % 4 == 3:  # requests finish as they come: the bound never binds
            for s in r.states:
                s.in_flight = s.outstanding_tokens = 0
    counts = sorted(s.cache.evictions + len(s.cache) for s in r.states)
    assert counts[0] > 0.7 * counts[-1]


# -- through the gateway ------------------------------------------------------------


async def test_two_gateway_replicas_send_a_conversation_to_the_same_backend(
    redis_server, key_prefix
) -> None:
    async with upstream(n_tokens=2, token_interval=0.001) as a, upstream(n_tokens=2) as b:
        config = cluster_config(
            a.url,
            [{"name": "acme", "api_keys": [KEY]}],
            redis_url=redis_server.url,
            prefix=key_prefix,
            backends=[backend_entry(a, "a"), backend_entry(b, "b")],
        )
        async with replicas(config) as (g0, g1), g0.client() as c0, g1.client() as c1:
            for n in range(12):
                for turn in range(1, 4):  # turns alternate between the replicas
                    client = c0 if turn % 2 else c1
                    body = {**conversation(n, turn), "stream": False}
                    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200

    def served(fake) -> dict[int, int]:
        seen: dict[int, int] = {}
        for body in fake.bodies:
            n = int(body["messages"][1]["content"].split()[1].rstrip(","))
            seen[n] = seen.get(n, 0) + 1
        return seen

    on_a, on_b = served(a), served(b)
    assert set(on_a) | set(on_b) == set(range(12))
    assert not set(on_a) & set(on_b)  # every conversation stayed on one backend
    assert on_a and on_b  # and the conversations spread over both


async def test_a_failed_preferred_backend_falls_over_as_before() -> None:
    async with upstream(n_tokens=2) as a, upstream(n_tokens=2) as b:
        config = make_config([backend_entry(a, "a"), backend_entry(b, "b")])
        async with gateway(config) as gw, gw.client() as client:
            body = conversation(5, 1)
            r1 = await client.post("/v1/chat/completions", json={**body, "stream": False})
            home, spare = (a, b) if a.bodies else (b, a)
            home.mode = "http_503"
            r2 = await client.post(
                "/v1/chat/completions", json={**conversation(5, 2), "stream": False}
            )
            assert (r1.status_code, r2.status_code) == (200, 200)
            assert len(spare.bodies) == 1 and len(home.bodies) == 2
            router = gw.state.router
            assert router.state("b" if spare is b else "a").cached_tokens == 0


async def test_estimated_hits_are_in_the_metrics() -> None:
    async with upstream(n_tokens=2) as a, upstream(n_tokens=2) as b:
        config = make_config([backend_entry(a, "a"), backend_entry(b, "b")])
        async with gateway(config) as gw, gw.client() as client:
            for turn in (1, 2):
                body = {**conversation(1, turn), "stream": False}
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
            text = (await httpx.AsyncClient(base_url=gw.url).get("/metrics")).text

    def total(series: str) -> float:
        return sum(float(x.split()[-1]) for x in text.splitlines() if x.startswith(series + "{"))

    prompt, cached = (
        total("tokenpace_backend_prompt_tokens"),
        total("tokenpace_backend_prefix_cached_tokens"),
    )
    assert prompt > 0 and cached > 0.3 * prompt  # turn 2 found turn 1 (half the prompts)


def test_one_backend_alone_leaves_the_prompt_unread() -> None:
    assert router(1).routed(conversation(1, 2), ctx()) is None  # no choice to make
    assert router(2).routed(conversation(1, 2), ctx()) is not None
