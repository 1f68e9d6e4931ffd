"""tokenpace-client, sync: the real gateway on its embedded SIMULATED engine, in a thread.

The gateway (gateway.app on uvicorn) runs in a thread of its own (tests/support/sdk_python.py);
the engine is qos.sim under Andes (no model runs). Timing assertions are release times
against the ideal schedule computed from the measured arrivals, with tolerances that hold
on a loaded 2-core machine; the exact schedule is tested on a manual clock in
sdk_python/tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import tokenpace_client as tp
from tokenpace_client.qoe import digestion_starts, token_times
from tokenpace_client.telemetry import TOKEN_HEADER

from gateway.config.schema import DEMO_MODEL
from tests.support.gateway import KEY
from tests.support.sdk_python import (
    HELLO,
    SLOW,
    RecordingTransport,
    embedded_config,
    gateway_thread,
    sequences,
    wait_until,
)

ADMIN = "tp-test-admin-key-0001"


@pytest.fixture(scope="module")
def gw():
    with gateway_thread(embedded_config(admin={"key": ADMIN})) as (gateway, _runner):
        yield gateway


def _text(chunks) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _lateness(stream: tp.PacedStream) -> list[float]:
    """Per token: displayed time minus the ideal release time (digestion of the arrivals)."""
    ideal = digestion_starts(token_times(stream.timeline.arrivals), stream.tds)
    shown = token_times(stream.timeline.displayed)
    return [s - i for s, i in zip(shown, ideal, strict=True)]


def test_server_ahead_is_released_at_the_tier_speed_in_real_time(gw):
    client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, tier="fast")
    with client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=25, stream=True
    ) as stream:
        chunks = list(stream)
    assert isinstance(chunks[1], openai.types.chat.ChatCompletionChunk)
    assert (stream.tier, stream.ttft, stream.tds) == ("fast", 0.5, 25.0)
    assert len(stream.request_id) == 32 and stream.outcome == "completed"
    arrivals, shown = stream.timeline.arrivals, stream.timeline.displayed
    assert sum(n for _, n in arrivals) == sum(n for _, n in shown) == 25
    # the engine (~5 ms a token) is far ahead of 25 tokens/s: the burst is paced, not dumped
    assert arrivals[-1][0] - arrivals[0][0] < 0.5 * 24 / 25
    late = _lateness(stream)
    assert min(late) >= -1e-6  # never before its time
    assert late[0] < 0.05  # the first token goes out as it arrives
    assert sorted(late)[len(late) // 2] < 0.02 and max(late) < 0.25
    assert shown[-1][0] - shown[0][0] == pytest.approx(24 / 25, abs=0.25)


def test_a_server_slower_than_the_tier_adds_no_delay(gw):
    client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(model=SLOW, messages=HELLO, max_tokens=4, stream=True)
    assert _text(stream)
    assert stream.tier == "chat" and stream.tds == 4.8
    arrived = token_times(stream.timeline.arrivals)
    shown = token_times(stream.timeline.displayed)
    slow = [k for k in range(1, 4) if arrived[k] - arrived[k - 1] >= 1 / 4.8]
    assert len(slow) >= 2, arrived  # the engine is mostly slower than the reader
    for k in [0, *slow]:  # those tokens go out as they arrive
        assert 0 <= shown[k] - arrived[k] < 0.05, (k, arrived, shown)


def test_close_makes_the_gateway_see_the_disconnect_within_100_ms(gw):
    client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=4000, stream=True
    )
    for _ in zip(range(3), stream, strict=False):
        pass
    assert sequences(gw) == 1  # still being generated (about 20 s of it)
    started = time.monotonic()
    stream.close()
    assert wait_until(lambda: sequences(gw) == 0, 1.0) < 1.0  # the engine aborted it
    gone = time.monotonic() - started  # close() and the wait after it, counted once
    assert gone < 0.1, gone  # ~2-10 ms here with the load average near 3
    assert stream.outcome == "aborted"


def test_leaving_with_and_breaking_out_close_the_upstream(gw):
    client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    with client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=4000, stream=True
    ) as stream:
        for _ in stream:
            break
        started = time.monotonic()
    assert wait_until(lambda: sequences(gw) == 0, 1.0) < 1.0
    assert time.monotonic() - started < 0.1  # leaving the block and the wait, counted once
    # breaking out of a paced stream nothing else holds drops it: the upstream is closed
    raw = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    upstream = raw.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=4000, stream=True
    )
    for _ in tp.pace(upstream, telemetry=False):
        break
    assert wait_until(lambda: sequences(gw) == 0, 1.0) < 0.1
    assert wait_until(lambda: upstream.response.is_closed, 1.0) < 1.0  # by the reader thread


def test_openai_stream_and_raw_response_wrap_unchanged(gw):
    raw = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    args = {"model": DEMO_MODEL, "messages": HELLO, "max_tokens": 8, "stream": True}
    plain = list(raw.chat.completions.create(**args))
    paced = list(tp.pace(raw.chat.completions.create(**args), tds=1000.0, telemetry=False))
    assert all(isinstance(c, openai.types.chat.ChatCompletionChunk) for c in paced)
    same = {"exclude": {"id", "created"}}  # the same prompt gets the same chunks
    assert [c.model_dump(**same) for c in paced] == [c.model_dump(**same) for c in plain]
    response = raw.chat.completions.with_raw_response.create(
        **args, extra_headers={"X-TokenPace-Tier": "voice"}
    )
    stream = tp.pace(response, telemetry=False, end="flush")
    assert _text(stream) == _text(plain)
    assert (stream.tier, stream.tds, stream.request_id) == (
        "voice",
        3.3,
        response.headers["x-request-id"],
    )
    # through the drop-in client, with_raw_response is openai's own
    client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    untouched = client.chat.completions.with_raw_response.create(**args)
    assert isinstance(untouched.parse(), openai.Stream)
    untouched.parse().close()


def test_tier_default_per_call_body_and_header(gw):
    client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, tier="voice")
    args = {"model": DEMO_MODEL, "messages": HELLO, "max_tokens": 2}
    assert client.chat.completions.with_raw_response.create(**args).headers["x-tokenpace-tier"] == (
        "voice"
    )
    per_call = client.chat.completions.create(
        **args, stream=True, extra_body={"tokenpace": {"tier": "fast"}}
    )
    list(per_call)
    header = client.chat.completions.create(
        **args, stream=True, extra_headers={"X-TokenPace-Tier": "batch"}
    )
    list(header)
    assert (per_call.tier, header.tier) == ("fast", "batch")
    copied = client.with_options(timeout=5.0)
    assert copied.tier == "voice"
    with pytest.raises(ValueError, match=r"^unit:"):
        tp.OpenAI(base_url=gw.base_url, api_key=KEY, unit="paragraph")


def test_telemetry_reaches_the_gateway_with_the_same_qoe(gw):
    sender = tp.TelemetrySender()
    client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, telemetry=sender)
    stream = client.chat.completions.create(model=SLOW, messages=HELLO, max_tokens=4, stream=True)
    list(stream)
    assert sender.flush(5.0) and sender.stats["delivered"] == 1
    (request_id, status, answer), *_ = sender.responses
    assert (request_id, status) == (stream.request_id, 200)
    assert answer["tier"] == stream.tier == "chat"
    gateway_qoe = answer["qoe"]
    assert stream.qoe.monotone < 1.0  # the slow engine falls behind the reader: a real score
    for name in ("andes", "monotone", "displayed_andes", "displayed_monotone"):
        assert gateway_qoe[name] == pytest.approx(getattr(stream.qoe, name), rel=1e-9), name
    summary = httpx.get(
        f"{gw.base_url}/tokenpace/qoe", headers={"Authorization": f"Bearer {KEY}"}
    ).json()
    client_side = summary["tenants"]["acme"]["tiers"]["chat"]["client"]
    assert client_side["count"] >= 1


def test_the_report_is_authenticated_by_the_telemetry_token_not_the_key(gw):
    admin = {"Authorization": f"Bearer {ADMIN}"}
    keys = f"{gw.base_url}/tokenpace/admin/tenants/acme/keys"
    made = httpx.post(keys, headers=admin)
    assert made.status_code == 201, made.text
    key, key_id = made.json()["key"], made.json()["id"]
    transport = RecordingTransport()
    sender = tp.TelemetrySender(transport=transport)
    client = tp.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, telemetry=sender)
    stream = client.chat.completions.create(model=SLOW, messages=HELLO, max_tokens=4, stream=True)
    token = stream.response.headers[TOKEN_HEADER]
    first = next(stream)
    # the key is revoked while the reply is shown: the client holds no usable key
    assert httpx.delete(f"{keys}/{key_id}", headers=admin).status_code == 200
    refused = httpx.get(f"{gw.base_url}/tokenpace/qoe", headers={"Authorization": f"Bearer {key}"})
    assert refused.status_code == 401
    rest = list(stream)
    assert _text([first, *rest]) and stream.outcome == "completed"
    assert sender.flush(5.0) and sender.stats["delivered"] == 1, dict(sender.stats)
    (sent,) = transport.requests
    assert sent.url == f"{gw.base_url}/tokenpace/telemetry"
    assert sent.headers[TOKEN_HEADER] == token and "authorization" not in sent.headers
    assert json.loads(sent.content)["request_id"] == stream.request_id
    (request_id, status, answer), *_ = sender.responses
    assert (request_id, status) == (stream.request_id, 200)
    assert stream.qoe.monotone < 1.0  # the slow engine falls behind the reader: a real score
    for name in ("andes", "monotone", "displayed_andes", "displayed_monotone"):
        assert answer["qoe"][name] == pytest.approx(getattr(stream.qoe, name), rel=1e-9), name
    again = httpx.post(sent.url, content=sent.content, headers={TOKEN_HEADER: token})
    assert again.status_code == 403, again.text  # single use: the report above was stored
    assert again.json()["error"]["code"] == "telemetry_token_used"


def test_an_aborted_stream_is_reported_as_aborted(gw):
    sender = tp.TelemetrySender()
    client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, telemetry=sender)
    with client.chat.completions.create(
        model=DEMO_MODEL, messages=HELLO, max_tokens=4000, stream=True
    ) as stream:
        for _ in zip(range(4), stream, strict=False):
            pass
    assert sender.flush(5.0) and sender.stats["delivered"] == 1
    assert sender.responses[-1][2]["request_id"] == stream.request_id
    assert stream.outcome == "aborted" and len(stream.timeline.displayed) >= 3


def test_with_the_gateway_down_telemetry_is_dropped_and_the_caller_unaffected():
    sender = tp.TelemetrySender(retries=2, backoff_s=0.3)
    with gateway_thread() as (gw, runner):
        client = tp.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, telemetry=sender)
        stream = client.chat.completions.create(
            model=DEMO_MODEL, messages=HELLO, max_tokens=6, stream=True
        )
        chunks = []
        for chunk in stream:
            chunks.append(chunk)
            if chunk.choices and chunk.choices[0].finish_reason:
                break  # the whole reply has arrived (the engine is far ahead of 4.8 tokens/s)
        runner.stop()
    started = time.monotonic()
    rest = list(stream)  # the stream ends now; its report goes to a gateway that is gone
    ended_in = time.monotonic() - started
    assert rest == [] or all(not c.choices for c in rest)
    assert stream.outcome == "completed" and ended_in < 0.2
    assert sender.flush(10.0)
    assert sender.stats["failed"] == 1 and sender.stats["attempts"] == 3
    assert sender.stats["delivered"] == 0


def test_reports_queued_at_exit_are_flushed(gw, tmp_path: Path):
    script = tmp_path / "client.py"
    script.write_text(
        "import sys, tokenpace_client as tp\n"
        "c = tp.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)\n"
        "s = c.chat.completions.create(model=sys.argv[3], max_tokens=3, stream=True,\n"
        "    messages=[{'role': 'user', 'content': 'exit'}],\n"
        "    extra_body={'tokenpace': {'tds': 500}})\n"
        "print(''.join(x.choices[0].delta.content or '' for x in s if x.choices))\n"
        "print(s.request_id)\n"  # and exit at once: the report is still queued
    )
    out = subprocess.run(
        [sys.executable, str(script), gw.base_url, KEY, DEMO_MODEL],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONPATH": ""},
        check=True,
    )
    request_id = out.stdout.split()[-1]
    again = httpx.post(
        f"{gw.base_url}/tokenpace/telemetry",
        headers={"Authorization": f"Bearer {KEY}"},
        content=json.dumps(
            {
                "request_id": request_id,
                "expected": {"ttft": 1.0, "tds": 500.0},
                "arrivals": [[0.1, 3]],
                "outcome": "completed",
            }
        ),
    )
    assert again.status_code == 409, again.text  # the exiting client's report was stored
