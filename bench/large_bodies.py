"""Another tenant's streams while one tenant sends very large legal chat bodies: the
gateway with its default limits against the same gateway with the limits raised so that
those bodies are parsed, side by side in one run.

The attack: ``--in-flight`` requests at a time, back to back (or, with ``--attack-rate``,
one due every 1/rate s: the same load on both gateways), each a chat body of
``--messages`` short messages (120,000 by default: about 3.7 MB, under the default 4 MiB
``limits.max_body_bytes``), ``max_tokens`` 1, not streamed. With the default limits the
gateway counts the messages on the bytes and answers 400 ``too_many_messages``
(``limits.max_messages`` 2048); with ``limits.max_messages`` and ``limits.max_parts``
raised past the count, it parses and validates every body and relays it upstream.

The victim: another tenant's ``--streams`` concurrent streams of ``--tokens`` tokens at
``--rate`` tokens/s from ``bench/loadgen.py`` (the load generator of "Gateway cost" in
docs/benchmarks.md), recorded over ``--record-s`` seconds after a ramp of one stream
duration: the inter-token gap at the client (time between reads of consecutive chunks;
the upstream emits one every 1/rate s) and the TTFT.

Targets, each its own ``tokenpace serve`` on the same upstream
(``bench/fixed_rate_upstream.py``): ``quiet`` (default limits, no attack: the
reference), ``default`` (default limits, under attack), ``raised`` (raised limits, under
attack). ``--repeats`` rounds with the targets interleaved (every other round in reverse
order). Pinned as in ``bench/gateway_load.py``: upstream, load generator, attacker and
harness on the first half of the CPUs, the gateways on the other. Results:
``OUT/results.json`` and a table on stdout. Run it under ``nice``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from gateway_load import BENCH_KEY, ROOT, UPSTREAM, _cpu_split, _fmt, _machine, _run_loadgen, _say
from launch import Server, free_port
from loadgen import LoadSpec
from result_files import save

ATTACKER_KEY = "tp-bench-attacker-0001"
TARGETS = ("quiet", "default", "raised")


def gateway_config(port: int, upstream_port: int, raised: int | None) -> str:
    """Two tenants on one plain HTTP backend, WARNING logs; ``raised``: the message and
    part limits set to it (else the defaults)."""
    limits = {"limits": {"max_messages": raised, "max_parts": raised}} if raised else {}
    return json.dumps(
        {
            **limits,
            "server": {"host": "127.0.0.1", "port": port},
            "tenants": [
                {"name": "victim", "api_keys": [{"key": BENCH_KEY}]},
                {"name": "attacker", "api_keys": [{"key": ATTACKER_KEY}]},
            ],
            "backends": [
                {
                    "name": "upstream",
                    "url": f"http://127.0.0.1:{upstream_port}/v1",
                    "models": ["*"],
                    "tokenpace": False,
                }
            ],
            "logging": {"level": "WARNING"},
        },
        indent=2,
    )


def large_body(messages: int) -> bytes:
    """A legal chat body of ``messages`` short user messages, ``max_tokens`` 1."""
    body = {
        "model": "tps-0",
        "messages": [{"role": "user", "content": "hi"}] * messages,
        "max_tokens": 1,
    }
    return json.dumps(body, separators=(",", ":")).encode()


async def attack(
    url: str, messages: int, in_flight: int, rate: float, seconds: float
) -> dict[str, Any]:
    """``in_flight`` senders of large bodies for ``seconds``: back to back, or with
    ``rate`` > 0 one due every 1/rate s (a sender that is late sends at once)."""
    body = large_body(messages)
    statuses: dict[str, int] = {}
    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {ATTACKER_KEY}", "Content-Type": "application/json"}
    start = time.monotonic()
    end = start + seconds
    due = [start]  # the next body's send time, shared by the senders
    limits = httpx.Limits(max_connections=in_flight)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as c:

        async def sender() -> None:
            while time.monotonic() < end:
                if rate > 0:
                    at, due[0] = due[0], due[0] + 1 / rate
                    if at >= end:
                        return
                    await asyncio.sleep(max(0.0, at - time.monotonic()))
                sent = time.monotonic()
                try:
                    r = await c.post("/v1/chat/completions", content=body)
                    status = str(r.status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                latencies.append(time.monotonic() - sent)
                statuses[status] = statuses.get(status, 0) + 1

        await asyncio.gather(*(sender() for _ in range(in_flight)))
    return {
        "body_bytes": len(body),
        "seconds": seconds,
        "requests": len(latencies),
        "statuses": statuses,
        "latency_s_p50": statistics.median(latencies) if latencies else None,
    }


class Run:
    """The upstream and the three gateways, one round after another."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.harness_cpus, self.proxy_cpus = _cpu_split(not args.no_pin)
        if self.harness_cpus:
            os.sched_setaffinity(0, self.harness_cpus)
        self.tmp = Path(tempfile.mkdtemp(prefix="tokenpace-bench-"))
        self.servers: dict[str, Server] = {}

    def start(self) -> None:
        up_port = free_port()
        cmd = [sys.executable, str(UPSTREAM), "--port", str(up_port), "--rate", "25"]
        self._launch("upstream", cmd, up_port, "/v1/models", self.harness_cpus)
        for name, raised in (("default", None), ("raised", self.args.messages + 1)):
            port = free_port()
            cfg = self.tmp / f"{name}.json"
            cfg.write_text(gateway_config(port, up_port, raised))
            cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)]
            self._launch(name, cmd, port, "/readyz", self.proxy_cpus)
        for s in self.servers.values():
            s.wait_ready(60.0)

    def _launch(self, name: str, cmd: list[str], port: int, ready: str, cpus: Any) -> None:
        env = {"PYTHONPATH": str(ROOT)}
        self.servers[name] = Server(
            name, cmd, port=port, ready_path=ready, log_dir=self.tmp, cpus=cpus, env=env, cwd=ROOT
        )

    def settle(self, max_s: float = 30.0) -> None:
        """Until every server used under 5 % of a CPU over two half seconds in a row."""
        start, quiet = time.monotonic(), 0
        while quiet < 2 and time.monotonic() - start < max_s:
            before = sum(s.cpu_s() for s in self.servers.values())
            time.sleep(0.5)
            busy = sum(s.cpu_s() for s in self.servers.values()) - before >= 0.025
            quiet = 0 if busy else quiet + 1

    def one(self, target: str) -> dict[str, Any]:
        a = self.args
        gateway = self.servers["default" if target == "quiet" else target]
        duration = a.tokens / a.rate
        spec = LoadSpec(
            host="127.0.0.1",
            port=gateway.port,
            key=BENCH_KEY,
            model=f"tps-{a.rate:g}",
            tokens=a.tokens,
            concurrency=a.streams,
            ramp_s=duration,
            record_s=a.record_s,
            stop_s=duration + a.record_s,
            cut_s=2 * duration + a.record_s + 5.0,
            window=(duration, duration + a.record_s),
        )
        self.settle()
        attacker = None
        if target != "quiet":
            seconds = 2 * duration + a.record_s + 2.0
            cmd = [sys.executable, __file__, "--attack", f"http://127.0.0.1:{gateway.port}"]
            cmd += ["--messages", str(a.messages), "--in-flight", str(a.in_flight)]
            cmd += ["--attack-rate", str(a.attack_rate)]
            cmd += ["--attack-s", str(seconds)]
            attacker = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            if self.harness_cpus:
                os.sched_setaffinity(attacker.pid, self.harness_cpus)
            time.sleep(1.0)  # the first bodies in flight
        cpu0 = gateway.cpu_s()
        res = _run_loadgen(spec, self.harness_cpus)
        res["gateway_cpu_s"] = gateway.cpu_s() - cpu0
        if attacker is not None:
            out, _ = attacker.communicate(timeout=120)
            res["attack"] = json.loads(out)
        return res

    def stop(self) -> None:
        for s in reversed(list(self.servers.values())):
            s.stop()


def _mean(runs: list[dict[str, Any]], key: str, p: str) -> float:
    return statistics.mean((r[key] or {}).get(p, 0.0) for r in runs)


def _attack(runs: list[dict[str, Any]]) -> str:
    attacks = [r["attack"] for r in runs if "attack" in r]
    if not attacks:
        return "none"
    per_s = statistics.mean(x["requests"] / x["seconds"] for x in attacks)
    statuses: dict[str, int] = {}
    for x in attacks:
        for k, v in x["statuses"].items():
            statuses[k] = statuses.get(k, 0) + v
    return f"{per_s:.1f} ({', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))})"


def summarize(runs: dict[str, list[dict[str, Any]]], rate: float) -> list[str]:
    """One row per target: means over the repeats (a repeat's percentiles are over its
    recorded streams), with each repeat's gap p99."""
    lines = [
        f"| target | victim inter-token gap p50 / p99 / max ms (every {1000 / rate:g} ms "
        "upstream) | gap p99 per repeat | victim delivery delay p50 / p99 ms | victim TTFT "
        "p50 / p99 ms | victim streams failed / started | attack bodies answered per s "
        "(statuses) | gateway CPU s per repeat |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t, rs in runs.items():
        gap = " / ".join(_fmt(_mean(rs, "gap_ms", p)) for p in ("p50", "p99", "max"))
        per = " · ".join(_fmt((r["gap_ms"] or {}).get("p99")) for r in rs)
        delay = " / ".join(_fmt(_mean(rs, "delay_ms", p)) for p in ("p50", "p99"))
        ttft = " / ".join(_fmt(_mean(rs, "ttft_ms", p)) for p in ("p50", "p99"))
        failed = f"{sum(r['errors'] for r in rs)} / {sum(r['streams_started'] for r in rs)}"
        cpu = statistics.mean(r["gateway_cpu_s"] for r in rs)
        lines.append(
            f"| {t} | {gap} | {per} | {delay} | {ttft} | {failed} | {_attack(rs)} | {cpu:.1f} |"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    bench = Run(args)
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in TARGETS}
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "machine": _machine(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("attack", "table", "out")},
    }
    try:
        bench.start()
        for i in range(args.repeats):
            for t in TARGETS if i % 2 == 0 else TARGETS[::-1]:
                runs[t].append(r := bench.one(t))
                gap = r["gap_ms"] or {}
                _say(
                    out,
                    f"round {i + 1} {t}: gap p50 {_fmt(gap.get('p50'))} p99 "
                    f"{_fmt(gap.get('p99'))} ms, errors {r['errors']}, attack "
                    f"{r.get('attack', {}).get('statuses', '-')}",
                )
    finally:
        bench.stop()
    results["runs"] = runs
    path = save(results, args.out, started)
    _say(out, "\n" + "\n".join(summarize(runs, args.rate)))
    _say(out, f"results: {path} ({results['wall_s']:.0f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Another tenant's gaps beside very large bodies.")
    p.add_argument("--messages", type=int, default=120_000, help="messages per large body")
    p.add_argument("--in-flight", type=int, default=4, help="large bodies sent at a time")
    p.add_argument(
        "--attack-rate", type=float, default=0.0, help="large bodies per s (0: back to back)"
    )
    p.add_argument("--streams", type=int, default=8, help="the victim's concurrent streams")
    p.add_argument("--tokens", type=int, default=100, help="tokens per victim stream")
    p.add_argument("--rate", type=float, default=25.0, help="tokens/s per victim stream")
    p.add_argument("--record-s", type=float, default=10.0, help="victim streams recorded, s")
    p.add_argument("--repeats", type=int, default=3, help="rounds, the targets interleaved")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--attack", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--attack-s", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--table", metavar="RESULTS", help="print the table of a results.json")
    p.add_argument("--out", default="results/large_bodies")
    args = p.parse_args(argv)
    if args.table:
        done = json.loads(Path(args.table).read_text())
        print("\n".join(summarize(done["runs"], done["settings"]["rate"])))
        return 0
    if args.attack:
        result = asyncio.run(
            attack(args.attack, args.messages, args.in_flight, args.attack_rate, args.attack_s)
        )
        print(json.dumps(result), flush=True)
        return 0
    if args.repeats < 1:
        p.error("--repeats: must be at least 1")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
