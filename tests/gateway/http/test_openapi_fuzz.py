"""Fuzzing: schemathesis against the gateway's own OpenAPI document.

Every operation of the document (the OpenAI routes, telemetry, the QoE summary, the admin
routes, the ops routes) gets :data:`EXAMPLES` generated requests, valid and invalid,
sent to a real gateway on a loopback port (uvicorn, as ``tokenpace serve`` runs it, in
front of the FakeUpstream stand-in for vLLM). Checks on every response:

- no 5xx;
- the status is one the document lists for the route, the content type and the body
  match its schema, the documented headers are there;
- every error the gateway writes is OpenAI-shaped: ``{"error": {"message", "type",
  "param", "code"}}`` with a non-empty message.

The number of examples bounds the time (about 20 s on a 2-core machine, for some 2,000
requests); Hypothesis runs derandomized, so a failure reproduces.

Nesting depth gets a strategy of its own, on every route that reads a body (a beacon's
report without a credential included): up to 5,000 levels of arrays and objects, with
brackets inside strings, is never a 5xx, and past 254 levels is 400 ``invalid_json``.

QoE reports get a strategy of their own: timelines of extreme floats (subnormal, huge,
past a day, NaN and infinities written raw into the JSON) and counts (zero, negative,
past 64 bits), each reported on a request of its own to a gateway on Redis: each is
stored with finite numbers or is a 400 naming the field, and the summaries stay finite.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.telemetry.reports import MAX_TIMELINE_S
from tests.support.fake_upstream import MODEL
from tests.support.gateway import KEY, backend_entry, gateway_in_thread, make_config

ADMIN = "admin-key-0000001"
EXAMPLES = 100


def config(url: str) -> Any:
    fake_url = {"name": "up", "url": f"{url}/v1", "models": ["fake-model"]}
    entry = {**fake_url, "health_path": "/health"}
    return make_config([entry], admin={"key": ADMIN})


# The document as the gateway serves it (it depends on the configuration's tiers and
# limits, not on where the backend is).
schema = schemathesis.openapi.from_dict(create_app(config("http://127.0.0.1:9")).openapi())


@pytest.fixture(scope="module")
def live():
    with gateway_in_thread(
        lambda fake: make_config([backend_entry(fake, "up")], admin={"key": ADMIN})
    ) as (gw, _):
        yield gw


def readiness_probe_says_not_ready(case: Any, response: Any) -> bool:
    """``/readyz``'s documented 503: a readiness state (its ``Health`` body is checked
    against the document), not a server error. On a loaded machine a fuzzed stream can
    lose its upstream connection mid-way (a ReadError), which marks the one backend down
    until the next health check."""
    return case.path == "/readyz" and response.status_code == 503


@schemathesis.check
def openai_shaped_errors(ctx: Any, response: Any, case: Any) -> bool | None:
    """An error status carries OpenAI's error body."""
    if response.status_code < 400 or readiness_probe_says_not_ready(case, response):
        return None
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    return True


def not_a_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    if readiness_probe_says_not_ready(case, response):
        return None
    assert response.status_code < 500, (response.status_code, response.text[:500])
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    openai_shaped_errors,
]


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_holds_its_document(case, live) -> None:
    key = ADMIN if "/admin/" in case.path else KEY
    tenant = (case.path_parameters or {}).get("tenant")
    if isinstance(tenant, str) and len(tenant) % 2:  # half the time, a tenant that exists
        case.path_parameters["tenant"] = "basic"
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL  # past the model check, to the backend and back
    # the valid key (a generated one only ever meets the 401 that other tests cover)
    headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}
    case.call_and_validate(base_url=live.url, headers=headers, checks=CHECKS, timeout=10)


# -- Nesting depth: every route that reads a body, with and without a credential ----------

BODY_ROUTES = [
    ("/v1/chat/completions", KEY),
    ("/v1/completions", KEY),
    ("/v1/tokenpace/telemetry", KEY),
    ("/v1/tokenpace/telemetry", None),  # a beacon's: read before anyone is known
    ("/v1/tokenpace/admin/tenants/acme/keys", ADMIN),
]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(
    route=st.sampled_from(BODY_ROUTES),
    levels=st.one_of(st.integers(1, 300), st.sampled_from([254, 255, 1000, 5_000])),
    opener=st.sampled_from(["[", '{"k": ', '[{"k": ']),
    in_string=st.sampled_from(["", "[[[", "}}]]", '\\"[']),
)
def test_nesting_at_any_depth_is_never_a_server_error(
    live, route, levels, opener, in_string
) -> None:
    """Deep nesting in a body: deeper than the parsers follow (254 levels) is a 400
    ``invalid_json`` on every route, found before parsing; brackets in strings don't count."""
    path, key = route
    closer = {"[": "]", '{"k": ': "}", '[{"k": ': "}]"}[opener]
    per_level = opener.count("[") + opener.count("{")
    value = opener * levels + f'"{in_string}"' + closer * levels
    fields = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    body = json.dumps(fields)[:-1] + f', "deep": {value}}}'
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=live.url, timeout=10) as c:
        r = c.post(path, content=body, headers=headers)
    assert r.status_code < 500, r.text
    error = r.json().get("error") if r.status_code >= 400 else None
    too_deep = 1 + levels * per_level > 254
    assert (error is not None and error["code"] == "invalid_json") == too_deep, r.text


# -- QoE reports: timelines of extreme numbers -------------------------------------------

EXTREME_TIMES = st.one_of(
    st.floats(min_value=0, max_value=MAX_TIMELINE_S * 2),
    st.sampled_from(
        [0.0, -0.0, 5e-324, 1e-300, 1e-9, MAX_TIMELINE_S, 86400.000001, 1e307, 1.7e308]
    ),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "-1"]),  # raw JSON
)
EXTREME_COUNTS = st.one_of(
    st.integers(min_value=-3, max_value=5),
    st.integers(min_value=1, max_value=4096 * 4),  # up to the limit (max_tokens · max_n)
    st.sampled_from([0, 4096 * 4 + 1, 2**31, 2**53 + 1, 2**63, 10**18, 10**40]),
)


@st.composite
def timelines(draw: st.DrawFn) -> list[tuple[object, int]]:
    """Entries of extreme times and counts; in time order more often than not, as real
    timelines are (an unordered one is refused before any arithmetic)."""
    entries = draw(st.lists(st.tuples(EXTREME_TIMES, EXTREME_COUNTS), max_size=6))
    if draw(st.integers(0, 3)):
        entries.sort(key=lambda e: e[0] if isinstance(e[0], float) else 0.0)
    return entries


TIMELINES = timelines()


def number(x: object) -> str:
    return x if isinstance(x, str) else repr(x)


def timeline_json(timeline: list[tuple[object, int]]) -> str:
    return "[" + ",".join(f"[{number(t)},{n}]" for t, n in timeline) + "]"


@pytest.fixture(scope="module")
def live_redis(redis_server):
    store = {"redis_url": redis_server.url, "key_prefix": "tp-fuzz-" + uuid.uuid4().hex[:8]}
    with gateway_in_thread(
        lambda fake: make_config([backend_entry(fake, "up")], admin={"key": ADMIN}, store=store)
    ) as (gw, _):
        yield gw


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(arrivals=TIMELINES, displayed=TIMELINES, ttft=EXTREME_TIMES, tds=EXTREME_TIMES)
def test_reports_of_extreme_timelines_are_stored_or_refused_naming_the_field(
    live_redis, arrivals, displayed, ttft, tds
) -> None:
    """Every timeline of extreme floats and counts is stored with finite numbers, or is a
    400 naming the field; the Redis store's scripts see every one that passes."""
    headers = {"Authorization": f"Bearer {KEY}"}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(base_url=live_redis.url, headers=headers, timeout=10) as c:
        rid = c.post("/v1/chat/completions", json=chat).headers["x-request-id"]
        body = (
            f'{{"request_id": "{rid}", "expected": {{"ttft": {number(ttft)}, "tds": '
            f'{number(tds)}}}, "arrivals": {timeline_json(arrivals)}, "displayed": '
            f'{timeline_json(displayed)}, "outcome": "completed"}}'
        )
        r = c.post(
            "/v1/tokenpace/telemetry", content=body, headers={"Content-Type": "application/json"}
        )
    assert r.status_code in (200, 400), r.text
    answer = json.loads(r.text, parse_constant=refuse_constant)
    if r.status_code == 400:
        assert answer["error"]["param"] or answer["error"]["code"] == "invalid_json", answer
    else:
        assert all(v is None or math.isfinite(v) for v in answer["qoe"].values()), answer


def test_after_the_extreme_reports_every_summary_is_finite(live_redis) -> None:
    """Whatever the reports above were, the summaries hold only finite numbers."""
    with httpx.Client(base_url=live_redis.url, timeout=10) as c:
        time.sleep(1.1)  # past the summaries' one-second reuse
        qoe = c.get("/v1/tokenpace/qoe", headers={"Authorization": f"Bearer {ADMIN}"})
        assert qoe.status_code == 200
        summary = json.loads(qoe.text, parse_constant=refuse_constant)
        assert summary["tenants"]["acme"]["tiers"]["chat"]["client"]["count"] >= 1
        scrape = c.get("/metrics").text
        assert "NaN" not in scrape and "Inf" not in scrape.replace('le="+Inf"', "")


def refuse_constant(name: str) -> object:
    raise AssertionError(f"{name} in a JSON answer")
