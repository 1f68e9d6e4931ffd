"""What cache-aware routing costs a gateway request, counted in instructions (Cachegrind).

Timed, the gateway's CPU per request (``bench/gateway_load.py --routing``) moves between
runs on a shared VM by more than the router costs. Cachegrind (Valgrind's cache
profiler) counts the instructions a process executes and simulates its caches. Each
figure is a run with ``--requests`` requests less a run with none, alike in all else,
divided by the requests: start-up and the fill cancel out (``PYTHONHASHSEED`` is fixed,
so both build the same index).

- **router**: the router alone in one process, as ``bench/routing_cost.py`` times it: a
  request is routed as admission routes it (``Router.routed``, ``Router.ranked``,
  ``Router.acquire``, the lease released, and the prompt's tokens estimated where routing
  did not, as the completions handler does), two backends. The index is first filled with
  each of ``--index-conversations`` conversations (request k a turn of conversation k:
  ``bench/loadgen.py``'s ``conversation_turn``, ~2.9 KB of prompt), and every measured
  request is the next turn of a random one of them. Per request: instructions and
  simulated first-level and last-level cache misses, for ``least_waiting`` and
  ``cache_aware``, whose difference is what cache-aware routing adds, and whether the
  index's size changes it. No I/O: the counts are the same on every run.
- **gateway**: ``tokenpace serve`` under Cachegrind, ``least_waiting``, two backends (the
  fixed-rate upstream, ``bench/fixed_rate_upstream.py``, under two names, as
  ``bench/gateway_load.py --routing`` runs them); an httpx client in this process sends
  ``--fill`` such turns, then ``--requests`` one-token streamed requests: the
  instructions of a request through the whole gateway, against which the router's are a
  share. The gateway's background work (health checks, flushes) runs by the clock, so
  the run with no requests idles as long as the other's requests took. (Two gateways'
  difference is not taken here: how many reads a reply's chunks arrive in depends on
  how fast each gateway runs under Cachegrind, which moves the count by more than the
  router costs.)

    .venv/bin/python bench/routing_instructions.py --out OUT

Needs Valgrind (Debian: ``apt-get install valgrind``). With the defaults, about 15
minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from gateway_load import BENCH_KEY, UPSTREAM, gateway_config, routing_section
from launch import Server, free_port
from loadgen import conversation_turn
from result_files import save

ROOT = Path(__file__).resolve().parent.parent
MODEL = "tps-0"  # the upstream's as-fast-as-it-can model
POLICIES = ("least_waiting", "cache_aware")
BACKENDS = 2


def turns(conversations: int, requests: int) -> list[list[dict[str, str]]]:
    """The fill (conversation k's turn, for each k), then ``requests`` next turns of
    random ones: the same messages in every run."""
    rng = random.Random(0)
    fill = [conversation_turn(k, rng) for k in range(conversations)]
    return fill + [conversation_turn(rng.randrange(conversations), rng) for _ in range(requests)]


def request(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": MODEL, "stream": True, "max_tokens": 1, "messages": messages}


def summary(path: Path) -> dict[str, int]:
    """Cachegrind's totals: ``Ir`` (instructions), ``D1mr``, ``DLmr``, ... ."""
    events: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("summary:"):
            return dict(zip(events, map(int, line.split()[1:]), strict=True))
    raise RuntimeError(f"{path}: no Cachegrind summary")


def cachegrind(out: Path, cache_sim: bool) -> list[str]:
    return [
        "valgrind",
        "--tool=cachegrind",
        f"--cache-sim={'yes' if cache_sim else 'no'}",
        f"--cachegrind-out-file={out}",
    ]


def child_env() -> dict[str, str]:
    return {"PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}


def server_run(
    tmp: Path, policy: str, up_port: int, fill: int, requests: int, idle_s: float
) -> tuple[dict[str, int], float]:
    """``tokenpace serve`` under Cachegrind, sent the fill, then ``requests`` requests or
    (with none) ``idle_s`` of nothing: its totals, and how long the requests took."""
    name = f"server-{policy}-{requests}"
    port = free_port()
    routing = routing_section(policy, fill, BACKENDS)
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(gateway_config(port, up_port, 16, None, BACKENDS, routing))
    out = tmp / f"{name}.cachegrind"
    serve = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)]
    cmd = cachegrind(out, cache_sim=False) + serve
    server = Server(
        name,
        cmd,
        port=port,
        ready_path="/readyz",
        log_dir=tmp,
        env=child_env(),
        cwd=ROOT,
        stop_grace_s=300.0,
    )
    headers = {"Authorization": f"Bearer {BENCH_KEY}"}
    try:
        server.wait_ready(900.0)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600.0) as client:

            def send(messages: list[dict[str, str]]) -> None:
                r = client.post("/v1/chat/completions", json=request(messages), headers=headers)
                if r.status_code != 200 or b"[DONE]" not in r.content:
                    raise RuntimeError(f"{name}: {r.status_code} {r.text[:300]}")

            sent = turns(fill, requests)
            for messages in sent[:fill]:
                send(messages)
            started = time.monotonic()
            for messages in sent[fill:]:
                send(messages)
            time.sleep(idle_s)
            took = time.monotonic() - started
    finally:
        server.stop()
    return summary(out), took


def router_run(tmp: Path, policy: str, conversations: int, requests: int) -> dict[str, int]:
    """This script's ``--child`` under Cachegrind (cache simulation on): its totals."""
    out = tmp / f"router-{policy}-{conversations}-{requests}.cachegrind"
    child = [sys.executable, __file__, "--child", policy, str(conversations), str(requests)]
    cmd = cachegrind(out, cache_sim=True) + child
    proc = subprocess.run(cmd, env={**os.environ, **child_env()}, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"router run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return summary(out)


def child(policy: str, conversations: int, requests: int) -> None:
    """The router alone: its index filled with ``conversations``, then ``requests``."""
    from routing_cost import IdleBackend, ctx

    from gateway.backends.routing import Router
    from gateway.config.loader import parse_config
    from qos.prompt_tokens import estimate_prompt_tokens

    routing = routing_section(policy, conversations, BACKENDS)
    text = gateway_config(free_port(), free_port(), 16, None, BACKENDS, routing)
    backends = [IdleBackend(f"b{i}", MODEL) for i in range(BACKENDS)]
    router = Router(backends, parse_config(json.loads(text)))
    request_ctx = ctx(MODEL)
    for messages in turns(conversations, requests):
        body = {"model": MODEL, "messages": messages}
        routed = router.routed(body, request_ctx)
        if routed is None:  # the completions handler estimates the prompt's tokens itself
            estimate_prompt_tokens(body)
        router.acquire(router.ranked(MODEL, routed=routed)[0], 1, routed).release()


def per_request(full: dict[str, int], empty: dict[str, int], requests: int) -> dict[str, float]:
    return {k: (full[k] - empty[k]) / requests for k in full}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fill", type=int, default=1000, help="conversations sent to the servers")
    ap.add_argument("--requests", type=int, default=2000, help="requests measured in each run")
    ap.add_argument("--index-conversations", default="1000,100000")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once")
    ap.add_argument("--out", help="folder for results.json (required)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        policy, conversations, requests = args.child
        child(policy, int(conversations), int(requests))
        return
    if not args.out:
        ap.error("--out is required")
    sizes = [int(x) for x in args.index_conversations.split(",") if x]
    if args.fill < 1 or args.requests < 1 or args.jobs < 1 or not sizes or min(sizes) < 1:
        ap.error("--fill, --requests, --jobs and --index-conversations must be >= 1")
    if shutil.which("valgrind") is None:
        sys.exit(
            "routing_instructions: needs Valgrind on the PATH (Debian: apt-get install valgrind)"
        )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="routing-instructions-") as d:
        tmp = Path(d)
        up_port = free_port()
        upstream = [sys.executable, str(UPSTREAM), "--port", str(up_port), "--rate", "1000"]
        up = Server("upstream", upstream, port=up_port, ready_path="/v1/models", log_dir=tmp)
        try:
            up.wait_ready(30.0)
            n = args.requests

            def gateway_pair() -> dict[str, float]:
                full, took = server_run(tmp, "least_waiting", up_port, args.fill, n, 0.0)
                empty, _ = server_run(tmp, "least_waiting", up_port, args.fill, 0, took)
                return per_request(full, empty, n)

            with ThreadPoolExecutor(args.jobs) as pool:
                runs = {  # the largest index first: its runs take longest
                    (p, size, k): pool.submit(router_run, tmp, p, size, k)
                    for size in sorted(sizes, reverse=True)
                    for p in POLICIES[::-1]
                    for k in (n, 0)
                }
                whole = pool.submit(gateway_pair)
            gateway = whole.result()
            router = {
                (p, size): per_request(runs[p, size, n].result(), runs[p, size, 0].result(), n)
                for p in POLICIES
                for size in sizes
            }
        finally:
            up.stop()
    version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout
    added = {
        size: router["cache_aware", size]["Ir"] - router["least_waiting", size]["Ir"]
        for size in sizes
    }
    results = {
        "args": {k: v for k, v in vars(args).items() if k != "child"},
        "valgrind": version.strip(),
        "python": sys.version.split()[0],
        "gateway": gateway,  # least_waiting, per one-token request
        "router": {f"{p}/{size}": r for (p, size), r in router.items()},
        "added_instructions": added,  # by index size (conversations)
        "added_share": {size: a / gateway["Ir"] for size, a in added.items()},
    }
    path = save(results, args.out, started)
    print(f"the whole gateway (least_waiting): {gateway['Ir']:,.0f} instructions a request")
    print()
    print("| router alone, index of | policy | instructions | D1 misses | LL misses |")
    print("| --- | --- | --- | --- | --- |")
    for (p, size), r in router.items():
        d1 = r["D1mr"] + r["D1mw"] + r["I1mr"]
        ll = r["DLmr"] + r["DLmw"] + r["ILmr"]
        print(f"| {size:,} conversations | {p} | {r['Ir']:,.0f} | {d1:,.0f} | {ll:,.0f} |")
    for size, a in added.items():
        share = a / gateway["Ir"]
        print(f"cache_aware adds {a:+,.0f} instructions a request at {size:,} ({share:.1%})")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
