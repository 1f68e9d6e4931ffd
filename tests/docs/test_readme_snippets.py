"""The READMEs' code runs as written, against the gateway on its embedded SIMULATED
engine (no model runs; `tokenpace serve` without a configuration serves the same).

Every ``python`` block runs, unless the line before it is ``<!-- not run: REASON -->``;
the blocks of one README run in one process, in order, as a reader pastes them one
after the other. A shell block runs only when the line before it is ``<!-- run -->``
(the others install things or start servers, which the rest of the suite covers). What a
reader replaces is replaced: the printed key ``tp-demo-...`` by a real key, the local
gateway's address by the test gateway's, and ``TOKENPACE_API_KEY`` /
``TOKENPACE_BASE_URL`` are set as the READMEs say to set them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.gateway import KEY
from tests.support.paths import ROOT
from tests.support.sdk_python import gateway_thread

READMES = ("README.md", "sdk_python/README.md", "examples/README.md", "deploy/README.md")
FENCE = re.compile(r"^```(\w*)\s*$")
LOCAL = "http://127.0.0.1:8000/v1"
PRINTED_KEY = "tp-demo-..."


@dataclass(frozen=True)
class Block:
    readme: str
    line: int
    lang: str
    code: str


def blocks(readme: str) -> list[Block]:
    """The blocks of ``readme`` that run, in order."""
    out = []
    lines = (ROOT / readme).read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = lines[i - 1].strip() if i else ""
        lang = m.group(1)
        runs = (lang == "python" and not marker.startswith("<!-- not run:")) or (
            lang == "sh" and marker == "<!-- run -->"
        )
        if runs:
            out.append(Block(readme, i + 1, lang, "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return out


def _filled(code: str, base_url: str) -> str:
    return code.replace(LOCAL, base_url).replace(PRINTED_KEY, KEY)


@pytest.fixture(scope="module")
def base_url():
    with gateway_thread() as (gw, _runner):
        yield gw.base_url


def _env(base_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return {**env, "TOKENPACE_API_KEY": KEY, "TOKENPACE_BASE_URL": base_url}


def test_the_readmes_have_code_to_run():
    found = {b.readme for r in READMES for b in blocks(r)}
    assert {"README.md", "sdk_python/README.md"} <= found
    assert any(b.lang == "sh" for b in blocks("README.md"))


@pytest.mark.parametrize(
    "readme", [r for r in READMES if any(b.lang == "python" for b in blocks(r))]
)
def test_python_blocks_run(readme: str, base_url: str, tmp_path: Path):
    code = [b for b in blocks(readme) if b.lang == "python"]
    script = tmp_path / "snippets.py"
    script.write_text("".join(f"# {b.readme}:{b.line}\n{_filled(b.code, base_url)}" for b in code))
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=_env(base_url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, f"{readme}:\n{out.stderr}"
    assert "Simulated reply:" in out.stdout  # each README's example streamed a reply


@pytest.mark.parametrize(
    "block",
    [b for r in READMES for b in blocks(r) if b.lang == "sh"],
    ids=lambda b: f"{b.readme}:{b.line}",
)
def test_shell_blocks_marked_to_run_run(block: Block, base_url: str):
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _filled(block.code, base_url)],
        cwd=ROOT,
        env=_env(base_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "data: [DONE]" in out.stdout and '"error"' not in out.stdout, out.stdout[-500:]
