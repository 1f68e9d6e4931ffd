"""Soak: N concurrent streams for T minutes through one gateway; errors, TTFT, RSS, fds.

Starts, on free loopback ports, the fixed-rate upstream (``bench/fixed_rate_upstream.py``,
``--rate`` tokens/s) and one gateway (``tokenpace serve`` with a generated configuration:
one tenant, one HTTP backend, WARNING logging), then keeps ``--streams`` slots busy:
each slot runs streams of ``--tokens`` tokens back to back on its own keep-alive
connection (starts staggered over one stream duration). A warm-up of ``--warmup``
minutes, then ``--minutes`` minutes measured, then the slots finish their streams and
close, and the gateway is left idle for ``--settle`` seconds.

Reported (stdout and ``--out``/soak.json):

- errors: streams that did not end with ``[DONE]`` after exactly their tokens, a status
  other than 200, an in-stream error event, a connection lost, no end within 120 s (by
  kind: ``bench/loadgen.py``);
- TTFT (request written → first content chunk read) p50/p99 of the streams started in
  the first and in the last minute of the measured period;
- the gateway's RSS and open file descriptors at start (before any load), at their
  peak, after the warm-up, and after the run (once settled). Targets: 0 errors; RSS
  after within 20 % of RSS after the warm-up; fds back to the start value.

The load generator (``bench/loadgen.py``: asyncio, uvloop when installed, httptools'
response parser, a few µs a chunk) runs in this process, sharing the machine's CPUs
with the gateway; the upstream and the gateway are processes of ``bench/launch.py``.
``--source DIR`` runs the gateway of another checkout (e.g. an older commit, in a git
worktree) with this environment, for a before/after comparison.

Run: ``python bench/soak.py --streams 1000 --minutes 5`` (about 7 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml
from launch import Server, free_port
from loadgen import LoadSpec, run_load

ROOT = Path(__file__).resolve().parent.parent
KEY = "tp-soak-key-0001"
MODEL = "bench"


def start_upstream(rate: float, workdir: Path) -> Server:
    port = free_port()
    cmd = [sys.executable, str(ROOT / "bench/fixed_rate_upstream.py"), "--port", str(port)]
    server = Server(
        "upstream", [*cmd, "--rate", str(rate)], port=port, ready_path="/health", log_dir=workdir
    )
    server.wait_ready(30.0, interval_s=0.1)
    return server


def start_gateway(upstream: Server, streams: int, source: Path, workdir: Path) -> Server:
    port = free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "tenants": [{"name": "soak", "api_keys": [KEY], "max_queued": 0}],
        "backends": [
            {
                "name": "up",
                "url": f"http://127.0.0.1:{upstream.port}/v1",
                "models": [MODEL],
                "health_path": "/health",
                "max_connections": streams,  # one upstream connection per stream
            }
        ],
        "logging": {"level": "WARNING"},
    }
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    server = Server(
        "gateway",
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        port=port,
        ready_path="/healthz",
        log_dir=workdir,
        env={"PYTHONPATH": str(source)},
        cwd=source,
    )
    server.wait_ready(30.0, interval_s=0.1)
    return server


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int


async def sampler(proc: psutil.Process, out: list[Sample], t0: float) -> None:
    while True:
        out.append(Sample(time.monotonic() - t0, proc.memory_info().rss / 2**20, proc.num_fds()))
        await asyncio.sleep(1.0)


def ttft_stats(ttfts: list[float | None]) -> dict[str, Any]:
    """TTFT p50 and p99 (ms) of streams, as many as were started."""
    seen = [s for s in ttfts if s is not None]
    if not seen:
        return {"streams": len(ttfts)}
    p50, p99 = np.percentile(seen, [50, 99])
    return {"streams": len(ttfts), "p50_ms": round(p50 * 1e3, 1), "p99_ms": round(p99 * 1e3, 1)}


async def soak(args: argparse.Namespace, gateway: Server) -> dict[str, Any]:
    gw = gateway.ps
    warm_s = args.warmup * 60
    end_s = warm_s + args.minutes * 60
    spec = LoadSpec(
        host="127.0.0.1",
        port=gateway.port,
        key=KEY,
        model=MODEL,
        tokens=args.tokens,
        concurrency=args.streams,
        ramp_s=args.tokens / args.rate,  # starts staggered over one stream's duration
        record_s=0.0,
        stop_s=end_s,
        stream_timeout_s=120.0,
        keep_streams=True,
    )
    samples: list[Sample] = []
    t0 = time.monotonic()
    start = Sample(0.0, gw.memory_info().rss / 2**20, gw.num_fds())
    sampling = asyncio.create_task(sampler(gw, samples, t0))
    running = asyncio.create_task(run_load(spec))
    await asyncio.sleep(max(0.0, t0 + warm_s - time.monotonic()))
    after_warmup = Sample(time.monotonic() - t0, gw.memory_info().rss / 2**20, gw.num_fds())
    load = await running
    finished = time.monotonic()
    await asyncio.sleep(args.settle)
    after = Sample(time.monotonic() - t0, gw.memory_info().rss / 2**20, gw.num_fds())
    sampling.cancel()
    # (start, TTFT, why it failed) of every stream, seconds from the load's start
    measured = [s for s in load["streams"] if warm_s <= s[0] < end_s]
    first = [ttft for started, ttft, _ in measured if started < warm_s + 60]
    last = [ttft for started, ttft, _ in measured if started >= end_s - 60]
    errors = sum(load["error_kinds"].values())
    peak_rss = max(s.rss_mib for s in samples)
    peak_fds = max(s.fds for s in samples)
    return {
        "streams": args.streams,
        "minutes": args.minutes,
        "warmup_minutes": args.warmup,
        "tokens": args.tokens,
        "rate": args.rate,
        "completed": load["streams_started"],
        "errors": errors,
        "error_kinds": load["error_kinds"],
        "drain_s": round(finished - (t0 + end_s), 1),
        "ttft_first_minute": ttft_stats(first),
        "ttft_last_minute": ttft_stats(last),
        "rss_mib": {
            "start": round(start.rss_mib, 1),
            "peak": round(peak_rss, 1),
            "after_warmup": round(after_warmup.rss_mib, 1),
            "after": round(after.rss_mib, 1),
        },
        "fds": {
            "start": start.fds,
            "peak": peak_fds,
            "after_warmup": after_warmup.fds,
            "after": after.fds,
        },
        "targets": {
            "no_errors": errors == 0,
            "rss_within_20pct": abs(after.rss_mib - after_warmup.rss_mib)
            <= 0.2 * after_warmup.rss_mib,
            "fds_back": after.fds <= start.fds,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--streams", type=int, default=1000, help="concurrent streams")
    p.add_argument("--minutes", type=float, default=5.0, help="measured minutes")
    p.add_argument("--warmup", type=float, default=1.0, help="warm-up minutes")
    p.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    p.add_argument("--rate", type=float, default=10.0, help="tokens/s per stream")
    p.add_argument("--settle", type=float, default=10.0, help="idle seconds before 'after'")
    p.add_argument("--source", type=Path, default=ROOT, help="checkout whose gateway runs")
    p.add_argument("--out", type=Path, help="directory for soak.json")
    args = p.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with tempfile.TemporaryDirectory(prefix="tokenpace-soak-") as tmp:
        upstream = start_upstream(args.rate, Path(tmp))
        servers = [upstream]
        try:
            gateway = start_gateway(upstream, args.streams, args.source.resolve(), Path(tmp))
            servers.append(gateway)
            result = asyncio.run(soak(args, gateway))
        finally:
            for server in reversed(servers):
                server.stop()
    result["source"] = str(args.source.resolve())
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.json").write_text(text + "\n")
    return 0 if all(result["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
