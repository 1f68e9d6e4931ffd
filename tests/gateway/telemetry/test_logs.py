"""Every log record is one line, whatever a request put into it (text and JSON formats)."""

from __future__ import annotations

import json
import logging
import sys

from gateway.telemetry.logs import JsonFormatter, TextFormatter

FORGED = "m\n2026-01-01T00:00:00 INFO    [x] forged\rline\u2028and\x1b[31m"


def record(msg: str, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("tokenpace.gateway.access", logging.INFO, "x", 1, msg, None, None)
    rec.__dict__.update(extra)
    return rec


def test_the_text_format_escapes_and_quotes_what_a_request_carries() -> None:
    line = TextFormatter().format(record(f"model {FORGED}", model=FORGED, tokens=3, tier="chat"))
    assert "\n" not in line and "\r" not in line and "\u2028" not in line and "\x1b" not in line
    assert "model m\\n2026-01-01T00:00:00 INFO    [x] forged\\rline\\u2028and\\x1b[31m" in line
    assert ' model="m\\n2026-01-01T00:00:00 INFO    [x] forged\\rline\\u2028and\\x1b[31m"' in line
    assert line.endswith(" tokens=3 tier=chat")  # plain values stay bare
    quoted = TextFormatter().format(record("x", error='a "b"=c\\d', user="x tenant=admin"))
    assert quoted.endswith(' error="a \\"b\\"=c\\\\d" user="x tenant=admin"')


def test_a_traceback_cannot_start_a_line_of_its_own() -> None:
    try:
        raise ValueError(FORGED)
    except ValueError:
        rec = record("failed")
        rec.exc_info = sys.exc_info()
    first, *rest = TextFormatter().format(rec).split("\n")
    assert first.endswith("failed") and rest
    assert all(line.startswith("    ") for line in rest), rest


def test_the_json_format_is_one_line_of_escaped_json() -> None:
    line = JsonFormatter().format(record(FORGED, model=FORGED))
    assert "\n" not in line and "\r" not in line and "\u2028" not in line and "\x1b" not in line
    parsed = json.loads(line)
    assert parsed["msg"] == FORGED and parsed["model"] == FORGED
