"""End to end on real vLLM engines: a conversation's second turn goes where its first was
served, and that engine's own prefix cache counts the hit.

Two vLLM OpenAI servers (the CPU build, ``.models/small-llama`` with dummy weights,
from ``.venv-vllm``; automatic prefix caching on, as vLLM ships it) serve one model
behind the tokenpace gateway with its default routing, ``cache_aware``. The official
``openai`` client sends four conversations, two turns each, the second resending the
first's prompt and reply. Read from each engine's ``/metrics``
(:func:`bench.routing_vllm.engine_counters`): every conversation's two turns were
served by one engine, and the prefix-cache hits of the second turns cover the first
turns' prompts. The servers and the conversations are ``bench/routing_vllm.py``'s.
About 1.5 minutes (two engines' start-up).
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

from gateway.backends.prefix import prompt_chain, prompt_name
from qos.routing import rendezvous_weight
from tests.support.paths import ROOT
from tests.support.vllm import local_model, vllm_python

sys.path.insert(0, str(ROOT / "bench"))
from routing_vllm import (
    BACKEND_NAMES,
    WORKLOADS,
    client_for,
    conversation,
    engine_counters,
    routing_config,
    servers,
    text,
)
from vllm_harness import serve_gateway


def preferred(n: int) -> int:
    """The engine conversation ``n`` of run ``e2e`` prefers: the first in its rendezvous
    order (its first turn's messages as :func:`routing_vllm.conversation` sends them)."""
    w = WORKLOADS["shared"]
    first_turn = [
        {"role": "system", "content": text(f"e2e/app{n % 2}", w.system_chars)},
        {"role": "user", "content": text(f"e2e/{n}/0", w.user_chars)},
    ]
    anchor = prompt_chain({"messages": first_turn}, 256).anchor
    return max(range(2), key=lambda i: rendezvous_weight(anchor, prompt_name(BACKEND_NAMES[i])))


# two conversations that prefer each engine
CONVERSATIONS = [n for n in range(64) if preferred(n) == 0][:2] + [
    n for n in range(64) if preferred(n) == 1
][:2]


async def drive(urls: list[str], base: str) -> list[list[dict[str, float]]]:
    """For each conversation: what each engine's counters gained over it."""
    out = []
    async with client_for(base) as client:
        one, two = replace(WORKLOADS["shared"], turns=1), replace(WORKLOADS["shared"], turns=2)
        await conversation(client, "warm", 99, one, 0.0)  # both engines answer once
        await conversation(client, "warm", 98, one, 0.0)
        for n in CONVERSATIONS:
            before = [await engine_counters(u) for u in urls]
            await conversation(client, "e2e", n, two, 0.0)
            await asyncio.sleep(1.0)  # the engines' counters reach /metrics
            after = [await engine_counters(u) for u in urls]
            out.append([{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)])
    return out


def test_the_second_turn_lands_where_the_first_was_served_and_hits_its_cache(
    tmp_path: Path,
) -> None:
    engines = servers(vllm_python(), str(local_model("small-llama")), tmp_path)
    try:
        for s in engines:
            s.start()
        for s in engines:
            s.wait_ready(420.0)

        async def main() -> list[list[dict[str, float]]]:
            config = routing_config(engines, {})  # the default routing: cache_aware
            assert config.routing.policy == "cache_aware"
            async with serve_gateway(config) as base:
                return await drive([s.url for s in engines], base)

        results = asyncio.run(main())
    finally:
        for s in engines:
            s.stop()
    homes = []
    for gained in results:
        served = [i for i, g in enumerate(gained) if g["requests"] > 0]
        assert len(served) == 1 and gained[served[0]]["requests"] == 2, gained  # one engine
        home = gained[served[0]]
        homes.append(served[0])
        # the second turn found the first's prompt (~700 tokens of system prompt and the
        # first user message: over a third of the two turns' prompts) in that engine's cache
        assert home["hits"] >= max(600, 0.35 * home["prompt_tokens"]), gained
    # each went to the engine it prefers, the same at any gateway replica: both engines
    assert homes == [preferred(n) for n in CONVERSATIONS] == [0, 0, 1, 1], homes
