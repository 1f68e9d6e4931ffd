"""The synchronous openai client (gateway and upstream run in a thread of their own).

The upstream is the FakeUpstream stand-in for vLLM (tests/support/gateway.py).
"""

from __future__ import annotations

import json

import openai

from tests.support.fake_upstream import MODEL
from tests.support.gateway import KEY, backend_entry, gateway_in_thread, make_config

MESSAGES = [{"role": "user", "content": "Hello!"}]


def test_sync_client_in_thread():
    def config_for(fake):
        return make_config([backend_entry(fake, "plain")])  # not a tokenpace backend

    with gateway_in_thread(config_for) as (gw, fake):
        client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
        text = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                stream=True,
                extra_body={"tokenpace": {"tier": "batch"}, "priority": -100},
            )
            if c.choices
        )
        assert text == "t0 t1 t2 t3 t4 t5 "
        body = fake.bodies[-1]
        # a backend that is neither tokenpace nor priority-aware gets no tags at all
        assert "vllm_xargs" not in body and "tokenpace" not in body and "priority" not in body
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)
        assert raw.headers["x-tokenpace-tier"] == "chat"
        assert json.loads(raw.text)["object"] == "chat.completion"
        client.close()
