"""docs/configuration.md against the configuration's models: every key of every section,
with its type (constraints included) and default, and no key the models lack. The
meanings and examples are the document's own; what can drift is checked here."""

from __future__ import annotations

import json
import re
import typing
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.backends.embedded import EmbeddedOptions
from gateway.config.loader import unwrapped
from gateway.config.schema import GatewayConfig
from tests.support.paths import ROOT

DOC = ROOT / "docs" / "configuration.md"
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}
_BOUNDS = (
    (annotated_types.Gt, "> {}", "gt"),
    (annotated_types.Ge, ">= {}", "ge"),
    (annotated_types.Lt, "< {}", "lt"),
    (annotated_types.Le, "<= {}", "le"),
)


def _model_of(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """(suffix, model) when ``annotation`` is a model, a list of one or a mapping to one."""
    annotation = unwrapped(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "", annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, dict) and (inner := _model_of(args[-1])) is not None:
        return ("[]" if origin is list else ".NAME"), inner[1]
    return None


def type_text(annotation: Any, field: FieldInfo | None = None) -> str:
    """How the document writes a field's type: ``number, > 0``, ``string or null``."""
    nullable = type(None) in typing.get_args(annotation)
    annotation = unwrapped(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in _SCALARS:
        text = _SCALARS[annotation]
    elif origin is typing.Literal:
        text = " or ".join(json.dumps(a) for a in args)
    elif origin is list:
        text = f"list of {type_text(args[0])}"
    elif origin is tuple:
        text = "[" + ", ".join(type_text(a) for a in args) + "]"
    elif origin is dict:
        text = f"mapping of {type_text(args[1])}"
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        text = "mapping"
    else:
        raise AssertionError(f"no text for the type {annotation!r}")
    if nullable:
        text += " or null"
    bounds = []
    for meta in field.metadata if field is not None else []:
        for cls, form, attr in _BOUNDS:
            if isinstance(meta, cls):
                bounds.append(form.format(getattr(meta, attr)))
        if isinstance(meta, annotated_types.MinLen) and meta.min_length:
            unit = "characters" if origin is not list else "items"
            bounds.append(f"at least {meta.min_length} {unit}")
    return ", ".join([text, *bounds])


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
    assert value is not PydanticUndefined
    if isinstance(value, BaseModel):
        return "(the section)"
    if isinstance(value, tuple):
        value = list(value)
    return "`" + json.dumps(value) + "`"


def sections() -> dict[str, dict[str, tuple[str, str]]]:
    """``{section: {key: (type, default)}}`` of every model, as the document names them."""
    out: dict[str, dict[str, tuple[str, str]]] = {}

    def walk(name: str, model: type[BaseModel]) -> None:
        rows: dict[str, tuple[str, str]] = {}
        for key, field in model.model_fields.items():
            key = field.alias or key
            if field.annotation is type(None):  # a key removed, refused with where it went
                continue
            nested = _model_of(field.annotation)
            if nested is not None:
                walk(
                    f"{name}.{key}{nested[0]}" if name != "(top level)" else f"{key}{nested[0]}",
                    nested[1],
                )
                if name != "(top level)":
                    rows[key] = (type_text(field.annotation, field), default_text(field))
                continue
            rows[key] = (type_text(field.annotation, field), default_text(field))
        out[name] = rows

    walk("(top level)", GatewayConfig)
    walk("backends[].options (kind: embedded)", EmbeddedOptions)
    return out


_HEADING = re.compile(r"^#{2,3} `(?P<name>[^`]+)`", re.M)
_ROW = re.compile(
    r"^\| `(?P<key>[^`]+)` \| (?P<type>[^|]+?) \| (?P<default>[^|]+?) \| .+ \|$", re.M
)


def documented() -> dict[str, dict[str, tuple[str, str]]]:
    """The document's tables, by the heading above each."""
    text = DOC.read_text()
    out: dict[str, dict[str, tuple[str, str]]] = {}
    headings = list(_HEADING.finditer(text))
    for i, heading in enumerate(headings):
        end = headings[i + 1].start() if i + 1 < len(headings) else len(text)
        rows = {
            m["key"]: (m["type"], m["default"]) for m in _ROW.finditer(text, heading.end(), end)
        }
        if rows:
            out[heading["name"]] = rows
    return out


@pytest.mark.parametrize("section", sorted(sections()))
def test_every_key_is_documented_with_its_type_and_default(section: str) -> None:
    doc = documented()
    assert section in doc, f"docs/configuration.md has no section `{section}`"
    assert doc[section] == sections()[section]


def test_the_document_has_no_section_the_models_lack() -> None:
    assert set(documented()) <= set(sections())
