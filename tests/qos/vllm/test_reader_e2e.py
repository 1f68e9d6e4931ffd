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

What this does not show: the away reply yielding its place to the watching ones. That is
the reader guard's (qos/policy), which reads the table's ``away_until``; here the guard
runs as shipped, and the assertion on yielding belongs with it.

redis-py is not installed in ``.venv-vllm`` by scripts/setup-vllm.sh yet: until it is,
the engine's process is given this environment's redis-py (same Python, pure Python) on
its ``PYTHONPATH``. About a minute, most of it the engine's start.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import redis

from qos.metrics import freezes
from tests.support.paths import ROOT
from tests.support.redis_server import RedisServer
from tests.support.vllm import local_model, vllm_python

sys.path.insert(0, str(ROOT / "bench"))
from vllm_harness import API_KEY, VllmServer, gateway_config, serve_gateway

TIERS = {"chat": {"ttft": 2.0, "tds": 20.0, "priority": 1}}
TOKENS = 1200
AWAY_AFTER_S, AWAY_FOR_S, LEAVE_AFTER_S = 1.0, 3.0, 1.0


def redis_path_for(python: str, workdir: Path) -> str | None:
    """A directory to put on the engine's PYTHONPATH holding this environment's redis-py,
    when the engine's own environment has none."""
    has = subprocess.run([python, "-c", "import redis"], capture_output=True, check=False)
    if has.returncode == 0:
        return None
    shim = workdir / "redis-py"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "redis").symlink_to(Path(redis.__file__).parent, target_is_directory=True)
    return str(shim)


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

    async def say(presence: str) -> None:
        r = await signals.post(
            "/v1/tokenpace/reader", json={"request_id": rid, "presence": presence}
        )
        answers.append(r.status_code)

    async def behave() -> None:
        while not times:
            await asyncio.sleep(0.02)
        if plan == "away":
            await asyncio.sleep(AWAY_AFTER_S)
            start = time.perf_counter() - sent
            await say("away")
            await asyncio.sleep(AWAY_FOR_S)
            await say("watching")
            away.append((start, time.perf_counter() - sent))
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
        shim = redis_path_for(python, tmp_path)
        if shim is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), shim])
        server = VllmServer(
            python,
            str(local_model("small-llama")),
            "tiny-andes",
            "andes",
            tmp_path,
            kv_blocks=256,
            max_num_seqs=4,
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
