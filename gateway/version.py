"""The installed tokenpace distribution's version (``tokenpace --version``, the start-up
banner, the OpenAPI document and the traces' service version)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def _installed() -> str:
    try:
        return version("tokenpace")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


VERSION = _installed()
