"""Request and response models: what is validated, and what the OpenAPI document shows.

The request models check what must be checked (``messages`` present and a list of
messages, numbers of the right type and range, ``tokenpace`` well formed) and allow any
other field (``extra="allow"``). The gateway forwards the client's JSON as it was
received, not these models' dump, so unknown fields, number formats and key order
reach the backend untouched; only ``tokenpace`` is removed and the contract's tags
added (docs/protocol.md). Types are strict: ``"max_tokens": "10"`` is a 400, as it is
at OpenAI, rather than silently coerced.

Limits that come from the configuration (the ``max_tokens`` cap, the ``n`` cap) are
checked by the handler, since a static model cannot know them. Strings the gateway
reads, logs or echoes (``model``, ``user``, ``tokenpace.tier``) have a length bound: a
3 MB model name was 3 MB of log per request and a 3 MB 404 body.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_REQUEST = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
_RESPONSE = ConfigDict(extra="allow")
MAX_NAME_CHARS = 256  # model, user
MAX_TIER_CHARS = 64  # a tier's name (the configuration's rule for names)


class TokenPaceOptions(BaseModel):
    """The ``tokenpace`` body field: a tier, or explicit expectations (plan permitting)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    tier: str | None = Field(
        None, max_length=MAX_TIER_CHARS, description="a tier name, e.g. 'chat', 'voice', 'fast'"
    )
    ttft: float | None = Field(None, description="expected time to first token, seconds")
    tds: float | None = Field(None, description="expected token delivery speed, tokens/s")

    @field_validator("tier", mode="before")
    @classmethod
    def _numbers_go_beside_the_tier(cls, value: Any) -> Any:
        if isinstance(value, dict):
            raise ValueError(
                "a tier is a name ('chat', 'voice', ...); explicit expectations go in place "
                'of it, not inside it: "tokenpace": {"ttft": 2, "tds": 10}'
            )
        return value


class StreamOptions(BaseModel):
    model_config = _REQUEST

    include_usage: bool | None = Field(
        None, description="send a last chunk with `usage` (and `usage: null` in the others)"
    )


class ChatMessage(BaseModel):
    """One message; content may be text, a list of content parts, or null."""

    model_config = _REQUEST

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class _SamplingRequest(BaseModel):
    model_config = _REQUEST

    model: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    user: str | None = Field(None, max_length=MAX_NAME_CHARS)
    tokenpace: TokenPaceOptions | None = Field(
        None, description="tokenpace QoE tier (removed before the request reaches a backend)"
    )


class ChatCompletionRequest(_SamplingRequest):
    """``POST /v1/chat/completions``; any other field is relayed untouched."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``; any other field is relayed untouched."""

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)


# -- responses (documentation; the gateway relays the backend's JSON) -----------------


class Usage(BaseModel):
    model_config = _RESPONSE

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionChoice(BaseModel):
    model_config = _RESPONSE

    index: int
    message: dict[str, Any]
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    model_config = _RESPONSE

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    model_config = _RESPONSE

    index: int
    text: str
    finish_reason: str | None = None


class Completion(BaseModel):
    model_config = _RESPONSE

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class Model(BaseModel):
    """OpenAI's model object; a backend may add fields (``Backend.model_card``)."""

    model_config = _RESPONSE

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "tokenpace"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: str
    backends: dict[str, bool] | None = None
