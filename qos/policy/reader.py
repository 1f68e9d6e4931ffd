"""The reader guard: a reply on screen is never left without a token to show.

A client shows a reply's tokens by the release rule (recursion D of :mod:`qos.timeline`):
the first on arrival, then one every 1/TDS unless the next has not arrived. The table
keeps d_n, when the last token received is shown (``dig_last``), so the reader of a
started reply runs out of tokens at

    D_i = d_n + 1/TDS_i                                             (the reader's deadline)

Its next token comes ``lead_i`` after the decision that runs it: one iteration τ, plus
the prefill of whatever of its context is not in the KV cache (a recompute after it
lost its KV). Its *slack* s_i = D_i + g - now - lead_i is how long it can still wait.

What is protected is what a reader can notice and the engine can give. The pace is at
most 1/τ, what the engine gives one sequence at the batch it runs: a deadline the
engine cannot meet for anyone buys nothing by holding others back. A wait past D_i
shorter than g = NOTICEABLE_GAP_S is not noticed. A consumer that does not watch the
text (a tier of ``non_reader_tiers``, by default ``batch``) has no deadline and takes
nothing of the readers' rate: its QoE is about when it finishes.

Wang et al., "Revisiting SLOs and System Level Metrics in LLM Serving" §4.3: users feel
the longest wait (user idle latency, Eq. 9), since "once the slowdown has occurred,
catching up later does not improve the user experience". Andes Eq. 1 integrates only up
to the last token, so a freeze late in a long reply costs almost nothing, and under
overload the solver kept giving the engine to fresh requests while started replies froze
for minutes. The guard makes the reader's deadline a constraint, not a cost:

1. **Due replies run.** A started reply whose slack is at most the margin runs now,
   whatever the objective says. The margin (:meth:`ReaderGuard.margin_s`) covers the
   wait for the next decision: this iteration and the next, each with its prefill base,
   plus how long the engine lets a decision stand.
2. **A reply gives way only with slack to spare.** Where pausing keeps the KV (the vLLM
   plugin), the replies ahead of their readers give their batch slots to fresh requests
   and to due replies; where it would lose the KV (a recompute), a running reply is left
   out only to make room for a due one, and only if its slack after that recompute is
   above the margin. A paused reply keeps its KV only while the cache has room, so a due
   reply that lost its KV comes back only into what is left once the replies in the
   cache that are due, or would be after a recompute, keep theirs: where the replies
   have outgrown the cache, bringing it back would push one of them out to come back
   the same way, a recompute every decision with nobody served sooner.
3. **The shortfall lands before the first token.** A request with no token yet is
   admitted only into the room left in the cache once every committed reply (started,
   or running) has its KV counted, parked ones included, and what the running ones
   grow by over GROWTH_HORIZON_S (not those lending it on a loan; twice that for those
   whose readers could not wait out a recompute: past it, the overflow falls on replies
   whose slack covers a recompute, as FCFS, filling the cache, recomputes), so a reply
   that gave way can always come back (two
   exceptions: under price plans, a request within its plan's guarantee may take back
   the KV of replies on borrowed room whose readers can wait for a recompute,
   :mod:`qos.policy.plans`, and they come back when due, as rule 1 says; with
   ``lend_after_s``, replies with more slack than that lend their KV, and come back
   from RETURN_AT of it into the KV of paused replies that would lend theirs); and only
   while the committed replies' readers, with it, ask no more tokens a second than the
   engine decodes at its full batch, less the share of time admissions' prefills take
   and, where replies lend their KV, the loans' swaps (:meth:`ReaderGuard.reader_rate`,
   :meth:`ReaderGuard.loan_share`): past that, the batch cannot pace every reader
   however the slots are shared, so on an engine of few slots and a large cache the
   cache alone would let in readers who then freeze; and the
   prefills admitted in one iteration stay within the slack of every reply that runs in
   it and of every reply left out beyond the next iteration, so an admission never
   freezes a reader that a slot can pace; while a reader no slot of the full batch paces
   is committed, within FIRST_DUE_PREFILL_S instead (that reader falls behind under any
   order, a prefill held for it is made within its reply all the same, and each split of
   a burst's prefills would delay it one more prefill base, which its idle latency keeps
   to the end, where the others' slack comes back at their pace). Exceptions: the first
   prefill of an iteration always goes in, an engine that would run nothing brings back
   the replies that gave way that fit the cache, and an engine with nothing committed
   admits the first request that fits it (progress). A request that would pass its TTFT before the
   next decision, once the prefills in line before it are made, has a user about to
   notice a wait as well: its prefill goes in beyond the readers' slack while the
   iteration's prefills stay within FIRST_DUE_PREFILL_S; one that would pass it counting
   its wait alone may, in the same order as the others, take what is kept for the
   replies that could not wait out a recompute, and go in past a request holding its
   line, while every committed reply's KV and the running replies' growth over
   GROWTH_HORIZON_S stay free.
   Among fresh requests, the policy's order, except that requests overdue (waiting
   more than ``overdue_after_ttfts`` times their TTFT, and under sustained overload
   more than OVERDUE_AFTER_FCFS_WAITS times what FCFS would make a new request wait)
   go first, oldest first: someone must wait, and the longest wait is what users feel.

**Reader signals** (:mod:`qos.signals`, recorded by the table, read through
:mod:`qos.policy.presence`): a started reply whose reader is away holding its *return
cushion*, R_i times its pace in tokens (:meth:`ReaderGuard.return_s`), has no deadline,
asks none of the readers' rate, takes spare slots last and, where pausing keeps the KV,
lends its KV to admissions; back, it is due by the model and runs before its reader
has read the cushion. A reader's stated pace (at most the TDS) steps its deadline and
its ask. Nothing a signal says makes a deadline earlier or an ask larger
(docs/architecture/reader-signals.md derives the return bound).

What remains is bounded: a reply can wait beyond its reader's pace for at most one
iteration with the longest single (re)compute prefill (the progress rule) or
FIRST_DUE_PREFILL_S of prefills (first prefills; all admissions', while a reader no slot
paces is committed). One case is left to FCFS's bounds: a paused reply that loses its KV
to the replies' own growth waits for completions to free room for it.
docs/architecture/policy.md derives this and docs/benchmarks.md measures it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from qos.latency import LatencyProfile
from qos.policy import plans, presence
from qos.policy.base import pack_in_order
from qos.policy.decision import Decision, Hold, Ranking
from qos.policy.table import Capacity, RequestTable

GROWTH_HORIZON_S = 2.0
"""How long a fresh request's room keeps the running replies' growth free, and how much
longer that of replies whose readers could not wait out a recompute (rule 3). Given
only the growth until the next completion, the trace's sustained overload outgrew the
cache and recomputed replies (QoE at 2.6 req/s 0.78 against 0.95, docs/benchmarks.md);
with 2 s for every reply and none more, fast readers' replies outgrew it and froze on
the robustness sweep (point 67 of seed 0: 2.75 % of replies over 2 s, FCFS 2.5 %)."""

OVERDUE_AFTER_FCFS_WAITS = 1.25
"""Under sustained overload a waiting request is overdue only once it has also waited
this many times what FCFS would make a request arriving now wait (the requests waiting,
each admitted as a running reply ends): before that, the policy's order may serve
requests still within reach of their TTFT first without their idle latency exceeding
FCFS's. The largest multiple measured (0.5, 1, 1.25, 1.5, 2, 4) that keeps user idle
latency p99 within FCFS's at every overloaded rate on both shipped profiles, over the
trace and over four times its length (docs/benchmarks.md)."""

RECLAIM_AFTER_TTFTS = 0.5
"""A request within its plan's guarantee takes back the KV of borrowed replies
(:meth:`ReaderGuard.admission_lines`) only once it has waited this many TTFTs: admitted then,
its first token still comes within its TTFT (a prefill takes a fraction of one), and
until then a running reply often ends and frees room for it, where every reclaim costs
the lender a recompute (0, 0.5 and 1 measured: docs/benchmarks.md, "Price plans")."""

RECLAIM_SLACK_S = 1.0
"""How much slack a borrowed reply must keep beyond its recompute and the margin to
give its KV back: one that would be due within it is not worth the recompute."""

RETURN_AT = 0.5
"""A reply that lent its KV comes back, where the cache has room, once its slack falls to
this share of ``lend_after_s``, so that lenders lent together do not all come back at
once when due. Of 0.25, 0.5 and 0.75 (docs/benchmarks.md, "Lending paused replies' KV
to host memory"), 0.25 still let a burst of returns stall a reply 1.6 s, and 0.75
shortened the loans so much that the trace's stall-free rate fell by a third."""

NOTICEABLE_GAP_S = 0.1
"""How late past its reader's deadline a token may come before the reader can notice: a
wait shorter than this is not a freeze worth holding an admission for. 0.1 s is the
perceptual processor's cycle (Card, Moran and Newell, "The Psychology of Human-Computer
Interaction", ch. 2: events within one ~100 ms cycle, range 50-200 ms, fuse into one
percept) and the limit under which a system is felt to react at once (Miller, "Response
time in man-computer conversational transactions"; Nielsen, "Usability Engineering" §5.5).
A reader at the shipped chat pace, 4.8 tokens/s, takes 0.21 s a token: such a wait
is half a token's reading, within the spread of a reader's own fixations."""

NON_READER_TIERS = frozenset({"batch"})
"""Tiers whose consumer does not watch the text appear (a job that reads the whole reply
once it ends): not guarded as readers, their QoE is about when they finish."""

FIRST_DUE_PREFILL_S = 1.0
"""The most prefill, in seconds, an iteration takes, all its prefills counted, where it
goes beyond the readers' slack for requests about to pass their TTFT, or where a reader
no slot paces is committed (rule 3): half the
shortest freeze the QoE records count (2 s, :data:`qos.metrics.FREEZE_THRESHOLDS_S`), so
that a burst's first tokens go in over a few iterations and no running reader waits one
iteration of all their prefills. Of 0.5,
1 and no bound, on the robustness sweep's 400 points (two seeds), 1 s ended the one
point where a burst froze running readers (a Gamma burst's 6,700 prompt tokens in one
2.04 s iteration on the slow 70B engine, 13.5 % of its replies) and changed nothing
else; 0.5 s cost QoE at two points."""

MAX_PREFILL_SHARE = 0.5
"""The most of the engine's time the rate room sets aside for admissions' prefills (an
estimate above it comes from a completion rate measured over too few replies)."""


@dataclass(frozen=True)
class GuardSettings:
    """The reader guard's settings, their one home: an engine's configuration (the vLLM
    plugin's environment, the embedded engine's options, a benchmark's flags) sets the
    ones it names and leaves the others at these defaults; a policy without the guard
    refuses them (:func:`qos.policy.registry.make_policy`).

    ``overdue_after_ttfts``: a request waiting longer than this many TTFTs is overdue
    (None: never), and under sustained overload only once it has also waited
    ``overdue_after_fcfs_waits`` times FCFS's wait (:meth:`ReaderGuard.overdue`);
    ``lend_after_s``: replies with more slack than this lend their KV (None: none
    lends; rule 3); ``margin_s``: a fixed margin in place of
    :meth:`ReaderGuard.margin_s`'s; ``non_reader_tiers``: tiers whose consumer does not
    watch the text."""

    overdue_after_ttfts: float | None = 10.0
    overdue_after_fcfs_waits: float = OVERDUE_AFTER_FCFS_WAITS
    lend_after_s: float | None = None
    margin_s: float | None = None
    non_reader_tiers: frozenset[str] = NON_READER_TIERS

    def __post_init__(self) -> None:
        ttfts, waits = self.overdue_after_ttfts, self.overdue_after_fcfs_waits
        if ttfts is not None and not ttfts > 0:
            raise ValueError(f"overdue_after_ttfts: must be > 0 (TTFTs), got {ttfts}")
        if not 0 <= waits < math.inf:
            raise ValueError(f"overdue_after_fcfs_waits: must be finite, >= 0, got {waits}")
        if self.lend_after_s is not None and not self.lend_after_s > 0:
            raise ValueError(f"lend_after_s: must be > 0 seconds, got {self.lend_after_s}")
        if self.margin_s is not None and not self.margin_s > 0:
            raise ValueError(f"margin_s: must be > 0 seconds, got {self.margin_s}")


def chosen_guard(
    *,
    overdue_after_ttfts: float | None = None,
    overdue_after_fcfs_waits: float | None = None,
    lend_after_s: float | None = None,
) -> GuardSettings | None:
    """The reader guard's settings an engine's configuration chose (the vLLM plugin's
    environment, the embedded engine's options, a benchmark's flags): those given over
    the defaults, ``math.inf`` turning a rule off (never overdue, never lending). None
    where none was given, so that a policy without the guard is refused only settings
    someone set (:func:`qos.policy.registry.make_policy`). ValueError: one out of range."""
    if overdue_after_ttfts is None and overdue_after_fcfs_waits is None and lend_after_s is None:
        return None
    default = GuardSettings()
    if overdue_after_fcfs_waits is None:
        overdue_after_fcfs_waits = default.overdue_after_fcfs_waits
    return GuardSettings(
        overdue_after_ttfts=_chosen(overdue_after_ttfts, default.overdue_after_ttfts),
        overdue_after_fcfs_waits=overdue_after_fcfs_waits,
        lend_after_s=_chosen(lend_after_s, default.lend_after_s),
    )


def _chosen(value: float | None, default: float | None) -> float | None:
    """``value`` where given (``math.inf``: the rule off, None), else ``default``."""
    if value is None:
        return default
    return None if value == math.inf else value


class ReaderGuard:
    """Applies the reader's deadline (module doc) to a policy's decision, with
    ``settings``; ``weights``: False where tenants' weights are ignored (every plan
    alike)."""

    def __init__(
        self,
        profile: LatencyProfile,
        settings: GuardSettings = GuardSettings(),
        *,
        weights: bool = True,
    ) -> None:
        self.profile = profile
        self.settings = settings
        self.weights = weights
        self.recent = plans.RecentDemand()  # each tenant's recent requests (plans' headroom)

    def set_profile(self, profile: LatencyProfile) -> None:
        self.profile = profile

    def margin_s(self, tau: float, capacity: Capacity) -> float:
        """How long a row left out can wait for the next decision: one iteration τ plus
        the prefill base an iteration that admits anything pays, doubled for the
        iteration's own admissions (bounded by the prefill budget, rule 3), plus how long
        the engine lets a decision stand."""
        if self.settings.margin_s is not None:
            return self.settings.margin_s
        return 2.0 * (tau + self.profile.prefill_base_s) + capacity.decision_interval_s

    def readers(self, table: RequestTable) -> np.ndarray:
        """Which rows have a reader watching the text appear: all but those of the
        ``non_reader_tiers``, whose QoE is about when the reply ends, not its pace."""
        tiers = self.settings.non_reader_tiers
        skip = [i for i, name in enumerate(table.tier_names) if name in tiers]
        if not skip:
            return np.ones(table.n, dtype=bool)
        readers: np.ndarray = ~np.isin(table.col("tier"), skip)
        return readers

    def return_s(self, table: RequestTable, tau: float, capacity: Capacity) -> np.ndarray:
        """R_i, how long each reply takes to give its returning reader a token: the
        signal's path to the table (SIGNAL_PATH_S and the engine's decision interval),
        the wait for a decision that runs it (the margin) and its lead, one iteration
        plus the prefill of its whole context (the KV of a reply that yields may be
        lost). A reader who comes back holding R_i times its pace in tokens reads on
        without a stop (docs/architecture/reader-signals.md derives it)."""
        p = self.profile
        path = presence.SIGNAL_PATH_S + capacity.decision_interval_s
        recompute = p.prefill_base_s + p.prefill_per_token_s * table.context
        wait: np.ndarray = path + self.margin_s(tau, capacity) + tau + recompute
        return wait

    def yielding(
        self, table: RequestTable, now: float, tau: float, capacity: Capacity
    ) -> np.ndarray:
        """The readers' rows that owe no token now: away, holding their return cushion
        (:func:`qos.policy.presence.yielding`, for :meth:`return_s`)."""
        if not presence.signalled(table).any():
            return np.zeros(table.n, dtype=bool)
        mask: np.ndarray = self.readers(table) & presence.yielding(
            table, now, self.return_s(table, tau, capacity)
        )
        return mask

    def deadline(self, table: RequestTable, tau: float) -> np.ndarray:
        """D_i = d_n + 1/p_i, when each reader runs out of tokens by the server's model,
        at its protected pace min(p_i, 1/τ), p_i the reader's pace (the tier's TDS
        unless its client said slower). A stated buffer does not move it: one below the
        model ("buffer empty") cannot be told from a lie, and sending sooner does not
        push tokens through a stalled network; one above it (a reader back from away)
        would keep the reply's KV idle while others wait for room
        (docs/architecture/reader-signals.md gives the measures)."""
        step = np.maximum(1.0 / table.col("reader_pace"), tau)
        deadline: np.ndarray = table.col("dig_last") + step
        return deadline

    def slack(
        self, table: RequestTable, now: float, tau: float, yielding: np.ndarray | None = None
    ) -> np.ndarray:
        """s_i = D_i + NOTICEABLE_GAP_S - now - lead_i for every reader's row
        (:meth:`deadline`) (+inf for rows with no token yet, for non-readers and for
        the ``yielding`` rows, :meth:`yielding`)."""
        uncomputed = table.context - table.col("computed")
        lead = tau + np.where(
            uncomputed > 0,
            self.profile.prefill_base_s + self.profile.prefill_per_token_s * uncomputed,
            0.0,
        )
        watched = (table.col("output") > 0) & self.readers(table)
        if yielding is not None:
            watched &= ~yielding
        deadline = self.deadline(table, tau) + NOTICEABLE_GAP_S
        slack: np.ndarray = np.where(watched, deadline - now - lead, np.inf)
        return slack

    def on_arrival(self, table: RequestTable, row: int, now: float) -> None:
        """Remember what a tenant's new request needs (the plans' headroom)."""
        if self.weights:
            weight, tenant = float(table.col("weight")[row]), int(table.col("tenant")[row])
            kv = int(table.demand[row])
            reads = bool(self.readers(table)[row])
            # what it takes of the readers' rate (:meth:`asks`): at most one slot's share
            # of the full batch's decode rate
            full = self.profile.max_batch
            tds = min(float(table.col("tds")[row]), 1.0 / float(self.profile.decode_s(full)))
            self.recent.add(now, tenant, weight, kv, tds if reads else 0.0)

    def reader_rate(
        self,
        table: RequestTable,
        capacity: Capacity,
        demand: np.ndarray,
        committed: np.ndarray,
        waiting: np.ndarray,
        room_wait_s: float,
        loan_share: float,
    ) -> float:
        """Tokens a second the engine can pace readers at (rule 3): its full batch's
        decode rate R = B / τ(B), τ with the committed replies' mean context, times the
        share of time left to decoding, 1 - λ·p̄ - ``loan_share`` (λ = 1/``room_wait_s``,
        the completion rate, which in steady state is the admission rate; p̄ the mean
        prefill of the ``waiting`` rows; ``loan_share``: :meth:`loan_share`). Readers
        asking more than that (:meth:`asks`, summed) cannot all be paced, whichever of
        them the slots go to (Wang et al., "Revisiting SLOs and System Level Metrics in
        LLM Serving" §4.3: the reader feels the longest wait)."""
        p, b = self.profile, capacity.max_batch
        replies = _count(committed)
        context = b * float(demand @ committed) / replies if replies else 0.0
        full = b / float(p.decode_s(b, context))
        share = 0.0
        if room_wait_s > 0 and waiting.size:
            uncomputed = table.context[waiting] - table.col("computed")[waiting]
            prefill_tokens = float(uncomputed.sum()) / waiting.size
            prefill = p.prefill_base_s + p.prefill_per_token_s * prefill_tokens
            share = min(prefill / room_wait_s, MAX_PREFILL_SHARE)
        return full * max(1.0 - share - loan_share, 0.0)

    def asks(
        self, table: RequestTable, sequence_rate: float, yielding: np.ndarray | None = None
    ) -> np.ndarray:
        """What each row's reader takes of the rate room: min(p_i, r), p_i the reader's
        pace (the tier's TDS unless its client said slower), 0 for non-readers, who
        watch no pace, and for the ``yielding`` rows (:meth:`yielding`), whose readers
        are away. r = R/B, what one of the full batch's B slots receives of its rate R
        (:meth:`reader_rate`): no sequence in that batch decodes faster, so a reader
        asking more is paced at the engine's speed by any slot, and B such readers fill
        the batch, never the room before it."""
        readers = self.readers(table)
        if yielding is not None:
            readers = readers & ~yielding
        asks: np.ndarray = np.where(
            readers, np.minimum(table.col("reader_pace"), sequence_rate), 0.0
        )
        return asks

    def loan_share(self, kv_committed: float, kv_tokens: float, margin: float) -> float:
        """The share of the engine's time the loans take (rule 3), where replies lend
        their KV: what the committed replies hold beyond the cache, ``kv_committed`` -
        ``kv_tokens`` tokens, is on loan at any time; a loan lasts about
        ``lend_after_s`` · (1 - RETURN_AT) - ``margin`` (a reply lends once its slack
        passes ``lend_after_s`` and comes back from RETURN_AT of it, within the next
        decision) and moves its KV out and back, 2·c a token (c: the profile's swap
        cost; where it has none, the loan is recomputed, p a token)."""
        lent = kv_committed - kv_tokens
        lend_after_s = self.settings.lend_after_s
        if lend_after_s is None or lent <= 0:
            return 0.0
        p = self.profile
        swap = p.swap_per_token_s
        per_token = 2.0 * swap if swap is not None else p.prefill_per_token_s
        loan_s = lend_after_s * (1.0 - RETURN_AT) - margin
        return lent * per_token / max(loan_s, margin)

    def apply(
        self,
        table: RequestTable,
        capacity: Capacity,
        demand: np.ndarray,
        ranking: Ranking,
        now: float,
        *,
        room_wait_s: float = 0.0,
        reply_s: float = plans.PLAN_MEMORY_S,
    ) -> Decision:
        """The decision under rules 1-3 (module doc) on ``ranking``: the requests the
        ranking stage would admit, in its order of preference, the τ it expects and the
        tenants' VTC levels (:mod:`qos.policy.fair`), which order the due replies, lowest
        level first, should more be due than the engine can run. ``room_wait_s``: the
        expected time until a running reply ends (1/λ, λ the completion rate);
        ``reply_s``: how long a reply holds its room (the mean time from arrival to
        completion)."""
        tau = ranking.tau
        replies = self.replies(table, capacity, demand, now, tau)
        due, forced = _due(replies, capacity, ranking.levels)
        fresh = ranking.admissions[~replies.committed[ranking.admissions]]
        overdue, fresh = self.overdue(table, fresh, now, room_wait_s)
        waiting = np.concatenate((overdue, fresh))
        loans = self.loan_share(float(replies.kv), capacity.kv_tokens, replies.margin)
        reader_rate = self.reader_rate(
            table, capacity, demand, replies.committed, waiting, room_wait_s, loans
        )
        sequence_rate = reader_rate / capacity.max_batch
        asks = self.asks(table, sequence_rate, replies.yielding)
        batch = _Batch(
            table,
            demand,
            replies.committed,
            asks,
            self.readers(table),
            capacity.max_batch,
            self.profile,
        )
        # a request that would pass its TTFT before the next decision has a user about to
        # notice a wait too (the wait for the first token is idle latency, Wang et al. Eq.
        # 9): it may go in past a request holding its line; and one that would once the
        # prefills in line before it are made has its prefill go in whatever the budget
        # (counted against it)
        waited = now + replies.margin - table.col("arrival")
        batch.first_due = ~replies.committed & (waited > table.col("ttft"))
        batch.prefill_due[waiting] = self.ttft_slack(table, waiting, now) <= replies.margin
        _take_due(batch, replies, due, capacity)
        paced = table.col("reader_pace") < sequence_rate
        batch.budget = self._prefill_budget(
            replies.slack, paced, batch.keep, replies.committed, tau
        )
        lines = self.admission_lines(
            table, replies, capacity, overdue, fresh, asks, reader_rate, now, reply_s
        )
        room = self.room(table, capacity, replies, tau)
        rate = reader_rate - float(asks[replies.committed].sum())  # the rate room
        if capacity.pauses:
            self._fill_pausing(batch, replies, lines, capacity, room, rate)
        else:
            self._fill_recomputing(batch, replies, lines, capacity, room, rate)
        _progress(batch, replies, lines, capacity)
        holds = np.zeros(table.n, dtype=np.int8)
        held = waiting[~batch.keep[waiting]]
        holds[held] = batch.holds[held]
        return Decision(batch.keep, holds, forced, _count(replies.running & ~batch.keep))

    def ttft_slack(self, table: RequestTable, waiting: np.ndarray, now: float) -> np.ndarray:
        """How long each request of ``waiting`` (the requests waiting, in line) can still
        wait before the prefills in line up to its own, made one after another, take it
        past its TTFT: a burst's last request is due when the burst's prefills would make
        it late, not when it alone would be (rule 3)."""
        p = self.profile
        uncomputed = table.context[waiting] - table.col("computed")[waiting]
        lead = np.cumsum(p.prefill_base_s + p.prefill_per_token_s * uncomputed)
        ttft = table.col("arrival")[waiting] + table.col("ttft")[waiting]
        slack: np.ndarray = ttft - now - lead
        return slack

    def replies(
        self, table: RequestTable, capacity: Capacity, demand: np.ndarray, now: float, tau: float
    ) -> _Replies:
        """What a decision reads of the replies: :class:`_Replies`."""
        running = table.running
        started = table.col("output") > 0
        margin = self.margin_s(tau, capacity)
        yielding = self.yielding(table, now, tau, capacity)
        slack = self.slack(table, now, tau, yielding)
        p = self.profile
        recompute = p.prefill_base_s + p.prefill_per_token_s * table.context
        committed = started | running
        short = started & (slack - recompute <= margin)
        reserved = committed
        if capacity.pauses:
            # a reply whose reader is away holding its return cushion lends its KV: it
            # stays in the cache until admissions need it, and the cushion covers the
            # recompute on return (:meth:`return_s`); taken back when due (rule 1)
            reserved = committed & ~yielding
        lend_after_s = self.settings.lend_after_s
        if lend_after_s is not None:  # replies due later than that lend their KV
            reserved = committed & (slack <= lend_after_s)
        # what the running replies that keep their KV grow by over GROWTH_HORIZON_S (at
        # least until the next decision), and GROWTH_HORIZON_S more for those whose
        # readers could not wait out a recompute: admitting into it would have the cache
        # outgrown; past it, the overflow falls on the replies with the most slack (rule
        # 2), a recompute their slack covers, as FCFS, filling the cache, recomputes. A
        # reply whose reader is away lends its KV but grows while it runs: its growth
        # stays free too (freed with the KV, admissions outgrew the cache, and the
        # watched readers' QoE fell below the same policy's without signals under
        # overload, docs/benchmarks.md, "Reader signals")
        steps = (max(GROWTH_HORIZON_S, margin) + np.where(short, GROWTH_HORIZON_S, 0.0)) / tau
        growing = running & (reserved | yielding)
        growth = np.where(growing, _growth(table, capacity, demand, steps), 0)
        return _Replies(
            running=running,
            started=started,
            committed=committed,
            resident=running | (table.col("computed") > 0),
            yielding=yielding,
            slack=slack,
            short=short,
            reserved=reserved,
            growth=growth,
            recompute_s=recompute,
            margin=margin,
            demand=demand,
            kv=int(demand @ committed),
        )

    def room(self, table: RequestTable, capacity: Capacity, replies: _Replies, tau: float) -> _Room:
        """The KV fresh requests may take (rule 3): :class:`_Room`."""
        # requests about to pass their TTFT may also take what is kept for a late
        # completion, while every committed reply's KV and the running replies' growth
        # over GROWTH_HORIZON_S stay free
        late_growth = _growth(table, capacity, replies.demand, GROWTH_HORIZON_S / tau)
        return _Room(
            fresh=capacity.kv_tokens
            - int(replies.demand @ replies.reserved)
            - int(replies.growth.sum()),
            late=capacity.kv_tokens - replies.kv - int(late_growth[table.running].sum()),
        )

    def _fill_pausing(
        self,
        batch: _Batch,
        replies: _Replies,
        lines: list[_Line],
        capacity: Capacity,
        room: _Room,
        rate: float,
    ) -> None:
        """Where pausing keeps the KV: fresh requests take the slots that replies ahead of
        their readers give up, then the replies fill what is left: those whose KV is in
        the cache, then, into what the paused ones leave free, those that lost it (a
        reply brought back early must not push a paused one out), and only while every
        committed reply's KV fits the cache: past that (loans, the replies' own growth)
        the one brought back pushes another out later, to come back in turn, each move a
        recompute (replies went in and out dozens of times, docs/benchmarks.md, "Price
        plans"); it comes back when due (rule 1)."""
        kv, slack, resident = capacity.kv_tokens, replies.slack, replies.resident
        lend_after_s = self.settings.lend_after_s
        rest = replies.committed & ~batch.keep
        self._admit(batch, lines, min(room.fresh, capacity.kv_tokens - batch.kv), rate)
        _admit_late(batch, lines, room.late, capacity, rate)
        if lend_after_s is not None:
            # lenders halfway due come back into the KV of paused replies that would
            # lend theirs, within the prefill budget: spread over the iterations, not
            # all at once when due (rule 1), as lenders lent together would be
            staying = int(replies.demand @ (rest & resident & (slack <= lend_after_s)))
            back = rest & ~resident & (slack <= lend_after_s * RETURN_AT)
            batch.take(_by(slack, back), kv - batch.kv - staying)
        batch.take(_by(slack, rest & resident), kv - batch.kv)
        if replies.kv <= kv:
            paused = int(replies.demand @ (resident & ~batch.keep))
            batch.take(_by(slack, rest & ~resident), kv - batch.kv - paused)

    def _fill_recomputing(
        self,
        batch: _Batch,
        replies: _Replies,
        lines: list[_Line],
        capacity: Capacity,
        room: _Room,
        rate: float,
    ) -> None:
        """Where pausing would lose the KV: the running replies stay, the parked ones come
        back, then fresh requests take the room left."""
        rest = replies.committed & ~batch.keep
        batch.take(_by(replies.slack, rest & replies.running), capacity.kv_tokens - batch.kv)
        batch.take(_by(replies.slack, rest & ~replies.running), capacity.kv_tokens - batch.kv)
        self._admit(batch, lines, min(room.fresh, capacity.kv_tokens - batch.kv), rate)
        _admit_late(batch, lines, room.late, capacity, rate)

    def overdue(
        self, table: RequestTable, rows: np.ndarray, now: float, room_wait_s: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` (all the requests waiting, in the policy's order) split into the
        overdue ones, oldest first, and the others, in the policy's order. A request is
        overdue once it has waited ``overdue_after_ttfts`` times its TTFT and
        ``overdue_after_fcfs_waits`` times FCFS's wait now: the requests waiting times
        ``room_wait_s``, the expected time until a running reply ends and admits one."""
        ttfts = self.settings.overdue_after_ttfts
        if ttfts is None or not rows.size:
            return rows[:0], rows
        arrival = table.col("arrival")[rows]
        fcfs_wait_s = rows.size * room_wait_s
        bound = np.maximum(
            ttfts * table.col("ttft")[rows],
            self.settings.overdue_after_fcfs_waits * fcfs_wait_s,
        )
        late = now - arrival > bound
        oldest = rows[late][np.argsort(arrival[late], kind="stable")]
        return oldest, rows[~late]

    def admission_lines(
        self,
        table: RequestTable,
        replies: _Replies,
        capacity: Capacity,
        overdue: np.ndarray,
        fresh: np.ndarray,
        asks: np.ndarray,
        reader_rate: float,
        now: float,
        reply_s: float,
    ) -> list[_Line]:
        """The waiting requests as lines of admission (:mod:`qos.policy.plans`): one
        line; or, when the tenants' weights act and differ, three: the requests within their
        tenants' guarantees; those beyond them but within plan (borrowing what another
        tenant does not use); the rest, the higher weights first. The last two leave the
        tenants' headroom free. Each rule holds for both resources, the cache (less the
        running replies' expected growth) and the readers' rate (``reader_rate``, tokens a
        second, of which each row takes ``asks``). Once a request within its guarantee
        has waited RECLAIM_AFTER_TTFTS, the first line may also take the
        KV of the replies that can lend it (:func:`_lenders`) and run on borrowed room
        (:func:`~qos.policy.plans.reclaimable`): the engine drops it and they are
        recomputed when due."""
        if not self.weights:
            return [_Line(overdue, fresh)]
        committed, demand = replies.committed, replies.demand
        waiting = np.concatenate((overdue, fresh))
        present = committed.copy()
        present[waiting] = True
        tenants = len(table.tenant_names)
        weight = self.recent.weights(now, tenants)
        if not waiting.size or not plans.weighted(table, present, weight):
            return [_Line(overdue, fresh)]
        kv_demand, tds_demand = self.recent.demand(tenants, reply_s)
        within = np.ones(waiting.size, dtype=bool)
        guaranteed = np.ones(waiting.size, dtype=bool)
        resources = (
            (demand, float(capacity.kv_tokens - int(replies.growth.sum())), kv_demand),
            (asks, reader_rate, tds_demand),
        )
        guarantees = []
        for need, total, _ in resources:
            within &= plans.within_plan(table, waiting, committed, need, total)
            guarantee = plans.guarantees(table, waiting, committed, total, weight)
            guaranteed &= plans.within_limit(table, waiting, committed, need, guarantee)
            guarantees.append(guarantee)
        spare_kv, spare_tds = (
            plans.headroom(table, waiting, guaranteed, committed, need, guarantee, expected)
            for (need, _, expected), guarantee in zip(resources, guarantees, strict=True)
        )
        first = waiting[guaranteed]
        waited = now - table.col("arrival")[first] >= RECLAIM_AFTER_TTFTS * table.col("ttft")[first]
        reclaim = 0.0
        if waited.any():
            borrowed = plans.beyond_guarantee(table, committed, demand, guarantees[0])
            lenders = _lenders(table, replies, capacity) & borrowed
            held = demand + replies.growth  # a reply taken back frees its growth too
            reclaim = plans.reclaimable(table, committed, lenders, held, guarantees[0])
        borrowing, beyond = within & ~guaranteed, ~within & ~guaranteed
        n = overdue.size
        return [
            _Line(overdue[guaranteed[:n]], fresh[guaranteed[n:]], reclaim_kv=int(reclaim)),
            _Line(overdue[borrowing[:n]], fresh[borrowing[n:]], int(spare_kv), spare_tds),
            _Line(
                plans.by_weight(table, overdue[beyond[:n]]),
                plans.by_weight(table, fresh[beyond[n:]]),
                int(spare_kv),
                spare_tds,
            ),
        ]

    @staticmethod
    def _admit(batch: _Batch, lines: list[_Line], kv_tokens: int, rate: float) -> None:
        """Each line in turn, within ``kv_tokens`` of KV and ``rate`` tokens a second of
        new readers: its overdue requests in line (the oldest first; one that does not
        fit holds the room for itself, as FCFS would), then, if they all went in, the
        others; the next line only once this one is all in."""
        kv_start, tds_start = batch.kv, batch.tds

        def left(line: _Line) -> tuple[int, float]:
            kv = kv_tokens + line.reclaim_kv - line.spare_kv - (batch.kv - kv_start)
            return kv, rate - line.spare_tds - (batch.tds - tds_start)

        for line in lines:
            if line.overdue.size and not batch.take_in_line(line.overdue, *left(line)):
                return
            batch.take(line.fresh, *left(line))
            if not batch.keep[line.fresh].all():
                return

    def _prefill_budget(
        self,
        slack: np.ndarray,
        paced: np.ndarray,
        keep: np.ndarray,
        committed: np.ndarray,
        tau: float,
    ) -> float:
        """Seconds of prefill the iteration may add without making a reader wait: no
        more than the slack of any reply that runs in it, nor than what the replies left
        out can spare beyond the next iteration (they may run at the next decision).
        That holds while every committed reader is ``paced``: asks no more than one
        slot's share of the full batch's rate (:meth:`asks`). While a reader no slot
        paces is committed, FIRST_DUE_PREFILL_S: its reply falls behind under any order,
        and each split of a burst's prefills would delay it one more prefill base, which
        its idle latency keeps (Wang et al. Eq. 9), where the paced readers' slack comes
        back at their pace."""
        watched = committed & np.isfinite(slack)  # finite: a started reply, watched
        if (watched & ~paced).any():
            return FIRST_DUE_PREFILL_S
        ran = slack[keep & watched]
        waits = slack[watched & ~keep]
        budget = float(ran.min()) if ran.size else np.inf
        if waits.size:
            budget = min(budget, float(waits.min()) - tau - self.profile.prefill_base_s)
        return budget


@dataclass(frozen=True)
class _Replies:
    """What one decision reads of the table's rows (module doc, rules 1-2)."""

    running: np.ndarray  # in the engine's batch now
    started: np.ndarray  # a token shown
    committed: np.ndarray  # started or running: their KV is counted before any admission
    resident: np.ndarray  # their KV in the cache
    yielding: np.ndarray  # readers away, holding their return cushion
    slack: np.ndarray  # seconds each reader can still wait (+inf: none watching)
    short: np.ndarray  # started, and could not wait for their own recompute (KV lost)
    reserved: np.ndarray  # committed, their KV kept from admissions (not lent)
    growth: np.ndarray  # KV tokens each running row grows by (0 where a watched one lends)
    recompute_s: np.ndarray  # each row's whole context prefilled again
    margin: float  # the wait for the next decision (:meth:`ReaderGuard.margin_s`)
    demand: np.ndarray  # each row's KV tokens
    kv: int  # the committed rows' KV tokens


class _Room(NamedTuple):
    """The KV tokens fresh requests may take (rule 3): ``fresh``, the cache less the
    committed replies' KV (not that of replies whose readers are away, where pausing
    keeps it) and the running replies' growth over GROWTH_HORIZON_S (twice that for
    replies that could not wait out a recompute); ``late``, for requests about to pass
    their TTFT, the cache less every committed reply's KV and the running replies'
    growth over GROWTH_HORIZON_S."""

    fresh: int
    late: int


class _Line(NamedTuple):
    """A line of admission: its overdue requests (oldest first), its others (in the
    policy's order), what the line must leave free (KV tokens, readers' tokens/s) and
    the KV it may take back from borrowed replies beyond the room left."""

    overdue: np.ndarray
    fresh: np.ndarray
    spare_kv: int = 0
    spare_tds: float = 0.0
    reclaim_kv: int = 0


class _Batch:
    """The batch being built: rows taken in turn, each within the KV given, the batch
    limit, the prefill budget (what taken rows must (re)compute, in seconds) and, for
    rows not yet committed, the readers' rate given (what each asks of it, summed)."""

    def __init__(
        self,
        table: RequestTable,
        demand: np.ndarray,
        committed: np.ndarray,
        asks: np.ndarray,
        readers: np.ndarray,
        max_batch: int,
        profile: LatencyProfile,
    ) -> None:
        self.demand = demand
        self.fresh = ~committed  # requests with no token yet, not running
        self.reads = readers & self.fresh  # new readers: they take of the rate room
        self.asks = np.where(self.reads, asks, 0.0)
        self.uncomputed = table.context - table.col("computed")
        self.slots = max_batch
        self.profile = profile
        self.first_due = np.zeros(table.n, dtype=bool)  # held, they would pass their TTFT
        self.prefill_due = np.zeros(table.n, dtype=bool)  # ... or would, with those in line
        self.keep = np.zeros(table.n, dtype=bool)
        self.holds = np.full(table.n, Hold.LINE, dtype=np.int8)  # why a row was left out
        self.taken = 0  # rows in keep
        self.kv = 0
        self.tds = 0.0  # new readers' rate taken
        self.budget = np.inf
        self.prefill_s = 0.0  # the prefill taken, in seconds

    def take_in_line(self, order: np.ndarray, kv_tokens: int, tds: float = np.inf) -> bool:
        """Take the rows of ``order`` up to the first that does not fit; whether all did."""
        slots = self.slots - self.taken
        need = np.cumsum(self.demand[order])
        line = order[: min(int(np.searchsorted(need, kv_tokens, side="right")), max(slots, 0))]
        if line.size < order.size:  # the first left out holds the line behind it
            self.holds[order[line.size]] = Hold.SLOTS if line.size >= slots else Hold.KV
        before = self.taken
        self.take(line, kv_tokens, tds)
        return self.taken - before == order.size

    def take(self, order: np.ndarray, kv_tokens: int, tds: float = np.inf) -> None:
        """Take the rows of ``order`` that fit, in order, skipping the others; new
        readers only while their TDS, summed, stays within ``tds`` (the first that does
        not fit stops the new ones after it)."""
        slots = self.slots - self.taken
        if not order.size:
            return
        if kv_tokens <= 0 or slots <= 0:
            self.holds[order] = Hold.SLOTS if slots <= 0 else Hold.KV
            return
        taken = pack_in_order(order, self.demand, kv_tokens, slots, self.keep.size)
        full = np.count_nonzero(taken) == slots
        self.holds[order[~taken[order]]] = Hold.SLOTS if full else Hold.KV
        rows = order[taken[order]]
        reads = self.reads[rows]
        if reads.any():
            within = (np.cumsum(self.asks[rows]) <= tds + 1e-9) & (tds > 0)
            self.holds[rows[reads & ~within]] = Hold.READERS_RATE
            rows = rows[~reads | within]
        prefill = self.uncomputed[rows]
        if prefill.any():  # within the budget; the first prefill of a batch always fits
            p = self.profile
            cost = np.cumsum(np.where(prefill > 0, p.prefill_per_token_s * prefill, 0.0))
            cost += p.prefill_base_s
            due = self.prefill_due[rows] & (self.prefill_s + cost <= FIRST_DUE_PREFILL_S)
            fits = (cost <= self.budget) | (prefill == 0) | due
            if not self.prefill_s:
                fits[int(np.argmax(prefill > 0))] = True
            self.holds[rows[~fits]] = Hold.PREFILL
            rows = rows[fits]
            spent = prefill[fits]
            if spent.any():
                spent_s = p.prefill_per_token_s * float(spent.sum()) + p.prefill_base_s
                self.budget -= spent_s
                self.prefill_s += spent_s
        self.keep[rows] = True
        self.taken += rows.size
        self.kv += int(self.demand[rows].sum())
        self.tds += float(self.asks[rows].sum())


def _growth(
    table: RequestTable, capacity: Capacity, demand: np.ndarray, steps: float | np.ndarray
) -> np.ndarray:
    """KV tokens each row grows by in ``steps`` iterations (one count for all, or each
    row's), one token an iteration (at most what it has left, where its length is
    known), in the whole blocks the engine allocates."""
    whole = np.ceil(steps).astype(np.int64)
    left = table.col("max_tokens") - table.col("output")
    grown = table.context + 1 + np.where(left >= 0, np.minimum(left, whole), whole)
    growth: np.ndarray = capacity.in_blocks(grown) - demand
    return growth


def _due(
    replies: _Replies, capacity: Capacity, levels: np.ndarray | None
) -> tuple[np.ndarray, int]:
    """Rule 1: the rows that run whatever the ranking says, least slack first (the
    tenants' VTC ``levels`` first, lowest first, where weights act), and how many of them
    the engine is not running now. Due are the started replies whose slack is within the
    margin, where pausing loses the KV the running ones that could not wait for their own
    recompute, and prefills under way (the engine's own chunking)."""
    must = replies.started & (replies.slack <= replies.margin)
    if not capacity.pauses:  # a running reply left out would be recomputed first
        must |= replies.running & replies.short
    must |= replies.running & ~replies.started
    due = _by(replies.slack, must)
    if levels is not None:
        due = due[np.argsort(levels[due], kind="stable")]
    return due, _count(must & ~replies.running)


def _take_due(batch: _Batch, replies: _Replies, due: np.ndarray, capacity: Capacity) -> None:
    """The ``due`` rows into the batch. Where pausing keeps the KV, a due reply that lost
    its KV comes back only into what is left once the replies in the cache that are due,
    or would be after a recompute, keep theirs: pushing one out would pass the recompute
    on, one a decision, with nobody served sooner (rule 2, as where pausing loses the
    KV)."""
    holding = 0
    if capacity.pauses:
        batch.take(due[replies.resident[due]], capacity.kv_tokens)
        keeps = replies.resident & replies.short & ~batch.keep
        holding = int(replies.demand @ keeps)
        due = due[~replies.resident[due]]
    batch.take(due, capacity.kv_tokens - batch.kv - holding)


def _lenders(table: RequestTable, replies: _Replies, capacity: Capacity) -> np.ndarray:
    """The replies that can give their KV back to a request within its plan's guarantee,
    where pausing keeps it: started, with it in the cache, and their recompute, the margin
    and RECLAIM_SLACK_S of slack to spare (so none is due)."""
    spare = replies.slack - replies.recompute_s > replies.margin + RECLAIM_SLACK_S
    lenders: np.ndarray = replies.started & (table.col("computed") > 0) & spare
    return lenders & capacity.pauses


def _progress(batch: _Batch, replies: _Replies, lines: list[_Line], capacity: Capacity) -> None:
    """An engine that would run nothing brings back a reply that gave way, least slack
    first, even where the committed replies' KV together exceeds the cache (a batch
    job's reply, never due, would wait for ever); one with nothing committed admits the
    first request that fits (:func:`_admit_first`)."""
    if not batch.keep.any():
        batch.take(_by(replies.slack, replies.committed), capacity.kv_tokens)
    if not replies.committed.any() and not batch.keep.any():
        _admit_first(batch, lines, capacity.kv_tokens)


def _admit_late(
    batch: _Batch, lines: list[_Line], room: int, capacity: Capacity, rate: float
) -> None:
    """The requests still waiting that would pass their TTFT before the next decision
    (``batch.first_due``), in the lines' order, into ``room`` tokens of KV less what
    this decision admitted (the whole cache less the committed replies' KV and growth)
    and ``rate``, the readers' rate room, less what this decision's new readers took
    (rule 3), past a request holding their line: a user past the TTFT is already waiting
    (user idle latency, Wang et al. Eq. 9)."""
    waiting = batch.first_due & ~batch.keep
    late = [  # the KV that borrowed replies give back went to the lines before
        line._replace(
            overdue=line.overdue[waiting[line.overdue]],
            fresh=line.fresh[waiting[line.fresh]],
            reclaim_kv=0,
        )
        for line in lines
    ]
    if any(line.overdue.size or line.fresh.size for line in late):
        admitted = int(batch.demand @ (batch.keep & batch.fresh))
        kv = min(room - admitted, capacity.kv_tokens - batch.kv)
        ReaderGuard._admit(batch, late, kv, rate - batch.tds)


def _admit_first(batch: _Batch, lines: list[_Line], kv_tokens: int) -> None:
    """An idle engine admits the first request, in the lines' order, that fits
    ``kv_tokens``, whatever the plans keep free and however fast its reader: what is kept
    is for tenants that may send, and with nothing running nobody else's reader can be
    slowed, so leaving the engine idle would serve nobody (progress)."""
    order = np.concatenate([np.concatenate((line.overdue, line.fresh)) for line in lines])
    fits = order[batch.demand[order] <= kv_tokens]
    batch.take(fits[:1], kv_tokens)


def _by(slack: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows of mask ``rows``, least slack first."""
    found = rows.nonzero()[0]
    ordered: np.ndarray = found[np.argsort(slack[found], kind="stable")]
    return ordered


def _count(mask: np.ndarray) -> int:
    return int(np.count_nonzero(mask))
