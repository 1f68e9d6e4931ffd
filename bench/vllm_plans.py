"""Price plans on a real vLLM engine: two tenants, weights 1 : 4, the plugin with plans
(``andes-tp``) against the same policy with weights ignored (``andes-tp-unweighted``).

Shared with ``tests/qos/vllm/test_tiering_e2e.py``. One vLLM OpenAI server per policy (the
CPU build, ``.models/small-llama`` with dummy weights, started from ``.venv-vllm`` with
this checkout's ``qos`` first on its path), four sequence slots (``--max-num-seqs 4``).
The tokenpace gateway in front of it has two tenants, ``basic`` (weight 1) and
``premium`` (weight 4), and tags every request with its tenant and weight. The tier is
**scaled to the engine's measured speed**: a first gateway streams four 96-token replies
at once, four times, to measure s, the tokens/s of one request in a full batch (the
fastest batch); the measured gateway's tier asks for ``tds_per_speed`` × s tokens/s
after a first token within ``TTFT_TOKENS`` / TDS seconds. Both tenants send the same
demand, steadily: ``REQUESTS`` 160-token requests, alternating, evenly spaced so that
``READERS`` replies read at their pace at any time (one every 160 / TDS / 16 s, for
about 40 s: long enough for the plans to learn each tenant's pace). At the default 0.4,
the sixteen readers ask for 1.6 times the full batch's decode speed (overload); at
0.286, 1.14 times; at 0.2, 0.8 times.

The slack is 256 service units (``TOKENPACE_FAIR_SHARE_SLACK``): the shipped 8,192 is
~5 s of a GPU engine's output and would outlast a whole run.

    .venv/bin/python bench/vllm_plans.py --loads 0.2,0.286,0.4 [--speed S]

prints each tenant's client-measured average QoE, first-token wait, longest freeze and
user idle latency (p50 and p99) per policy and load (a few minutes per run), and the
load as the engine ran (:func:`measured_load`). With
``--speed``, one full-batch speed sets every server's tier, so both policies of a load
serve the same demand; by default each server's own calibration sets its tier, and on a
shared VM two servers' calibrations can differ by half.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from vllm_harness import (
    Job,
    JobResult,
    VllmServer,
    full_batch_speed,
    gateway_config,
    run_jobs,
    serve_gateway,
    tenant_key,
)

ROOT = Path(__file__).resolve().parents[1]

OVERLOAD_TDS_PER_SPEED = 0.4  # READERS readers at this TDS ask 1.6 x the engine's 4 s
TTFT_TOKENS = 15.0  # the expected TTFT, in tokens' worth of the tier's TDS
TENANTS = {"basic": 1.0, "premium": 4.0}
TOKENS = 160
REQUESTS = 64
READERS = 16  # replies read at once, at the arrival pace, were each served at its TDS
SLOTS = 4  # --max-num-seqs
POLICIES = ("andes-tp", "andes-tp-unweighted")


def workload(tds: float, requests: int = REQUESTS) -> list[Job]:
    """The tenants' requests in turn, one every TOKENS / ``tds`` / READERS seconds."""
    spacing = TOKENS / tds / READERS
    jobs = []
    for i in range(requests):
        tenant = list(TENANTS)[i % len(TENANTS)]
        prompt = f"{tenant} question {i}: how fast do users read?"
        jobs.append(Job(spacing * i, "chat", prompt, TOKENS, tenant_key(tenant)))
    return jobs


def tiers(tds: float) -> dict[str, dict[str, float]]:
    return {"chat": {"ttft": TTFT_TOKENS / tds, "tds": tds, "priority": 1}}


def plan_server(python: str, model: str, policy: str, workdir: Path) -> VllmServer:
    """The plugin under ``policy`` (``TOKENPACE_POLICY``) on four slots."""
    return VllmServer(
        python,
        model,
        "tiny-tiers",
        "andes",
        workdir,
        kv_blocks=256,
        max_num_seqs=SLOTS,
        max_model_len=1024,
        extra_args=("--stream-interval", "4"),
        env={"TOKENPACE_FAIR_SHARE_SLACK": "256", "TOKENPACE_POLICY": policy},
        nice=10,
    )


async def engine_speed(server: VllmServer) -> float:
    """Warm the engine up, then :func:`~vllm_harness.full_batch_speed` with ``SLOTS``
    requests at once."""
    async with serve_gateway(gateway_config([server], tiers(30.0), TENANTS)) as url:
        key = tenant_key("premium")
        warm = [Job(0.0, "chat", "warm up " * (i + 1), 8 + 8 * i, key) for i in range(SLOTS)]
        done = await run_jobs(url, server.name, warm)
        assert all(r.completion_tokens == r.job.max_tokens for r in done)
        return await full_batch_speed(url, server.name, SLOTS, "chat", key)


async def drive(
    server: VllmServer, tds_per_speed: float = OVERLOAD_TDS_PER_SPEED, speed: float | None = None
) -> tuple[float, list[JobResult]]:
    """The tier's TDS (``tds_per_speed`` times ``speed``, the full batch's per-request
    tokens/s, measured on ``server`` when not given) and every reply of the workload."""
    if speed is None:
        speed = await engine_speed(server)
    tds = tds_per_speed * speed
    async with serve_gateway(gateway_config([server], tiers(tds), TENANTS)) as url:
        return tds, await run_jobs(url, server.name, workload(tds))


@dataclass(frozen=True)
class TenantOutcome:
    avg_qoe: float
    mean_ttft_s: float
    longest_freeze_s: float
    idle_p50_s: float  # user idle latency (Wang et al. Eq. 9) over the tenant's replies
    idle_p99_s: float  # its tail


def by_tenant(results: list[JobResult]) -> dict[str, TenantOutcome]:
    out = {}
    for name in TENANTS:
        rs = [r for r in results if r.job.api_key == tenant_key(name)]
        out[name] = TenantOutcome(
            statistics.mean(r.qoe for r in rs),
            statistics.mean(r.ttft for r in rs),
            max(r.longest_freeze_s for r in rs),
            statistics.median(r.idle_s for r in rs),
            float(np.percentile([r.idle_s for r in rs], 99)),
        )
    return out


def run_one(args: argparse.Namespace, policy: str, load: float, workdir: Path) -> dict[str, Any]:
    server = plan_server(args.python, args.model, policy, workdir)
    try:
        server.start()
        server.wait_ready(timeout_s=400)
        tds, results = asyncio.run(drive(server, load, args.speed))
        stats = server.stats()
    finally:
        server.stop()
    assert all(r.completion_tokens == r.job.max_tokens for r in results)
    return {
        "tds": tds,
        "load": measured_load(tds, stats),
        "tenants": by_tenant(results),
        "policy_s": stats.get("policy_s"),
    }


def measured_load(tds: float, stats: dict[str, Any]) -> float:
    """What the READERS readers at ``tds`` asked of the engine as it ran: their tokens/s
    over its full batch's decode rate, SLOTS over the step time the plugin measured at
    that batch (its online profile, in the server's stats)."""
    step_s = float(stats["profile"]["decode_s_at"][-1])
    return tds * READERS * step_s / SLOTS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--model", default=str(ROOT / ".models" / "small-llama"))
    p.add_argument("--loads", default=f"0.2,{OVERLOAD_TDS_PER_SPEED}", help="TDS per speed")
    p.add_argument("--workdir", default=str(ROOT / "results" / "vllm_plans"))
    p.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        help="the full batch's tokens/s per request for every server (default: each "
        "server's own, measured at its start), so that the policies of a load get the "
        "same tier",
    )
    args = p.parse_args()
    if args.speed is not None and not args.speed > 0:
        p.error(f"--speed: must be > 0 tokens/s, got {args.speed}")
    unknown = set(args.policies.split(",")) - set(POLICIES)
    if unknown:
        p.error(f"--policies: unknown {', '.join(sorted(unknown))}; use {', '.join(POLICIES)}")
    print(
        "| TDS / full-batch speed | policy | tier TDS | load measured | "
        + " | ".join(
            f"{t} (w {w:g}): QoE, mean TTFT, longest freeze, idle p50 / p99"
            for t, w in TENANTS.items()
        )
        + " |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for load in (float(x) for x in args.loads.split(",")):
        for policy in args.policies.split(","):
            workdir = Path(args.workdir) / f"{policy}-{load:g}"
            workdir.mkdir(parents=True, exist_ok=True)
            got = run_one(args, policy, load, workdir)
            cells = [
                f"{o.avg_qoe:.2f}, {o.mean_ttft_s:.1f} s, {o.longest_freeze_s:.1f} s, "
                f"{o.idle_p50_s:.1f} / {o.idle_p99_s:.1f} s"
                for o in got["tenants"].values()
            ]
            row = f"| {load:g} | {policy} | {got['tds']:.1f} | {got['load']:.2f} | "
            print(row + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
