"""A backend that ignores ``max_tokens`` cannot stream without end: the relay cuts the
stream at the request's limit (``max_tokens`` or ``max_completion_tokens``, else the
gateway's ``limits.max_tokens``, times ``n``) with an ``upstream_too_long`` error event
and ``[DONE]``, and charges what was sent. An upstream that ignored it streamed 1,185
chunks in 25 s for ``max_tokens: 5``.

Hypothesis over the limit, ``n``, the endpoint and what the upstream sends; the upstream
is the FakeUpstream stand-in for vLLM on a real loopback socket, the gateway under
uvicorn in a thread of its own.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fake_upstream import MODEL
from tests.support.gateway import KEY, backend_entry, gateway_in_thread, make_config

GATEWAY_LIMIT = 40  # limits.max_tokens here


@pytest.fixture(scope="module")
def live():
    with gateway_in_thread(
        lambda fake: make_config([backend_entry(fake, "up")], limits={"max_tokens": GATEWAY_LIMIT})
    ) as (gw, fake):
        fake.ignores_max_tokens = True
        fake.token_interval = 0.0
        yield gw, fake


def events(text: str) -> list[Any]:
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def tokens_in(event: Any) -> int:
    if not isinstance(event, dict):
        return 0
    n = 0
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        n += bool(delta.get("content")) if delta is not None else bool(choice.get("text"))
    return n


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    sent=st.integers(1, 60),
    limit=st.one_of(st.none(), st.integers(1, 40)),
    field=st.sampled_from(["max_tokens", "max_completion_tokens"]),
    n=st.integers(1, 3),
    chat=st.booleans(),
)
def test_a_stream_never_carries_more_than_the_request_allows(
    live, sent: int, limit: int | None, field: str, n: int, chat: bool
) -> None:
    gw, fake = live
    fake.n_tokens = sent  # per choice, whatever the request asked
    body: dict[str, Any] = {"model": MODEL, "stream": True, "n": n}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
        field = "max_tokens"
    if limit is not None:
        body[field] = limit
    path = "/v1/chat/completions" if chat else "/v1/completions"
    with httpx.Client(base_url=gw.url, timeout=20) as c:
        r = c.post(path, json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    got = events(r.text)
    cap = (limit or GATEWAY_LIMIT) * n
    assert sum(map(tokens_in, got)) <= cap
    assert got[-1] == "[DONE]"
    errors = [e["error"] for e in got if isinstance(e, dict) and "error" in e]
    if sent * n > cap:
        assert [e["code"] for e in errors] == ["upstream_too_long"], errors
        assert str(cap) in errors[0]["message"]
    else:
        assert errors == []
        assert sum(map(tokens_in, got)) == sent * n
