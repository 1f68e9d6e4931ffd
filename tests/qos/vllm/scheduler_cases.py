"""Unit tests of qos.vllm.AndesScheduler on vLLM's real scheduler code (needs vLLM).

Run by tests/qos/vllm/test_scheduler.py inside the virtualenv that has vLLM (.venv-vllm,
made by scripts/setup-vllm.sh); the file name keeps pytest from collecting it in the
project's .venv, where vLLM is not installed.

The scheduler is constructed directly against the tiny model's configuration (no model
weights, no worker): each test feeds it fake model-runner outputs (one token per
request that finished its prefill), on a fake clock that advances a fixed time per
step. What is checked is the plugin's contract: vLLM schedules exactly the requests the
qos policy chose; the running ones it dropped are paused (KV kept, nothing recomputed
on resume) while the cache has room, preempted otherwise (or always, with
``TOKENPACE_PAUSE=0``); and every request finishes with its full output.

Every case runs twice, with synchronous and with async scheduling (``sync``/``async``
in the test ids): under async the driver keeps two steps in flight, as vLLM's engine
core does (``step_with_batch_queue``) and as vLLM's own
``tests/v1/core/test_async_scheduler.py`` drives its scheduler.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from qos.metrics import freezes
from qos.policy.andes import Andes
from qos.policy.base import Policy
from qos.policy.table import NO_TOKEN, Capacity, RequestTable
from qos.signals import AWAY_LEASE_S, Presence, ReaderSignal
from qos.vllm import AndesScheduler, AsyncAndesScheduler, AsyncTimedScheduler, TimedScheduler
from qos.vllm.reader_channel import Arrived

MODEL_DIR = Path(__file__).resolve().parents[3] / ".models" / "tiny-llama"
BLOCK = 16
STEP_S = 0.05  # fake duration of one engine step


@dataclass
class Decision:
    keys: list[str]
    running: np.ndarray
    paused: np.ndarray  # not running, KV kept (table.pause)
    run: np.ndarray

    def _keys(self, mask: np.ndarray) -> set[str]:
        return {k for k, m in zip(self.keys, mask, strict=True) if m}

    def preempt(self) -> set[str]:
        """The running requests it dropped."""
        return self._keys(self.running & ~self.run)

    def stop(self) -> set[str]:
        """The requests holding KV that it does not run: running or paused."""
        return self._keys((self.running | self.paused) & ~self.run)

    def admit(self) -> set[str]:
        return self._keys(self.run & ~self.running)

    def chosen(self) -> set[str]:
        return self._keys(self.run)


@dataclass
class Recorder(Policy):
    """Delegates to a real policy and records what it saw and answered."""

    inner: Policy
    step: int = 0  # set by the driver before each schedule()
    decisions: list[tuple[int, Decision]] = field(default_factory=list)

    def schedule(self, table: RequestTable, capacity: Capacity, now: float) -> np.ndarray:
        run = self.inner.schedule(table, capacity, now)
        running = table.running.copy()
        paused = ~running & (table.col("computed") > 0)
        decision = Decision(list(table.keys), running, paused, run.copy())
        self.decisions.append((self.step, decision))
        return run

    def on_arrival(self, table: RequestTable, row: int, now: float) -> None:
        self.inner.on_arrival(table, row, now)

    def on_finish(self, table: RequestTable, row: int, now: float) -> None:
        self.inner.on_finish(table, row, now)


@pytest.fixture(scope="module", params=["sync", "async"])
def vllm_config(request: pytest.FixtureRequest) -> VllmConfig:
    """The engine's configuration, with synchronous or with async scheduling."""
    return engine_config(async_scheduling=request.param == "async")


def engine_config(async_scheduling: bool) -> VllmConfig:
    if not (MODEL_DIR / "config.json").exists():
        pytest.fail(f"no tiny model at {MODEL_DIR}: run scripts/setup-vllm.sh")
    model = ModelConfig(
        model=str(MODEL_DIR), dtype="float32", max_model_len=512, skip_tokenizer_init=True
    )
    sched = SchedulerConfig(
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        max_model_len=512,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=False)
    config = VllmConfig(
        model_config=model,
        scheduler_config=sched,
        cache_config=cache,
        device_config=DeviceConfig("cpu"),
    )
    # after VllmConfig's own resolution, which turns async scheduling off on a CPU
    # platform and on where the platform is unknown (the GPU wheel without a GPU)
    config.scheduler_config.async_scheduling = async_scheduling
    return config


def make_scheduler(
    config: VllmConfig,
    blocks: int,
    monkeypatch: pytest.MonkeyPatch,
    interval: float = 0.0,
    pause: bool = True,
    policy: str | None = None,
):
    monkeypatch.setenv("TOKENPACE_PAUSE", "1" if pause else "0")
    if policy is not None:
        monkeypatch.setenv("TOKENPACE_POLICY", policy)
    monkeypatch.setenv("TOKENPACE_PROFILE", "llama-3.1-8b-h100")  # fixed: deterministic
    monkeypatch.setenv("TOKENPACE_DEFAULT_TTFT", "1.0")
    monkeypatch.setenv("TOKENPACE_DEFAULT_TDS", "4.8")
    monkeypatch.setenv("TOKENPACE_DECISION_INTERVAL_S", str(interval))
    config.cache_config.num_gpu_blocks = blocks
    kv = KVCacheConfig(
        num_blocks=blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                FullAttentionSpec(
                    block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.float32
                ),
            )
        ],
    )
    scheduler = AndesScheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )
    clock = [1000.0]
    scheduler.clock = lambda: clock[0]
    return scheduler, clock


def request(rid: str, prompt: int, max_tokens: int, now: float, **tags: object) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=tags or None)
    return Request(rid, list(range(3, 3 + prompt)), params, None, arrival_time=now)


def sampling(scheduler: AndesScheduler, out: SchedulerOutput) -> set[str]:
    """The requests this step samples a token for (past their prefill), as scheduled."""
    return {rid for rid in out.num_scheduled_tokens if not scheduler.requests[rid].is_prefill_chunk}


def fake_step(scheduler: AndesScheduler, out: SchedulerOutput, sampled: set[str]) -> None:
    """What the model runner would return: a token for every request ``sampled``."""
    ids = list(out.num_scheduled_tokens)
    tokens = [[11] if i in sampled else [] for i in ids]
    mro = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=tokens
    )
    scheduler.update_from_output(out, mro)


def last_token_in_flight(scheduler: AndesScheduler) -> set[str]:
    """The requests whose last token is in flight: vLLM schedules them no further."""
    return {
        r.request_id
        for r in scheduler.running
        if r.num_output_placeholders
        and r.num_output_tokens + r.num_output_placeholders >= r.max_tokens
    }


def run_workload(scheduler, clock, arrivals, max_steps: int = 2000, finishing=None):
    """Drive the scheduler as vLLM's engine core does; arrivals: (step, Request).

    Synchronous scheduling: schedule a step, run it, process its output. Async: step N+1
    is scheduled while step N runs, then N's output is processed, so two steps are in
    flight at each schedule() (an empty step flushes what is in flight). The fake clock
    advances one step time per schedule(). Returns the per-step outputs and the
    requests; ``finishing``, a list, gets each step's :func:`last_token_in_flight`.
    """
    depth = 2 if scheduler.async_scheduling else 1
    pending = sorted(arrivals, key=lambda a: a[0])
    everything = {req.request_id: req for _, req in pending}
    outputs: list[SchedulerOutput] = []
    in_flight: deque[tuple[SchedulerOutput, set[str]]] = deque()
    for step in range(max_steps):
        while pending and pending[0][0] <= step:
            req = pending.pop(0)[1]
            req.arrival_time = clock[0]
            scheduler.add_request(req)
        if not pending and not scheduler.requests and not in_flight:
            return outputs, everything
        if isinstance(scheduler.qos_policy, Recorder):
            scheduler.qos_policy.step = step
        if finishing is not None:
            finishing.append(last_token_in_flight(scheduler))
        out = scheduler.schedule()
        outputs.append(out)
        in_flight.append((out, sampling(scheduler, out)))
        while len(in_flight) >= depth or (in_flight and not out.total_num_scheduled_tokens):
            fake_step(scheduler, *in_flight.popleft())
        clock[0] += STEP_S
    raise AssertionError(f"workload not finished after {max_steps} steps")


def admitted(out: SchedulerOutput) -> set[str]:
    new = {r.req_id for r in out.scheduled_new_reqs}
    return new | set(out.scheduled_cached_reqs.resumed_req_ids)


def relaxed_then_chat(
    now: float, relaxed: int, prompt: int, length: int, chat_at: int, chat_prompt: int
) -> list[tuple[int, Request]]:
    """``relaxed`` batch-tier requests at step 0, then a burst of four chat requests, one a
    step from step ``chat_at``."""
    batch = [
        (0, request(f"long{i}", prompt, length, now, tp_ttft=30.0, tp_tds=2.0, tp_tier="batch"))
        for i in range(relaxed)
    ]
    chat = [
        (
            chat_at + i,
            request(f"chat{i}", chat_prompt, 24, now, tp_ttft=0.5, tp_tds=10.0, tp_tier="chat"),
        )
        for i in range(4)
    ]
    return batch + chat


def contended_workload(now: float) -> list[tuple[int, Request]]:
    """Four long relaxed requests fill the cache; a burst of chat requests arrives later."""
    return relaxed_then_chat(now, relaxed=4, prompt=40, length=120, chat_at=30, chat_prompt=24)


def scheduled(out: SchedulerOutput) -> set[str]:
    return set(out.num_scheduled_tokens)


def many_requests_workload(now: float) -> list[tuple[int, Request]]:
    """More requests than the batch limit (8), few enough for the KV cache to hold them all:
    eight relaxed requests, then a burst of four chat requests."""
    return relaxed_then_chat(now, relaxed=8, prompt=16, length=60, chat_at=20, chat_prompt=16)


@pytest.mark.parametrize("pause", [False, True], ids=["preempt", "pause"])
def test_vllm_applies_exactly_the_policy_decisions(vllm_config, monkeypatch, pause):
    scheduler, clock = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch, pause=pause)
    assert isinstance(scheduler.qos_policy, Andes)
    recorder = Recorder(scheduler.qos_policy)
    scheduler.qos_policy = recorder
    finishing: list[set[str]] = []
    outputs, reqs = run_workload(
        scheduler, clock, contended_workload(clock[0]), finishing=finishing
    )

    decisions = dict(recorder.decisions)
    assert decisions, "the policy was never asked"
    preemptions = 0
    for step, out in enumerate(outputs):
        decision = decisions.get(step)
        if decision is None:  # nothing in the engine at that step
            assert out.total_num_scheduled_tokens == 0
            continue
        assert scheduled(out) == decision.chosen() - finishing[step], step
        if pause:  # dropped: paused or preempted; paused ones may be preempted later
            assert set(out.preempted_req_ids) <= decision.stop(), step
            assert admitted(out) <= decision.admit(), step
        else:
            assert set(out.preempted_req_ids) == decision.preempt(), step
            assert admitted(out) == decision.admit(), step
        preemptions += len(out.preempted_req_ids)
    assert preemptions + scheduler.stats["pauses"] > 0, "the workload must make Andes preempt"
    assert scheduler.stats["preemptions"] == preemptions
    for rid, req in reqs.items():
        assert req.num_output_tokens == req.max_tokens, rid
    assert scheduler.table.n == 0


def test_preempted_requests_resume_with_their_output(vllm_config, monkeypatch):
    scheduler, clock = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch, pause=False)
    outputs, reqs = run_workload(scheduler, clock, contended_workload(clock[0]))
    preempted = {rid for rid, r in reqs.items() if r.num_preemptions > 0}
    assert preempted, "the workload must preempt someone"
    for rid in preempted:
        req = reqs[rid]
        # Full output, every token the fake runner produced, none lost or duplicated.
        assert list(req.output_token_ids) == [11] * req.max_tokens
        # Resumed by recomputation: the prompt + output so far were prefilled again.
        resumed_at = [i for i, o in enumerate(outputs) if rid in admitted(o)]
        assert len(resumed_at) == req.num_preemptions + 1
        for i in resumed_at[1:]:
            assert outputs[i].num_scheduled_tokens[rid] > 1


def test_paused_requests_keep_their_kv_and_resume_without_recompute(vllm_config, monkeypatch):
    """The batch limit binds, not the cache: the policy's dropped requests are paused,
    none is preempted, and each resumes with one token per step (no prefill again)."""
    scheduler, clock = make_scheduler(vllm_config, blocks=64, monkeypatch=monkeypatch)
    recorder = Recorder(scheduler.qos_policy)
    scheduler.qos_policy = recorder
    finishing: list[set[str]] = []
    outputs, reqs = run_workload(
        scheduler, clock, many_requests_workload(clock[0]), finishing=finishing
    )
    assert scheduler.stats["pauses"] > 0, "the workload must make Andes pause"
    assert scheduler.stats["preemptions"] == 0
    decisions = dict(recorder.decisions)
    seen: set[str] = set()
    for step, out in enumerate(outputs):
        if step in decisions:
            assert scheduled(out) == decisions[step].chosen() - finishing[step], step
        for rid, n in out.num_scheduled_tokens.items():
            if rid in seen:
                assert n == 1, (step, rid, n)  # a decode step, never a recompute
            seen.add(rid)
    for rid, req in reqs.items():
        assert list(req.output_token_ids) == [11] * req.max_tokens, rid
        assert req.num_preemptions == 0, rid
    assert scheduler.table.n == 0 and not scheduler.paused and not scheduler.running


def test_paused_requests_are_preempted_when_the_running_ones_need_their_blocks(
    vllm_config, monkeypatch
):
    """A cache too small to keep the paused requests and grow the running ones: the paused
    ones give way (preempted, recomputed later), vLLM never has to preempt on its own,
    and everyone finishes. (The policy without the reader guard, which over-commits the
    cache: the guard keeps room for every started reply, so it never comes to this.)"""
    scheduler, clock = make_scheduler(
        vllm_config, blocks=34, monkeypatch=monkeypatch, policy="andes-tp-unguarded"
    )
    own: list[int] = []  # vLLM's own preemptions, per step
    was_paused: list[bool] = []  # per preemption by the plugin
    schedule_step, preempt = scheduler._schedule_step, scheduler._preempt

    def count_vllm_preemptions(throttle_prefills=False):
        before = scheduler.stats["policy_preemptions"]
        out = schedule_step(throttle_prefills)
        own.append(len(out.preempted_req_ids) - (scheduler.stats["policy_preemptions"] - before))
        return out

    def note_preemption(request, row, now):
        was_paused.append(request in scheduler.paused)
        preempt(request, row, now)

    scheduler._schedule_step = count_vllm_preemptions
    scheduler._preempt = note_preemption
    _, reqs = run_workload(scheduler, clock, many_requests_workload(clock[0]))
    assert scheduler.stats["pauses"] > 0
    assert any(was_paused), "the cache must force paused requests out"
    assert sum(own) == 0, "vLLM preempted on its own"
    for rid, req in reqs.items():
        assert list(req.output_token_ids) == [11] * req.max_tokens, rid


def first_tokens_and_times(scheduler, clock):
    """Spy on the scheduler: each request's first-token time and output token times."""
    first_token: dict[str, float] = {}
    times: dict[str, list[float]] = {}
    original = scheduler.update_from_output

    def spy(out, mro):
        result = original(out, mro)
        for rid, req in scheduler.requests.items():
            seen = times.setdefault(rid, [])
            seen.extend([clock[0]] * (req.num_output_tokens - len(seen)))
            if req.num_output_tokens and rid not in first_token:
                first_token[rid] = clock[0]
        return result

    scheduler.update_from_output = spy
    return first_token, times


def test_chat_burst_is_served_before_relaxed_requests(vllm_config, monkeypatch):
    """Andes's point: more requests than the batch holds, and the burst's first tokens
    come soon, the relaxed replies ahead of their readers giving up their slots."""
    scheduler, clock = make_scheduler(vllm_config, blocks=64, monkeypatch=monkeypatch)
    first_token, _ = first_tokens_and_times(scheduler, clock)
    run_workload(scheduler, clock, many_requests_workload(clock[0]))
    chat_arrival = 1000.0 + 20 * STEP_S
    for i in range(4):
        ttft = first_token[f"chat{i}"] - (chat_arrival + i * STEP_S)
        assert ttft <= 0.5, (i, ttft)


def test_a_full_cache_keeps_its_started_replies_and_the_burst_waits(vllm_config, monkeypatch):
    """The cache holds four started replies: the burst waits for room rather than take
    their KV, no started reply freezes at its reader's pace, and the burst is served as
    the replies finish."""
    scheduler, clock = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch)
    first_token, times = first_tokens_and_times(scheduler, clock)
    _, reqs = run_workload(scheduler, clock, contended_workload(clock[0]))
    start = 1000.0
    for i in range(4):
        relaxed = [t - start for t in times[f"long{i}"]]
        assert freezes(relaxed, 2.0).count == 0, i
    last_relaxed = max(times[f"long{i}"][-1] for i in range(4))
    assert min(first_token[f"chat{i}"] for i in range(4)) > start + 30 * STEP_S
    assert all(first_token[f"chat{i}"] <= last_relaxed + 1.0 for i in range(4))
    for rid, req in reqs.items():
        assert list(req.output_token_ids) == [11] * req.max_tokens, rid


def test_untagged_requests_get_the_defaults(vllm_config, monkeypatch):
    scheduler, clock = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch)
    scheduler.add_request(request("plain", 8, 4, clock[0]))
    scheduler.add_request(request("bad", 8, 4, clock[0], tp_tds=-3, tp_tenant="acme"))
    table = scheduler.table
    plain, bad = table.row("plain"), table.row("bad")
    assert table.col("ttft")[plain] == 1.0 and table.col("tds")[plain] == 4.8
    assert table.col("tds")[bad] == 4.8  # malformed: the default, with a warning
    assert table.tenant_names[table.col("tenant")[bad]] == "acme"
    scheduler.finish_requests(["plain", "bad"], RequestStatus.FINISHED_ABORTED)
    assert table.n == 0


def test_reader_signals_are_applied_at_decision_time_by_the_gateway_request_id(
    vllm_config, monkeypatch
):
    # a long decision interval: only a change of presence makes a decision sooner
    scheduler, clock = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch, interval=60)
    scheduler.add_request(request("a", 8, 40, clock[0], tp_request_id="gw-a"))
    scheduler.add_request(request("b", 8, 40, clock[0]))

    def step() -> None:
        out = scheduler.schedule()
        fake_step(scheduler, out, sampling(scheduler, out))
        clock[0] += STEP_S

    for _ in range(3):
        step()
    decisions = scheduler.stats["decisions"]
    table, inbox = scheduler.table, scheduler.reader_inbox
    heard = clock[0] - 0.01
    inbox.put(Arrived("gw-a", ReaderSignal(Presence.AWAY, buffer_tokens=5), heard))
    inbox.put(Arrived("gw-gone", ReaderSignal(Presence.AWAY), heard))  # no such request
    step()
    assert scheduler.stats["decisions"] == decisions + 1  # the presence changed
    row = table.row("a")
    assert table.col("away_until")[row] == pytest.approx(heard + AWAY_LEASE_S)
    assert table.col("stated_buffer")[row] == 5
    assert table.col("stated_at")[row] == pytest.approx(heard)
    assert (scheduler.stats["reader_signals"], scheduler.stats["reader_signals_unknown"]) == (1, 1)
    scheduler.write_stats()  # the operators' view: a's reader away, holding its cushion
    started = int((table.col("output") > 0).sum())
    assert scheduler.stats["readers_away_share"] == pytest.approx(1 / started)
    assert scheduler.stats["rate_given_back_tps"] == pytest.approx(4.8)
    inbox.put(Arrived("gw-a", ReaderSignal(Presence.AWAY, buffer_tokens=9), clock[0]))
    step()
    assert scheduler.stats["decisions"] == decisions + 1  # the same presence: no decision
    assert table.col("stated_buffer")[table.row("a")] == 9
    inbox.put(Arrived("gw-a", ReaderSignal(Presence.WATCHING), clock[0]))
    step()
    assert scheduler.stats["decisions"] == decisions + 2
    assert table.col("away_until")[table.row("a")] == NO_TOKEN
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    inbox.put(Arrived("gw-a", ReaderSignal(Presence.AWAY), clock[0]))
    step()
    assert scheduler.stats["reader_signals_unknown"] == 2  # the reply ended: nothing to tell


def test_the_scheduler_builds_on_the_base_the_engine_schedules_with(vllm_config, monkeypatch):
    """One --scheduler-cls for both modes: the class named is built on vLLM's
    AsyncScheduler exactly when async scheduling is on, timing baseline included."""
    scheduler, _ = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch)
    is_async = bool(vllm_config.scheduler_config.async_scheduling)
    assert isinstance(scheduler, AndesScheduler)
    assert isinstance(scheduler, AsyncScheduler) is is_async
    assert (type(scheduler) is AsyncAndesScheduler) is is_async
    assert scheduler.async_scheduling is is_async
    assert scheduler.stats["async_scheduling"] is is_async
    baseline = TimedScheduler(
        vllm_config=vllm_config,
        kv_cache_config=scheduler.kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
    )
    assert (type(baseline) is AsyncTimedScheduler) is is_async

    class Custom(AndesScheduler):
        """A subclass with no async variant registered."""

    def build_custom():
        return Custom(
            vllm_config=vllm_config,
            kv_cache_config=scheduler.kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=BLOCK,
        )

    if is_async:  # refused, not run on the synchronous base
        with pytest.raises(TypeError, match="no async variant"):
            build_custom()
    else:
        assert type(build_custom()) is Custom


def test_between_decisions_only_chosen_requests_are_admitted(vllm_config, monkeypatch):
    """With a decision interval, steps in between keep the last decision: vLLM admits
    nothing the policy did not choose and preempts only what it must."""
    scheduler, clock = make_scheduler(
        vllm_config, blocks=24, monkeypatch=monkeypatch, interval=10 * STEP_S
    )
    recorder = Recorder(scheduler.qos_policy)
    scheduler.qos_policy = recorder
    outputs, reqs = run_workload(scheduler, clock, contended_workload(clock[0]))
    decisions = dict(recorder.decisions)
    assert len(decisions) < len(outputs) / 2, "the interval must skip decisions"
    chosen: set[str] = set()
    for step, out in enumerate(outputs):
        decision = decisions.get(step)
        if decision is not None:
            chosen = decision.chosen()
            assert not scheduled(out) & decision.stop(), step
        assert scheduled(out) <= chosen, step
    for rid, req in reqs.items():
        assert list(req.output_token_ids) == [11] * req.max_tokens, rid


def test_a_request_within_its_plan_takes_back_a_borrowers_kv(vllm_config, monkeypatch):
    """Price plans on vLLM's scheduler: a weight-1 tenant's four long replies fill the
    cache, far beyond its guarantee, each far ahead of its slow reader. A weight-4
    request arrives: within its guarantee, it waits half its TTFT, then takes back the
    KV of a borrowed reply (preempted the vLLM way, recomputed later) rather than wait
    for one to end; no borrowed reply freezes at its reader's pace, and all finish."""
    scheduler, clock = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch)
    first_token, times = first_tokens_and_times(scheduler, clock)
    free = dict(tp_ttft=30.0, tp_tds=2.0, tp_tenant="free", tp_weight=1.0)
    arrivals = [(0, request(f"free{i}", 40, 120, clock[0], **free)) for i in range(4)]
    ent = dict(tp_ttft=1.0, tp_tds=4.8, tp_tenant="ent", tp_weight=4.0)
    arrivals.append((30, request("ent", 24, 24, clock[0], **ent)))
    _, reqs = run_workload(scheduler, clock, arrivals)
    arrived = 1000.0 + 30 * STEP_S
    last_free = max(times[f"free{i}"][-1] for i in range(4))
    assert 0.5 <= first_token["ent"] - arrived <= 1.0, first_token["ent"] - arrived
    assert first_token["ent"] < last_free - 1.0  # no borrowed reply had to end first
    assert scheduler.stats["policy_preemptions"] > 0
    for i in range(4):
        shown = [t - 1000.0 for t in times[f"free{i}"]]
        assert freezes(shown, 2.0).longest_s < 0.5, i
    for rid, req in reqs.items():
        assert list(req.output_token_ids) == [11] * req.max_tokens, rid


def test_replies_far_ahead_of_their_readers_lend_their_kv(vllm_config, monkeypatch):
    """With ``TOKENPACE_LEND_AFTER_S``, the full cache of the test above is lent: the four
    relaxed replies, tens of seconds ahead of their readers, give their KV to the burst
    (preempted the vLLM way; with KV offloading they come back by a copy) and come back
    before their readers run dry, so the burst starts within its TTFT and nothing
    freezes."""
    monkeypatch.setenv("TOKENPACE_LEND_AFTER_S", "10")  # the replies are further ahead
    scheduler, clock = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch)
    first_token, times = first_tokens_and_times(scheduler, clock)
    _, reqs = run_workload(scheduler, clock, contended_workload(clock[0]))
    burst = 1000.0 + 30 * STEP_S
    for i in range(4):
        assert first_token[f"chat{i}"] - (burst + i * STEP_S) <= 0.5, i
        relaxed = [t - 1000.0 for t in times[f"long{i}"]]
        assert freezes(relaxed, 2.0).count == 0, i
    assert scheduler.stats["policy_preemptions"] > 0
    for rid, req in reqs.items():
        assert list(req.output_token_ids) == [11] * req.max_tokens, rid


def distinct_decisions(recorder: Recorder) -> tuple[list[frozenset[str]], list[int]]:
    """The policy's successive run sets, each with the step it was first made at."""
    runs: list[frozenset[str]] = []
    steps: list[int] = []
    for step, decision in recorder.decisions:
        run = frozenset(decision.chosen())
        if not runs or run != runs[-1]:
            runs.append(run)
            steps.append(step)
    return runs, steps


def matched_steps(
    sync_runs: list[frozenset[str]], async_runs: list[frozenset[str]], async_at: list[int]
) -> list[int]:
    """The steps at which async made each of sync's decisions, in order. Any other async
    decision only drops requests from the one before it: two requests that finish in
    the same synchronous step can be seen to finish a step apart under async."""
    at: list[int] = []
    for k, run in enumerate(async_runs):
        if len(at) < len(sync_runs) and run == sync_runs[len(at)]:
            at.append(async_at[k])
        else:
            assert k > 0 and run < async_runs[k - 1], (run, async_runs[k - 1])
    assert len(at) == len(sync_runs), (sync_runs, async_runs)
    return at


@pytest.mark.parametrize("pause", [False, True], ids=["preempt", "pause"])
def test_sync_and_async_make_the_same_decisions_up_to_the_one_step_lag(monkeypatch, pause):
    """The same workload on both modes: the policy makes the same succession of
    decisions (async may add one between two, where requests that finish in one synchronous
    step are seen to finish a step apart), the same preemptions and pauses, and every
    request gets its full output.
    Under async each decision sees the tokens one step later, so a change that waits for
    a step's outcome (a request finishing, leaving its KV and slot) comes one step later
    than the synchronous one; nothing comes sooner, and no change is more than one step
    later than the one before it was. (Before the in-flight accounting, a request
    preempted while its step was in flight took its token as KV, and the policy made
    129 preemptions here where synchronous scheduling makes 3.)"""
    runs = {}
    for mode in ("sync", "async"):
        config = engine_config(async_scheduling=mode == "async")
        scheduler, clock = make_scheduler(config, blocks=24, monkeypatch=monkeypatch, pause=pause)
        recorder = Recorder(scheduler.qos_policy)
        scheduler.qos_policy = recorder
        _, reqs = run_workload(scheduler, clock, contended_workload(clock[0]))
        for rid, req in reqs.items():
            assert list(req.output_token_ids) == [11] * req.max_tokens, (mode, rid)
        runs[mode] = (scheduler.stats, *distinct_decisions(recorder))
    (sync_stats, sync_runs, sync_at), (async_stats, async_runs, async_at) = runs.values()
    assert len(sync_runs) > 4, "the workload must make the policy change its mind"
    matched_at = matched_steps(sync_runs, async_runs, async_at)
    lags = [a - s for a, s in zip(matched_at, sync_at, strict=True)]
    assert lags[0] == 0 and all(0 <= later - before <= 1 for before, later in pairwise(lags))
    assert max(lags) > 0, "some decision must wait for a step's outcome"
    for counter in ("preemptions", "policy_preemptions", "pauses"):
        assert async_stats[counter] == sync_stats[counter], counter
    assert sync_stats["preemptions"] + sync_stats["pauses"] > 0


def next_token(req: Request) -> int:
    """1, or 0 for a request whose tokens in flight reach its ``max_tokens``: vLLM's
    ``Scheduler.schedule`` does not schedule it again."""
    placeholders = req.num_output_placeholders
    ends = req.num_computed_tokens + 2 - placeholders >= req.num_prompt_tokens + req.max_tokens
    return 0 if placeholders and ends else 1


@pytest.mark.parametrize("pause", [False, True], ids=["preempt", "pause"])
def test_the_table_holds_kv_exactly_for_the_requests_vllm_holds_it_for(
    vllm_config, monkeypatch, pause
):
    """After every step, a request has KV in the table (``computed`` > 0) if and only
    if vLLM computed tokens for it, preempted requests whose in-flight token came back
    after their preemption included. And at every decision the policy counts, for the
    requests holding KV, their whole context after their next token, as vLLM will hold
    it: known tokens, tokens in flight (async) and the next one, in whole blocks; the
    in-flight part as room its capacity leaves out."""
    scheduler, clock = make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch, pause=pause)
    table = scheduler.table
    update, capacity_now = scheduler.update_from_output, scheduler._step_capacity
    stale = 0  # tokens delivered to requests preempted while their step was in flight

    def checked_update(out, mro):
        nonlocal stale
        stale += sum(
            scheduler.requests[rid].status == RequestStatus.PREEMPTED
            for rid in out.num_scheduled_tokens
            if rid in scheduler.requests
        )
        result = update(out, mro)
        for rid, req in scheduler.requests.items():
            assert (table.col("computed")[table.row(rid)] > 0) == (req.num_computed_tokens > 0), rid
        return result

    in_flight_room: list[int] = []

    def checked_capacity():
        capacity = capacity_now()
        in_flight_room.append(scheduler.capacity.kv_tokens - capacity.kv_tokens)
        holding = table.col("computed") > 0
        counted = int(capacity.demand(table)[holding].sum()) + in_flight_room[-1]
        after_next = sum(
            -(-(req.num_tokens + req.num_output_placeholders + next_token(req)) // BLOCK) * BLOCK
            for rid, req in scheduler.requests.items()
            if holding[table.row(rid)]
        )
        assert counted == after_next
        return capacity

    scheduler.update_from_output = checked_update
    scheduler._step_capacity = checked_capacity
    run_workload(scheduler, clock, contended_workload(clock[0]))
    assert (max(in_flight_room) > 0) is scheduler.async_scheduling
    if scheduler.async_scheduling and not pause:
        assert stale > 0, "the workload must preempt a request with its token in flight"


def test_step_time_is_the_device_time_with_two_steps_in_flight(vllm_config, monkeypatch):
    """The stock scheduler, timed on a fake clock: each step takes 30 ms on the device,
    schedule() 5 ms and update_from_output() 2 ms of the engine's time. Under async the
    engine schedules step N+1 while N runs, so the device never waits and every step's
    model time is its 30 ms, not what is left of it after the overlapped scheduling
    (the stats' model time then sums to the device's busy time), a step queued behind an
    empty one included."""
    monkeypatch.delenv("TOKENPACE_STATS_FILE", raising=False)
    config = vllm_config
    config.cache_config.num_gpu_blocks = 64
    scheduler = TimedScheduler(
        vllm_config=config,
        kv_cache_config=make_scheduler(config, 64, monkeypatch)[0].kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )
    device_s, schedule_s, update_s = 0.030, 0.005, 0.002
    now = [0.0]
    scheduler.timer = lambda: now[0]
    schedule_step = scheduler._schedule_step

    def timed_schedule_step(throttle_prefills=False):
        out = schedule_step(throttle_prefills)
        now[0] += schedule_s
        return out

    scheduler._schedule_step = timed_schedule_step
    for i in range(4):
        scheduler.add_request(request(f"r{i}", 16, 20, now[0]))
    # vLLM's step_with_batch_queue: every output is queued, empty ones too (one whose
    # requests all have their last token in flight), and the oldest is processed when
    # the queue is full or nothing is left to schedule
    depth = 2 if scheduler.async_scheduling else 1
    device_free = 0.0
    in_flight: deque[tuple[SchedulerOutput, set[str], float]] = deque()
    steps = empty = 0
    while scheduler.requests or in_flight:
        out = scheduler.schedule() if scheduler.requests else None
        if out is not None:
            if out.total_num_scheduled_tokens:
                device_free = max(now[0], device_free) + device_s
                steps += 1
            else:
                empty += 1
                if empty == 1:  # a request arrives behind the empty step
                    scheduler.add_request(request("late", 16, 8, now[0]))
            in_flight.append((out, sampling(scheduler, out), device_free))
            if len(in_flight) < depth and scheduler.requests:
                continue
        done, sampled, done_at = in_flight.popleft()
        now[0] = max(now[0], done_at)
        fake_step(scheduler, done, sampled)
        now[0] += update_s
    stats = scheduler.stats
    assert stats["steps"] == steps >= 20
    assert (empty > 0) is scheduler.async_scheduling, "async: empty steps in the queue"
    assert stats["max_model_s"] == pytest.approx(device_s)
    assert stats["model_s"] == pytest.approx(steps * device_s)
    assert stats["schedule_s"] == pytest.approx(steps * schedule_s)
