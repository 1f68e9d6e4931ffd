"""A discrete-event simulator of one continuous-batching engine with a paged KV cache.

Modelled on vLLM: requests wait in a queue, run in iterations (one token per running
request per iteration), hold KV-cache blocks while they run, and are preempted
(recompute, or swap to host memory) when the scheduling policy says so. One
implementation, :class:`Engine`, serves both the offline benchmark (:func:`simulate`)
and the gateway, which drives it in wall-clock time from an asyncio task.

**KV cache.** ``M`` tokens (``kv_tokens``, default ``profile.kv_capacity_tokens``,
rounded down to whole blocks) in blocks of ``block_size`` tokens. A request that runs
in an iteration holds ``ceil((context + 1) / block_size)`` blocks, context = prompt +
tokens generated so far (the ``+1`` is room for the token it generates: the table's
``demand``). Swapped-out KV lives in host memory (unbounded) and holds no GPU block.

**One iteration** (:meth:`Engine.step`, starting at ``now``):

1. Requests whose arrival time is ``<= now`` join the table (``policy.on_arrival`` at
   their arrival time).
2. ``policy.schedule(table, Capacity(M, max_batch), now)`` returns the rows to run.
3. The engine enforces its hard limits, whatever the policy returned: if the chosen
   rows need more than ``M`` tokens of blocks or more than ``max_batch`` slots, it keeps
   chosen *running* requests first, oldest admission first, then chosen *waiting*
   requests in arrival order, skipping each one that no longer fits (greedy, as
   :func:`qos.policy.base.pack_in_order`). Whatever is dropped simply does not run; a
   dropped running request is preempted (counted in ``forced_preemptions``). Note that
   blocks round each request up: a policy packing ``table.demand`` tokens against
   ``M`` can overshoot by up to a block per request, and the engine then clips.
4. Running requests not kept are preempted (``table.preempt``): with ``"recompute"``
   their KV is dropped; with ``"swap"`` it is copied to host memory, costing
   ``profile.preempt_s(context, "swap")`` in this iteration.
5. Kept waiting requests are admitted. A swapped-out one is copied back (the same
   swap cost) and decodes; any other is prefilled: prompt + tokens already generated
   are (re)computed, and the prefill produces its next token, as vLLM does. A first
   prefill calls ``policy.on_prefill(row, prompt_tokens)``.
6. Running requests decode one token each. The iteration lasts
   ``profile.iteration_s(decode_batch, decode_context_tokens, prefill_tokens)`` plus
   swap costs; every request that ran emits one token stamped at its end
   (``policy.on_tokens`` then the table's digestion sums). A request whose output
   reaches its ``output_tokens`` finishes: ``policy.on_finish``, then it leaves.

The engine checks its invariants as it goes and raises ``RuntimeError`` with detail on
a violation: KV used ``<= M`` every iteration, at most ``max_batch`` requests, exactly
``output_tokens`` non-decreasing emission times per request, positive iteration time,
and (in :func:`simulate`) every request finishing.

Results depend only on the workload, the policy and the profile (deterministic): wall
clock enters only the policy decision-time statistics.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from qos.latency import LatencyProfile
from qos.metrics import (
    Freezes,
    IdlePenalty,
    ReaderSummary,
    RequestRecord,
    ServingMetrics,
    andes_qoe,
    freezes,
    monotone_qoe,
    reader_summary,
    request_benefit,
    serving_metrics,
    user_idle_latency,
)
from qos.policy.base import Policy, pack_in_order
from qos.policy.table import Capacity, RequestTable
from qos.sim.workload import SimRequest

if TYPE_CHECKING:
    from qos.sim.readers import ReaderSim

PreemptionMode = Literal["recompute", "swap"]

CLOCK_TOLERANCE_S = 1e-3
"""How far ``step(now)`` may lag the end of the previous iteration (timer jitter)."""

_PERCENTILES = (5, 10, 25, 50, 75, 90, 95, 99)


@dataclass
class StepResult:
    """What one call to :meth:`Engine.step` did.

    ``emitted`` lists ``(request_id, token_index, finished)`` for every token produced
    at the end of the iteration (``token_index`` counts from 0); all of them carry the
    time ``end``. An idle step (nothing ran) has ``batch_size == 0`` and duration 0.
    """

    start: float
    duration: float
    request_ids: list[str] = field(default_factory=list)
    token_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    finished_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    finished: list[str] = field(default_factory=list)
    admitted: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    prefill_tokens: int = 0
    kv_used: int = 0
    decision_s: float = 0.0
    dropped: int = 0  # chosen by the policy but over the engine's limits
    forced_preemptions: int = 0  # running, chosen by the policy, preempted by the limits

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def batch_size(self) -> int:
        return len(self.request_ids)

    @property
    def emitted(self) -> list[tuple[str, int, bool]]:
        return list(
            zip(
                self.request_ids,
                self.token_index.tolist(),
                self.finished_mask.tolist(),
                strict=True,
            )
        )


@dataclass
class RequestResult:
    """One finished request. ``times`` are emission times in seconds since arrival."""

    id: str
    tenant: str
    tier: str
    ttft: float  # expected
    tds: float  # expected
    arrival: float
    prompt_tokens: int
    output_tokens: int
    times: np.ndarray
    preemptions: int
    andes_qoe: float
    monotone_qoe: float
    freezes: Freezes  # what the reader saw stop, by the release rule
    idle_s: float  # user idle latency, Wang et al. Eq. 9

    @property
    def actual_ttft(self) -> float:
        return float(self.times[0])

    @property
    def actual_tds(self) -> float:
        """Tokens after the first / time from first to last token (Andes Table 4);
        NaN for a one-token reply."""
        n = self.times.size
        span = float(self.times[-1] - self.times[0])
        return (n - 1) / span if n > 1 and span > 0 else math.nan


_STAT_FIELDS = (
    "start",
    "duration",
    "batch_size",
    "decode_batch",
    "prefill_tokens",
    "kv_used",
    "preemptions",
    "admissions",
    "waiting",
    "dropped",
    "forced_preemptions",
    "decision_s",
)


class Engine:
    """One continuous-batching engine, stepped one iteration at a time.

    ``submit`` queues a request for its ``arrival`` time on the engine clock; ``step(now)``
    runs one iteration starting at ``now`` (which must not precede the end of the
    previous one) and returns what it emitted. Driven offline by :func:`simulate`, or in
    wall-clock time by the gateway: ``res = engine.step(clock()); await sleep(res.duration);
    deliver(res.emitted)``; when ``res.batch_size == 0`` wait for the next submission or
    :meth:`next_arrival_time`.

    ``expose_output_len`` writes each request's true output length into the table's
    ``max_tokens`` column (an oracle; by default the policy does not know it, as in
    Andes). ``record`` keeps per-request results and per-iteration statistics (what
    :func:`simulate` reports); leave it off in a long-running server. ``cached_prefix``
    (a prefix cache, :mod:`qos.sim.cluster`): the prompt tokens of a request it already
    holds, asked at the request's first prefill, which then computes only the rest (at
    least one token, as vLLM does).
    """

    def __init__(
        self,
        policy: Policy,
        profile: LatencyProfile,
        *,
        preemption: PreemptionMode = "recompute",
        block_size: int = 16,
        kv_tokens: int | None = None,
        expose_output_len: bool = False,
        record: bool = False,
        pause: bool = False,
        cached_prefix: Callable[[SimRequest], int] | None = None,
    ) -> None:
        if preemption not in ("recompute", "swap"):
            raise ValueError(f"preemption: must be 'recompute' or 'swap', got {preemption!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size: must be an integer >= 1, got {block_size!r}")
        m = profile.kv_capacity_tokens if kv_tokens is None else kv_tokens
        if isinstance(m, bool) or not isinstance(m, int | np.integer) or m < block_size:
            raise ValueError(
                f"kv_tokens: must be an integer >= block_size ({block_size}), got {m!r}"
            )
        if preemption == "swap" and profile.swap_per_token_s is None:
            raise ValueError(
                f"preemption: profile {profile.name!r} has no swap cost; use recompute"
            )
        if profile.max_batch < 1:
            raise ValueError(f"profile: max_batch must be >= 1, got {profile.max_batch}")
        self.policy = policy
        self.profile = profile
        self.preemption: PreemptionMode = preemption
        self.pause = pause
        self.block_size = block_size
        self.total_blocks = int(m) // block_size
        self.kv_tokens = self.total_blocks * block_size  # M
        self.max_batch = int(profile.max_batch)
        self.capacity = Capacity(
            kv_tokens=self.kv_tokens,
            max_batch=self.max_batch,
            block_size=self.block_size,
            pauses=pause,
        )
        self.expose_output_len = expose_output_len
        self.record = record
        self._cached_prefix = cached_prefix

        self.table = RequestTable()
        self.clock = 0.0  # end of the last iteration (or the last idle step's time)
        self._pending: list[tuple[float, int, SimRequest]] = []  # heap by arrival
        self._aborted_pending: set[str] = set()
        self._live: dict[str, SimRequest] = {}  # submitted, not finished or aborted
        self._seq = 0  # submission counter (tie-break for equal arrivals)
        self._adm_counter = 0
        # Engine-private columns aligned with the table's rows (mirrored on removal).
        self._cap = 0
        self._target = np.zeros(0, dtype=np.int64)  # output tokens to generate
        self._sub_seq = np.zeros(0, dtype=np.int64)  # submission order
        self._adm_seq = np.zeros(0, dtype=np.int64)  # order of last admission
        self._swapped = np.zeros(0, dtype=bool)  # KV held in host memory
        self._grow(256)

        cls = type(policy)
        self._hook_tokens = cls.on_tokens is not Policy.on_tokens
        self._hook_prefill = cls.on_prefill is not Policy.on_prefill

        self.results: list[RequestResult] = []
        self.aborted: list[str] = []
        self._stats: dict[str, list[float]] = {k: [] for k in _STAT_FIELDS}
        self.iterations = 0
        self.total_preemptions = 0
        self.total_pauses = 0

    # -- submission ------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-int(tokens) // self.block_size)

    def submit(self, request: SimRequest) -> None:
        """Queue ``request`` for its arrival time. Raises ``ValueError`` if its id is live
        or if prompt + output can never fit in the KV cache."""
        if request.id in self._live:
            raise ValueError(f"request: id {request.id!r} is already in the engine")
        need = request.prompt_tokens + request.output_tokens
        if self.blocks_for(need) > self.total_blocks:
            raise ValueError(
                f"request: {request.id!r} needs {need} KV tokens (prompt {request.prompt_tokens}"
                f" + output {request.output_tokens}), more than the cache's M = "
                f"{self.kv_tokens}; it could never finish"
            )
        self._aborted_pending.discard(request.id)
        self._live[request.id] = request
        heapq.heappush(self._pending, (float(request.arrival), self._seq, request))
        self._seq += 1

    def abort(self, request_id: str) -> None:
        """Drop a request wherever it is: its KV is freed and it emits nothing more.

        A request already in the table hears ``policy.on_finish`` before it leaves.
        Unknown or already finished ids are ignored (abort is idempotent).
        """
        if request_id not in self._live:
            return
        del self._live[request_id]
        if request_id in self.table:
            r = self.table.row(request_id)
            self.policy.on_finish(self.table, r, self.clock)
            self._remove_row(request_id)
        else:
            self._aborted_pending.add(request_id)
        if self.record:
            self.aborted.append(request_id)

    # -- state -----------------------------------------------------------------------
    def _clean_pending(self) -> None:
        while self._pending and self._pending[0][2].id in self._aborted_pending:
            self._aborted_pending.discard(heapq.heappop(self._pending)[2].id)

    def next_arrival_time(self) -> float | None:
        """Arrival time of the earliest request submitted but not yet in the table."""
        self._clean_pending()
        return self._pending[0][0] if self._pending else None

    def has_work(self) -> bool:
        """Whether any request is waiting, running or yet to arrive."""
        return self.table.n > 0 or self.next_arrival_time() is not None

    @property
    def num_running(self) -> int:
        return int(self.table.running.sum())

    @property
    def num_waiting(self) -> int:
        return self.table.n - self.num_running

    @property
    def kv_used(self) -> int:
        """KV tokens (whole blocks) the running requests hold."""
        t = self.table
        ctx = t.context[t.running]
        return int(np.sum(-(-ctx // self.block_size))) * self.block_size

    # -- one iteration ---------------------------------------------------------------
    def step(self, now: float) -> StepResult:
        """Run one iteration starting at ``now``; see the module docstring."""
        if not math.isfinite(now):
            raise ValueError(f"now: must be finite, got {now}")
        if now < self.clock - CLOCK_TOLERANCE_S:
            raise ValueError(
                f"now: {now} is before the end of the previous iteration ({self.clock})"
            )
        now = max(float(now), self.clock)
        self._admit_arrivals(now)
        table = self.table
        n = table.n
        if n == 0:
            self.clock = now
            return StepResult(start=now, duration=0.0)

        t0 = time.perf_counter()
        mask = self.policy.schedule(table, self.capacity, now)
        decision_s = time.perf_counter() - t0
        run, need, dropped, forced = self._enforce(mask)
        rows = np.flatnonzero(run)
        if rows.size == 0:
            self.clock = now
            return StepResult(start=now, duration=0.0, decision_s=decision_s, dropped=dropped)

        running = table.running.copy()
        context = table.context  # fresh array (prompt + output)
        keys = table.keys
        profile = self.profile
        swap = self.preemption == "swap"
        extra_s = 0.0

        left_out = np.flatnonzero(running & ~run)
        if self.pause:
            for r in left_out.tolist():
                table.pause(r, now)
            self.total_pauses += left_out.size
            preempt_rows = self._evict_paused(run, need)
        else:
            preempt_rows = left_out
        preempted = [keys[r] for r in preempt_rows.tolist()]
        for r in preempt_rows.tolist():
            if swap:
                extra_s += profile.preempt_s(int(context[r]), "swap")
                self._swapped[r] = True
            table.preempt(r, now)
        self.total_preemptions += len(preempted)

        admit_rows = np.flatnonzero(run & ~running)
        admitted = [keys[r] for r in admit_rows.tolist()]
        prefill_tokens = 0
        first_prefill: list[int] = []
        resumed = 0  # swapped back in, or paused with the KV kept: they decode at once
        resumed_ctx = 0
        output = table.col("output")
        computed = table.col("computed")
        for r in admit_rows.tolist():
            if self._swapped[r] or computed[r] > 0:  # swapped out, or paused with its KV
                if self._swapped[r]:
                    extra_s += profile.preempt_s(int(context[r]), "swap")
                    self._swapped[r] = False
                resumed += 1
                resumed_ctx += int(context[r])
            else:
                fresh = int(context[r])
                if output[r] == 0:
                    first_prefill.append(r)
                    if self._cached_prefix is not None:
                        fresh -= min(self._cached_prefix(self._live[keys[r]]), fresh - 1)
                prefill_tokens += fresh
            table.admit(r)
            self._adm_seq[r] = self._adm_counter
            self._adm_counter += 1

        decode_rows = np.flatnonzero(run & running)
        decode_batch = decode_rows.size + resumed
        decode_ctx = int(context[decode_rows].sum()) + resumed_ctx
        duration = float(
            profile.iteration_s(
                decode_batch=decode_batch,
                decode_context_tokens=decode_ctx,
                prefill_tokens=prefill_tokens,
            )
        ) + float(extra_s)
        if not (duration > 0 and math.isfinite(duration)):
            raise RuntimeError(
                f"iteration at t={now}: duration {duration} s is not positive "
                f"(decode_batch={decode_batch}, prefill_tokens={prefill_tokens})"
            )
        kv_used = (int(need[rows].sum()) + int(self._paused_blocks().sum())) * self.block_size
        if kv_used > self.kv_tokens or rows.size > self.max_batch:
            raise RuntimeError(
                f"iteration at t={now}: {rows.size} requests using {kv_used} KV tokens "
                f"exceed M={self.kv_tokens} / max_batch={self.max_batch}"
            )
        end = now + duration

        # Tokens at the end of the iteration: hooks first, then the table.
        policy = self.policy
        if self._hook_prefill:
            prompt = table.col("prompt")
            for r in first_prefill:
                policy.on_prefill(table, r, int(prompt[r]))
        if self._hook_tokens:
            for r in rows.tolist():
                policy.on_tokens(table, r, 1)
        table.record_next_token(rows, end)
        out_now = table.col("output")[rows]
        target = self._target[rows]
        done = out_now >= target
        request_ids = [keys[r] for r in rows.tolist()]
        finished = [request_ids[i] for i in np.flatnonzero(done).tolist()]
        for key in finished:
            self._finish(key, end)

        self.clock = end
        self.iterations += 1
        if self.record:
            st = self._stats
            for name, value in (
                ("start", now),
                ("duration", duration),
                ("batch_size", rows.size),
                ("decode_batch", decode_batch),
                ("prefill_tokens", prefill_tokens),
                ("kv_used", kv_used),
                ("preemptions", len(preempted)),
                ("admissions", len(admitted)),
                ("waiting", n - rows.size),
                ("dropped", dropped),
                ("forced_preemptions", forced),
                ("decision_s", decision_s),
            ):
                st[name].append(value)
        return StepResult(
            start=now,
            duration=duration,
            request_ids=request_ids,
            token_index=out_now - 1,
            finished_mask=done,
            finished=finished,
            admitted=admitted,
            preempted=preempted,
            prefill_tokens=prefill_tokens,
            kv_used=kv_used,
            decision_s=decision_s,
            dropped=dropped,
            forced_preemptions=forced,
        )

    def _enforce(self, mask: object) -> tuple[np.ndarray, np.ndarray, int, int]:
        """The policy's mask clipped to M and max_batch, blocks needed per row, how many
        chosen rows were dropped and how many of those were running."""
        table = self.table
        n = table.n
        arr = np.asarray(mask)
        if arr.shape != (n,):
            raise RuntimeError(
                f"policy {self.policy.name!r} returned a mask of shape {arr.shape} for a "
                f"table of {n} rows"
            )
        run = arr.astype(bool, copy=True)
        bs = self.block_size
        need = (table.context + bs) // bs  # ceil((context + 1) / block_size)
        chosen = np.flatnonzero(run)
        if chosen.size <= self.max_batch and int(need[chosen].sum()) <= self.total_blocks:
            return run, need, 0, 0
        running = table.running[chosen]
        keep_running = chosen[running]
        keep_running = keep_running[np.argsort(self._adm_seq[keep_running], kind="stable")]
        admissions = chosen[~running]
        admissions = admissions[
            np.lexsort((self._sub_seq[admissions], table.col("arrival")[admissions]))
        ]
        order = np.concatenate([keep_running, admissions])
        run = pack_in_order(order, need, self.total_blocks, self.max_batch, n)
        forced = int(keep_running.size - run[keep_running].sum())
        return run, need, int(chosen.size - run.sum()), forced

    def _paused_blocks(self) -> np.ndarray:
        """Blocks each row holds while it does not run: its KV, if paused with it kept."""
        table = self.table
        held = ~table.running & ~self._swapped[: table.n] & (table.col("computed") > 0)
        blocks: np.ndarray = np.where(held, -(-table.col("computed") // self.block_size), 0)
        return blocks

    def _evict_paused(self, run: np.ndarray, need: np.ndarray) -> np.ndarray:
        """Paused rows that lose their KV so that what runs fits beside the rest: the one
        whose reader needs its next token last goes first, as the vLLM plugin does."""
        table = self.table
        blocks = self._paused_blocks()
        blocks[run] = 0  # resumed this iteration: counted in ``need``
        over = int(need[run].sum()) + int(blocks.sum()) - self.total_blocks
        if over <= 0:
            return np.zeros(0, dtype=np.int64)
        held = np.flatnonzero(blocks)
        deadline = table.col("dig_last")[held] + 1.0 / table.col("tds")[held]
        order = held[np.argsort(-deadline, kind="stable")]
        freed = np.cumsum(blocks[order])
        return order[: int(np.searchsorted(freed, over)) + 1]

    # -- table bookkeeping -----------------------------------------------------------
    def _grow(self, cap: int) -> None:
        for name in ("_target", "_sub_seq", "_adm_seq", "_swapped"):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[: old.size] = old
            setattr(self, name, new)
        self._cap = cap

    def _admit_arrivals(self, now: float) -> None:
        pending = self._pending
        table = self.table
        while pending and pending[0][0] <= now:
            arrival, seq, req = heapq.heappop(pending)
            if req.id in self._aborted_pending:
                self._aborted_pending.discard(req.id)
                continue
            r = table.add(
                req.id,
                arrival=arrival,
                prompt_tokens=req.prompt_tokens,
                ttft=req.ttft,
                tds=req.tds,
                tenant=req.tenant,
                weight=req.weight,
                max_tokens=req.output_tokens if self.expose_output_len else None,
                tier=req.tier,
            )
            if r >= self._cap:
                self._grow(max(2 * self._cap, r + 1))
            self._target[r] = req.output_tokens
            self._sub_seq[r] = seq
            self._adm_seq[r] = 0
            self._swapped[r] = False
            self.policy.on_arrival(table, r, arrival)

    def _remove_row(self, key: str) -> list[float]:
        table = self.table
        r = table.row(key)
        last = table.n - 1
        times = table.remove(key)
        if r != last:
            for name in ("_target", "_sub_seq", "_adm_seq", "_swapped"):
                arr = getattr(self, name)
                arr[r] = arr[last]
        return times

    def _finish(self, key: str, now: float) -> None:
        table = self.table
        r = table.row(key)
        target = int(self._target[r])
        produced = int(table.col("output")[r])
        preemptions = int(table.col("preemptions")[r])
        if produced != target:
            raise RuntimeError(f"request {key!r}: produced {produced} tokens, expected {target}")
        self.policy.on_finish(table, r, now)
        times = np.asarray(self._remove_row(key), dtype=float)
        req = self._live.pop(key)
        if times.size != target:
            raise RuntimeError(
                f"request {key!r}: {times.size} emission times for {target} tokens "
                "(a token was lost or duplicated)"
            )
        if times.size > 1 and np.any(np.diff(times) < 0):
            raise RuntimeError(f"request {key!r}: emission times are not non-decreasing")
        if self.record:
            rel = times - req.arrival
            self.results.append(
                RequestResult(
                    id=req.id,
                    tenant=req.tenant,
                    tier=req.tier,
                    ttft=req.ttft,
                    tds=req.tds,
                    arrival=req.arrival,
                    prompt_tokens=req.prompt_tokens,
                    output_tokens=target,
                    times=rel,
                    preemptions=preemptions,
                    andes_qoe=andes_qoe(rel, req.ttft, req.tds),
                    monotone_qoe=monotone_qoe(rel, req.ttft, req.tds),
                    freezes=freezes(rel, req.tds),
                    idle_s=user_idle_latency(rel, req.ttft, req.tds),
                )
            )

    def iteration_stats(self) -> dict[str, np.ndarray]:
        """Per-iteration statistics recorded so far (``record=True``), as arrays."""
        return {k: np.asarray(v, dtype=float) for k, v in self._stats.items()}


# -- offline simulation --------------------------------------------------------------------
def _pct(values: np.ndarray) -> dict[str, float | None]:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"mean": None, **{f"p{p}": None for p in _PERCENTILES}}
    out: dict[str, float | None] = {"mean": float(v.mean())}
    out.update(
        {
            f"p{p}": float(x)
            for p, x in zip(_PERCENTILES, np.percentile(v, _PERCENTILES), strict=True)
        }
    )
    return out


def _jsonable(x: object) -> object:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


@dataclass
class SimResult:
    """Outcome of :func:`simulate`: per-request results, aggregates, iteration stats.

    Requests left unfinished (only possible with ``max_time``) are listed in
    ``unfinished`` and count as QoE 0 in the QoE averages and percentiles; TTFT and TDS
    statistics cover finished requests. The makespan runs from the first arrival to the
    last token.
    """

    policy: str
    profile: str
    preemption: str
    block_size: int
    kv_tokens: int
    max_batch: int
    requests: list[RequestResult]
    unfinished: list[str]
    iterations: dict[str, np.ndarray]
    makespan: float

    def _qoe(self, attr: str) -> np.ndarray:
        vals = [getattr(r, attr) for r in self.requests] + [0.0] * len(self.unfinished)
        return np.asarray(vals, dtype=float)

    @property
    def n_requests(self) -> int:
        return len(self.requests) + len(self.unfinished)

    @property
    def avg_qoe(self) -> float:
        q = self._qoe("andes_qoe")
        return float(q.mean()) if q.size else math.nan

    @property
    def avg_monotone_qoe(self) -> float:
        q = self._qoe("monotone_qoe")
        return float(q.mean()) if q.size else math.nan

    @property
    def output_tokens(self) -> int:
        return int(sum(r.output_tokens for r in self.requests))

    @property
    def throughput(self) -> float:
        """Output tokens per second over the makespan."""
        return self.output_tokens / self.makespan if self.makespan > 0 else math.nan

    @property
    def preemptions_per_request(self) -> float:
        n = len(self.requests)
        return sum(r.preemptions for r in self.requests) / n if n else math.nan

    def smooth_goodput(self, alpha: float = 2.5, penalty: IdlePenalty = "linear") -> float:
        """Σ benefit / makespan (Wang et al. Eq. 10-11), α = 2.5, linear idle penalty."""
        if not self.makespan > 0:
            return math.nan
        total = sum(
            request_benefit(r.times, r.ttft, r.tds, alpha=alpha, penalty=penalty)
            for r in self.requests
        )
        return float(total) / self.makespan

    def reader(self) -> ReaderSummary:
        """Freezes and user idle latency over the finished requests (:mod:`qos.metrics`)."""
        return reader_summary(
            [r.freezes.longest_s for r in self.requests], [r.idle_s for r in self.requests]
        )

    def serving(self) -> ServingMetrics | None:
        """``vllm bench serve``-style metrics over the finished requests."""
        if not self.requests or not self.makespan > 0:
            return None
        records = [
            RequestRecord(
                prompt_tokens=r.prompt_tokens,
                chunks=np.column_stack([r.times, np.ones(r.times.size)]),
            )
            for r in self.requests
        ]
        return serving_metrics(records, self.makespan)

    def summary(self) -> dict[str, Any]:
        """Aggregates as a JSON-serialisable dict (NaN becomes None)."""
        it = self.iterations
        dec = it.get("decision_s", np.zeros(0))
        serving = self.serving()
        out = {
            "policy": self.policy,
            "profile": self.profile,
            "preemption": self.preemption,
            "block_size": self.block_size,
            "kv_tokens": self.kv_tokens,
            "max_batch": self.max_batch,
            "requests": self.n_requests,
            "completed": len(self.requests),
            "unfinished": len(self.unfinished),
            "avg_qoe": self.avg_qoe,
            "avg_monotone_qoe": self.avg_monotone_qoe,
            "qoe": _pct(self._qoe("andes_qoe")),
            "monotone_qoe": _pct(self._qoe("monotone_qoe")),
            "ttft_s": _pct(np.asarray([r.actual_ttft for r in self.requests])),
            "tds": _pct(np.asarray([r.actual_tds for r in self.requests])),
            "makespan_s": self.makespan,
            "output_tokens": self.output_tokens,
            "throughput_tok_s": self.throughput,
            "preemptions_per_request": self.preemptions_per_request,
            "smooth_goodput": self.smooth_goodput(),
            "reader": self.reader().as_dict() if self.requests else None,
            "serving": asdict(serving) if serving is not None else None,
            "iterations": {
                "count": int(it["start"].size) if "start" in it else 0,
                "mean_batch": float(it["batch_size"].mean()) if dec.size else None,
                "max_kv_used": int(it["kv_used"].max()) if dec.size else None,
                "mean_kv_used": float(it["kv_used"].mean()) if dec.size else None,
                "prefill_tokens": int(it["prefill_tokens"].sum()) if dec.size else 0,
                "dropped": int(it["dropped"].sum()) if dec.size else 0,
                "forced_preemptions": int(it["forced_preemptions"].sum()) if dec.size else 0,
                "decision_ms_mean": float(dec.mean() * 1e3) if dec.size else None,
                "decision_ms_p99": float(np.percentile(dec, 99) * 1e3) if dec.size else None,
                "decision_s_total": float(dec.sum()),
            },
        }
        result = _jsonable(out)
        assert isinstance(result, dict)
        return result


def simulate(
    workload: list[SimRequest],
    policy: Policy,
    profile: LatencyProfile,
    *,
    preemption: PreemptionMode = "recompute",
    block_size: int = 16,
    kv_tokens: int | None = None,
    max_time: float | None = None,
    expose_output_len: bool = False,
    pause: bool = False,
    readers: ReaderSim | None = None,
) -> SimResult:
    """Run ``workload`` through one :class:`Engine` until every request finishes (or,
    with ``readers``, until its reader leaves: :mod:`qos.sim.readers` plays the clients,
    and their signals, against the engine between iterations).

    Event-driven: when nothing can run the clock jumps to the next arrival. With
    ``max_time`` no iteration starts at or after that time and what is left is reported
    unfinished. Pass a fresh ``policy`` per run (policies may keep state). Raises
    ``RuntimeError`` if an invariant breaks or the policy stalls (schedules nothing with
    requests waiting and none left to arrive).
    """
    if max_time is not None and not max_time > 0:
        raise ValueError(f"max_time: must be > 0, got {max_time}")
    engine = Engine(
        policy,
        profile,
        preemption=preemption,
        block_size=block_size,
        kv_tokens=kv_tokens,
        expose_output_len=expose_output_len,
        record=True,
        pause=pause,
    )
    for req in sorted(workload, key=lambda r: r.arrival):
        engine.submit(req)
    start = min((r.arrival for r in workload), default=0.0)
    now = start
    last_token = start
    while engine.has_work():
        if engine.table.n == 0:
            arrival = engine.next_arrival_time()
            assert arrival is not None  # has_work: something is yet to arrive
            now = max(now, arrival)
        if max_time is not None and now >= max_time:
            break
        if readers is not None:
            readers.before_step(engine, now)
            if not engine.has_work():  # the last readers left
                break
        res = engine.step(now)
        if readers is not None:
            readers.after_step(res.request_ids, res.end, res.finished)
        if res.batch_size == 0:
            nxt = engine.next_arrival_time()
            if nxt is None or nxt <= now:
                raise RuntimeError(
                    f"policy {policy.name!r} scheduled nothing at t={now} with "
                    f"{engine.table.n} requests waiting and no later arrival: stalled"
                )
            now = nxt
            continue
        now = last_token = res.end
    unfinished = sorted(engine._live)
    if max_time is None and unfinished:
        raise RuntimeError(f"{len(unfinished)} requests never finished: {unfinished[:5]}...")
    return SimResult(
        policy=policy.name,
        profile=profile.name,
        preemption=preemption,
        block_size=engine.block_size,
        kv_tokens=engine.kv_tokens,
        max_batch=engine.max_batch,
        requests=engine.results,
        unfinished=unfinished,
        iterations=engine.iteration_stats(),
        makespan=last_token - start,
    )
