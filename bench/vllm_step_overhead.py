"""The vLLM plugin's own time per engine step, against vLLM's stock scheduler (no model).

Constructs :class:`qos.vllm.TimedScheduler` (vLLM's scheduler, timed) and
:class:`qos.vllm.AndesScheduler` directly against the tiny model's configuration, as
``tests/qos/vllm/scheduler_cases.py`` does (no weights, no worker), and drives each through
the same workload: requests from the Andes trace (lengths × 0.25, 70 % chat and 30 %
batch tier scaled ×10, as ``bench/vllm_compare.py``) arriving as a Poisson process at
``--load`` times what the batch limit can serve, on a fake clock that advances
``--step-ms`` per step, with a fake model-runner output of one token per request past
its prefill. KV is shrunk in proportion to ``max_num_seqs`` (the 48 blocks of 32 tokens
for 8 sequences of ``bench/vllm_compare.py``), so requests contend for slots and cache.
Each scheduler runs with synchronous and with async scheduling (``--modes``); under async
the driver keeps two steps in flight as vLLM's engine core does (step N+1 scheduled
before step N's output is processed), and the same classes build on vLLM's
``AsyncScheduler`` (:class:`qos.vllm.AsyncTimedScheduler`, :class:`qos.vllm.AsyncAndesScheduler`).

Reported per batch limit and scheduler, in µs per step over the steps that scheduled
tokens, median (and mean): the time inside ``schedule()`` and ``update_from_output()``,
and of the two together the part in vLLM's own ``Scheduler`` methods (the ``super()``
calls), the part in the policy's decision (the median step makes none) and the rest,
the plugin's own bookkeeping ("plugin's own"; for the stock scheduler, the timing
wrapper of :class:`~qos.vllm.TimedScheduler`); "added" is the plugin's own minus the
stock scheduler's; "vs stock" is the plugin's ``schedule()`` + ``update_from_output()``
over the stock scheduler's in the same mode (medians). vLLM's part differs between
schedulers as their batches differ.
Times are the thread's CPU time (``--wall``: wall-clock), so moments the
process waits for a core do not count; the schedulers run side by side, a step each in
turn, so a shared machine's load falls on all of them alike; ``--rounds`` repeats the
run. With ``--before FILE`` (a copy of an older ``qos/vllm/scheduler.py``) that
version's AndesScheduler runs too, for a before/after comparison in one session.

Runs where vLLM is installed: on 0.32 (the CPU build) and on 0.33 (``make vllm033``)::

    .venv-vllm/bin/python bench/vllm_step_overhead.py
    .venv-vllm033/bin/python bench/vllm_step_overhead.py

and to compare with the committed scheduler::

    git show HEAD:qos/vllm/scheduler.py > /tmp/scheduler_before.py
    .venv-vllm/bin/python bench/vllm_step_overhead.py --before /tmp/scheduler_before.py
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from vllm import __version__ as vllm_version
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from qos.sim.workload import build_workload, load_andes_trace
from qos.tags import RequestTags, encode_tags
from qos.vllm import scheduler as current

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / ".models" / "tiny-llama"
MAX_MODEL_LEN = 512
BLOCK = 32
KV_TOKENS_PER_SEQ = 48 * BLOCK // 8  # bench/vllm_compare.py: 48 blocks for 8 sequences
TIERS = {"chat": (0.1, 48.0, 0.7), "batch": (6.0, 20.0, 0.3)}  # ttft, tds, share
PLUGIN_ENV = {
    "TOKENPACE_PROFILE": "llama-3.1-8b-h100",  # fixed: every run decides alike
    "TOKENPACE_DECISION_INTERVAL_S": "0.02",
}

Arrival = tuple[float, str, int, int, dict[str, Any]]  # time, id, prompt, max tokens, tags


def vllm_config(max_num_seqs: int, blocks: int, async_scheduling: bool) -> VllmConfig:
    """The tiny model's engine configuration with ``blocks`` KV blocks."""
    model = ModelConfig(
        model=str(MODEL_DIR), dtype="float32", max_model_len=MAX_MODEL_LEN, skip_tokenizer_init=True
    )
    sched = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(2048, 4 * max_num_seqs),
        max_model_len=MAX_MODEL_LEN,
        is_encoder_decoder=False,
        enable_chunked_prefill=True,
    )
    cache = CacheConfig(block_size=BLOCK, enable_prefix_caching=False)
    cache.num_gpu_blocks = blocks
    config = VllmConfig(
        model_config=model,
        scheduler_config=sched,
        cache_config=cache,
        device_config=DeviceConfig("cpu"),
    )
    # set after VllmConfig's resolution (the CPU platform turns async scheduling off)
    config.scheduler_config.async_scheduling = async_scheduling
    return config


def make_scheduler(cls: type[Scheduler], config: VllmConfig) -> Scheduler:
    """``cls`` on ``config``'s KV blocks, as the engine core would construct it."""
    blocks = config.cache_config.num_gpu_blocks
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.float32)
    layers = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    kv = KVCacheConfig(
        num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(layers, spec)]
    )
    return cls(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )


def workload(max_num_seqs: int, n: int, args: argparse.Namespace) -> list[Arrival]:
    """``n`` of the trace's requests, arriving at ``--load`` times what the batch limit serves."""
    entries = load_andes_trace()
    limit = MAX_MODEL_LEN // 2 - 4
    lengths = [min(max(round(e.output_len * 0.25), 4), limit) for e in entries]
    served_per_s = max_num_seqs / (float(np.mean(lengths)) * args.step_ms / 1000)
    requests = build_workload(
        entries, args.load * served_per_s, seed=args.seed, n=n, tier_mix=TIERS
    )
    arrivals = []
    for r in requests:
        prompt = int(np.clip(round(r.prompt_tokens * 0.25), 4, limit))
        output = int(np.clip(round(r.output_tokens * 0.25), 4, limit))
        tags = encode_tags(RequestTags(tier=r.tier, ttft=r.ttft, tds=r.tds))
        arrivals.append((r.arrival, r.id, prompt, output, tags))
    return arrivals


class Stopwatch:
    """Adds up the time spent inside the functions it wraps."""

    def __init__(self, timer: Callable[[], float]) -> None:
        self.timer = timer
        self.seconds = 0.0

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = self.timer()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += self.timer() - start

        return timed


class Driver:
    """One scheduler on the workload, a step at a time, timing its two calls and, within
    them, vLLM's own ``Scheduler`` methods (``vllm``) and the plugin's policy. Under async
    scheduling a step schedules the next batch before it processes the one in flight."""

    def __init__(
        self, scheduler: Scheduler, arrivals: list[Arrival], step_s: float, vllm: Stopwatch
    ) -> None:
        self.scheduler = scheduler
        self.now = 0.0
        scheduler.clock = lambda: self.now  # the plugin's clock; the stock scheduler has none
        self.step_s = step_s
        self.pending = list(reversed(arrivals))
        self.vllm = vllm
        self.policy = Stopwatch(vllm.timer)
        if hasattr(scheduler, "qos_policy"):
            scheduler.qos_policy.schedule = self.policy.wrap(scheduler.qos_policy.schedule)
        self.times: dict[str, list[float]] = {part: [] for part in PARTS}
        self.depth = 2 if scheduler.scheduler_config.async_scheduling else 1
        self.in_flight: deque[tuple[SchedulerOutput, list[list[int]]]] = deque()

    @property
    def done(self) -> bool:
        return not (self.pending or self.scheduler.requests or self.in_flight)

    def step(self) -> None:
        """Admit the arrivals due, then one engine step: schedule, fake model, update."""
        scheduler, pending = self.scheduler, self.pending
        while pending and pending[-1][0] <= self.now:
            _, rid, prompt, output, tags = pending.pop()
            params = SamplingParams(max_tokens=output, ignore_eos=True, extra_args=tags)
            prompt_ids = list(range(3, 3 + prompt))
            scheduler.add_request(Request(rid, prompt_ids, params, None, arrival_time=self.now))
        timer, vllm_before, policy_before = self.vllm.timer, self.vllm.seconds, self.policy.seconds
        start = timer()
        out = scheduler.schedule()
        mid = timer()
        ids = list(out.num_scheduled_tokens)
        sampled = [[] if scheduler.requests[i].is_prefill_chunk else [11] for i in ids]
        self.in_flight.append((out, sampled))
        update_s = 0.0
        while self.in_flight and (
            len(self.in_flight) >= self.depth or not out.total_num_scheduled_tokens
        ):
            done, tokens = self.in_flight.popleft()
            ids = list(done.num_scheduled_tokens)
            runner = ModelRunnerOutput(
                req_ids=ids,
                req_id_to_index={r: i for i, r in enumerate(ids)},
                sampled_token_ids=tokens,
            )
            before_update = timer()
            scheduler.update_from_output(done, runner)
            update_s += timer() - before_update
        if out.total_num_scheduled_tokens:
            schedule_s = mid - start
            vllm_s = self.vllm.seconds - vllm_before
            policy_s = self.policy.seconds - policy_before
            own_s = schedule_s + update_s - vllm_s - policy_s
            parts = (schedule_s, update_s, vllm_s, policy_s, own_s)
            for part, seconds in zip(PARTS, parts, strict=True):
                self.times[part].append(seconds)
        self.now += self.step_s


PARTS = ("schedule()", "update()", "vLLM's own", "policy", "plugin's own")


def run_lockstep(drivers: list[Driver]) -> None:
    """Step every driver in turn, rotating who goes first, until all are done: a shared
    machine's load then falls on all of them alike."""
    turn = 0
    while not all(d.done for d in drivers):
        turn += 1
        for d in drivers[turn % len(drivers) :] + drivers[: turn % len(drivers)]:
            if not d.done:
                d.step()


def _us(seconds: Sequence[float] | np.ndarray) -> str:
    """Median (and mean) of per-step seconds, in µs."""
    return f"{np.median(seconds) * 1e6:.0f} ({np.mean(seconds) * 1e6:.0f})"


def load_scheduler_module(path: str) -> Any:
    """A copy of ``qos/vllm/scheduler.py`` (another version) as its own module."""
    spec = importlib.util.spec_from_file_location("scheduler_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", default="8,256", help="max_num_seqs values, comma-separated")
    p.add_argument("--requests", default="400,2000", help="requests for each --batch value")
    p.add_argument("--load", type=float, default=1.3, help="offered load / batch-limit service")
    p.add_argument("--step-ms", type=float, default=6.0, help="fake model time per step")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--modes", default="sync,async", help="scheduling modes, comma-separated")
    p.add_argument("--before", help="an older scheduler.py to compare (its AndesScheduler)")
    p.add_argument("--wall", action="store_true", help="wall-clock time, not the thread's CPU")
    args = p.parse_args(argv)
    os.environ.update(PLUGIN_ENV)

    variants: dict[str, type[Scheduler]] = {"stock": current.TimedScheduler}
    if args.before:
        variants["plugin before"] = load_scheduler_module(args.before).AndesScheduler
    variants["plugin"] = current.AndesScheduler
    modes = args.modes.split(",")
    if not set(modes) <= {"sync", "async"}:
        p.error(f"--modes: sync and/or async, got {args.modes!r}")
    vllm = Stopwatch(time.perf_counter if args.wall else time.thread_time)
    Scheduler.schedule = vllm.wrap(Scheduler.schedule)  # type: ignore[method-assign]
    Scheduler.update_from_output = vllm.wrap(Scheduler.update_from_output)  # type: ignore[method-assign]
    print(
        f"vLLM {vllm_version}, load {args.load}, fake step {args.step_ms} ms, "
        f"{args.rounds} rounds; µs of {'wall-clock' if args.wall else 'CPU'} time per step: "
        "median (mean)"
    )
    columns = ("max_num_seqs", "requests", "mode", "scheduler", "steps", *PARTS, "added")
    columns += ("vs stock",)
    print("| " + " | ".join(columns) + " |\n|" + " --- |" * len(columns))
    batches, counts = args.batch.split(","), args.requests.split(",")
    for max_num_seqs, n in zip(map(int, batches), map(int, counts), strict=True):
        blocks = -(-KV_TOKENS_PER_SEQ * max_num_seqs // BLOCK)
        configs = {mode: vllm_config(max_num_seqs, blocks, mode == "async") for mode in modes}
        arrivals = workload(max_num_seqs, n, args)
        runs = [(mode, name) for mode in modes for name in variants]
        times = {run: {part: [] for part in PARTS} for run in runs}
        for _ in range(args.rounds):
            gc.collect()
            drivers = {
                (mode, name): Driver(
                    make_scheduler(variants[name], configs[mode]),
                    arrivals,
                    args.step_ms / 1000,
                    vllm,
                )
                for mode, name in runs
            }
            run_lockstep(list(drivers.values()))
            for run, d in drivers.items():
                for part, values in d.times.items():
                    times[run][part] += values
        for (mode, name), t in times.items():
            stock = times[mode, "stock"]
            own, stock_own = t["plugin's own"], stock["plugin's own"]
            added = (np.median(own) - np.median(stock_own), np.mean(own) - np.mean(stock_own))
            cells = [_us(t[part]) for part in PARTS]
            cells.append(f"{added[0] * 1e6:.0f} ({added[1] * 1e6:.0f})")
            calls = np.median(np.add(t["schedule()"], t["update()"]))
            stock_calls = np.median(np.add(stock["schedule()"], stock["update()"]))
            cells.append(f"{(calls / stock_calls - 1) * 100:+.0f} %")
            steps = str(len(t["policy"]) // args.rounds)
            row = [str(max_num_seqs), str(n), mode, name, steps]
            print("| " + " | ".join(row + cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
