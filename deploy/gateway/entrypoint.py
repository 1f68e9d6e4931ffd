"""The gateway image's entrypoint: the mounted configuration with its secrets filled in,
then ``tokenpace`` (``serve`` by default).

Kubernetes mounts the configuration (a ConfigMap) at ``$TOKENPACE_CONFIG_TEMPLATE`` and
puts the Secrets' values in the container's environment. The configuration names them in
its string values as ``${VARIABLE}`` (``admin: {key: "${TOKENPACE_ADMIN_KEY}"}``; ``$$``
is a literal ``$``). This fills them in, after the YAML is parsed (a value is never read
as YAML), writes the result, readable by this user only, to ``$TOKENPACE_CONFIG`` (the
file ``tokenpace serve`` reads when no ``--config`` is given; in the pod, a directory in
memory) and runs ``tokenpace ARGS``. A variable that is not set stops the start, with a
message naming the key and the variable. Without ``$TOKENPACE_CONFIG_TEMPLATE`` the
arguments go to ``tokenpace`` unchanged.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from string import Template
from typing import Any

import yaml

TEMPLATE_ENV = "TOKENPACE_CONFIG_TEMPLATE"
CONFIG_ENV = "TOKENPACE_CONFIG"  # gateway.config.CONFIG_ENV: what `tokenpace serve` reads


class RenderError(ValueError):
    """A ``${VARIABLE}`` that cannot be filled in; the message names its key."""


def fill(value: Any, environ: dict[str, str], key: str = "") -> Any:
    """``value`` with ``${VARIABLE}`` in every string filled in from ``environ``."""
    if isinstance(value, dict):
        return {k: fill(v, environ, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, environ, f"{key}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    try:
        return Template(value).substitute(environ)
    except KeyError as exc:
        raise RenderError(
            f"{key}: ${{{exc.args[0]}}} is not set; give the container that variable "
            "(from its Secret)"
        ) from None
    except ValueError:
        raise RenderError(
            f"{key}: a '$' must start ${{VARIABLE}}; write '$$' for a literal '$'"
        ) from None


def render(template: Path, target: Path, environ: dict[str, str]) -> None:
    """Write ``template`` with its variables filled in to ``target`` (mode 0600)."""
    data = yaml.safe_load(template.read_text(encoding="utf-8"))
    text = yaml.safe_dump(fill(data, environ), sort_keys=False)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)


def main(args: list[str]) -> int:
    template = os.environ.get(TEMPLATE_ENV)
    if template:
        target = os.environ.get(CONFIG_ENV)
        if not target or target == template:
            print(
                f"entrypoint: set {CONFIG_ENV} to the file to write the filled-in "
                f"configuration to (not {TEMPLATE_ENV} itself)",
                file=sys.stderr,
            )
            return 2
        try:
            render(Path(template), Path(target), dict(os.environ))
        except (OSError, yaml.YAMLError, RenderError) as exc:
            print(f"entrypoint: {template}: {exc}", file=sys.stderr)
            return 2
    argv = ["tokenpace", *(args or ["serve"])]
    os.execvp(argv[0], argv)
    return 0  # not reached: exec replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
