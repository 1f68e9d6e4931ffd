"""Write the QoE test vectors every implementation of the formulas is checked against.

``qos.metrics`` is the reference. The client SDKs (``sdk_python``, ``sdk_web``) carry
their own dependency-free copies of the digestion schedule (recursion D), Andes QoE
(Andes, Liu et al., §3.1 Eq. 1) and the monotone QoE (docs/qoe.md); each test suite
checks its copy against ``tests/vectors/qoe.json``, and ``tests/qos/test_qoe_vectors.py``
checks that every value in the committed file is what ``qos.metrics`` computes today, so
no copy can drift silently. Rewrite the file after changing a formula:

    .venv/bin/python scripts/make_qoe_vectors.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from qos.metrics import andes_qoe, freezes, monotone_qoe, user_idle_latency
from qos.timeline import digestion_starts, token_times

OUT = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "qoe.json"
SEED = 20261123

Chunks = list[tuple[float, int]]


def _per_token(times: list[float]) -> Chunks:
    return [(t, 1) for t in times]


def _hand_cases() -> list[tuple[str, Chunks, float, float]]:
    """Cases with known values (docs/qoe.md): Andes Figure 5, lateness, cliffs."""
    fig5 = 10, 1.0, 2.0  # tokens, TTFT, TDS
    n, ttft, tds = fig5
    on_time = [ttft + k / tds for k in range(n)]
    paused = [1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 5.5, 6.0, 6.5, 7.0]
    late = [21.0 + k / 5.0 for k in range(100)]
    return [
        ("andes-fig5a-perfect", _per_token(on_time), ttft, tds),
        ("andes-fig5b-ttft-missed", _per_token([t + 2.0 for t in on_time]), ttft, tds),
        ("andes-fig5c-tds-missed", _per_token([1.0 + k for k in range(n)]), ttft, tds),
        ("andes-fig5d-pause", _per_token(paused), ttft, tds),
        ("lateness-baseline", _per_token(late), 1.0, 5.0),
        ("lateness-last-token-held", _per_token([*late[:-1], late[-1] + 30.0]), 1.0, 5.0),
        ("single-chunk-at-ttft", [(1.0, 20)], 1.0, 4.8),
        ("single-chunk-after-ttft", [(1.0001, 20)], 1.0, 4.8),
        ("all-before-ttft", [(0.1, 3), (0.2, 5)], 1.0, 4.8),
        ("single-token-late", [(2.5, 1)], 1.0, 4.8),
        ("first-token-at-zero", [(0.0, 1), (0.1, 1), (0.9, 4)], 0.0, 3.3),
        ("eq1-not-monotone-in-tds-fast", [(5.0, 1), (6.0, 1)], 1.0, 2.0),
        ("eq1-not-monotone-in-tds-slow", [(5.0, 1), (6.0, 1)], 1.0, 0.2),
        ("burst-after-pause", [(0.3, 1), (0.5, 1), (3.0, 30), (3.1, 1)], 1.0, 4.8),
        (
            "freeze-late-in-a-long-reply",
            _per_token([*late[:90], *(t + 60.0 for t in late[90:])]),
            1.0,
            5.0,
        ),
        ("freezes-exactly-at-pace", _per_token([1.0 + k / 4.8 for k in range(12)]), 1.0, 4.8),
        ("freeze-behind-a-buffer", [(1.0, 20), (4.0, 1), (9.0, 5)], 1.0, 5.0),
    ]


def _random_cases(rng: np.random.Generator) -> list[tuple[str, Chunks, float, float]]:
    """Bursty server timelines: gaps, pauses and multi-token chunks, at the tiers' speeds."""
    cases = []
    tiers = [("chat", 1.0, 4.8), ("voice", 1.0, 3.3), ("fast", 0.5, 25.0), ("batch", 60.0, 50.0)]
    for i in range(24):
        name, ttft, tds = tiers[i % len(tiers)]
        chunks = int(rng.integers(1, 120))
        first = float(rng.exponential(ttft * 1.5))
        gaps = rng.exponential(1.0 / (tds * rng.uniform(0.3, 4.0)), size=chunks)
        gaps[rng.random(chunks) < 0.05] += rng.uniform(1.0, 8.0)  # pauses (preemptions)
        gaps[0] = 0.0
        times = first + np.cumsum(gaps)
        counts = rng.choice([1, 1, 1, 2, 3, 8], size=chunks)
        timeline = [(round(float(t), 6), int(c)) for t, c in zip(times, counts, strict=True)]
        cases.append((f"random-{name}-{i:02d}", timeline, ttft, tds))
    return cases


def vector(name: str, timeline: Chunks, ttft: float, tds: float) -> dict[str, Any]:
    """One case: the inputs and what ``qos`` computes for them."""
    times = token_times(timeline)
    return {
        "name": name,
        "timeline": [[t, n] for t, n in timeline],
        "ttft": ttft,
        "tds": tds,
        "andes": andes_qoe(timeline, ttft, tds),
        "monotone": monotone_qoe(timeline, ttft, tds),
        "digestion": digestion_starts(times, tds).tolist(),
        "freezes": asdict(freezes(timeline, tds)),
        "idle": user_idle_latency(timeline, ttft, tds),
    }


def build() -> dict[str, Any]:
    cases = _hand_cases() + _random_cases(np.random.default_rng(SEED))
    return {
        "about": (
            "QoE test vectors generated from qos.metrics by scripts/make_qoe_vectors.py; "
            "do not edit. timeline: [seconds since the request, tokens] per chunk; "
            "andes: Andes Eq. 1; monotone: monotone QoE (docs/qoe.md); digestion: "
            "d_k = max(t_k, d_(k-1) + 1/TDS) per token, the pacing schedule; freezes: the "
            "display gaps beyond the reader's pace, (d_k - d_(k-1)) - 1/TDS > 1e-6 s (longest, "
            "count, total); idle: user idle latency (Wang et al. Eq. 9)."
        ),
        "vectors": [vector(*case) for case in cases],
    }


def render() -> str:
    """One vector a line, so a change reads as a diff of the cases it touches."""
    data = build()
    lines = ",\n  ".join(json.dumps(v) for v in data["vectors"])
    return f'{{"about": {json.dumps(data["about"])},\n "vectors": [\n  {lines}\n ]}}\n'


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
