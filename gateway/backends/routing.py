"""Routing: backend health, load, and the order in which backends are tried.

A backend's outstanding work is QLM's request waiting time estimate (Patke et al., §6,
Eq. 2; :func:`qos.queueing.request_waiting_time`): the output tokens still expected from
the requests already on that backend, divided by its token throughput Θ. A request's
expected output is its ``max_tokens`` capped by ``routing.expected_output_tokens``
(QLM uses the mean output length for the queue), and shrinks as its tokens stream back.

``routing.policy: cache_aware`` (the default) ranks the backends by the QoE of the
request's first token (:func:`qos.routing.cache_aware_order`), within a bound on each
backend's share of the requests in flight. It counts the prefill each backend saves with
what its prefix cache holds (this replica's estimate of the caches: a
:class:`~qos.prefix_cache.BlockLRU` per backend of the prompts sent there, read as
:mod:`gateway.backends.prefix` chains), and the prefills queued on it: a request's
uncached prompt tokens, from when it is sent until its first token comes back.
``least_waiting``: the least waiting time, then fewer requests in flight, then round
robin. Failover goes on in the ``least_waiting`` order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio

from gateway.backends import Backend, BackendError
from gateway.backends.prefix import PromptChain, prompt_chain, prompt_name
from gateway.config.schema import GatewayConfig
from gateway.context import RequestContext
from qos.prefix_cache import BlockLRU
from qos.queueing import request_waiting_time
from qos.routing import Candidate, PromptDemand, cache_aware_order, rendezvous_weight

log = logging.getLogger("tokenpace.gateway")


class Routed(NamedTuple):
    """A request as cache-aware routing reads it: its prompt, and what its reader expects
    (a named tuple: :class:`qos.routing.Candidate`'s note)."""

    prompt: PromptChain
    demand: PromptDemand


@dataclass(eq=False)
class BackendState:
    backend: Backend
    index: int
    throughput_tps: float
    cache: BlockLRU  # the prompt blocks this replica sent there, as an estimate of its cache
    healthy: bool = True
    saturated: bool = False  # the engine's own report: no room (Backend.saturated)
    in_flight: int = 0
    outstanding_tokens: int = 0
    last_error: str | None = None
    checked_at: float | None = None
    prompt_tokens: int = 0  # of the requests sent here (cache_aware), all together
    cached_tokens: int = 0  # ... of those, the estimate said the backend held
    queued_prefill_tokens: int = 0  # uncached prompt tokens of those before their first token

    @property
    def name(self) -> str:
        return self.backend.name

    def sent(self, prompt: PromptChain) -> int:
        """``prompt`` goes to this backend: count what it held, then hold it. Returns its
        tokens the backend did not hold: the prefill queued here until its first token."""
        self.prompt_tokens += prompt.tokens
        cached = prompt.tokens_of(self.cache.touch(prompt.blocks))
        self.cached_tokens += cached
        prefill = prompt.tokens - cached
        self.queued_prefill_tokens += prefill
        return prefill

    def waiting_time(self) -> float:
        return request_waiting_time(self.outstanding_tokens, self.throughput_tps)


@dataclass(eq=False)
class Lease:
    """A request's share of a backend's outstanding work; released exactly once.

    Owned by the request's admission ticket (:class:`gateway.admission.controller.Ticket`), which
    moves it with the store slot on failover.
    """

    state: BackendState
    remaining: int
    prompt: PromptChain | None = None  # cache_aware: sent on with the request on failover
    prefill: int = 0  # its prompt tokens the backend computes before its first token
    released: bool = field(default=False)

    def tokens(self, n: int) -> None:
        """``n`` more output tokens arrived: that much less work is outstanding, and the
        prefill is done."""
        if n <= 0 or self.released:
            return
        dec = min(n, self.remaining)
        self.remaining -= dec
        self.state.outstanding_tokens -= dec
        self._prefilled()

    def move(self, state: BackendState) -> None:
        """The request now runs on ``state``: its share of the work goes with it."""
        if self.released or state is self.state:
            return
        self._prefilled()
        self.state.in_flight -= 1
        self.state.outstanding_tokens -= self.remaining
        state.in_flight += 1
        state.outstanding_tokens += self.remaining
        self.state = state
        if self.prompt is not None:
            self.prefill = state.sent(self.prompt)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._prefilled()
        self.state.in_flight -= 1
        self.state.outstanding_tokens -= self.remaining
        self.remaining = 0

    def _prefilled(self) -> None:
        self.state.queued_prefill_tokens -= self.prefill
        self.prefill = 0


class Router:
    """Backend health, local load, and the order in which backends are tried."""

    def __init__(self, backends: Sequence[Backend], config: GatewayConfig) -> None:
        routing = config.routing
        self.states = [
            BackendState(
                b,
                i,
                b.throughput_tps or routing.throughput_tps,
                BlockLRU(routing.prefix_index_blocks),
            )
            for i, b in enumerate(backends)
        ]
        self._by_name = {s.name: s for s in self.states}
        # each backend's rendezvous key: its name's, the same at every gateway replica
        self._keys = [prompt_name(s.name) for s in self.states]
        self._rr = 0
        self._health = config.health
        self._routing = routing
        self.cache_aware = routing.policy == "cache_aware"

    def routed(self, body: dict[str, Any], ctx: RequestContext) -> Routed | None:
        """What cache-aware routing reads of a request: None under ``least_waiting``, and
        where one backend alone serves its model (there is no choice to make)."""
        if not self.cache_aware or sum(s.backend.serves(ctx.model) for s in self.states) < 2:
            return None
        prompt = prompt_chain(body, self._routing.prefix_block_chars)
        demand = PromptDemand(
            prompt_tokens=prompt.tokens,
            history_tokens=prompt.history_tokens,
            output_tokens=ctx.expected_tokens,
            ttft=ctx.tier.ttft,
            tds=ctx.tier.tds,
        )
        return Routed(prompt, demand)

    def model_cards(self) -> list[dict[str, Any]]:
        """``/v1/models`` entries: each named model once, described by its first backend."""
        seen: dict[str, dict[str, Any]] = {}
        for s in self.states:
            for m in s.backend.models:
                if m != "*" and m not in seen:
                    seen[m] = {**s.backend.model_card(m), "id": m}
        return list(seen.values())

    def state(self, name: str) -> BackendState:
        """The backend called ``name`` (KeyError if none is)."""
        return self._by_name[name]

    def knows_model(self, model: str) -> bool:
        return any(s.backend.serves(model) for s in self.states)

    def any_healthy(self) -> bool:
        return any(s.healthy for s in self.states)

    def serving(self, model: str) -> list[BackendState]:
        return [s for s in self.states if s.backend.serves(model)]

    def ranked(
        self, model: str, exclude: Iterable[str] = (), routed: Routed | None = None
    ) -> list[BackendState]:
        """The backends serving ``model`` outside ``exclude``, best first: the one order.

        With ``routed`` (``cache_aware``): :func:`qos.routing.cache_aware_order`. Without:
        healthy before unhealthy (tried only when no healthy one is left), then least
        waiting time, fewest in flight, round robin: from the backend after the last one
        chosen, one further at each call (concurrent arrivals, admitted before any of them
        is sent, spread over equals).
        """
        excluded = set(exclude)
        serving = [s for s in self.states if s.name not in excluded and s.backend.serves(model)]
        if routed is not None:
            return self._cache_aware(serving, routed)
        n, rr = len(self.states), self._rr
        self._rr = (rr + 1) % max(n, 1)
        return sorted(
            serving,
            key=lambda s: (not s.healthy, s.waiting_time(), s.in_flight, (s.index - rr) % n),
        )

    def _cache_aware(self, serving: list[BackendState], routed: Routed) -> list[BackendState]:
        prompt = routed.prompt
        matched = [s.cache.matched(prompt.blocks) for s in serving]
        candidates = [
            Candidate(
                healthy=s.healthy,
                decode_wait_s=s.waiting_time(),
                in_flight=s.in_flight,
                cached_tokens=prompt.tokens_of(m),
                prefill_tps=self._routing.prefill_tps,
                affinity=rendezvous_weight(prompt.anchor, self._keys[s.index]),
                holds_conversation=m > prompt.own_block,
                queued_prefill_tokens=s.queued_prefill_tokens,
            )
            for s, m in zip(serving, matched, strict=True)
        ]
        order = cache_aware_order(candidates, routed.demand, self._routing.load_factor)
        return [serving[i] for i in order]

    def choose(
        self, model: str, exclude: Collection[str] = (), prefer: str | None = None
    ) -> BackendState | None:
        """The backend for the next attempt, or None when every candidate was tried.

        ``prefer`` (the backend admission reserved a slot on) goes first when untried.
        """
        best = self._by_name.get(prefer) if prefer is not None else None
        if best is None or best.name in exclude or not best.backend.serves(model):
            ranked = self.ranked(model, exclude)
            best = ranked[0] if ranked else None
        if best is not None:
            self._rr = (best.index + 1) % len(self.states)  # round robin: start after it
        return best

    def acquire(
        self, state: BackendState, expected_tokens: int, routed: Routed | None = None
    ) -> Lease:
        state.in_flight += 1
        state.outstanding_tokens += expected_tokens
        if routed is None:
            return Lease(state, expected_tokens)
        return Lease(state, expected_tokens, routed.prompt, state.sent(routed.prompt))

    def report_failure(self, state: BackendState, exc: BackendError) -> None:
        state.last_error = exc.message
        if exc.unhealthy and state.healthy:
            state.healthy = False
            log.warning("backend %s marked unhealthy: %s", state.name, exc.message)

    async def check(self, state: BackendState) -> bool:
        try:
            with anyio.fail_after(self._health.timeout_s + 1.0):
                ok = bool(await state.backend.check_health())
        except Exception as exc:  # a broken health check is an unhealthy backend
            ok = False
            state.last_error = f"health check failed: {exc!r}"
        if ok != state.healthy:
            log.log(
                logging.INFO if ok else logging.WARNING,
                "backend %s is %s",
                state.name,
                "healthy" if ok else "unhealthy",
            )
        state.healthy = ok
        state.checked_at = time.monotonic()
        return ok

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(s) for s in self.states))

    async def capacity_loop(self, interval_s: float) -> None:
        """Poll the backends that report their capacity (vLLM's ``/metrics``)."""
        probed = [s for s in self.states if s.backend.probes_capacity]
        while probed:
            for state in probed:
                state.saturated = await state.backend.saturated()
            await asyncio.sleep(interval_s)

    async def health_loop(self) -> None:
        while True:
            await asyncio.sleep(self._health.interval_s)
            await self.check_all()
