"""Policies by name: one table for the benchmark, the embedded engine and the docs.

``andes`` is the paper's Andes (P = 1, no stall charge, no tenant weights); ``andes-tp``
is what tokenpace ships (:func:`qos.policy.andes.tokenpace_andes`: tenant weights act
through :mod:`qos.policy.fair`); ``andes-tp-unweighted`` is the same with weights
ignored, the reference the tiering benchmark compares total QoE with; ``vtc`` is strict
weighted fair share without QoE, the fairness reference. The vLLM plugin uses the same
names (``qos.vllm.config``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from qos.latency import LatencyProfile
from qos.policy.andes import UNGUARDED, Andes, tokenpace_andes
from qos.policy.base import Policy
from qos.policy.fcfs import FCFS
from qos.policy.round_robin import RoundRobin
from qos.policy.vtc import VTC

POLICIES: dict[str, Callable[..., Policy]] = {
    "fcfs": lambda profile, **_: FCFS(),
    "round-robin": lambda profile, **_: RoundRobin(interval=50),
    "andes": Andes,
    "andes-p0.3": lambda profile, **kw: Andes(profile, **{"preemption_cap": 0.3, **kw}),
    "andes-tp": tokenpace_andes,
    "andes-monotone": lambda profile, **kw: Andes(profile, **{"qoe": "monotone", **kw}),
    "andes-tp-unweighted": lambda profile, **kw: tokenpace_andes(
        profile,
        **{**kw, "fair_share_slack": None},  # weights ignored, whatever the options
    ),
    "andes-tp-unguarded": lambda profile, **kw: tokenpace_andes(profile, **{**UNGUARDED, **kw}),
    "vtc": lambda profile, **_: VTC(),
}


STOCK_POLICIES = frozenset({"fcfs"})
"""The policies that stand for an engine's own scheduler (vLLM's FCFS): run without the
tokenpace plugin, so a running request left out loses its KV (recompute), as in stock
vLLM. Every other policy runs as the plugin runs it, pausing a request it leaves out
with its KV kept while the cache has room (``Capacity.pauses``)."""


GUARDED = frozenset({"andes-tp", "andes-tp-unweighted"})
"""The policies with the reader guard (:mod:`qos.policy.reader`): the ones that take its
settings (``guard``)."""

ANDES_POLICIES = frozenset(
    {
        "andes",
        "andes-p0.3",
        "andes-tp",
        "andes-monotone",
        "andes-tp-unweighted",
        "andes-tp-unguarded",
    }
)
"""The policies that take :class:`~qos.policy.andes.Andes` keyword arguments."""


def make_policy(name: str, profile: LatencyProfile, **andes_options: Any) -> Policy:
    """A fresh policy ``name`` on ``profile``; ValueError naming the choices if unknown.

    ``andes_options`` are :class:`~qos.policy.andes.Andes` keyword arguments; they
    override the named configuration's own. A setting the named policy would not read is
    refused, naming where it acts: any for FCFS, round robin and VTC, which have none,
    and ``guard`` (:class:`~qos.policy.reader.GuardSettings`) for the policies without
    the reader guard.
    """
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"policy: unknown {name!r}; use one of {', '.join(POLICIES)}")
    guard = andes_options.get("guard")
    if guard is not None and name not in GUARDED:
        set_here = [f.name for f in fields(guard) if getattr(guard, f.name) != f.default]
        raise ValueError(
            f"{', '.join(set_here or ['guard'])}: the reader guard's settings, and policy "
            f"{name!r} has no reader guard; they act on {', '.join(sorted(GUARDED))}"
        )
    if andes_options and name not in ANDES_POLICIES:
        raise ValueError(
            f"{', '.join(sorted(andes_options))}: policy {name!r} reads no settings; "
            f"they act on {', '.join(sorted(ANDES_POLICIES))}"
        )
    return factory(profile, **andes_options)
