"""A latency profile of the running engine, fitted online from its own steps (no vLLM import).

Andes needs the decode latency as a function of batch size (B_min, the trigger, τ in
Q_serve) and the prefill cost per token (the first-token delay of a waiting request,
the forecast's ``first_delay``). Inside vLLM both are measured for free: every step
the scheduler knows how many requests decoded, how many prompt tokens were prefilled,
and how long the model took. :class:`OnlineProfile` keeps a window of those steps and,
every ``refit_every`` steps, refits:

- decode table: :func:`qos.latency.fit_profile` over the pure-decode steps (Appendix
  B's measurement: median latency per batch size, made non-decreasing);
- prefill cost per token: the median over mixed steps of
  (step time − decode time of its decode batch) / prefilled tokens.

Until ``min_samples`` decode steps are seen it returns the seed profile; the first fit
comes as soon as they are (a seed that takes a slow engine for a fast one lets the
policy admit readers the batch cannot pace), the next ones every ``refit_every`` steps.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from qos.latency import LatencyProfile, fit_profile

SEED_DECODE_S = 0.02  # one decode iteration before anything is measured (a small GPU model)
SEED_PREFILL_PER_TOKEN_S = 1e-4
_MIN_PREFILL_PER_TOKEN_S = 1e-8


class OnlineProfile:
    """Refit a :class:`~qos.latency.LatencyProfile` from observed engine steps."""

    def __init__(
        self,
        *,
        kv_capacity_tokens: int,
        max_batch: int,
        window: int = 4096,
        refit_every: int = 200,
        min_samples: int = 32,
    ) -> None:
        if refit_every < 1 or min_samples < 1 or window < min_samples:
            raise ValueError(
                f"need refit_every >= 1 and 1 <= min_samples <= window, got {refit_every}, "
                f"{min_samples}, {window}"
            )
        self.kv_capacity_tokens = kv_capacity_tokens
        self.max_batch = max_batch
        self.refit_every = refit_every
        self.min_samples = min_samples
        self._decode: deque[tuple[int, float]] = deque(maxlen=window)
        self._mixed: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._since_fit = 0
        self.refits = 0
        self.profile = LatencyProfile(
            name="vllm-online-seed",
            source="seed before any engine step was measured",
            batch_sizes=(1,),
            decode_s_at=(SEED_DECODE_S,),
            kv_capacity_tokens=kv_capacity_tokens,
            max_batch=max_batch,
            prefill_per_token_s=SEED_PREFILL_PER_TOKEN_S,
        )

    def observe(self, decode_batch: int, prefill_tokens: int, duration_s: float) -> bool:
        """Record one step; True when the profile was refitted (``self.profile`` changed)."""
        if duration_s <= 0 or (decode_batch <= 0 and prefill_tokens <= 0):
            return False
        if prefill_tokens == 0:
            self._decode.append((decode_batch, duration_s))
        else:
            self._mixed.append((decode_batch, prefill_tokens, duration_s))
        self._since_fit += 1
        if len(self._decode) < self.min_samples:
            return False
        if self.refits and self._since_fit < self.refit_every:
            return False
        self._since_fit = 0
        self.profile = self._fit()
        self.refits += 1
        return True

    def _fit(self) -> LatencyProfile:
        batches, durations = zip(*self._decode, strict=True)
        decode = fit_profile(
            "vllm-online",
            batches,
            durations,
            kv_capacity_tokens=self.kv_capacity_tokens,
            max_batch=self.max_batch,
            prefill_per_token_s=self.profile.prefill_per_token_s,
            source=f"fitted online from {len(batches)} decode steps of this engine",
        )
        if self._mixed:
            b, tokens, dur = (np.asarray(x, dtype=float) for x in zip(*self._mixed, strict=True))
            per_token = (dur - np.asarray(decode.decode_s(b))) / tokens
            prefill = max(float(np.median(per_token)), _MIN_PREFILL_PER_TOKEN_S)
        else:
            prefill = self.profile.prefill_per_token_s
        return LatencyProfile(
            name=decode.name,
            source=decode.source + f" and {len(self._mixed)} prefill steps",
            batch_sizes=decode.batch_sizes,
            decode_s_at=decode.decode_s_at,
            kv_capacity_tokens=self.kv_capacity_tokens,
            max_batch=self.max_batch,
            prefill_per_token_s=prefill,
        )
