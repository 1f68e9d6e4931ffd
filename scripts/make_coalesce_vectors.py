"""Write the test vectors of the telemetry coalescing rule both SDKs share.

The Python client's :func:`tokenpace_client.coalesce.coalesce` and
:func:`tokenpace_client.timeline.ceil_us` are the reference (docs/protocol.md, "SDK →
gateway: QoE telemetry": a timeline longer than the point limit keeps its first entry
alone and becomes runs of consecutive entries, each at the time of its last entry;
times are written rounded up to the microsecond). The web SDK checks its copy against
``tests/vectors/coalesce.json``, and ``sdk_python/tests/test_client_telemetry.py`` checks
that the committed file is what the Python client computes today. Rewrite the file after
changing the rule:

    .venv/bin/python scripts/make_coalesce_vectors.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tokenpace_client.coalesce import coalesce
from tokenpace_client.timeline import ceil_us

OUT = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "coalesce.json"
SEED = 20260415

Timeline = list[tuple[float, int]]


def _steady(n: int) -> Timeline:
    return [(round(0.5 + i * 0.2, 6), 1) for i in range(n)]


def _hand_cases() -> list[tuple[str, Timeline, int]]:
    """Edges of the rule: at and just over the limit, the smallest limit, uneven runs."""
    counted = [(float(i + 1), i + 1) for i in range(10)]
    return [
        ("empty", [], 4),
        ("one-entry", [(0.412, 3)], 2),
        ("under-the-limit", _steady(3), 4),
        ("at-the-limit", _steady(4), 4),
        ("one-over-the-limit", _steady(5), 4),
        ("limit-2-everything-after-the-first-in-one-run", counted, 2),
        ("even-runs", counted, 4),
        ("uneven-runs", counted[:9], 4),
        ("runs-of-one-and-two", counted, 7),
        ("equal-times", [(1.0, 1)] * 6 + [(2.0, 2)] * 3, 3),
    ]


def _random_cases(rng: random.Random) -> list[tuple[str, Timeline, int]]:
    """Bursty timelines of every length against limits below and above it."""
    cases = []
    for i in range(16):
        n = rng.randint(2, 150)
        t = rng.uniform(0.0, 3.0)
        timeline = []
        for _ in range(n):
            t += rng.expovariate(5.0) + (rng.uniform(1.0, 6.0) if rng.random() < 0.03 else 0.0)
            timeline.append((round(t, 6), rng.choice([1, 1, 1, 2, 3, 8])))
        limit = rng.randint(2, n + 10)
        cases.append((f"random-{i:02d}", timeline, limit))
    return cases


def _rounding_cases(rng: random.Random) -> list[float]:
    """Seconds as a clock reads them, some already on the microsecond, some just off it."""
    hand = [0.0, 0.1, 0.412, 0.4123451, 1.0000001, 2.9999999, 0.1234565, 123.456789]
    hand += [1234.5678901, 0.000_000_4, 59.999_999_5, 3600.000_000_1]
    drawn = [rng.uniform(0.0, 10.0 ** rng.randint(0, 4)) for _ in range(60)]
    return hand + drawn


def build() -> dict[str, Any]:
    rng = random.Random(SEED)
    cases = _hand_cases() + _random_cases(rng)
    return {
        "about": (
            "Telemetry coalescing vectors generated from tokenpace_client.coalesce and "
            "tokenpace_client.timeline.ceil_us by scripts/make_coalesce_vectors.py; do not "
            "edit. coalesce: a timeline ([seconds, tokens] entries) cut to at most `limit` "
            "entries; rounding: seconds and their value rounded up to the microsecond."
        ),
        "coalesce": [
            {
                "name": name,
                "timeline": [[t, n] for t, n in timeline],
                "limit": limit,
                "coalesced": [[t, n] for t, n in coalesce(timeline, limit)],
            }
            for name, timeline, limit in cases
        ],
        "rounding": [[s, ceil_us(s)] for s in _rounding_cases(rng)],
    }


def render() -> str:
    """One vector a line, so a change reads as a diff of the cases it touches."""
    data = build()
    cases = ",\n  ".join(json.dumps(v) for v in data["coalesce"])
    rounding = ",\n  ".join(json.dumps(v) for v in data["rounding"])
    return (
        f'{{"about": {json.dumps(data["about"])},\n'
        f' "coalesce": [\n  {cases}\n ],\n'
        f' "rounding": [\n  {rounding}\n ]}}\n'
    )


def main() -> None:
    OUT.write_text(render())
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
