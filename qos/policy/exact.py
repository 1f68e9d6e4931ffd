"""Exact solution of Andes Eq. 4 by dynamic programming (Appendix C, Algorithm 2).

Pseudo-polynomial, O(N·B·M): a reference for tests on small instances, and a drop-in
``solver`` for :class:`~qos.policy.andes.Andes` where M is small.
"""

from __future__ import annotations

import numpy as np


def exact_k_knapsack(values: np.ndarray, sizes: np.ndarray, capacity: int, k: int) -> np.ndarray:
    """Exactly ``k`` items (or as many as fit) maximising Σ values with Σ sizes ≤ capacity.

    Algorithm 2 with the m dimension vectorised: dp[b, m] is the best value of b items
    of total size exactly m. If no set of exactly k items fits, the largest feasible
    count is used (an engine always runs what fits). Returns a bool mask.
    """
    n = values.size
    sizes = np.asarray(sizes, dtype=np.int64)
    if np.any(sizes < 0) or capacity < 0 or k < 0:
        raise ValueError("sizes, capacity and k must be non-negative")
    k = min(k, n)
    dp = np.full((k + 1, capacity + 1), -np.inf)
    dp[0, 0] = 0.0
    choice = np.zeros((n, k + 1, capacity + 1), dtype=bool)
    for i in range(n):
        size, value = int(sizes[i]), float(values[i])
        if size > capacity:
            continue
        for b in range(min(i + 1, k), 0, -1):
            candidate = dp[b - 1, : capacity + 1 - size] + value
            better = candidate > dp[b, size:]
            dp[b, size:][better] = candidate[better]
            choice[i, b, size:] = better
    feasible = [b for b in range(k, -1, -1) if np.isfinite(dp[b]).any()]
    b = feasible[0]
    m = int(np.argmax(dp[b]))
    chosen = np.zeros(n, dtype=bool)
    for i in range(n - 1, -1, -1):
        if b > 0 and choice[i, b, m]:
            chosen[i] = True
            m -= int(sizes[i])
            b -= 1
    return chosen
