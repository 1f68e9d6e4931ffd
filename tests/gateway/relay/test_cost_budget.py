"""The gateway's work per relayed chunk and per request stays within its budget.

Counted, not timed (tests/support/cost.py): the calls made on the gateway's behalf (its
own functions and the libraries' work under them), with a ``sys.setprofile`` hook, and
the bytes its code keeps per chunk, with ``tracemalloc``; the same numbers on any
machine, however loaded, so this guards CI where the timing benchmark
(bench/gateway_load.py) cannot. The gateway runs on a real uvicorn in front of a real
loopback upstream that sends each chunk only once the client has read the previous one:
every chunk is a read, a batch and a write of its own, the most the relay does per chunk.

The budgets are the counts of the code they were set on (Python 3.11, the libraries in
constraints.txt) plus a margin, not targets:

- per chunk, 62 calls (62 in the relay of 2026-11-26 too): the upstream read (aiohttp),
  the SSE split, the chunk decoded and its tokens counted, the write to the client
  (uvicorn), the read deadline, the timing of its tokens and the resumption of each
  coroutine frame between the body's task and the read (the body runs in a task of its
  own, below none of the middlewares' frames).
  The margin (5) holds a per-chunk counter or check (a stream length cap is a
  comparison and an addition, no call; a bound on a stalled client's writes, a timer
  moved, a few calls); a metric observed or a label resolved per chunk costs 14 and does
  not fit: it belongs in the stream's state, summarised once at its end.
- per request, 2,417 calls: authentication, the body's parse and checks, admission, the
  backend's request (httpx, aiohttp), the response (one task for its body), the
  stream's teardown, and its QoE (replies_qoe) and record, measured and added to the
  store's aggregates alone (the flush loop measures and adds many at once: a batch's
  QoE costs about what one reply's does). 2,630 while FastAPI validated the body as a
  route parameter and the connection armed a timer per request; 2,955 before the body
  left sse-starlette's task group of three tasks; 2,754 on 2026-11-26, before the
  freezes, the idle latency and the store's aggregates. The margin (150) is a few small
  steps, not a store round trip, a second pass over the timeline or a task.
- the bytes kept per chunk in the middle of a stream: its emission time and token count
  (16 bytes in two arrays, grown in steps), nothing per chunk besides.

A change that needs more raises the budget here, with the benchmark's figures beside it
(docs/benchmarks/2026-12-06-gateway-cost.md).
"""

from __future__ import annotations

from tests.support.cost import LockstepUpstream, measure, retained_per_chunk
from tests.support.fake_upstream import MODEL
from tests.support.gateway import backend_entry, gateway, make_config
from tests.support.servers import run_server

CALLS_PER_CHUNK = 67
CALLS_PER_REQUEST = 2570
BYTES_KEPT_PER_CHUNK = 40

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def test_calls_and_bytes_per_chunk_and_per_request_within_budget():
    upstream = LockstepUpstream(MODEL)
    async with run_server(upstream) as url:
        config = make_config([backend_entry(url, "lockstep")])
        async with gateway(config) as gw, gw.client() as client:
            states = gw.state.router.states

            def done() -> bool:
                return all(s.in_flight == 0 and s.outstanding_tokens == 0 for s in states)

            cost = await measure(client, upstream, BODY, done, gw.state.telemetry.flush)
            kept = await retained_per_chunk(client, upstream, BODY)
    # the lower bounds: the hook saw the relay and the request path at all
    assert 30 <= cost.per_chunk <= CALLS_PER_CHUNK, cost
    assert 1000 <= cost.per_request <= CALLS_PER_REQUEST, cost
    assert 0 < kept <= BYTES_KEPT_PER_CHUNK, kept
