"""Cache-aware routing's work per request stays within its budget.

Counted, not timed (:class:`tests.support.cost.CallCounter`: the Python and builtin
calls made under the gateway's functions), so the same numbers on any machine, however
loaded; ``bench/routing_cost.py`` and ``bench/gateway_load.py --routing`` time it. A
request is routed as admission routes it (``Router.routed``, ``Router.ranked``,
``Router.acquire``, the lease released), a later turn of a conversation whose earlier
turns the router's index holds. Its calls split into a part per prompt block (naming the
block), a part per backend (its index's bisection, its rendezvous weight and its place in
the order) and the rest.

The budgets are the counts of the code they were set on (Python 3.11) plus a margin, not
targets:

- per block, 3 calls: its name (``hash`` of the pair of the previous name and the
  block's text), the chain's ``append`` and the index's move of it to the freshest end
  (a block the index held; one it did not goes in at that end with no call).
  Naming it by a keyed BLAKE2b cost 4 (``digest`` and ``int.from_bytes`` in place of
  ``hash``) and about four times the CPU. No margin: a call more a block is a third more.
- per backend, 23 calls: whether it serves the model, its index's bisection, its
  waiting time, its rendezvous weight, its candidate and the QoE of its first token.
  The margin (4) is a small step, not a second pass over the index.
- the rest, 110 calls: the prompt's text and its token estimate (a few calls a message),
  the demand, the load bound, the order, the lease. The margin (15) is a few small
  steps, not a pass more over the messages.

A change that needs more raises the budget here, with ``bench/routing_cost.py``'s
figures beside it (docs/benchmarks/2026-12-06-routing.md). A call is not a fixed cost (a
frozen dataclass sets its fields with no counted call, at twice a plain one's CPU):
``bench/routing_instructions.py`` counts the instructions a request costs the gateway.
"""

from __future__ import annotations

from typing import Any

from gateway.backends.routing import Router
from tests.gateway.backends.test_cache_aware_routing import conversation, ctx, router
from tests.support.cost import CallCounter
from tests.support.fake_upstream import MODEL

CALLS_PER_BLOCK = 3
CALLS_PER_BACKEND = 27
CALLS_PER_REQUEST = 125


def calls(r: Router, body: dict[str, Any]) -> tuple[int, int]:
    """The calls routing ``body`` costs, and its prompt's blocks."""
    c = ctx()
    with CallCounter() as counter:
        routed = r.routed(body, c)
        r.acquire(r.ranked(MODEL, routed=routed)[0], 256, routed).release()
    assert routed is not None
    return counter.calls, len(routed.prompt.blocks)


def filled(backends: int) -> Router:
    r = router(backends)
    for n in range(50):
        for turns in (1, 2, 3):
            routed = r.routed(conversation(n, turns), ctx())
            r.acquire(r.ranked(MODEL, routed=routed)[0], 256, routed).release()
    return r


async def test_routing_a_turn_costs_a_few_calls_a_block_and_a_backend() -> None:
    two, eight = filled(2), filled(8)
    short, short_blocks = calls(two, conversation(7, 2))  # its blocks held (filled)
    # the same messages, a longer reply in the history: more blocks alone, held as well
    longer = conversation(7, 2, reply="Certainly. " * 300)
    calls(two, longer)
    long, long_blocks = calls(two, longer)
    wide, _ = calls(eight, conversation(7, 2))
    per_block = (long - short) / (long_blocks - short_blocks)
    per_backend = (wide - short) / 6
    rest = short - per_block * short_blocks - 2 * per_backend
    # the lower bounds: the hook saw the naming and the ranking at all
    assert long_blocks > short_blocks + 10
    assert 1 <= per_block <= CALLS_PER_BLOCK, (per_block, per_backend, rest)
    assert 5 <= per_backend <= CALLS_PER_BACKEND, (per_block, per_backend, rest)
    assert 50 <= rest <= CALLS_PER_REQUEST, (per_block, per_backend, rest)
