"""What the client examples share: where the gateway is, and what to fix when a call fails.

The base URL comes from ``TOKENPACE_BASE_URL``, else openai's own ``OPENAI_BASE_URL``,
else a gateway on localhost's port 8000 (``tokenpace serve``, ``make run``); the API
key from ``TOKENPACE_API_KEY``. A failed call is told in one line that names the fix, as
the openai SDKs' own messages do, instead of a traceback.
"""

from __future__ import annotations

import os

import openai

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"

# What to do about the gateway's error codes (docs/protocol.md, "Errors").
_FIXES = {
    "invalid_api_key": "Give the key the gateway printed (--api-key or TOKENPACE_API_KEY).",
    "unknown_tier": "Choose one of those with --tier.",
    "tier_not_allowed": "Choose a tier of this key's plan with --tier.",
    "model_not_found": "Name one of the models GET /v1/models lists with --model.",
}


def base_url() -> str:
    """``TOKENPACE_BASE_URL``, else ``OPENAI_BASE_URL``, else :data:`DEFAULT_BASE_URL`."""
    return (
        os.environ.get("TOKENPACE_BASE_URL")
        or os.environ.get("OPENAI_BASE_URL")
        or DEFAULT_BASE_URL
    )


def api_key() -> str | None:
    return os.environ.get("TOKENPACE_API_KEY")


def explain(error: openai.APIError, url: str) -> str:
    """One line: what went wrong, and what to fix."""
    if isinstance(error, openai.APIConnectionError):
        return (
            f"No tokenpace gateway answers at {url}. Start one (`tokenpace serve` or "
            "`make run`), or give its URL with --base-url or TOKENPACE_BASE_URL."
        )
    body = error.body if isinstance(error.body, dict) else {}
    message = str(body.get("message") or error.message)
    fix = _FIXES.get(str(error.code))
    status = f"{error.status_code} " if isinstance(error, openai.APIStatusError) else ""
    return f"{status}{message}" + (f" {fix}" if fix else "")
