"""The scheduling-policy interface shared by the simulator and the vLLM plugin.

Each iteration the engine hands the policy its :class:`~qos.policy.table.RequestTable`
and :class:`~qos.policy.table.Capacity` and asks which requests run next. The answer is
a boolean mask over the table's rows; admissions are ``run & ~running`` and
preemptions ``running & ~run``. The engine then enforces its own hard limits (it never
exceeds the KV cache or the batch size, whatever a policy returns).

Policies that keep per-tenant state (VTC) also hear about service as it happens,
through the ``on_*`` hooks; the engine calls them before it changes the table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from qos.policy.table import Capacity, RequestTable


class Policy(ABC):
    """Decides, each iteration, which requests run."""

    name: str = "policy"

    @abstractmethod
    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        """Return a bool mask over ``table``'s rows: True = runs in the next iteration."""

    def on_arrival(self, table: RequestTable, row: int, now: float) -> None:
        """A request joined the table (row is valid now)."""

    def on_prefill(self, table: RequestTable, row: int, tokens: int) -> None:
        """The engine prefilled ``tokens`` prompt tokens of this request for the first time."""

    def on_tokens(self, table: RequestTable, row: int, tokens: int) -> None:
        """The request generated ``tokens`` output tokens."""

    def on_finish(self, table: RequestTable, row: int, now: float) -> None:
        """The request is about to leave the table (row still valid)."""


def pack_in_order(
    order: np.ndarray, context: np.ndarray, kv_tokens: int, max_batch: int, n: int
) -> np.ndarray:
    """Greedy packing (Andes Algorithm 1 with skip): take rows in ``order`` while they fit.

    A row that does not fit in the remaining KV budget is skipped, not a reason to stop.
    Vectorised in passes: each pass keeps the rows that could still fit on their own and
    takes the longest prefix of them whose cumulative size fits; equivalent to the
    sequential loop, since the first row that breaks the prefix is exactly the one the
    loop would skip. Returns a bool mask of length ``n``.
    """
    chosen = np.zeros(n, dtype=bool)
    remaining_kv, remaining_slots = kv_tokens, max_batch
    candidates = order
    while candidates.size and remaining_slots > 0:
        sizes = context[candidates]
        fits = sizes <= remaining_kv
        candidates, sizes = candidates[fits], sizes[fits]
        if not candidates.size:
            break
        cum = np.cumsum(sizes)
        take = min(int(np.searchsorted(cum, remaining_kv, side="right")), remaining_slots)
        chosen[candidates[:take]] = True
        remaining_kv -= int(cum[take - 1]) if take else 0
        remaining_slots -= take
        candidates = candidates[take + 1 :]  # candidates[take] did not fit: skipped
    return chosen
