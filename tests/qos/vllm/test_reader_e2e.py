"""Reader signals end to end on a real vLLM engine: client → gateway → Redis → plugin.

One vLLM OpenAI server (the CPU build, ``.models/small-llama`` with dummy weights, from
``.venv-vllm``) runs the plugin with ``TOKENPACE_REDIS_URL`` on a real redis-server, the
gateway in front of it shares that Redis (its ``store``), and the official ``openai``
client streams four long chat replies through the gateway. While they stream, their
readers speak through ``POST /v1/tokenpace/reader``: one goes away for 3 s and comes
back, one leaves, two watch throughout. Checked:

- the channel, end to end: the plugin's table recorded the signals (its stats file:
  ``reader_signals`` applied to requests it runs, found by their ``tp_request_id``; none
  malformed, the subscription never lost);
- ``left``: the reply ends at once and cleanly at the client (``[DONE]``, no error, fewer
  tokens than asked) and vLLM aborts it (the engine goes on serving the others);
- the reader who came back saw no freeze over 2 s while watching (the release rule on
  the client's receive times, the away interval taken out, as the SDKs report it), nor
  did the readers who watched.

Two sequences run at once (``max_num_seqs`` 2) for three replies, so a reply that
yields its place lets another run: while its reader is away (holding its return cushion,
as the SDKs state it with ``buffer_tokens``), the away reply gets fewer tokens than the
watched ones, and none of the watched replies freezes. About a minute and a half, most
of it the engine's start.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai

from qos.metrics import freezes
from qos.timeline import digestion_starts, token_times
from tests.support.paths import ROOT
from tests.support.redis_server import RedisServer
from tests.support.vllm import local_model, vllm_python

sys.path.insert(0, str(ROOT / "bench"))
from vllm_harness import API_KEY, VllmServer, gateway_config, serve_gateway

TIERS = {"chat": {"ttft": 2.0, "tds": 20.0, "priority": 1}}
TOKENS = 1200
AWAY_AFTER_S, AWAY_FOR_S, LEAVE_AFTER_S = 1.0, 3.0, 1.0


def unshown(times: list[tuple[float, int]], tds: float, now: float) -> int:
    """Tokens received by ``now`` and not yet shown by the release rule at ``tds``: the
    buffer an SDK states."""
    if not times:
        return 0
    starts = digestion_starts(token_times(times), tds)
    return int(np.count_nonzero(starts > now))


async def reader(
    client: openai.AsyncOpenAI,
    signals: httpx.AsyncClient,
    model: str,
    plan: str,
) -> dict:
    """One reply streamed and read; ``plan``: ``watch``, ``away`` (away for a while) or
    ``leave``. Its receive times, the away intervals and how it ended."""
    sent = time.perf_counter()
    raw = await client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": f"a long answer, reader {plan}"}],
        max_tokens=TOKENS,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "tokenpace": {"tier": "chat"}},
    )
    rid = raw.headers["x-request-id"]
    tds = float(raw.headers["X-TokenPace-TDS"])
    times: list[tuple[float, int]] = []
    away: list[tuple[float, float]] = []
    answers: list[int] = []

    async def say(presence: str, buffer: int | None = None) -> None:
        body = {"request_id": rid, "presence": presence, "buffer_tokens": buffer}
        r = await signals.post("/v1/tokenpace/reader", json=body)
        answers.append(r.status_code)

    async def behave() -> None:
        while not times:
            await asyncio.sleep(0.02)
        if plan == "away":
            await asyncio.sleep(AWAY_AFTER_S)
            start = time.perf_counter() - sent
            held = unshown(times, tds, start)  # the display stops: these wait for the reader
            await say("away", held)
            await asyncio.sleep(AWAY_FOR_S)
            back = time.perf_counter() - sent
            received = sum(n for t, n in times if t <= back)
            await say("watching", held + received - sum(n for t, n in times if t <= start))
            away.append((start, back))
        elif plan == "leave":
            await asyncio.sleep(LEAVE_AFTER_S)
            await say("left")

    behaviour = asyncio.create_task(behave())
    seen = 0
    async for chunk in raw.parse():  # raises on an error event
        usage = chunk.usage
        if usage is not None and usage.completion_tokens > seen:
            times.append((time.perf_counter() - sent, usage.completion_tokens - seen))
            seen = usage.completion_tokens
    await behaviour
    return {
        "plan": plan,
        "tds": tds,
        "times": times,
        "away": away,
        "tokens": seen,
        "answers": answers,
    }


async def drive(server: VllmServer, redis_url: str, prefix: str) -> list[dict]:
    config = gateway_config([server], TIERS)
    store = config.store.model_copy(update={"redis_url": redis_url, "key_prefix": prefix})
    async with serve_gateway(config.model_copy(update={"store": store})) as url:
        root = url.removesuffix("/v1")
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with (
            openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=600) as client,
            httpx.AsyncClient(base_url=root, headers=headers, timeout=30) as signals,
        ):
            warm = await client.chat.completions.create(  # the first batch compiles
                model=server.name, messages=[{"role": "user", "content": "hi"}], max_tokens=8
            )
            assert warm.usage is not None and warm.usage.completion_tokens == 8
            plans = ["away", "leave", "watch", "watch"]
            return list(
                await asyncio.gather(*(reader(client, signals, server.name, p) for p in plans))
            )


def test_signals_reach_the_plugin_and_left_ends_the_reply(tmp_path: Path) -> None:
    python = vllm_python()
    prefix = "tp-e2e-reader"
    with RedisServer() as redis_server:
        env = {"TOKENPACE_REDIS_URL": redis_server.url, "TOKENPACE_KEY_PREFIX": prefix}
        server = VllmServer(
            python,
            str(local_model("small-llama")),
            "tiny-andes",
            "andes",
            tmp_path,
            kv_blocks=256,
            max_num_seqs=2,
            max_model_len=2048,
            extra_args=("--stream-interval", "4"),
            env=env,
            nice=10,
        )
        try:
            server.start()
            server.wait_ready(timeout_s=400)
            results = asyncio.run(drive(server, redis_server.url, prefix))
            time.sleep(1.5)  # the stats file is rewritten when the engine goes idle
            stats = server.stats()
        finally:
            server.stop()

    by_plan = {r["plan"]: r for r in results}
    report = f"{[(r['plan'], r['tokens'], r['answers']) for r in results]}, stats {stats}"
    assert all(a == 202 for r in results for a in r["answers"]), report
    # the channel: the plugin heard every signal; what it applied found its request
    assert stats["reader_signals_received"] == 3, report
    assert stats["reader_signals_malformed"] == 0, report
    assert stats["reader_channel_reconnects"] == 0, report
    assert stats["reader_signals"] >= 2, report  # away, watching (left may meet the abort)
    assert stats["reader_signals"] + stats["reader_signals_unknown"] == 3, report
    # left: the reply ended early, cleanly; the others got every token
    assert 0 < by_plan["leave"]["tokens"] < TOKENS, report
    for r in results:
        if r["plan"] != "leave":
            assert r["tokens"] == TOKENS, report
    # no freeze over 2 s while watching, the return included
    longest = {
        r["plan"] + str(i): freezes(r["times"], r["tds"], r["away"]).longest_s
        for i, r in enumerate(results)
        if r["plan"] != "leave"
    }
    print(f"longest freeze while watching {longest}; {report}")
    assert by_plan["away"]["away"], report
    assert max(longest.values()) <= 2.0, (longest, report)
    # the away reply yielded: over its reader's absence (its first and last half second
    # aside: the signal's path, the decision interval) it got fewer tokens than any
    # watched reply
    start, back = by_plan["away"]["away"][0]

    def during(r: dict) -> int:
        return sum(n for t, n in r["times"] if start + 0.5 <= t <= back - 0.5)

    watched = [during(r) for r in results if r["plan"] == "watch"]
    print(f"tokens while away: away {during(by_plan['away'])}, watched {watched}")
    assert during(by_plan["away"]) < min(watched), (during(by_plan["away"]), watched, report)
