"""Write the reader-signal vectors both SDKs are checked against.

``qos.signals`` is the reference for the channel's vocabulary and timing (how often a
client may send, how long an away holds), and ``qos.metrics.freezes`` with ``away`` for
the freezes a reader sees while watching. Each SDK keeps a dependency-free copy
(``tokenpace_client.signals``, ``sdk_web/src/signals.ts``) and checks it against
``tests/vectors/signals.json``; ``tests/qos/test_signal_vectors.py`` checks that the
committed file is what ``qos`` gives today, so no copy can drift silently. Rewrite the
file after changing a constant or the release rule:

    .venv/bin/python scripts/make_signal_vectors.py
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from qos.metrics import freezes, watched_times
from qos.signals import (
    AWAY_LEASE_S,
    MAX_BUFFER_TOKENS,
    MAX_PACE_TPS,
    MIN_INTERVAL_S,
    Presence,
)
from qos.timeline import token_times

OUT = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "signals.json"
SEED = 20261206

Chunks = list[tuple[float, int]]
Away = list[tuple[float, float]]


def _hand_cases() -> list[tuple[str, Chunks, float, Away]]:
    """Cases with a known answer: a reply that streams on while its reader is away."""
    steady = [(1.0 + k / 5.0, 1) for k in range(40)]
    return [
        ("no-away", steady, 5.0, []),
        ("away-while-it-streams", steady, 5.0, [(2.0, 6.0)]),
        ("away-during-a-server-stall", [(1.0, 10), (8.0, 10)], 5.0, [(2.5, 7.5)]),
        ("stall-outlasts-the-away", [(1.0, 10), (12.0, 10)], 5.0, [(2.5, 7.5)]),
        ("away-before-the-first-token", [(3.0, 5), (3.5, 5)], 4.8, [(0.5, 2.0)]),
        ("two-aways", steady, 5.0, [(1.5, 2.0), (4.0, 9.0)]),
        ("away-of-no-length", steady, 5.0, [(3.0, 3.0)]),
    ]


def _random_cases(rng: np.random.Generator) -> list[tuple[str, Chunks, float, Away]]:
    """Bursty timelines at the tiers' speeds, the reader away once or twice."""
    cases = []
    for i in range(12):
        tds = (4.8, 3.3, 25.0)[i % 3]
        chunks = int(rng.integers(5, 80))
        gaps = rng.exponential(1.0 / (tds * rng.uniform(0.3, 3.0)), size=chunks)
        gaps[rng.random(chunks) < 0.08] += rng.uniform(1.0, 6.0)
        times = float(rng.uniform(0.2, 2.0)) + np.cumsum(gaps)
        counts = rng.choice([1, 1, 2, 3], size=chunks)
        timeline = [(round(float(t), 6), int(c)) for t, c in zip(times, counts, strict=True)]
        bounds = np.sort(rng.uniform(0.0, float(times[-1]) + 5.0, size=2 * (1 + i % 2)))
        away = [(round(float(a), 6), round(float(b), 6)) for a, b in bounds.reshape(-1, 2)]
        cases.append((f"random-{i:02d}", timeline, tds, away))
    return cases


def vector(name: str, timeline: Chunks, tds: float, away: Away) -> dict[str, Any]:
    """One case: the inputs, the watched times of its tokens and the freezes seen."""
    return {
        "name": name,
        "timeline": [[t, n] for t, n in timeline],
        "tds": tds,
        "away": [[a, b] for a, b in away],
        "watched": watched_times(token_times(timeline), away).tolist(),
        "freezes": asdict(freezes(timeline, tds, away)),
    }


def build() -> dict[str, Any]:
    cases = _hand_cases() + _random_cases(np.random.default_rng(SEED))
    return {
        "about": (
            "Reader-signal vectors generated from qos.signals and qos.metrics by "
            "scripts/make_signal_vectors.py; do not edit. constants: the channel's timing "
            "and bounds; freezes: timeline [seconds since the request, tokens], away "
            "intervals on the same clock, watched: each token's time with the time away "
            "before it taken out, freezes: what the release rule shows on watched time."
        ),
        "constants": {
            "min_interval_s": MIN_INTERVAL_S,
            "away_lease_s": AWAY_LEASE_S,
            "max_pace_tps": MAX_PACE_TPS,
            "max_buffer_tokens": MAX_BUFFER_TOKENS,
            "presences": [p.value for p in Presence],
        },
        "freezes": [vector(*case) for case in cases],
    }


def render() -> str:
    """One vector a line, so a change reads as a diff of the cases it touches."""
    data = build()
    lines = ",\n  ".join(json.dumps(v) for v in data["freezes"])
    return (
        f'{{"about": {json.dumps(data["about"])},\n'
        f' "constants": {json.dumps(data["constants"])},\n'
        f' "freezes": [\n  {lines}\n ]}}\n'
    )


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
