"""``tokenpace serve``, ``tokenpace check-config`` and ``tokenpace hash-key``.

The top-level ``tokenpace`` command (tokenpace/cli.py) mounts these with
:func:`add_gateway_commands`; each sub-parser sets ``func`` to a callable taking the
parsed ``argparse.Namespace`` and returning an exit code. :func:`serve` and
:func:`check_config` take an argv list for direct use, and ``python -m gateway.cli``
works on its own.

Without ``--config`` (or ``$TOKENPACE_CONFIG``), ``serve`` starts the demo
configuration: one tenant ``demo`` with a fresh key (or ``$TOKENPACE_DEMO_KEY``), a fresh
admin key (or ``$TOKENPACE_ADMIN_KEY``) and the embedded simulated engine
(:mod:`gateway.backends.embedded`, model ``tokenpace-sim``) as the backend. It prints the keys,
the URLs of the web pages and ready-to-paste curl and openai examples.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from gateway.backends.serveability import unservable_tiers
from gateway.config.loader import demo_config, load_config
from gateway.config.schema import (
    CONFIG_ENV,
    DEMO_MODEL,
    ConfigError,
    GatewayConfig,
    hash_key,
    new_api_key,
)
from gateway.http.pages import PAGES, is_built

DEMO_KEY_ENV = "TOKENPACE_DEMO_KEY"
ADMIN_KEY_ENV = "TOKENPACE_ADMIN_KEY"


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"YAML or TOML configuration (default: ${CONFIG_ENV}, else the demo configuration)",
    )
    p.add_argument("--host", help="interface to listen on (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: server.port, 8080)")
    p.add_argument("--log-json", action="store_true", default=None, help="JSON log lines")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="gateway processes serving the port (default 1; N > 1 needs store.redis_url)",
    )


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _add_check_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="YAML or TOML configuration to validate")


def _add_hash_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("key", nargs="?", help="the API key (default: read one line from stdin)")


def add_gateway_commands(subparsers: Any) -> None:
    """Add ``serve``, ``check-config`` and ``hash-key`` to an argparse sub-parser set."""
    p = subparsers.add_parser(
        "serve", help="run the gateway", description="Run the OpenAI-compatible gateway."
    )
    _add_serve_args(p)
    p.set_defaults(func=_serve_ns)
    p = subparsers.add_parser(
        "check-config",
        help="validate a gateway configuration",
        description="Validate a configuration file; errors name the bad key.",
    )
    _add_check_args(p)
    p.set_defaults(func=_check_ns)
    p = subparsers.add_parser(
        "hash-key",
        help="print the key_sha256 of an API key",
        description="Print the SHA-256 digest to store as api_keys[].key_sha256.",
    )
    _add_hash_args(p)
    p.set_defaults(func=_hash_ns)


# ---------------------------------------------------------------------------------
# serve


def _display_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _pages(url: str) -> list[str]:
    if not is_built():
        return ["  web pages (/demo, /dashboard): not built; run `make webui`"]
    demo, dashboard = (f"{url}{route}" for route in PAGES)
    return [f"  demo page:  {demo}", f"  dashboard:  {dashboard} (the admin key)"]


def banner(
    config: GatewayConfig, url: str, demo_key: str | None, admin_key: str | None = None
) -> str:
    """What ``serve`` prints: where it listens, its pages and, for the demo, how to call it."""
    models = [m for b in config.backends for m in b.models if m != "*"]
    model = models[0] if models else DEMO_MODEL
    lines = [f"tokenpace gateway listening on {url}"]
    lines.append(
        f"  {len(config.tenants)} tenant(s), {len(config.backends)} backend(s), "
        f"tiers: {', '.join(config.tiers)}"
    )
    if not config.backends:
        lines.append("  note: no backend configured; /readyz answers 503 and requests 404")
    lines += _pages(url)
    if any(b.kind == "embedded" for b in config.backends):
        lines.append(
            "  backend: the embedded SIMULATED engine (qos.sim, Andes): placeholder text, "
            "no model runs"
        )
    if demo_key is None:
        return "\n".join(lines)
    payload = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "stream": True}
    )
    lines += [
        "",
        "Demo configuration (no --config given):",
        "  tenant: demo",
        f"  API key: {demo_key}",
        *([f"  admin key (dashboard): {admin_key}"] if admin_key else []),
        "",
        "curl:",
        f"  curl -N {url}/v1/chat/completions \\",
        f'    -H "Authorization: Bearer {demo_key}" \\',
        '    -H "Content-Type: application/json" -H "X-TokenPace-Tier: chat" \\',
        f"    -d '{payload}'",
        "",
        "python (pip install openai):",
        "  from openai import OpenAI",
        f'  client = OpenAI(base_url="{url}/v1", api_key="{demo_key}")',
        "  stream = client.chat.completions.create(",
        f'      model="{model}",',
        '      messages=[{"role": "user", "content": "Hello!"}],',
        "      stream=True,",
        '      extra_body={"tokenpace": {"tier": "voice"}},',
        "  )",
        "  for chunk in stream:",
        "      if chunk.choices:",
        '          print(chunk.choices[0].delta.content or "", end="", flush=True)',
    ]
    return "\n".join(lines)


def load_serve_config(
    config_path: str | None,
) -> tuple[GatewayConfig, str | None, str | None]:
    """The configuration ``serve`` runs: the file, else the demo (and its two keys)."""
    path = config_path or os.environ.get(CONFIG_ENV) or None
    if path:
        return load_config(path), None, None
    admin_key = os.environ.get(ADMIN_KEY_ENV) or new_api_key("tp-admin-")
    config, key = demo_config(os.environ.get(DEMO_KEY_ENV) or None, admin_key=admin_key)
    return config, key, admin_key


def _serve_ns(ns: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.runtime.server import freeze_startup_objects, listen, uvicorn_config
    from gateway.telemetry.logs import setup_logging

    try:
        config, demo_key, admin_key = load_serve_config(ns.config)
    except ConfigError as exc:
        print(f"tokenpace serve: {exc}", file=sys.stderr)
        return 2
    host = ns.host or config.server.host
    port = ns.port if ns.port is not None else config.server.port
    json_logs = config.logging.json_logs if ns.log_json is None else ns.log_json
    level = ns.log_level or config.logging.level
    setup_logging(json_logs=json_logs, level=level)
    try:
        if ns.workers > 1:  # the app is built in each worker (gateway.runtime.workers)
            from gateway.runtime.workers import WorkerPool

            pool = WorkerPool(config, ns.workers, log_json=json_logs, log_level=level)
        else:
            app = create_app(config)
    except ConfigError as exc:  # backend options are checked when the backend is built
        print(f"tokenpace serve: {exc}", file=sys.stderr)
        return 2
    try:
        sockets = [listen(host, port)]
        if config.metrics.port is not None:
            sockets.append(listen(host, config.metrics.port))
    except OSError as exc:
        print(f"tokenpace serve: cannot listen on {host}: {exc}", file=sys.stderr)
        return 2
    url = f"http://{_display_host(host)}:{port}"
    print(banner(config, url, demo_key, admin_key), flush=True)
    for warning in unservable_tiers(config):
        logging.getLogger("tokenpace.gateway").warning("%s", warning)
    m = config.metrics
    if m.port is None and m.token_sha256 is None and host not in ("127.0.0.1", "::1", "localhost"):
        print(
            f"tokenpace serve: warning: /metrics (tenant names, per-tenant QoE) is open to "
            f"anyone who reaches {host}:{port}; set metrics.port or metrics.token",
            file=sys.stderr,
        )
    if ns.workers > 1:
        return pool.run(sockets)
    freeze_startup_objects()
    server = uvicorn.Server(uvicorn_config(app, config, log_level=level.lower()))
    server.run(sockets=sockets)
    return 0


def serve(argv: Sequence[str] | None = None) -> int:
    """``tokenpace serve [--config FILE] [--host H] [--port P] [--workers N]``; the exit code."""
    p = argparse.ArgumentParser(prog="tokenpace serve", description="Run the gateway.")
    _add_serve_args(p)
    return _serve_ns(p.parse_args(argv))


# ---------------------------------------------------------------------------------
# check-config / hash-key


def _check_ns(ns: argparse.Namespace) -> int:
    from gateway.backends.kinds import build_backends

    try:
        config = load_config(ns.file)
        build_backends(config)  # also checks options that only a backend kind knows
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    tiers = ", ".join(f"{n} ({t.ttft:g} s, {t.tds:g} tok/s)" for n, t in config.tiers.items())
    print(
        f"{ns.file}: OK: {len(config.tenants)} tenant(s), {len(config.backends)} backend(s), "
        f"tiers: {tiers}"
    )
    if not config.backends:
        print(f"{ns.file}: warning: no backends; every request would get 404", file=sys.stderr)
    for warning in unservable_tiers(config):
        print(f"{ns.file}: warning: {warning}", file=sys.stderr)
    return 0


def check_config(argv: Sequence[str] | None = None) -> int:
    """``tokenpace check-config FILE``: 0 when valid, 1 (problems on stderr) otherwise."""
    p = argparse.ArgumentParser(prog="tokenpace check-config")
    _add_check_args(p)
    return _check_ns(p.parse_args(argv))


def _hash_ns(ns: argparse.Namespace) -> int:
    key = ns.key if ns.key is not None else sys.stdin.readline().strip()
    if not key:
        print("tokenpace hash-key: no key given", file=sys.stderr)
        return 1
    print(hash_key(key))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gateway.cli")
    sub = p.add_subparsers(dest="command", required=True)
    add_gateway_commands(sub)
    ns = p.parse_args(argv)
    return int(ns.func(ns))


if __name__ == "__main__":
    sys.exit(main())
