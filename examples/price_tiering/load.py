"""Drive the three plans of gateway.yaml into overload and print what each tenant got.

Starts ``tokenpace serve --config gateway.yaml`` (the embedded simulated engine) on a
free loopback port, then for ``--seconds`` sends each tenant's requests at the same
rate (Poisson arrivals, streaming, the official ``openai`` client), all in the chat
tier every plan has, so that what differs between them is the weight (with
``--mixed``, ``pro`` alternates chat and voice and ``enterprise`` cycles chat, voice and
fast, as their plans allow). When it stops sending it reads ``/metrics``: the output
tokens each tenant was served so far (``tokenpace_output_tokens``), its share of the
engine while all three were contending. It waits for the streams to end, then reads
the gateway's own figures: ``GET /v1/tokenpace/qoe`` (admin key) for each tenant's
average QoE, overall and in the chat tier, the share of its replies that froze over
2 s and its user idle latency p99, and ``/metrics`` for its mean TTFT
(``tokenpace_ttft_seconds``). Every few seconds it prints to stderr how many requests
were sent and how many are still streaming. Usage::

    .venv/bin/python examples/price_tiering/load.py [--seconds 60] [--rate 0.8] [--mixed]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.reports import FLUSH_INTERVAL_S

HERE = Path(__file__).resolve().parent
ADMIN_KEY = "tp-example-admin-key"
PLANS = {  # tenant: (API key, the tiers its plan allows, cycled through with --mixed)
    "free": ("tp-example-free-key", ["chat"]),
    "pro": ("tp-example-pro-key", ["chat", "voice"]),
    "enterprise": ("tp-example-enterprise-key", ["chat", "voice", "fast"]),
}
MODEL = "tokenpace-sim"
PROGRESS_S = 5.0  # seconds between progress lines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gateway(config: Path):
    """``tokenpace serve`` on a free port with ``config``; yields its base URL."""
    port = free_port()
    data = yaml.safe_load(config.read_text())
    data["server"] = {"host": "127.0.0.1", "port": port}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gateway.yaml"
        path.write_text(yaml.safe_dump(data))
        log = open(Path(tmp) / "gateway.log", "w")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                        break
                if proc.poll() is not None:
                    raise RuntimeError((Path(tmp) / "gateway.log").read_text())
                time.sleep(0.2)
            else:
                raise RuntimeError("the gateway did not start within 60 s")
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()


async def one(client: openai.AsyncOpenAI, tier: str, max_tokens: int) -> tuple[str, float]:
    """One streamed request; ("ok", client TTFT) or (error type, nan)."""
    sent = time.perf_counter()
    try:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Tell me about price tiering."}],
            max_tokens=max_tokens,
            stream=True,
            extra_body={"tokenpace": {"tier": tier}},
        )
        ttft = float("nan")
        async for chunk in stream:
            if ttft != ttft and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - sent
        return "ok", ttft
    except openai.APIStatusError as exc:
        return f"HTTP {exc.status_code}", float("nan")
    except openai.APIError as exc:  # the stream ended in an error event
        return f"stream error: {exc.message}", float("nan")


def scrape(url: str) -> dict[str, dict[str, float]]:
    """Per tenant from ``/metrics``: output tokens, TTFT sum and count."""
    out: dict[str, dict[str, float]] = {}
    names = {
        "tokenpace_output_tokens_total": "tokens",
        "tokenpace_ttft_seconds_sum": "ttft_sum",
        "tokenpace_ttft_seconds_count": "ttft_count",
    }
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            key = names.get(sample.name)
            tenant = sample.labels.get("tenant")
            if key and tenant:
                row = out.setdefault(tenant, {"tokens": 0.0, "ttft_sum": 0.0, "ttft_count": 0.0})
                row[key] += sample.value
    return out


async def drive(
    url: str, seconds: float, rate: float, max_tokens: int, mixed: bool
) -> tuple[dict, dict]:
    """Each tenant sends Poisson arrivals at ``rate`` requests/s for ``seconds``; returns
    the outcomes and the per-tenant figures of ``/metrics`` when the sending stopped."""
    rng = random.Random(0)
    outcomes: dict[str, list[tuple[str, float]]] = {t: [] for t in PLANS}
    sent: dict[str, list[asyncio.Task]] = {t: [] for t in PLANS}

    async def tenant(name: str) -> None:
        key, tiers = PLANS[name]
        cycle = itertools.cycle(tiers if mixed else ["chat"])
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300
        ) as client:
            tasks = sent[name]
            start = time.perf_counter()
            at = rng.expovariate(rate)
            while at < seconds:
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
                tasks.append(asyncio.create_task(one(client, next(cycle), max_tokens)))
                at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, start + seconds - time.perf_counter()))
            outcomes[name] = list(await asyncio.gather(*tasks))

    async def snapshot() -> dict:
        await asyncio.sleep(seconds)
        return await asyncio.to_thread(scrape, url)

    async def progress() -> None:
        start = time.perf_counter()
        while True:
            await asyncio.sleep(PROGRESS_S)
            elapsed = time.perf_counter() - start
            tasks = [task for tasks in sent.values() for task in tasks]
            streaming = sum(not task.done() for task in tasks)
            doing = f"sending for {seconds:g} s" if elapsed < seconds else "sending done"
            print(
                f"[{elapsed:4.0f} s] {doing}: {len(tasks)} requests sent, {streaming} streaming",
                file=sys.stderr,
                flush=True,
            )

    reporter = asyncio.create_task(progress())
    try:
        *_, contended = await asyncio.gather(*(tenant(name) for name in PLANS), snapshot())
    finally:
        reporter.cancel()
    return outcomes, contended


def report(url: str, outcomes: dict, contended: dict) -> str:
    """Per tenant: requests, QoE (gateway side, overall and chat), the share of its replies
    that froze over 2 s and its user idle latency p99 (what the reader waited longest,
    beside the average), mean TTFT, p90 client TTFT, and its share of the output tokens
    served while all were sending."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    qoe = httpx.get(f"{url}/v1/tokenpace/qoe", headers=headers, timeout=10).json()["tenants"]
    final = scrape(url)
    total = sum(row["tokens"] for row in contended.values()) or 1.0
    weights = {
        t["name"]: t.get("weight", 1)
        for t in yaml.safe_load((HERE / "gateway.yaml").read_text())["tenants"]
    }
    lines = [
        f"{'tenant':<11} {'weight':>6} {'sent':>5} {'ok':>4} {'avg QoE':>8} {'chat QoE':>9} "
        f"{'frozen>2s':>9} {'idle p99':>9} {'mean TTFT':>10} {'p90 TTFT':>9} {'token share':>12}"
    ]
    for name, results in outcomes.items():
        ok = [ttft for status, ttft in results if status == "ok"]
        p90 = sorted(ok)[int(0.9 * (len(ok) - 1))] if ok else float("nan")
        mine = qoe.get(name, {})
        gateway_side = mine.get("overall", {}).get("gateway", {})
        overall = (gateway_side.get("andes") or {}).get("mean")
        reader = gateway_side.get("reader") or {}
        chat = mine.get("tiers", {}).get("chat", {}).get("gateway", {}).get("andes") or {}
        row = final.get(name, {"ttft_sum": 0.0, "ttft_count": 0.0})
        mean_ttft = row["ttft_sum"] / max(row["ttft_count"], 1.0)
        share = contended.get(name, {"tokens": 0.0})["tokens"] / total
        lines.append(
            f"{name:<11} {weights[name]:>6g} {len(results):>5} {len(ok):>4} "
            f"{overall or float('nan'):>8.3f} {chat.get('mean', float('nan')):>9.3f} "
            f"{100 * reader.get('frozen_over_2s', float('nan')):>8.1f}% "
            f"{reader.get('idle_p99_s', float('nan')):>8.1f}s "
            f"{mean_ttft:>9.2f}s {p90:>8.2f}s {share:>12.2f}"
        )
    errors = {n: sorted({s for s, _ in r if s != "ok"}) for n, r in outcomes.items()}
    if any(errors.values()):
        lines.append(f"errors: {errors}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to send")
    parser.add_argument("--rate", type=float, default=0.8, help="requests/s per tenant")
    parser.add_argument("--max-tokens", type=int, default=120, help="tokens per reply")
    parser.add_argument("--config", type=Path, default=HERE / "gateway.yaml")
    parser.add_argument("--mixed", action="store_true", help="use every tier each plan allows")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with gateway(args.config) as url:
        started = time.perf_counter()
        outcomes, contended = asyncio.run(
            drive(url, args.seconds, args.rate, args.max_tokens, args.mixed)
        )
        print(f"sent for {args.seconds:g} s, done after {time.perf_counter() - started:.0f} s")
        time.sleep(2 * FLUSH_INTERVAL_S)  # the last streams' QoE records reach the store
        print(report(url, outcomes, contended))
    return 0


if __name__ == "__main__":
    sys.exit(main())
