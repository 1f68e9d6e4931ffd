"""Cache-aware routing on real engines: two vLLM CPU servers with prefix caching.

Two vLLM OpenAI servers (the CPU build, ``.models/small-llama`` with dummy weights, from
``.venv-vllm``; automatic prefix caching on, as vLLM ships it; vLLM's own FCFS
scheduler) serve one model behind two tokenpace gateways in this process, one routing
with ``least_waiting`` (today's) and one with ``cache_aware``. The official ``openai``
client drives multi-turn conversations through a gateway: each conversation belongs to
one of two apps, whose system prompt it starts with; every turn resends the history (the
earlier user messages and the replies as they came back) and a new user message; the
user thinks between turns (``--think-s`` sets how long); the conversations run at once
(:data:`WORKLOADS`: ``shared``, a long system prompt, most of every prompt; ``history``,
a short one and long conversations, whose history is most of every prompt;
``cache_bound``, histories that overflow one engine's KV cache, which is made smaller
than what the conversations fill together).

Every run uses texts of its own (a run number leads every system prompt), so no run finds
another's prompts in a cache; the two policies run alternately, ``--repeats`` times each,
on the same two servers. Measured per run: the client's TTFT (p50, p90), the Andes QoE
of every reply against the chat tier (scaled to the engine, as ``bench/vllm_compare.py``
does), what its readers saw at that pace (the share of replies frozen over 2 s, and the
user idle latency p99: :func:`qos.metrics.reader_summary`), output tokens/s over the
run, and the prefix-cache hit rate each server counts (``vllm:prefix_cache_hits_total``
over ``vllm:prefix_cache_queries_total``, read from its ``/metrics`` before and after
the run). The report gives each run and the medians.

``routing.prefill_tps`` of the cache-aware gateway is measured first: the extra TTFT of
a long prompt over a short one, in the gateway's estimated tokens (chars / 4). So is
``routing.throughput_tps`` of both gateways, the output tokens/s an engine streams with
eight replies at once (the waiting-time estimate's Θ): the shipped 1,000 tokens/s is a
GPU's, and on these engines it would put a queue's wait at about a quarter of what it is.

    .venv/bin/python bench/routing_vllm.py --workload shared --repeats 3 --out /tmp/routing_vllm

About 4-6 minutes here (two servers' start-up included, ~3 GB each). The machine is
shared: compare only the figures of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
from result_files import save
from vllm_harness import API_KEY, ROOT, VllmServer, gateway_client, serve_gateway

from gateway.config.loader import parse_config
from gateway.config.schema import GatewayConfig
from qos.metrics import reader_summary, reply_qoe

MODEL = "small"
TIER = {"ttft": 0.5, "tds": 40.0, "priority": 1}  # the engine streams ~100-400 tokens/s


@dataclass(frozen=True)
class ChatWorkload:
    """Conversations run at once, their turns, the user's think time and the lengths."""

    conversations: int = 12
    turns: int = 6
    think_s: float = 0.3
    reply_tokens: int = 32
    system_chars: int = 900  # ~700 tokens of this model's tokenizer (~1.3 characters a token)
    user_chars: int = 150
    kv_blocks: int = 0  # each engine's KV cache in 32-token blocks (0: vLLM sizes it)


WORKLOADS = {
    # a long system prompt shared by every conversation of an app: most of each prompt
    "shared": ChatWorkload(),
    # a short system prompt and long conversations: most of each prompt is its history
    "history": ChatWorkload(
        conversations=8, turns=7, reply_tokens=64, system_chars=120, user_chars=200
    ),
    # at their last turn the conversations fill ~830 blocks, 1.6 engines' caches: where one sees
    # every conversation, each evicts what the other turns need; where each sees half, its
    # half fits (a cache smaller than what is served: the production regime)
    "cache_bound": ChatWorkload(
        conversations=16,
        turns=6,
        reply_tokens=32,
        system_chars=120,
        user_chars=300,
        kv_blocks=512,
    ),
}
POLICIES = ("least_waiting", "cache_aware")
BACKEND_NAMES = ("a", "b")  # the gateway's names of the two servers
_WORDS = [
    "account",
    "ledger",
    "invoice",
    "policy",
    "refund",
    "quarter",
    "audit",
    "balance",
    "credit",
    "entry",
    "review",
    "payment",
    "vendor",
    "approval",
    "budget",
    "forecast",
    "reconcile",
    "statement",
]


def text(seed: str, chars: int) -> str:
    """Words of a fixed vocabulary in an order of ``seed``'s own: ``chars`` characters."""
    rng = np.random.default_rng(
        int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest())
    )
    words: list[str] = []
    size = 0
    while size < chars:
        w = _WORDS[int(rng.integers(len(_WORDS)))]
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:chars]


def servers(python: str, model: str, workdir: Path, kv_blocks: int = 0) -> list[VllmServer]:
    """The two engines (not started), each logging its statistics for ``/metrics``, with
    ``kv_blocks`` blocks of KV cache (0: vLLM sizes it, room for every run)."""
    return [
        VllmServer(
            python,
            model,
            MODEL,
            "fcfs",
            workdir / name,
            kv_blocks=kv_blocks,
            block_size=32,  # the CPU build's attention needs a multiple of 32
            max_num_seqs=16,
            max_model_len=2048,
            log_stats=True,
            # eager: no torch.compile at start-up (minutes on a loaded two-core machine);
            # the warm-up runs every batch shape before anything is measured
            extra_args=("--stream-interval", "4", "--enforce-eager"),
        )
        for name in ("a", "b")
    ]


def routing_config(engines: Sequence[VllmServer], routing: dict[str, Any]) -> GatewayConfig:
    """A gateway in front of ``engines`` (one model, :data:`BACKEND_NAMES`) with ``routing``."""
    return parse_config(
        {
            "tenants": [{"name": "bench", "api_keys": [API_KEY]}],
            "tiers": {"chat": TIER},
            "backends": [
                {"name": name, "url": f"{s.url}/v1", "models": [MODEL], "health_path": "/health"}
                for name, s in zip(BACKEND_NAMES, engines, strict=True)
            ],
            "timeouts": {"first_byte_s": 120.0, "idle_s": 120.0, "request_s": 600.0},
            "limits": {"max_tokens": 4096},
            "routing": routing,
        }
    )


async def engine_counters(url: str) -> dict[str, float]:
    """The engine's own counters: prefix-cache queries and hits (tokens), requests done."""
    async with httpx.AsyncClient(timeout=10.0) as http:
        body = (await http.get(f"{url}/metrics")).text
    names = {
        "vllm:prefix_cache_queries_total": "queries",
        "vllm:prefix_cache_hits_total": "hits",
        "vllm:request_success_total": "requests",
        "vllm:prompt_tokens_total": "prompt_tokens",
    }
    out = dict.fromkeys(names.values(), 0.0)
    for line in body.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


@dataclass
class Reply:
    conversation: int
    turn: int
    prompt_chars: int
    ttft: float
    times: list[tuple[float, int]] = field(repr=False)
    tokens: int
    qoe: float
    longest_freeze_s: float  # what its reader, at TIER's pace, saw stop the longest
    idle_s: float  # user idle latency (Wang et al. Eq. 9)


async def chat_turn(
    client: openai.AsyncOpenAI, messages: list[dict[str, str]], max_tokens: int
) -> tuple[str, list[tuple[float, int]]]:
    """One streamed turn: the reply's text and its tokens' arrival times."""
    sent = time.perf_counter()
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "tokenpace": {"tier": "chat"}},
    )
    parts: list[str] = []
    times: list[tuple[float, int]] = []
    seen = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        usage = chunk.usage
        if usage is not None and usage.completion_tokens > seen:
            times.append((time.perf_counter() - sent, usage.completion_tokens - seen))
            seen = usage.completion_tokens
    return "".join(parts), times


async def conversation(
    client: openai.AsyncOpenAI, run: str, n: int, w: ChatWorkload, start_s: float
) -> list[Reply]:
    """Conversation ``n`` of run ``run``: ``w.turns`` turns, each resending the history."""
    await asyncio.sleep(start_s)
    app = n % 2
    messages = [{"role": "system", "content": text(f"{run}/app{app}", w.system_chars)}]
    replies = []
    for t in range(w.turns):
        messages.append({"role": "user", "content": text(f"{run}/{n}/{t}", w.user_chars)})
        answer, times = await chat_turn(client, messages, w.reply_tokens)
        chars = sum(len(m["content"]) for m in messages)
        if not times:
            raise RuntimeError(f"conversation {n} turn {t}: the reply streamed no token")
        seen = reply_qoe(times, TIER["ttft"], TIER["tds"])
        tokens = sum(k for _, k in times)
        replies.append(
            Reply(
                n,
                t,
                chars,
                times[0][0],
                times,
                tokens,
                seen.andes,
                seen.freezes.longest_s,
                seen.idle_s,
            )
        )
        messages.append({"role": "assistant", "content": answer})
        await asyncio.sleep(w.think_s)
    return replies


def client_for(base_url: str) -> openai.AsyncOpenAI:
    return gateway_client(base_url, timeout_s=600.0, connections=200)


async def run_conversations(base_url: str, run: str, w: ChatWorkload) -> tuple[list[Reply], float]:
    """Every conversation of run ``run`` through the gateway at ``base_url``; the replies
    and the run's wall time."""
    async with client_for(base_url) as client:
        started = time.perf_counter()
        done = await asyncio.gather(
            *(conversation(client, run, n, w, 0.1 * n) for n in range(w.conversations))
        )
        return [r for conv in done for r in conv], time.perf_counter() - started


async def measure_prefill_tps(base_url: str) -> float:
    """Estimated prompt tokens (chars / 4) per second of prefill: a long prompt's extra
    TTFT over a short one's, the best of three of each."""
    async with client_for(base_url) as client:

        async def ttft(chars: int, i: int) -> float:
            content = text(f"calibrate/{chars}/{i}", chars)
            _, times = await chat_turn(client, [{"role": "user", "content": content}], 1)
            return times[0][0]

        short = min([await ttft(40, i) for i in range(3)])
        long = min([await ttft(2000, i) for i in range(3)])
    return (2000 - 40) / 4 / max(long - short, 1e-3)


async def measure_throughput_tps(base_url: str, streams: int = 16, tokens: int = 64) -> float:
    """Output tokens per second one engine streams at half of ``streams`` at once (QLM's
    Θ, the router's waiting-time estimate): ``streams`` short prompts over both engines."""
    async with client_for(base_url) as client:
        started = time.perf_counter()
        done = await asyncio.gather(
            *(
                chat_turn(client, [{"role": "user", "content": text(f"theta/{i}", 40)}], tokens)
                for i in range(streams)
            )
        )
        wall = time.perf_counter() - started
    return sum(k for _, times in done for _, k in times) / wall / len(BACKEND_NAMES)


def summary(replies: list[Reply], wall_s: float, engines: list[dict[str, float]]) -> dict[str, Any]:
    ttft = np.array([r.ttft for r in replies])
    queries = sum(e["queries"] for e in engines)
    hits = sum(e["hits"] for e in engines)
    readers = reader_summary([r.longest_freeze_s for r in replies], [r.idle_s for r in replies])
    return {
        **readers.as_dict(),
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p90_s": float(np.percentile(ttft, 90)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "qoe_mean": float(np.mean([r.qoe for r in replies])),
        "qoe_p10": float(np.percentile([r.qoe for r in replies], 10)),
        "tokens_per_s": sum(r.tokens for r in replies) / wall_s,
        "wall_s": wall_s,
        "hit_rate": hits / queries if queries else float("nan"),
        "engines": [
            {**e, "hit_rate": e["hits"] / e["queries"] if e["queries"] else float("nan")}
            for e in engines
        ],
    }


SHIPPED_THETA = "cache_aware, shipped Θ"  # --shipped-throughput's arm


async def bench(
    engines: list[VllmServer], repeats: int, w: ChatWorkload, shipped_theta: bool = False
) -> dict[str, Any]:
    urls = [s.url for s in engines]
    async with serve_gateway(routing_config(engines, {"policy": "least_waiting"})) as probe:
        for i in range(4):  # warm-up: both engines compile their batch shapes
            await run_conversations(probe, f"warm{i}", replace(w, conversations=4, turns=2))
        prefill_tps = await measure_prefill_tps(probe)
        throughput_tps = await measure_throughput_tps(probe)
    print(f"prefill {prefill_tps:.0f} tokens/s, throughput {throughput_tps:.0f} tokens/s")
    configs = {
        "least_waiting": {"policy": "least_waiting", "throughput_tps": throughput_tps},
        "cache_aware": {
            "policy": "cache_aware",
            "prefill_tps": prefill_tps,
            "throughput_tps": throughput_tps,
        },
    }
    if shipped_theta:  # the same, Θ left at the shipped routing.throughput_tps
        configs[SHIPPED_THETA] = {"policy": "cache_aware", "prefill_tps": prefill_tps}
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in configs}
    for rep in range(repeats):
        for policy in configs:
            async with serve_gateway(routing_config(engines, configs[policy])) as url:
                before = [await engine_counters(u) for u in urls]
                replies, wall = await run_conversations(url, f"{rep}/{policy}", w)
                await asyncio.sleep(1.0)  # the engines' last counters reach /metrics
                after = [await engine_counters(u) for u in urls]
            diff = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
            runs[policy].append(summary(replies, wall, diff))
            r = runs[policy][-1]
            print(
                f"repeat {rep} {policy}: TTFT p50 {r['ttft_p50_s']:.3f} p90 "
                f"{r['ttft_p90_s']:.3f} s, QoE {r['qoe_mean']:.3f}, {r['tokens_per_s']:.0f} "
                f"tokens/s, hit rate {r['hit_rate']:.3f}",
                flush=True,
            )
    medians = {
        p: {
            k: statistics.median(r[k] for r in runs[p])
            for k in (
                "ttft_p50_s",
                "ttft_p90_s",
                "ttft_p99_s",
                "qoe_mean",
                "qoe_p10",
                "frozen_over_2s",
                "idle_p99_s",
                "tokens_per_s",
                "hit_rate",
            )
        }
        for p in configs
    }
    return {
        "prefill_tps": prefill_tps,
        "throughput_tps": throughput_tps,
        "runs": runs,
        "medians": medians,
    }


def report(results: dict[str, Any]) -> str:
    lines = [
        "| routing | run | TTFT p50 s | TTFT p90 s | TTFT p99 s | QoE mean | QoE p10 "
        "| frozen > 2 s | idle p99 s | tokens/s | hit rate | engine a hit rate (requests) "
        "| engine b hit rate (requests) |",
        "|" + " --- |" * 13,
    ]
    for policy in results["runs"]:
        for i, r in enumerate(results["runs"][policy]):
            a, b = r["engines"]
            lines.append(
                f"| {policy} | {i} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} "
                f"| {r['ttft_p99_s']:.3f} | {r['qoe_mean']:.3f} | {r['qoe_p10']:.3f} "
                f"| {r['frozen_over_2s']:.3f} | {r['idle_p99_s']:.3f} "
                f"| {r['tokens_per_s']:.0f} | {r['hit_rate']:.3f} "
                f"| {a['hit_rate']:.3f} ({a['requests']:.0f}) "
                f"| {b['hit_rate']:.3f} ({b['requests']:.0f}) |"
            )
        m = results["medians"][policy]
        lines.append(
            f"| {policy} | median | {m['ttft_p50_s']:.3f} | {m['ttft_p90_s']:.3f} "
            f"| {m['ttft_p99_s']:.3f} | {m['qoe_mean']:.3f} | {m['qoe_p10']:.3f} "
            f"| {m['frozen_over_2s']:.3f} | {m['idle_p99_s']:.3f} "
            f"| {m['tokens_per_s']:.0f} | {m['hit_rate']:.3f} | | |"
        )
    ca, lw = results["medians"]["cache_aware"], results["medians"]["least_waiting"]
    lines.append("")
    lines.append(
        f"hit rate ratio {ca['hit_rate'] / lw['hit_rate']:.2f} (>= 2), p90 TTFT ratio "
        f"{ca['ttft_p90_s'] / lw['ttft_p90_s']:.2f} (<= 0.6), tokens/s ratio "
        f"{ca['tokens_per_s'] / lw['tokens_per_s']:.3f} (>= 1)"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="shared")
    ap.add_argument("--out", default="/tmp/routing_vllm")
    ap.add_argument("--think-s", type=float, help="the user's think time between turns")
    ap.add_argument(
        "--shipped-throughput",
        action="store_true",
        help="also run cache_aware with routing.throughput_tps left at its default",
    )
    args = ap.parse_args()
    workload = WORKLOADS[args.workload]
    if args.think_s is not None:
        if args.think_s < 0:
            ap.error(f"--think-s: at least 0, got {args.think_s}")
        workload = replace(workload, think_s=args.think_s)
    started = time.monotonic()
    python = str(ROOT / ".venv-vllm" / "bin" / "python")
    model = str(ROOT / ".models" / "small-llama")
    with tempfile.TemporaryDirectory(prefix="routing-vllm-") as tmp:
        engines = servers(python, model, Path(tmp), workload.kv_blocks)
        try:
            for s in engines:
                s.start()
            for s in engines:
                s.wait_ready(420.0)
            results = asyncio.run(bench(engines, args.repeats, workload, args.shipped_throughput))
        finally:
            for s in engines:
                s.stop()
    results["workload"] = {"name": args.workload, **asdict(workload), "tier": TIER}
    print(report(results))
    print(f"wrote {save(results, args.out, started)}")


if __name__ == "__main__":
    main()
