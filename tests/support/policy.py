"""Hand-built request tables and a small engine loop for the policy tests: two latency
profiles (:data:`FAST`, :data:`LINEAR`), requests added by hand (:func:`add`) or at
random (:func:`random_table`), and :class:`MiniEngine`, which drives policies through
their hooks."""

from __future__ import annotations

import numpy as np

from qos.latency import LatencyProfile
from qos.policy.base import Policy
from qos.policy.table import Capacity, RequestTable

# A fast engine: 50 tokens/s per request at B=1, 25 at B=64, so a TDS of 5-10 is always met.
FAST = LatencyProfile(
    name="fast",
    source="test",
    batch_sizes=(1, 64),
    decode_s_at=(0.02, 0.04),
    kv_capacity_tokens=100_000,
    max_batch=64,
    prefill_per_token_s=1e-5,
)
# A slow engine: decode_s(B) = 0.01 + 0.001·(B - 1), i.e. 100 tokens/s at B=1, ~9 at B=100.
LINEAR = LatencyProfile(
    name="linear",
    source="test",
    batch_sizes=(1, 100),
    decode_s_at=(0.01, 0.109),
    kv_capacity_tokens=100_000,
    max_batch=256,
    prefill_per_token_s=1e-5,
)


# -- helpers -----------------------------------------------------------------------------
def add(
    table: RequestTable,
    key: str,
    *,
    arrival: float = 0.0,
    prompt: int = 10,
    ttft: float = 1.0,
    tds: float = 5.0,
    tenant: str = "default",
    weight: float = 1.0,
    running: bool = False,
    tokens_at: list[float] | None = None,
) -> int:
    """Add one request; optionally mark it running and deliver tokens at the given times."""
    r = table.add(
        key,
        arrival=arrival,
        prompt_tokens=prompt,
        ttft=ttft,
        tds=tds,
        tenant=tenant,
        weight=weight,
    )
    for t in tokens_at or []:
        table.record_tokens(r, t)
    if running:
        table.admit(r)
    return r


def random_table(seed: int, n_max: int = 12, now: float = 20.0) -> RequestTable:
    """A random table of waiting and running requests, some with tokens delivered."""
    rng = np.random.default_rng(seed)
    table = RequestTable(initial_capacity=4)  # exercises growth too
    for i in range(int(rng.integers(1, n_max + 1))):
        arrival = float(rng.uniform(0.0, now - 0.1))
        r = table.add(
            f"r{i}",
            arrival=arrival,
            prompt_tokens=int(rng.integers(0, 60)),
            ttft=float(rng.uniform(0.1, 3.0)),
            tds=float(rng.uniform(1.0, 20.0)),
            tenant=str(rng.choice(["a", "b", "c"])),
            weight=float(rng.choice([1.0, 2.0])),
        )
        out = int(rng.integers(0, 30))
        for t in np.sort(rng.uniform(arrival, now, size=out)):
            table.record_tokens(r, float(t))
        if rng.random() < 0.5:
            table.admit(r)
    return table


def assert_valid_mask(mask: np.ndarray, table: RequestTable, capacity: Capacity) -> None:
    assert isinstance(mask, np.ndarray)
    assert mask.dtype == bool
    assert mask.shape == (table.n,)
    assert int(capacity.demand(table)[mask].sum()) <= capacity.kv_tokens
    assert int(mask.sum()) <= capacity.max_batch


def apply_mask(table: RequestTable, mask: np.ndarray, now: float) -> None:
    running = table.running.copy()
    for r in np.flatnonzero(running & ~mask):
        table.preempt(int(r), now)
    for r in np.flatnonzero(mask & ~running):
        table.admit(int(r))


class MiniEngine:
    """A few lines that behave like an engine: schedule, admit/preempt, tokens, finish.

    ``policies[0]`` decides; every policy hears every hook, so policies with state can be
    compared on the same sequence of tables.
    """

    def __init__(self, policies: list[Policy], capacity: Capacity, dt: float = 0.05) -> None:
        self.policies = policies
        self.capacity = capacity
        self.dt = dt
        self.table = RequestTable()
        self.targets: dict[str, int] = {}
        self.prefilled: set[str] = set()
        self.now = 0.0
        self.preempted_by_policy = 0

    def arrive(self, key: str, *, output: int, **kwargs) -> None:
        r = add(self.table, key, arrival=self.now, **kwargs)
        self.targets[key] = output
        for p in self.policies:
            p.on_arrival(self.table, r, self.now)

    def step(self) -> list[np.ndarray]:
        table, now = self.table, self.now
        masks = [p.schedule(table, self.capacity, now) for p in self.policies]
        mask = masks[0]
        assert_valid_mask(mask, table, self.capacity)
        self.preempted_by_policy += int((table.running & ~mask).sum())
        apply_mask(table, mask, now)
        end = now + self.dt
        prompt = table.col("prompt")
        for r in np.flatnonzero(mask).tolist():
            key = table.keys[r]
            for p in self.policies:
                if key not in self.prefilled:
                    p.on_prefill(table, r, int(prompt[r]))
                p.on_tokens(table, r, 1)
            self.prefilled.add(key)
            table.record_tokens(r, end)
        output = table.col("output")
        done = [
            table.keys[r] for r in np.flatnonzero(mask) if output[r] >= self.targets[table.keys[r]]
        ]
        for key in done:
            for p in self.policies:
                p.on_finish(table, table.row(key), end)
            table.remove(key)
        self.now = end
        return masks
