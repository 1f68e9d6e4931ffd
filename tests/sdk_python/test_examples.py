"""The client's examples (examples/chat.py, examples/voice.py) against the real gateway.

The gateway runs on its embedded SIMULATED engine (no model runs), in a thread; the
examples run as the user runs them, in a subprocess. The voice example writes its WAV
with espeak-ng (a Debian package the project installs) and prints sentences without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from gateway.config.schema import DEMO_MODEL
from tests.support.gateway import KEY
from tests.support.paths import EXAMPLES
from tests.support.sdk_python import gateway_thread


@pytest.fixture(scope="module")
def base_url():
    with gateway_thread() as (gw, _runner):
        yield gw.base_url


def _run(script: str, base_url: str, *args: str, env: dict | None = None) -> str:
    out = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / script),
            *("--base-url", base_url, "--api-key", KEY),
            *("--model", DEMO_MODEL),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    return out.stdout


def test_chat_prints_the_reply_then_tier_ttft_and_both_qoes(base_url):
    out = _run("chat.py", base_url, "--prompt", "Hello!", "--tier", "fast", "--max-tokens", "12")
    reply, summary = out.strip().splitlines()
    assert reply.startswith("Simulated reply:")
    assert re.fullmatch(
        r"\[tier fast · TTFT \d+\.\d\d s · QoE arrived [01]\.\d\d \(monotone [01]\.\d\d\) · "
        r"displayed [01]\.\d\d \(monotone [01]\.\d\d\)\]",
        summary,
    ), summary


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng (make system-deps)")
def test_voice_writes_the_spoken_sentences_to_a_wav(base_url, tmp_path: Path):
    wav = tmp_path / "reply.wav"
    out = _run("voice.py", base_url, "--max-tokens", "12", "--wav", str(wav))
    sentences = re.findall(r"^\[\s*(\d+\.\d\d) s\] (.+)$", out, re.M)
    assert len(sentences) == 2 and sentences[0][1].endswith(".")
    # the second sentence waits for the first one's speaking time (10 tokens at 3.3/s)
    assert float(sentences[1][0]) - float(sentences[0][0]) >= 10 / 3.3 - 0.05
    with wave.open(str(wav)) as audio:
        seconds = audio.getnframes() / audio.getframerate()
    assert 1.0 < seconds < 30.0 and f"{seconds:.1f} s of audio" in out


def test_voice_without_espeak_prints_sentences_with_release_times(base_url, tmp_path: Path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no espeak-ng on it
    out = _run("voice.py", base_url, "--max-tokens", "12", env=env)
    assert len(re.findall(r"^\[\s*\d+\.\d\d s\] \S", out, re.M)) == 2
    assert "tier voice" in out
