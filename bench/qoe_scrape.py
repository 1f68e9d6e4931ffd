"""What a QoE summary costs as the records pile up: ``/metrics`` and ``GET
/v1/tokenpace/qoe`` at 10,000, 100,000 and 1,000,000 records in Redis.

Starts a ``redis-server`` on a free loopback port and ``tokenpace serve`` on it (four
tenants, the default tiers, the admin key; ``bench/launch.py``), then fills Redis in
steps through the store's own writes (:meth:`gateway.store.RedisStore.add_qoe`, batches
of 1,000 as the gateway's flush writes them): four records in five from the gateway
side, one from the client side (its request remembered first, as admission does), spread
over the tenants and tiers, each with a QoE, freezes and an idle latency drawn at random.
Every record lands in the default window (``telemetry.window_s``, an hour).

At each step it times ``--calls`` scrapes of ``/metrics`` and calls of
``/v1/tokenpace/qoe`` (every tenant, the admin key), each more than a second after the
last, so that each reads Redis (a summary is reused for a second): wall time per call
and the Redis commands it caused (``INFO commandstats``). ``--baseline DIR`` also runs
the gateway of another checkout on the same Redis (its ``gateway`` package with this
environment, e.g. the commit before the aggregates, which read every record of the
window), interleaved, with a call timeout of ``--baseline-timeout`` seconds. Results:
``OUT/results.json`` and a table on stdout.

Run: ``.venv/bin/python bench/qoe_scrape.py --out results/qoe_scrape``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis
import redis.asyncio as aioredis
from launch import Server, free_port

from gateway.store import QoERecord, RedisStore

ROOT = Path(__file__).resolve().parent.parent
ADMIN = "tp-bench-admin-key-0001"
PREFIX = "bench-qoe"
TENANTS = ("acme", "globex", "initech", "umbrella")
TIERS = ("chat", "voice", "fast")
BATCH = 1000


def gateway_config(port: int, redis_url: str) -> str:
    return json.dumps(
        {
            "server": {"host": "127.0.0.1", "port": port},
            "tenants": [{"name": t, "api_keys": [{"key": f"tp-bench-{t}-0001"}]} for t in TENANTS],
            "admin": {"key": ADMIN},
            "store": {"redis_url": redis_url, "key_prefix": PREFIX, "timeout_s": 5.0},
            "logging": {"level": "WARNING"},
        }
    )


def record(i: int, rng: random.Random) -> QoERecord:
    side = "client" if i % 5 == 0 else "gateway"
    andes = min(1.0, rng.betavariate(8, 1))
    longest = 0.0 if rng.random() < 0.9 else rng.expovariate(1 / 3)
    return QoERecord(
        f"{i:032x}",
        TENANTS[i % len(TENANTS)],
        TIERS[(i // len(TENANTS)) % len(TIERS)],
        side,
        andes,
        andes * rng.uniform(0.8, 1.0),
        "completed",
        displayed_andes=min(1.0, andes + 0.05) if side == "client" else None,
        longest_freeze_s=longest,
        freezes=0 if longest == 0 else rng.randint(1, 5),
        idle_s=rng.expovariate(2.0) + longest,
    )


async def fill(url: str, start: int, end: int, rng: random.Random) -> float:
    """Write records ``start`` .. ``end - 1``; the seconds it took."""
    store = RedisStore(url, PREFIX, timeout_s=30.0)
    owner = aioredis.from_url(url)
    t0 = time.monotonic()
    try:
        for first in range(start, end, BATCH):
            batch = [record(i, rng) for i in range(first, min(first + BATCH, end))]
            pipe = owner.pipeline(transaction=False)
            for rec in batch:
                if rec.side == "client":  # the ownership a client record is checked against
                    pipe.hset(f"{{{PREFIX}}}:req:{rec.request_id}", "tenant", rec.tenant)
            await pipe.execute()
            await store.add_qoe(batch)
    finally:
        await store.aclose()
        await owner.aclose()
    return time.monotonic() - t0


def commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def call(port: int, path: str, timeout: float, client: redis.Redis) -> dict[str, Any]:
    """One call after the summary's reuse has lapsed: wall time, status, Redis commands."""
    time.sleep(1.1)
    before = commands(client)
    t0 = time.monotonic()
    try:
        r = httpx.get(
            f"http://127.0.0.1:{port}{path}",
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=timeout,
        )
        status = r.status_code
    except httpx.TimeoutException:
        status = None
    wall = time.monotonic() - t0
    after = commands(client)
    used = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    used["info"] = used.get("info", 0) - 1  # the INFO above
    return {"wall_s": wall, "status": status, "commands": {k: v for k, v in used.items() if v}}


def summarize(results: dict[str, Any]) -> list[str]:
    lines = [
        "| records | gateway | `/metrics` median (max) | `/v1/tokenpace/qoe` median (max) "
        "| Redis commands per call |",
        "| --- | --- | --- | --- | --- |",
    ]
    for step in results["steps"]:
        for name, calls in step["gateways"].items():
            cells = []
            for path in ("/metrics", "/v1/tokenpace/qoe"):
                walls = [c["wall_s"] for c in calls[path] if c["status"] == 200]
                timed_out = sum(1 for c in calls[path] if c["status"] is None)
                text = (
                    f"{statistics.median(walls) * 1000:,.0f} ms ({max(walls) * 1000:,.0f})"
                    if walls
                    else "–"
                )
                cells.append(text + (f", {timed_out} timed out" if timed_out else ""))
            per_call = calls["/v1/tokenpace/qoe"][0]["commands"]
            cmds = ", ".join(f"{k} {v}" for k, v in sorted(per_call.items()))
            lines.append(f"| {step['records']:,} | {name} | {cells[0]} | {cells[1]} | {cmds} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="10000,100000,1000000", help="records, cumulative")
    p.add_argument("--calls", type=int, default=5, help="calls of each route per step")
    p.add_argument("--baseline", type=Path, metavar="DIR", help="another checkout's gateway")
    p.add_argument("--baseline-timeout", type=float, default=300.0)
    p.add_argument("--baseline-calls", type=int, default=1)
    p.add_argument("--out", default="results/qoe_scrape")
    args = p.parse_args(argv)
    steps = [int(x) for x in args.steps.split(",") if x]
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found (scripts/install-system-deps.sh)")
    tmp = Path(tempfile.mkdtemp(prefix="tokenpace-qoe-scrape-"))
    redis_port = free_port()
    redis_args = [exe, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""]
    redis_srv = Server(
        "redis",
        [*redis_args, "--appendonly", "no", "--dir", str(tmp)],
        port=redis_port,
        ready_path=None,
        log_dir=tmp,
    )
    redis_srv.wait_ready(10.0, interval_s=0.05)
    url = f"redis://127.0.0.1:{redis_port}/0"
    gateways: dict[str, Server] = {}
    sources = [("gateway", ROOT)] + ([("gateway-base", args.baseline)] if args.baseline else [])
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "loadavg_start": os.getloadavg(),
        "steps": [],
    }
    client = redis.Redis(port=redis_port)
    try:
        for name, source in sources:
            port = free_port()
            cfg = tmp / f"{name}.json"
            cfg.write_text(gateway_config(port, url))
            cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)]
            env = {"PYTHONPATH": str(source.resolve())}
            gateways[name] = Server(
                name, cmd, port=port, ready_path="/healthz", log_dir=tmp, env=env, cwd=source
            )
        for g in gateways.values():
            g.wait_ready(60.0)
        rng = random.Random(7)
        written = 0
        for target in steps:
            took = asyncio.run(fill(url, written, target, rng))
            print(f"{target:,} records ({target - written:,} written in {took:.0f} s)", flush=True)
            written = target
            step: dict[str, Any] = {"records": target, "fill_s": took, "gateways": {}}
            for name, g in gateways.items():
                base = name != "gateway"
                n = args.baseline_calls if base else args.calls
                timeout = args.baseline_timeout if base else 60.0
                step["gateways"][name] = {
                    path: [call(g.port, path, timeout, client) for _ in range(n)]
                    for path in ("/metrics", "/v1/tokenpace/qoe")
                }
                print(f"  {name}: {json.dumps(step['gateways'][name])[:300]}", flush=True)
            step["redis_used_memory_mb"] = client.info("memory")["used_memory"] / 2**20
            results["steps"].append(step)
    finally:
        client.close()
        for g in gateways.values():
            g.stop()
        redis_srv.stop()
    results["loadavg_end"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print("\n".join(summarize(results)))
    print(f"results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
