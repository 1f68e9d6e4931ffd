"""The client's examples (examples/chat.py, examples/voice.py) against the real gateway.

The gateway runs on its embedded SIMULATED engine (no model runs), in a thread; the
examples run as the user runs them, in a subprocess. The voice example writes its WAV
with espeak-ng (a Debian package the project installs) and prints sentences without it.
A common mistake (a wrong key, an unknown tier, no gateway) is one line saying what to fix.
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
from tests.support.gateway import KEY, KEY_BASIC
from tests.support.paths import EXAMPLES
from tests.support.ports import free_port
from tests.support.sdk_python import gateway_thread


@pytest.fixture(scope="module")
def base_url():
    with gateway_thread() as (gw, _runner):
        yield gw.base_url


def _example(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *("--model", DEMO_MODEL), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _run(script: str, base_url: str, *args: str, env: dict | None = None) -> str:
    out = _example(script, "--base-url", base_url, "--api-key", KEY, *args, env=env)
    assert out.returncode == 0, out.stderr
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
    # 3.3 tokens/s at 1.32 tokens a word (Andes Table 2's 150 words/min) is 150 words/min
    assert "[espeak-ng at 150 words/min: the tier's 3.3 tokens/s at 1.32 tokens a word]" in out
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


def test_voice_speed_control_tells_the_gateway_the_listeners_pace(base_url, tmp_path: Path):
    env = {**os.environ, "PATH": str(tmp_path)}  # no espeak-ng on it
    out = _run("voice.py", base_url, "--max-tokens", "12", "--speed", "0.5", env=env)
    assert "[listening at 0.5x the tier's speed: 1.65 tokens/s]" in out
    assert len(re.findall(r"^\[\s*\d+\.\d\d s\] \S", out, re.M)) == 2
    refused = _example("voice.py", "--base-url", base_url, "--api-key", KEY, "--speed", "0")
    assert refused.returncode == 2 and "--speed 0: give a multiple from 0.25 to 2" in refused.stderr


def test_the_gateway_url_comes_from_the_environment(base_url):
    prompt = ("--api-key", KEY, "--prompt", "Hello!", "--max-tokens", "3")
    without = {k: v for k, v in os.environ.items() if not k.endswith("_BASE_URL")}
    for env in ({"TOKENPACE_BASE_URL": base_url}, {"OPENAI_BASE_URL": base_url}):
        out = _example("chat.py", *prompt, env={**without, **env})
        assert out.returncode == 0 and out.stdout.startswith("Simulated reply:"), out.stderr
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    both = {"TOKENPACE_BASE_URL": nowhere, "OPENAI_BASE_URL": base_url}
    out = _example("chat.py", *prompt, env={**without, **both})
    assert out.returncode == 1 and nowhere in out.stderr, "TOKENPACE_BASE_URL comes first"


WRONG_KEY = "tp-not-a-key-0000"


@pytest.mark.parametrize(
    ("script", "args", "says"),
    [
        ("chat.py", ["--api-key", WRONG_KEY], "401 Incorrect API key provided. Give"),
        ("voice.py", ["--api-key", WRONG_KEY], "401 Incorrect API key provided. Give"),
        ("chat.py", ["--api-key", KEY, "--tier", "slow"], "Unknown tier 'slow'; this"),
        ("chat.py", ["--api-key", KEY_BASIC, "--tier", "fast"], "Choose a tier of this key's plan"),
        ("chat.py", ["--api-key", KEY, "--base-url", "NOWHERE"], "No tokenpace gateway answers at"),
    ],
    ids=["wrong-key", "wrong-key-voice", "unknown-tier", "tier-not-in-plan", "no-gateway"],
)
def test_a_common_mistake_is_one_line_that_says_what_to_fix(base_url, script, args, says):
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    args = [nowhere if a == "NOWHERE" else a for a in args]
    out = _example(script, "--base-url", base_url, *args, "--prompt", "Hi", "--max-tokens", "3")
    assert out.returncode == 1
    assert out.stdout.strip() == ""
    assert len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("error: ") and says in out.stderr, out.stderr


def test_voice_wav_without_espeak_fails_before_asking(base_url, tmp_path: Path):
    wav = tmp_path / "reply.wav"
    env = {**os.environ, "PATH": str(tmp_path)}  # no espeak-ng on it
    out = _example("voice.py", "--base-url", base_url, "--api-key", KEY, "--wav", str(wav), env=env)
    assert out.returncode == 2 and not wav.exists()
    assert "writing audio needs espeak-ng, which is not installed" in out.stderr


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng (make system-deps)")
def test_voice_wav_that_cannot_be_written_fails(base_url, tmp_path: Path):
    wav = tmp_path / "no-such-folder" / "reply.wav"
    out = _example(
        "voice.py", "--base-url", base_url, "--api-key", KEY, "--max-tokens", "6", "--wav", str(wav)
    )
    assert out.returncode == 1 and f"error: cannot write {wav}" in out.stderr
