"""Queueing estimates for routing and admission.

QLM's request waiting time (RWT) estimator (Patke et al., "Queue Management for
SLO-Oriented Large Language Model Serving", §6, Eq. 2): under continuous batching the
token generation throughput Θ of an instance is close to constant over a long queue
(statistical averaging, QLM Appendix A.1), so a request waits for the output tokens of
everything ahead of it to be generated:

    W_q = Σ_{i=1}^{q-1} O_i / Θ

O_i is unknown in advance; QLM models it by its mean over the request group (Eq. 3),
and callers here pass whatever estimate they hold (the gateway: each request's
``max_tokens`` capped by a configured mean, shrinking as tokens stream back). The
estimate is conservative for short queues and tightens as the queue grows (QLM
Fig. 18).
"""

from __future__ import annotations

import math


def request_waiting_time(tokens_ahead: float, throughput_tps: float) -> float:
    """QLM's request waiting time estimate (§6, Eq. 2): ``W_q = ΣO_i / Θ`` in seconds.

    ``tokens_ahead`` is ΣO_i, the output tokens still expected from the requests ahead
    (>= 0); ``throughput_tps`` is Θ, the instance's token generation throughput in
    tokens per second (finite, > 0).
    """
    if not (math.isfinite(throughput_tps) and throughput_tps > 0):
        raise ValueError(f"throughput_tps: must be a finite number > 0, got {throughput_tps!r}")
    if not (math.isfinite(tokens_ahead) and tokens_ahead >= 0):
        raise ValueError(f"tokens_ahead: must be a finite number >= 0, got {tokens_ahead!r}")
    return tokens_ahead / throughput_tps
