"""The committed QoE test vectors (tests/vectors/qoe.json) are what ``qos`` computes.

The client SDKs check their own copies of the formulas against the same file
(``sdk_python/tests``, ``sdk_web/test``); this test ties the file to ``qos.metrics`` and
``qos.timeline``, so a formula changed here without regenerating the vectors
(``scripts/make_qoe_vectors.py``) fails.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from qos.metrics import andes_qoe, freezes, monotone_qoe, user_idle_latency
from qos.timeline import digestion_starts, token_times
from tests.support.paths import VECTORS

VECTORS = json.loads((VECTORS / "qoe.json").read_text())["vectors"]


def test_the_vectors_cover_the_cases_that_matter():
    names = {v["name"] for v in VECTORS}
    assert {"andes-fig5a-perfect", "andes-fig5d-pause", "lateness-last-token-held"} <= names
    assert len(names) == len(VECTORS) >= 30
    assert any(n > 1 for v in VECTORS for _, n in v["timeline"]), "multi-token chunks"
    assert {v["tds"] for v in VECTORS} >= {4.8, 3.3, 25.0}


@pytest.mark.parametrize("vec", VECTORS, ids=lambda v: v["name"])
def test_vector_matches_qos(vec):
    timeline = [tuple(p) for p in vec["timeline"]]
    ttft, tds = vec["ttft"], vec["tds"]
    assert andes_qoe(timeline, ttft, tds) == pytest.approx(vec["andes"], rel=1e-12, abs=1e-12)
    assert monotone_qoe(timeline, ttft, tds) == pytest.approx(vec["monotone"], rel=1e-12)
    starts = digestion_starts(token_times(timeline), tds)
    np.testing.assert_allclose(starts, vec["digestion"], rtol=1e-12, atol=1e-12)
    got = freezes(timeline, tds)
    assert got.count == vec["freezes"]["count"]
    assert got.longest_s == pytest.approx(vec["freezes"]["longest_s"], rel=1e-12, abs=1e-12)
    assert got.total_s == pytest.approx(vec["freezes"]["total_s"], rel=1e-12, abs=1e-12)
    assert user_idle_latency(timeline, ttft, tds) == pytest.approx(vec["idle"], rel=1e-12)


def test_the_vectors_cover_freezes():
    counts = [v["freezes"]["count"] for v in VECTORS]
    assert 0 in counts and any(c > 1 for c in counts)
    assert max(v["freezes"]["longest_s"] for v in VECTORS) > 10.0
