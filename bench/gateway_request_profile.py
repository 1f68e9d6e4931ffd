"""Where the gateway's per-request work goes: a ranked profile, in one process.

The gateway on a real uvicorn in front of ``tests/support/cost.py``'s lockstep upstream
(each chunk sent once the client read the previous one), ``--requests`` streams of
``--tokens`` tokens one after another, the QoE records flushed after every
``--flush-every`` of them (1: each request with its own, as the cost budget test counts
them, tests/gateway/relay/test_cost_budget.py; the flush loop takes every record of a
quarter second at once). Two views:

- ``calls``: every call made on the gateway's behalf (the budget test's hook), charged to
  the innermost ``gateway/`` or ``qos/`` function on the stack (its own calls and the
  libraries' work under it), per request;
- ``cprofile``: cProfile's inclusive time per request of the gateway's functions (the
  profiler's overhead included: a ranking, not a timing);
- ``cpu``: the process's CPU time per request, no profiler (the client and the upstream
  included: compare two trees' figures, run alternately, not one figure with another
  benchmark's).

Run from the repository root with ``PYTHONPATH=$PWD:$PWD/sdk_python``, e.g.
``.venv/bin/python bench/gateway_request_profile.py --tokens 1 --requests 300``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from tests.support.cost import OWN, CallCounter, LockstepUpstream, stream
from tests.support.fake_upstream import MODEL
from tests.support.gateway import backend_entry, gateway, make_config
from tests.support.servers import run_server

ROOT = Path(__file__).resolve().parents[1]


class ChargedCounter(CallCounter):
    """:class:`CallCounter`, each call charged to the innermost own function above it."""

    def __init__(self) -> None:
        super().__init__()
        self.by_function: Counter[str] = Counter()

    def _owner(self, frame: FrameType | None) -> str | None:
        while frame is not None:
            code = frame.f_code
            if self._is_own(code.co_filename):
                path = Path(code.co_filename).relative_to(ROOT)
                return f"{path}:{code.co_firstlineno}({code.co_name})"
            frame = frame.f_back
        return None

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "c_call"):
            return
        if asyncio.current_task() in self._skip:
            return
        # a call's own frame is the function called: charge the caller's own function
        owner = self._owner(frame.f_back if event == "call" else frame)
        if owner is None and event == "call" and self._is_own(frame.f_code.co_filename):
            owner = "(entered from outside)"
        if owner is not None:
            self.calls += 1
            self.by_function[owner] += 1


async def main(args: argparse.Namespace) -> None:
    upstream = LockstepUpstream(MODEL)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": args.tokens,
    }
    async with run_server(upstream) as url:
        config = make_config([backend_entry(url, "lockstep")])
        async with gateway(config) as gw, gw.client() as client:
            states = gw.state.router.states
            flush = gw.state.telemetry.flush

            async def one(i: int) -> None:
                await stream(client, upstream, body)
                while not all(s.in_flight == 0 and s.outstanding_tokens == 0 for s in states):
                    await asyncio.sleep(0.001)
                if i % args.flush_every == args.flush_every - 1:
                    await flush()

            for i in range(20):  # caches, labels, connections warm
                await one(i)
            await flush()
            n = args.requests
            if args.view == "calls":
                counter = ChargedCounter()
                with counter:
                    for i in range(n):
                        await one(i)
                print(f"calls per request: {counter.calls / n:.1f} ({args.tokens} tokens)")
                for name, calls in counter.by_function.most_common(args.top):
                    print(f"{calls / n:8.1f}  {name}")
                return
            if args.view == "cpu":
                started = time.process_time()
                for i in range(n):
                    await one(i)
                await flush()
                spent = time.process_time() - started
                print(f"CPU µs per request: {spent / n * 1e6:.0f} ({args.tokens} tokens)")
                return
            profile = cProfile.Profile()
            profile.enable()
            for i in range(n):
                await one(i)
            profile.disable()
    stats = pstats.Stats(profile)
    own = [
        (key, row)
        for key, row in stats.stats.items()  # type: ignore[attr-defined]
        if key[0].startswith(OWN)
    ]
    own.sort(key=lambda item: item[1][3], reverse=True)  # inclusive time
    print(f"inclusive µs per request (cProfile, {args.tokens} tokens, {n} requests)")
    for (filename, line, name), (_, calls, _tt, ct, _) in own[: args.top]:
        path = Path(filename).relative_to(ROOT)
        print(f"{ct / n * 1e6:8.1f}  {calls / n:6.1f}×  {path}:{line}({name})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--flush-every", type=int, default=1)
    parser.add_argument("--view", choices=("calls", "cprofile", "cpu"), default="calls")
    parser.add_argument("--top", type=int, default=40)
    sys.exit(asyncio.run(main(parser.parse_args())))
