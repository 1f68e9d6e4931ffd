"""Weights inside Andes: each tenant's weighted fair share of service, QoE within it.

Service is counted as VTC counts it ("Fairness in Serving Large Language Models", Sheng
et al.; :mod:`qos.fairness`): W = w_p·prompt + w_q·output, a tenant's counter growing
by W / weight, lifted when the tenant becomes active again. A tenant is active while
it has a request in the engine, *backlogged* while one of them *asks*: it waits, and
waiting hurts it (its Andes gain Q_serve − Q_wait, Eq. 2, is positive:
:meth:`qos.policy.andes.Andes.asking`). A request paused ahead of its reader is no
unmet demand.

**Levels.** Row i of tenant f (weight w_i) is at level

    L_i = ⌊(c_f − m_i)⁺ / slack⌋,  m_i = min counter of the backlogged tenants whose
                                         weight differs from w_i

(0 where there is no such tenant). Andes packs level by level, lowest first, in its
own order (Eq. 5 priority) within a level; and once an *asking* row does not fit, no
waiting row after it is admitted, of its level or a higher one: the room is kept for
it, as VTC's execution stream stops at the first request that does not fit (without
the stop, the short requests behind it fill every gap and a long one never fits).
Running rows of any level may still keep their place.

- One tenant, or all rows of one weight: every level is 0 and the decision is exactly
  Andes's (the rule never reads a counter).
- Tenants of different weights, all backlogged: a tenant more than ``slack`` ahead of
  a less-served one is admitted only after that one, so the weighted counters of
  backlogged tenants stay within a band; a tenant that asks for less than its share
  is never backlogged, never a reference, and gets all it asks for; the shortfall
  falls on the tenants whose counters run ahead, i.e. the lower weights first.
- Bound (two backlogged tenants f, g of different weights, the proof of the VTC
  slides' bound): while c_f > c_g + slack, f receives no admission that g could use,
  and its counter grows only through the requests it already runs, at most
  ``max_batch`` of them, each adding at most w_q per iteration, plus the prompts of
  admissions decided in the iteration in which it crossed the line. So

      |c_f − c_g| ≤ slack + (w_p·L_input·B_max + w_q·M_f) / w_min

  with L_input the longest prompt, B_max the batch limit, M_f the output tokens f's
  running requests generate before they finish or are preempted, w_min the smaller
  weight: VTC's bound
  2·max(w_p·L_input, w_q·M) in form, widened by ``slack``, which the operator sets to
  trade fairness for QoE. With ``wait_for_room`` (andes-tp) a running request is
  preempted only for a claim, which weights do not give: as in VTC, f's running
  requests then finish at their own pace, and M_f is at most what they still have to
  generate.
"""

from __future__ import annotations

import numpy as np

from qos.fairness import VirtualTokenCounter
from qos.policy.base import pack_in_order
from qos.policy.table import RequestTable


class TenantShares:
    """Per-tenant VTC counters kept from the request table, and the levels they set.

    A request's service is charged when it leaves (``on_finish``); until then it is read
    off the table (``prompt`` once the first token is out, ``output``), so nothing runs
    per token.
    """

    def __init__(self, slack: float, counter: VirtualTokenCounter | None = None) -> None:
        if not slack >= 0:
            raise ValueError(f"fair_share_slack: must be >= 0, got {slack}")
        self.slack = slack
        self.vtc = counter or VirtualTokenCounter()

    def _live(self, table: RequestTable) -> np.ndarray:
        """Service each live row has received, divided by its weight."""
        output = table.col("output")
        prompt = np.where(output > 0, table.col("prompt"), 0)
        service = self.vtc.w_prompt * prompt + self.vtc.w_output * output
        per_weight: np.ndarray = service / table.col("weight")
        return per_weight

    def on_arrival(self, table: RequestTable, row: int) -> None:
        tenant = table.tenant_names[int(table.col("tenant")[row])]
        unsettled = None
        if self.vtc.queued.get(tenant, 0) == 0:
            by_id = np.bincount(
                table.col("tenant"), weights=self._live(table), minlength=len(table.tenant_names)
            )
            unsettled = dict(zip(table.tenant_names, by_id.tolist(), strict=True))
        self.vtc.enqueue(tenant, unsettled)

    def on_finish(self, table: RequestTable, row: int) -> None:
        tenant = table.tenant_names[int(table.col("tenant")[row])]
        output = int(table.col("output")[row])
        self.vtc.charge(
            tenant,
            float(table.col("weight")[row]),
            prompt_tokens=int(table.col("prompt")[row]) if output > 0 else 0,
            output_tokens=output,
        )
        self.vtc.dequeue(tenant)

    def counters(self, table: RequestTable) -> np.ndarray:
        """The counter of each row's tenant (settled plus live service)."""
        ids = table.col("tenant")
        live = np.bincount(ids, weights=self._live(table), minlength=len(table.tenant_names))
        settled = np.array([self.vtc.counter(t) for t in table.tenant_names])
        counters: np.ndarray = (settled + live)[ids]
        return counters

    @staticmethod
    def weighted(table: RequestTable) -> bool:
        """Whether the rows' weights differ (else every level is 0)."""
        weight = table.col("weight")
        return weight.size > 0 and not bool((weight == weight[0]).all())

    def levels(self, table: RequestTable, asks: np.ndarray) -> np.ndarray | None:
        """Each row's level (module docstring), or None where every level is 0.

        ``asks``: the rows that make their tenant backlogged (module docstring)."""
        if not self.weighted(table):
            return None
        weight = table.col("weight")
        counters = self.counters(table)
        levels = np.zeros(table.n)
        for value in np.unique(weight):
            mine = weight == value
            ref = asks & ~mine
            if ref.any():
                ahead = np.maximum(counters[mine] - counters[ref].min(), 0.0)
                levels[mine] = np.floor(ahead / self.slack) if self.slack > 0 else ahead
        return levels if levels.any() else None


def pack_by_level(
    order: np.ndarray,
    running: np.ndarray,
    asks: np.ndarray,
    demand: np.ndarray,
    kv_tokens: int,
    max_batch: int,
    n: int,
) -> np.ndarray:
    """Greedy packing of ``order`` (sorted by level first) with VTC's stop: skip what does
    not fit, but after the first asking row (``asks``) that does not fit, take only
    running rows; the room is kept for it. Returns a bool mask of length ``n``."""
    took = pack_in_order(order, demand, kv_tokens, max_batch, n)
    missed = (~took[order] & asks[order]).nonzero()[0]
    if not missed.size:
        return took
    after = order[missed[0] + 1 :]
    took[after] = False
    kv_left = kv_tokens - int(demand[took].sum())
    slots = max_batch - int(np.count_nonzero(took))
    took |= pack_in_order(after[running[after]], demand, kv_left, slots, n)
    return took
