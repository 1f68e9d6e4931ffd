"""The order of a model's admission queue, and how long a place in it waits.

The rule is the price plans' (:mod:`qos.policy.plans`), applied to what a contended
gateway runs short of: backend slots, the ``max_concurrent`` of the backends serving
the model, counted over every replica.

- tenant f's *hold* h_f is the slots its requests hold on those backends; its *want*
  is h_f plus its requests queued for the model;
- its *share* s_f is the weighted max-min split (:func:`qos.fairness.water_fill`) of
  the slots C among the tenants present (holding or queued), by weight, each capped at
  its want;
- its k-th queued request (earliest TTFT deadline first, then the id) is *within plan*
  while h_f + k ≤ s_f.

The queue serves the requests within plan first, the earliest deadline first (ties: the
id); then the others, the highest weight first, within a weight the tenant with the
least virtual token counter (VTC: among tenants of one weight that all want more than
their share, service is what they compete for), then deadline, then id. Where the
weights of the tenants present are equal, or a backend has no cap, the plans are
skipped and the order is VTC's, as it always was: the least counter, then deadline,
then id. The head is the first of this order, and the last places are the lowest
class: beyond plan, lowest weight.

:func:`admission_order` is the rule; the in-memory store calls it, the Redis store's
Lua (``lua/prelude.lua``) is its atomic form, and both are checked against
``tests/vectors/admission.json``, generated from it (``scripts/make_admission_vectors.py``).

A tenant may hold at most its *cap* of the model's slots (:func:`concurrency_cap`): while
it holds that many, its queued requests are never the head and come last
(:func:`capped_last`), so they wait for its own streams to end and never block the
others'. The cap is no part of :func:`admission_order` (the queue's order among the
tenants that may be admitted); it applies on top of it, in both stores alike.

A place's wait is estimated from the recent admissions of the model, over every
replica (:func:`admission_interval`): position × the interval between them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from qos.fairness import water_fill

ADMISSIONS_KEPT = 16
"""The admissions of a model the wait estimate looks back on, at most."""
ADMISSION_HORIZON_S = 60.0
"""... and only those of the last minute: an idle hour says nothing of the next burst."""
WITHIN = 1e-9  # the tolerance of h_f + k ≤ s_f, as qos.policy.plans.within_plan's

Key = tuple[int, float, float, float, str]


@dataclass(frozen=True, slots=True)
class Queued:
    """A queued request: its tenant and TTFT deadline (the store's milliseconds)."""

    request_id: str
    tenant: str
    deadline: float


def admission_order(
    queued: Iterable[Queued],
    holds: Mapping[str, int],
    weights: Mapping[str, float],
    counters: Mapping[str, float],
    capacity: int | None,
) -> list[str]:
    """The ids of ``queued`` in the order the queue admits them (module doc).

    ``holds``: slots held per tenant on the model's backends; ``weights`` and
    ``counters``: per tenant (1 and 0 when missing); ``capacity``: the slots of the
    model's backends, None when one of them has no cap.
    """
    by_tenant: dict[str, list[Queued]] = {}
    for q in queued:
        by_tenant.setdefault(q.tenant, []).append(q)
    present = sorted(set(by_tenant) | {t for t, h in holds.items() if h > 0})
    weight = {t: float(weights.get(t, 1.0)) for t in present}
    plans = capacity is not None and len(set(weight.values())) > 1
    share: dict[str, float] = {}
    if plans:
        assert capacity is not None
        wants = [holds.get(t, 0) + len(by_tenant.get(t, ())) for t in present]
        split = water_fill(wants, [weight[t] for t in present], float(capacity))
        share = dict(zip(present, split, strict=True))
    keys: list[Key] = []
    for tenant, requests in by_tenant.items():
        requests.sort(key=lambda q: (q.deadline, q.request_id))
        hold = holds.get(tenant, 0)
        counter = float(counters.get(tenant, 0.0))
        for k, q in enumerate(requests, 1):
            if not plans:
                keys.append((0, 0.0, counter, q.deadline, q.request_id))
            elif hold + k <= share[tenant] + WITHIN:
                keys.append((0, 0.0, 0.0, q.deadline, q.request_id))
            else:
                keys.append((1, -weight[tenant], counter, q.deadline, q.request_id))
    keys.sort()
    return [key[-1] for key in keys]


def concurrency_cap(configured: int | None, capacity: int | None, tenants: int) -> int:
    """The slots of a model's backends one tenant may hold at once (0: no cap).

    ``configured``: its plan's ``max_concurrent``, which applies as set; ``capacity``:
    the model's slots (:func:`capacity_of`); ``tenants``: how many tenants are configured.

    Unset, a tenant may hold all the slots but one of a capped model when other tenants
    may want it. The queue already shares every slot that is released among the tenants
    waiting (plans, then VTC); what it cannot share is a slot taken while nobody waited
    and then held for long (a stream whose client reads slowly or not at all). Keeping
    one slot out of any single tenant's reach means another tenant always has one to be
    admitted to, whatever the first one's streams do; a tenant alone loses at most that
    one slot. A cap that binds only while others wait would not do it: a slot already
    granted cannot be taken back from a running stream.
    """
    if configured is not None:
        return configured
    if capacity is None or capacity < 2 or tenants < 2:
        return 0
    return capacity - 1


def at_cap(tenant: str, holds: Mapping[str, int], caps: Mapping[str, int]) -> bool:
    """Whether ``tenant`` holds as many slots as its cap allows (``caps``: 0 or missing
    for no cap)."""
    cap = caps.get(tenant, 0)
    return 0 < cap <= holds.get(tenant, 0)


def capped_last(
    order: Sequence[str],
    tenant_of: Mapping[str, str],
    holds: Mapping[str, int],
    caps: Mapping[str, int],
) -> list[str]:
    """``order`` (:func:`admission_order`'s) with the requests of the tenants at their
    cap moved after the others, each part in its order: the head is the first unless
    its tenant is at its cap too, then nobody is."""
    free = [r for r in order if not at_cap(tenant_of[r], holds, caps)]
    return free + [r for r in order if at_cap(tenant_of[r], holds, caps)]


def capacity_of(caps: Sequence[int]) -> int | None:
    """The slots of a model's backends (caps of 0: no cap, then None)."""
    return None if any(c <= 0 for c in caps) else sum(caps)


def admission_interval(times_ms: Iterable[float], now_ms: float) -> float:
    """Seconds between two admissions of a model lately: (now − the oldest) / their
    number, over the last :data:`ADMISSIONS_KEPT` admissions within
    :data:`ADMISSION_HORIZON_S` (a stall makes it grow as it lasts);
    :data:`ADMISSION_HORIZON_S` when there was none."""
    recent = [t for t in times_ms if t > now_ms - ADMISSION_HORIZON_S * 1000]
    if not recent:
        return ADMISSION_HORIZON_S
    return (now_ms - min(recent)) / 1000 / len(recent)
