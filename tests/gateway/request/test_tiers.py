"""Tier resolution (docs/protocol.md, "choosing a tier") and the tags a backend receives."""

from __future__ import annotations

import math

import pytest

from gateway.config.loader import parse_config
from gateway.config.schema import ConfigError, CustomTierLimits
from gateway.context import RequestContext, ResolvedTier
from gateway.errors import GatewayError
from gateway.relay.tagging import upstream_body
from gateway.request.tiers import plan_limits, resolve_tier
from qos.tags import TAG_KEYS

CONFIG = parse_config(
    {
        "tiers": {"gold": {"ttft": 0.2, "tds": 40, "priority": 0}},
        "tenants": [
            {"name": "pro", "api_keys": ["tp-pro-key-0001"], "allow_custom": True, "weight": 4},
            {
                "name": "basic",
                "api_keys": ["tp-basic-key-002"],
                "tiers": ["chat", "batch"],
                "default_tier": "batch",
            },
            {
                "name": "reader",
                "api_keys": ["tp-reader-key-03"],
                "tiers": ["chat", "voice"],
                "allow_custom": True,
            },
            {
                "name": "lab",
                "api_keys": ["tp-lab-key-00004"],
                "tiers": ["chat"],
                "allow_custom": True,
                "custom_tier_limits": {"ttft_min": 0.0, "tds_max": 1000.0},
            },
        ],
    }
)
PRO, BASIC, READER, LAB = CONFIG.tenants


def err(fn, *args) -> GatewayError:
    with pytest.raises(GatewayError) as exc:
        fn(*args)
    return exc.value


def test_default_tier():
    assert resolve_tier(CONFIG, PRO, None, None) == ResolvedTier("chat", 1.0, 4.8, 1)
    assert resolve_tier(CONFIG, BASIC, None, None) == ResolvedTier("batch", 60.0, 50.0, 2)


def test_header_body_and_operator_tiers():
    assert resolve_tier(CONFIG, PRO, "voice", None).name == "voice"
    assert resolve_tier(CONFIG, PRO, " fast ", None).tds == 25.0
    assert resolve_tier(CONFIG, PRO, None, {"tier": "gold"}) == ResolvedTier("gold", 0.2, 40.0, 0)
    assert resolve_tier(CONFIG, PRO, "voice", {"tier": "voice"}).name == "voice"  # agreeing


def test_custom_numbers():
    t = resolve_tier(CONFIG, PRO, None, {"ttft": 0.8, "tds": 6})
    assert t == ResolvedTier("custom", 0.8, 6.0, 1)
    # one number given: the other comes from the named (or default) tier
    t = resolve_tier(CONFIG, PRO, "voice", {"tds": 2.5})
    assert (t.name, t.ttft, t.tds) == ("custom", 1.0, 2.5)
    assert resolve_tier(CONFIG, PRO, None, {"ttft": 0.2}).ttft == 0.2  # gold's, the shortest


def test_custom_numbers_stay_within_the_plan():
    """A plan without limits of its own spans its tiers: chat and voice (TTFT 1 s, TDS up
    to 4.8) may ask for a slower reader, not for TTFT 0 or TDS 1000."""
    assert plan_limits(CONFIG, READER) == CustomTierLimits(
        ttft_min=1.0, ttft_max=600.0, tds_min=0.1, tds_max=4.8
    )
    assert resolve_tier(CONFIG, READER, None, {"ttft": 2.0, "tds": 3.0}).tds == 3.0
    for options, param in (({"ttft": 0}, "tokenpace.ttft"), ({"tds": 1000}, "tokenpace.tds")):
        e = err(resolve_tier, CONFIG, READER, None, options)
        assert (e.status, e.param) == (400, param)
        assert "your plan's range" in e.message
    # a plan with its own range gets it, whatever its tiers
    assert resolve_tier(CONFIG, LAB, None, {"ttft": 0, "tds": 1000}).tds == 1000.0


def test_the_global_custom_tier_limits_key_is_refused_naming_it():
    with pytest.raises(ConfigError) as exc:
        parse_config(
            {"tenants": [{"name": "a", "api_keys": ["tp-a-key-0001"]}], "custom_tier_limits": {}}
        )
    (problem,) = exc.value.problems
    assert problem.startswith("custom_tier_limits: ")
    assert "tenants[].custom_tier_limits" in problem


@pytest.mark.parametrize(
    ("tenant", "header", "options", "status", "param"),
    [
        (PRO, "platinum", None, 400, "X-TokenPace-Tier"),
        (PRO, None, {"tier": "platinum"}, 400, "tokenpace.tier"),
        (PRO, "", None, 400, "X-TokenPace-Tier"),
        (PRO, "chat", {"tier": "voice"}, 400, "tokenpace.tier"),
        (PRO, None, {"tier": 3}, 400, "tokenpace.tier"),
        (PRO, None, {"speed": 3}, 400, "tokenpace.speed"),
        (PRO, None, {"ttft": -0.1}, 400, "tokenpace.ttft"),
        (PRO, None, {"ttft": 601}, 400, "tokenpace.ttft"),
        (PRO, None, {"ttft": 0.1}, 400, "tokenpace.ttft"),  # below gold's, the plan's shortest
        (PRO, None, {"tds": 51}, 400, "tokenpace.tds"),  # past batch's, the plan's fastest
        (PRO, None, {"ttft": math.inf}, 400, "tokenpace.ttft"),
        (PRO, None, {"ttft": True}, 400, "tokenpace.ttft"),
        (PRO, None, {"tds": 0}, 400, "tokenpace.tds"),
        (PRO, None, {"tds": math.nan}, 400, "tokenpace.tds"),
        (PRO, None, {"tds": "4"}, 400, "tokenpace.tds"),
        (PRO, None, "voice", 400, "tokenpace"),
        (BASIC, "voice", None, 403, "X-TokenPace-Tier"),
        (BASIC, None, {"tier": "fast"}, 403, "tokenpace.tier"),
        (BASIC, None, {"ttft": 1, "tds": 5}, 403, "tokenpace.ttft"),
        (BASIC, None, {"tier": "nope", "ttft": 1}, 400, "tokenpace.tier"),  # 400 before 403
        (BASIC, None, {"ttft": -1}, 400, "tokenpace.ttft"),  # malformed before the plan
        (BASIC, None, {"ttft": 601}, 403, "tokenpace.ttft"),  # the plan before its range
    ],
)
def test_rejections(tenant, header, options, status, param):
    e = err(resolve_tier, CONFIG, tenant, header, options)
    assert (e.status, e.param) == (status, param)
    assert set(e.body["error"]) == {"message", "type", "param", "code"}


def test_response_headers():
    headers = ResolvedTier("voice", 1.0, 3.3, 1).headers()
    assert headers == {
        "X-TokenPace-Tier": "voice",
        "X-TokenPace-TTFT": "1.0",
        "X-TokenPace-TDS": "3.3",
    }


class _B:
    def __init__(self, tokenpace: bool, priority: bool) -> None:
        self.tokenpace, self.supports_priority = tokenpace, priority


CTX = RequestContext(
    request_id="rid-1",
    tenant="pro",
    weight=4.0,
    tier=ResolvedTier("voice", 1.0, 3.3, 1),
    endpoint="chat.completions",
    model="m",
    stream=True,
    received_at=0.0,
    expected_tokens=10,
)
RAW = {
    "model": "m",
    "messages": [{"role": "user", "content": "x"}],
    "tokenpace": {"tier": "voice"},
    "priority": -50,
    "vllm_xargs": {"tp_tier": "fast", "tp_weight": 100, "mine": "yes"},
    "top_k": 5,
}


def test_tokenpace_backend_gets_tags():
    body = upstream_body(RAW, CTX, _B(tokenpace=True, priority=False))
    assert "tokenpace" not in body and "priority" not in body
    assert body["vllm_xargs"] == {
        "mine": "yes",
        "tp_tier": "voice",
        "tp_ttft": 1.0,
        "tp_tds": 3.3,
        "tp_tenant": "pro",
        "tp_weight": 4.0,
        "tp_request_id": "rid-1",
    }
    assert set(TAG_KEYS) <= set(body["vllm_xargs"])
    assert body["top_k"] == 5 and body["messages"] == RAW["messages"]
    assert RAW["vllm_xargs"]["tp_tier"] == "fast"  # the client's dict is not mutated


def test_priority_only_where_supported():
    body = upstream_body(RAW, CTX, _B(tokenpace=True, priority=True))
    assert body["priority"] == 1
    body = upstream_body(
        RAW, CTX, _B(tokenpace=False, priority=True)
    )  # stock vLLM, priority policy
    assert body["priority"] == 1 and body["vllm_xargs"] == {"mine": "yes"}


def test_plain_backend_gets_no_tags():
    body = upstream_body(RAW, CTX, _B(tokenpace=False, priority=False))
    assert "tokenpace" not in body and "priority" not in body
    assert body["vllm_xargs"] == {"mine": "yes"}  # the client's own keys stay, tp_* go
    only_tags = {**RAW, "vllm_xargs": {"tp_tier": "fast"}}
    assert "vllm_xargs" not in upstream_body(only_tags, CTX, _B(False, False))
    plain = {"model": "m", "messages": []}
    assert upstream_body(plain, CTX, _B(False, False)) == plain
