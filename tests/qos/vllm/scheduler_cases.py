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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from qos.metrics import freezes
from qos.policy.andes import Andes
from qos.policy.base import Policy
from qos.policy.table import Capacity, RequestTable
from qos.vllm import AndesScheduler

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


@pytest.fixture(scope="module")
def vllm_config() -> VllmConfig:
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
    return VllmConfig(
        model_config=model,
        scheduler_config=sched,
        cache_config=cache,
        device_config=DeviceConfig("cpu"),
    )


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


def fake_step(scheduler: AndesScheduler, out: SchedulerOutput) -> None:
    """What the model runner would return: a token for every request past its prefill."""
    ids = list(out.num_scheduled_tokens)
    sampled = [[] if scheduler.requests[i].is_prefill_chunk else [11] for i in ids]
    mro = ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
    )
    scheduler.update_from_output(out, mro)


def run_workload(scheduler, clock, arrivals, max_steps: int = 2000):
    """Drive the scheduler; arrivals: (step, Request). Returns per-step outputs and requests."""
    pending = sorted(arrivals, key=lambda a: a[0])
    everything = {req.request_id: req for _, req in pending}
    outputs: list[SchedulerOutput] = []
    for step in range(max_steps):
        while pending and pending[0][0] <= step:
            req = pending.pop(0)[1]
            req.arrival_time = clock[0]
            scheduler.add_request(req)
        if not pending and not scheduler.requests:
            return outputs, everything
        if isinstance(scheduler.qos_policy, Recorder):
            scheduler.qos_policy.step = step
        out = scheduler.schedule()
        outputs.append(out)
        fake_step(scheduler, out)
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
    outputs, reqs = run_workload(scheduler, clock, contended_workload(clock[0]))

    decisions = dict(recorder.decisions)
    assert decisions, "the policy was never asked"
    preemptions = 0
    for step, out in enumerate(outputs):
        decision = decisions.get(step)
        if decision is None:  # nothing in the engine at that step
            assert out.total_num_scheduled_tokens == 0
            continue
        assert scheduled(out) == decision.chosen(), step
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
    outputs, reqs = run_workload(scheduler, clock, many_requests_workload(clock[0]))
    assert scheduler.stats["pauses"] > 0, "the workload must make Andes pause"
    assert scheduler.stats["preemptions"] == 0
    decisions = dict(recorder.decisions)
    seen: set[str] = set()
    for step, out in enumerate(outputs):
        if step in decisions:
            assert scheduled(out) == decisions[step].chosen(), step
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


def test_async_scheduling_is_refused(vllm_config, monkeypatch):
    vllm_config.scheduler_config.async_scheduling = True
    try:
        with pytest.raises(ValueError, match="--no-async-scheduling"):
            make_scheduler(vllm_config, blocks=24, monkeypatch=monkeypatch)
    finally:
        vllm_config.scheduler_config.async_scheduling = False


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
