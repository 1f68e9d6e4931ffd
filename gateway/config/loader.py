"""Reading a configuration: YAML or TOML, every error naming its key, and the built-in
demo configuration ``tokenpace serve`` uses without a file."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.schema import DEMO_MODEL, ConfigError, GatewayConfig, new_api_key


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _is_type_tag(str(part)):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _is_type_tag(part: str) -> bool:
    # pydantic adds the union branch or validator kind to ``loc``: not a key.
    return (
        "[" in part
        or "-" in part
        or part in {"str", "int", "float", "bool", "list", "dict", "none", "None"}
    )


def validation_problems(exc: ValidationError) -> list[str]:
    """``key: reason`` lines naming the bad key of every error in ``exc``."""
    lines = []
    for err in exc.errors(include_url=False):
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        key = _format_loc(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            msg = "unknown key (typo?)"
        if not err["loc"] and msg.startswith(("tenants[", "backends[")):
            lines.extend(msg.split("\n"))  # cross-field checks name their own keys
        else:
            lines.append(f"{key}: {msg}")
    return lines


def parse_config(data: Any, source: str | None = None) -> GatewayConfig:
    """Validate an already-parsed mapping; raise :class:`ConfigError` naming bad keys."""
    if not isinstance(data, dict):
        raise ConfigError(["(top level): the configuration must be a mapping"], source)
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc), source) from None


def load_config(path: str | os.PathLike[str]) -> GatewayConfig:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file and validate it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"(file): cannot read {p}: {exc.strerror or exc}"], str(p)) from None
    try:
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError([f"(syntax): {exc}"], str(p)) from None
    return parse_config(data if data is not None else {}, str(p))


def demo_config(
    key: str | None = None,
    backends: list[dict[str, Any]] | None = None,
    admin_key: str | None = None,
) -> tuple[GatewayConfig, str]:
    """The configuration ``tokenpace serve`` uses without a file.

    One tenant ``demo`` (every tier, custom tiers allowed) whose key is ``key`` or a new
    random one; ``backends`` defaults to the embedded engine (kind ``embedded``, model
    ``tokenpace-sim``); the admin key (the dashboard's) is ``admin_key``, else none.
    Returns (config, plain key).
    """
    key = key or new_api_key("tp-demo-")
    if backends is None:
        backends = [{"name": "embedded", "kind": "embedded", "models": [DEMO_MODEL]}]
    data: dict[str, Any] = {
        "tenants": [
            {"name": "demo", "api_keys": [{"key": key}], "allow_custom": True, "weight": 1.0}
        ],
        "backends": backends,
    }
    if admin_key:
        data["admin"] = {"key": admin_key}
    return parse_config(data, "built-in demo configuration"), key
