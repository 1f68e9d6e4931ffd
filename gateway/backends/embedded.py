"""The embedded engine: a SIMULATED continuous-batching engine inside the gateway process.

With no backend configured (``tokenpace serve`` without a file, ``make run``) the
gateway serves the model ``tokenpace-sim`` from here. **No language model runs**: the
replies are deterministic placeholder text, and their timing is the simulation of
:mod:`qos.sim` — one :class:`qos.sim.engine.Engine` (paged KV cache, continuous
batching, preemption by recompute) scheduled by the Andes policy as tokenpace ships it
(:func:`qos.policy.andes.tokenpace_andes`) on a latency profile (:mod:`qos.latency`, default
``llama-3.1-8b-h100``), advanced in wall-clock time. It is labelled as a simulation in
``/v1/models`` (``owned_by: tokenpace-simulation`` and a ``description``) and in a
WARNING log line at start.

How it runs (one asyncio task drives the engine in wall-clock time; a request's
async generator reads its queue): docs/architecture/gateway.md, "The embedded engine".

A request becomes one :class:`qos.sim.workload.SimRequest` per choice (``n`` × prompts,
batched like vLLM's sequences) with

- the tier's expected TTFT/TDS, the tenant and its weight (what andes-tp, weights
  included, schedules on), arrival = when the gateway received it;
- prompt tokens estimated from the text as ``qos.prompt_tokens`` does (chars/4: the
  contents of the messages, or the prompt; a prompt of token ids counts its ids);
- output tokens = ``max_completion_tokens`` or ``max_tokens`` exactly (finish reason
  ``length``); without either, a completion gets 16 (OpenAI's and vLLM's default,
  ``length``) and a chat reply a length drawn deterministically from its prompt in
  ``default_output_tokens`` (finish reason ``stop``: the "natural" end).

The text is :mod:`gateway.backends.embedded_text`'s (the same prompt always gets the same);
``stop`` strings are honoured (text is held back while it may be the start of one, as
vLLM does); sampling fields (temperature, seed, logprobs, tools, ...) are ignored.
``stream_options.include_usage`` adds the usage chunk; non-streaming requests are the
stream aggregated (:class:`gateway.backends.InProcessBackend`). A reader signal for a
request (:meth:`EmbeddedEngine.reader_signal`, from the relay,
:mod:`gateway.relay.reader`) is recorded in the engine's table for each of its sequences.

Options (``backends[].options`` with ``kind: embedded``): ``profile``, ``policy``
(a name of :mod:`qos.policy.registry`: ``andes-tp``, the default, is
:func:`~qos.policy.andes.tokenpace_andes`; ``andes`` the paper's settings),
``fair_share_slack`` (how far a tenant may run ahead before the weights act,
:mod:`qos.policy.fair`), ``kv_tokens``, ``max_batch``, ``block_size``, ``time_scale``
(simulated seconds per wall-clock second: 2 runs twice as fast as the profile; the
tiers' TTFT/TDS are read in simulated seconds), ``default_output_tokens`` ([min, max])
and ``max_sequences`` (sequences in the engine at once, checked at admission; more are
refused with 503 ``engine_overloaded``, which lets the gateway fail over).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.backends.base import BackendError, BackendRuntime, InProcessBackend
from gateway.backends.embedded_text import Placeholder, StopText, text_seed
from gateway.background import stop
from gateway.config.loader import validation_problems
from gateway.config.schema import DEMO_MODEL, BackendConfig, ConfigError, GatewayConfig
from gateway.context import Endpoint, RequestContext
from gateway.errors import INVALID_REQUEST, SERVER_ERROR, error_body
from qos.latency import PROFILES, get_profile
from qos.policy.reader import OVERDUE_AFTER_FCFS_WAITS, chosen_guard
from qos.policy.registry import POLICIES, STOCK_POLICIES, make_policy
from qos.prompt_tokens import estimate_text_tokens
from qos.signals import ReaderSignal
from qos.sim.engine import Engine, StepResult
from qos.sim.workload import SimRequest

log = logging.getLogger("tokenpace.gateway.embedded")

KIND = "embedded"
OWNED_BY = "tokenpace-simulation"
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions


class EmbeddedOptions(BaseModel):
    """``backends[].options`` of an ``embedded`` backend."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    profile: str = Field("llama-3.1-8b-h100", description="latency profile (qos.latency)")
    policy: str = Field("andes-tp", description="a policy of qos.policy.registry")
    fair_share_slack: float | None = Field(
        None, ge=0, description="the Andes policies' fair_share_slack; default the policy's"
    )
    overdue_after_ttfts: float | None = Field(
        None,
        gt=0,
        description="the reader guard's least overdue wait, in TTFTs; default the policy's (10)",
    )
    overdue_after_fcfs_waits: float | None = Field(
        None,
        ge=0,
        description="... and, in multiples of FCFS's wait now, under sustained overload; "
        f"0: the TTFTs alone; default the policy's ({OVERDUE_AFTER_FCFS_WAITS:g})",
    )
    kv_tokens: int | None = Field(None, ge=1, description="KV cache M; default the profile's")
    max_batch: int | None = Field(None, ge=1, description="batch limit; default the profile's")
    block_size: int = Field(16, ge=1, description="KV block size in tokens")
    time_scale: float = Field(1.0, gt=0, description="simulated seconds per wall-clock second")
    default_output_tokens: tuple[int, int] = Field(
        (32, 256), description="range of chat reply lengths without max_tokens"
    )
    max_sequences: int = Field(4096, ge=1, description="sequences in the engine at once")

    @field_validator("profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        if v not in PROFILES:
            raise ValueError(f"unknown latency profile {v!r}; valid: {', '.join(sorted(PROFILES))}")
        return v

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}; valid: {', '.join(POLICIES)}")
        return v

    @field_validator("default_output_tokens")
    @classmethod
    def _range(cls, v: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= v[0] <= v[1]:
            raise ValueError("must be [min, max] with 1 <= min <= max")
        return v


# ---------------------------------------------------------------------------------
# placeholder text


# ---------------------------------------------------------------------------------
# planning a request


@dataclass(frozen=True, slots=True)
class _Choice:
    prompt_tokens: int
    output_tokens: int
    seed: int


@dataclass(frozen=True, slots=True)
class _Plan:
    endpoint: Endpoint
    model: str
    choices: tuple[_Choice, ...]
    prompt_tokens: int  # usage: every prompt once, whatever n
    capped: bool  # the length was the client's max_tokens (or the default 16): "length"
    stops: tuple[str, ...]
    include_usage: bool


def _bad(message: str, param: str | None, code: str = "invalid_value") -> BackendError:
    return BackendError(
        message,
        status=400,
        retryable=False,
        body=error_body(message, INVALID_REQUEST, param, code),
        code=code,
        type=INVALID_REQUEST,
    )


def _message_text(messages: list[Any]) -> str:
    parts: list[str] = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p["text"]) for p in content if isinstance(p, dict) and "text" in p)
    return "\n".join(parts)


def _prompts(endpoint: Endpoint, body: dict[str, Any]) -> list[tuple[str, int]]:
    """(text, prompt tokens) of each prompt: the messages, or the completion prompt(s)."""
    if endpoint == "chat.completions":
        text = _message_text(body.get("messages") or [])
        return [(text, estimate_text_tokens(text))]
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [(prompt, estimate_text_tokens(prompt))]
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return [(repr(prompt), len(prompt))]  # token ids: count them
    if isinstance(prompt, list) and prompt:
        return [
            (p, estimate_text_tokens(p)) if isinstance(p, str) else (repr(p), max(1, len(p)))
            for p in prompt
        ]
    raise _bad("'prompt' must not be empty.", "prompt")


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    return tuple(s for s in items if isinstance(s, str) and s)


# ---------------------------------------------------------------------------------
# the backend


@dataclass(eq=False, slots=True)
class _Route:
    """Where the engine's tokens for one sequence go."""

    queue: asyncio.Queue[tuple[int, bool] | BackendError]
    choice: int


class EmbeddedEngine(InProcessBackend):
    """A simulated engine (qos.sim + Andes) serving OpenAI requests in this process.

    ``options`` are :class:`EmbeddedOptions` fields. ``throughput_tps`` (the router's
    Θ) defaults to the profile's token throughput at full batch.
    """

    def __init__(
        self,
        name: str = KIND,
        models: tuple[str, ...] | list[str] = (DEMO_MODEL,),
        *,
        throughput_tps: float | None = None,
        **options: Any,
    ) -> None:
        opts = EmbeddedOptions.model_validate(options)
        profile = get_profile(opts.profile)
        if opts.max_batch is not None:
            profile = dataclasses.replace(profile, max_batch=opts.max_batch)
        self.options = opts
        self.profile = profile
        chosen: dict[str, Any] = {}
        if opts.fair_share_slack is not None:
            chosen["fair_share_slack"] = opts.fair_share_slack
        guard = chosen_guard(
            overdue_after_ttfts=opts.overdue_after_ttfts,
            overdue_after_fcfs_waits=opts.overdue_after_fcfs_waits,
        )
        if guard is not None:
            chosen["guard"] = guard
        self.engine = Engine(
            make_policy(opts.policy, profile, **chosen),
            profile,
            block_size=opts.block_size,
            kv_tokens=opts.kv_tokens,
            pause=opts.policy not in STOCK_POLICIES,  # as vLLM with the plugin, or stock
        )
        full = profile.max_batch
        default_tps = full * float(profile.tokens_per_s(full)) * opts.time_scale
        super().__init__(name, models, tokenpace=True, throughput_tps=throughput_tps or default_tps)
        self._scale = opts.time_scale
        self._routes: dict[str, _Route] = {}
        self._requests: dict[str, list[str]] = {}  # request id -> its sequences' ids
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = 0.0
        self._failure: str | None = None
        self.iterations = 0
        self.peak_batch = 0
        self.last_batch = 0

    @classmethod
    def from_config(cls, cfg: BackendConfig, config: GatewayConfig) -> EmbeddedEngine:
        try:
            return cls(cfg.name, cfg.models, throughput_tps=cfg.throughput_tps, **cfg.options)
        except ValidationError as exc:
            where = f"backends[{cfg.name}].options"
            raise ConfigError([f"{where}.{line}" for line in validation_problems(exc)]) from None
        except ValueError as exc:  # options valid one by one, not together (e.g. kv_tokens)
            raise ConfigError([f"backends[{cfg.name}].options: {exc}"]) from None

    # -- description ---------------------------------------------------------------
    def describe(self) -> str:
        o = self.options
        return (
            f"SIMULATION (no model runs): deterministic placeholder text, timed by qos.sim "
            f"with the {o.policy} policy on the latency profile {self.profile.name} "
            f"(M = {self.engine.kv_tokens} KV tokens, max batch {self.engine.max_batch}, "
            f"time scale {o.time_scale:g})"
        )

    def model_card(self, model: str) -> dict[str, Any]:
        return {"owned_by": OWNED_BY, "description": self.describe()}

    def stats(self) -> dict[str, int]:
        """The engine now: sequences running and waiting, KV used, iterations, batches."""
        e = self.engine
        return {
            "running": e.num_running,
            "waiting": e.num_waiting,
            "sequences": len(self._routes),
            "kv_used": e.kv_used,
            "iterations": self.iterations,
            "last_batch": self.last_batch,
            "peak_batch": self.peak_batch,
            "preemptions": e.total_preemptions,
        }

    # -- life cycle ----------------------------------------------------------------
    async def start(self, runtime: BackendRuntime) -> None:
        self._t0 = time.monotonic()
        self._failure = None
        self._task = asyncio.create_task(self._run(), name=f"tokenpace-embedded-{self.name}")
        log.warning("backend %s: embedded engine, %s", self.name, self.describe())

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await stop(task)
        self._fail_all(f"Backend {self.name!r} (simulated engine) shut down.")

    async def check_health(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- the clock -------------------------------------------------------------------
    def _sim_time(self, monotonic: float) -> float:
        return max(0.0, (monotonic - self._t0) * self._scale)

    def _wall_time(self, sim: float) -> float:
        return self._t0 + sim / self._scale

    # -- the engine loop -------------------------------------------------------------
    async def _run(self) -> None:
        engine = self.engine
        idle_s = float(self.profile.decode_s(1)) / self._scale
        try:
            while True:
                if not engine.has_work():
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                res = engine.step(max(self._sim_time(time.monotonic()), engine.clock))
                if res.batch_size == 0:  # the policy ran nothing: look again in an iteration
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), idle_s)
                    continue
                self.iterations += 1
                self.last_batch = res.batch_size
                self.peak_batch = max(self.peak_batch, res.batch_size)
                await asyncio.sleep(max(0.0, self._wall_time(res.end) - time.monotonic()))
                self._deliver(res)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine invariant broke: fail everyone, go unhealthy
            log.exception("backend %s: the simulated engine failed", self.name)
            self._fail_all(f"Backend {self.name!r} (simulated engine) failed: {exc}")

    def _deliver(self, res: StepResult) -> None:
        for seq_id, _index, finished in res.emitted:
            route = self._routes.get(seq_id)
            if route is None:  # aborted while the iteration ran
                continue
            route.queue.put_nowait((route.choice, finished))
            if finished:
                del self._routes[seq_id]

    def _fail_all(self, message: str) -> None:
        self._failure = message
        routes, self._routes = self._routes, {}
        for seq_id, route in routes.items():
            route.queue.put_nowait(BackendError(message, code="upstream_error", unhealthy=True))
            with contextlib.suppress(Exception):  # an engine that broke may not abort cleanly
                self.engine.abort(seq_id)

    # -- requests ------------------------------------------------------------------
    def _plan(self, endpoint: Endpoint, body: dict[str, Any]) -> _Plan:
        prompts = _prompts(endpoint, body)
        n = body.get("n") or 1
        limit = None
        for key in ("max_completion_tokens", "max_tokens"):
            if isinstance(body.get(key), int):
                limit = body[key]
                break
        if limit is None and endpoint == "completions":
            limit = COMPLETION_DEFAULT_MAX_TOKENS
        lo, hi = self.options.default_output_tokens
        choices: list[_Choice] = []
        for text, tokens in prompts:
            for j in range(n):
                seed = text_seed(text, str(j))
                out = limit if limit is not None else lo + seed % (hi - lo + 1)
                if self.engine.blocks_for(tokens + out) > self.engine.total_blocks:
                    raise _bad(
                        f"This model's maximum context length is {self.engine.kv_tokens} "
                        f"tokens (the simulated KV cache); the request needs {tokens + out} "
                        f"({tokens} in the prompt, {out} to generate).",
                        "messages" if endpoint == "chat.completions" else "prompt",
                        "context_length_exceeded",
                    )
                choices.append(_Choice(tokens, out, seed))
        if len(self._routes) + len(choices) > self.options.max_sequences:
            raise BackendError(
                f"Backend {self.name!r} (simulated engine) is full; try again shortly.",
                status=503,
                code="engine_overloaded",
                type=SERVER_ERROR,
            )
        return _Plan(
            endpoint=endpoint,
            model=str(body.get("model", "")),
            choices=tuple(choices),
            prompt_tokens=sum(tokens for _, tokens in prompts),
            capped=limit is not None,
            stops=_stops(body),
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
        )

    def generate(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext
    ) -> AsyncIterator[dict[str, Any]]:
        """Check the request (BackendError before the stream), then stream it."""
        if self._task is None or self._task.done():
            raise BackendError(
                self._failure or f"Backend {self.name!r} (simulated engine) is not running.",
                status=503,
                code="backend_unavailable",
                type=SERVER_ERROR,
                unhealthy=True,
            )
        return self._stream(self._plan(endpoint, body), ctx)

    def _submit(
        self, plan: _Plan, ctx: RequestContext, queue: asyncio.Queue[Any], ids: list[str]
    ) -> None:
        """Queue every choice in the engine (ids collects them, to abort even halfway)."""
        arrival = self._sim_time(ctx.received_at)
        for c, choice in enumerate(plan.choices):
            seq_id = f"{ctx.request_id}/{c}"
            self.engine.submit(
                SimRequest(
                    id=seq_id,
                    arrival=arrival,
                    prompt_tokens=choice.prompt_tokens,
                    output_tokens=choice.output_tokens,
                    ttft=ctx.tier.ttft,
                    tds=ctx.tier.tds,
                    tenant=ctx.tenant,
                    weight=ctx.weight,
                    tier=ctx.tier.name,
                )
            )
            ids.append(seq_id)
            self._routes[seq_id] = _Route(queue, c)
        self._wake.set()

    def reader_signal(self, request_id: str, signal: ReaderSignal) -> bool:
        """Record the signal in the engine's table for each of the request's sequences
        (``table.reader_signal`` on the engine's clock), and wake the engine so that its
        next decision sees it; False when none of them is in the table (queued, or ended)."""
        table = self.engine.table
        now = max(self._sim_time(time.monotonic()), self.engine.clock)
        applied = False
        for seq_id in self._requests.get(request_id, ()):
            applied |= table.reader_signal(seq_id, signal, now)
        if applied:
            self._wake.set()
        return applied

    def _abort(self, ids: list[str]) -> None:
        for seq_id in ids:
            if self._routes.pop(seq_id, None) is not None:
                self.engine.abort(seq_id)

    async def _stream(self, plan: _Plan, ctx: RequestContext) -> AsyncIterator[dict[str, Any]]:
        chat = plan.endpoint == "chat.completions"
        base: dict[str, Any] = {
            "id": ("chatcmpl-" if chat else "cmpl-") + ctx.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": plan.model,
        }
        if plan.include_usage:
            base["usage"] = None

        def chunk(c: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            if chat:
                choice = {"index": c, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                text = delta.get("content", "")
                choice = {"index": c, "text": text, "logprobs": None, "finish_reason": finish}
            return {**base, "choices": [choice]}

        k = len(plan.choices)
        texts = [Placeholder(ch.seed) for ch in plan.choices]
        cutters = [StopText(plan.stops) for _ in range(k)]
        produced = [0] * k
        done = [False] * k
        queue: asyncio.Queue[tuple[int, bool] | BackendError] = asyncio.Queue()
        ids: list[str] = []
        self._requests[ctx.request_id] = ids
        try:
            self._submit(plan, ctx, queue, ids)
            open_choices = k
            while open_choices:
                item = await queue.get()
                if isinstance(item, BackendError):
                    raise item
                c, finished = item
                if done[c]:  # cut at a stop string; tokens already queued are dropped
                    continue
                if produced[c] == 0 and chat:  # the role comes with the first token, as in vLLM
                    yield chunk(c, {"role": "assistant", "content": ""})
                produced[c] += 1
                text, stopped = cutters[c].push(texts[c].next())
                if finished and not stopped:
                    text += cutters[c].flush()
                if text:
                    yield chunk(c, {"content": text})
                if stopped or finished:
                    self._abort([ids[c]])  # at a stop string the engine drops the sequence
                    reason = "stop" if stopped or not plan.capped else "length"
                    yield chunk(c, {}, reason)
                    done[c] = True
                    open_choices -= 1
            if plan.include_usage:
                completion = sum(produced)
                usage = {
                    "prompt_tokens": plan.prompt_tokens,
                    "completion_tokens": completion,
                    "total_tokens": plan.prompt_tokens + completion,
                }
                yield {**base, "choices": [], "usage": usage}
        finally:
            self._requests.pop(ctx.request_id, None)
            self._abort(ids)
