"""A voice reply on the voice tier: sentences released at speaking speed, spoken by espeak-ng.

Start the gateway (``tokenpace serve`` or ``make run``), then:

    .venv/bin/python examples/voice.py --api-key tp-demo-... [--wav reply.wav]

tokenpace_client releases whole sentences (``unit="sentence"``): each goes out once it
is complete and the previous one has had its speaking time (its tokens / TDS, 3.3
tokens/s on the voice tier). Every sentence is printed with its release time (seconds
since the request). With espeak-ng installed (the Debian package ``espeak-ng``) each one
is spoken as it is released, or with ``--wav FILE`` written to one WAV file instead, at
the speed the gateway announces for the tier (``X-TokenPace-TDS``), so the speech keeps
pace with the release. ``--speed`` is the listener's speed control: espeak-ng speaks at
that multiple of the tier's speed, and the stream tells the gateway the listener's pace
(a reader signal, docs/architecture/sdk-reader-signals.md), so that a slower listener's
reply can yield to others. The gateway's URL and the key are found as ``chat.py`` finds them.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import time
import wave

import openai
from cli_support import api_key, base_url, explain
from tokenpace_client import OpenAI

# espeak-ng's speed is in words a minute, a tier's TDS in tokens a second. Andes (Liu et
# al.) §2.2 derives the voice tier's 3.3 tokens/s from Table 2's English speaking speed,
# 150 words a minute: 3.3 / (150 / 60) = 1.32 tokens a word.
TOKENS_PER_WORD = 3.3 / (150 / 60)
ESPEAK_MIN_WPM = 80  # espeak-ng speaks no slower
MIN_SPEED, MAX_SPEED = 0.25, 2.0  # the speed control's range, a multiple of the tier's


def words_per_minute(tds: float) -> int:
    """espeak-ng's ``-s`` for ``tds`` tokens/s: tds / TOKENS_PER_WORD words a second, x 60."""
    return max(ESPEAK_MIN_WPM, round(tds / TOKENS_PER_WORD * 60))


def synthesize(espeak: str, wpm: int, sentence: str) -> bytes:
    """espeak-ng's WAV of ``sentence`` spoken at ``wpm`` words a minute."""
    command = [espeak, "-s", str(wpm), "--stdout", sentence]
    return subprocess.run(command, check=True, capture_output=True).stdout


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
    parser.add_argument("--base-url", default=base_url())
    parser.add_argument("--api-key", default=api_key())
    parser.add_argument("--model", default="tokenpace-sim")
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--prompt", default="Tell me a short story.")
    parser.add_argument("--wav", metavar="FILE", help="write the audio to FILE instead of playing")
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="speak at this multiple of the tier's speed (0.25 to 2; default 1)",
    )
    args = parser.parse_args()
    if not MIN_SPEED <= args.speed <= MAX_SPEED:
        parser.error(f"--speed {args.speed:g}: give a multiple from {MIN_SPEED} to {MAX_SPEED:g}")
    if not args.api_key:
        parser.error("--api-key (or TOKENPACE_API_KEY): the key `make run` printed")
    espeak = shutil.which("espeak-ng")
    if espeak is None and args.wav:
        parser.error(
            f"--wav {args.wav}: writing audio needs espeak-ng, which is not installed "
            "(Debian: apt-get install espeak-ng, or make system-deps)"
        )
    if espeak is None:
        print("espeak-ng is not installed: printing the sentences only", file=sys.stderr)
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, tier="voice", unit="sentence")
    try:
        clips = speak(client, args, espeak)
    except openai.APIError as error:
        print(f"error: {explain(error, args.base_url)}", file=sys.stderr)
        return 1
    if args.wav:
        try:
            seconds = write_wav(args.wav, clips)
        except OSError as error:
            print(f"error: cannot write {args.wav}: {error.strerror or error}", file=sys.stderr)
            return 1
        print(f"wrote {args.wav}: {seconds:.1f} s of audio")
    return 0


def speak(client: OpenAI, args: argparse.Namespace, espeak: str | None) -> list[bytes]:
    """Ask, then print (and speak, or keep the audio of) each sentence as it is released."""
    sent = time.monotonic()
    stream = client.chat.completions.create(
        model=args.model,
        messages=[{"role": "user", "content": args.prompt}],
        max_tokens=args.max_tokens,
        stream=True,
    )
    pace = stream.tds * args.speed
    if args.speed != 1.0:  # the listener's own pace: the gateway may let the reply yield
        stream.set_pace(pace)
        print(f"[listening at {args.speed:g}x the tier's speed: {pace:.3g} tokens/s]")
    wpm = words_per_minute(pace)
    if espeak is not None:
        rate = f"{pace:.3g} tokens/s at {TOKENS_PER_WORD:.2f} tokens a word"
        if args.speed == 1.0:
            rate = f"the tier's {rate}"
        print(f"[espeak-ng at {wpm} words/min: {rate}]")
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
                clips.append(synthesize(espeak, wpm, sentence))
            else:  # speaks now; the next sentence is due once this one had its time
                spoken = subprocess.run(
                    [espeak, "-s", str(wpm), sentence], capture_output=True, text=True
                )
                if spoken.returncode != 0 or "error" in spoken.stderr.lower():
                    print(
                        f"espeak-ng cannot play here ({spoken.stderr.strip().splitlines()[-1]});"
                        " use --wav FILE",
                        file=sys.stderr,
                    )
                    espeak = None
    q = stream.qoe
    print(f"[tier {stream.tier} · QoE arrived {q.andes:.2f} · displayed {q.displayed_andes:.2f}]")
    return clips


if __name__ == "__main__":
    sys.exit(main())
