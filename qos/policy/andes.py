"""Andes: QoE-aware preemptive scheduling (Liu et al. §4, Appendix A).

Each iteration, when triggered, Andes picks the set of requests to run that maximises
the QoE gain over a horizon Δt (Eq. 4: an exact-k-item knapsack per batch size B):

- gain of request i: Q_serve,i(B) - Q_wait,i (Eq. 2) for average QoE; max(Q_min - Q_wait,i, 0)
  for max-min QoE (Eq. 6); [1(Q_serve=1) - 1(Q_wait=1)]·1(Q_now=1) for the number of
  perfect-QoE requests (Eq. 7);
- priority gain / l_i and greedy packing (Eq. 5, Algorithm 1, skipping what does not
  fit), for batch sizes B in [B_min, B_max] (§4.2 optimisation #2), keeping the best;
- selective triggering (optimisation #1): solve only when serving everyone would push
  the KV cache past the watermark (default 90 %) or decode slower than the most
  stringent TDS; otherwise everyone runs. A TDS at or above the engine's batch-1 speed
  is met by no batch size, so it is no reason to solve and does not set B_min: the
  paper's rule reads "the most stringent TDS *the engine can deliver*" (without it, one
  such request makes every iteration a solve that may shrink the batch for nothing);
- preemption cap P (optimisation #4): preemptions stay at most P per request on average.

tokenpace extension, off by default (``wait_for_room``): preempt only for a claim. Q_wait
assumes a request left out waits the whole horizon, but one left out is reconsidered at
the next iteration and gets room when a running request finishes, on average 1/λ away
(λ the recent completion rate). A waiting request has a *claim* only if that wait hurts
it: its gain, compared when it would get its first token after the wait, is positive.
A preemption made for an admission without a claim buys nothing but a recompute, so the
solver's running requests and claimed admissions go first, then the requests it would
preempt, then its other admissions into the room left. Near capacity this removes
nearly every preemption; under overload waits are long, most waiting requests have a
claim, and the solver's decision stands. Tenant weights give no claim of their own: they
act through the order of admissions, as VTC's do. Once the preemption budget is spent
the cap keeps every running request, and claims are not computed. Neither the cap nor
the claims act with the reader guard (``guard``), which decides who runs on the
solver's ranking; they are refused there (``andes-tp-unguarded`` keeps them).

tokenpace extension, off by default (``preemption_cost = 0`` is the paper's Andes): the
gain of a request that must be (re)computed before it decodes is charged for the stall
its prefill p_i imposes on the running batch. Over the horizon the batch then loses
about (p_i / Δt)·G of its gain, G = Σ of the running requests' positive gains; the
charge is k·(p_i / Δt)·G with k = ``preemption_cost``. k > 1 because the stall is paid
twice when an admission displaces a running request (that one recomputes on resume) and
outlives the horizon. :func:`tokenpace_andes` is the configuration tokenpace ships
(k = 4 and the reader guard: docs/benchmarks.md measures it against the paper's
settings).

Tenant weights (tokenpace extension, ``fair_share_slack``): packing goes by the levels
of :mod:`qos.policy.fair`, so each backlogged tenant gets its weighted fair share of
service (VTC-counted) and Andes maximises QoE within it; with one tenant or equal
weights every level is 0 and the decisions are the ones above.

Q_serve and Q_wait come from :mod:`qos.policy.forecast` and the latency model; the
horizon Δt defaults to the running mean request completion time (§4.1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from qos.fairness import VirtualTokenCounter
from qos.latency import LatencyProfile
from qos.policy.base import Policy, pack_in_order
from qos.policy.decision import Decision, Ranking
from qos.policy.fair import TenantShares, pack_by_level
from qos.policy.forecast import Forecast, QoEKind
from qos.policy.reader import GuardSettings, ReaderGuard
from qos.policy.table import Capacity, RequestTable

Objective = Literal["average", "max-min", "perfect"]
Solver = Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]

_PERFECT = 1.0 - 1e-9


class Andes(Policy):
    """The Andes scheduler over the engine-agnostic request table."""

    name = "andes"

    def __init__(
        self,
        profile: LatencyProfile,
        *,
        objective: Objective = "average",
        qoe: QoEKind = "andes",
        horizon_s: float | None = None,
        initial_horizon_s: float = 10.0,
        kv_watermark: float = 0.9,
        preemption_cap: float | None = None,
        preemption_cost: float = 0.0,
        batch_candidates: int = 4,
        solver: Solver | None = None,
        fair_share_slack: float | None = None,
        counter: VirtualTokenCounter | None = None,
        wait_for_room: bool = False,
        guard: GuardSettings | None = None,
    ) -> None:
        if objective not in ("average", "max-min", "perfect"):
            raise ValueError(f"objective: unknown {objective!r}; use average, max-min or perfect")
        if qoe not in ("andes", "monotone"):
            raise ValueError(f"qoe: unknown {qoe!r}; use andes or monotone")
        if not 0 < kv_watermark <= 1:
            raise ValueError(f"kv_watermark: must be in (0, 1], got {kv_watermark}")
        if guard is not None and (preemption_cap is not None or wait_for_room):
            raise ValueError(
                "preemption_cap, wait_for_room: they act on the solver's preemptions, and "
                "with the reader guard (andes-tp) the guard decides who runs and leaves a "
                "reply out only with slack to spare; unset them, or pick a policy without "
                "the guard (andes, andes-p0.3, andes-tp-unguarded)"
            )
        if preemption_cap is None and guard is None:
            preemption_cap = 1.0  # the paper's P: at most one preemption a request
        if preemption_cap is not None and preemption_cap < 0:
            raise ValueError(f"preemption_cap: must be >= 0, got {preemption_cap}")
        if not preemption_cost >= 0:
            raise ValueError(f"preemption_cost: must be >= 0, got {preemption_cost}")
        if horizon_s is not None and not horizon_s > 0:
            raise ValueError(f"horizon_s: must be > 0 seconds, got {horizon_s}")
        if batch_candidates < 1:
            raise ValueError(f"batch_candidates: must be >= 1, got {batch_candidates}")
        self.profile = profile
        self.objective: Objective = objective
        self.qoe: QoEKind = qoe
        self.fixed_horizon = horizon_s
        self.kv_watermark = kv_watermark
        self.preemption_cap = preemption_cap  # None: the guard decides (no cap)
        self.preemption_cost = preemption_cost
        self.batch_candidates = batch_candidates
        self.solver = solver
        self.shares = None if fair_share_slack is None else TenantShares(fair_share_slack, counter)
        self.wait_for_room = wait_for_room
        self.guard = (
            ReaderGuard(profile, guard, weights=fair_share_slack is not None)
            if guard is not None
            else None
        )
        self._finished: deque[float] = deque(maxlen=64)  # recent completion times
        self.deferred = 0  # preemptions dropped for want of a claim
        self._levels: np.ndarray | None = None  # the last solve's tenant levels
        self._asks: np.ndarray | None = None  # and the rows that asked (asking)
        self._forecast: tuple[Forecast, float] | None = None  # the last solve's, and its τ
        self._completions: deque[float] = deque([initial_horizon_s], maxlen=256)
        self._completion_sum = initial_horizon_s
        self.arrivals = 0
        self.preemptions = 0
        self.solves = 0
        self._decode = np.zeros(0)
        self._speeds = np.zeros(0)
        # the last solve's priorities (Eq. 5) and the part of its packing order it read
        self._priority = np.zeros(0)
        self._order: np.ndarray | None = None

    def set_profile(self, profile: LatencyProfile) -> None:
        """Decide with ``profile`` from the next decision on (a refitted latency model)."""
        self.profile = profile
        if self.guard is not None:
            self.guard.set_profile(profile)
        self._decode = np.zeros(0)  # the per-batch-size caches refill from it
        self._speeds = np.zeros(0)

    # -- hooks ------------------------------------------------------------------------
    def on_arrival(self, table: RequestTable, row: int, now: float) -> None:
        self.arrivals += 1
        if self.shares is not None:
            self.shares.on_arrival(table, row)
        if self.guard is not None:
            self.guard.on_arrival(table, row, now)

    def on_finish(self, table: RequestTable, row: int, now: float) -> None:
        if self.shares is not None:
            self.shares.on_finish(table, row)
        if len(self._completions) == self._completions.maxlen:
            self._completion_sum -= self._completions[0]
        took = now - float(table.col("arrival")[row])
        self._completions.append(took)
        self._completion_sum += took
        self._finished.append(now)

    def room_wait_s(self, now: float) -> float | None:
        """1/λ: the mean time between recent completions, i.e. until a running request
        frees room (None before two completions)."""
        if len(self._finished) < 2 or not now > self._finished[0]:
            return None
        return (now - self._finished[0]) / len(self._finished)

    @property
    def horizon_s(self) -> float:
        """Δt: fixed if given, else the mean completion time of recent requests."""
        if self.fixed_horizon is not None:
            return self.fixed_horizon
        return max(self._completion_sum / len(self._completions), 1e-3)

    # -- decision ---------------------------------------------------------------------
    def triggered(
        self, table: RequestTable, capacity: Capacity, demand: np.ndarray | None = None
    ) -> bool:
        """Optimisation #1: is serving everyone impossible or too slow?"""
        n = table.n
        if n > capacity.max_batch:
            return True
        if demand is None:
            demand = capacity.demand(table)
        if int(demand.sum()) > self.kv_watermark * capacity.kv_tokens:
            return True
        tds = self.most_stringent_tds(table)
        return tds is not None and float(self.profile.decode_s(n)) > 1.0 / tds

    def most_stringent_tds(self, table: RequestTable) -> float | None:
        """The highest expected TDS below the batch-1 speed (None if there is none): a
        higher one is met by no batch size, so neither triggers a solve nor sets B_min."""
        self.decode_table(1)
        tds = table.col("tds")
        reachable = tds[tds < self._speeds[1]]
        return float(reachable.max()) if reachable.size else None

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        return self.decide(table, capacity, now).run

    def decide(self, table: RequestTable, capacity: Capacity, now: float) -> Decision:
        """This iteration's decision as a typed value: with the reader guard, the ranking
        stage (:meth:`rank`) and then the guard's stage (:mod:`qos.policy.reader`);
        without it, the solver's batch, its preemptions capped and made for claims."""
        n = table.n
        running = table.running
        if n == 0:
            return Decision.of(np.zeros(0, dtype=bool), running)
        demand = capacity.demand(table)
        if not self.triggered(table, capacity, demand):
            if self.guard is None or running.all():
                return Decision.of(np.ones(n, dtype=bool), running)
            # Everyone fits; the guard only spreads admissions' prefills so that none
            # freezes a reader (rule 3), in arrival order.
            waiting = (~running).nonzero()[0]
            order = waiting[np.argsort(table.col("arrival")[waiting], kind="stable")]
            ranking = Ranking(order, float(self.profile.decode_s(n)))
            return self.guard.apply(table, capacity, demand, ranking, now, reply_s=self.horizon_s)
        self.solves += 1
        if self.guard is not None:
            return self.guard.apply(
                table,
                capacity,
                demand,
                self.rank(table, capacity, demand, now),
                now,
                room_wait_s=self.room_wait_s(now) or 0.0,
                reply_s=self.horizon_s,
            )
        chosen = self._solve(table, capacity, demand, now)
        assert chosen is not None
        if self.wait_for_room and self.preemption_budget > 0:  # else the cap keeps them all
            chosen = self._preempting_only_for_claims(table, capacity, demand, chosen)
        return Decision.of(self._cap_preemptions(table, capacity, demand, chosen), running)

    def rank(
        self, table: RequestTable, capacity: Capacity, demand: np.ndarray, now: float
    ) -> Ranking:
        """The ranking stage the reader guard decides on: the requests with no token yet
        in this solve's priority order (Eq. 5), the decode latency τ at B_max, and the
        tenants' VTC levels where weights act (:mod:`qos.policy.fair`: they then order
        the due replies when the engine cannot run them all; on admissions weights act
        through the plans of :mod:`qos.policy.plans`)."""
        self._solve(table, capacity, demand, now, batch=False)
        assert self._forecast is not None
        fresh = (~table.running & (table.col("output") == 0)).nonzero()[0]
        order = fresh[np.argsort(-self._priority[fresh], kind="stable")]
        return Ranking(order, self._forecast[1], self._levels)

    def forecast(self, table: RequestTable, now: float) -> Forecast:
        """Q_wait / Q_serve forecaster for this decision (waiting requests pay a prefill first)."""
        output = table.col("output")
        max_tokens = table.col("max_tokens")
        held = self.qoe == "monotone"
        return Forecast.build(
            kind=self.qoe,
            n=output.astype(float),
            dig_sum=table.col("held_sum" if held else "dig_sum"),
            dig_last=table.col("held_last" if held else "dig_last"),
            tds=table.col("tds"),
            ttft=table.col("ttft"),
            arrival=table.col("arrival"),
            now=now,
            horizon=now + self.horizon_s,
            # the prefill of what is not in the KV cache: p·l_i for a waiting request, 0
            # for a running one or one paused with its KV kept (``RequestTable.pause``)
            first_delay=self.profile.prefill_per_token_s * (table.context - table.col("computed")),
            remaining=np.where(max_tokens >= 0, max_tokens - output, np.inf),
        )

    def gains(self, forecast: Forecast, now: float, tau: float) -> np.ndarray:
        """QoE gain of serving each request at decode latency τ (Eq. 2, 6 or 7)."""
        gain: np.ndarray
        if self.objective == "max-min":
            gain = np.maximum(float(forecast.q_now.min()) - forecast.q_wait, 0.0)
            return gain
        q_serve = forecast.q_serve(tau)
        if self.objective == "average":
            gain = q_serve - forecast.q_wait
            return gain
        now_perfect = forecast.q_now >= _PERFECT
        gain = ((q_serve >= _PERFECT).astype(float) - (forecast.q_wait >= _PERFECT)) * now_perfect
        return gain

    def batch_range(
        self, table: RequestTable, capacity: Capacity, demand: np.ndarray | None = None
    ) -> tuple[int, int]:
        """[B_min, B_max] of §4.2 optimisation #2.

        B_max: how many requests fit when the shortest contexts go first. B_min: the
        largest batch still decoding faster than the most stringent TDS.
        """
        if demand is None:
            demand = capacity.demand(table)
        limit = min(capacity.max_batch, table.n)
        smallest = np.partition(demand, limit - 1)[:limit] if limit < table.n else demand
        if int(smallest.sum()) <= capacity.kv_tokens:
            b_max = limit
        else:
            b_max = int(np.searchsorted(np.cumsum(np.sort(smallest)), capacity.kv_tokens, "right"))
        b_max = max(b_max, 1)
        self.decode_table(b_max)
        tds = self.most_stringent_tds(table)
        if tds is None:
            return b_max, b_max
        fast = (self._speeds[1 : b_max + 1] >= tds).nonzero()[0]
        b_min = int(fast[-1]) + 1 if fast.size else 1
        return b_min, b_max

    def decode_table(self, b_max: int) -> np.ndarray:
        """Decode latency by batch size 0..b_max (context term excluded) of the current
        profile, cached with its inverse, the tokens per second of each request; both
        are refilled by :meth:`set_profile`."""
        if self._decode.size <= b_max:
            self._decode = np.asarray(self.profile.decode_s(np.arange(2 * b_max + 1)), dtype=float)
            with np.errstate(divide="ignore"):
                self._speeds = 1.0 / self._decode  # inf at B = 0, never read
        return self._decode[: b_max + 1]

    def _solve(
        self,
        table: RequestTable,
        capacity: Capacity,
        demand: np.ndarray,
        now: float,
        *,
        batch: bool = True,
    ) -> np.ndarray | None:
        """Eq. 4 by greedy packing at each candidate batch size: the best batch, its
        order and priorities (Eq. 5). ``batch=False`` (the reader guard, which reads the
        priorities only): with a single candidate size nothing is packed, None returned."""
        forecast = self.forecast(table, now)
        # Pack to the watermark: the headroom absorbs the batch's growth until the next
        # solve instead of forcing the engine to preempt.
        capacity = Capacity(
            int(self.kv_watermark * capacity.kv_tokens), capacity.max_batch, capacity.block_size
        )
        b_min, b_max = self.batch_range(table, capacity, demand)
        count = min(self.batch_candidates, b_max - b_min + 1)
        sizes = sorted(
            {round(b_min + (b_max - b_min) * i / max(count - 1, 1)) for i in range(count)}
        )
        decode = self.decode_table(b_max)
        per_context = self.profile.per_context_token_s
        context_s = per_context * float(demand.mean()) if per_context else 0.0
        self._levels = self._asks = None
        tau = float(decode[b_max]) + context_s * b_max
        if self.shares is not None and self.shares.weighted(table):
            self._asks = self.asking(table, forecast, tau)
            self._levels = self.shares.levels(table, self._asks)
        self._forecast = (forecast, tau)
        best, best_value = None, -np.inf
        running = table.running
        size = demand.astype(float)  # l_i; dividing by it as floats is 3x cheaper
        for b in sizes:
            gain = self.gains(forecast, now, float(decode[b]) + context_s * b)
            if self.preemption_cost:
                gain = gain - self.stall_charge(forecast, gain, running)
            priority = gain / size
            if not batch and len(sizes) == 1:
                self._order, self._priority = None, priority
                return None
            order: np.ndarray | None
            if self.solver is not None:
                order = self.packing_order(table, priority)
                chosen = self.solver(gain, demand, capacity.kv_tokens, b)
            else:
                chosen, order = self._pack(table, priority, demand, capacity.kv_tokens, b)
            value = float(gain[chosen].sum()) if len(sizes) > 1 else 0.0  # the sum only ranks
            if value > best_value:
                best, best_value, self._order, self._priority = chosen, value, order, priority
        assert best is not None
        return best

    def _pack(
        self, table: RequestTable, priority: np.ndarray, demand: np.ndarray, kv_tokens: int, b: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Greedy packing (Algorithm 1) in :meth:`packing_order`: the chosen mask, and the
        rows of the order it read, in order (None where their order did not matter).

        Without a subclass's own order, only the head of the order is looked at: the rows
        whose priority is at least the b-th highest (ties included). When b head rows fit
        together they are the batch, whatever their order. Otherwise the head is sorted
        and packed, then, if the batch is not full, the rest of the rows that still fit
        the KV left: rows beyond the head come after it in the order, and a row that does
        not fit the KV left can never be taken, so this packs exactly as the full sort.
        With tenant levels (:mod:`qos.policy.fair`) the whole order is sorted and packed
        by :func:`~qos.policy.fair.pack_by_level`.
        """
        n = table.n
        if self._levels is not None:
            order = self.packing_order(table, priority)
            assert self._asks is not None
            chosen = pack_by_level(order, table.running, self._asks, demand, kv_tokens, b, n)
            return chosen, order
        if b >= n or type(self).packing_order is not Andes.packing_order:
            order = self.packing_order(table, priority)
            return pack_in_order(order, demand, kv_tokens, b, n), order
        key, running = -priority, table.running
        in_head = key <= np.partition(key, b - 1)[b - 1]
        head = in_head.nonzero()[0]
        if head.size == b and int(demand[head].sum()) <= kv_tokens:
            chosen = np.zeros(n, dtype=bool)
            chosen[head] = True
            return chosen, None
        head = _in_priority_order(head, key, running)
        chosen = pack_in_order(head, demand, kv_tokens, b, n)
        taken = int(np.count_nonzero(chosen))
        if taken == b:
            return chosen, head
        left = kv_tokens - int(demand[chosen].sum())
        rest = (~in_head & (demand <= left)).nonzero()[0]
        rest = _in_priority_order(rest, key, running)
        chosen |= pack_in_order(rest, demand, left, b - taken, n)
        return chosen, np.concatenate((head, rest))

    def _in_solver_order(self, admitted: np.ndarray) -> np.ndarray:
        """The rows of ``admitted`` (waiting rows) in the last solve's packing order."""
        rows: np.ndarray
        if self._order is not None:
            rows = self._order[admitted[self._order]]
            return rows
        rows = admitted.nonzero()[0]  # Andes's own order: priority, then row (all waiting)
        rows = rows[np.argsort(-self._priority[rows], kind="stable")]
        return rows

    def asking(self, table: RequestTable, forecast: Forecast, tau: float) -> np.ndarray:
        """The rows that are their tenant's unmet ask (:mod:`qos.policy.fair`): waiting,
        and hurt by waiting (Q_serve at τ, the decode latency at B_max, above Q_wait)."""
        asks: np.ndarray = ~table.running & forecast.hurt(tau)
        return asks

    def claims(self, forecast: Forecast, tau: float, rows: np.ndarray) -> np.ndarray:
        """Which of the waiting ``rows`` the wait for room hurts (module doc): Q_serve at
        τ above Q_wait, compared when each would get its first token after that wait
        (at the horizon before two completions); in closed form for most rows
        (:meth:`~qos.policy.forecast.Forecast.hurt_at`)."""
        wait = self.room_wait_s(forecast.now)
        first = forecast.now + (np.inf if wait is None else wait) + forecast.first_delay[rows]
        first += tau
        return forecast.hurt_at(rows, np.minimum(first, forecast.horizon), tau)

    def _preempting_only_for_claims(
        self, table: RequestTable, capacity: Capacity, demand: np.ndarray, chosen: np.ndarray
    ) -> np.ndarray:
        """``chosen`` with its preemptions limited to what its admissions with a claim need
        (module doc): what it runs and the rows it admits with a claim, then the running
        rows it drops, the longest context first (the costliest to recompute), while they
        fit, then its other admissions into the room left under the watermark, in its
        order (with tenant levels, :func:`~qos.policy.fair.pack_by_level`'s)."""
        running = table.running
        evicted = running & ~chosen
        if not evicted.any():
            return chosen
        assert self._forecast is not None
        admitted = (chosen & ~running).nonzero()[0]
        unclaimed = admitted[~self.claims(*self._forecast, admitted)]
        kept = chosen.copy()
        kept[unclaimed] = False
        slots = capacity.max_batch - int(np.count_nonzero(kept))
        if slots <= 0:  # nothing fits back, nothing else is admitted
            return kept
        used = int(demand @ kept)
        if used < capacity.kv_tokens:  # else no evicted row fits back
            back = _costliest_first(table, evicted)
            kept |= pack_in_order(back, demand, capacity.kv_tokens - used, slots, table.n)
            self.deferred += int(np.count_nonzero(evicted & kept))
            used, slots = int(demand @ kept), capacity.max_batch - int(np.count_nonzero(kept))
        room = int(self.kv_watermark * capacity.kv_tokens) - used
        if unclaimed.size and room > 0 and slots > 0:
            waiting = np.zeros(table.n, dtype=bool)
            waiting[unclaimed] = True
            kept |= self._admit_in_order(table, waiting, demand, room, slots)
        return kept

    def _admit_in_order(
        self, table: RequestTable, admitted: np.ndarray, demand: np.ndarray, room: int, slots: int
    ) -> np.ndarray:
        """The rows of ``admitted`` that fit ``room`` and ``slots``, packed in the last
        solve's order (with tenant levels, by :func:`~qos.policy.fair.pack_by_level`)."""
        order = self._in_solver_order(admitted)
        if self._levels is None:
            return pack_in_order(order, demand, room, slots, table.n)
        assert self._asks is not None
        return pack_by_level(order, table.running, self._asks, demand, room, slots, table.n)

    def stall_charge(self, forecast: Forecast, gain: np.ndarray, running: np.ndarray) -> np.ndarray:
        """k·(p_i / Δt)·G: what request i's prefill costs the running batch (module doc)."""
        batch_gain = float(np.maximum(gain[running], 0.0).sum())
        scale = self.preemption_cost * batch_gain / (forecast.horizon - forecast.now)
        return scale * forecast.first_delay

    def packing_order(self, table: RequestTable, priority: np.ndarray) -> np.ndarray:
        """Rows in the order greedy packing considers them: highest priority (Eq. 5) first.

        On equal priority (typically zero gain everywhere) running requests go first, so a
        tie never preempts one for nothing; then row order. With tenant levels, lower
        levels first, this order within each.
        """
        if self._levels is not None:
            return np.lexsort((~table.running, -priority, self._levels))
        return _in_priority_order(np.arange(table.n), -priority, table.running)

    @property
    def preemption_budget(self) -> int:
        """Preemptions optimisation #4 still allows: P per request so far, less those made."""
        assert self.preemption_cap is not None  # set wherever the solver decides
        return int(self.preemption_cap * self.arrivals) - self.preemptions

    def _cap_preemptions(
        self, table: RequestTable, capacity: Capacity, demand: np.ndarray, chosen: np.ndarray
    ) -> np.ndarray:
        """Optimisation #4: keep preemptions ≤ P per request on average."""
        running = table.running
        evicted = running & ~chosen
        count = int(np.count_nonzero(evicted))
        budget = self.preemption_budget
        if count <= budget:
            self.preemptions += count
            return chosen
        # Over budget: of the evictions, keep running those costliest to preempt (the
        # longest contexts, recomputed on resume), then pack the solution's admissions.
        if budget > 0:
            keep = _costliest_first(table, evicted)[: count - budget]
            kept = chosen & running
            kept[keep] = True
        else:  # budget spent: every victim stays
            kept = running.copy()
        used, slots = int(demand[kept].sum()), capacity.max_batch - int(np.count_nonzero(kept))
        packed: np.ndarray
        if used <= capacity.kv_tokens and slots >= 0:
            packed = kept  # the usual case: what was running still fits
        else:
            packed = pack_in_order(
                kept.nonzero()[0], demand, capacity.kv_tokens, capacity.max_batch, table.n
            )
            used = int(demand[packed].sum())
            slots = capacity.max_batch - int(np.count_nonzero(packed))
        # Admissions only into the room left under the watermark (see _solve).
        room = int(self.kv_watermark * capacity.kv_tokens) - used
        if room > 0 and slots > 0:
            packed |= self._admit_in_order(table, chosen & ~running, demand, room, slots)
        self.preemptions += int(np.count_nonzero(running & ~packed))
        return packed


def _costliest_first(table: RequestTable, rows: np.ndarray) -> np.ndarray:
    """The rows of the mask ``rows``, longest context (the costliest to recompute) first."""
    found = rows.nonzero()[0]
    ordered: np.ndarray = found[np.argsort(-table.context[found], kind="stable")]
    return ordered


def _in_priority_order(rows: np.ndarray, key: np.ndarray, running: np.ndarray) -> np.ndarray:
    """``rows`` in Andes's packing order: lowest ``key`` (−priority, Eq. 5) first, running
    requests first on equal key, then row order."""
    return rows[np.lexsort((~running[rows], key[rows]))]


TOKENPACE_ANDES: dict[str, Any] = {
    "preemption_cost": 4.0,
    "kv_watermark": 0.95,
    "fair_share_slack": 8192.0,
    "guard": GuardSettings(),
}

UNGUARDED: dict[str, Any] = {"guard": None, "preemption_cap": 0.3, "wait_for_room": True}
"""What ``andes-tp-unguarded`` sets instead of the guard: the solver's decision, its
preemptions capped at P = 0.3 and made only for a claim (module doc)."""


def tokenpace_andes(profile: LatencyProfile, **overrides: Any) -> Andes:
    """Andes as tokenpace ships it: the reader guard (:mod:`qos.policy.reader`) deciding
    who runs on the solver's ranking, stall charge k = 4, the solver ranking admissions
    once the committed KV passes 95 % of the cache (arrival order below it), tenant
    weights acting with a slack of 8,192 service units (4,096 output
    tokens of a weight-1 tenant, ~5 s of the OPT-66B profile's output;
    ``fair_share_slack=None`` ignores weights). docs/benchmarks.md measures the slack.

    The paper's defaults (no stall charge) lose a quarter of the engine's token
    throughput to recompute prefills on a KV-bound engine; docs/benchmarks.md compares
    the two side by side. Without the guard, admissions fill to the watermark, which only
    has to leave room for a few iterations of growth, since a triggered solver re-plans
    every iteration: 0.95 served more than the paper's 0.9 at nearly every rate
    measured, with no forced preemption (1.0 does force them). With the guard, the
    guard admits into the whole cache less the replies' expected growth
    (:mod:`qos.policy.reader`, rule 3): a fixed share kept above admissions held first
    tokens back where FCFS gave them (docs/benchmarks.md, the robustness sweep).
    ``overrides`` are :class:`Andes` keyword arguments.
    """
    return Andes(profile, **{**TOKENPACE_ANDES, **overrides})
