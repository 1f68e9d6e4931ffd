"""Drive the three plans of gateway.yaml into overload and print what each tenant got.

Starts ``tokenpace serve --config gateway.yaml`` (the embedded simulated engine) on a
free loopback port, then for ``--seconds`` sends each tenant's requests at the same
rate (Poisson arrivals, streaming, the official ``openai`` client): ``free`` in its
chat tier, ``pro`` alternating chat and voice, ``enterprise`` cycling chat, voice and
fast. It waits for the streams to end, then reads the gateway's own figures:
``GET /v1/tokenpace/qoe`` (admin key) for each tenant's average QoE, and ``/metrics``
for its TTFT (``tokenpace_ttft_seconds``) and the output tokens it was served
(``tokenpace_output_tokens``), as a share of all. Usage::

    .venv/bin/python examples/price_tiering/load.py [--seconds 60] [--rate 0.8]
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

from gateway.telemetry import FLUSH_INTERVAL_S

HERE = Path(__file__).resolve().parent
ADMIN_KEY = "tp-example-admin-key"
PLANS = {  # tenant: (API key, tiers it cycles through)
    "free": ("tp-example-free-key", ["chat"]),
    "pro": ("tp-example-pro-key", ["chat", "voice"]),
    "enterprise": ("tp-example-enterprise-key", ["chat", "voice", "fast"]),
}
MODEL = "tokenpace-sim"


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


async def drive(url: str, seconds: float, rate: float, max_tokens: int) -> dict:
    """Each tenant sends Poisson arrivals at ``rate`` requests/s for ``seconds``."""
    rng = random.Random(0)
    outcomes: dict[str, list[tuple[str, float]]] = {t: [] for t in PLANS}

    async def tenant(name: str) -> None:
        key, tiers = PLANS[name]
        cycle = itertools.cycle(tiers)
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300
        ) as client:
            tasks = []
            start = time.perf_counter()
            at = rng.expovariate(rate)
            while at < seconds:
                await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
                tasks.append(asyncio.create_task(one(client, next(cycle), max_tokens)))
                at += rng.expovariate(rate)
            outcomes[name] = list(await asyncio.gather(*tasks))

    await asyncio.gather(*(tenant(name) for name in PLANS))
    return outcomes


def report(url: str, outcomes: dict) -> str:
    """Per tenant: requests, QoE (gateway side), TTFT, and its share of output tokens."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    qoe = httpx.get(f"{url}/v1/tokenpace/qoe", headers=headers, timeout=10).json()["tenants"]
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    tokens: dict[str, float] = {}
    ttft_sum: dict[str, float] = {}
    ttft_count: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            tenant = s.labels.get("tenant")
            if s.name == "tokenpace_output_tokens_total":
                tokens[tenant] = tokens.get(tenant, 0.0) + s.value
            elif s.name == "tokenpace_ttft_seconds_sum":
                ttft_sum[tenant] = ttft_sum.get(tenant, 0.0) + s.value
            elif s.name == "tokenpace_ttft_seconds_count":
                ttft_count[tenant] = ttft_count.get(tenant, 0.0) + s.value
    total = sum(tokens.values()) or 1.0
    lines = [
        f"{'tenant':<11} {'weight':>6} {'sent':>5} {'ok':>4} {'avg QoE':>8} "
        f"{'mean TTFT':>10} {'p90 TTFT':>9} {'token share':>12}"
    ]
    weights = {
        t["name"]: t.get("weight", 1)
        for t in yaml.safe_load((HERE / "gateway.yaml").read_text())["tenants"]
    }
    for name, results in outcomes.items():
        ok = [ttft for status, ttft in results if status == "ok"]
        p90 = sorted(ok)[int(0.9 * (len(ok) - 1))] if ok else float("nan")
        mean_qoe = qoe.get(name, {}).get("overall", {}).get("gateway", {})
        mean_qoe = (mean_qoe.get("andes") or {}).get("mean", float("nan"))
        mean_ttft = ttft_sum.get(name, 0.0) / max(ttft_count.get(name, 0.0), 1.0)
        lines.append(
            f"{name:<11} {weights[name]:>6g} {len(results):>5} {len(ok):>4} {mean_qoe:>8.3f} "
            f"{mean_ttft:>9.2f}s {p90:>8.2f}s {tokens.get(name, 0.0) / total:>12.2f}"
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
    args = parser.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with gateway(args.config) as url:
        started = time.perf_counter()
        outcomes = asyncio.run(drive(url, args.seconds, args.rate, args.max_tokens))
        print(f"sent for {args.seconds:g} s, done after {time.perf_counter() - started:.0f} s")
        time.sleep(2 * FLUSH_INTERVAL_S)  # the last streams' QoE records reach the store
        print(report(url, outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
