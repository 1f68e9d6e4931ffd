"""Discrete-event simulation of a continuous-batching engine, and its workloads."""

from qos.sim.engine import (
    Engine,
    RequestResult,
    SimResult,
    StepResult,
    simulate,
)
from qos.sim.workload import (
    CHAT,
    PROMPT_TOKEN_ESTIMATE,
    READING_TDS,
    SPEAKING_TDS,
    VOICE,
    SimRequest,
    Tier,
    TraceEntry,
    build_workload,
    default_trace_path,
    estimate_prompt_tokens,
    gamma_arrivals,
    load_andes_trace,
    poisson_arrivals,
)

__all__ = [
    "CHAT",
    "PROMPT_TOKEN_ESTIMATE",
    "READING_TDS",
    "SPEAKING_TDS",
    "VOICE",
    "Engine",
    "RequestResult",
    "SimRequest",
    "SimResult",
    "StepResult",
    "Tier",
    "TraceEntry",
    "build_workload",
    "default_trace_path",
    "estimate_prompt_tokens",
    "gamma_arrivals",
    "load_andes_trace",
    "poisson_arrivals",
    "simulate",
]
