"""The vLLM plugin's parts that need no vLLM: configuration, version check, online
profile (the tags it reads: test_tags.py). ``import qos`` and ``import qos.vllm`` must not
import vLLM."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from qos.latency import LatencyProfile, get_profile
from qos.policy.andes import Andes
from qos.policy.fcfs import FCFS
from qos.policy.registry import POLICIES, make_policy
from qos.tags import RequestTags
from qos.vllm import SUPPORTED_VLLM_RANGE, check_vllm_version
from qos.vllm.config import PluginConfig
from qos.vllm.online import SEED_DECODE_S, OnlineProfile
from tests.support.paths import ROOT


def test_importing_qos_vllm_does_not_import_vllm() -> None:
    code = "import sys, qos, qos.vllm, qos.vllm.config; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_from_environment() -> None:
    cfg = PluginConfig.from_env(
        {
            "TOKENPACE_POLICY": "andes",
            "TOKENPACE_OBJECTIVE": "max-min",
            "TOKENPACE_PREEMPTION_CAP": "0.5",
            "TOKENPACE_PROFILE": "llama-3.1-8b-h100",
            "TOKENPACE_KV_WATERMARK": "0.8",
            "TOKENPACE_HORIZON_S": "5",
            "TOKENPACE_DEFAULT_TTFT": "2",
            "TOKENPACE_DEFAULT_TDS": "10",
            "TOKENPACE_DEFAULT_TENANT": "anon",
            "TOKENPACE_STATS_FILE": "/tmp/x.json",
            "TOKENPACE_DECISION_INTERVAL_S": "0",
            "TOKENPACE_PAUSE": "off",
        }
    )
    assert cfg.decision_interval_s == 0.0
    assert cfg.pause is False and PluginConfig.from_env({"TOKENPACE_PAUSE": " True "}).pause
    assert cfg.defaults == RequestTags(tier="default", ttft=2.0, tds=10.0, tenant="anon")
    assert (cfg.kv_watermark, cfg.horizon_s, cfg.stats_file) == (0.8, 5.0, "/tmp/x.json")
    policy = cfg.build_policy(OnlineProfile(kv_capacity_tokens=1024, max_batch=8).profile)
    assert isinstance(policy, Andes)
    assert (policy.objective, policy.kv_watermark, policy.horizon_s) == ("max-min", 0.8, 5.0)
    assert (policy.preemption_cap, policy.preemption_cost) == (0.5, 0.0)  # the paper's k
    shipped = PluginConfig.from_env({}).build_policy(policy.profile)
    assert isinstance(shipped, Andes)
    assert (shipped.preemption_cap, shipped.preemption_cost) == (None, 4.0)  # tokenpace_andes
    refused = PluginConfig.from_env({"TOKENPACE_PREEMPTION_CAP": "0.5"})
    with pytest.raises(ValueError, match="preemption_cap"):  # andes-tp: the guard decides
        refused.build_policy(policy.profile)
    assert isinstance(
        PluginConfig.from_env({"TOKENPACE_POLICY": "fcfs"}).build_policy(policy.profile), FCFS
    )
    for env, named in (
        ({"TOKENPACE_POLICY": "fcfs", "TOKENPACE_OBJECTIVE": "max-min"}, "objective"),
        ({"TOKENPACE_POLICY": "andes", "TOKENPACE_LEND_AFTER_S": "10"}, "lend_after_s"),
        ({"TOKENPACE_POLICY": "vtc", "TOKENPACE_OVERDUE_AFTER_TTFTS": "off"}, "guard"),
    ):
        with pytest.raises(ValueError, match=f"TOKENPACE_POLICY={env['TOKENPACE_POLICY']}: "):
            PluginConfig.from_env(env).build_policy(policy.profile)
        with pytest.raises(ValueError, match=named):
            PluginConfig.from_env(env).build_policy(policy.profile)
    assert PluginConfig.from_env({}) == PluginConfig()


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_registry_policy_is_a_plugin_policy(name: str) -> None:
    profile = get_profile("llama-3.1-8b-h100")
    policy = PluginConfig.from_env({"TOKENPACE_POLICY": name}).build_policy(profile)
    expected = make_policy(name, profile)
    assert type(policy) is type(expected)
    if isinstance(expected, Andes):  # unset options keep the named policy's settings
        for option in ("objective", "kv_watermark", "horizon_s", "preemption_cap", "qoe"):
            assert getattr(policy, option) == getattr(expected, option), option


def test_fair_share_slack_reaches_the_shipped_policy() -> None:
    profile = get_profile("llama-3.1-8b-h100")
    policy = PluginConfig.from_env({"TOKENPACE_FAIR_SHARE_SLACK": "256"}).build_policy(profile)
    assert isinstance(policy, Andes) and policy.shares is not None
    assert policy.shares.slack == 256.0
    assert PluginConfig.from_env({}).build_policy(profile).shares.slack == 8192.0
    with pytest.raises(ValueError, match="TOKENPACE_FAIR_SHARE_SLACK"):
        PluginConfig.from_env({"TOKENPACE_FAIR_SHARE_SLACK": "-1"})


def test_the_unweighted_policy_ignores_weights_whatever_the_slack() -> None:
    """The reference the plans are measured against stays unweighted when the slack is
    set for the whole deployment (as the benchmarks set it for both servers)."""
    env = {"TOKENPACE_POLICY": "andes-tp-unweighted", "TOKENPACE_FAIR_SHARE_SLACK": "256"}
    policy = PluginConfig.from_env(env).build_policy(get_profile("llama-3.1-8b-h100"))
    assert isinstance(policy, Andes) and policy.shares is None
    assert policy.guard is not None and not policy.guard.weights


def test_andes_options_apply_to_the_named_policy() -> None:
    env = {
        "TOKENPACE_POLICY": "andes-tp-unweighted",
        "TOKENPACE_OBJECTIVE": "perfect",
        "TOKENPACE_KV_WATERMARK": "0.7",
        "TOKENPACE_HORIZON_S": "3",
        "TOKENPACE_PREEMPTION_COST": "2",
    }
    policy = PluginConfig.from_env(env).build_policy(get_profile("llama-3.1-8b-h100"))
    assert isinstance(policy, Andes) and policy.shares is None
    assert (policy.objective, policy.kv_watermark, policy.horizon_s) == ("perfect", 0.7, 3.0)
    assert (policy.preemption_cap, policy.preemption_cost) == (None, 2.0)  # guarded: no cap


def test_overdue_bound_reaches_the_reader_guard() -> None:
    profile = get_profile("llama-3.1-8b-h100")
    guard = PluginConfig.from_env({}).build_policy(profile).guard
    assert guard is not None and guard.settings.overdue_after_ttfts == 10.0
    env = {"TOKENPACE_OVERDUE_AFTER_TTFTS": "30"}
    assert (
        PluginConfig.from_env(env).build_policy(profile).guard.settings.overdue_after_ttfts == 30.0
    )
    env = {"TOKENPACE_OVERDUE_AFTER_TTFTS": "off"}
    assert (
        PluginConfig.from_env(env).build_policy(profile).guard.settings.overdue_after_ttfts is None
    )
    assert guard.settings.overdue_after_fcfs_waits == 1.25
    env = {"TOKENPACE_OVERDUE_AFTER_FCFS_WAITS": "0"}
    assert (
        PluginConfig.from_env(env).build_policy(profile).guard.settings.overdue_after_fcfs_waits
        == 0
    )


def test_lending_is_off_unless_asked_for() -> None:
    profile = get_profile("llama-3.1-8b-h100")
    assert PluginConfig.from_env({}).build_policy(profile).guard.settings.lend_after_s is None
    env = {"TOKENPACE_LEND_AFTER_S": "10"}
    assert PluginConfig.from_env(env).build_policy(profile).guard.settings.lend_after_s == 10.0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TOKENPACE_POLICY": "lifo"}, "TOKENPACE_POLICY"),
        ({"TOKENPACE_OVERDUE_AFTER_TTFTS": "0"}, "TOKENPACE_OVERDUE_AFTER_TTFTS"),
        ({"TOKENPACE_OVERDUE_AFTER_TTFTS": "soon"}, "TOKENPACE_OVERDUE_AFTER_TTFTS"),
        ({"TOKENPACE_OVERDUE_AFTER_FCFS_WAITS": "-1"}, "TOKENPACE_OVERDUE_AFTER_FCFS_WAITS"),
        ({"TOKENPACE_OVERDUE_AFTER_FCFS_WAITS": "inf"}, "TOKENPACE_OVERDUE_AFTER_FCFS_WAITS"),
        ({"TOKENPACE_OBJECTIVE": "best"}, "TOKENPACE_OBJECTIVE"),
        ({"TOKENPACE_PROFILE": "a100"}, "TOKENPACE_PROFILE"),
        ({"TOKENPACE_KV_WATERMARK": "1.5"}, "TOKENPACE_KV_WATERMARK"),
        ({"TOKENPACE_KV_WATERMARK": "high"}, "TOKENPACE_KV_WATERMARK"),
        ({"TOKENPACE_PREEMPTION_CAP": "-1"}, "TOKENPACE_PREEMPTION_CAP"),
        ({"TOKENPACE_PREEMPTION_COST": "-1"}, "TOKENPACE_PREEMPTION_COST"),
        ({"TOKENPACE_HORIZON_S": "0"}, "TOKENPACE_HORIZON_S"),
        ({"TOKENPACE_LEND_AFTER_S": "0"}, "TOKENPACE_LEND_AFTER_S"),
        ({"TOKENPACE_LEND_AFTER_S": "later"}, "TOKENPACE_LEND_AFTER_S"),
        ({"TOKENPACE_PAUSE": "maybe"}, "TOKENPACE_PAUSE"),
        ({"TOKENPACE_DECISION_INTERVAL_S": "-0.1"}, "TOKENPACE_DECISION_INTERVAL_S"),
        ({"TOKENPACE_DEFAULT_TDS": "0"}, "TOKENPACE_DEFAULT"),
        ({"TOKENPACE_DEFAULT_TTFT": "nan"}, "TOKENPACE_DEFAULT_TTFT"),
    ],
)
def test_bad_configuration_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PluginConfig.from_env(env)


@pytest.mark.parametrize(
    "version", ["0.32.0", "0.32.5", "0.32.1+cpu", "0.32.0rc1", "0.33.0", "0.33.2", "0.33.0+cu130"]
)
def test_supported_vllm_versions(version: str) -> None:
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0", "dev"])
def test_unsupported_vllm_versions_are_refused_clearly(version: str) -> None:
    with pytest.raises(RuntimeError, match=r">=0\.32,<0\.34.*runs vLLM " + version):
        check_vllm_version(version)


def test_the_vllm_extra_installs_the_versions_the_plugin_accepts() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert extras["vllm"][0] == f"vllm{SUPPORTED_VLLM_RANGE}"
    assert extras["vllm"][1:] == ["redis>=5.0"]  # the reader channel (TOKENPACE_REDIS_URL)


def test_online_profile_fits_as_soon_as_it_has_the_samples() -> None:
    """The first fit comes at ``min_samples`` decode steps, not after ``refit_every``:
    the seed takes any engine for a fast one until then."""
    online = OnlineProfile(kv_capacity_tokens=4096, max_batch=4, refit_every=200, min_samples=8)
    fitted = [online.observe(4, 0, 0.1) for _ in range(8)]
    assert fitted == [False] * 7 + [True]
    assert online.profile.decode_s(4) == pytest.approx(0.1)
    assert not any(online.observe(4, 0, 0.1) for _ in range(199))  # then every 200 steps
    assert online.observe(4, 0, 0.1)


def test_online_profile_fits_decode_and_prefill_costs() -> None:
    online = OnlineProfile(kv_capacity_tokens=4096, max_batch=16, refit_every=50, min_samples=20)
    assert online.profile.decode_s_at == (SEED_DECODE_S,)
    refits = 0
    for i in range(400):
        batch = 1 + i % 16
        decode = 0.004 + 0.0005 * batch  # the engine's true decode time
        if i % 4 == 3:  # a mixed step: the decode batch plus 100 prompt tokens at 2e-5 s
            refits += online.observe(batch, 100, decode + 100 * 2e-5)
        else:
            refits += online.observe(batch, 0, decode)
    assert refits == online.refits > 0
    profile = online.profile
    assert profile.batch_sizes != (1,)  # fitted, not the seed
    assert isinstance(profile, LatencyProfile)
    for b in (1, 8, 16):
        assert profile.decode_s(b) == pytest.approx(0.004 + 0.0005 * b, rel=1e-6)
    assert profile.prefill_per_token_s == pytest.approx(2e-5, rel=1e-6)
    assert (profile.kv_capacity_tokens, profile.max_batch) == (4096, 16)
