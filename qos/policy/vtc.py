"""VTC as an engine policy: admit the least-served tenant's earliest request first.

The execution stream of the VTC slides (Sheng et al.): running requests keep
running; while the cache has room, the tenant with the smallest counter among those
with waiting requests gets its earliest waiting request admitted, and its counter is
charged w_p·prompt at once (so one admission round interleaves tenants); output
tokens are charged w_q each as they are generated. A tenant counts as active while it
has any request in the engine (waiting or running); counter lift happens when it
becomes active again (:class:`~qos.fairness.VirtualTokenCounter`).
"""

from __future__ import annotations

import numpy as np

from qos.fairness import VirtualTokenCounter
from qos.policy.base import Policy
from qos.policy.table import Capacity, RequestTable


class FairShareHooks(Policy):
    """Keeps a :class:`VirtualTokenCounter` in step with the engine's service."""

    def __init__(self, counter: VirtualTokenCounter | None = None) -> None:
        self.vtc = counter or VirtualTokenCounter()

    def _tenant(self, table: RequestTable, row: int) -> str:
        return table.tenant_names[int(table.col("tenant")[row])]

    def on_arrival(self, table: RequestTable, row: int, now: float) -> None:
        self.vtc.enqueue(self._tenant(table, row))

    def on_finish(self, table: RequestTable, row: int, now: float) -> None:
        self.vtc.dequeue(self._tenant(table, row))

    def on_prefill(self, table: RequestTable, row: int, tokens: int) -> None:
        weight = float(table.col("weight")[row])
        self.vtc.charge(self._tenant(table, row), weight, prompt_tokens=tokens)

    def on_tokens(self, table: RequestTable, row: int, tokens: int) -> None:
        weight = float(table.col("weight")[row])
        self.vtc.charge(self._tenant(table, row), weight, output_tokens=tokens)

    def tenant_counters(self, table: RequestTable) -> np.ndarray:
        """Counter of each row's tenant."""
        by_id = np.array([self.vtc.counter(name) for name in table.tenant_names])
        counters: np.ndarray = by_id[table.col("tenant")]
        return counters


class VTC(FairShareHooks):
    name = "vtc"

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        running = table.running.copy()
        demand = capacity.demand(table)
        used = int(demand[running].sum())
        slots = capacity.max_batch - int(running.sum())
        waiting = np.flatnonzero(~running)
        waiting = waiting[np.argsort(table.col("arrival")[waiting], kind="stable")]
        tenants = table.col("tenant")[waiting]
        queues = {int(t): list(waiting[tenants == t]) for t in np.unique(tenants)}
        counters = {t: self.vtc.counter(table.tenant_names[t]) for t in queues}
        prompt, weight = table.col("prompt"), table.col("weight")
        while queues and slots > 0:
            tenant = min(queues, key=lambda t: counters[t])
            row = queues[tenant][0]
            if used + int(demand[row]) > capacity.kv_tokens:
                break  # the slides' execution stream stops at the first that does not fit
            running[row] = True
            used += int(demand[row])
            slots -= 1
            counters[tenant] += self.vtc.service(int(prompt[row]), 0) / float(weight[row])
            queues[tenant].pop(0)
            if not queues[tenant]:
                del queues[tenant]
        return running
