"""Service shares per tenant in a simulation: who got how much of the engine, and when.

Service is counted the way VTC counts it ("Fairness in Serving Large Language Models",
Sheng et al.; :mod:`qos.fairness`): W = w_p·prompt + w_q·output. Over time
(:meth:`ShareReport.share_over_time`) it is placed where the engine produced it: the
prompt at the first token, each output token when it is emitted.

**Weighted max-min fair share**, in service per second over the window from the run's
first to its last arrival, on the readers' timeline: a tenant *asks for* the service
that falls due in the window on its requests' expected timelines (the prompt at the
expected first token, output token k at TTFT + k/TDS:
:func:`qos.metrics.token_deadlines`) and is *delivered* the service its readers got in
it, each token when the client buffer releases it at the reader's pace
(:func:`qos.timeline.digestion_starts`, held until the expected TTFT). So a tenant
served on schedule or ahead of it is delivered exactly what it asked, whatever its
reply lengths: tokens served ahead of their readers count when they are read. The fair
shares are the water-filling of the delivered total in proportion to the weights,
capped at what each tenant asks (:func:`water_fill`). A tenant whose fair share is
below what it asks for is *backlogged*; its ratio is the service it got over its fair
share (1.0 = exactly fair). Where the engine delivered at least 95 % of all that was
asked (:data:`SHORT`), it was not short and every fair share is what was asked: the
5 % absorb replies served a little behind their readers.

Counting over the run, not per short interval, is deliberate: a request runs for a
minute or more once admitted, so any scheduler's shares swing within seconds; what a
tenant pays for is its share over the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qos.fairness import W_OUTPUT, W_PROMPT, water_fill
from qos.metrics import token_deadlines
from qos.sim.engine import RequestResult
from qos.timeline import digestion_starts

SHORT = 0.95
"""The engine is short when it delivers less than this fraction of what was asked."""


@dataclass(frozen=True)
class ShareReport:
    """Per-tenant service in the window against its fair share, and over time."""

    tenants: list[str]
    weights: np.ndarray
    window: tuple[float, float]  # first and last arrival (s, engine clock)
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
    edges = start + bin_s * np.arange(int(np.floor((end - start) / bin_s)) + 2)
    service = np.zeros((len(tenants), edges.size - 1))
    asked = np.zeros(len(tenants))
    delivered = np.zeros(len(tenants))

    def in_window(times: np.ndarray, prompt_tokens: int) -> float:
        """Service of one request's tokens at ``times`` in the window (the first token
        carries the prompt)."""
        inside = (times >= start) & (times <= last)
        return w_output * int(inside.sum()) + (w_prompt * prompt_tokens if inside[0] else 0.0)

    for r in requests:
        i = index[r.tenant]
        emitted = r.arrival + r.times
        at = np.searchsorted(edges, emitted, side="right") - 1
        np.add.at(service[i], at, w_output)
        service[i, at[0]] += w_prompt * r.prompt_tokens
        due = r.arrival + token_deadlines(r.times.size, r.ttft, r.tds)
        read = r.arrival + digestion_starts(r.times, r.tds, hold_until=r.ttft)
        asked[i] += in_window(due, r.prompt_tokens)
        delivered[i] += in_window(read, r.prompt_tokens)
    length = max(last - start, 1e-9)
    asked, delivered = asked / length, delivered / length
    w = np.array([float(weights[t]) for t in tenants])
    return ShareReport(
        tenants=tenants,
        weights=w,
        window=(start, last),
        asked=asked,
        delivered=delivered,
        fair=np.asarray(water_fill(asked.tolist(), w.tolist(), float(delivered.sum())))
        if delivered.sum() < SHORT * asked.sum()
        else asked,
        bin_edges=edges,
        service=service,
    )
