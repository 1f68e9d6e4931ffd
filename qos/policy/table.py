"""The engine-agnostic snapshot every policy reads: a columnar table of requests.

Engines (the simulator, the vLLM plugin) keep one :class:`RequestTable` up to date as
requests arrive, are admitted, emit tokens, are preempted and finish. Rows are dense
(removal swaps the last row in), so every column is a plain numpy slice and a policy
decision over thousands of requests is a handful of vectorised operations.

Besides the raw facts (tenant, tier, weight, expected TTFT/TDS, arrival, prompt and output
tokens, context length, running or waiting, preemptions) the table keeps, per request,
the running sums of the user's digestion schedule (:mod:`qos.timeline`, recursion D),
so a policy can predict QoE in closed form without re-reading every token time:

- ``dig_sum``, ``dig_last``: Σ d_k and d_n, digestion without hold (Andes Eq. 1);
- ``held_sum``, ``held_last``: the same with tokens held until the expected TTFT
  (the monotone QoE, :func:`qos.metrics.monotone_qoe`); before the first token
  ``held_last`` is TTFT - 1/TDS, so the hold falls out of the same recursion;
- what the reply's client last said of its reader (:meth:`RequestTable.reader_signal`).

All times are the engine's clock in seconds. Per-token emission times are kept too
(``emitted``), for exact metrics when the request ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qos.signals import AWAY_LEASE_S, Presence, ReaderSignal

NO_TOKEN = -1e18  # d_n before any token: finite, so closed forms stay NaN-free

_FLOAT_COLUMNS = (
    "weight",
    "ttft",
    "tds",
    "arrival",
    "queued_at",
    "first_token_at",
    "dig_sum",
    "dig_last",
    "held_sum",
    "held_last",
    "away_until",
    "reader_pace",
    "stated_at",
)
_INT_COLUMNS = (
    "tenant",
    "tier",
    "prompt",
    "max_tokens",
    "output",
    "computed",
    "preemptions",
    "stated_buffer",
    "stated_output",
)


@dataclass(frozen=True)
class Capacity:
    """What the engine can hold in the next iteration."""

    kv_tokens: int  # M: KV-cache slots, in tokens
    max_batch: int  # most requests in one iteration
    block_size: int = 1  # KV is allocated in blocks of this many tokens (paged attention)
    # a running request left out keeps its KV while the cache has room (the vLLM
    # plugin's pause), rather than losing it to a recompute or a swap
    pauses: bool = False
    # how long a decision may stand before the next (0: every iteration decides)
    decision_interval_s: float = 0.0

    def demand(self, table: RequestTable) -> np.ndarray:
        """KV tokens each request occupies after its next token, rounded up to whole blocks."""
        return self.in_blocks(table.context + 1)

    def in_blocks(self, tokens: np.ndarray) -> np.ndarray:
        """``tokens`` (integers) rounded up to whole blocks: the KV they take."""
        if self.block_size == 1:
            return tokens
        rounded: np.ndarray = -(-tokens // self.block_size) * self.block_size
        return rounded


class RequestTable:
    """Dense struct-of-arrays of an engine's live requests (waiting and running)."""

    def __init__(self, initial_capacity: int = 256) -> None:
        self._cap = initial_capacity
        self.n = 0
        self.keys: list[str] = []
        self.emitted: list[list[float]] = []
        self._row: dict[str, int] = {}
        self.tenant_names: list[str] = []
        self._tenant_index: dict[str, int] = {}
        self.tier_names: list[str] = []
        self._tier_index: dict[str, int] = {}
        self._cols: dict[str, np.ndarray] = {}
        for name in _FLOAT_COLUMNS:
            self._cols[name] = np.zeros(self._cap, dtype=float)
        for name in _INT_COLUMNS:
            self._cols[name] = np.zeros(self._cap, dtype=np.int64)
        self._cols["running"] = np.zeros(self._cap, dtype=bool)

    # -- columns (views of the live rows) ------------------------------------------
    def col(self, name: str) -> np.ndarray:
        """Live rows of one column (a view: writes go to the table)."""
        return self._cols[name][: self.n]

    @property
    def running(self) -> np.ndarray:
        return self._cols["running"][: self.n]

    @property
    def context(self) -> np.ndarray:
        """l_i: prompt plus generated tokens, the KV slots the request needs to run."""
        context: np.ndarray = self._cols["prompt"][: self.n] + self._cols["output"][: self.n]
        return context

    @property
    def demand(self) -> np.ndarray:
        """KV slots each request occupies after its next token: context + 1."""
        return self.context + 1

    def __len__(self) -> int:
        return self.n

    def __contains__(self, key: str) -> bool:
        return key in self._row

    def row(self, key: str) -> int:
        try:
            return self._row[key]
        except KeyError:
            raise KeyError(f"request {key!r} is not in the table") from None

    def tenant_id(self, name: str) -> int:
        """Stable small integer for a tenant name."""
        return _intern(self._tenant_index, self.tenant_names, name)

    def tier_id(self, name: str) -> int:
        """Stable small integer for a tier name."""
        return _intern(self._tier_index, self.tier_names, name)

    # -- lifecycle -------------------------------------------------------------------
    def add(
        self,
        key: str,
        *,
        arrival: float,
        prompt_tokens: int,
        ttft: float,
        tds: float,
        tenant: str = "default",
        weight: float = 1.0,
        max_tokens: int | None = None,
        tier: str = "default",
    ) -> int:
        """Add a waiting request; return its row. ``tier``: the name of its QoE tier
        (policies may treat tiers differently, e.g. the reader guard's non-readers)."""
        if key in self._row:
            raise ValueError(f"key: request {key!r} is already in the table")
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens: must be >= 0, got {prompt_tokens}")
        if not tds > 0 or not ttft >= 0:
            raise ValueError(f"ttft/tds: need ttft >= 0 and tds > 0, got {ttft}, {tds}")
        if not weight > 0:
            raise ValueError(f"weight: must be > 0, got {weight}")
        if self.n == self._cap:
            self._grow()
        r = self.n
        self.n += 1
        self._row[key] = r
        self.keys.append(key)
        self.emitted.append([])
        c = self._cols
        for name, value in (
            ("weight", weight),
            ("ttft", ttft),
            ("tds", tds),
            ("arrival", arrival),
            ("queued_at", arrival),
            ("first_token_at", np.nan),
            ("dig_sum", 0.0),
            ("dig_last", NO_TOKEN),
            ("held_sum", 0.0),
            ("held_last", arrival + ttft - 1.0 / tds),  # first token held until TTFT
            ("away_until", NO_TOKEN),
            ("reader_pace", tds),
            ("stated_at", NO_TOKEN),
            ("stated_buffer", -1),
            ("stated_output", 0),
            ("tenant", self.tenant_id(tenant)),
            ("tier", self.tier_id(tier)),
            ("prompt", prompt_tokens),
            ("max_tokens", -1 if max_tokens is None else max_tokens),
            ("output", 0),
            ("computed", 0),
            ("preemptions", 0),
            ("running", False),
        ):
            c[name][r] = value
        return r

    def remove(self, key: str) -> list[float]:
        """Drop a request (finished or aborted); return its emission times."""
        r = self._row.pop(key)
        last = self.n - 1
        times = self.emitted[r]
        if r != last:
            for arr in self._cols.values():
                arr[r] = arr[last]
            moved = self.keys[last]
            self.keys[r] = moved
            self.emitted[r] = self.emitted[last]
            self._row[moved] = r
        self.keys.pop()
        self.emitted.pop()
        self.n = last
        return times

    def admit(self, row: int) -> None:
        """Mark running with its whole context (prompt + output so far) in the KV cache."""
        c = self._cols
        c["running"][row] = True
        c["computed"][row] = c["prompt"][row] + c["output"][row]

    def preempt(self, row: int, now: float) -> None:
        """Back to waiting, KV freed (recompute on resume); counts one preemption."""
        c = self._cols
        c["running"][row] = False
        c["computed"][row] = 0
        c["preemptions"][row] += 1
        c["queued_at"][row] = now

    def pause(self, row: int, now: float) -> None:
        """Back to waiting with its KV kept (``computed`` unchanged): on resume it decodes
        at once, nothing to recompute. Not a preemption (no KV is lost)."""
        c = self._cols
        c["running"][row] = False
        c["queued_at"][row] = now

    def reader_signal(self, key: str, signal: ReaderSignal, now: float) -> bool:
        """Record what a client said of its reader at ``now`` (:mod:`qos.signals`);
        False when ``key`` is not in the table (a reply already ended).

        - ``away_until``: ``now`` + AWAY_LEASE_S while away (or gone: the gateway ends
          the reply), else NO_TOKEN;
        - ``reader_pace``: the stated pace, never above the tier's TDS (a signal never buys
          more than the tier's pace), else the TDS;
        - ``stated_buffer``, ``stated_at``, ``stated_output``: the tokens the client held
          unshown, when it said so, and the reply's output then (-1: never stated).
        """
        r = self._row.get(key)
        if r is None:
            return False
        c = self._cols
        watching = signal.presence is Presence.WATCHING
        c["away_until"][r] = NO_TOKEN if watching else now + AWAY_LEASE_S
        tds = c["tds"][r]
        c["reader_pace"][r] = tds if signal.pace_tps is None else min(signal.pace_tps, tds)
        if signal.buffer_tokens is not None:
            c["stated_buffer"][r] = signal.buffer_tokens
            c["stated_at"][r] = now
            c["stated_output"][r] = c["output"][r]
        return True

    def record_tokens(self, row: int, now: float, n: int = 1) -> None:
        """``n`` tokens of this request reached the user at ``now``.

        Updates the digestion sums in O(1): the chunk's tokens are digested back to
        back from max(now, previous digestion end) (recursion D of qos.timeline).
        """
        c = self._cols
        tds = c["tds"][row]
        step = 1.0 / tds
        offsets = (n * (n - 1) / 2.0) * step
        first = max(now, c["dig_last"][row] + step)
        c["dig_sum"][row] += n * first + offsets
        c["dig_last"][row] = first + (n - 1) * step
        held_first = max(now, c["held_last"][row] + step)
        c["held_sum"][row] += n * held_first + offsets
        c["held_last"][row] = held_first + (n - 1) * step
        if c["output"][row] == 0:
            c["first_token_at"][row] = now
        c["output"][row] += n
        c["computed"][row] += n
        self.emitted[row].extend([now] * n)

    def record_next_token(self, rows: np.ndarray, now: float) -> None:
        """One token for each of ``rows`` (distinct) at ``now``: record_tokens(r, now) in bulk."""
        col = self.col
        step = 1.0 / col("tds")[rows]
        dig_last = col("dig_last")
        first = np.maximum(dig_last[rows] + step, now)
        col("dig_sum")[rows] += first
        dig_last[rows] = first
        held_last = col("held_last")
        held_first = np.maximum(held_last[rows] + step, now)
        col("held_sum")[rows] += held_first
        held_last[rows] = held_first
        output = col("output")
        col("first_token_at")[rows[output[rows] == 0]] = now
        output[rows] += 1
        col("computed")[rows] += 1
        for r in rows.tolist():
            self.emitted[r].append(now)

    def _grow(self) -> None:
        self._cap *= 2
        for name, arr in self._cols.items():
            grown = np.zeros(self._cap, dtype=arr.dtype)
            grown[: arr.size] = arr
            self._cols[name] = grown


def _intern(index: dict[str, int], names: list[str], name: str) -> int:
    """``name``'s position in ``names``, appended on first sight (``index`` maps back)."""
    idx = index.get(name)
    if idx is None:
        idx = index[name] = len(names)
        names.append(name)
    return idx
