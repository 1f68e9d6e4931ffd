"""Price plans: weights decide who absorbs a shortfall, not how many tokens each tenant gets.

A reader consumes a few tokens a second; once every tenant's readers are served at their
pace, more tokens buy nobody anything, so holding a tenant to a share of *service*
(VTC) only makes its users wait. What a contended engine runs short of is room for new
replies, of two kinds, each held by every started reply until it ends (the reader guard,
:mod:`qos.policy.reader`, admits a request only into what is left of both): the KV cache,
and the readers' rate, the tokens a second the full batch can pace readers at. The plans
split each (``room`` C below is one of them; ``need`` what a request takes of it):

- tenant f's *hold* h_f is what its committed replies take; its *want* is h_f plus what
  its waiting requests need;
- its *guarantee* g_f = w_f / Σw · C over the tenants present (with a reply or a request
  in the engine, or a request within the last ``PLAN_MEMORY_S``): a request of f is
  *within its guarantee* while h_f plus its need and the needs of f's requests ahead of
  it stay within g_f, in both resources. These are admitted first;
- its *share* s_f is the weighted max-min split of C by the wants
  (:func:`qos.fairness.water_fill`): a tenant that wants less than its share keeps only
  what it wants, and its excess goes to the others by weight. A request beyond its
  guarantee but within its share *borrows* that excess; it is admitted next, and the
  requests beyond their shares last, the higher weights first;
- a borrower leaves every tenant its *headroom* (:func:`headroom`): what its replies
  will hold, at the pace it has been sending (Little's law over :class:`RecentDemand`),
  beyond what they hold now, plus one request's worth, within its guarantee;
- where pausing keeps the KV, a request within its guarantee that has waited half its
  TTFT takes the KV of replies on borrowed room (:func:`beyond_guarantee`) back
  (:func:`reclaimable`): those whose readers have enough to read to wait for a
  recompute, never below their tenant's own guarantee of the cache (a reply that lost
  its KV has given it back already). They are paused, the engine
  drops their KV, and they are recomputed when their readers need them (not before,
  while the cache is over-committed: :class:`~qos.policy.reader.ReaderGuard`). The
  borrowed replies grow a token an iteration into the room kept beside them; what they
  grow into is taken back the same way.

What a plan guarantees: a tenant whose replies need at most g_f of the cache and of the
readers' rate is admitted ahead of every borrower, whatever the others send, and finds
its next request's room kept free, or takes it back from the borrowers' replies.
No reply freezes to make room, so a request of a tenant that has sent nothing for
``PLAN_MEMORY_S``, or sends faster than before, may still wait for the next replies to
end where the borrowers' readers have little left to read. When there is room for
everyone, every request is within its share and borrowing leaves room for all: the
order is the unweighted one. Beyond the plans the shortfall lands on the lower weights
first. With one tenant or equal weights the rule is skipped and the decisions are
exactly the unweighted ones.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from qos.fairness import water_fill
from qos.policy.table import RequestTable

PLAN_MEMORY_S = 30.0
"""How far back a tenant's requests tell the pace at which it sends (the headroom)."""


class Demand(NamedTuple):
    """What each tenant (by id) is expected to ask of one resource."""

    held: np.ndarray  # what its replies will hold, at the pace it sends (Little's law)
    unit: np.ndarray  # what one of its requests needs, on average


class RecentDemand:
    """Each tenant's requests of the last PLAN_MEMORY_S: their count, KV and reader rate
    (TDS), and the tenant's weight; from them, the tenant's :class:`Demand` of each."""

    def __init__(self) -> None:
        self._requests: deque[tuple[float, int, np.ndarray]] = deque()
        self._sums: dict[int, np.ndarray] = {}  # tenant id -> [count, KV, TDS]
        self._weight: dict[int, float] = {}

    def add(self, now: float, tenant: int, weight: float, kv: int, tds: float) -> None:
        need = np.array([1.0, kv, tds])
        self._requests.append((now, tenant, need))
        self._sums[tenant] = self._sums.get(tenant, np.zeros(3)) + need
        self._weight[tenant] = weight

    def weights(self, now: float, tenants: int) -> np.ndarray:
        """Per tenant id: its weight if it sent within the memory before ``now``, else 0
        (requests older than that are forgotten)."""
        requests, sums = self._requests, self._sums
        while requests and requests[0][0] < now - PLAN_MEMORY_S:
            _, tenant, need = requests.popleft()
            sums[tenant] -= need
        weight = np.zeros(tenants)
        for tenant in self._senders():
            weight[tenant] = self._weight[tenant]
        return weight

    def demand(self, tenants: int, reply_s: float) -> tuple[Demand, Demand]:
        """The KV and the TDS :class:`Demand` per tenant id, over the requests that
        :meth:`weights` last kept. A reply holds its room for ``reply_s`` (the mean time
        from arrival to completion, taken as at least PLAN_MEMORY_S: early completions
        come from an engine not yet contended), so a tenant's replies hold what it sent
        over that long."""
        total = np.zeros((tenants, 3))
        for tenant in self._senders():
            total[tenant] = self._sums[tenant]
        scale = max(reply_s, PLAN_MEMORY_S) / PLAN_MEMORY_S
        count = np.maximum(total[:, 0], 1.0)
        kv, tds = (Demand(total[:, k] * scale, total[:, k] / count) for k in (1, 2))
        return kv, tds

    def _senders(self) -> list[int]:
        """The tenants with a request within the memory."""
        return [tenant for tenant, sent in self._sums.items() if sent[0] > 0.5]


def weighted(table: RequestTable, rows: np.ndarray, recent_weight: np.ndarray) -> bool:
    """Whether the tenants present differ in weight (else the plans do nothing): those of
    mask ``rows`` and those with a ``recent_weight`` (> 0: sent within the plans' memory)."""
    weight = np.concatenate((table.col("weight")[rows], recent_weight[recent_weight > 0]))
    return bool(weight.size) and bool(weight.max() > weight.min())


def within_plan(
    table: RequestTable,
    waiting: np.ndarray,
    committed: np.ndarray,
    demand: np.ndarray,
    room: float,
) -> np.ndarray:
    """For each row of ``waiting`` (in admission order): whether it is within its
    tenant's plan (module doc) of one resource: ``demand`` what each row needs of it,
    ``room`` how much the plans split."""
    count = len(table.tenant_names)
    want = _per_tenant(table, committed, demand, count) + _per_tenant(table, waiting, demand, count)
    weight = _weights(table, waiting, committed, np.ones(count))
    active = (want > 0).nonzero()[0]
    share = np.zeros(count)
    share[active] = water_fill(want[active].tolist(), weight[active].tolist(), float(room))
    return within_limit(table, waiting, committed, demand, share)


def guarantees(
    table: RequestTable,
    waiting: np.ndarray,
    committed: np.ndarray,
    room: float,
    recent_weight: np.ndarray,
) -> np.ndarray:
    """Per tenant id: its guarantee of one resource, w_f / Σw of ``room`` over the
    tenants present (with a reply or a request in the engine, or a ``recent_weight``:
    sent within the plans' memory), 0 for the others."""
    weight = _weights(table, waiting, committed, recent_weight)
    guarantee: np.ndarray = room * weight / weight.sum()
    return guarantee


def within_limit(
    table: RequestTable,
    waiting: np.ndarray,
    committed: np.ndarray,
    demand: np.ndarray,
    limit: np.ndarray,
) -> np.ndarray:
    """For each row of ``waiting`` (in admission order): whether its tenant's hold, with
    it and its tenant's requests ahead of it, stays within the tenant's ``limit`` (per
    tenant id: its share, or its guarantee)."""
    tenant = table.col("tenant")
    hold = _per_tenant(table, committed, demand, limit.size)
    ahead = _cumulative_by_group(tenant[waiting], demand[waiting].astype(float))
    within: np.ndarray = hold[tenant[waiting]] + ahead <= limit[tenant[waiting]] + 1e-9
    return within


def beyond_guarantee(
    table: RequestTable, committed: np.ndarray, need: np.ndarray, guarantee: np.ndarray
) -> np.ndarray:
    """Per row: whether its tenant's committed replies hold more of one resource
    (``need`` per row) than the tenant's ``guarantee``: its replies run on borrowed room."""
    tenant = table.col("tenant")
    hold = _per_tenant(table, committed, need, guarantee.size)
    beyond: np.ndarray = hold[tenant] > guarantee[tenant] + 1e-9
    return beyond


def reclaimable(
    table: RequestTable,
    committed: np.ndarray,
    lenders: np.ndarray,
    need: np.ndarray,
    guarantee: np.ndarray,
) -> float:
    """How much of one resource (``need`` per row) a request within its guarantee may
    take back from the replies of mask ``lenders`` (on borrowed room, able to give it
    back): per tenant, what its lenders hold, at most what its ``committed`` replies
    hold in the cache beyond its guarantee, so no tenant is taken below its own
    guarantee. A reply that has lost its KV gave it back already: counted as held, its
    tenant's replies were taken back again and again while the cache stayed
    over-committed, each time one more recompute (docs/benchmarks.md, "Price plans")."""
    count = guarantee.size
    cached = committed & (table.col("computed") > 0)
    beyond = _per_tenant(table, cached, need, count) - guarantee
    lent = np.minimum(_per_tenant(table, lenders, need, count), np.maximum(beyond, 0.0))
    return float(lent.sum())


def headroom(
    table: RequestTable,
    waiting: np.ndarray,
    taken: np.ndarray,
    committed: np.ndarray,
    need: np.ndarray,
    guarantee: np.ndarray,
    demand: Demand,
) -> float:
    """What to keep free of one resource (``need`` per row) when a tenant is admitted
    beyond its guarantee: for each tenant, what its replies will hold beyond what they
    hold now (``demand.held`` less its hold and what its waiting requests ``taken``
    within their guarantees take), plus one request's worth (arrivals come unevenly),
    within its guarantee left. A tenant within its guarantee then finds room for its
    next request at once, rather than behind replies admitted on another tenant's
    borrowed room, without its whole guarantee lying idle while it sends little."""
    count = guarantee.size
    took = _per_tenant(table, waiting[taken], need, count) + _per_tenant(
        table, committed, need, count
    )
    coming = np.maximum(demand.held - took, 0.0) + demand.unit
    keep = np.minimum(np.maximum(guarantee - took, 0.0), coming)
    return float(keep.sum())


def by_weight(table: RequestTable, rows: np.ndarray) -> np.ndarray:
    """``rows`` with the higher weights first, each weight's rows in their given order."""
    ordered: np.ndarray = rows[np.argsort(-table.col("weight")[rows], kind="stable")]
    return ordered


def _per_tenant(table: RequestTable, rows: np.ndarray, need: np.ndarray, count: int) -> np.ndarray:
    """Per tenant id (``count`` of them): the ``need`` of its rows among ``rows`` (a
    mask or indices), summed."""
    tenant = table.col("tenant")
    total: np.ndarray = np.bincount(tenant[rows], weights=need[rows], minlength=count)
    return total


def _weights(
    table: RequestTable, waiting: np.ndarray, committed: np.ndarray, base: np.ndarray
) -> np.ndarray:
    """Per tenant id: the largest of ``base`` and the weights its rows of ``waiting`` and
    ``committed`` carry."""
    tenant, weight = table.col("tenant"), base.copy()
    np.maximum.at(weight, tenant[waiting], table.col("weight")[waiting])
    np.maximum.at(weight, tenant[committed], table.col("weight")[committed])
    return weight


def _cumulative_by_group(group: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Running sum of ``value`` within each group, in the given order (inclusive)."""
    order = np.argsort(group, kind="stable")
    sorted_group, total = group[order], np.cumsum(value[order])
    starts = np.r_[0, (np.diff(sorted_group) != 0).nonzero()[0] + 1]
    lengths = np.diff(np.r_[starts, group.size])
    base = np.repeat(total[starts] - value[order][starts], lengths)
    out = np.empty_like(total)
    out[order] = total - base
    return out
