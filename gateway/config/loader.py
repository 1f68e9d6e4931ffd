"""Reading a configuration: YAML or TOML, ``${NAME}`` filled in from the environment
(:mod:`gateway.config.variables`), and every error in one pass, each naming its key (a
typo with the nearest key); plus the built-in demo configuration ``tokenpace serve``
uses without a file.

Pydantic stops at the fields: the checks across fields (a tenant's tier that the table
lacks, duplicate names) run only once every field is valid, and a backend's ``options``
are known only to its kind. So that one run of ``check-config`` reports everything,
after a failed validation the tenants and backends that are valid on their own are
checked across, and each backend's ``options`` are validated against its kind's model
(``options_models``, given by the caller: this package imports nothing else of the
gateway).
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from gateway.config.schema import (
    DEMO_MODEL,
    BackendConfig,
    ConfigError,
    GatewayConfig,
    TenantConfig,
    TierSpec,
    cross_field_problems,
    merged_tiers,
    new_api_key,
)
from gateway.config.variables import expand_variables

OptionModels = Mapping[str, type[BaseModel]]  # backend kind -> the model of its options


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


def unwrapped(annotation: Any) -> Any:
    """``X`` of a field's ``X | None`` (and of ``Annotated[X, ...]``)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a mapping at ``loc`` (inside ``model``) may have; [] when not a model's."""
    annotation: Any = model
    for part in loc:
        annotation = unwrapped(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            fields = annotation.model_fields
            field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
            if field is None:
                return []
            annotation = field.annotation
        elif typing.get_origin(annotation) in (list, dict):
            annotation = typing.get_args(annotation)[-1]
        else:
            return []
    annotation = unwrapped(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [f.alias or name for name, f in annotation.model_fields.items()]
    return []


def _unknown_key(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> str:
    """The message for an unknown key, with the nearest known key when one is close."""
    if model is not None and loc and isinstance(loc[-1], str):
        near = difflib.get_close_matches(loc[-1], _keys_at(model, loc[:-1]), n=1, cutoff=0.6)
        if near:
            return f"unknown key; did you mean '{near[0]}'?"
    return "unknown key (typo?)"


def validation_problems(exc: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """``key: reason`` lines naming the bad key of every error in ``exc``; an unknown key
    of ``model`` (the model validated) gets the nearest known key."""
    lines = []
    for err in exc.errors(include_url=False):
        msg = err["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        loc = tuple(err["loc"])
        key = _format_loc(loc)
        if err["type"] == "extra_forbidden":
            msg = _unknown_key(model, tuple(p for p in loc if not _is_type_tag(str(p))))
        if not loc and msg.startswith(("tenants[", "backends[")):
            lines.extend(msg.split("\n"))  # cross-field checks name their own keys
        else:
            lines.append(f"{key}: {msg}")
    return lines


def _valid(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data)
    except (ValidationError, ValueError):
        return None


def _cross_problems(data: dict[str, Any]) -> list[str]:
    """The checks across fields, among the tenants and backends valid on their own."""
    tiers: dict[str, TierSpec] | None
    try:
        raw = TypeAdapter(dict[str, TierSpec]).validate_python(data.get("tiers") or {})
        tiers = merged_tiers(raw)
    except (ValidationError, ValueError):
        tiers = None
    tenants = data.get("tenants")
    backends = data.get("backends")
    valid_tenants = [
        (i, t)
        for i, raw_tenant in enumerate(tenants if isinstance(tenants, list) else [])
        if (t := _valid(TenantConfig, raw_tenant)) is not None
    ]
    valid_backends = [
        (i, b)
        for i, raw_backend in enumerate(backends if isinstance(backends, list) else [])
        if (b := _valid(BackendConfig, raw_backend)) is not None
    ]
    return cross_field_problems(tiers, valid_tenants, valid_backends)


def _option_problems(data: dict[str, Any], option_models: OptionModels) -> list[str]:
    """Each backend's ``options`` checked against the model of its kind."""
    problems: list[str] = []
    backends = data.get("backends")
    for i, backend in enumerate(backends if isinstance(backends, list) else []):
        if not isinstance(backend, dict):
            continue
        model = option_models.get(backend.get("kind", "http"))
        options = backend.get("options", {})
        if model is None or not isinstance(options, dict):
            continue
        try:
            model.model_validate(options)
        except ValidationError as exc:
            where = f"backends[{i}].options"
            problems += [f"{where}.{line}" for line in validation_problems(exc, model)]
    return problems


def parse_config(
    data: Any,
    source: str | None = None,
    option_models: OptionModels | None = None,
    skip: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """Validate an already-parsed mapping; raise :class:`ConfigError` with every problem.

    ``option_models``: the model of each backend kind's ``options``, checked too. ``skip``:
    problems already found by key (the variables), reported first; validation problems
    of those keys are left out (they follow from the first).
    """
    if not isinstance(data, dict):
        raise ConfigError(["(top level): the configuration must be a mapping"], source)
    early = [f"{key}: {reason}" for key, reason in (skip or {}).items()]
    options = _option_problems(data, option_models or {})
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, GatewayConfig)
        if all(err["loc"] for err in exc.errors()):  # the fields failed: not checked across
            problems += _cross_problems(data)
        found = [p for p in problems if not any(p.startswith(f"{key}:") for key in skip or {})]
        raise ConfigError(list(dict.fromkeys([*early, *found, *options])), source) from None
    if early or options:
        raise ConfigError([*early, *options], source)
    return config


def _syntax_problem(exc: yaml.YAMLError | tomllib.TOMLDecodeError) -> str:
    """``(syntax): line L, column C: what`` (the file is the error's source)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = " ".join(filter(None, [exc.context, exc.problem]))
        return f"(syntax): line {mark.line + 1}, column {mark.column + 1}: {what}"
    return f"(syntax): {exc}"


def load_config(
    path: str | os.PathLike[str],
    option_models: OptionModels | None = None,
    environ: Mapping[str, str] | None = None,
) -> GatewayConfig:
    """Read a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file, fill in its ``${NAME}``
    from ``environ`` (default: the process's environment), and validate it."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"(file): cannot read {p}: {exc.strerror or exc}"], str(p)) from None
    try:
        data = tomllib.loads(text) if p.suffix.lower() == ".toml" else yaml.safe_load(text)
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError([_syntax_problem(exc)], str(p)) from None
    data, unset = expand_variables(data if data is not None else {}, environ or os.environ)
    return parse_config(data, str(p), option_models, unset)


def demo_config(
    key: str | None = None,
    backends: list[dict[str, Any]] | None = None,
    admin_key: str | None = None,
    redis_url: str | None = None,
) -> tuple[GatewayConfig, str]:
    """The configuration ``tokenpace serve`` uses without a file.

    One tenant ``demo`` (every tier, custom tiers allowed) whose key is ``key`` or a new
    random one; ``backends`` defaults to the embedded engine (kind ``embedded``, model
    ``tokenpace-sim``); the admin key (the dashboard's) is ``admin_key``, else none; the
    shared store is ``redis_url``, else in memory.
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
    if redis_url:
        data["store"] = {"redis_url": redis_url}
    return parse_config(data, "built-in demo configuration"), key
