"""A voice reply on the voice tier: sentences released at speaking speed, spoken by espeak-ng.

Start the gateway (``make run``), then:

    .venv/bin/python examples/voice.py --api-key tp-demo-... [--wav reply.wav]

tokenpace_client releases whole sentences (``unit="sentence"``): each goes out once it
is complete and the previous one has had its speaking time (its tokens / TDS, 3.3
tokens/s on the voice tier). Every sentence is printed with its release time (seconds
since the request). With espeak-ng installed (the Debian package ``espeak-ng``) each one
is spoken as it is released, or with ``--wav FILE`` written to one WAV file instead.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import time
import wave

from tokenpace_client import OpenAI


def synthesize(espeak: str, sentence: str) -> bytes:
    """espeak-ng's WAV of ``sentence``."""
    return subprocess.run([espeak, "--stdout", sentence], check=True, capture_output=True).stdout


def write_wav(path: str, clips: list[bytes]) -> float:
    """Concatenate WAV clips (espeak-ng's format throughout) into ``path``; seconds written."""
    frames = 0
    with wave.open(path, "wb") as out:
        for i, clip in enumerate(clips):
            with wave.open(io.BytesIO(clip)) as part:
                if i == 0:
                    out.setparams(part.getparams())
                data = part.readframes(part.getnframes())  # espeak-ng's header overstates it
                frames += len(data) // (part.getsampwidth() * part.getnchannels())
                out.writeframes(data)
        rate = out.getframerate() if clips else 1
    return frames / rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default=os.environ.get("TOKENPACE_API_KEY"))
    parser.add_argument("--model", default="tokenpace-sim")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--prompt", default="Tell me a short story.")
    parser.add_argument("--wav", metavar="FILE", help="write the audio to FILE instead of playing")
    args = parser.parse_args()
    if not args.api_key:
        parser.error("--api-key (or TOKENPACE_API_KEY): the key `make run` printed")
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        print("espeak-ng is not installed: printing the sentences only", file=sys.stderr)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, tier="voice", unit="sentence")
    sent = time.monotonic()
    stream = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": args.prompt}],
        max_tokens=args.max_tokens,
        stream=True,
    )
    clips: list[bytes] = []
    with stream:
        for chunk in stream:
            sentence = (chunk.choices[0].delta.content or "").strip() if chunk.choices else ""
            if not sentence:
                continue
            print(f"[{time.monotonic() - sent:6.2f} s] {sentence}", flush=True)
            if espeak is None:
                continue
            if args.wav:
                clips.append(synthesize(espeak, sentence))
            else:  # speaks now; the next sentence is due once this one had its time
                spoken = subprocess.run([espeak, sentence], capture_output=True, text=True)
                if spoken.returncode != 0 or "error" in spoken.stderr.lower():
                    print(
                        f"espeak-ng cannot play here ({spoken.stderr.strip().splitlines()[-1]});"
                        " use --wav FILE",
                        file=sys.stderr,
                    )
                    espeak = None
    q = stream.qoe
    print(f"[tier {stream.tier} · QoE arrived {q.andes:.2f} · displayed {q.displayed_andes:.2f}]")
    if args.wav and espeak is not None:
        print(f"wrote {args.wav}: {write_wav(args.wav, clips):.1f} s of audio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
