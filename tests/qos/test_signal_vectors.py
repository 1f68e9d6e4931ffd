"""The committed reader-signal vectors are what ``qos`` gives today.

Both SDKs check their copies of the channel's constants and of the watched-time release
rule against ``tests/vectors/signals.json`` (``sdk_python/tests/test_client_signals.py``,
``sdk_web/test/signals.test.ts``); this ties that file to ``qos.signals`` and
``qos.metrics``, so a constant or a rule changed without
``scripts/make_signal_vectors.py`` fails here.
"""

from __future__ import annotations

import json

from qos.signals import AWAY_LEASE_S, MIN_INTERVAL_S
from scripts.make_signal_vectors import render
from tests.support.paths import VECTORS

COMMITTED = (VECTORS / "signals.json").read_text()


def test_the_committed_vectors_are_current():
    assert render() == COMMITTED, "run scripts/make_signal_vectors.py"


def test_the_vectors_state_the_channels_timing():
    constants = json.loads(COMMITTED)["constants"]
    assert constants["min_interval_s"] == MIN_INTERVAL_S
    assert constants["away_lease_s"] == AWAY_LEASE_S


def test_the_vectors_hold_freezes_hidden_by_an_away():
    cases = {v["name"]: v for v in json.loads(COMMITTED)["freezes"]}
    hidden = cases["away-during-a-server-stall"]["freezes"]
    seen = cases["stall-outlasts-the-away"]["freezes"]
    assert hidden["count"] == 0
    assert seen["count"] == 1 and seen["longest_s"] > 0
