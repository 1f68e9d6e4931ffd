"""Several engine replicas behind a router, each with a prefix cache: a simulation.

Every replica is an :class:`~qos.sim.engine.Engine` (FCFS, vLLM's default order) whose
prefix cache is a :class:`~qos.prefix_cache.BlockLRU` of ``kv_capacity_tokens /
block_size`` blocks (vLLM keeps computed blocks until their room is needed; this counts
the running requests' blocks in the same budget, so it holds a little more than vLLM
would). At a request's first prefill the replica looks its prompt's blocks up, computes
only the part it does not hold (the latency profile's prefill cost of that part) and
holds the prompt; when the reply ends it holds the prompt and the reply.

The router sees what the gateway sees: the requests it sent and their tokens as they
stream back, never the replicas' caches. Policies (``routing``):

``round_robin``
    each replica in turn.
``least_waiting``
    the gateway's ``least_waiting``: the least waiting time (QLM's estimate, the output
    tokens expected from the replica's requests, ``expected_output`` each at most, over
    its throughput Θ), then fewest in flight, then round robin.
``cache_aware``
    the gateway's ``cache_aware`` (:func:`qos.routing.cache_aware_order`), with the
    router's own index of the prompts it sent (one :class:`BlockLRU` per replica, the
    size of the replica's cache) and, as the gateway, the prompt tokens it expected each
    replica to compute for the requests whose first token has not come. The
    conversation's identity is its number.

``gateways`` (cache_aware): that many gateway replicas, each with its own index, every
turn at one of them by a hash of the conversation and the turn's number (a load balancer
without session affinity): a later turn often comes to a router that never saw the
earlier ones. They all read the replicas' load as one (the real gateway replicas each see
only their own requests), so this measures what the split indexes cost, not split load.

Conversations run closed-loop (:mod:`qos.sim.conversations`): a turn's reply ends, the
user thinks, the next turn arrives. Events are processed in time order: an engine
iteration's tokens reach the router when the iteration ends. Block names are token
blocks here; the gateway's are character blocks of the prompt text (:mod:`gateway.backends.prefix`).
This is a simulation of GPU engines that are not here, and says so wherever it is used.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from qos.latency import LatencyProfile
from qos.policy.fcfs import FCFS
from qos.prefix_cache import BlockLRU
from qos.routing import Candidate, PromptDemand, cache_aware_order, rendezvous_weight, splitmix64
from qos.sim.conversations import Conversation, Turn
from qos.sim.engine import Engine, SimResult, StepResult
from qos.sim.workload import SimRequest

Routing = Literal["round_robin", "least_waiting", "cache_aware"]
ROUTINGS: tuple[Routing, ...] = ("round_robin", "least_waiting", "cache_aware")
EXPECTED_OUTPUT = 256  # the gateway's routing.expected_output_tokens default


def full_batch_throughput(profile: LatencyProfile) -> float:
    """Θ: output tokens/s of a replica's full decode batch."""
    return profile.max_batch / float(profile.decode_s(profile.max_batch))


def turn_seconds(profile: LatencyProfile, prompt_tokens: float, reply_tokens: float) -> float:
    """Engine seconds one turn takes: the prefill of ``prompt_tokens``, and its share of
    full decode batches for ``reply_tokens`` (the capacity the sweep's loads refer to)."""
    per_token = float(profile.decode_s(profile.max_batch)) / profile.max_batch
    return profile.prefill_s(max(round(prompt_tokens), 1)) + reply_tokens * per_token


@dataclass
class Replica:
    """One engine and what the router and the cache counted of it."""

    engine: Engine
    cache: BlockLRU  # what the engine holds
    busy: bool = False
    in_flight: int = 0
    outstanding: int = 0  # output tokens still expected (the router's estimate)
    queued_prefill: int = 0  # uncached prompt tokens before their first token (its estimate)
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # found in the cache at prefill
    busy_s: float = 0.0


@dataclass
class ClusterResult:
    """The replicas' requests together, and each replica's share."""

    routing: Routing
    result: SimResult
    replicas: list[Replica] = field(repr=False)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens found in a replica's cache over all prompt tokens."""
        prompt = sum(r.prompt_tokens for r in self.replicas)
        return sum(r.cached_tokens for r in self.replicas) / prompt if prompt else math.nan

    def steady(self, start: float, end: float) -> SimResult:
        """The requests that arrived in ``[start, end)`` (the steady state, past the
        ramp-up and before the drain), their output over ``end - start`` seconds."""
        r = self.result
        keep = (r.iterations["start"] >= start) & (r.iterations["start"] < end)
        return replace(
            r,
            requests=[q for q in r.requests if start <= q.arrival < end],
            iterations={k: v[keep] for k, v in r.iterations.items()},
            makespan=end - start,
        )

    def load_ratio(self) -> dict[str, float]:
        """Most loaded replica over the mean: by requests served and by engine time."""
        requests = np.asarray([r.requests for r in self.replicas], dtype=float)
        busy = np.asarray([r.busy_s for r in self.replicas], dtype=float)
        return {
            "requests": float(requests.max() / requests.mean()),
            "busy": float(busy.max() / busy.mean()),
        }


class ClusterSim:
    """``replicas`` engines of ``profile`` behind one router (the module docstring)."""

    def __init__(
        self,
        profile: LatencyProfile,
        replicas: int,
        routing: Routing,
        *,
        block_size: int = 16,
        load_factor: float = 1.25,
        gateways: int = 1,
    ) -> None:
        if routing not in ROUTINGS:
            raise ValueError(f"routing: one of {', '.join(ROUTINGS)}, got {routing!r}")
        if replicas < 1:
            raise ValueError(f"replicas: must be >= 1, got {replicas}")
        if gateways < 1:
            raise ValueError(f"gateways: must be >= 1, got {gateways}")
        self.profile = profile
        self.routing: Routing = routing
        self.block_size = block_size
        self.load_factor = load_factor
        self.theta = full_batch_throughput(profile)
        self.prefill_tps = 1.0 / profile.prefill_per_token_s
        blocks = profile.kv_capacity_tokens // block_size
        self.replicas = [
            Replica(
                Engine(
                    FCFS(),
                    profile,
                    block_size=block_size,
                    record=True,
                    cached_prefix=self._lookup(j),
                ),
                BlockLRU(blocks),
            )
            for j in range(replicas)
        ]
        # what each gateway replica's router thinks each engine holds
        self.indexes = [[BlockLRU(blocks) for _ in range(replicas)] for _ in range(gateways)]
        self._turns: dict[str, Turn] = {}
        self._remaining: dict[str, int] = {}  # output tokens still expected, per request
        self._prefill: dict[str, int] = {}  # the router's estimate of a request's prefill
        self._rr = 0
        self._ttft, self._tds = 1.0, 4.8  # the tier, set by :meth:`run`

    def _lookup(self, j: int) -> Callable[[SimRequest], int]:
        """Replica ``j``'s prefix cache, as its engine asks it at a first prefill."""

        def cached_prefix(request: SimRequest) -> int:
            replica = self.replicas[j]
            chain = self._turns[request.id].blocks(self.block_size)
            hit = min(replica.cache.touch(chain) * self.block_size, request.prompt_tokens)
            replica.prompt_tokens += request.prompt_tokens
            replica.cached_tokens += hit
            return hit

        return cached_prefix

    # -- routing ----------------------------------------------------------------------
    def route(self, turn: Turn) -> int:
        """The replica ``turn`` goes to."""
        n = len(self.replicas)
        if self.routing == "round_robin":
            choice = self._rr % n
        elif self.routing == "least_waiting":
            rr = self._rr
            choice = min(
                range(n),
                key=lambda j: (
                    self.replicas[j].outstanding / self.theta,
                    self.replicas[j].in_flight,
                    (j - rr) % n,
                ),
            )
        else:
            choice = self._cache_aware(turn)
        self._rr = choice + 1
        return choice

    def _cache_aware(self, turn: Turn) -> int:
        chain = turn.blocks(self.block_size)
        p = turn.prompt_tokens
        own_block = turn.system_tokens // self.block_size  # its first own block
        conversation = splitmix64(turn.conversation)  # its name, as the gateway's anchor
        gateway = splitmix64(conversation ^ turn.index) % len(self.indexes)
        index = self.indexes[gateway]
        matched = [held.matched(chain) for held in index]
        candidates = [
            Candidate(
                healthy=True,
                decode_wait_s=r.outstanding / self.theta,
                in_flight=r.in_flight,
                cached_tokens=min(m * self.block_size, p),
                prefill_tps=self.prefill_tps,
                affinity=rendezvous_weight(conversation, j),
                holds_conversation=m > own_block,
                queued_prefill_tokens=r.queued_prefill,
            )
            for j, (r, m) in enumerate(zip(self.replicas, matched, strict=True))
        ]
        history = turn.system_tokens + turn.history_tokens if turn.index else 0
        demand = PromptDemand(p, history, EXPECTED_OUTPUT, self._ttft, self._tds)
        choice = cache_aware_order(candidates, demand, self.load_factor)[0]
        self._prefill[turn.id] = p - candidates[choice].cached_tokens
        index[choice].touch(chain)
        return choice

    # -- the run ----------------------------------------------------------------------
    def run(self, conversations: list[Conversation], ttft: float, tds: float) -> ClusterResult:
        """Every turn of ``conversations``, closed-loop; the tier ``ttft``/``tds``."""
        self._ttft, self._tds = ttft, tds
        events: list[tuple[float, int, int, Turn | tuple[int, StepResult]]] = []
        seq = 0

        def push(t: float, payload: Turn | tuple[int, StepResult]) -> None:
            """Iterations end (0) before turns arrive (1) at the same time."""
            nonlocal seq
            heapq.heappush(events, (t, isinstance(payload, Turn), seq, payload))
            seq += 1

        by_id = {conv.id: conv for conv in conversations}
        for conv in conversations:
            push(conv.start, conv.turns[0])
        first = min((c.start for c in conversations), default=0.0)
        last_token = first
        while events:
            now, _, _, payload = heapq.heappop(events)
            if isinstance(payload, Turn):  # a turn arrives
                turn = payload
                j = self.route(turn)
                replica = self.replicas[j]
                self._turns[turn.id] = turn
                self._remaining[turn.id] = EXPECTED_OUTPUT
                replica.engine.submit(
                    SimRequest(turn.id, now, turn.prompt_tokens, turn.reply_tokens, ttft, tds)
                )
                replica.in_flight += 1
                replica.outstanding += EXPECTED_OUTPUT
                replica.queued_prefill += self._prefill.get(turn.id, 0)
                replica.requests += 1
            else:  # an iteration ended
                j, res = payload
                replica = self.replicas[j]
                replica.busy = False
                last_token = max(last_token, now)
                for rid, _, done in res.emitted:
                    replica.queued_prefill -= self._prefill.pop(rid, 0)
                    left = self._remaining[rid]
                    if done:
                        replica.in_flight -= 1
                        replica.outstanding -= left
                        self._finished(replica, rid, now, push, by_id)
                    elif left > 0:
                        self._remaining[rid] = left - 1
                        replica.outstanding -= 1
            self._kick(j, now, push)
        results = [r for rep in self.replicas for r in rep.engine.results]
        stats = [rep.engine.iteration_stats() for rep in self.replicas]
        iterations = {k: np.concatenate([s[k] for s in stats]) for k in stats[0]}
        eng = self.replicas[0].engine
        result = SimResult(
            policy=self.routing,
            profile=self.profile.name,
            preemption=eng.preemption,
            block_size=eng.block_size,
            kv_tokens=eng.kv_tokens,
            max_batch=eng.max_batch,
            requests=sorted(results, key=lambda r: r.arrival),
            unfinished=[],
            iterations=iterations,
            makespan=last_token - first,
        )
        return ClusterResult(self.routing, result, self.replicas)

    def _finished(
        self,
        replica: Replica,
        rid: str,
        now: float,
        push: Callable[[float, Turn | tuple[int, StepResult]], None],
        conversations: dict[int, Conversation],
    ) -> None:
        """Request ``rid`` ended on ``replica``: its prompt and reply are cached there, and
        its conversation's next turn comes after the user's think time."""
        turn = self._turns[rid]
        replica.cache.touch(turn.blocks(self.block_size, turn.prompt_tokens + turn.reply_tokens))
        del self._remaining[rid]
        conv = conversations[turn.conversation]
        if turn.index + 1 < len(conv.turns):
            push(now + turn.think_s, conv.turns[turn.index + 1])

    def _kick(
        self, j: int, now: float, push: Callable[[float, Turn | tuple[int, StepResult]], None]
    ) -> None:
        """Start replica ``j``'s next iteration at ``now`` if it is idle with work."""
        replica = self.replicas[j]
        engine = replica.engine
        if replica.busy or not engine.has_work():
            return
        res = engine.step(now)
        if res.batch_size == 0:
            raise RuntimeError(f"replica {j} ran nothing at t={now} with work waiting")
        replica.busy = True
        replica.busy_s += res.duration
        push(res.end, (j, res))
