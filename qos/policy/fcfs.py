"""First come, first served: what vLLM does by default (and the Andes paper's baseline).

Requests run in arrival order while they fit. A running request is never displaced by
a later one; when the cache overflows (running requests grow) the latest arrivals are
the ones left out, as vLLM preempts the most recently admitted request.
"""

from __future__ import annotations

import numpy as np

from qos.policy.base import Policy
from qos.policy.table import Capacity, RequestTable


class FCFS(Policy):
    name = "fcfs"

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        order = np.argsort(table.col("arrival"), kind="stable")
        return pack_fcfs(order, table, capacity)


def pack_fcfs(order: np.ndarray, table: RequestTable, capacity: Capacity) -> np.ndarray:
    """Pack in ``order`` and stop at the first request that does not fit (no skipping).

    Head-of-line blocking is the point of FCFS: a long request at the head of the queue
    holds back the short ones behind it, exactly as vLLM's waiting queue does.
    """
    demand = capacity.demand(table)[order]
    fits = np.cumsum(demand) <= capacity.kv_tokens
    take = min(int(np.argmin(fits)) if not fits.all() else fits.size, capacity.max_batch)
    chosen = np.zeros(table.n, dtype=bool)
    chosen[order[:take]] = True
    return chosen
