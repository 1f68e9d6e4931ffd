"""Policies by name: one table for the benchmark, the embedded engine and the docs.

``andes`` is the paper's Andes (P = 1, no stall charge); ``andes-tp`` is what tokenpace
ships (:func:`qos.policy.andes.tokenpace_andes`); ``fair-andes-tp`` is fair Andes with
the same settings. The vLLM plugin uses the same names (``qos.vllm.config``).
"""

from __future__ import annotations

from collections.abc import Callable

from qos.latency import LatencyProfile
from qos.policy.andes import TOKENPACE_ANDES, Andes, tokenpace_andes
from qos.policy.base import Policy
from qos.policy.fair import FairAndes
from qos.policy.fcfs import FCFS
from qos.policy.round_robin import RoundRobin
from qos.policy.vtc import VTC

POLICIES: dict[str, Callable[[LatencyProfile], Policy]] = {
    "fcfs": lambda profile: FCFS(),
    "round-robin": lambda profile: RoundRobin(interval=50),
    "andes": lambda profile: Andes(profile),
    "andes-p0.3": lambda profile: Andes(profile, preemption_cap=0.3),
    "andes-tp": tokenpace_andes,
    "andes-monotone": lambda profile: Andes(profile, qoe="monotone"),
    "vtc": lambda profile: VTC(),
    "fair-andes": lambda profile: FairAndes(profile),
    "fair-andes-tp": lambda profile: FairAndes(profile, **TOKENPACE_ANDES),
}


def make_policy(name: str, profile: LatencyProfile) -> Policy:
    """A fresh policy ``name`` on ``profile``; ValueError naming the choices if unknown."""
    factory = POLICIES.get(name)
    if factory is None:
        raise ValueError(f"policy: unknown {name!r}; use one of {', '.join(POLICIES)}")
    return factory(profile)
