"""The gateway image, run as processes: what its install script installs (the build
context staged from deploy/gateway/Containerfile's COPY lines), started by its entrypoint
(``tokenpace``) with the example overlay's arguments, environment and configuration.
Two replicas share one Redis, started with the Redis StatefulSet's arguments, in front
of two fake engines (bench/fixed_rate_upstream.py, stand-ins for vLLM). Only the
addresses change: the Services' host names become loopback ports.

A replica stopped mid-stream (SIGTERM: :meth:`Replica.signal`, what Kubernetes sends a
pod it stops) drains while the other serves.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.deploy import (
    DEPLOY,
    ROOT,
    container,
    dashboard_series,
    environment,
    expand,
    find,
    gateway_config,
    stage_context,
)
from tests.support.deploy import render as render_manifests
from tests.support.ports import free_port
from tests.support.process import wait_http

EXAMPLE = "overlays/example"
MODEL = "llama-3.1-8b"
ENGINES = {"vllm-llama-a:8000", "vllm-llama-b:8000"}
ACME_KEY = "tp-acme-deploy-test-0001"


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return render_manifests(EXAMPLE)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image's /opt/tokenpace: install.sh run on the Containerfile's build context."""
    root = tmp_path_factory.mktemp("gateway-image")
    src = stage_context(DEPLOY / "gateway" / "Containerfile", "install", root)
    prefix = root / "opt" / "tokenpace"
    done = subprocess.run(
        [str(src / "deploy" / "gateway" / "install.sh"), str(src), str(prefix)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return prefix


@dataclass
class Store:
    port: int
    password: str
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def store(
    manifests: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    """redis-server with the StatefulSet's command and arguments (its port and data
    directory moved to the local one)."""
    redis = container(find(manifests, "StatefulSet", "tokenpace-redis"), "redis")
    env = environment(redis)
    args = [expand(a, env) for a in redis["command"] + redis["args"]]
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    args[args.index("--dir") + 1] = str(tmp_path_factory.mktemp("redis-data"))
    proc = subprocess.Popen([*args, "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL)
    try:
        probe = redis["readinessProbe"]["exec"]["command"]
        probe = [a.replace("-p 6379", f"-p {port}") for a in probe]
        deadline = time.monotonic() + 10
        while subprocess.run(probe, env={**os.environ, **env}).returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, "redis did not start"
            time.sleep(0.05)
        # The probe fails without the password: the server requires it.
        no_auth = {k: v for k, v in os.environ.items() if k != "REDISCLI_AUTH"}
        assert subprocess.run(probe, env=no_auth).returncode != 0
        yield Store(port, env["REDIS_PASSWORD"], proc)
    finally:
        proc.kill()
        proc.wait()


@dataclass
class Upstream:
    port: int
    proc: subprocess.Popen[bytes]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def upstreams() -> Iterator[dict[str, Upstream]]:
    """Two fake engines in place of vllm-llama-a and vllm-llama-b (20 tokens/s)."""
    started: dict[str, Upstream] = {}
    try:
        for host in sorted(ENGINES):
            port = free_port()
            args = [sys.executable, str(ROOT / "bench" / "fixed_rate_upstream.py")]
            args += ["--port", str(port), "--rate", "20", "--models", MODEL]
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started[host] = Upstream(port, proc)
            wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield started
    finally:
        for upstream in started.values():
            upstream.kill()


@dataclass
class Replica:
    """One gateway pod: the image's entrypoint, as a process."""

    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).text

    def signal(self, signum: int) -> None:
        """What the kubelet sends (SIGTERM) when the pod is deleted."""
        self.proc.send_signal(signum)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def local_config(text: str, store: Store, upstreams: dict[str, Upstream]) -> tuple[str, int, int]:
    """The ConfigMap's configuration with the Services' addresses on loopback ports, and
    the two ports the replica listens on; the ${VARIABLES} left for the gateway."""
    text = text.replace("tokenpace-redis:6379", f"127.0.0.1:{store.port}")
    for host, upstream in upstreams.items():
        text = text.replace(host, f"127.0.0.1:{upstream.port}")
    config = yaml.safe_load(text)
    port, metrics_port = free_port(), free_port()
    config["server"].update(host="127.0.0.1", port=port)
    config["metrics"]["port"] = metrics_port
    return yaml.safe_dump(config, sort_keys=False), port, metrics_port


@pytest.fixture
def replicas(
    image: Path,
    manifests: list[dict[str, Any]],
    store: Store,
    upstreams: dict[str, Upstream],
    tmp_path: Path,
) -> Iterator[list[Replica]]:
    """Two gateway pods of the example overlay, ready (both engines healthy)."""
    deployment = find(manifests, "Deployment", "tokenpace-gateway")
    gateway = container(deployment, "gateway")
    started: list[Replica] = []
    try:
        for i in range(2):
            text, port, metrics_port = local_config(gateway_config(manifests), store, upstreams)
            pod = tmp_path / f"pod-{i}"
            (pod / "etc").mkdir(parents=True)
            (pod / "etc" / "gateway.yaml").write_text(text)
            env = {
                "PATH": f"{image / 'bin'}{os.pathsep}{os.environ['PATH']}",  # the image's ENV
                "PYTHONUNBUFFERED": "1",
                "TOKENPACE_CONFIG": str(pod / "etc" / "gateway.yaml"),
                "TMPDIR": str(pod),
                **environment(gateway),
            }
            with open(pod / "log", "wb") as log:
                proc = subprocess.Popen(
                    [str(image / "bin" / "tokenpace"), *gateway["args"]],  # ENTRYPOINT, args
                    cwd=pod,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            started.append(Replica(proc, port, metrics_port))
        for replica in started:
            wait_http(replica.url + "/readyz", replica.proc, timeout=60)
        yield started
    finally:
        for replica in started:
            replica.stop()


def stream(
    replica: Replica, key: str = ACME_KEY, max_tokens: int = 12, content: str = "Hello!"
) -> list[str]:
    client = openai.OpenAI(base_url=replica.url + "/v1", api_key=key, max_retries=0)
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        stream=True,
        extra_body={"tokenpace": {"tier": "chat"}},
    )
    return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]


def test_the_installed_image_is_not_the_checkout(image: Path) -> None:
    done = subprocess.run(
        [str(image / "bin" / "python"), "-c", "import gateway, qos; print(gateway.__file__)"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.startswith(str(image))


def test_a_stream_through_each_replica_sharing_one_redis(replicas: list[Replica]) -> None:
    for replica in replicas:
        assert len(stream(replica)) == 12
    # A key the admin adds through one replica works on the other: one store.
    admin = {"Authorization": "Bearer tp-admin-deploy-test-0001"}
    added = httpx.post(
        replicas[0].url + "/v1/tokenpace/admin/tenants/globex/keys", headers=admin, timeout=10
    )
    assert added.status_code == 201, added.text
    assert len(stream(replicas[1], key=added.json()["key"])) == 12
    # /metrics is served on the metrics port only (metrics.port), not on the API port.
    assert httpx.get(replicas[0].url + "/metrics", timeout=5).status_code == 404


def test_a_replica_stopped_mid_stream_drains_and_the_other_serves(
    replicas: list[Replica],
) -> None:
    """What a rolling update or a scale-down does to a pod: SIGTERM (after the preStop,
    when the Service no longer sends it anything) while it streams."""
    client = openai.OpenAI(base_url=replicas[0].url + "/v1", api_key=ACME_KEY, max_retries=0)
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "a long one"}],
        max_tokens=100,  # 5 s at 20 tokens/s
        stream=True,
        extra_body={"tokenpace": {"tier": "chat"}},
    )
    texts = [c.choices[0].delta.content for c in itertools.islice(chunks, 3)]  # under way
    replicas[0].signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while True:  # it stops accepting: its readiness fails, new connections are refused
        try:
            httpx.get(replicas[0].url + "/readyz", timeout=2)
        except httpx.ConnectError:
            break
        except httpx.RemoteProtocolError:  # accepted by the kernel as the listener closed
            continue
        assert time.monotonic() < deadline, "the stopped replica still accepts connections"
        time.sleep(0.1)
    assert len(stream(replicas[1])) == 12  # new requests: the other replica
    texts += [c.choices[0].delta.content for c in chunks if c.choices]
    assert len([t for t in texts if t]) == 100  # the open stream ended as it would have
    assert replicas[0].proc.wait(30) in (0, -signal.SIGTERM)


def test_image_health_check(replicas: list[Replica], image: Path) -> None:
    check = [str(image / "bin" / "python"), str(DEPLOY / "gateway" / "healthcheck.py")]
    env = {**os.environ, "TOKENPACE_HEALTHCHECK_URL": replicas[0].url + "/healthz"}
    assert subprocess.run(check, env=env).returncode == 0
    env["TOKENPACE_HEALTHCHECK_URL"] = f"http://127.0.0.1:{free_port()}/healthz"
    assert subprocess.run(check, env=env, capture_output=True).returncode == 1


def series_present(replicas: list[Replica]) -> set[str]:
    names: set[str] = set()
    for replica in replicas:
        for family in text_string_to_metric_families(replica.metrics()):
            names.update(sample.name for sample in family.samples)
    return names


def test_every_series_the_dashboard_queries_is_in_metrics(
    replicas: list[Replica], upstreams: dict[str, Upstream]
) -> None:
    """Traffic as production has it: streams through both replicas, one from the Python
    SDK (its QoE report fills the client side of the telemetry window), and one failover
    (an engine gone before the health checks noticed)."""
    from tokenpace_client import OpenAI as PacedOpenAI
    from tokenpace_client import default_sender

    for replica in replicas:
        stream(replica)
    client = PacedOpenAI(base_url=replicas[1].url + "/v1", api_key=ACME_KEY, tier="chat")
    paced = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, stream=True
    )
    assert len([c for c in paced if c.choices and c.choices[0].delta.content]) == 8
    assert default_sender().flush(10)

    # A long stream on one engine, so the next requests, prompts no engine holds, go to
    # the other (the shorter estimated wait; where the answering worker has not seen the
    # long stream, each prompt's own rendezvous order), which is gone: they fail over.
    client = openai.OpenAI(base_url=replicas[0].url + "/v1", api_key=ACME_KEY, max_retries=0)
    long = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "long"}], max_tokens=400, stream=True
    )
    next(iter(long))

    def busy() -> set[str]:
        return {
            s.labels["backend"]
            for f in text_string_to_metric_families(replicas[0].metrics())
            for s in f.samples
            if s.name == "tokenpace_backend_in_flight" and s.value > 0
        }

    # Each worker publishes its view of the backends every second (the one that answers
    # the scrape may not be the one that serves the stream).
    deadline = time.monotonic() + 5
    while not busy() and time.monotonic() < deadline:
        time.sleep(0.1)
    (idle,) = {"llama-a", "llama-b"} - busy()
    upstreams[f"vllm-{idle}:8000"].kill()
    for i in range(8):
        assert len(stream(replicas[0], content=f"prompt {i}, which no engine has seen")) == 12
    long.close()

    missing = dashboard_series() - series_present(replicas)
    assert not missing, f"queried by the dashboard, absent from /metrics: {sorted(missing)}"
