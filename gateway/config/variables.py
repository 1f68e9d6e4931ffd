"""``${NAME}`` in a configuration file's string values, filled in from the environment.

Secrets (the admin key, tenants' keys, the metrics token, the telemetry-token secret, a
password in ``store.redis_url``) need not be written into the file: a string value may
name environment variables as ``${NAME}`` (``admin: {key: "${TOKENPACE_ADMIN_KEY}"}``,
``redis_url: "redis://:${REDIS_PASSWORD}@redis:6379/0"``), and ``$$`` is a literal
``$``. Values are filled in after the file is parsed, so a variable's value is never read
as YAML or TOML, and before validation, so it is checked as if it were written there.
Mapping keys and non-string values are left as they are. A variable that is not set, or
a ``$`` that starts neither ``${NAME}`` nor ``$$``, is a problem naming the key (and the
variable); the value of a variable is never part of a message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REFERENCE = re.compile(r"\$(?:(?P<dollar>\$)|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}|)")


def key_path(parent: str, part: str | int) -> str:
    """``tenants[1].api_keys[0].key``: how problems name a key."""
    if isinstance(part, int):
        return f"{parent}[{part}]"
    return f"{parent}.{part}" if parent else str(part)


def expand_variables(
    data: Any, environ: Mapping[str, str], key: str = ""
) -> tuple[Any, dict[str, str]]:
    """``data`` with ``${NAME}`` filled in from ``environ`` in every string value, and the
    problems by key (``{key: reason}``); a value with a problem is left as it was."""
    problems: dict[str, str] = {}

    def fill(value: Any, where: str) -> Any:
        if isinstance(value, dict):
            return {k: fill(v, key_path(where, str(k))) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v, key_path(where, i)) for i, v in enumerate(value)]
        if not isinstance(value, str) or "$" not in value:
            return value
        missing: list[str] = []
        malformed = False

        def substitute(match: re.Match[str]) -> str:
            nonlocal malformed
            if match["dollar"]:
                return "$"
            name = match["name"]
            if name is None:
                malformed = True
                return match[0]
            if name not in environ:
                missing.append(name)
                return match[0]
            return environ[name]

        filled = _REFERENCE.sub(substitute, value)
        if missing:
            names = ", ".join(f"${{{n}}}" for n in dict.fromkeys(missing))
            verb = "is" if len(missing) == 1 else "are"
            problems[where or "(top level)"] = (
                f"{names} {verb} not set (an environment variable the value names)"
            )
        elif malformed:
            problems[where or "(top level)"] = (
                "a '$' must start ${NAME} (an environment variable); write '$$' for a literal '$'"
            )
        else:
            return filled
        return value

    return fill(data, key), problems
