"""Real vLLM servers behind the tokenpace gateway, driven by the official openai client.

Shared by ``bench/vllm_compare.py``, ``bench/vllm_plans.py`` and their tests:

- :class:`VllmServer`: ``python -m vllm.entrypoints.openai.api_server`` as a process of
  ``bench/launch.py`` (its own process group, stopped with SIGTERM then SIGKILL), with
  the qos plugin (``--scheduler-cls qos.vllm.AndesScheduler``) or vLLM's stock FCFS /
  priority policy (timed by ``qos.vllm.TimedScheduler``: same scheduling, plus the step
  statistics);
- :func:`serve_gateway`: the gateway app on a loopback port with uvicorn;
- :func:`run_jobs`: a workload of timed requests, streamed through the gateway with
  ``openai.AsyncOpenAI``; each reply's tokens are timed on receipt (vLLM's
  ``continuous_usage_stats`` gives the token count of every chunk) and scored with the
  Andes QoE (:func:`qos.metrics.andes_qoe`) against its tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import psutil
from launch import Server, free_port, serve_in_loop

from gateway.app import create_app
from gateway.config.loader import parse_config
from gateway.config.schema import GatewayConfig
from qos.metrics import andes_qoe, freezes, reader_summary, user_idle_latency
from qos.policy.reader import NON_READER_TIERS

API_KEY = "tp-bench-key-0000001"
ROOT = Path(__file__).resolve().parents[1]  # the checkout whose qos the engines load
PLUGIN = "qos.vllm.AndesScheduler"
TIMED_STOCK = "qos.vllm.TimedScheduler"


def _engine_cpu() -> int | None:
    """The CPU the vLLM servers are confined to when there are two or more, else None.

    On a GPU server the model runs on the GPU and the CPUs serve the API server and the
    client side. Here the model's compute is on the CPU too, and vLLM's CPU worker binds
    a spinning OpenMP thread to every CPU it finds: with two cores it starved its own API
    server, the gateway and the client, and requests reached the engine seconds late and
    in bursts, whatever the scheduler. So the servers get the last CPU (the worker's
    threads bound to it with vLLM's ``VLLM_CPU_OMP_THREADS_BIND``) and the gateway and
    client the others; on one CPU everything shares it.
    """
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[-1] if len(cpus) >= 2 else None


@dataclass
class VllmServer:
    """One vLLM OpenAI server; ``mode`` is ``andes`` (the plugin), ``fcfs`` or ``priority``."""

    python: str
    model: str
    name: str  # served model name
    mode: str
    workdir: Path
    kv_blocks: int = 40
    block_size: int = 32
    max_num_seqs: int = 8
    max_model_len: int = 512
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    dummy_weights: bool = True
    log_stats: bool = False  # keep vLLM's statistics: its /metrics counters (prefix cache)
    nice: int = 0  # niceness of the engine's processes (> 0: API server, gateway, client first)
    port: int = field(default_factory=free_port)
    server: Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stats_file(self) -> Path:
        return self.workdir / f"{self.name}.stats.json"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def command(self) -> list[str]:
        if self.mode not in ("andes", "fcfs", "priority"):
            raise ValueError(f"mode: use andes, fcfs or priority, got {self.mode!r}")
        cmd = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--block-size",
            str(self.block_size),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--scheduler-cls",
            PLUGIN if self.mode == "andes" else TIMED_STOCK,
        ]
        if not self.log_stats:
            cmd.append("--disable-log-stats")
        if self.kv_blocks > 0:  # shrink the cache so that requests contend (0: vLLM sizes it)
            cmd += ["--num-gpu-blocks-override", str(self.kv_blocks)]
        if self.dummy_weights:
            cmd += ["--load-format", "dummy", "--dtype", "float32"]
        if self.mode == "priority":
            cmd += ["--scheduling-policy", "priority"]
        return cmd + list(self.extra_args)

    def start(self) -> VllmServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stats_file.unlink(missing_ok=True)
        # This checkout's qos first: the vLLM environment's own (editable) install may be
        # another checkout's.
        pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {
            "PYTHONPATH": pythonpath,
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "TOKENPACE_STATS_FILE": str(self.stats_file),
            # Longer than the gateway's pooled connections live (30 s): vLLM's default 5 s
            # closes idle ones under the gateway, whose next request on one gets a 502.
            "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "120",
            **self.env,
        }
        cpu = _engine_cpu()
        if cpu is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu)
        self.server = Server(
            self.name,
            self.command(),
            port=self.port,
            ready_path="/health",
            log_dir=self.workdir,
            cpus=None if cpu is None else {cpu},
            env=env,
            stop_grace_s=20.0,
        )
        return self

    def wait_ready(self, timeout_s: float) -> None:
        """Until /health answers 200; RuntimeError with the log's tail otherwise."""
        assert self.server is not None, "start() first"
        self.server.wait_ready(timeout_s, interval_s=0.5)
        self._renice_engine()

    def _renice_engine(self) -> None:
        """Lower the engine's processes (engine core, worker) to ``nice``; not the API server.

        The API server shares its CPU with the model's compute (see :func:`_engine_cpu`);
        it goes first, as it would on a GPU server.
        """
        assert self.server is not None
        if self.nice:
            for child in self.server.tree()[1:]:
                with contextlib.suppress(psutil.Error):
                    child.nice(self.nice)

    def tail(self, chars: int = 4000) -> str:
        return self.server.tail(chars) if self.server is not None else ""

    def stats(self) -> dict[str, Any]:
        """The scheduler's counters (``qos.vllm.TimedScheduler.stats``), as last written."""
        return json.loads(self.stats_file.read_text())

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after 20 s."""
        if self.server is not None:
            self.server.stop()


def gateway_config(
    backends: Sequence[VllmServer],
    tiers: dict[str, dict[str, float]],
    tenants: dict[str, float] | None = None,
) -> GatewayConfig:
    """One tenant (``bench``, every tier; or ``tenants``, name: weight, each with the key
    :func:`tenant_key`), one backend per server, tagged for tokenpace.

    Every backend gets the tags (``tokenpace: true``; the stock schedulers ignore them)
    and the tier's ``priority`` (``supports_priority``; only vLLM's priority policy reads
    it), so every engine receives the same request bodies.
    """
    return parse_config(
        {
            "tenants": [
                {"name": name, "api_keys": [tenant_key(name)], "weight": weight}
                for name, weight in tenants.items()
            ]
            if tenants
            else [{"name": "bench", "api_keys": [API_KEY], "allow_custom": True}],
            "tiers": tiers,
            "backends": [
                {
                    "name": s.name,
                    "url": f"{s.url}/v1",
                    "models": [s.name],
                    "health_path": "/health",
                    "tokenpace": True,
                    "supports_priority": True,
                }
                for s in backends
            ],
            "timeouts": {"first_byte_s": 600.0, "idle_s": 600.0, "request_s": 1200.0},
            "limits": {"max_tokens": 4096},
        }
    )


def tenant_key(tenant: str) -> str:
    """The API key of a tenant of :func:`gateway_config`."""
    return f"tp-bench-tenant-{tenant}"


@asynccontextmanager
async def serve_gateway(config: GatewayConfig) -> AsyncIterator[str]:
    """The gateway on a free loopback port, in this event loop; yields its ``/v1`` URL."""
    async with serve_in_loop(create_app(config), config, log_level="warning") as url:
        yield f"{url}/v1"


@dataclass(frozen=True)
class Job:
    """One request of a workload: sent at ``at_s`` seconds after the start."""

    at_s: float
    tier: str
    prompt: str
    max_tokens: int
    api_key: str = API_KEY  # whose request (tenant_key(name) for a named tenant)


@dataclass
class JobResult:
    job: Job
    ttft_expected: float
    tds_expected: float
    times: list[tuple[float, int]]  # (seconds since sent, tokens received)
    completion_tokens: int
    qoe: float
    elapsed_s: float
    longest_freeze_s: float  # what the reader saw stop, by the release rule (qos.metrics)
    idle_s: float  # user idle latency, Wang et al. Eq. 9

    @property
    def ttft(self) -> float:
        return self.times[0][0] if self.times else float("nan")


async def _one(client: openai.AsyncOpenAI, model: str, job: Job, t0: float) -> JobResult:
    await asyncio.sleep(max(0.0, t0 + job.at_s - time.perf_counter()))
    sent = time.perf_counter()
    if job.api_key != client.api_key:
        client = client.with_options(api_key=job.api_key)
    raw = await client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": job.prompt}],
        max_tokens=job.max_tokens,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, "tokenpace": {"tier": job.tier}},
    )
    ttft_expected = float(raw.headers["X-TokenPace-TTFT"])
    tds_expected = float(raw.headers["X-TokenPace-TDS"])
    stream = raw.parse()
    times: list[tuple[float, int]] = []
    seen = 0
    async for chunk in stream:
        usage = chunk.usage
        if usage is None or usage.completion_tokens <= seen:
            continue
        times.append((time.perf_counter() - sent, usage.completion_tokens - seen))
        seen = usage.completion_tokens
    elapsed = time.perf_counter() - sent
    qoe = andes_qoe(times, ttft_expected, tds_expected) if times else 0.0
    longest = freezes(times, tds_expected).longest_s if times else float("inf")
    idle = user_idle_latency(times, ttft_expected, tds_expected) if times else elapsed
    return JobResult(job, ttft_expected, tds_expected, times, seen, qoe, elapsed, longest, idle)


def gateway_client(base_url: str, timeout_s: float, connections: int) -> openai.AsyncOpenAI:
    """The official client on the gateway: no retries (a failure is a result), up to
    ``connections`` streams at once."""
    return openai.AsyncOpenAI(
        base_url=base_url,
        api_key=API_KEY,
        max_retries=0,
        timeout=timeout_s,
        http_client=openai.DefaultAsyncHttpxClient(
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        ),
    )


async def run_jobs(base_url: str, model: str, jobs: Sequence[Job]) -> list[JobResult]:
    """Send every job at its time through the gateway; results in job order."""
    async with gateway_client(base_url, timeout_s=1200.0, connections=1000) as client:
        t0 = time.perf_counter()
        return list(await asyncio.gather(*(_one(client, model, job, t0) for job in jobs)))


def median_decode_speed(results: Sequence[JobResult]) -> float:
    """Median tokens/s after the first token over ``results`` (requests streamed together:
    one request's speed in that batch); ValueError when none streamed two chunks."""
    speeds = [
        (r.completion_tokens - r.times[0][1]) / (r.times[-1][0] - r.times[0][0])
        for r in results
        if len(r.times) > 1
    ]
    if not speeds:
        raise ValueError("no request streamed more than one chunk")
    return statistics.median(speeds)


CALIBRATION_TOKENS = 96  # reply length of a calibration batch's requests
CALIBRATION_BATCHES = 4


async def full_batch_speed(
    base_url: str, model: str, size: int, tier: str, api_key: str = API_KEY
) -> float:
    """The tokens/s of one request among ``size`` streamed at once (after its first token):
    the fastest of ``CALIBRATION_BATCHES`` batches in a row, on a warmed-up engine.

    One batch is a poor sample on the CPU build: a fresh engine speeds up over its first
    batches, and whatever else the machine runs slows one down (seen in ten batches in a
    row: 73 to 112 tokens/s; 52 in one batch against about 83 under the workload that
    followed). Neither makes a batch faster than the engine is. ValueError when a batch
    streamed no request in more than one chunk.
    """
    speeds = []
    for b in range(CALIBRATION_BATCHES):
        batch = [
            Job(0.0, tier, f"{b}.{i}: calibrate", CALIBRATION_TOKENS, api_key) for i in range(size)
        ]
        speeds.append(median_decode_speed(await run_jobs(base_url, model, batch)))
    return max(speeds)


def summarize(results: Sequence[JobResult], stats: dict[str, Any]) -> dict[str, float]:
    """The comparison's figures for one engine's run."""
    qoe = np.array([r.qoe for r in results])
    ttft = np.array([r.ttft for r in results])
    tokens = sum(r.completion_tokens for r in results)
    start = min(r.job.at_s for r in results)
    end = max(r.job.at_s + r.elapsed_s for r in results)
    last_arrival = max(r.job.at_s for r in results)
    # tokens received while requests still arrive: the engine's rate under the load itself,
    # without the drain after the last arrival (whose length depends on which requests a
    # policy left for the end)
    loaded = sum(n for r in results for t, n in r.times if r.job.at_s + t <= last_arrival)
    steps = max(int(stats.get("steps", 0)), 1)
    step_s = stats.get("schedule_s", 0.0) + stats.get("model_s", 0.0) + stats.get("update_s", 0.0)
    everyone = reader_summary([r.longest_freeze_s for r in results], [r.idle_s for r in results])
    # Freezes count for the replies someone reads as they stream: a batch job's reply has
    # nobody watching it stall (NON_READER_TIERS, as bench/robustness.py counts them);
    # the share over every reply is reported beside.
    read = [r for r in results if r.job.tier not in NON_READER_TIERS]
    readers = reader_summary([r.longest_freeze_s for r in read], [r.idle_s for r in read])
    return {
        "requests": len(results),
        "avg_qoe": float(qoe.mean()),
        "frozen_over_2s": readers.frozen_share[2.0],
        "frozen_over_5s": readers.frozen_share[5.0],
        "longest_freeze_s": readers.longest_freeze_s,
        "frozen_over_2s_all": everyone.frozen_share[2.0],
        "longest_freeze_all_s": everyone.longest_freeze_s,
        "idle_p99_s": everyone.idle_p99_s,
        "p10_qoe": float(np.percentile(qoe, 10)),
        "p90_ttft_s": float(np.percentile(ttft, 90)),
        "readers_p90_ttft_s": float(np.percentile([r.ttft for r in read], 90)),
        "throughput_tok_s": tokens / (end - start),
        "loaded_tok_s": loaded / (last_arrival - start) if last_arrival > start else 0.0,
        "preemptions_per_request": stats.get("preemptions", 0) / len(results),
        # tokens the engine computed (prompts, outputs, recomputes after preemptions) per
        # token delivered
        "computed_per_token": stats.get("scheduled_tokens", 0) / max(tokens, 1),
        "schedule_ms_per_step": 1e3 * stats.get("schedule_s", 0.0) / steps,
        "policy_ms_per_step": 1e3 * stats.get("policy_s", 0.0) / steps,
        "step_ms": 1e3 * step_s / steps,
        "schedule_share": stats.get("schedule_s", 0.0) / step_s if step_s else 0.0,
        # the engine thread's own CPU time in schedule(): without what the API server,
        # sharing the engine's CPU here (not on a GPU server), ran in the meantime
        "schedule_cpu_share": stats.get("schedule_cpu_s", 0.0) / step_s if step_s else 0.0,
    }
