"""QoE and fairness together: Andes priorities inside VTC's fair-share envelope.

Design. Andes orders requests by QoE gain per KV slot (Eq. 5). This policy keeps that
order, with one change: a tenant whose weighted VTC counter runs more than ``slack``
ahead of the least-served active tenant is *throttled*, and every request of a
throttled tenant is packed after every request of the others. Nothing else differs.

- One tenant: the least-served active tenant is itself, nobody is throttled, and the
  decisions are exactly Andes's (same forecast, same order, same packing).
- Several backlogged tenants: a throttled tenant receives service only from capacity
  the others cannot use, so when the others are backlogged its counter stops while
  theirs advance. The throttle is decided once per iteration, so in the iteration in
  which a tenant crosses the line it can still receive up to B_max first prefills and
  B_max output tokens. For prompts of at most L_input tokens, batches of at most B_max
  requests and a smallest tenant weight w_min:

      |W_f/w_f - W_g/w_g| ≤ slack + B_max·(w_p·L_input + w_q) / w_min

  the same form as VTC's bound (2·max(w_p·L_input, w_q·M)), with ``slack`` set by the
  operator to trade fairness for QoE.
  The bound assumes the preemption cap P lets the throttled tenant's running requests
  be preempted; with a tight P it is reached more slowly.
"""

from __future__ import annotations

import numpy as np

from qos.fairness import VirtualTokenCounter
from qos.latency import LatencyProfile
from qos.policy.andes import Andes
from qos.policy.table import RequestTable
from qos.policy.vtc import FairShareHooks


class FairAndes(Andes, FairShareHooks):
    name = "fair-andes"

    def __init__(
        self,
        profile: LatencyProfile,
        *,
        slack: float = 4096.0,
        counter: VirtualTokenCounter | None = None,
        **andes_options,
    ) -> None:
        Andes.__init__(self, profile, **andes_options)
        FairShareHooks.__init__(self, counter)
        if slack < 0:
            raise ValueError(f"slack: must be >= 0, got {slack}")
        self.slack = slack

    def on_arrival(self, table: RequestTable, row: int, now: float) -> None:
        Andes.on_arrival(self, table, row, now)
        FairShareHooks.on_arrival(self, table, row, now)

    def on_finish(self, table: RequestTable, row: int, now: float) -> None:
        Andes.on_finish(self, table, row, now)
        FairShareHooks.on_finish(self, table, row, now)

    def throttled(self, table: RequestTable) -> np.ndarray:
        """Rows whose tenant is more than ``slack`` ahead of the least-served active tenant."""
        counters = self.tenant_counters(table)
        return counters > counters.min() + self.slack

    def packing_order(self, table: RequestTable, priority: np.ndarray) -> np.ndarray:
        return np.lexsort((~table.running, -priority, self.throttled(table)))
