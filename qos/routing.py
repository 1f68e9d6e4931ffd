"""Which replica a request goes to, valued in what its reader experiences.

A replica that already holds the start of a prompt (its prefix cache) skips that part of
the prefill, so its first token comes sooner. For each candidate replica ``r``:

    TTFT_r = W_r + (p - h_r) / P_r,    W_r = O_r / Θ_r + F_r / P_r

with ``W_r`` the wait before it starts the request: the output tokens ``O_r`` still
expected from the requests on it over its token throughput ``Θ_r`` (QLM's request
waiting time, Patke et al. §6 Eq. 2), plus the prompt tokens ``F_r`` of those still
waiting for their first token and not held in its cache, over its prefill speed ``P_r``
(prompt tokens/s): a prefill queued ahead delays the request as much as its decode does,
and on an engine whose prefill is slow next to a decode step it is most of the wait.
``p`` is the prompt's tokens and ``h_r`` those of them ``r`` holds.

**Its QoE.** If the reply then streams at least at the reader's pace ``TDS``, every token
is read ``δ_r = (TTFT_r - TTFT_tier)⁺`` late, so the digestion deficit of the monotone QoE
(:func:`qos.metrics.monotone_qoe`, ``E / (E + deficit)`` with ``E = l² / (2·TDS)``) is
``l·δ_r`` for a reply of ``l`` tokens, and

    Q_r = l / (l + 2·TDS·δ_r)                                   (:func:`delayed_start_qoe`)

1 while the first token comes within the tier's TTFT, falling as it comes later, faster
for a short reply (a late start is a larger share of it) and a fast tier.

**The order** (:func:`cache_aware_order`):

1. healthy replicas first;
2. replicas within the load bound first: consistent hashing with bounded loads
   (Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads", 2018)
   lets no replica hold more than ``⌈c · (m + 1) / n⌉`` of the ``m + 1`` requests in
   flight (this one included) over ``n`` replicas, ``c = 1 + ε``, so a hot conversation
   or a shared system prompt cannot pile onto one replica;
3. the higher ``Q_r``: what the reader gets comes first. The wait ``W_r`` counts only
   here: a replica's queue matters when the reader would see it;
4. fewer uncached prompt tokens ``p - h_r``: where every candidate meets the tier's TTFT
   (all ``Q_r = 1``), the one that recomputes least, since a prefill is engine time taken
   from every other request on that replica (the cluster's throughput);
5. a replica the router *knows* holds the conversation (``holds_conversation``: its
   index holds the conversation's own text, so an earlier turn went there) before one
   only *assumed* to (the preferred replica, below): the assumption fails whenever an
   earlier turn went elsewhere;
6. for a *cold* prompt (no history, and no replica known to hold any of it: a single
   prompt), the shorter wait, then fewer requests in flight, as ``least_waiting``: no
   replica saves any prefill, so the one that starts it soonest is the best, and the
   rendezvous order would only spread cold prompts at random over idle and busy replicas;
7. the conversation's rendezvous order (highest random weight: Thaler and Ravishankar,
   "Using Name-Based Mappings to Increase Hit Rates", 1998): a hash of the conversation's
   identity and the replica's name, the same at every router without a word between
   them.

**Routers that never see each other's requests** (gateway replicas) agree through step
7 and one assumption: the *preferred* replica of a conversation, the first in rendezvous
order among the healthy ones within the load bound, is taken to hold the conversation's
history (``history_tokens``: what its earlier turns computed) and whatever prefix of the
prompt any replica holds (a shared system prompt: the preferred replica computes it once
and holds it from then on), as it does when every turn went there. So a router that
knows none of a conversation's earlier turns sends it to its preferred replica, unless
that replica is past the load bound or would start the reply late enough to cost QoE. A
replica this router knows holds the conversation (step 5) is taken to hold its history
(it computed the earlier turns' replies as well), and then the preferred one is not: it
counts only what the index says it holds, since this router saw the earlier turns go
elsewhere (a cold first turn, a turn past the load bound). Were both taken to hold the
history, the preferred one would win the turn whenever its queue were a little shorter,
and the turn would compute its whole history again. Otherwise the router's own index
(``h_r``) picks the fallback that holds the most, and the rendezvous order the rest. A
cold prompt goes where it starts soonest (step 6), not to its preferred replica: if its
next turn comes to another router, that router sends it to the preferred replica, which
holds nothing of it, and the turn is computed again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple


def delayed_start_qoe(
    ttft_s: float, expected_ttft: float, expected_tds: float, output_tokens: int
) -> float:
    """``Q = l / (l + 2·TDS·(TTFT - TTFT_expected)⁺)``: the monotone QoE of a reply of
    ``output_tokens`` whose first token comes at ``ttft_s`` and the rest at the reader's
    pace (the module docstring's derivation)."""
    late = ttft_s - expected_ttft
    if late <= 0:
        return 1.0
    n = max(output_tokens, 1)
    return n / (n + 2.0 * expected_tds * late)


def splitmix64(x: int) -> int:
    """SplitMix64's finaliser (Steele, Lea, Flood, "Fast Splittable Pseudorandom Number
    Generators", 2014): a well-spread 64-bit hash of ``x``, the rendezvous weight."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def rendezvous_weight(conversation: int, replica: int) -> int:
    """Step 7's weight of a conversation on a replica (both named by 64-bit integers):
    ``splitmix64(conversation XOR replica)``, the same at every router."""
    return splitmix64(conversation ^ replica)


def load_bound(in_flight_total: int, replicas: int, factor: float) -> int:
    """Most requests one of ``replicas`` may hold once the next arrives:
    ``⌈factor · (in_flight_total + 1) / replicas⌉`` (Mirrokni et al., bounded loads)."""
    if replicas < 1:
        raise ValueError(f"replicas: must be >= 1, got {replicas}")
    if not factor >= 1.0:
        raise ValueError(f"factor: must be >= 1, got {factor}")
    return math.ceil(factor * (in_flight_total + 1) / replicas - 1e-9)


# Candidate and PromptDemand are named tuples, not frozen dataclasses: a router builds
# one a backend and one a request on every request's path, and a frozen dataclass sets
# each field through ``object.__setattr__`` (more than twice the CPU).


class Candidate(NamedTuple):
    """What a router knows of one replica when a request arrives."""

    healthy: bool
    decode_wait_s: float  # O_r / Θ_r: the queue's decode
    in_flight: int
    cached_tokens: int  # h_r, from the router's own index
    prefill_tps: float  # P_r
    affinity: int  # the conversation's rendezvous weight on this replica (higher first)
    holds_conversation: bool = False  # the router's index holds its own text: a turn went there
    queued_prefill_tokens: int = 0  # F_r: uncached prompt tokens before their first token

    @property
    def wait_s(self) -> float:
        """``W_r = O_r / Θ_r + F_r / P_r``: the wait before it starts a request."""
        return self.decode_wait_s + self.queued_prefill_tokens / self.prefill_tps


class PromptDemand(NamedTuple):
    """What a request asks of the replica that serves it."""

    prompt_tokens: int  # p
    history_tokens: int  # of those, computed by the conversation's earlier turns
    output_tokens: int  # l: the reply expected
    ttft: float  # the tier's expected TTFT (s)
    tds: float  # the tier's expected token delivery speed (tokens/s)


def cache_aware_order(
    candidates: Sequence[Candidate], demand: PromptDemand, load_factor: float
) -> list[int]:
    """The indices of ``candidates``, best first (the module docstring's order)."""
    n = len(candidates)
    if n == 0:
        return []
    bound = load_bound(sum(c.in_flight for c in candidates), n, load_factor)
    any_healthy = any(c.healthy for c in candidates)
    # the preferred replica: the first in rendezvous order among the healthy (if any is)
    # within the bound (in flight + 1 <= bound)
    preferred = None
    for i, c in enumerate(candidates):
        eligible = c.in_flight < bound and (c.healthy or not any_healthy)
        if eligible and (preferred is None or c.affinity > candidates[preferred].affinity):
            preferred = i
    p, history, output, ttft_tier, tds = demand
    anywhere = max(history, *(c.cached_tokens for c in candidates))
    cold = anywhere == 0
    # the preferred replica is assumed to hold the history only where no replica is known
    # to: a router that saw an earlier turn go elsewhere knows better than the assumption
    assumed = None if any(c.holds_conversation for c in candidates) else preferred
    keys = []
    for i, c in enumerate(candidates):
        held = anywhere if i == assumed or c.holds_conversation else c.cached_tokens
        uncached = p - min(held, p)
        wait = c.wait_s
        q = delayed_start_qoe(wait + uncached / c.prefill_tps, ttft_tier, tds, output)
        keys.append(
            (
                not c.healthy,
                c.in_flight >= bound,  # past the load bound
                -q,
                uncached,
                not c.holds_conversation,
                wait if cold else 0.0,
                c.in_flight if cold else 0,
                -c.affinity,
            )
        )
    return sorted(range(n), key=keys.__getitem__)
