"""Telemetry on the client side: coalescing, the report, the auth header, delivery rules.

Delivery runs against httpx's MockTransport here (a stand-in that answers what the
gateway would); tests/test_sdk_python_gateway.py posts to the real gateway.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from tokenpace_client.coalesce import coalesce
from tokenpace_client.qoe import andes_qoe, monotone_qoe
from tokenpace_client.telemetry import (
    MAX_BODY_BYTES,
    MAX_POINTS,
    TOKEN_HEADER,
    Delivery,
    TelemetrySender,
    destination,
    report_body,
)
from tokenpace_client.timeline import Timeline, ceil_us

RID = "0123456789abcdef0123456789abcdef"
COALESCE_VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "tests" / "vectors" / "coalesce.json").read_text()
)


# -- coalescing -----------------------------------------------------------------------


def test_short_timelines_are_unchanged():
    timeline = [(0.1, 1), (0.2, 2)]
    assert coalesce(timeline, 2) == timeline


def test_runs_follow_the_shared_rule():
    timeline = [(float(i), 1) for i in range(11)]  # n = 11, L = 4
    # the first entry alone; the other 10 in 3 runs: [0, 3), [3, 6), [6, 10) of them
    assert coalesce(timeline, 4) == [(0.0, 1), (3.0, 3), (6.0, 3), (10.0, 4)]


def test_coalescing_keeps_tokens_and_never_flatters_the_qoe():
    timeline = [(1.0 + 0.013 * i + (2.0 if i > 500 else 0.0), 1 + i % 3) for i in range(1000)]
    for limit in (2, 3, 17, 999):
        short = coalesce(timeline, limit)
        assert len(short) == limit and short[0] == timeline[0]
        assert sum(n for _, n in short) == sum(n for _, n in timeline)
        assert [t for t, _ in short] == sorted(t for t, _ in short)
        assert monotone_qoe(short, 1.0, 4.8) <= monotone_qoe(timeline, 1.0, 4.8) + 1e-12
    with pytest.raises(ValueError, match="limit"):
        coalesce(timeline, 1)


@pytest.mark.parametrize("vec", COALESCE_VECTORS["coalesce"], ids=lambda v: v["name"])
def test_the_shared_coalescing_vectors_are_what_this_client_computes(vec):
    # tests/vectors/coalesce.json is written from this client (scripts/make_coalesce_vectors.py)
    # and the web SDK checks its copy against it: a rule changed here without rewriting
    # the file fails.
    timeline = [(t, n) for t, n in vec["timeline"]]
    assert coalesce(timeline, vec["limit"]) == [(t, n) for t, n in vec["coalesced"]]


def test_the_shared_rounding_vectors_are_what_this_client_computes():
    rounding = COALESCE_VECTORS["rounding"]
    assert len(rounding) >= 50
    assert [ceil_us(seconds) for seconds, _ in rounding] == [up for _, up in rounding]


def test_times_are_rounded_up_to_the_microsecond():
    for t in (0.1, 1.0000001, 2.9999999, 0.1234565, 123.456789):
        up = ceil_us(t)
        assert up >= t and up - t < 1e-6 and round(up, 6) == up
    assert ceil_us(0.5) == 0.5


def test_the_report_fits_the_gateway_limits():
    arrivals = tuple((1.0 + i * 1e-3 + 1e-7, 1) for i in range(50_000))
    body = report_body(RID, 1.0, 4.8, Timeline(arrivals, arrivals), "completed", "0.1.0")
    report = json.loads(body)
    assert len(body) <= MAX_BODY_BYTES
    assert 2 < len(report["arrivals"]) <= MAX_POINTS
    assert sum(n for _, n in report["arrivals"]) == 50_000
    assert report["sdk"] == {"name": "tokenpace-python", "version": "0.1.0"}
    assert set(report) == {"request_id", "expected", "arrivals", "displayed", "outcome", "sdk"}
    assert andes_qoe(report["arrivals"], 1.0, 4.8) <= andes_qoe(arrivals, 1.0, 4.8) + 1e-12
    small = json.loads(report_body(RID, 1.0, 4.8, Timeline(((0.5, 1),), ()), "aborted", "x"))
    assert small["arrivals"] == [[0.5, 1]] and small["displayed"] == []


# -- where and how it is sent -----------------------------------------------------------


def test_the_telemetry_token_is_preferred_over_the_api_key():
    url = "http://gw:8000/v1/chat/completions"
    auth = {"authorization": "Bearer tp-key"}
    assert destination(url, auth, {TOKEN_HEADER: "tok"}) == (
        "http://gw:8000/v1/tokenpace/telemetry",
        {TOKEN_HEADER: "tok"},
    )
    assert destination(url, auth, {}) == (
        "http://gw:8000/v1/tokenpace/telemetry",
        {"Authorization": "Bearer tp-key"},
    )
    assert (
        destination("http://gw/v1/completions?x=1", auth, {})[0]
        == "http://gw/v1/tokenpace/telemetry"
    )
    assert destination("http://gw/v1/embeddings", auth, {}) is None
    assert destination(url, {}, {}) is None  # no way to authenticate


def _sender(handler, **kwargs) -> TelemetrySender:
    return TelemetrySender(transport=httpx.MockTransport(handler), backoff_s=0.01, **kwargs)


def _delivery() -> Delivery:
    return Delivery("http://gw/v1/tokenpace/telemetry", {"Authorization": "Bearer k"}, b"{}", RID)


def test_server_errors_are_retried_client_errors_never():
    statuses = iter([503, 502, 200])
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["authorization"])
        return httpx.Response(next(statuses), json={"ok": True})

    sender = _sender(handler)
    assert sender.submit(_delivery())
    assert sender.flush(5.0)
    assert sender.stats["delivered"] == 1 and sender.stats["attempts"] == 3
    assert seen == ["Bearer k"] * 3

    refused = _sender(lambda r: httpx.Response(409, json={"error": {"code": "duplicate_report"}}))
    refused.submit(_delivery())
    assert refused.flush(5.0)
    assert refused.stats["rejected"] == 1 and refused.stats["attempts"] == 1
    assert refused.responses[-1][1] == 409


def test_connection_failures_are_dropped_after_the_retries():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    sender = _sender(handler, retries=2)
    started = time.monotonic()
    assert sender.submit(_delivery())
    assert time.monotonic() - started < 0.5  # submitting never waits for the network
    assert sender.flush(5.0)
    assert sender.stats["failed"] == 1 and sender.stats["attempts"] == 3


def test_the_queue_is_bounded_and_a_full_queue_drops():
    release = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        release.wait(5)
        return httpx.Response(200, json={})

    sender = _sender(handler, max_queue=2)
    results = [sender.submit(_delivery()) for _ in range(6)]
    assert results.count(False) >= 3 and sender.stats["dropped"] == results.count(False)
    release.set()
    assert sender.flush(5.0)
    assert sender.stats["delivered"] == results.count(True)


def test_close_gives_up_backing_off_within_its_bound():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500)

    sender = TelemetrySender(
        transport=httpx.MockTransport(handler), backoff_s=60.0, retries=3, exit_flush_s=2.0
    )
    sender.submit(_delivery())
    time.sleep(0.05)  # the first attempt failed: it is backing off for a minute
    started = time.monotonic()
    sender.close()
    assert time.monotonic() - started < 2.0
    assert sender.stats["failed"] == 1 and sender.stats["attempts"] == 4
