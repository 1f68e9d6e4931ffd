"""``tokenpace serve``, ``check-config``, ``hash-key`` and ``keys``, and ``--version``.

The top-level ``tokenpace`` command (tokenpace/cli.py) mounts these with
:func:`add_gateway_commands`; each sub-parser sets ``func`` to a callable taking the
parsed ``argparse.Namespace`` and returning an exit code. :func:`serve` and
:func:`check_config` take an argv list for direct use, and ``python -m gateway.cli``
works on its own.

Without ``--config`` (or ``$TOKENPACE_CONFIG``), ``serve`` starts the demo
configuration: one tenant ``demo`` with a fresh key (or ``$TOKENPACE_DEMO_KEY``), a fresh
admin key (or ``$TOKENPACE_ADMIN_KEY``) and the embedded simulated engine
(:mod:`gateway.backends.embedded`, model ``tokenpace-sim``) as the backend. It prints the keys,
the URLs of the web pages and ready-to-paste curl and openai examples. ``--redis-url``
(or ``$TOKENPACE_REDIS_URL``) sets ``store.redis_url`` of either configuration, which
``--workers N`` needs.

``keys list|add|rotate|revoke`` call a running gateway's admin API
(:mod:`gateway.keys_client`) with the admin key in ``$TOKENPACE_ADMIN_KEY``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from gateway.backends.kinds import OPTION_MODELS
from gateway.backends.serveability import unservable_tiers
from gateway.config.loader import demo_config, load_config, validation_problems
from gateway.config.schema import (
    CONFIG_ENV,
    DEMO_MODEL,
    ConfigError,
    GatewayConfig,
    StoreConfig,
    hash_key,
    new_api_key,
)
from gateway.http.pages import PAGES, is_built
from gateway.keys_client import BASE_URL_ENV, DEFAULT_BASE_URL, AdminCallFailed, KeysClient
from gateway.version import VERSION

DEMO_KEY_ENV = "TOKENPACE_DEMO_KEY"
ADMIN_KEY_ENV = "TOKENPACE_ADMIN_KEY"
REDIS_URL_ENV = "TOKENPACE_REDIS_URL"


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print the installed version and exit."""
    parser.add_argument("--version", action="version", version=f"tokenpace {VERSION}")


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        metavar="FILE",
        help=f"YAML or TOML configuration (default: ${CONFIG_ENV}, else the demo configuration)",
    )
    p.add_argument("--host", help="interface to listen on (default: server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: server.port, 8000)")
    p.add_argument("--log-json", action="store_true", default=None, help="JSON log lines")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        metavar="N",
        help="gateway processes serving the port (default 1; N > 1 needs Redis: --redis-url)",
    )
    p.add_argument(
        "--redis-url",
        metavar="URL",
        help=f"shared store, replacing store.redis_url: redis://host:port/db "
        f"(default: ${REDIS_URL_ENV}, else the configuration's)",
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


def _add_keys_options(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    """``--base-url`` and ``--json``, before the action (``defaults``) or after it
    (``keys list --json``), where they are left unset unless given."""
    url = os.environ.get(BASE_URL_ENV) or DEFAULT_BASE_URL
    p.add_argument(
        "--base-url",
        default=url if defaults else argparse.SUPPRESS,
        help=f"the gateway, /v1 included (default: ${BASE_URL_ENV}, else {DEFAULT_BASE_URL})",
    )
    p.add_argument(
        "--json",
        action="store_true",
        default=False if defaults else argparse.SUPPRESS,
        help="print the gateway's JSON answer",
    )


def _add_keys_args(p: argparse.ArgumentParser) -> None:
    _add_keys_options(p, defaults=True)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    list_ = actions.add_parser("list", help="tenants and their key ids")
    add = actions.add_parser("add", help="a new key for a tenant (printed once)")
    add.add_argument("tenant")
    parsers = [list_, add]
    for name, what in (("rotate", "a new key, and KEY_ID revoked"), ("revoke", "revoke KEY_ID")):
        action = actions.add_parser(name, help=what)
        action.add_argument("tenant")
        action.add_argument("key_id", help="the key's id: its SHA-256 digest (keys list)")
        parsers.append(action)
    for action in parsers:
        _add_keys_options(action, defaults=False)


def add_gateway_commands(subparsers: Any) -> None:
    """Add ``serve``, ``check-config``, ``hash-key`` and ``keys`` to an argparse sub-parser
    set."""
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
    p = subparsers.add_parser(
        "keys",
        help="list, add, rotate or revoke tenants' API keys on a running gateway",
        description=f"Manage API keys through a running gateway's admin API, with the admin "
        f"key in ${ADMIN_KEY_ENV}.",
    )
    _add_keys_args(p)
    p.set_defaults(func=_keys_ns)


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
    config: GatewayConfig,
    url: str,
    demo_key: str | None,
    admin_key: str | None = None,
    workers: int = 1,
) -> str:
    """What ``serve`` prints: where it listens, its version and workers, its pages and,
    for the demo, how to call it."""
    models = [m for b in config.backends for m in b.models if m != "*"]
    model = models[0] if models else DEMO_MODEL
    lines = [f"tokenpace gateway listening on {url}", f"  version: {VERSION}"]
    store = "Redis" if config.store.redis_url else "in memory"
    lines.append(f"  workers: {workers} (shared state {store})")
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
    config_path: str | None, redis_url: str | None = None
) -> tuple[GatewayConfig, str | None, str | None]:
    """The configuration ``serve`` runs: the file, else the demo (and its two keys); with
    ``redis_url`` (else ``$TOKENPACE_REDIS_URL``) as its ``store.redis_url``."""
    path = config_path or os.environ.get(CONFIG_ENV) or None
    redis_url = redis_url or os.environ.get(REDIS_URL_ENV) or None
    if path:
        config, key, admin_key = load_config(path, OPTION_MODELS), None, None
    else:
        admin_key = os.environ.get(ADMIN_KEY_ENV) or new_api_key("tp-admin-")
        config, key = demo_config(os.environ.get(DEMO_KEY_ENV) or None, admin_key=admin_key)
    if redis_url:
        config = with_redis_url(config, redis_url)
    return config, key, admin_key


def with_redis_url(config: GatewayConfig, url: str) -> GatewayConfig:
    """``config`` with ``store.redis_url`` replaced by ``url`` (checked as in a file)."""
    try:
        store = StoreConfig.model_validate({**config.store.model_dump(), "redis_url": url})
    except ValidationError as exc:
        problems = [f"--redis-url (or ${REDIS_URL_ENV}): {p}" for p in validation_problems(exc)]
        raise ConfigError(problems) from None
    return config.model_copy(update={"store": store})


def _serve_ns(ns: argparse.Namespace) -> int:
    import uvicorn

    from gateway.app import create_app
    from gateway.runtime.server import listen, tune_garbage_collector, uvicorn_config
    from gateway.telemetry.logs import setup_logging

    try:
        config, demo_key, admin_key = load_serve_config(ns.config, ns.redis_url)
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
    sockets = []
    for bind_port in (port, config.metrics.port):
        if bind_port is None:
            continue
        try:
            sockets.append(listen(host, bind_port))
        except OSError as exc:
            what = "port" if bind_port == port else "metrics.port"
            print(
                f"tokenpace serve: cannot listen on {host}:{bind_port} ({what}): "
                f"{exc.strerror or exc}",
                file=sys.stderr,
            )
            return 2
    url = f"http://{_display_host(host)}:{port}"
    print(banner(config, url, demo_key, admin_key, ns.workers), flush=True)
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
    tune_garbage_collector()
    server = uvicorn.Server(uvicorn_config(app, config, log_level=level.lower()))
    server.run(sockets=sockets)
    return 0


def serve(argv: Sequence[str] | None = None) -> int:
    """``tokenpace serve [--config FILE] [--host H] [--port P] [--workers N]
    [--redis-url URL]``; the exit code."""
    p = argparse.ArgumentParser(prog="tokenpace serve", description="Run the gateway.")
    _add_serve_args(p)
    return _serve_ns(p.parse_args(argv))


# ---------------------------------------------------------------------------------
# check-config / hash-key


def _check_ns(ns: argparse.Namespace) -> int:
    from gateway.backends.kinds import build_backends

    try:
        config = load_config(ns.file, OPTION_MODELS)
        build_backends(config)  # options valid one by one but not together
    except ConfigError as exc:
        source = exc.source or ns.file
        for line in exc.problems:
            print(f"{source}: {line}", file=sys.stderr)
        count = len(exc.problems)
        print(f"{source}: invalid: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
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


# ---------------------------------------------------------------------------------
# keys


def _keys_ns(ns: argparse.Namespace) -> int:
    admin_key = os.environ.get(ADMIN_KEY_ENV)
    if not admin_key:
        print(
            f"tokenpace keys: set {ADMIN_KEY_ENV} to the gateway's admin key (admin.key; "
            "`tokenpace serve` without a configuration prints it)",
            file=sys.stderr,
        )
        return 2
    client = KeysClient(ns.base_url, admin_key)
    try:
        if ns.action == "list":
            answer: Any = client.tenants()
        elif ns.action == "add":
            answer = client.add(ns.tenant)
        elif ns.action == "rotate":
            answer = client.rotate(ns.tenant, ns.key_id)
        else:
            answer = client.revoke(ns.tenant, ns.key_id)
    except AdminCallFailed as exc:
        print(f"tokenpace keys {ns.action}: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    if ns.json:
        print(json.dumps(answer, indent=2))
    elif ns.action == "list":
        for tenant in answer:
            keys = tenant["keys"]
            print(f"{tenant['name']} (weight {tenant['weight']:g}): {len(keys)} key(s)")
            for key_id in keys:
                print(f"  {key_id}")
    elif ns.action == "revoke":
        print(f"revoked {answer['id']} of tenant {answer['tenant']}")
    else:
        print(f"tenant: {answer['tenant']}\nid:     {answer['id']}\nkey:    {answer['key']}")
        if "revoked" in answer:
            print(f"revoked: {answer['revoked']}")
        print("(the key is shown only now: store it)", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gateway.cli")
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    add_gateway_commands(sub)
    ns = p.parse_args(argv)
    return int(ns.func(ns))


if __name__ == "__main__":
    sys.exit(main())
