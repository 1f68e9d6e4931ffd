"""Configuration of the vLLM scheduler plugin, from environment variables (no vLLM import).

vLLM constructs the scheduler class itself (``--scheduler-cls``), so the plugin takes
its settings from the engine's environment (defaults in brackets):

- ``TOKENPACE_POLICY``: the qos policy asked each iteration, by its name in
  :data:`qos.policy.registry.POLICIES`: ``andes-tp`` (default: Andes as tokenpace ships
  it, :func:`qos.policy.andes.tokenpace_andes`, the reader guard, stall charge 4 and
  the ``tp_weight`` tags acting as tenant weights), ``andes`` (the paper's settings),
  ``andes-tp-unweighted``, ``fcfs``, ``vtc``, ``round-robin``, ... A setting below
  that the named policy would not read (any, for ``fcfs``, ``vtc`` and ``round-robin``;
  the reader guard's, for the Andes policies without it) is refused when the engine
  starts.
- ``TOKENPACE_OBJECTIVE``: Andes objective, ``average``, ``max-min`` or ``perfect``
  [average].
- ``TOKENPACE_PROFILE``: latency profile: ``online`` (default: fitted from the engine's
  own step times with ``qos.latency.fit_profile``, :mod:`qos.vllm.online`) or the name
  of a shipped profile (``qos.latency.PROFILES``).
- ``TOKENPACE_KV_WATERMARK`` (with the reader guard, the share of the cache past which
  the solver ranks admissions; the guard admits into the whole cache less the replies'
  growth), ``TOKENPACE_PREEMPTION_CAP`` (P, preemptions per
  request on average; refused with the reader guard, which makes no preemption for the
  solver to cap), ``TOKENPACE_PREEMPTION_COST`` (the stall charge k),
  ``TOKENPACE_HORIZON_S`` (a fixed Δt; default the running mean completion time, §4.1):
  the Andes options of the same names, for the Andes policies; unset, the named
  policy's own settings apply. ``TOKENPACE_FAIR_SHARE_SLACK``: how far (in VTC service
  units over weight) a tenant may run ahead before the weights act
  (:mod:`qos.policy.fair`; ``andes-tp``'s default 8,192 suits a GPU engine's output
  rate, a small engine needs less). ``TOKENPACE_OVERDUE_AFTER_TTFTS``: a waiting request
  that has waited this many times its TTFT (and, under sustained overload,
  ``TOKENPACE_OVERDUE_AFTER_FCFS_WAITS`` times what FCFS would make a new request wait;
  ``andes-tp``'s default 1.25, 0 for the TTFT bound alone) is overdue and admitted in line,
  oldest first (:mod:`qos.policy.reader`; ``andes-tp``'s default 10), or ``off``.
- ``TOKENPACE_LEND_AFTER_S``: paused replies whose readers need nothing from them for
  longer than this many seconds lend their KV to waiting requests: they are preempted
  and brought back before their readers run dry (:mod:`qos.policy.reader`) [off]. Only
  where vLLM offloads KV to host memory (``--kv-offloading-size``), so that a lender
  comes back by a copy, not a recompute: without it every loan costs a prefill and
  lending loses throughput. Simulated with measured swap costs, 30 s lifts the
  stall-free rate most under sustained overload and 10 s on bursts, neither with a
  reply frozen past the guard's bound (docs/benchmarks.md, "Lending paused replies'
  KV to host memory").
- ``TOKENPACE_DECISION_INTERVAL_S``: least time between two policy decisions [0.1];
  a request arriving or leaving, or vLLM preempting on its own, forces a decision at the
  next step; 0 decides every step. In between, the last decision stands: nothing is
  preempted and only the requests it chose may be admitted. The reader guard's margin
  includes it (:meth:`qos.policy.reader.ReaderGuard.margin_s`), so a longer interval
  costs no freeze, only earlier resumptions; 0.1 s is under half a chat reader's token
  (1/4.8 s) and keeps the decisions' cost within 5 % of a CPU engine's step
  (docs/benchmarks.md).
- ``TOKENPACE_PAUSE``: ``1`` (default) or ``0``. With 1, a running request the policy
  drops is *paused*: it keeps its KV blocks and simply is not scheduled, and resumes
  where it stopped, as long as the cache has room for the requests the policy runs (the
  paused ones needed soonest keep theirs); the others are preempted the vLLM way (KV
  freed, recomputed on resume). With 0 every dropped request is preempted.
- ``TOKENPACE_DEFAULT_TIER`` [default], ``TOKENPACE_DEFAULT_TTFT`` [1.0 s],
  ``TOKENPACE_DEFAULT_TDS`` [4.8 tokens/s], ``TOKENPACE_DEFAULT_TENANT`` [default]:
  the expectations of requests that carry no tags.
- ``TOKENPACE_STATS_FILE``: if set, a JSON file the scheduler rewrites about once a
  second with its counters (steps, scheduling and policy time, preemptions, reader
  signals).
- ``TOKENPACE_REDIS_URL``: the gateway's shared store (its ``store.redis_url``); set, the
  scheduler hears the readers' signals the gateway publishes there
  (:mod:`qos.vllm.reader_channel`; needs redis-py in the engine's environment); unset
  [default], no reader channel: the reader guard models every reader from the send times.
- ``TOKENPACE_KEY_PREFIX`` [tokenpace]: the gateway's ``store.key_prefix``, which names
  the channel (:func:`qos.signals.channel`); refused without ``TOKENPACE_REDIS_URL``.

A malformed value is a ``ValueError`` naming the variable, raised when the engine
starts (not on the first request).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from qos.latency import PROFILES, LatencyProfile
from qos.policy.base import Policy
from qos.policy.reader import chosen_guard
from qos.policy.registry import POLICIES, make_policy
from qos.tags import RequestTags

OBJECTIVES = ("average", "max-min", "perfect")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
_FLAGS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


@dataclass(frozen=True)
class PluginConfig:
    policy: str = "andes-tp"
    objective: str | None = None  # None: the policy's default
    profile: str = "online"
    kv_watermark: float | None = None  # None: the policy's default
    preemption_cap: float | None = None  # None: the policy's default
    preemption_cost: float | None = None
    horizon_s: float | None = None
    fair_share_slack: float | None = None
    overdue_after_ttfts: float | None = None  # None: the policy's default; inf: off
    overdue_after_fcfs_waits: float | None = None  # None: the policy's default
    lend_after_s: float | None = None  # None: no lending
    decision_interval_s: float = 0.1
    pause: bool = True
    defaults: RequestTags = field(default_factory=RequestTags)
    stats_file: str | None = None
    redis_url: str | None = None  # None: no reader channel
    key_prefix: str = "tokenpace"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"TOKENPACE_POLICY: unknown policy {self.policy!r}; "
                f"use one of {', '.join(POLICIES)}"
            )
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise ValueError(
                f"TOKENPACE_OBJECTIVE: unknown objective {self.objective!r}; "
                f"use one of {', '.join(OBJECTIVES)}"
            )
        if self.profile != "online" and self.profile not in PROFILES:
            raise ValueError(
                f"TOKENPACE_PROFILE: unknown profile {self.profile!r}; use 'online' or one of "
                f"{', '.join(sorted(PROFILES))}"
            )
        if self.redis_url is not None:
            if not self.redis_url.startswith(_REDIS_SCHEMES):
                raise ValueError(
                    f"TOKENPACE_REDIS_URL: must be a Redis URL ({', '.join(_REDIS_SCHEMES)}...), "
                    f"got {self.redis_url!r}"
                )
            if importlib.util.find_spec("redis") is None:
                raise ValueError(
                    "TOKENPACE_REDIS_URL: the reader channel needs redis-py in the engine's "
                    "environment: pip install 'redis>=5' (or unset TOKENPACE_REDIS_URL)"
                )
        if not self.key_prefix:
            raise ValueError("TOKENPACE_KEY_PREFIX: must not be empty")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginConfig:
        """Read the ``TOKENPACE_*`` variables (see the module docstring)."""
        env = os.environ if environ is None else environ
        base = cls()
        d = base.defaults
        try:
            defaults = RequestTags(
                tier=env.get("TOKENPACE_DEFAULT_TIER", d.tier),
                ttft=_number(env, "TOKENPACE_DEFAULT_TTFT", d.ttft),
                tds=_number(env, "TOKENPACE_DEFAULT_TDS", d.tds),
                tenant=env.get("TOKENPACE_DEFAULT_TENANT", d.tenant),
            )
        except ValueError as exc:
            raise ValueError(f"TOKENPACE_DEFAULT_*: {exc}") from None
        watermark = None
        if env.get("TOKENPACE_KV_WATERMARK"):
            watermark = _number(env, "TOKENPACE_KV_WATERMARK", 0.0)
            if not 0 < watermark <= 1:
                raise ValueError(f"TOKENPACE_KV_WATERMARK: must be in (0, 1], got {watermark}")
        cap = _optional_non_negative(env, "TOKENPACE_PREEMPTION_CAP")
        cost = _optional_non_negative(env, "TOKENPACE_PREEMPTION_COST")
        horizon = _optional_seconds(env, "TOKENPACE_HORIZON_S")
        slack = _optional_non_negative(env, "TOKENPACE_FAIR_SHARE_SLACK")
        overdue = None
        raw = env.get("TOKENPACE_OVERDUE_AFTER_TTFTS", "").strip().lower()
        if raw == "off":
            overdue = math.inf
        elif raw:
            overdue = _number(env, "TOKENPACE_OVERDUE_AFTER_TTFTS", 0.0)
            if overdue <= 0:
                raise ValueError(
                    f"TOKENPACE_OVERDUE_AFTER_TTFTS: must be > 0 (TTFTs) or off, got {raw!r}"
                )
        waits = _optional_non_negative(
            env, "TOKENPACE_OVERDUE_AFTER_FCFS_WAITS", " (0: the TTFT bound alone)"
        )
        lend = _optional_seconds(env, "TOKENPACE_LEND_AFTER_S")
        interval = _number(env, "TOKENPACE_DECISION_INTERVAL_S", base.decision_interval_s)
        if interval < 0:
            raise ValueError(f"TOKENPACE_DECISION_INTERVAL_S: must be >= 0 seconds, got {interval}")
        redis_url = env.get("TOKENPACE_REDIS_URL", "").strip() or None
        prefix = env.get("TOKENPACE_KEY_PREFIX")
        if prefix is not None and redis_url is None:
            raise ValueError(
                "TOKENPACE_KEY_PREFIX: names the reader channel, which is off without "
                "TOKENPACE_REDIS_URL: set both, or neither"
            )
        pause = env.get("TOKENPACE_PAUSE", "1").strip().lower()
        if pause not in _FLAGS:
            raise ValueError(f"TOKENPACE_PAUSE: must be 1 or 0 (or true/false), got {pause!r}")
        return cls(
            policy=env.get("TOKENPACE_POLICY", base.policy),
            objective=env.get("TOKENPACE_OBJECTIVE") or None,
            profile=env.get("TOKENPACE_PROFILE", base.profile),
            kv_watermark=watermark,
            preemption_cap=cap,
            preemption_cost=cost,
            horizon_s=horizon,
            fair_share_slack=slack,
            overdue_after_ttfts=overdue,
            overdue_after_fcfs_waits=waits,
            lend_after_s=lend,
            decision_interval_s=interval,
            pause=_FLAGS[pause],
            defaults=defaults,
            stats_file=env.get("TOKENPACE_STATS_FILE") or None,
            redis_url=redis_url,
            key_prefix=base.key_prefix if prefix is None else prefix.strip(),
        )

    def build_policy(self, profile: LatencyProfile) -> Policy:
        """The registry's policy of this name on ``profile``, with the Andes options and
        the reader guard's settings set here (the ones left unset keep the named
        policy's own). One the named policy would not read is refused."""
        options = {
            "objective": self.objective,
            "kv_watermark": self.kv_watermark,
            "horizon_s": self.horizon_s,
            "preemption_cap": self.preemption_cap,
            "preemption_cost": self.preemption_cost,
            "fair_share_slack": self.fair_share_slack,
        }
        chosen: dict[str, Any] = {k: v for k, v in options.items() if v is not None}
        guard = chosen_guard(
            overdue_after_ttfts=self.overdue_after_ttfts,
            overdue_after_fcfs_waits=self.overdue_after_fcfs_waits,
            lend_after_s=self.lend_after_s,
        )
        if guard is not None:
            chosen["guard"] = guard
        try:
            return make_policy(self.policy, profile, **chosen)
        except ValueError as exc:
            raise ValueError(f"TOKENPACE_POLICY={self.policy}: {exc}") from None


def _optional_seconds(env: Mapping[str, str], name: str) -> float | None:
    """The duration in ``name``, None when unset; a ValueError naming it unless > 0."""
    if not env.get(name):
        return None
    value = _number(env, name, 0.0)
    if value <= 0:
        raise ValueError(f"{name}: must be > 0 seconds, got {value}")
    return value


def _optional_non_negative(env: Mapping[str, str], name: str, hint: str = "") -> float | None:
    """The number in ``name``, None when unset; a ValueError naming it when negative."""
    if not env.get(name):
        return None
    value = _number(env, name, 0.0)
    if value < 0:
        raise ValueError(f"{name}: must be >= 0{hint}, got {value}")
    return value


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}: must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name}: must be finite, got {raw!r}")
    return value
