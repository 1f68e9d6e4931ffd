"""What cache-aware routing costs a request, and what its index weighs.

The router alone, in this process: ``--backends`` backends, the index filled with
``--conversations`` conversations (each a system prompt of one of four apps, then its
own turns: ``--history`` characters of history in all), then ``--requests`` requests,
each the next turn of a random conversation, routed as admission routes them
(``Router.routed``, ``Router.ranked``, ``Router.acquire``, the lease released). The CPU
time per request (``time.process_time``) of ``cache_aware`` against ``least_waiting``
(which reads no prompt) is the added cost; the index's memory is what ``tracemalloc``
counts while it fills.

    .venv/bin/python bench/routing_cost.py --backends 2,8 --conversations 100000

``--chain-only``: the CPU time of naming one 2.4 KB chat's blocks
(:func:`gateway.backends.prefix.prompt_chain`), the chat
``bench/precise_index_cost.py`` names as vLLM does.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from loadgen import conversation_turn

from gateway.backends import Backend
from gateway.backends.prefix import prompt_chain
from gateway.backends.routing import Router
from gateway.config.loader import parse_config
from gateway.context import RequestContext, ResolvedTier

MODEL = "m"
TIER = ResolvedTier("chat", 1.0, 4.8, 1)


class IdleBackend(Backend):
    """A backend that is never sent anything: the router alone is measured."""

    def __init__(self, name: str, model: str = MODEL) -> None:
        self.name, self.models, self.throughput_tps = name, (model,), None

    async def open_stream(self, endpoint, body, ctx):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    async def complete(self, endpoint, body, ctx):  # type: ignore[no-untyped-def]
        raise NotImplementedError


def body(n: int, history: int, rng: random.Random) -> dict[str, Any]:
    """A later turn of conversation ``n`` (:func:`loadgen.conversation_turn`)."""
    return {"model": MODEL, "messages": conversation_turn(n, rng, history)}


def ctx(model: str = MODEL) -> RequestContext:
    return RequestContext("r", "t", 1.0, TIER, "chat.completions", model, True, 0.0, 256)


def measure(
    backends: int, conversations: int, history: int, requests: int, index_blocks: int | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"backends": backends, "conversations": conversations}
    rng = random.Random(0)
    for policy in ("least_waiting", "cache_aware"):
        routing: dict[str, Any] = {"policy": policy}
        if policy == "cache_aware":  # by default, room for every conversation
            roomy = 4 * conversations * (history // 256 + 4) // backends
            routing["prefix_index_blocks"] = roomy if index_blocks is None else index_blocks
        config = parse_config(
            {"tenants": [{"name": "t", "api_keys": ["k" * 16]}], "routing": routing}
        )
        router = Router([IdleBackend(f"b{i}") for i in range(backends)], config)
        c = ctx()
        if policy == "cache_aware":
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            for n in range(conversations):
                routed = router.routed(body(n, history, rng), c)
                router.acquire(router.ranked(MODEL, routed=routed)[0], 256, routed).release()
            index_bytes = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            blocks = sum(len(s.cache) for s in router.states)
            out["index"] = {
                "blocks": blocks,
                "bytes": index_bytes,
                "bytes_per_block": index_bytes / blocks,
                "mib": index_bytes / 2**20,
            }
        bodies = [body(rng.randrange(conversations), history, rng) for _ in range(requests)]
        for s in router.states:  # the hit rate of the measured requests alone
            s.prompt_tokens = s.cached_tokens = 0
        started = time.process_time()
        for b in bodies:
            routed = router.routed(b, c)
            router.acquire(router.ranked(MODEL, routed=routed)[0], 256, routed).release()
        out[policy] = {"cpu_us_per_request": 1e6 * (time.process_time() - started) / requests}
        if policy == "cache_aware":
            hit = sum(s.cached_tokens for s in router.states)
            out[policy]["estimated_hit_rate"] = hit / sum(s.prompt_tokens for s in router.states)
    out["added_us"] = (
        out["cache_aware"]["cpu_us_per_request"] - out["least_waiting"]["cpu_us_per_request"]
    )
    return out


def chain_cost(repeats: int = 20_000) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from precise_index_cost import chat  # the same chat (needs nothing of vLLM's)

    request = {"model": MODEL, "messages": chat()}
    started = time.process_time()
    for _ in range(repeats):
        prompt_chain(request, 256)
    per = (time.process_time() - started) / repeats
    chars = sum(len(m["content"]) for m in request["messages"])
    print(f"{chars} characters: {per * 1e6:.1f} µs of CPU per prompt (256-character blocks)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="2,8")
    ap.add_argument("--conversations", type=int, default=100_000)
    ap.add_argument("--history", type=int, default=2000, help="characters of earlier turns")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument(
        "--index-blocks",
        type=int,
        help="blocks per backend's index (default: room for four times the conversations)",
    )
    ap.add_argument("--chain-only", action="store_true", help="time the prompt chain alone")
    args = ap.parse_args()
    if args.chain_only:
        chain_cost()
        return
    print(
        "| backends | conversations | index blocks | index MiB | bytes/block "
        "| least_waiting µs/req | cache_aware µs/req | added µs/req | est. hit rate |"
    )
    print("|" + " --- |" * 9)
    for n in (int(x) for x in args.backends.split(",")):
        r = measure(n, args.conversations, args.history, args.requests, args.index_blocks)
        i = r["index"]
        lw, ca = r["least_waiting"], r["cache_aware"]
        print(
            f"| {n} | {args.conversations} | {i['blocks']} | {i['mib']:.1f} "
            f"| {i['bytes_per_block']:.0f} | {lw['cpu_us_per_request']:.1f} "
            f"| {ca['cpu_us_per_request']:.1f} | {r['added_us']:.1f} "
            f"| {ca['estimated_hit_rate']:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
