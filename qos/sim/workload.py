"""Workloads for the simulator: the Andes ShareGPT QoE trace, arrival processes, tiers.

A workload is a list of :class:`SimRequest` sorted by arrival time. It is built from
trace entries (prompt length, reply length and the user's expected TTFT/TDS), an
arrival process (Poisson, or Gamma for bursty traffic, Andes §6.4) and optionally a
mix of QoE tiers (e.g. chat at reading speed, voice at speaking speed) and tenants.

The trace's numbers ship with the package (``qos/sim/data/andes_sharegpt_qoe_trace.csv``,
3,000 rows, Apache-2.0, from the Andes authors' AmberLJC/vllm-0.6.1): prompt token
estimate, reply length, expected TTFT and seconds per token. :func:`load_andes_trace`
reads it by default, or the full JSON trace (with prompt texts) given its path.

Prompt tokens are *estimated* from the prompt text as ``max(1, round(len(prompt) / 4))``
(about four characters per token for English; see :data:`PROMPT_TOKEN_ESTIMATE`). The
trace stores text, not token ids, so every result built on it must say so.

Everything here is deterministic for a seed.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from qos.prompt_tokens import estimate_text_tokens

PROMPT_TOKEN_ESTIMATE = "chars/4: max(1, round(len(prompt) / 4))"
"""How :func:`load_andes_trace` counts prompt tokens; quote it next to any result."""

TRACE_ENV = "TOKENPACE_TRACE"
DEFAULT_TRACE = Path(__file__).resolve().parent / "data" / "andes_sharegpt_qoe_trace.csv"
"""The trace's numbers, shipped with the package (the module docstring)."""

READING_TDS = 4.8
"""Tokens/s of a chat tier at a brisk reading pace (~220 WPM at the trace's 1.3 tokens per
word; the trace itself spans 3.8-5.1 tokens/s, 175-236 WPM of Andes Table 1, mean 4.5)."""
SPEAKING_TDS = 3.3
"""Tokens/s of speech: 150 WPM (Andes Table 2, English) at 1.3 tokens per word, the
voice-chat QoE trace of §6.4."""


@dataclass(frozen=True)
class SimRequest:
    """One request as the simulator sees it. Times in seconds on the engine clock."""

    id: str
    arrival: float
    prompt_tokens: int
    output_tokens: int
    ttft: float  # expected time to first token (s)
    tds: float  # expected token delivery speed (tokens/s)
    tenant: str = "default"
    weight: float = 1.0
    tier: str = "chat"

    def __post_init__(self) -> None:
        if not math.isfinite(self.arrival) or self.arrival < 0:
            raise ValueError(f"arrival: must be a finite time >= 0, got {self.arrival}")
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens: must be >= 0, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"output_tokens: a reply needs >= 1 token, got {self.output_tokens}")
        if not math.isfinite(self.ttft) or self.ttft < 0:
            raise ValueError(f"ttft: must be a finite number >= 0, got {self.ttft}")
        if not math.isfinite(self.tds) or self.tds <= 0:
            raise ValueError(f"tds: must be a finite number > 0, got {self.tds}")
        if not self.weight > 0:
            raise ValueError(f"weight: must be > 0, got {self.weight}")


@dataclass(frozen=True)
class TraceEntry:
    """One entry of the Andes QoE trace."""

    id: str
    prompt_tokens: int  # chars/4 estimate, see PROMPT_TOKEN_ESTIMATE
    output_len: int
    ttft: float  # expected TTFT (s)
    latency: float  # expected seconds per token

    @property
    def tds(self) -> float:
        """Expected token delivery speed, tokens/s (1 / latency)."""
        return 1.0 / self.latency


@dataclass(frozen=True)
class Tier:
    """A QoE class: the expected TTFT (s) and TDS (tokens/s) its users get."""

    name: str
    ttft: float
    tds: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.ttft) or self.ttft < 0:
            raise ValueError(f"tier {self.name!r}: ttft must be finite and >= 0, got {self.ttft}")
        if not math.isfinite(self.tds) or self.tds <= 0:
            raise ValueError(f"tier {self.name!r}: tds must be finite and > 0, got {self.tds}")


CHAT = Tier("chat", 1.0, READING_TDS)
VOICE = Tier("voice", 1.0, SPEAKING_TDS)
FAST = Tier("fast", 0.5, 25.0)
BATCH = Tier("batch", 60.0, 50.0)
TIERS = {t.name: t for t in (CHAT, VOICE, FAST, BATCH)}
"""The gateway's default tiers (``gateway.config.schema.DEFAULT_TIERS``), by name."""


def default_trace_path() -> Path:
    """``$TOKENPACE_TRACE`` if set, else the shipped CSV (:data:`DEFAULT_TRACE`)."""
    env = os.environ.get(TRACE_ENV)
    return Path(env) if env else DEFAULT_TRACE


def load_andes_trace(path: str | os.PathLike[str] | None = None) -> list[TraceEntry]:
    """Read the Andes ShareGPT QoE trace: the shipped CSV or the authors' full JSON.

    ``path`` defaults to :func:`default_trace_path`. A ``.csv`` path is read as the
    shipped file (columns ``id, prompt_tokens, output_len, ttft_s, latency_s``; ``#``
    lines are comments); anything else as the JSON trace, a list of entries with
    ``prompt`` (text), ``output_len`` (tokens of the reply), ``ttft`` (expected TTFT, s)
    and ``latency`` (expected seconds per token; the expected TDS is ``1 / latency``),
    whose prompt tokens are estimated from the text as ``max(1, round(len(prompt) / 4))``
    (chars/4, :data:`PROMPT_TOKEN_ESTIMATE`, as the CSV's were): the trace has no token ids.
    """
    p = Path(path) if path is not None else default_trace_path()
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"path: Andes trace not found at {p} (set ${TRACE_ENV} to its location)"
        ) from None
    rows = _csv_rows(text) if p.suffix.lower() == ".csv" else _json_rows(text, p)
    if not rows:
        raise ValueError(f"path: {p} holds no trace entries")
    entries = []
    for i, row in enumerate(rows):
        try:
            entry = TraceEntry(
                id=str(row.get("id", i)),
                prompt_tokens=int(row["prompt_tokens"]),
                output_len=int(row["output_len"]),
                ttft=float(row["ttft"]),
                latency=float(row["latency"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"path: entry {i} of {p} is malformed ({exc!r})") from None
        if entry.prompt_tokens < 1 or entry.output_len < 1 or not entry.ttft >= 0:
            raise ValueError(
                f"path: entry {i} of {p} needs prompt tokens >= 1, output_len >= 1, ttft >= 0; "
                f"got {entry.prompt_tokens}, {entry.output_len}, {entry.ttft}"
            )
        if not entry.latency > 0:
            raise ValueError(f"path: entry {i} of {p} needs latency > 0, got {entry.latency}")
        entries.append(entry)
    return entries


def _csv_rows(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return [
        {**row, "ttft": row.get("ttft_s"), "latency": row.get("latency_s")}
        for row in csv.DictReader(lines)
    ]


def _json_rows(text: str, p: Path) -> list[dict[str, Any]]:
    raw = json.loads(text)
    if not isinstance(raw, list):
        raise ValueError(f"path: {p} does not hold a JSON list of trace entries")
    rows = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict) or not isinstance(e.get("prompt"), str):
            raise ValueError(f"path: entry {i} of {p} is malformed (no prompt text)")
        rows.append({**e, "prompt_tokens": estimate_text_tokens(e["prompt"])})
    return rows


# -- arrival processes -------------------------------------------------------------------
def _check_n_rate(n: int, rate: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ValueError(f"n: must be an integer >= 0, got {n!r}")
    if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate: must be a finite number of requests/s > 0, got {rate!r}")


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times (s) of a Poisson process of ``rate`` requests/s.

    Inter-arrival gaps are exponential with mean ``1/rate``; the first arrival is one
    gap after time 0.
    """
    _check_n_rate(n, rate)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def gamma_arrivals(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times (s) with Gamma inter-arrival gaps: mean ``1/rate``, CV ``cv``.

    Shape k = 1/cv², scale θ = cv²/rate (mean kθ = 1/rate, CV 1/√k = cv). ``cv = 1`` is
    Poisson; ``cv = 3`` is the bursty process of Andes §6.4.
    """
    _check_n_rate(n, rate)
    if not (isinstance(cv, int | float) and math.isfinite(cv) and cv > 0):
        raise ValueError(f"cv: coefficient of variation must be a finite number > 0, got {cv!r}")
    shape = 1.0 / (cv * cv)
    return np.cumsum(rng.gamma(shape, 1.0 / (rate * shape), size=n))


# -- building a workload -------------------------------------------------------------------
TierMix = Mapping[str, tuple[float, float, float]] | Sequence[tuple[Tier, float]]
TenantMix = Sequence[tuple[str, float, float]]


def _shares(values: Sequence[float], what: str) -> np.ndarray:
    p = np.asarray(values, dtype=float)
    if p.size == 0:
        raise ValueError(f"{what}: needs at least one entry")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError(f"{what}: shares must be finite and >= 0, got {p.tolist()}")
    if not math.isclose(float(p.sum()), 1.0, abs_tol=1e-6):
        raise ValueError(f"{what}: shares must sum to 1, got {float(p.sum()):g}")
    normalised: np.ndarray = p / p.sum()
    return normalised


def _parse_tier_mix(tier_mix: TierMix) -> tuple[list[Tier], np.ndarray]:
    tiers, shares = [], []
    try:
        if isinstance(tier_mix, Mapping):
            for name, (ttft, tds, share) in tier_mix.items():
                tiers.append(Tier(str(name), float(ttft), float(tds)))
                shares.append(share)
        else:
            for tier, share in tier_mix:
                if not isinstance(tier, Tier):
                    raise TypeError(f"expected a Tier, got {tier!r}")
                tiers.append(tier)
                shares.append(share)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"tier_mix: expected {{name: (ttft, tds, share)}} or [(Tier, share), ...]; {exc}"
        ) from None
    if len({t.name for t in tiers}) != len(tiers):
        raise ValueError("tier_mix: tier names must be unique")
    return tiers, _shares(shares, "tier_mix")


def parse_tier_mix(text: str) -> list[tuple[Tier, float]]:
    """``"chat=0.5,voice=0.3,fast=0.2"`` (names of :data:`TIERS`) as ``[(Tier, share)]``."""
    mix = []
    for part in text.split(","):
        name, _, share = part.strip().partition("=")
        if name not in TIERS:
            raise ValueError(f"tier mix: unknown tier {name!r}; use {', '.join(TIERS)}")
        try:
            mix.append((TIERS[name], float(share)))
        except ValueError:
            raise ValueError(f"tier mix: {part.strip()!r} is not NAME=SHARE") from None
    _shares([s for _, s in mix], "tier mix")
    return mix


def parse_tenants(text: str) -> list[tuple[str, float, float]]:
    """``"free:1:0.33,pro:2:0.33,ent:4:0.34"`` (name:weight:share) as a tenant mix."""
    tenants = []
    for part in text.split(","):
        fields = part.strip().split(":")
        try:
            name, weight, share = fields[0], float(fields[1]), float(fields[2])
        except (IndexError, ValueError):
            raise ValueError(f"tenants: {part.strip()!r} is not NAME:WEIGHT:SHARE") from None
        if len(fields) != 3 or not name:
            raise ValueError(f"tenants: {part.strip()!r} is not NAME:WEIGHT:SHARE")
        tenants.append((name, weight, share))
    _parse_tenants(tenants)
    return tenants


def _parse_tenants(tenants: TenantMix) -> tuple[list[str], np.ndarray, np.ndarray]:
    names, weights, shares = [], [], []
    try:
        for name, weight, share in tenants:
            names.append(str(name))
            weights.append(float(weight))
            shares.append(share)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tenants: expected [(name, weight, share), ...]; {exc}") from None
    if len(set(names)) != len(names):
        raise ValueError("tenants: tenant names must be unique")
    w = np.asarray(weights, dtype=float)
    if w.size and (not np.all(np.isfinite(w)) or np.any(w <= 0)):
        raise ValueError(f"tenants: weights must be finite and > 0, got {w.tolist()}")
    return names, w, _shares(shares, "tenants")


def build_workload(
    entries: Sequence[TraceEntry],
    rate: float,
    *,
    arrivals: Literal["poisson", "gamma"] = "poisson",
    cv: float = 3.0,
    seed: int = 0,
    n: int | None = None,
    tier_mix: TierMix | None = None,
    tenants: TenantMix | None = None,
) -> list[SimRequest]:
    """Requests from trace ``entries`` arriving at ``rate`` requests/s, sorted by arrival.

    - ``n`` requests (default ``len(entries)``) take the entries in trace order,
      cycling through them again when ``n > len(entries)``; ids are ``"r0"``, ``"r1"``...
    - ``arrivals``: ``"poisson"`` or ``"gamma"`` (inter-arrival CV ``cv``; Andes §6.4
      uses cv = 3 for bursts). ``cv`` is ignored for Poisson.
    - ``tier_mix`` (``{"chat": (ttft, tds, share), "voice": (1.0, 3.3, 0.3)}`` or
      ``[(Tier, share), ...]``) overrides each request's expected TTFT/TDS from a tier
      drawn at random with those shares; without it, requests keep the trace's
      expectations (tier ``"chat"``). A voice workload is ``{"voice": (1.0, 3.3, 1.0)}``.
    - ``tenants`` (``[(name, weight, share), ...]``) draws each request's tenant.

    Arrivals, tiers and tenants use independent streams spawned from ``seed``, so e.g.
    changing the tier mix keeps the same arrival times. Raises ``ValueError`` naming
    the argument on bad input.
    """
    if not entries:
        raise ValueError("entries: the trace is empty")
    if n is None:
        n = len(entries)
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"n: must be an integer >= 1, got {n!r}")
    _check_n_rate(n, rate)
    if arrivals not in ("poisson", "gamma"):
        raise ValueError(f"arrivals: must be 'poisson' or 'gamma', got {arrivals!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ValueError(f"seed: must be an integer, got {seed!r}")
    tiers: list[Tier] = []
    tier_shares = None
    if tier_mix is not None:
        tiers, tier_shares = _parse_tier_mix(tier_mix)
    tenant_names: list[str] = []
    tenant_weights = np.ones(0)
    tenant_shares = None
    if tenants is not None:
        tenant_names, tenant_weights, tenant_shares = _parse_tenants(tenants)

    arr_rng, tier_rng, tenant_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(3)
    )
    if arrivals == "poisson":
        times = poisson_arrivals(n, rate, arr_rng)
    else:
        times = gamma_arrivals(n, rate, cv, arr_rng)
    tier_idx = tier_rng.choice(len(tiers), size=n, p=tier_shares) if tiers else None
    tenant_idx = (
        tenant_rng.choice(len(tenant_names), size=n, p=tenant_shares) if tenant_names else None
    )

    out = []
    for i in range(n):
        e = entries[i % len(entries)]
        ttft, tds, tier = e.ttft, e.tds, "chat"
        if tier_idx is not None:
            t = tiers[tier_idx[i]]
            ttft, tds, tier = t.ttft, t.tds, t.name
        tenant, weight = "default", 1.0
        if tenant_idx is not None:
            tenant, weight = tenant_names[tenant_idx[i]], float(tenant_weights[tenant_idx[i]])
        out.append(
            SimRequest(
                id=f"r{i}",
                arrival=float(times[i]),
                prompt_tokens=e.prompt_tokens,
                output_tokens=e.output_len,
                ttft=float(ttft),
                tds=float(tds),
                tenant=tenant,
                weight=weight,
                tier=tier,
            )
        )
    return out


def scale_demand(requests: Sequence[SimRequest], factor: float) -> list[SimRequest]:
    """``requests`` asking ``factor`` (≥ 1) times as much at every moment: request i
    repeated ⌊(i+1)·factor⌋ − ⌊i·factor⌋ times at its own arrival (⌊factor⌋ or ⌈factor⌉,
    spread evenly), the k-th copy's id suffixed ``~k``. On a whole engine, this is the load
    the requests put on 1/``factor`` of it, its KV cache, batch slots and compute alike:
    what they would get from that part of a fleet of such engines. Raises ``ValueError``
    on a factor below 1 or not finite."""
    if not 1.0 <= factor < math.inf:
        raise ValueError(f"factor: must be a finite number >= 1, got {factor}")
    out: list[SimRequest] = []
    for i, request in enumerate(requests):
        copies = math.floor((i + 1) * factor) - math.floor(i * factor)
        out.extend(replace(request, id=f"{request.id}~{k}") for k in range(copies))
    return out
