"""Write the admission-order test vectors both gateway stores are checked against.

:func:`gateway.store.queue.admission_order` is the reference (tenants' plans over the
backends' slots, VTC between tenants of one weight). The in-memory store calls it; the
Redis store's Lua is its atomic form. ``tests/gateway/store/test_admission_order.py``
sets each case up in both stores and compares their order, and checks that the
committed file is what this script writes. Rewrite the file after changing the rule:

    .venv/bin/python scripts/make_admission_vectors.py

Each case: the backends' caps (0: no cap), the tenants' weights, counters and holds,
the queued requests (id, tenant, TTFT deadline in seconds, all different: the stores
are set up in real time, ties in the deadline are left to the unit tests) and the order.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from gateway.store.queue import Queued, admission_order, capacity_of

OUT = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "admission.json"
SEED = 20261127
CASES = 64
TENANTS = ("ent", "free", "pro", "team")
WEIGHTS = (1.0, 2.0, 4.0)
COUNTERS = (0.0, 12.0, 12.0, 40.5)  # repeated: ties between counters


def case(rng: random.Random, equal_weights: bool) -> dict[str, Any]:
    tenants = sorted(rng.sample(TENANTS, rng.choice((1, 2, 2, 3, 3, 4))))
    weight = rng.choice(WEIGHTS)
    weights = {t: weight if equal_weights else rng.choice(WEIGHTS) for t in tenants}
    counters = {t: rng.choice(COUNTERS) for t in tenants}
    holds = {t: rng.randint(0, 3) for t in tenants}
    caps = [rng.randint(1, 4) for _ in range(rng.randint(1, 2))]
    while sum(caps) < sum(holds.values()):
        caps[0] += 1
    if rng.random() < 0.1:
        caps.append(0)  # a backend without a cap: no plans
    counts = {t: rng.randint(0, 5) for t in tenants}
    if not any(counts.values()):
        counts[tenants[0]] = 1
    deadlines = rng.sample(range(1, sum(counts.values()) + 1), sum(counts.values()))
    queued: list[list[Any]] = []
    for t in tenants:
        for _ in range(counts[t]):
            queued.append([f"r{len(queued):02d}", t, float(deadlines[len(queued)])])
    order = admission_order(
        [Queued(rid, t, d) for rid, t, d in queued], holds, weights, counters, capacity_of(caps)
    )
    return {
        "caps": caps,
        "weights": weights,
        "counters": counters,
        "holds": holds,
        "queued": queued,
        "order": order,
    }


def build() -> dict[str, Any]:
    rng = random.Random(SEED)
    return {
        "about": (
            "The gateway's admission order, generated from gateway.store.queue by "
            "scripts/make_admission_vectors.py; do not edit. caps: the model's backends' "
            "max_concurrent (0: none); holds: slots each tenant holds; queued: [id, tenant, "
            "TTFT deadline in s]; order: the queued ids in the order they are admitted."
        ),
        "cases": [case(rng, equal_weights=i % 4 == 0) for i in range(CASES)],
    }


def main() -> None:
    OUT.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
