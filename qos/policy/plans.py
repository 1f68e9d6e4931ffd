"""Price plans: weights decide who absorbs a shortfall, not how many tokens each tenant gets.

A reader consumes a few tokens a second; once every tenant's readers are served at their
pace, more tokens buy nobody anything, so holding a tenant to a share of *service*
(VTC) only makes its users wait. What a contended engine runs short of is room for new
replies: the KV cache every started reply holds until it ends (the reader guard,
:mod:`qos.policy.reader`, admits a request only into room left once every started reply
is counted). The plans split *that*:

- tenant f's *hold* h_f is the KV its committed replies occupy; its *want* is h_f plus
  what its waiting requests need;
- its *share* s_f is the weighted max-min split of the admission room C (the cache
  under the watermark) by the tenants' wants (:func:`qos.fairness.water_fill`): weights
  in proportion, a tenant that wants less than its share keeps only what it wants, and
  its excess goes to the others by weight;
- a waiting request of f is *within plan* while h_f plus its own need and the needs of
  f's requests ahead of it stay within s_f. Requests within plan are admitted first;
  the others only into what is left, the higher weights first.

What a plan guarantees: a tenant whose replies need at most its weighted share of the
cache, w_f / Σw of C over the tenants with demand, is admitted ahead of every request
beyond its plan, whatever the others send. Requests beyond plans are admitted only
while the room its recent requests needed (:func:`headroom`, over the last
``PLAN_MEMORY_S`` of :mod:`qos.policy.reader`), and what the running replies grow by
within a TTFT, stay free, so its next requests find room at once. A started reply is
never taken away (no reply freezes to make room), so the first request of a tenant
that sent nothing for a while waits for the next replies to end. Beyond the plans the
shortfall lands on the lower weights first. With one tenant or equal weights the rule is
skipped and the decisions are exactly the unweighted ones.
"""

from __future__ import annotations

import numpy as np

from qos.fairness import water_fill
from qos.policy.table import RequestTable


def weighted(table: RequestTable, rows: np.ndarray) -> bool:
    """Whether the tenants of mask ``rows`` differ in weight (else the plans do nothing)."""
    weight = table.col("weight")[rows]
    return bool(weight.size) and bool(weight.max() > weight.min())


def within_plan(
    table: RequestTable,
    waiting: np.ndarray,
    committed: np.ndarray,
    demand: np.ndarray,
    room: int,
) -> np.ndarray:
    """For each row of ``waiting`` (in admission order): whether it is within its
    tenant's plan (module doc), ``room`` the KV tokens the plans split."""
    tenant = table.col("tenant")
    count = len(table.tenant_names)
    need = demand[waiting].astype(float)
    hold = np.bincount(tenant[committed], weights=demand[committed], minlength=count)
    want = hold + np.bincount(tenant[waiting], weights=need, minlength=count)
    weight = np.ones(count)
    np.maximum.at(weight, tenant[waiting], table.col("weight")[waiting])
    np.maximum.at(weight, tenant[committed], table.col("weight")[committed])
    active = (want > 0).nonzero()[0]
    share = np.zeros(count)
    share[active] = water_fill(want[active].tolist(), weight[active].tolist(), float(room))
    ahead = _cumulative_by_group(tenant[waiting], need)
    within: np.ndarray = hold[tenant[waiting]] + ahead <= share[tenant[waiting]] + 1e-9
    return within


def headroom(
    table: RequestTable,
    waiting: np.ndarray,
    within: np.ndarray,
    committed: np.ndarray,
    demand: np.ndarray,
    room: int,
    recent: np.ndarray,
    recent_weight: np.ndarray,
) -> int:
    """KV to keep free for the plans when requests beyond them are admitted: for each
    tenant present (with a reply or a request in the engine, or ``recent`` > 0), what its
    requests of the recent past needed (``recent``, KV tokens per tenant id), at most its
    guarantee w_f / Σw of ``room`` less what it holds and what its waiting requests
    within plan take. A tenant within its plan then finds room for its next requests at
    once, rather than behind replies admitted beyond another tenant's plan, without the
    whole guarantee lying idle while it sends nothing."""
    tenant = table.col("tenant")
    count = len(table.tenant_names)
    weight = np.zeros(count)
    weight[: recent_weight.size] = recent_weight[:count]
    np.maximum.at(weight, tenant[waiting], table.col("weight")[waiting])
    np.maximum.at(weight, tenant[committed], table.col("weight")[committed])
    expected = np.zeros(count)
    expected[: recent.size] = recent[:count]
    present = expected > 0
    present[tenant[committed]] = True
    present[tenant[waiting]] = True
    guarantee = room * weight / weight[present].sum()
    hold = np.bincount(tenant[committed], weights=demand[committed], minlength=count)
    taken = np.bincount(tenant[waiting[within]], weights=demand[waiting[within]], minlength=count)
    keep = np.minimum(np.maximum(guarantee - hold - taken, 0.0), np.maximum(expected - taken, 0.0))
    return int(keep[present].sum())


def by_weight(table: RequestTable, rows: np.ndarray) -> np.ndarray:
    """``rows`` with the higher weights first, each weight's rows in their given order."""
    ordered: np.ndarray = rows[np.argsort(-table.col("weight")[rows], kind="stable")]
    return ordered


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
