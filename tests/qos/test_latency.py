"""Tests for qos.latency: interpolation, the shipped profiles, fitting and validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from qos.latency import PROFILES, LatencyProfile, fit_profile, get_profile

NIM_POINTS = {1: 4.63, 25: 5.19, 50: 5.91, 100: 7.57, 150: 9.81, 200: 12.65, 250: 16.14}


def _toy(**overrides) -> LatencyProfile:
    kwargs = dict(
        name="toy",
        source="test",
        batch_sizes=(1, 10, 20),
        decode_s_at=(0.01, 0.02, 0.04),
        kv_capacity_tokens=1000,
        max_batch=64,
        prefill_per_token_s=1e-4,
    )
    kwargs.update(overrides)
    return LatencyProfile(**kwargs)


def test_interpolation_exact_at_points_and_linear_between():
    p = _toy()
    for b, d in zip(p.batch_sizes, p.decode_s_at, strict=True):
        assert p.decode_s(b) == pytest.approx(d)
    assert p.decode_s(5) == pytest.approx(0.01 + 4 / 9 * 0.01)
    assert p.decode_s(15) == pytest.approx(0.03)
    assert p.decode_s(0) == 0.0


def test_extrapolation_uses_last_slope():
    p = _toy()
    assert p.decode_s(30) == pytest.approx(0.06)
    assert p.decode_s(40) == pytest.approx(0.08)


def test_context_term_and_scalar_type():
    p = _toy(per_context_token_s=1e-6)
    assert isinstance(p.decode_s(10), float)
    assert p.decode_s(10, 5000) == pytest.approx(0.025)
    assert p.decode_s(0, 5000) == 0.0


def test_vectorised_matches_scalar():
    p = _toy(per_context_token_s=2e-6)
    bs = np.array([0, 1, 3, 10, 17, 20, 33, 64])
    ctx = bs * 300
    vec = p.decode_s(bs, ctx)
    assert isinstance(vec, np.ndarray)
    np.testing.assert_allclose(
        vec, [p.decode_s(int(b), int(c)) for b, c in zip(bs, ctx, strict=True)]
    )
    np.testing.assert_allclose(p.tokens_per_s(bs[1:]), [p.tokens_per_s(int(b)) for b in bs[1:]])


def test_a_whole_batch_size_reads_the_same_latency_as_the_vector_path():
    p = _toy(per_context_token_s=2e-6)
    sizes = np.arange(0, 2 * p.max_batch + 3)
    contexts = np.array([0, 1, 777, 12_345.5])
    for context in contexts:
        vec = p.decode_s(sizes, context)
        one = [p.decode_s(int(b), float(context)) for b in sizes]
        assert one == vec.tolist()  # exactly, not approximately


def test_prefill_iteration_and_preemption():
    p = _toy(prefill_base_s=0.005, swap_per_token_s=1e-5)
    assert p.prefill_s(0) == 0.0
    assert p.prefill_s(100) == pytest.approx(0.015)
    assert p.iteration_s(decode_batch=0, prefill_tokens=100) == pytest.approx(0.015)
    assert p.iteration_s(decode_batch=10) == pytest.approx(0.02)
    assert p.iteration_s(decode_batch=10, prefill_tokens=100) == pytest.approx(0.035)
    assert p.preempt_s(500) == 0.0
    assert p.preempt_s(500, "swap") == pytest.approx(0.005)
    with pytest.raises(ValueError, match="swap"):
        _toy().preempt_s(500, "swap")


def test_max_batch_for_speed():
    p = _toy()
    assert p.max_batch_for_speed(50.0) == 10  # decode_s(10) = 0.02 s
    assert p.max_batch_for_speed(1000.0) == 1
    assert p.max_batch_for_speed(0.1) == p.max_batch


def test_nim_profile_reproduces_points():
    p = get_profile("llama-3.1-8b-h100")
    for b, ms in NIM_POINTS.items():
        assert p.decode_s(b) == pytest.approx(ms / 1000)
    assert p.kv_capacity_tokens == pytest.approx((80e9 * 0.9 - 16e9) / (2 * 32 * 8 * 128 * 2), 0.01)
    assert p.max_batch == 256


def test_opt_profile_matches_paper():
    p = get_profile("opt-66b-4xa100")
    speeds = p.tokens_per_s(np.arange(100, 251))
    assert np.all((speeds >= 6.0) & (speeds <= 8.0))
    assert np.any(speeds >= 6.6)  # §2.3: server speed >= 6.6 tokens/s under load
    assert p.decode_s(1) < 0.1
    assert p.max_batch_for_speed(4.8) > p.max_batch_for_speed(6.6)
    kv_bytes_per_token = 2 * 64 * 9216 * 2
    assert p.kv_capacity_tokens == pytest.approx(
        (4 * 80e9 * 0.9 - 132e9) / kv_bytes_per_token, 0.01
    )
    assert p.max_batch == 256
    assert p.swap_per_token_s is not None


def test_opt_profile_saturates_at_a_few_requests_per_second():
    """Decode-only upper bound on ShareGPT request throughput at the KV-bound batch."""
    p = get_profile("opt-66b-4xa100")
    batch = p.kv_capacity_tokens // (163 + 332)  # requests of average full length fit
    per_request_s = 332 * p.decode_s(batch) / batch + p.prefill_s(163)
    assert 2.0 < 1 / per_request_s < 4.0


def test_fit_profile_recovers_linear_plus_context_model():
    rng = np.random.default_rng(7)
    n = 20_000
    b = rng.integers(1, 201, n)
    ctx = b * rng.uniform(200, 600, n)
    truth = 0.02 + 4e-4 * b + 3e-7 * ctx
    measured = truth * (1 + rng.normal(0, 0.03, n))
    p = fit_profile(
        "fit",
        b,
        measured,
        context_tokens=ctx,
        kv_capacity_tokens=10_000,
        max_batch=256,
        prefill_per_token_s=1e-4,
    )
    assert len(p.batch_sizes) <= 16
    assert p.per_context_token_s == pytest.approx(3e-7, rel=0.02)
    assert p.batch_sizes[0] <= 10  # below the first group's median batch size the fit is flat
    grid = np.arange(p.batch_sizes[0], 251)
    for c in (200, 400, 600):
        np.testing.assert_allclose(
            p.decode_s(grid, grid * c), 0.02 + 4e-4 * grid + 3e-7 * grid * c, rtol=0.02
        )


def test_fit_profile_distinct_sizes_without_context():
    rng = np.random.default_rng(0)
    b = np.repeat([1, 8, 32, 64], 200)
    measured = (0.01 + 1e-4 * b) * (1 + rng.normal(0, 0.01, b.size))
    p = fit_profile("f", b, measured, kv_capacity_tokens=1, max_batch=64, prefill_per_token_s=1)
    assert p.batch_sizes == (1, 8, 32, 64)
    assert p.per_context_token_s == 0.0
    np.testing.assert_allclose(p.decode_s_at, 0.01 + 1e-4 * np.array([1, 8, 32, 64]), rtol=0.01)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (([], []), "batch_sizes"),
        (([1, 2], [0.1]), "iteration_s"),
        (([1, 0], [0.1, 0.1]), "batch_sizes"),
        (([1, 2], [0.1, -0.1]), "iteration_s"),
    ],
)
def test_fit_profile_validation(args, field):
    with pytest.raises(ValueError, match=field):
        fit_profile("f", *args, kv_capacity_tokens=1, max_batch=1, prefill_per_token_s=1)


def test_fit_profile_context_length_mismatch():
    with pytest.raises(ValueError, match="context_tokens"):
        fit_profile(
            "f",
            [1, 2],
            [0.1, 0.2],
            context_tokens=[5],
            kv_capacity_tokens=1,
            max_batch=1,
            prefill_per_token_s=1,
        )


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(batch_sizes=(1, 1, 2)), "batch_sizes"),
        (dict(batch_sizes=(0, 10, 20)), "batch_sizes"),
        (dict(decode_s_at=(0.01, 0.02)), "decode_s_at"),
        (dict(decode_s_at=(0.0, 0.02, 0.03)), "decode_s_at"),
        (dict(decode_s_at=(0.03, 0.02, 0.04)), "decode_s_at"),
        (dict(kv_capacity_tokens=0), "kv_capacity_tokens"),
        (dict(max_batch=-1), "max_batch"),
        (dict(prefill_per_token_s=0.0), "prefill_per_token_s"),
        (dict(swap_per_token_s=-1.0), "swap_per_token_s"),
    ],
)
def test_profile_validation_names_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        _toy(**overrides)


def test_profiles_are_frozen_and_registered():
    p = get_profile("opt-66b-4xa100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_batch = 1  # type: ignore[misc]
    assert set(PROFILES) == {"opt-66b-4xa100", "llama-3.1-8b-h100"}
    assert dataclasses.replace(p, max_batch=128).max_batch == 128


def test_get_profile_unknown_name_lists_valid():
    with pytest.raises(ValueError, match=r"llama-3\.1-8b-h100") as err:
        get_profile("gpt-5")
    assert "gpt-5" in str(err.value)
