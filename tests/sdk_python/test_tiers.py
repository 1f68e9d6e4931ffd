"""Both SDKs pace to the gateway's default tiers when no header says otherwise.

Each SDK keeps one copy of the table: ``tokenpace_client.tiers`` is checked here against
``gateway.config``; the web SDK's ``src/tiers.ts`` is checked against
``tests/vectors/tiers.json`` (``sdk_web/test/tiers.test.ts``), which is checked here, so a
tier changed at the gateway without ``scripts/make_tier_vectors.py`` fails.
"""

from __future__ import annotations

import json

from tokenpace_client import DEFAULT_TIER, TDS_RANGE, TIERS, TTFT_RANGE

from gateway.config.schema import DEFAULT_TIERS, CustomTierLimits, TenantConfig
from tests.support.paths import VECTORS as VECTORS_DIR

VECTORS = json.loads((VECTORS_DIR / "tiers.json").read_text())
GATEWAY = {name: {"ttft": t.ttft, "tds": t.tds} for name, t in DEFAULT_TIERS.items()}
GATEWAY_DEFAULT = TenantConfig.model_fields["default_tier"].default


def test_the_python_client_paces_to_the_gateways_tiers():
    assert {name: {"ttft": t.ttft, "tds": t.tds} for name, t in TIERS.items()} == GATEWAY
    assert DEFAULT_TIER == GATEWAY_DEFAULT


def test_the_tier_vectors_the_web_sdk_reads_are_the_gateways():
    assert VECTORS["tiers"] == GATEWAY
    assert VECTORS["default"] == GATEWAY_DEFAULT


def test_the_python_client_bounds_headers_by_the_widest_range_of_a_plan():
    widest = CustomTierLimits()
    assert (widest.ttft_min, widest.ttft_max) == TTFT_RANGE
    assert (widest.tds_min, widest.tds_max) == TDS_RANGE
