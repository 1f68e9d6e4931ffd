"""The `tokenpace` command: `serve`, `check-config`, `bench qoe`.

Each subcommand imports its implementation only when it runs, so `tokenpace bench qoe`
needs no server packages and `tokenpace serve` pays nothing for the benchmark's plots.
"""

from __future__ import annotations

import argparse


def _serve(args: argparse.Namespace) -> int:
    from gateway.cli import serve

    return serve(args)


def _check_config(args: argparse.Namespace) -> int:
    from gateway.cli import check_config

    return check_config(args)


def _bench_qoe(args: argparse.Namespace) -> int:
    from tokenpace.bench_qoe import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenpace", description="QoE-aware LLM streaming")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", default=None, help="YAML/TOML file (env TOKENPACE_CONFIG)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(handler=_serve)

    check = commands.add_parser("check-config", help="validate a gateway configuration file")
    check.add_argument("config", help="YAML/TOML file")
    check.set_defaults(handler=_check_config)

    bench = commands.add_parser("bench", help="benchmarks")
    suites = bench.add_subparsers(dest="bench", required=True)
    qoe = suites.add_parser("qoe", help="sweep request rates for policies in the simulator")
    from tokenpace.bench_qoe import add_arguments

    add_arguments(qoe)
    qoe.set_defaults(handler=_bench_qoe)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)
