"""A terminal chat through tokenpace, the reply paced at the reader's speed.

Start the gateway (``tokenpace serve`` or ``make run``), then, with the key it prints:

    .venv/bin/python examples/chat.py --api-key tp-demo-...

Each reply is printed as tokenpace_client releases it (the tier's TDS, announced by the
gateway), followed by one line: the tier, the time to first token, and the Andes QoE
(Andes (Liu et al.) §3.1 Eq. 1) of what arrived from the network and of what was shown.
``--prompt TEXT`` asks one question and exits. The gateway's URL: ``--base-url``, else
``TOKENPACE_BASE_URL``, else ``OPENAI_BASE_URL``, else ``http://127.0.0.1:8000/v1``. A
wrong key, an unknown tier or no gateway is told in one line that says what to fix.
"""

from __future__ import annotations

import argparse
import sys

import openai
from cli_support import api_key, base_url, explain
from tokenpace_client import OpenAI, PacedStream


def summary(stream: PacedStream) -> str:
    """One line about the reply: tier, TTFT, arrival and displayed QoE."""
    q, timeline = stream.qoe, stream.timeline
    ttft = f"{timeline.arrivals[0][0]:.2f} s" if timeline.arrivals else "-"
    return (
        f"[tier {stream.tier} · TTFT {ttft} · QoE arrived {q.andes:.2f} "
        f"(monotone {q.monotone:.2f}) · displayed {q.displayed_andes:.2f} "
        f"(monotone {q.displayed_monotone:.2f})]"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=base_url())
    parser.add_argument("--api-key", default=api_key())
    parser.add_argument("--model", default="tokenpace-sim")
    parser.add_argument("--tier", default="chat", help="chat, voice, fast, batch")
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--prompt", help="ask this once and exit")
    args = parser.parse_args()
    if not args.api_key:
        parser.error("--api-key (or TOKENPACE_API_KEY): the key `make run` printed")
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, tier=args.tier)
    history: list[dict[str, str]] = []
    while True:
        if args.prompt is not None:
            question = args.prompt
        else:
            try:
                question = input("you> ")
            except EOFError:
                return 0
        history.append({"role": "user", "content": question})
        reply: list[str] = []
        try:
            stream = client.chat.completions.create(
                model=args.model, messages=history, max_tokens=args.max_tokens, stream=True
            )
            with stream:
                for chunk in stream:
                    text = chunk.choices[0].delta.content if chunk.choices else None
                    if text:
                        reply.append(text)
                        sys.stdout.write(text)
                        sys.stdout.flush()
        except openai.APIError as error:
            print("\n" if reply else "", end="")
            print(f"error: {explain(error, args.base_url)}", file=sys.stderr)
            return 1
        print()
        print(summary(stream))
        history.append({"role": "assistant", "content": "".join(reply)})
        if args.prompt is not None:
            return 0


if __name__ == "__main__":
    sys.exit(main())
