"""The official openai client, unchanged, against the gateway (base_url = the gateway).

Upstream is the FakeUpstream stand-in for vLLM (tests/support/gateway.py).
"""

from __future__ import annotations

import openai
import pytest
import pytest_asyncio

from tests.support.fake_upstream import MODEL, upstream
from tests.support.gateway import KEY, KEY_BASIC, backend_entry, gateway, make_config

MESSAGES = [{"role": "user", "content": "Hello!"}]


# One upstream and one gateway for the whole module (start-up and shutdown cost ~0.5 s).
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shared():
    async with upstream() as fake:
        config = make_config(
            [backend_entry(fake, "vllm-a", tokenpace=True, supports_priority=True)]
        )
        async with gateway(config) as gw:
            client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
            yield gw, fake, client
            await client.close()


@pytest.fixture
def env(shared):
    shared[1].mode = "ok"
    yield shared
    shared[1].mode = "ok"


async def test_non_streaming_chat(env):
    _gw, fake, client = env
    resp = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0.3, stop=["\n\n"]
    )
    completion = resp.parse()
    assert completion.choices[0].message.content == "t0 t1 t2 t3 "
    assert completion.usage.completion_tokens == 4
    # the tenant's default tier, announced in the headers
    assert resp.headers["x-tokenpace-tier"] == "chat"
    assert float(resp.headers["x-tokenpace-ttft"]) == 1.0
    assert float(resp.headers["x-tokenpace-tds"]) == 4.8
    assert len(resp.headers["x-request-id"]) == 32
    body = fake.bodies[-1]
    # sampling fields reach the backend untouched
    assert body["max_tokens"] == 4 and body["temperature"] == 0.3 and body["stop"] == ["\n\n"]
    assert body["vllm_xargs"]["tp_request_id"] == resp.headers["x-request-id"]
    assert fake.headers[-1]["x-request-id"] == resp.headers["x-request-id"]
    assert "authorization" not in fake.headers[-1]  # the tenant's key stays at the gateway


async def test_streaming_chat_with_tier_from_extra_body(env):
    _gw, fake, client = env
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        extra_body={"tokenpace": {"tier": "voice"}},
    )
    text = ""
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == "t0 t1 t2 t3 t4 t5 "
    body = fake.bodies[-1]
    assert "tokenpace" not in body
    assert body["vllm_xargs"] == {
        "tp_tier": "voice",
        "tp_ttft": 1.0,
        "tp_tds": 3.3,
        "tp_tenant": "acme",
        "tp_weight": 2.0,
        "tp_request_id": body["vllm_xargs"]["tp_request_id"],
    }
    assert body["priority"] == 1  # the backend declares supports_priority


async def test_streaming_headers_and_tier_header(env):
    _gw, fake, client = env
    async with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        extra_headers={"X-TokenPace-Tier": "fast"},
    ) as resp:
        assert resp.headers["x-tokenpace-tier"] == "fast"
        assert float(resp.headers["x-tokenpace-ttft"]) == 0.5
        assert float(resp.headers["x-tokenpace-tds"]) == 25.0
        assert resp.headers["content-type"].startswith("text/event-stream")
        chunks = [c async for c in await resp.parse()]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert fake.bodies[-1]["vllm_xargs"]["tp_tier"] == "fast"
    assert fake.bodies[-1]["priority"] == 0


async def test_include_usage(env):
    _gw, fake, client = env
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert all(c.usage is None for c in chunks[:-1])
    assert fake.bodies[-1]["stream_options"] == {"include_usage": True}
    # without it, no usage chunk
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    chunks = [c async for c in stream]
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


async def test_tools_and_unknown_fields_pass_through(env):
    _gw, fake, client = env
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=tools,
        tool_choice="auto",
        stream=True,
        seed=7,
        extra_body={
            "top_k": 20,
            "repetition_penalty": 1.1,
            "vllm_xargs": {"mine": 1, "tp_tier": "batch"},
        },
    )
    name, args = "", ""
    async for chunk in stream:
        for call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            name += call.function.name or ""
            args += call.function.arguments or ""
    assert name == "get_weather" and args.startswith("{") and args.endswith("}")
    body = fake.bodies[-1]
    assert body["tools"] == tools and body["tool_choice"] == "auto" and body["seed"] == 7
    assert body["top_k"] == 20 and body["repetition_penalty"] == 1.1
    # the client's own vllm_xargs survive; its tp_* cannot override the gateway's tier
    assert body["vllm_xargs"]["mine"] == 1 and body["vllm_xargs"]["tp_tier"] == "chat"


async def test_completions_endpoint(env):
    _gw, fake, client = env
    done = await client.completions.create(model=MODEL, prompt="Once", max_tokens=3)
    assert done.choices[0].text == "t0 t1 t2 "
    stream = await client.completions.create(model=MODEL, prompt="Once", stream=True, n=2)
    texts = {0: "", 1: ""}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts[0] == texts[1] == "t0 t1 t2 t3 t4 t5 "
    assert fake.bodies[-1]["prompt"] == "Once" and fake.bodies[-1]["n"] == 2


async def test_models_list(env):
    _gw, _fake, client = env
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]


async def test_errors_are_openai_exceptions(env):
    gw, fake, client = env
    bad_key = openai.AsyncOpenAI(base_url=gw.base_url, api_key="tp-wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        await bad_key.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    await bad_key.close()

    with pytest.raises(openai.NotFoundError) as err:
        await client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert err.value.code == "model_not_found" and err.value.param == "model"

    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"tokenpace": {"tier": "gold"}}
        )
    assert err.value.param == "tokenpace.tier"

    basic = openai.AsyncOpenAI(base_url=gw.base_url, api_key=KEY_BASIC, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as err:
        await basic.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, extra_headers={"X-TokenPace-Tier": "fast"}
        )
    assert err.value.code == "tier_not_allowed"
    with pytest.raises(openai.PermissionDeniedError):  # custom numbers need allow_custom
        await basic.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_body={"tokenpace": {"ttft": 0.2, "tds": 9}}
        )
    await basic.close()

    fake.mode = "http_400"  # the backend's own 4xx is relayed as it was
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    assert "fake upstream error 400" in err.value.message


async def test_custom_tier(env):
    _gw, fake, client = env
    resp = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, extra_body={"tokenpace": {"ttft": 0.8, "tds": 6}}
    )
    assert resp.headers["x-tokenpace-tier"] == "custom"
    assert float(resp.headers["x-tokenpace-ttft"]) == 0.8
    assert float(resp.headers["x-tokenpace-tds"]) == 6.0
    xargs = fake.bodies[-1]["vllm_xargs"]
    assert (xargs["tp_tier"], xargs["tp_ttft"], xargs["tp_tds"]) == ("custom", 0.8, 6.0)


async def test_mid_stream_error_raises_in_client(env):
    _gw, fake, client = env
    fake.mode = "close_mid"
    stream = await client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    got = []
    with pytest.raises(openai.APIError) as err:
        async for chunk in stream:
            got.append(chunk)
    assert len(got) == 4  # the role chunk and three tokens, then the error event
    assert "mid-stream" in err.value.message
    fake.mode = "ok"  # and the gateway goes on serving
    done = await client.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert done.choices[0].message.content
