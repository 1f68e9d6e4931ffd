"""What OpenTelemetry tracing costs the gateway per request: off, on, and the gateway of a
checkout from before tracing existed, side by side in one run.

The per-request phase of ``bench/gateway_load.py`` ("Gateway cost" in
docs/benchmarks.md), with its servers, pinning and load generator: streams of one token,
``--request-concurrency`` at a time; a target's CPU per request is its process tree's
CPU seconds over ``--requests`` of them ÷ the requests completed, and its own work is
that minus the stack floor's in the same repeat. Targets:

- ``floor``: the stack floor (``bench/stack_floor.py``);
- ``gateway-base``: the ``gateway`` package of ``--baseline DIR`` (a git worktree of the
  commit before tracing) run with this environment;
- ``gateway-NAME``, for each ``--checkout NAME=DIR``: another checkout's gateway, tracing
  off (e.g. the commit that added tracing, to tell its cost from later changes);
- ``gateway``: this checkout, tracing off (no ``OTEL_*`` endpoint);
- ``gateway-traced``: this checkout with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set to an OTLP/HTTP
  sink on the harness's CPUs that reads each export and answers 200 (spans are built,
  batched, encoded and sent; ``OTEL_BSP_SCHEDULE_DELAY`` 200 ms, so the exports of a
  run fall inside it).

``--repeats`` rounds, the targets interleaved (every other round in reverse order), each
run after the servers went idle. Results: ``OUT/results.json`` and a table on stdout.
Run it under ``nice``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from gateway_load import (
    ROOT,
    Bench,
    RssSampler,
    _fmt,
    _machine,
    _say,
    gateway_config,
)
from launch import Server, free_port
from result_files import save

TARGETS = ("floor", "gateway-base", "gateway", "gateway-traced")
SINK_PATH = "/count"


class _SinkHandler(BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver that keeps nothing: reads each export, answers 200."""

    exports = 0
    received = 0

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(size)
        type(self).exports += 1
        type(self).received += size
        self._answer(b"", "application/x-protobuf")

    def do_GET(self) -> None:
        counts = {"exports": type(self).exports, "bytes": type(self).received}
        self._answer(json.dumps(counts).encode(), "application/json")

    def _answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve_sink(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), _SinkHandler).serve_forever()


class TracingBench(Bench):
    """Bench's floor, gateway and baseline gateway, plus the traced gateway and its sink."""

    def start_checkout(self, name: str, source: Path) -> None:
        """The gateway of the checkout at ``source`` as ``name``, run with this environment."""
        port = free_port()
        cfg = self.tmp / f"{name}.yaml"
        cfg.write_text(gateway_config(port, self.ports["upstream"], 2 * max(self.args.ns)))
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)]
        env = {"PYTHONPATH": str(source)}
        self.launch(name, cmd, port, "/readyz", self.proxy_cpus, env=env, source=source)
        self.servers[name].wait_ready(60.0)

    def start_traced(self) -> None:
        sink_port = free_port()
        cmd = [sys.executable, __file__, "--sink", str(sink_port)]
        self.sink = Server(
            "otlp-sink",
            cmd,
            port=sink_port,
            ready_path=SINK_PATH,
            log_dir=self.tmp,
            cpus=self.harness_cpus,
        )
        self.sink.wait_ready(30.0)
        port = free_port()
        cfg = self.tmp / "gateway-traced.yaml"
        cfg.write_text(gateway_config(port, self.ports["upstream"], 2 * max(self.args.ns)))
        env = {
            "PYTHONPATH": str(ROOT),
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg)]
        self.launch("gateway-traced", cmd, port, "/readyz", self.proxy_cpus, env=env)
        self.servers["gateway-traced"].wait_ready(60.0)
        assert self.sampler is not None
        self.sampler.close()
        self.sampler = RssSampler([s for n, s in self.servers.items() if n != "upstream"])

    def exports(self) -> dict[str, int]:
        counts: dict[str, int] = httpx.get(f"http://127.0.0.1:{self.sink.port}{SINK_PATH}").json()
        return counts

    def stop(self) -> None:
        super().stop()
        if getattr(self, "sink", None) is not None:
            self.sink.stop()


def _own(runs: dict[str, list[dict[str, Any]]], target: str) -> list[float]:
    """The target's CPU ms per request minus the floor's, repeat by repeat."""
    pairs = zip(runs[target], runs["floor"], strict=True)
    return [g["cpu_ms_per_request"] - f["cpu_ms_per_request"] for g, f in pairs]


def _spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} (median {statistics.median(values):.3f}; " + (
        " · ".join(f"{v:.3f}" for v in values) + ")"
    )


def summarize(runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| target | CPU ms per request: mean (median; per repeat) | own CPU ms per request "
        "(− floor, same repeat) | TTFT p50 / p99 ms (median of repeats) | errors |",
        "| --- | --- | --- | --- | --- |",
    ]
    for t, rs in runs.items():
        cpu = _spread([r["cpu_ms_per_request"] for r in rs])
        own = "" if t == "floor" else _spread(_own(runs, t))
        p50 = statistics.median((r["ttft_ms"] or {}).get("p50", 0.0) for r in rs)
        p99 = statistics.median((r["ttft_ms"] or {}).get("p99", 0.0) for r in rs)
        errors = sum(r["errors"] for r in rs)
        lines.append(f"| {t} | {cpu} | {own} | {_fmt(p50)} / {_fmt(p99)} | {errors} |")
    for t in runs:
        if t.startswith("gateway") and t != "gateway-base" and "gateway-base" in runs:
            pairs = zip(runs[t], runs["gateway-base"], strict=True)
            diff = [a["cpu_ms_per_request"] - b["cpu_ms_per_request"] for a, b in pairs]
            lines.append(f"\n{t} − gateway-base, per repeat (ms per request): {_spread(diff)}")
    return lines


def run(args: argparse.Namespace) -> int:
    out = sys.stdout
    bench_args = argparse.Namespace(
        no_pin=args.no_pin,
        ns=[args.warm_streams],
        rate=25.0,
        redis=False,
        workers=[1],
        baseline=args.baseline,
        requests=args.requests,
        request_concurrency=args.request_concurrency,
    )
    bench = TracingBench(bench_args)
    targets = [t for t in args.targets.split(",") if t]
    others = [name for name, _ in args.checkout]
    targets = targets[:2] + others + targets[2:] if "gateway-base" in targets else targets
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in targets}
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "machine": _machine(),
        "settings": {
            "requests": args.requests,
            "request_concurrency": args.request_concurrency,
            "repeats": args.repeats,
            "baseline": str(args.baseline.resolve()),
            "checkouts": {name: str(source.resolve()) for name, source in args.checkout},
        },
    }
    try:
        bench.start(["gateway", "floor"], None)
        for name, source in args.checkout:
            bench.start_checkout(name, source)
        if "gateway-traced" in targets:
            bench.start_traced()
        for t in targets:
            _say(out, f"warming up {t}")
            bench.warm_up(t)
        for i in range(args.repeats):
            for t in targets if i % 2 == 0 else targets[::-1]:
                runs[t].append(r := bench.per_request(t))
                _say(
                    out,
                    f"round {i + 1} {t}: {_fmt(r.get('cpu_ms_per_request'), '.3f')} ms CPU per "
                    f"request, {r['streams_completed']} completed, errors {r['errors']}",
                )
        if "gateway-traced" in targets:
            time.sleep(1.0)  # the last batch
            results["otlp_sink"] = bench.exports()
    finally:
        bench.stop()
    results["runs"] = runs
    path = save(results, args.out, started)
    _say(out, "\n" + "\n".join(summarize(runs)))
    if "otlp_sink" in results:
        _say(out, f"OTLP sink: {results['otlp_sink']}")
    _say(out, f"results: {path} ({results['wall_s']:.0f} s)")
    return 0


def _checkout(value: str) -> tuple[str, Path]:
    name, _, source = value.partition("=")
    if not name or not source:
        raise argparse.ArgumentTypeError(f"{value!r}: expected NAME=DIR")
    return f"gateway-{name}", Path(source)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Gateway CPU per request: tracing off, on, before.")
    p.add_argument("--baseline", type=Path, help="a checkout of the gateway before tracing")
    p.add_argument(
        "--checkout",
        action="append",
        default=[],
        type=_checkout,
        metavar="NAME=DIR",
        help="also measure this checkout's gateway as gateway-NAME (repeatable)",
    )
    p.add_argument("--targets", default=",".join(TARGETS), help="subset of " + ",".join(TARGETS))
    p.add_argument("--requests", type=int, default=3000, help="one-token requests per run")
    p.add_argument("--request-concurrency", type=int, default=8)
    p.add_argument("--repeats", type=int, default=4, help="rounds, the targets interleaved")
    p.add_argument("--warm-streams", type=int, default=64, help="streams of the warm-up")
    p.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    p.add_argument("--sink", type=int, metavar="PORT", help=argparse.SUPPRESS)
    p.add_argument("--out", default="results/tracing_cost")
    args = p.parse_args(argv)
    if args.sink is not None:
        serve_sink(args.sink)
        return 0
    if args.baseline is None or args.repeats < 1:
        p.error("--baseline DIR is required, and --repeats must be at least 1")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
