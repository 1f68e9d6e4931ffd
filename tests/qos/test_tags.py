"""The ``tp_*`` tag contract (docs/protocol.md, "Gateway → engine"): what the gateway
writes into ``vllm_xargs`` is what the vLLM plugin reads back (:mod:`qos.tags`)."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.context import RequestContext, ResolvedTier
from gateway.relay.tagging import upstream_body
from qos.tags import TAG_KEYS, TAG_PREFIX, RequestTags, decode_tags, encode_tags

DEFAULTS = RequestTags(tier="chat", ttft=1.0, tds=4.8)

names = st.text(min_size=1, max_size=40)
positive = st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False)
tags_st = st.builds(
    RequestTags,
    tier=names,
    ttft=st.one_of(st.just(0.0), positive),
    tds=positive,
    tenant=names,
    weight=positive,
    request_id=st.one_of(st.none(), st.text(max_size=64)),
)


@given(tags_st)
def test_decode_inverts_encode(tags: RequestTags) -> None:
    assert decode_tags(encode_tags(tags), DEFAULTS) == (tags, [])


@given(tags_st)
def test_tags_survive_the_json_wire(tags: RequestTags) -> None:
    """The body reaches vLLM as JSON (orjson in the gateway, the stdlib parser in vLLM)."""
    wire = json.loads(orjson.dumps({"vllm_xargs": encode_tags(tags)}))
    assert decode_tags(wire["vllm_xargs"], DEFAULTS) == (tags, [])


def test_every_tag_is_a_field_with_the_prefix() -> None:
    full = encode_tags(RequestTags(request_id="rid"))
    assert tuple(full) == TAG_KEYS
    assert all(key.startswith(TAG_PREFIX) for key in TAG_KEYS)
    assert {key.removeprefix(TAG_PREFIX) for key in TAG_KEYS} == set(_fields(DEFAULTS))
    assert "tp_request_id" not in encode_tags(RequestTags())


def test_what_the_gateway_sends_is_what_the_plugin_reads() -> None:
    ctx = RequestContext(
        request_id="ab" * 16,
        tenant="acme",
        weight=2.0,
        tier=ResolvedTier("voice", 0.8, 3.3, 1),
        endpoint="chat.completions",
        model="m",
        stream=True,
        received_at=0.0,
        expected_tokens=10,
    )

    class TokenpaceBackend:
        tokenpace, supports_priority = True, False

    raw = {"model": "m", "vllm_xargs": {"tp_weight": 100, "other": 1}}
    body = upstream_body(raw, ctx, TokenpaceBackend())
    tags, problems = decode_tags(json.loads(orjson.dumps(body))["vllm_xargs"], DEFAULTS)
    assert problems == []
    assert tags == RequestTags("voice", 0.8, 3.3, "acme", 2.0, "ab" * 16)


def test_gateway_tags_are_read() -> None:
    tags, problems = decode_tags(
        {
            "tp_tier": "voice",
            "tp_ttft": 0.8,
            "tp_tds": 3.3,
            "tp_tenant": "acme",
            "tp_weight": 2,
            "tp_request_id": "ab" * 16,
            "other": "kept for other extensions",
        },
        DEFAULTS,
    )
    assert problems == []
    assert tags == RequestTags("voice", 0.8, 3.3, "acme", 2.0, "ab" * 16)


def test_missing_tags_take_the_defaults() -> None:
    assert decode_tags(None, DEFAULTS) == (DEFAULTS, [])
    assert decode_tags({}, DEFAULTS) == (DEFAULTS, [])
    tags, _ = decode_tags({"tp_tds": 10}, DEFAULTS)
    assert (tags.tier, tags.ttft, tags.tds, tags.tenant) == ("chat", 1.0, 10.0, "default")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tp_tds", 0),
        ("tp_tds", -1.0),
        ("tp_tds", float("inf")),
        ("tp_ttft", -0.5),
        ("tp_ttft", float("nan")),
        ("tp_ttft", "1.0"),
        ("tp_weight", True),
        ("tp_weight", 0),
        ("tp_tenant", ""),
        ("tp_tier", 3),
        ("tp_request_id", None),
    ],
)
def test_malformed_tags_fall_back_and_are_reported(key: str, value: object) -> None:
    tags, problems = decode_tags({key: value, "tp_tenant_ok": 1}, DEFAULTS)
    assert tags == DEFAULTS
    assert len(problems) == 1 and key in problems[0] and "using the default" in problems[0]


def _fields(tags: RequestTags) -> dict[str, object]:
    return {name: getattr(tags, name) for name in RequestTags.__dataclass_fields__}
