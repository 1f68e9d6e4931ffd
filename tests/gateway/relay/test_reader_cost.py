"""A reader signal's work in the gateway stays within its budget, counted not timed.

The calls made on the gateway's behalf (tests/support/cost.py's ``sys.setprofile``
hook) per signal through the whole app, as bench/reader_signal_cost.py sends them (the
benchmark times them: docs/benchmarks/2026-12-06-reader-channel.md): accepted (a change
of presence, published and delivered to the stream this replica relays, and to the
embedded engine's table) and refused (429, the abusive client's), with the API key and
with the telemetry token. ``GET /healthz`` through the same app is the floor.

The budgets are the counts of the code they were set on (Python 3.11, the libraries in
constraints.txt) plus a margin of about 10 %, not targets: a signal costs 70 to 120
calls above the floor (the gate, the checks, the publish and the delivery), and a store
round trip, a task or a second parse of the body would not fit.
"""

from __future__ import annotations

import sys

from gateway.app import create_app
from gateway.config.loader import demo_config
from gateway.config.schema import DEMO_MODEL
from tests.support.cost import CallCounter
from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from reader_signal_cost import open_stream, senders

BUDGETS = {  # calls per request; measured 316, 427, 388, 436, 395 on 2026-12-06
    "floor (GET /healthz)": 350,
    "accepted/key": 470,
    "refused/key": 430,
    "accepted/token": 480,
    "refused/token": 435,
}
N = 20


async def test_calls_per_reader_signal_within_budget() -> None:
    backend = {"name": "embedded", "kind": "embedded", "models": [DEMO_MODEL]}
    config, key = demo_config(backends=[{**backend, "options": {"time_scale": 0.05}}])
    app = create_app(config)
    counts: dict[str, float] = {}
    async with app.router.lifespan_context(app):
        rid, token, stream = await open_stream(app, key)
        kinds = senders(app, key, rid, token)
        await kinds["accepted/key"](0)  # the owner looked up, once
        await kinds["accepted/key"](1)  # watching: the accepted runs start away
        for name, send in kinds.items():
            expected = {"accepted": 202, "refused": 429}.get(name.split("/")[0], 200)
            statuses = []
            with CallCounter() as counter:
                for i in range(N):
                    statuses.append(await send(i))
            assert statuses == [expected] * N, (name, statuses)
            counts[name] = counter.calls / N
        stream.cancel()
    for name, budget in BUDGETS.items():
        assert 0 < counts[name] <= budget, (name, counts)
