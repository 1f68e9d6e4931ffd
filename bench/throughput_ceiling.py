"""What no scheduler can exceed: an engine profile's token and request rate on the trace.

Every reply of the Andes trace costs the engine its prompt's prefill and one decode
iteration per token after the first. An iteration that decodes a batch of B sequences
and prefills P tokens takes τ(B) + c·P (``LatencyProfile.iteration_s``; a prefill's
fixed cost comes on top), so over N replies the engine is busy at least

    N·E[p]·c + N·E[n − 1]·min_B τ(B)/B,

whatever the order, pausing or preemption (a recompute or a swap only adds to it). The
request rate it can sustain is N over that, and smooth goodput (Wang et al. Eq. 10–11),
tokens less an idle penalty, cannot exceed the token rate. This is the **batch
bound**: it holds for every policy.

Where the KV cache binds, an engine that keeps every KV it holds on the GPU (no swap) can
also hold at most M context tokens at once. A reply holds E[(n − 1)·p + n(n − 1)/2] token
iterations over its decode; at the same batch every iteration that allows a batch of at
most B_kv = M·E[n − 1] / E[(n − 1)·p + n(n − 1)/2], and the **KV bound** is the same
formula with B ≤ B_kv. It assumes a steady batch: where τ is concave (OPT-66B's table)
alternating large batches of short contexts with small ones could in principle beat it.

    .venv/bin/python bench/throughput_ceiling.py [--profile NAME ...] [--out FILE]

prints each bound, then the report as JSON (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from qos.latency import PROFILES, LatencyProfile, get_profile
from qos.sim.workload import TraceEntry, load_andes_trace


@dataclass(frozen=True)
class Ceiling:
    """One bound: the best batch it allows and the rates it caps."""

    batch: int  # the batch size with the least decode time per token within the bound
    decode_s_per_token: float  # τ(batch) / batch
    req_s: float
    tok_s: float


def _lengths(entries: list[TraceEntry]) -> tuple[np.ndarray, np.ndarray]:
    """Each entry's prompt and reply length, in tokens."""
    prompt = np.array([e.prompt_tokens for e in entries], dtype=float)
    return prompt, np.array([e.output_len for e in entries], dtype=float)


def ceiling(profile: LatencyProfile, entries: list[TraceEntry], max_batch: int) -> Ceiling:
    """The rates no schedule exceeds when no batch holds more than ``max_batch`` sequences."""
    prompt, output = _lengths(entries)
    batches = np.arange(1, max_batch + 1)
    per_token = profile.decode_s(batches) / batches
    best = int(np.argmin(per_token))
    seconds = profile.prefill_per_token_s * prompt.mean() + (output - 1).mean() * per_token[best]
    return Ceiling(int(batches[best]), float(per_token[best]), 1 / seconds, output.mean() / seconds)


def kv_batch(profile: LatencyProfile, entries: list[TraceEntry]) -> int:
    """B_kv: the steady batch the KV cache holds on this trace (module docstring)."""
    prompt, output = _lengths(entries)
    decoded = output - 1
    held = (decoded * prompt + decoded * (decoded + 1) / 2).mean()
    return max(1, int(profile.kv_capacity_tokens * decoded.mean() / held))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", choices=sorted(PROFILES))
    parser.add_argument("--out", type=Path, help="also write the report (JSON) here")
    args = parser.parse_args()
    entries = load_andes_trace()
    report = {}
    for name in args.profile or sorted(PROFILES):
        profile = get_profile(name)
        batch = ceiling(profile, entries, profile.max_batch)
        kv = ceiling(profile, entries, min(profile.max_batch, kv_batch(profile, entries)))
        report[name] = {"batch_bound": asdict(batch), "kv_bound": asdict(kv)}
        for label, bound in (("batch bound", batch), ("KV bound", kv)):
            print(
                f"{name:20s} {label:11s} batch {bound.batch:3d}: "
                f"{bound.req_s:6.2f} req/s, {bound.tok_s:7,.0f} tokens/s"
            )
    print(json.dumps(report))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
