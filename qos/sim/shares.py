"""Service shares per tenant in a simulation: who got how much of the engine, and when.

Service is counted the way VTC counts it ("Fairness in Serving Large Language Models",
Sheng et al.; :mod:`qos.fairness`): W = w_p·prompt + w_q·output, the prompt charged when
the request's first token comes out (its first prefill), each output token when it is
emitted.

**Weighted max-min fair share**, in service per second. A request's service reaches it
over its whole life, a minute or more after it arrives, so each tenant's demand and
delivery are compared with its own lag L (the median time from arrival to last token
of its requests): it *asks for* the service of the requests it sent in
[t_first, t_last − L] and is *delivered* the service it received in
[t_first + L, t_last], both divided by their common length (t_first, t_last: the
first and last arrival of the run). The fair shares are the water-filling of the
delivered total over the tenants in proportion to their weights, capped at what each
asks for: a tenant that asks for less than its weighted share gets all it asks for,
and the rest is divided among the others in proportion to their weights
(:func:`water_fill`). A tenant whose fair share is below what it asks for is
*backlogged*; its ratio is the service it got over its fair share (1.0 = exactly fair).
Where the engine delivered at least 95 % of all that was asked (:data:`SHORT`), it was
not short and every fair share is what the tenant asked for: the 5 % absorb the noise
of comparing two windows.

Counting over the run, not per short interval, is deliberate: a request runs for a
minute or more once admitted, so any scheduler's shares swing within seconds; what a
tenant pays for is its share over the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qos.fairness import W_OUTPUT, W_PROMPT
from qos.sim.engine import RequestResult

SHORT = 0.95
"""The engine is short when it delivers less than this fraction of what was asked."""


@dataclass(frozen=True)
class ShareReport:
    """Per-tenant service in the window against its fair share, and over time."""

    tenants: list[str]
    weights: np.ndarray
    window: tuple[float, float]  # first and last arrival (s, engine clock)
    lag: np.ndarray  # each tenant's L (s)
    asked: np.ndarray  # service per second each tenant asked for
    delivered: np.ndarray  # service per second each tenant received
    fair: np.ndarray  # its weighted max-min fair share of the delivered total
    bin_edges: np.ndarray  # seconds, for :meth:`share_over_time`
    service: np.ndarray  # [tenant, bin]: service received in each bin

    @property
    def backlogged(self) -> np.ndarray:
        """Tenants whose fair share is below what they asked for."""
        return self.fair < self.asked * (1 - 1e-9)

    def ratio(self, tenant: str) -> float:
        """Service delivered over fair share."""
        i = self.tenants.index(tenant)
        return float(self.delivered[i] / self.fair[i]) if self.fair[i] > 0 else float("nan")

    def share_over_time(self) -> np.ndarray:
        """[tenant, bin]: each tenant's fraction of the bin's service (NaN for idle bins)."""
        total = self.service.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            share: np.ndarray = self.service / np.where(total > 0, total, np.nan)
        return share

    def fair_fraction(self) -> np.ndarray:
        """Each tenant's fair share as a fraction of the window's service."""
        fraction: np.ndarray = self.fair / self.fair.sum()
        return fraction


def water_fill(asked: np.ndarray, weights: np.ndarray, total: float) -> np.ndarray:
    """Weighted max-min split of ``total``: shares ∝ weights, each capped at ``asked``,
    the excess of a capped tenant divided among the others in proportion to weights."""
    share = np.zeros(asked.size)
    open_ = asked > 0
    left = float(total)
    while open_.any() and left > 1e-12:
        w = np.where(open_, weights, 0.0)
        offer = left * w / w.sum()
        capped = open_ & (share + offer >= asked)
        if not capped.any():
            filled: np.ndarray = share + offer
            return filled
        left -= float((asked[capped] - share[capped]).sum())
        share[capped] = asked[capped]
        open_ &= ~capped
    return share


def service_shares(
    requests: Sequence[RequestResult],
    weights: Mapping[str, float],
    *,
    bin_s: float = 10.0,
    w_prompt: float = W_PROMPT,
    w_output: float = W_OUTPUT,
) -> ShareReport:
    """Count each tenant's service; fair shares as in the module docstring."""
    if not bin_s > 0:
        raise ValueError(f"bin_s: must be > 0, got {bin_s}")
    if not requests:
        raise ValueError("requests: nothing to count")
    tenants = list(weights)
    index = {t: i for i, t in enumerate(tenants)}
    unknown = {r.tenant for r in requests} - set(index)
    if unknown:
        raise ValueError(f"weights: no weight for tenants {sorted(unknown)}")
    start = min(r.arrival for r in requests)
    last = max(r.arrival for r in requests)
    end = max(r.arrival + float(r.times[-1]) for r in requests)
    lag = np.zeros(len(tenants))
    for t, i in index.items():
        times = [float(r.times[-1]) for r in requests if r.tenant == t]
        lag[i] = min(float(np.median(times)), (last - start) / 2) if times else 0.0
    edges = start + bin_s * np.arange(int(np.floor((end - start) / bin_s)) + 2)
    service = np.zeros((len(tenants), edges.size - 1))
    asked = np.zeros(len(tenants))
    delivered = np.zeros(len(tenants))
    for r in requests:
        i = index[r.tenant]
        emitted = r.arrival + r.times
        at = np.searchsorted(edges, emitted, side="right") - 1
        np.add.at(service[i], at, w_output)
        service[i, at[0]] += w_prompt * r.prompt_tokens
        if r.arrival <= last - lag[i]:
            asked[i] += w_prompt * r.prompt_tokens + w_output * r.times.size
        in_window = (emitted >= start + lag[i]) & (emitted <= last)
        delivered[i] += w_output * int(in_window.sum())
        if in_window[0]:
            delivered[i] += w_prompt * r.prompt_tokens
    length = np.maximum(last - start - lag, 1e-9)
    asked, delivered = asked / length, delivered / length
    w = np.array([float(weights[t]) for t in tenants])
    return ShareReport(
        tenants=tenants,
        weights=w,
        window=(start, last),
        lag=lag,
        asked=asked,
        delivered=delivered,
        fair=water_fill(asked, w, float(delivered.sum()))
        if delivered.sum() < SHORT * asked.sum()
        else asked,
        bin_edges=edges,
        service=service,
    )
