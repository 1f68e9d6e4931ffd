r"""Structured logs: every record carries the request id of the request being served.

``setup_logging(json_logs=True)`` writes one JSON object per line (``ts``, ``level``,
``logger``, ``msg``, ``request_id`` and any ``extra=`` fields); otherwise lines read
``time level [request_id] message key=value ...``.

One record is one line, whatever a client put into it: JSON escapes every control
character (and, ASCII only, U+2028/U+2029); the text format escapes control characters
(``\n``, ``\x1b``, ``\u2028``) in the message and the values, quotes a value that
holds a space, ``=``, ``"`` or ``\`` (logfmt's rule), and indents a traceback's lines,
so nothing a request carries can start a line that reads as a record of its own.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
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


# C0 and C1 controls, DEL, and Unicode's line and paragraph separators
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_QUOTED = re.compile('[\\s="\\\\]')  # a value holding these is quoted


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def one_line(text: str) -> str:
    r"""``text`` with its control characters escaped (``\n``, ``\x1b``, ``\u2028``)."""
    return _CONTROL.sub(_escape_char, text)


def logfmt_value(value: object) -> str:
    r"""A ``key=value`` value: on one line, quoted when it holds a space, ``=``, ``"`` or
    ``\`` (its ``"`` and ``\`` then escaped)."""
    text = str(value)
    if text and not _QUOTED.search(text) and not _CONTROL.search(text):
        return text
    return '"' + one_line(text.replace("\\", "\\\\").replace('"', '\\"')) + '"'


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
        line = f"{ts} {record.levelname:<7} [{one_line(str(rid))}] {one_line(record.getMessage())}"
        extras = _extras(record)
        if extras:
            line += " " + " ".join(f"{k}={logfmt_value(v)}" for k, v in extras.items())
        if record.exc_info:  # its lines indented: none reads as a record of its own
            trace = self.formatException(record.exc_info)
            line += "".join(f"\n    {part}" for part in trace.splitlines())
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
