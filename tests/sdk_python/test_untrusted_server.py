"""tokenpace-client against a server that announces absurd pacing: the real openai client
over HTTP to the fake upstream (a stand-in for a misbehaving server), whose streams carry
``X-TokenPace-TDS: 0.0001`` and ``X-TokenPace-TTFT: 1e9``."""

from __future__ import annotations

import time

import tokenpace_client as tp

from tests.support.fake_upstream import MODEL, upstream


async def test_absurd_pacing_headers_are_bounded_and_the_drain_capped():
    async with upstream(n_tokens=3, token_interval=0.01) as fake:
        fake.stream_headers = [(b"x-tokenpace-tds", b"0.0001"), (b"x-tokenpace-ttft", b"1e9")]
        client = tp.AsyncOpenAI(
            base_url=f"{fake.url}/v1", api_key="k", max_retries=0, telemetry=False, max_drain_s=1
        )
        started = time.monotonic()
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        texts = [c.choices[0].delta.content async for c in stream if c.choices]
        elapsed = time.monotonic() - started
        await client.close()
    assert "".join(t or "" for t in texts) == "t0 t1 t2 "
    assert (stream.tds, stream.ttft) == (0.1, 600.0)  # clamped to the ranges
    # paced at 0.1 tokens/s the reply would take 20 s (at 0.0001, 5.5 hours): the drain
    # ends one second after the upstream did
    assert elapsed < 5.0
    assert stream.outcome == "completed"
