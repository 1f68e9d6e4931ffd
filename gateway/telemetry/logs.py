"""Structured logs: every record carries the request id of the request being served.

``setup_logging(json_logs=True)`` writes one JSON object per line (``ts``, ``level``,
``logger``, ``msg``, ``request_id`` and any ``extra=`` fields); otherwise lines read
``time level [request_id] message key=value ...``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import TextIO

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("tp_request_id", default="-")

_STD_ATTRS = frozenset(
    vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None)).keys()
) | {"message", "asctime", "request_id", "taskName"}


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STD_ATTRS and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        rid = getattr(record, "request_id", "-")
        line = f"{ts} {record.levelname:<7} [{rid}] {record.getMessage()}"
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _GatewayHandler(logging.StreamHandler[TextIO]):
    """The handler :func:`setup_logging` installs (and replaces when called again)."""


def setup_logging(json_logs: bool = False, level: str = "INFO") -> None:
    """Configure the ``tokenpace`` loggers (idempotent)."""
    logger = logging.getLogger("tokenpace")
    logger.setLevel(level)
    for h in list(logger.handlers):
        if isinstance(h, _GatewayHandler):
            logger.removeHandler(h)
    handler = _GatewayHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_logs else TextFormatter())
    handler.addFilter(RequestIdFilter())
    logger.addHandler(handler)
    logger.propagate = False
