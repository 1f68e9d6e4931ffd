"""Round robin: the Andes paper's second baseline (§6.1).

A running request keeps its slot for a service interval of ``interval`` iterations
(50 in the paper); after that, if others are waiting, it is preempted and goes to the
back of the queue. Within the queue, service is first come first served by the time
each request last joined it.
"""

from __future__ import annotations

import numpy as np

from qos.policy.base import Policy
from qos.policy.fcfs import pack_fcfs
from qos.policy.table import Capacity, RequestTable


class RoundRobin(Policy):
    name = "round-robin"

    def __init__(self, interval: int = 50) -> None:
        if interval < 1:
            raise ValueError(f"interval: must be >= 1 iteration, got {interval}")
        self.interval = interval
        self._served: dict[str, int] = {}  # iterations in the current slot, by request key

    def on_finish(self, table: RequestTable, row: int, now: float) -> None:
        self._served.pop(table.keys[row], None)

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        running = table.running
        keys = table.keys
        served = np.array([self._served.get(k, 0) for k in keys], dtype=np.int64)
        expired = running & (served >= self.interval) & (~running).any()
        queue_time = np.where(expired, now, table.col("queued_at"))
        # running requests within their slot first, then the queue in order of joining it
        order = np.lexsort((queue_time, ~(running & ~expired)))
        chosen = pack_fcfs(order, table, capacity)
        for row in np.flatnonzero(chosen):
            key = keys[row]
            self._served[key] = (
                self._served.get(key, 0) + 1 if running[row] and not expired[row] else 1
            )
        for row in np.flatnonzero(~chosen):
            self._served.pop(keys[row], None)
        return chosen
