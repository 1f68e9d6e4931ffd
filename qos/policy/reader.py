"""The reader's deadline: a reply on screen is never left without a token to show.

A client shows a reply's tokens by the release rule (recursion D of :mod:`qos.timeline`):
the first on arrival, then one every 1/TDS unless the next has not arrived. The table
keeps d_n, when the last token received starts being shown (``dig_last``), so the reader
of a started reply runs out of tokens at

    D_i = d_n + 1/TDS_i                                             (the reader's deadline)

and its next token comes ``lead_i`` after the decision that runs it: one iteration τ,
plus the prefill of whatever of its context is not in the KV cache (a recompute after a
preemption). Its *slack* is s_i = D_i - now - lead_i: how long it can still wait.

Wang et al., "Revisiting SLOs and System Level Metrics in LLM Serving" §4.3: users feel
the longest wait (user idle latency, Eq. 9), since "once the slowdown has occurred,
catching up later does not improve the user experience". Andes Eq. 1 integrates only up
to the last token, so a freeze late in a long reply costs it almost nothing, and under
overload the solver keeps giving the engine to fresh requests while started replies
freeze for minutes. The guard makes the reader's deadline a constraint, not a cost:

1. **Due rows run.** A started reply whose slack is at most the margin runs now, whatever
   the objective says: the margin is the longest the next decision can be away (one
   iteration with its prefills, :meth:`ReaderGuard.margin_s`).
2. **A started reply is paused only with slack to spare.** A running reply leaves the
   batch only to make room for a due one, the one with the most slack first, and only if
   its slack after the recompute it would then need is above the margin.
3. **The shortfall lands before the first token.** A request with no token yet is
   admitted only into the room that is left once every committed reply (started, or
   running) has its KV counted, parked ones included, so a reply parked to make room can
   always come back; and the prefills admitted in one iteration are bounded by the
   smallest slack of the replies that run in it, so an admission never freezes a reader.

What the guard cannot prevent is a started set that outgrows the engine on its own
(replies grow into the KV headroom): then the replies with the most slack are parked and
come back first when room frees, before any fresh request.
"""

from __future__ import annotations

import numpy as np

from qos.latency import LatencyProfile
from qos.policy.base import pack_in_order
from qos.policy.table import Capacity, RequestTable


class ReaderGuard:
    """Applies the reader's deadline (module doc) to a policy's decision."""

    def __init__(
        self,
        profile: LatencyProfile,
        *,
        margin_s: float | None = None,
        overdue_after_ttfts: float | None = 10.0,
        lend_after_s: float | None = None,
    ) -> None:
        if margin_s is not None and not margin_s > 0:
            raise ValueError(f"margin_s: must be > 0 seconds, got {margin_s}")
        if overdue_after_ttfts is not None and not overdue_after_ttfts > 0:
            raise ValueError(f"overdue_after_ttfts: must be > 0 (TTFTs), got {overdue_after_ttfts}")
        if lend_after_s is not None and not lend_after_s > 0:
            raise ValueError(f"lend_after_s: must be > 0 seconds, got {lend_after_s}")
        self.profile = profile
        self.fixed_margin = margin_s
        self.lend_after_s = lend_after_s
        self.overdue_after_ttfts = overdue_after_ttfts
        self.forced = 0  # due rows the decision had left out
        self.held = 0  # fresh admissions deferred to keep a reader's deadline

    def set_profile(self, profile: LatencyProfile) -> None:
        self.profile = profile

    def margin_s(self, tau: float, capacity: Capacity) -> float:
        """How long a row left out can wait for the next decision: one iteration τ plus
        the prefill base an iteration that admits anything pays, doubled for the
        iteration's own admissions (bounded by the prefill budget, rule 3), plus how long
        the engine lets a decision stand."""
        if self.fixed_margin is not None:
            return self.fixed_margin
        return 2.0 * (tau + self.profile.prefill_base_s) + capacity.decision_interval_s

    def slack(self, table: RequestTable, now: float, tau: float) -> np.ndarray:
        """s_i = D_i - now - lead_i for every row (+inf for rows with no token yet)."""
        step = 1.0 / table.col("tds")
        uncomputed = table.context - table.col("computed")
        lead = tau + np.where(
            uncomputed > 0,
            self.profile.prefill_base_s + self.profile.prefill_per_token_s * uncomputed,
            0.0,
        )
        started = table.col("output") > 0
        slack: np.ndarray = np.where(started, table.col("dig_last") + step - now - lead, np.inf)
        return slack

    def apply(
        self,
        table: RequestTable,
        capacity: Capacity,
        demand: np.ndarray,
        admissions_in_order: np.ndarray,
        now: float,
        tau: float,
        kv_watermark: float,
    ) -> np.ndarray:
        """The rows that run next under rules 1-3 (module doc). ``admissions_in_order``:
        the requests the policy would admit, in its order of preference."""
        running = table.running
        started = table.col("output") > 0
        committed = started | running
        margin = self.margin_s(tau, capacity)
        slack = self.slack(table, now, tau)
        must = started & (slack <= margin)
        if not capacity.pauses:  # a running reply left out would be recomputed first
            p = self.profile
            recompute = p.prefill_base_s + p.prefill_per_token_s * table.context
            must |= running & started & (slack - recompute <= margin)
        must |= running & ~started  # a prefill under way (the engine's own chunking)
        self.forced += _count(must & ~running)
        watermark = int(kv_watermark * capacity.kv_tokens)
        batch = _Batch(table, demand, capacity.max_batch, self.profile)
        batch.take(_by(slack, must), capacity.kv_tokens)
        batch.budget = self._prefill_budget(slack, batch.keep, committed, tau)
        rest = committed & ~batch.keep
        fresh = self.overdue_first(table, admissions_in_order[~committed[admissions_in_order]], now)
        reserved = committed
        if self.lend_after_s is not None:  # replies due later than that lend their KV
            reserved = committed & (slack <= self.lend_after_s)
        room = watermark - int(demand @ reserved)
        if capacity.pauses:
            # Pausing keeps the KV: fresh requests take the slots that replies ahead of
            # their readers give up, then the replies fill what is left: those whose KV
            # is in the cache, then, into what the paused ones leave free, those that
            # lost it (a reply brought back early must not push a paused one out).
            resident = running | (table.col("computed") > 0)
            batch.take(fresh, min(room, watermark - batch.kv))
            batch.take(_by(slack, rest & resident), capacity.kv_tokens - batch.kv)
            paused = int(demand @ (resident & ~batch.keep))
            batch.take(_by(slack, rest & ~resident), capacity.kv_tokens - batch.kv - paused)
        else:
            # Pausing would lose the KV: the running replies stay, the parked ones come
            # back, then fresh requests take the room left.
            batch.take(_by(slack, rest & running), capacity.kv_tokens - batch.kv)
            batch.take(_by(slack, rest & ~running), watermark - batch.kv)
            batch.take(fresh, min(room, watermark - batch.kv))
        self.held += int(fresh.size - np.count_nonzero(batch.keep[fresh]))
        return batch.keep

    def overdue_first(self, table: RequestTable, rows: np.ndarray, now: float) -> np.ndarray:
        """``rows`` (waiting, in the policy's order) with the overdue ones first, oldest
        first: those that have waited ``overdue_after_ttfts`` times their TTFT."""
        if self.overdue_after_ttfts is None or not rows.size:
            return rows
        arrival = table.col("arrival")[rows]
        overdue = now - arrival > self.overdue_after_ttfts * table.col("ttft")[rows]
        if not overdue.any():
            return rows
        oldest = rows[overdue][np.argsort(arrival[overdue], kind="stable")]
        return np.concatenate((oldest, rows[~overdue]))

    def _prefill_budget(
        self, slack: np.ndarray, keep: np.ndarray, committed: np.ndarray, tau: float
    ) -> float:
        """Seconds of prefill the iteration may add without making a reader wait: no
        more than the slack of any reply that runs in it, nor than what the replies left
        out can spare beyond the next iteration (they may run at the next decision)."""
        ran = slack[keep & np.isfinite(slack)]
        waits = slack[committed & ~keep & np.isfinite(slack)]
        budget = float(ran.min()) if ran.size else np.inf
        if waits.size:
            budget = min(budget, float(waits.min()) - tau - self.profile.prefill_base_s)
        return budget


class _Batch:
    """The batch being built: rows taken in turn, each within the KV given, the batch
    limit and the prefill budget (what taken rows must (re)compute, in seconds)."""

    def __init__(
        self, table: RequestTable, demand: np.ndarray, max_batch: int, profile: LatencyProfile
    ) -> None:
        self.demand = demand
        self.uncomputed = table.context - table.col("computed")
        self.slots = max_batch
        self.profile = profile
        self.keep = np.zeros(table.n, dtype=bool)
        self.kv = 0
        self.budget = np.inf
        self.prefilled = False

    def take(self, order: np.ndarray, kv_tokens: int) -> None:
        """Take the rows of ``order`` that fit, in order, skipping the others."""
        slots = self.slots - _count(self.keep)
        if not order.size or kv_tokens <= 0 or slots <= 0:
            return
        taken = pack_in_order(order, self.demand, kv_tokens, slots, self.keep.size)
        rows = order[taken[order]]
        prefill = self.uncomputed[rows]
        if prefill.any():  # within the budget; the first prefill of a batch always fits
            p = self.profile
            cost = np.cumsum(np.where(prefill > 0, p.prefill_per_token_s * prefill, 0.0))
            cost += p.prefill_base_s
            fits = (cost <= self.budget) | (prefill == 0)
            if not self.prefilled:
                fits[int(np.argmax(prefill > 0))] = True
            rows = rows[fits]
            spent = prefill[fits]
            if spent.any():
                self.budget -= p.prefill_per_token_s * float(spent.sum()) + p.prefill_base_s
                self.prefilled = True
        self.keep[rows] = True
        self.kv += int(self.demand[rows].sum())


def _by(slack: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows of mask ``rows``, least slack first."""
    found = rows.nonzero()[0]
    ordered: np.ndarray = found[np.argsort(slack[found], kind="stable")]
    return ordered


def _count(mask: np.ndarray) -> int:
    return int(np.count_nonzero(mask))
