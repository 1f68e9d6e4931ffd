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
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
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
