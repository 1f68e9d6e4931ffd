"""The `tokenpace` command: `serve`, `check-config`, `hash-key`, `keys`, `bench qoe`.

The gateway commands come from gateway.cli; the benchmark's module (matplotlib, tqdm)
is imported only when `bench qoe` runs.
"""

from __future__ import annotations

import argparse


def _bench_qoe(args: argparse.Namespace) -> int:
    from tokenpace.bench_qoe import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    from gateway.cli import add_gateway_commands, add_version_flag

    parser = argparse.ArgumentParser(prog="tokenpace", description="QoE-aware LLM streaming")
    add_version_flag(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    add_gateway_commands(commands)  # serve, check-config, hash-key, keys: set `func`

    bench = commands.add_parser("bench", help="benchmarks")
    suites = bench.add_subparsers(dest="bench", required=True)
    qoe = suites.add_parser("qoe", help="sweep request rates for policies in the simulator")
    from tokenpace.bench_qoe import add_arguments

    add_arguments(qoe)
    qoe.set_defaults(handler=_bench_qoe)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = getattr(args, "handler", None) or args.func
    return int(handler(args) or 0)
