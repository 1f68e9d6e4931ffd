"""Virtual Token Counter (VTC): weighted fair share of LLM service between tenants.

From "Fairness in Serving Large Language Models" (Sheng et al.), as presented in the
slides: service W = w_p·n_prefill + w_q·n_decode (w_p = 1,
w_q = 2), each tenant's counter grows by its service divided by its weight, the
tenant with the least counter is served first, and a tenant that becomes active again
has its counter lifted so it can neither bank idle time nor be punished for it:

- if other tenants are queued, to max(own, min counter of the queued tenants);
- if nobody is queued, to max(own, counter of the last tenant that left the queue).

For two backlogged tenants f, g the slides bound |W_f/w_f - W_g/w_g| by
2·max(w_p·L_input, w_q·M) (L_input the longest prompt, M the most tokens in a batch).
Pure bookkeeping: the gateway, the simulator and the vLLM plugin all use this class.

:func:`water_fill` is the weighted max-min split of a capacity that the plans' rule
(what each weight is guaranteed) and the benchmarks' fair shares are built on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

W_PROMPT = 1.0
W_OUTPUT = 2.0


def water_fill(asked: Sequence[float], weights: Sequence[float], total: float) -> list[float]:
    """Weighted max-min split of ``total``: shares in proportion to the weights, each
    capped at what its tenant asks, a capped tenant's excess divided among the others
    in proportion to their weights (the "weighted max-min fair share" of the VTC slides)."""
    if len(asked) != len(weights):
        raise ValueError(f"weights: {len(weights)} weights for {len(asked)} tenants")
    if any(not w > 0 for w in weights):
        raise ValueError(f"weights: must be > 0, got {list(weights)}")
    share = [0.0] * len(asked)
    open_ = [a > 0 for a in asked]
    left = float(total)
    while any(open_) and left > 1e-12:
        weight = sum(w for w, o in zip(weights, open_, strict=True) if o)
        offer = [left * w / weight if o else 0.0 for w, o in zip(weights, open_, strict=True)]
        capped = [o and share[i] + offer[i] >= asked[i] for i, o in enumerate(open_)]
        if not any(capped):
            return [s + x for s, x in zip(share, offer, strict=True)]
        for i, cap in enumerate(capped):
            if cap:
                left -= asked[i] - share[i]
                share[i] = float(asked[i])
                open_[i] = False
    return share


@dataclass
class VirtualTokenCounter:
    """Per-tenant counters with counter lift; queued-request counts are tracked here too."""

    w_prompt: float = W_PROMPT
    w_output: float = W_OUTPUT
    counters: dict[str, float] = field(default_factory=dict)
    queued: dict[str, int] = field(default_factory=dict)
    last_left: str | None = None

    def __post_init__(self) -> None:
        if not self.w_prompt >= 0:
            raise ValueError(f"w_prompt: must be >= 0, got {self.w_prompt}")
        if not self.w_output > 0:
            raise ValueError(f"w_output: must be > 0, got {self.w_output}")

    def service(self, prompt_tokens: int, output_tokens: int) -> float:
        """W = w_p·prompt + w_q·output."""
        return self.w_prompt * prompt_tokens + self.w_output * output_tokens

    def enqueue(self, tenant: str, unsettled: Mapping[str, float] | None = None) -> None:
        """A request of ``tenant`` joins the queue; lift its counter if it was idle.

        ``unsettled``: service (already divided by weight) that active tenants have
        received but that is not charged yet, for a caller that charges a request's
        service when it finishes (:class:`qos.policy.fair.TenantShares`); the lift
        reads each active tenant's counter plus it.
        """
        if self.queued.get(tenant, 0) == 0:
            extra = unsettled or {}
            active = [
                self.counters.get(t, 0.0) + extra.get(t, 0.0)
                for t, c in self.queued.items()
                if c > 0
            ]
            if active:
                floor = min(active)
            elif self.last_left is not None:
                floor = self.counters.get(self.last_left, 0.0)
            else:
                floor = 0.0
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), floor)
        self.queued[tenant] = self.queued.get(tenant, 0) + 1

    def dequeue(self, tenant: str) -> None:
        """A request of ``tenant`` left the queue (admitted, finished or aborted)."""
        left = self.queued.get(tenant, 0) - 1
        if left < 0:
            raise ValueError(f"tenant: {tenant!r} has no queued request to remove")
        self.queued[tenant] = left
        if left == 0:
            self.last_left = tenant

    def charge(
        self, tenant: str, weight: float, prompt_tokens: int = 0, output_tokens: int = 0
    ) -> None:
        """Add the service a request of ``tenant`` received, divided by its weight."""
        if weight <= 0:
            raise ValueError(f"weight: must be > 0, got {weight}")
        self.counters[tenant] = self.counters.get(tenant, 0.0) + (
            self.service(prompt_tokens, output_tokens) / weight
        )

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)
