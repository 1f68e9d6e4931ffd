"""The qos policies inside vLLM's v1 engine: ``--scheduler-cls qos.vllm.AndesScheduler``.

:class:`AndesScheduler` subclasses vLLM's own ``Scheduler`` and keeps everything vLLM
does (token budget, chunked prefill, KV block allocation, prefix caching, the
``max_num_seqs`` limit, the model-runner bookkeeping); it only decides *which* requests
those mechanisms get to work on. Each iteration:

1. **Table.** A :class:`~qos.policy.table.RequestTable` row per live request, added in
   ``add_request`` (tags from ``sampling_params.extra_args``, :mod:`qos.tags`),
   removed in ``_free_request`` (finished or aborted); running flags are synced from
   vLLM's ``running`` list before the decision (vLLM may have preempted on its own).
2. **Decision.** The configured qos policy (by default Andes as tokenpace ships it,
   :func:`qos.policy.andes.tokenpace_andes`, the same code the simulator runs;
   :mod:`qos.vllm.config`) returns the mask of rows to run, on a
   :class:`~qos.policy.table.Capacity` of the engine's real KV blocks and
   ``max_num_seqs``. At most one decision per ``TOKENPACE_DECISION_INTERVAL_S``
   (0.1 s), sooner when a request arrives or leaves or vLLM preempted on its own; in
   between the last decision stands.
3. **Pause or preempt.** Running requests outside the mask stop being scheduled. With
   ``TOKENPACE_PAUSE`` on (the default) they are *paused*: they keep their KV blocks
   and stay in ``running`` between steps, but are taken out of it while vLLM's
   ``schedule()`` runs, so vLLM does not schedule them, and its model runner keeps
   their state for when they come back (vLLM's own path for running requests that a
   step leaves out); a paused request the policy runs again decodes at once, nothing
   recomputed. The Andes paper preempts by swapping KV to host memory (§4.2
   "Preemption overhead", §6.1), at about one iteration's cost; vLLM v1 only
   recomputes, so pausing is what keeps preemption that cheap here.
   Paused requests keep their blocks only while the cache has room for the requests
   the policy runs: the ones whose user needs tokens soonest (earliest digestion end,
   Eq. 1) keep theirs; the rest, and at any step the paused requests whose blocks the
   running ones need for that step's tokens (the ones needed last go first), are
   preempted with vLLM's own ``_preempt_request`` (KV freed, recompute on resume,
   sent to the workers in ``preempted_req_ids``), before vLLM schedules anything.
4. **Admit.** Waiting requests outside the mask are held out of the ``waiting`` queue
   while vLLM's ``schedule()`` runs, so vLLM admits only the policy's admissions (in
   its queue order: resumed requests first, then arrival order) and as many of them as
   its limits allow this step (token budget, free blocks, ``max_num_seqs``); the held
   requests go back to the queue afterwards, in their order. vLLM still preempts on
   its own if running requests outgrow the cache (Andes packs to its KV watermark, so
   this is rare); the policy sees it at the next decision.
5. **Reader signals.** With ``TOKENPACE_REDIS_URL``, a thread hears the signals the
   gateway publishes (:mod:`qos.vllm.reader_channel`); each step first records the ones
   heard since the last (``table.reader_signal``, the request found by its
   ``tp_request_id`` tag), and a change of presence forces a decision at once. No Redis
   call on the step path.
6. **Tokens.** ``update_from_output`` timestamps every request's output growth into
   the table (the digestion sums behind Andes's Q_serve/Q_wait forecasts, Eq. 1-2)
   and, with ``TOKENPACE_PROFILE=online``, feeds the step time to
   :class:`~qos.vllm.online.OnlineProfile`.

**Async scheduling** (vLLM's default on GPUs): ``--scheduler-cls
qos.vllm.AndesScheduler`` builds :class:`AsyncAndesScheduler`, the same body on vLLM's
``AsyncScheduler``, whenever ``scheduler_config.async_scheduling`` is on (the choice is
made by ``TimedScheduler.__new__``). The engine then schedules step N+1 before it has
processed step N's output, so each decision sees the tokens one step behind vLLM; what
that costs and why it is bounded is in docs/architecture/vllm-plugin-versions.md. What
the plugin adds for it: the in-flight tokens' KV blocks are taken off the room the
policy packs (:meth:`AndesScheduler._step_capacity`) and counted in the blocks the
running requests need (:meth:`AndesScheduler._make_room`); a token delivered to a
request preempted while its step was in flight reaches the user but adds no KV to the
table; and a step's model time is measured from when it could start on the device
(:meth:`TimedScheduler.update_from_output`). Supported vLLM:
:data:`qos.vllm.SUPPORTED_VLLM_RANGE`, checked when this module is imported.

:class:`TimedScheduler` is vLLM's stock scheduler plus the same step timing and stats
file, the baseline the benchmark compares against (:class:`AsyncTimedScheduler` under
async scheduling, chosen the same way).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from itertools import filterfalse
from typing import Any, ClassVar

import numpy as np
import vllm

from qos.vllm import check_vllm_version

check_vllm_version(vllm.__version__)

# The scheduler API is private to vLLM: import it only once the version is known good.
from vllm.logger import init_logger  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreOutputs  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

from qos.latency import LatencyProfile, get_profile  # noqa: E402
from qos.policy.andes import Andes  # noqa: E402
from qos.policy.base import Policy  # noqa: E402
from qos.policy.presence import away_share, rate_given_back  # noqa: E402
from qos.policy.table import Capacity, RequestTable  # noqa: E402
from qos.signals import Presence  # noqa: E402
from qos.tags import decode_tags  # noqa: E402
from qos.vllm.config import PluginConfig  # noqa: E402
from qos.vllm.online import OnlineProfile  # noqa: E402
from qos.vllm.reader_channel import ReaderInbox, ReaderSubscriber  # noqa: E402

logger = init_logger("vllm.tokenpace")  # under "vllm": vLLM configures its handlers

STATS_INTERVAL_S = 1.0  # how often the stats file is rewritten while the engine works


class TimedScheduler(Scheduler):
    """vLLM's scheduler, timed: scheduling time, model time and preemptions per step.

    Counters live in :attr:`stats`; with ``TOKENPACE_STATS_FILE`` set they are written
    there as JSON about once a second, whenever the engine falls idle, and at shutdown.
    Time inside schedule() is counted twice: wall-clock (``schedule_s``), and the engine
    thread's own CPU time (``schedule_cpu_s``), which leaves out what other processes
    sharing its CPU ran meanwhile. A step's model time runs from when the step could
    start on the device (the end of its schedule(), or the previous step's completion
    if that came later: under async scheduling the next step is queued behind the
    running one) to its completion (the start of its update_from_output()), so idle
    waits between requests never count, and with two steps in flight each is timed on
    its own.

    Constructed with ``scheduler_config.async_scheduling`` on, the class named is
    swapped for its variant on vLLM's ``AsyncScheduler`` (:data:`ASYNC_VARIANTS`), so
    one ``--scheduler-cls`` serves both modes.
    """

    running: list[Request]  # vLLM's running queue (declared: the scheduler reorders it)
    ASYNC_VARIANTS: ClassVar[dict[type[Scheduler], type[Scheduler]]] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        if config.scheduler_config.async_scheduling and not issubclass(cls, AsyncScheduler):
            variant = TimedScheduler.ASYNC_VARIANTS.get(cls)
            if variant is None:
                raise TypeError(
                    f"{cls.__qualname__} subclasses vLLM's synchronous Scheduler and has no "
                    "async variant: register one in TimedScheduler.ASYNC_VARIANTS (a "
                    "subclass of it and vLLM's AsyncScheduler), or start vLLM with "
                    "async scheduling off"
                )
            return super().__new__(variant)
        return super().__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.async_scheduling = isinstance(self, AsyncScheduler)
        self.timer: Callable[[], float] = time.perf_counter  # the step timing's clock
        self.stats_file = os.environ.get("TOKENPACE_STATS_FILE") or None
        self.stats: dict[str, Any] = {
            "scheduler": type(self).__name__,
            "async_scheduling": self.async_scheduling,
            "vllm_policy": self.scheduler_config.policy,
            "steps": 0,  # steps that scheduled at least one token
            "schedule_s": 0.0,  # time inside schedule(), policy included
            "schedule_cpu_s": 0.0,  # the engine thread's CPU time inside schedule()
            "model_s": 0.0,  # from the end of schedule() to update_from_output()
            "max_model_s": 0.0,  # the longest such step
            "update_s": 0.0,  # time inside update_from_output()
            "preemptions": 0,
            "scheduled_tokens": 0,
        }
        # the steps scheduled and not yet processed, each with the end of its schedule()
        # (one under synchronous scheduling, up to two under async)
        self._in_flight: deque[tuple[SchedulerOutput, float]] = deque()
        self._last_done = 0.0  # when the last step's output came back
        self._last_write = 0.0

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        start, cpu_start = self.timer(), time.thread_time()
        output = self._schedule_step(throttle_prefills)
        end, cpu_end = self.timer(), time.thread_time()
        if output.total_num_scheduled_tokens > 0:
            self._in_flight.append((output, end))
            stats = self.stats
            stats["steps"] += 1
            stats["schedule_s"] += end - start
            stats["schedule_cpu_s"] += cpu_end - cpu_start
            stats["preemptions"] += len(output.preempted_req_ids or ())
            stats["scheduled_tokens"] += output.total_num_scheduled_tokens
        return output

    def _schedule_step(self, throttle_prefills: bool) -> SchedulerOutput:
        """One scheduling decision (overridden by the policy-driven scheduler)."""
        return super().schedule(throttle_prefills)

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        start = self.timer()
        outputs: dict[int, EngineCoreOutputs] = super().update_from_output(
            scheduler_output, model_runner_output
        )
        end = self.timer()
        scheduled_at = self._scheduled_at(scheduler_output)
        if scheduled_at is not None:
            model_s = start - max(scheduled_at, self._last_done)
            self._last_done = start
            self.stats["model_s"] += model_s
            self.stats["max_model_s"] = max(self.stats["max_model_s"], model_s)
            self.stats["update_s"] += end - start
            self._observe_step(scheduler_output, model_s)
        idle = not self.requests
        if self.stats_file is not None and (idle or end - self._last_write >= STATS_INTERVAL_S):
            self._last_write = end
            self.write_stats()
        return outputs

    def _scheduled_at(self, scheduler_output: SchedulerOutput) -> float | None:
        """When the schedule() that made this output ended (None: it scheduled nothing).

        The engine processes outputs in the order it scheduled them, empty ones included
        (which are not queued here); any older ones it never processed (dropped by a
        reset) are discarded on the way.
        """
        in_flight = self._in_flight
        if not scheduler_output.total_num_scheduled_tokens:
            return None
        while in_flight:
            output, end = in_flight.popleft()
            if output is scheduler_output:
                return end
        return None

    def _observe_step(self, scheduler_output: SchedulerOutput, model_s: float) -> None:
        """Hook: one step ran on the model for ``model_s`` seconds."""

    def write_stats(self) -> None:
        """Write :attr:`stats` to ``TOKENPACE_STATS_FILE`` (atomically: write, then rename)."""
        if self.stats_file is None:
            return
        tmp = f"{self.stats_file}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.stats, f)
        os.replace(tmp, self.stats_file)

    def shutdown(self) -> None:
        self.write_stats()
        super().shutdown()


class AndesScheduler(TimedScheduler):
    """vLLM's scheduler driven by a qos policy (see the module docstring)."""

    def __init__(self, vllm_config: Any, kv_cache_config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        self.qos_config = PluginConfig.from_env()
        # The block pool's first block is a reserved null block, never allocated.
        blocks = self.kv_cache_manager.block_pool.num_gpu_blocks - 1
        self.capacity = Capacity(
            kv_tokens=blocks * self.block_size,
            max_batch=self.max_num_running_reqs,
            block_size=self.block_size,
            pauses=self.qos_config.pause,
            decision_interval_s=self.qos_config.decision_interval_s,
        )
        self.online: OnlineProfile | None = None
        if self.qos_config.profile == "online":
            self.online = OnlineProfile(
                kv_capacity_tokens=self.capacity.kv_tokens, max_batch=self.capacity.max_batch
            )
            profile = self.online.profile
        else:
            profile = get_profile(self.qos_config.profile)
        self.qos_policy = self.qos_config.build_policy(profile)
        self.table = RequestTable()
        self.clock: Callable[[], float] = time.time  # the clock of request.arrival_time
        self._prefilled: set[str] = set()
        self._synced: set[Request] = set()  # the requests the table marks running
        self._chosen: set[Request] = set()  # the requests the last decision runs
        # dropped by a decision with their KV kept: in ``running`` between steps, out of
        # it while vLLM schedules, ``running = False`` in the table (``table.pause``)
        self._paused: set[Request] = set()
        self._decided_at = -np.inf
        self._dirty = True  # a request arrived or left since the last decision
        # reader signals (qos.vllm.reader_channel): the gateway's request id (the
        # tp_request_id tag) of each request, and the last presence its client stated
        self.reader_inbox = ReaderInbox()
        self.reader_channel: ReaderSubscriber | None = None
        self._by_gateway_id: dict[str, str] = {}
        self._gateway_id: dict[str, str] = {}
        self._presence: dict[str, Presence] = {}
        cfg = self.qos_config
        if cfg.redis_url is not None:
            self.reader_channel = ReaderSubscriber(cfg.redis_url, cfg.key_prefix, self.reader_inbox)
            self.reader_channel.start()
        self.stats.update(
            policy=self.qos_policy.name,
            policy_s=0.0,
            policy_cpu_s=0.0,
            decisions=0,
            policy_preemptions=0,
            pauses=0,
            reader_signals=0,  # applied to a request in the table
            reader_signals_unknown=0,  # for no request here (ended, or another engine's)
            profile=_describe(profile),
        )
        logger.info(
            "tokenpace %s (%s scheduling): policy %s, profile %s, KV %d tokens in blocks of "
            "%d, max batch %d",
            type(self).__name__,
            "async" if self.async_scheduling else "synchronous",
            self.qos_policy.name,
            self.qos_config.profile,
            self.capacity.kv_tokens,
            self.capacity.block_size,
            self.capacity.max_batch,
        )

    @property
    def paused(self) -> frozenset[Request]:
        """The requests a decision dropped with their KV cache kept (waiting to resume)."""
        return frozenset(self._paused)

    # -- the table follows vLLM's requests ------------------------------------------
    def add_request(self, request: Request) -> None:
        known = request.request_id in self.requests
        super().add_request(request)
        if known or request.request_id not in self.requests:
            return  # a streaming-input continuation of a request already in the table
        extra = request.sampling_params.extra_args if request.sampling_params else None
        tags, problems = decode_tags(extra, self.qos_config.defaults)
        if problems:
            logger.warning("request %s: %s", request.request_id, "; ".join(problems))
        row = self.table.add(
            request.request_id,
            arrival=request.arrival_time,
            prompt_tokens=request.num_prompt_tokens,
            ttft=tags.ttft,
            tds=tags.tds,
            tenant=tags.tenant,
            weight=tags.weight,
            max_tokens=request.max_tokens,
            tier=tags.tier,
        )
        self.qos_policy.on_arrival(self.table, row, self.clock())
        if tags.request_id is not None:
            self._by_gateway_id[tags.request_id] = request.request_id
            self._gateway_id[request.request_id] = tags.request_id
        self._dirty = True

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        key = request.request_id
        if key in self.table:
            self.qos_policy.on_finish(self.table, self.table.row(key), self.clock())
            self.table.remove(key)
            self._prefilled.discard(key)
            self._synced.discard(request)
            self._chosen.discard(request)
            self._paused.discard(request)
            self._presence.pop(key, None)
            gateway_id = self._gateway_id.pop(key, None)
            if gateway_id is not None:
                self._by_gateway_id.pop(gateway_id, None)
            self._dirty = True
        return super()._free_request(request, delay_free_blocks=delay_free_blocks)

    def _sync_running(self, now: float) -> None:
        """Mirror vLLM's ``running`` list, less the paused requests, into the table
        (admissions, resumptions and vLLM's own preemptions).

        Compares it with the last sync's as sets of requests (in C), so a step that
        changed nothing costs O(running) in C and the table sees O(changes) updates,
        preemptions first, each in row order. (The plugin's own pauses and preemptions
        update the table and ``_synced`` when it makes them.)
        """
        running = set(self.running)
        if self._paused:
            running -= self._paused
        left, joined = self._synced - running, running - self._synced
        if not (left or joined):
            return
        self._synced = running
        table = self.table
        for r in sorted(table.row(request.request_id) for request in left):
            table.preempt(r, now)
        prompt = table.col("prompt")
        for r in sorted(table.row(request.request_id) for request in joined):
            key = table.keys[r]
            if key not in self._prefilled:
                self._prefilled.add(key)
                self.qos_policy.on_prefill(table, r, int(prompt[r]))
            table.admit(r)

    # -- one decision ----------------------------------------------------------------
    def _schedule_step(self, throttle_prefills: bool) -> SchedulerOutput:
        held: list[Request] = []
        preempted = 0
        now = self.clock()
        if self.reader_inbox:
            self._apply_reader_signals(now)
        if self.table.n:
            self._sync_running(now)
            interval = self.qos_config.decision_interval_s
            if self._dirty or now - self._decided_at >= interval:
                preempted = self._decide(now)
            preempted += self._make_room(now)
            held = self._hold_out()
        paused = self._step_aside()
        try:
            output = super()._schedule_step(throttle_prefills)
        finally:
            self._put_back(held)
            self.running.extend(paused)
        if len(output.preempted_req_ids or ()) > preempted:
            self._dirty = True  # vLLM preempted on its own: decide again next step
        self._sync_running(now)
        return output

    def _apply_reader_signals(self, now: float) -> None:
        """Record the signals heard since the last step in the table (each at when it
        arrived, never later than ``now``); a change of presence forces a decision."""
        table, stats = self.table, self.stats
        for item in self.reader_inbox.drain():
            key = self._by_gateway_id.get(item.request_id)
            at = min(item.received_at, now)
            if key is None or not table.reader_signal(key, item.signal, at):
                stats["reader_signals_unknown"] += 1
                continue
            stats["reader_signals"] += 1
            presence = item.signal.presence
            if self._presence.get(key, Presence.WATCHING) is not presence:
                self._presence[key] = presence
                self._dirty = True

    def write_stats(self) -> None:
        if self.reader_channel is not None:
            self.stats.update(self.reader_channel.stats())
        now = self.clock()  # what the guard makes of the signals, for operators
        self.stats["readers_away_share"] = away_share(self.table, now)
        self.stats["rate_given_back_tps"] = rate_given_back(self.table, now)
        super().write_stats()

    def shutdown(self) -> None:
        if self.reader_channel is not None:
            self.reader_channel.stop()
        super().shutdown()

    def _decide(self, now: float) -> int:
        """Ask the policy; preempt the running requests it dropped (how many it preempted)."""
        table = self.table
        start, cpu_start = time.perf_counter(), time.thread_time()
        capacity = self._step_capacity()
        run = self.qos_policy.schedule(table, capacity, now)
        self.stats["policy_s"] += time.perf_counter() - start
        self.stats["policy_cpu_s"] += time.thread_time() - cpu_start
        self.stats["decisions"] += 1
        self._decided_at, self._dirty = now, False
        rows = np.flatnonzero(run).tolist()
        self._chosen = set(map(self.requests.__getitem__, map(table.keys.__getitem__, rows)))
        return self._stop_dropped(run, capacity, now)

    def _step_capacity(self) -> Capacity:
        """The capacity the policy packs this step: the engine's, less the KV blocks that
        the in-flight step's tokens (async scheduling) hold beyond what the table counts.

        The table knows the tokens that came back; a request with ``p`` tokens in flight
        (vLLM's ``num_output_placeholders``: one a decode step, more with speculative
        decoding) already holds the blocks for them, so after its next token it holds
        ``ceil((n + p + 1) / B)`` blocks where the table's demand counts
        ``ceil((n + 1) / B)``, for ``n`` tokens of prompt and output. A request whose
        tokens in flight reach its ``max_tokens`` ends with them: vLLM does not schedule
        it again (the same test as ``Scheduler.schedule``'s), so it needs no more blocks.
        Under synchronous scheduling nothing is in flight when the policy decides.
        """
        if not self.async_scheduling:
            return self.capacity
        size = self.block_size
        extra = 0
        for request in self.running:  # paused requests included: they keep their blocks
            in_flight = request.num_output_placeholders
            if not in_flight:
                continue
            certain = request.num_computed_tokens + 2 - in_flight  # tokens it will have
            if certain < request.num_prompt_tokens + request.max_tokens:  # scheduled again
                after = request.num_tokens + 1
                extra += -(-(after + in_flight) // size) - -(-after // size)
        if not extra:
            return self.capacity
        return replace(self.capacity, kv_tokens=self.capacity.kv_tokens - extra * size)

    def _stop_dropped(self, run: np.ndarray, capacity: Capacity, now: float) -> int:
        """Pause or preempt the requests outside ``run`` that hold KV; resume the paused
        ones inside it (module docstring, step 3). Returns how many it preempted."""
        table, requests, paused = self.table, self.requests, self._paused
        held = np.zeros(table.n, dtype=bool)  # the paused requests' rows
        if paused:
            held[[table.row(request.request_id) for request in paused]] = True
            paused.difference_update(requests[table.keys[r]] for r in np.flatnonzero(held & run))
        stop = np.flatnonzero((table.running | held) & ~run)
        if stop.size == 0:
            return 0
        keep = np.zeros(table.n, dtype=bool)
        if self.qos_config.pause:
            # what the requests it runs leave of the cache (their next token included);
            # the paused requests whose users need tokens soonest (Eq. 1) keep theirs
            demand = capacity.demand(table)
            room = capacity.kv_tokens - int(demand[run].sum())
            order = stop[np.argsort(table.col("dig_last")[stop], kind="stable")]
            keep[order[np.cumsum(demand[order]) <= room]] = True
        count = 0
        for r in stop.tolist():
            request = requests[table.keys[r]]
            if request.status != RequestStatus.RUNNING:
                continue
            if keep[r]:
                if not held[r]:
                    paused.add(request)
                    self._synced.discard(request)
                    table.pause(r, now)
                    self.stats["pauses"] += 1
                continue
            self._preempt(request, r, now)
            count += 1
        return count

    def _preempt(self, request: Request, row: int, now: float) -> None:
        """Preempt a running or paused request the vLLM way (KV freed, recompute on resume)."""
        self.running.remove(request)
        self._paused.discard(request)
        self._synced.discard(request)
        self._preempt_request(
            request, time.monotonic(), drop_stale_output=self.requires_kv_delivery
        )
        self.table.preempt(row, now)
        self.stats["policy_preemptions"] += 1

    def _make_room(self, now: float) -> int:
        """Preempt paused requests, the ones needed last first, while the requests that
        run may need more new blocks this step than are free: a block for each whose KV
        fills its blocks (a decode step's token starts a new one), more for a prefill
        (at most its whole remaining prompt). A request's tokens to compute run to its
        known tokens plus those still in flight (async scheduling), as vLLM counts them."""
        if not self._paused:
            return 0
        pool, paused, size = self.kv_cache_manager.block_pool, self._paused, self.block_size
        need = sum(
            -(-(request.num_tokens + request.num_output_placeholders) // size)
            - -(-request.num_computed_tokens // size)
            for request in self.running
            if request not in paused
        )
        if pool.get_num_free_blocks() >= need:
            return 0
        table = self.table
        dig_last = table.col("dig_last")
        rows = {request: table.row(request.request_id) for request in self._paused}
        count = 0
        for request in sorted(rows, key=lambda q: dig_last[rows[q]], reverse=True):
            self._preempt(request, rows[request], now)
            count += 1
            if pool.get_num_free_blocks() >= need:
                break
        return count

    def _step_aside(self) -> list[Request]:
        """Take the paused requests out of ``running`` while vLLM schedules (in order)."""
        if not self._paused:
            return []
        paused = self._paused
        aside = [request for request in self.running if request in paused]
        self.running = [request for request in self.running if request not in paused]
        return aside

    def _hold_out(self) -> list[Request]:
        """Take the waiting requests the last decision did not choose out of ``waiting``.

        Every waiting request is in the table, so these are the waiting requests outside
        the chosen set, in queue order. With vLLM's FCFS queue (a deque) the filtering
        runs in C, a few nanoseconds per waiting request.
        """
        waiting, chosen = self.waiting, self._chosen
        held = list(filterfalse(chosen.__contains__, waiting))
        if held and isinstance(waiting, deque):
            kept = list(filter(chosen.__contains__, waiting))
            waiting.clear()
            waiting.extend(kept)
        elif held:
            waiting.remove_requests(held)
        return held

    def _put_back(self, held: list[Request]) -> None:
        """Return the held requests to the end of ``waiting``, in their order."""
        if isinstance(self.waiting, deque):
            self.waiting.extend(held)  # what add_request does, one by one
        else:
            for request in held:
                self.waiting.add_request(request)

    # -- tokens ----------------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, Any]:
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        table, requests = self.table, self.requests
        rows: list[int] = []
        counts: list[int] = []
        freed: list[int] = []
        for rid in scheduler_output.num_scheduled_tokens:
            try:
                row = table.row(rid)
            except KeyError:
                continue  # finished (and removed) in this step
            request = requests[rid]
            rows.append(row)
            counts.append(request.num_output_tokens)
            if request.status == RequestStatus.PREEMPTED:
                freed.append(row)
        if rows:
            self._record_tokens(np.array(rows), np.array(counts), self.clock())
        if freed:
            # Preempted while this step was in flight (async scheduling): vLLM delivers
            # its token to the user, but its KV was freed; the table keeps it at none.
            table.col("computed")[freed] = 0
        return outputs

    def _record_tokens(self, rows: np.ndarray, counts: np.ndarray, now: float) -> None:
        """Timestamp each row's output growth to ``counts`` tokens into the table.

        The policy hears of the tokens first (``on_tokens``, in scheduling order, only
        if it listens); the usual single new token per request is recorded in bulk.
        """
        table, policy = self.table, self.qos_policy
        new = counts - table.col("output")[rows]
        grew = new > 0
        rows, new = rows[grew], new[grew]
        if type(policy).on_tokens is not Policy.on_tokens:
            for r, n in zip(rows.tolist(), new.tolist(), strict=True):
                policy.on_tokens(table, r, n)
        one = new == 1
        table.record_next_token(rows[one], now)
        for r, n in zip(rows[~one].tolist(), new[~one].tolist(), strict=True):
            table.record_tokens(r, now, n)

    def _observe_step(self, scheduler_output: SchedulerOutput, model_s: float) -> None:
        if self.online is None:
            return
        counts = list(scheduler_output.num_scheduled_tokens.values())
        decode = counts.count(1)  # requests decoding one token; the rest is prefill
        prefill = sum(counts) - decode
        if self.online.observe(decode, prefill, model_s):
            self._install_profile(self.online.profile)

    def _install_profile(self, profile: LatencyProfile) -> None:
        """Hand a refitted latency profile to the policy (the Andes policies use one)."""
        policy = self.qos_policy
        if isinstance(policy, Andes):
            policy.set_profile(profile)
            self.stats["profile"] = _describe(profile)


def _describe(profile: LatencyProfile) -> dict[str, Any]:
    """A latency profile as the stats file shows it."""
    return {
        "name": profile.name,
        "batch_sizes": list(profile.batch_sizes),
        "decode_s_at": list(profile.decode_s_at),
        "prefill_per_token_s": profile.prefill_per_token_s,
    }


class AsyncTimedScheduler(TimedScheduler, AsyncScheduler):
    """:class:`TimedScheduler` on vLLM's ``AsyncScheduler`` (built for it under async
    scheduling)."""


class AsyncAndesScheduler(AndesScheduler, AsyncScheduler):
    """:class:`AndesScheduler` on vLLM's ``AsyncScheduler`` (built for it under async
    scheduling): the same body; vLLM's async base tracks the in-flight tokens."""


TimedScheduler.ASYNC_VARIANTS.update(
    {TimedScheduler: AsyncTimedScheduler, AndesScheduler: AsyncAndesScheduler}
)
