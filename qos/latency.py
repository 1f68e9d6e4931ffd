"""Engine latency profiles: how long one iteration takes, and how much KV cache there is.

Andes models token-generation latency as a function of batch size B alone (§4.1
footnote 2, Appendix B: B and the batch's total context are correlated at 0.997 in a
live server), and caps the batch by the KV cache size M (Eq. 4). A
:class:`LatencyProfile` holds that function as a table of decode-iteration latencies
at a few batch sizes, plus M, the engine's batch limit, a prefill cost and a
preemption cost (§4.1 "Preemption Overhead", Appendix D). Simulators and policies
read speeds off it; :func:`fit_profile` builds one from any engine's iteration logs.

Two profiles ship in :data:`PROFILES`:

``opt-66b-4xa100``
    The paper's main setting (§6.1, Table 3): OPT-66B, FP16, tensor parallel 4 on
    4×A100-80GB, vLLM 0.2.7 defaults (``gpu_memory_utilization`` 0.9,
    ``max_num_seqs`` 256).

    * M = 66,000 tokens: 4 × 80 GB × 0.9 = 288 GB, minus 132 GB of weights
      (Table 3) leaves 156 GB; OPT-66B stores 2 (K, V) × 64 layers × 9216 hidden
      × 2 bytes = 2,359,296 bytes per token, so 156e9 / 2,359,296 = 66,121 tokens,
      rounded down.
    * Decode latency, linear between (1, 0.040 s), (100, 0.128 s), (250, 0.155 s).
      B = 1: reading 33 GB of weights per GPU at ~2 TB/s is ~17 ms, plus 128
      tensor-parallel all-reduces over PCIe (Appendix D: NVLink only pairs GPUs 0-1
      and 2-3) and vLLM's per-step overhead, ~40 ms in all. Under load (B ~ 100-250)
      §2.3 measures ≥ 6.6 tokens/s per request; the two loaded points put B = 100
      at Table 4's vLLM TDS p90 (1/7.84 = 0.128 s) and B = 250 at its p50
      (1/6.45 = 0.155 s). Per-request speed is therefore
      7.8 → 6.45 tokens/s over B = 100-250, ≥ 6.6 up to B ≈ 230; Table 4's p10
      (6.05) is what prefill iterations and swaps take off on top.
    * Prefill 2.6e-4 s/token: 2 × 66e9 FLOP per token over 4 GPUs at 40 % of
      312 TFLOPS = 132e9 / 499e12 = 2.64e-4 s. Base 0.01 s per prefill
      iteration: scheduling, launches and the all-reduces' latency (the weight
      read hides under prefill compute).
    * Swap 3e-4 s/token: swapping costs about one decode iteration (§4.1,
      Appendix D); a typical ShareGPT context is ~500 tokens (163 prompt + 332
      output, §6.1) and a loaded iteration ~0.15 s, so 0.15 / 500 = 3e-4 s
      (an effective ~7.5 GB/s host link, plausible for vLLM 0.2.7's block-wise
      copies). A current stack moves the same KV far faster: each GPU's shard
      (589,824 bytes a token) took 1.2e-5–1.4e-5 s/token each way over an H100's
      or H200's PCIe Gen5 link in bulk (``bench/kv_swap_cost.py``); an A100's Gen4
      link has half that bandwidth. ``tokenpace bench qoe --swap-s-per-token``
      overrides the cost.

    With these numbers a rough FCFS simulation of 3000 ShareGPT-like requests
    (lognormal lengths, mean prompt 163, mean output 332 tokens) saturates at
    ~2.3-2.7 requests/s, the batch then KV-bound at ~130-160 requests: the 2-4
    req/s range of Figure 10.

``llama-3.1-8b-h100``
    Llama-3.1-8B (BF16) on one H100-80GB, decode table = public NVIDIA NIM
    inter-token latencies at concurrency 1/25/50/100/150/200/250. M = 427,000:
    80 GB × 0.9 − 16 GB weights = 56 GB over 2 × 32 layers × 8 KV heads × 128 dim
    × 2 bytes = 131,072 bytes per token (427,246, rounded down). Prefill
    4e-5 s/token: 2 × 8e9 FLOP at 40 % of 989 TFLOPS (measured 2.8e-5 for 16 prompts
    of 512 tokens and 5.1e-5 for one, ``bench/kv_swap_cost.py`` on an H100). Base
    0.002 s (a single GPU: scheduling and launches only). Swap 3.7e-6 s/token each
    way, measured by ``bench/kv_swap_cost.py`` on an H100 80GB HBM3 (PCIe Gen5 x16 to
    the host): one 512-token context's paged blocks gathered and copied in bulk, 35
    GB/s (2.7e-6 at 48 GB/s for 16 contexts at once; an H200 3.5e-6 and 2.6e-6).
    vLLM's KV offloading submits all of a transfer's block copies in one driver call;
    one ``cudaMemcpyAsync`` per block and layer costs 1.3e-5–2.2e-5.

Both profiles fold context length into batch size (``per_context_token_s = 0``),
as Andes does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, overload

import numpy as np

PreemptMode = Literal["recompute", "swap"]
_MAX_FIT_POINTS = 16  # table points fit_profile keeps when there are many batch sizes


@dataclass(frozen=True)
class LatencyProfile:
    """Iteration latency, KV capacity and preemption cost of one model on one machine."""

    name: str
    source: str
    batch_sizes: tuple[int, ...]
    decode_s_at: tuple[float, ...]
    kv_capacity_tokens: int
    max_batch: int
    prefill_per_token_s: float
    prefill_base_s: float = 0.0
    per_context_token_s: float = 0.0
    swap_per_token_s: float | None = None
    _xs: np.ndarray = field(init=False, repr=False, compare=False)
    _ys: np.ndarray = field(init=False, repr=False, compare=False)
    _tail_slope: float = field(init=False, repr=False, compare=False)
    _by_batch: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        xs = np.asarray(self.batch_sizes, dtype=float)
        ys = np.asarray(self.decode_s_at, dtype=float)
        if xs.ndim != 1 or xs.size == 0:
            raise ValueError("batch_sizes: need at least one batch size")
        if np.any(xs != np.round(xs)) or np.any(xs < 1):
            raise ValueError(f"batch_sizes: must be integers >= 1, got {self.batch_sizes}")
        if np.any(np.diff(xs) <= 0):
            raise ValueError(f"batch_sizes: must be strictly increasing, got {self.batch_sizes}")
        if ys.shape != xs.shape:
            raise ValueError(
                f"decode_s_at: {ys.size} latencies for {xs.size} batch sizes; lengths must match"
            )
        if not np.all(np.isfinite(ys)) or np.any(ys <= 0):
            raise ValueError(f"decode_s_at: latencies must be positive, got {self.decode_s_at}")
        if np.any(np.diff(ys) < 0):
            raise ValueError(
                f"decode_s_at: latencies must be non-decreasing, got {self.decode_s_at}"
            )
        for name in ("kv_capacity_tokens", "max_batch"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        if not (math.isfinite(self.prefill_per_token_s) and self.prefill_per_token_s > 0):
            raise ValueError(
                f"prefill_per_token_s: must be positive, got {self.prefill_per_token_s}"
            )
        for name in ("prefill_base_s", "per_context_token_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be >= 0, got {value}")
        swap = self.swap_per_token_s
        if swap is not None and not (math.isfinite(swap) and swap > 0):
            raise ValueError(f"swap_per_token_s: must be positive or None, got {swap}")
        object.__setattr__(self, "batch_sizes", tuple(int(b) for b in xs))
        object.__setattr__(self, "decode_s_at", tuple(float(y) for y in ys))
        xs.setflags(write=False)
        ys.setflags(write=False)
        object.__setattr__(self, "_xs", xs)
        object.__setattr__(self, "_ys", ys)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if xs.size > 1 else 0.0
        object.__setattr__(self, "_tail_slope", float(slope))
        by_batch = self._batch_latency(np.arange(2 * self.max_batch + 1, dtype=float))
        object.__setattr__(self, "_by_batch", tuple(by_batch.tolist()))

    @overload
    def decode_s(self, batch_size: float, context_tokens: float = 0) -> float: ...
    @overload
    def decode_s(
        self, batch_size: np.ndarray, context_tokens: float | np.ndarray = 0
    ) -> np.ndarray: ...
    @overload
    def decode_s(self, batch_size: float, context_tokens: np.ndarray) -> np.ndarray: ...
    def decode_s(
        self, batch_size: float | np.ndarray, context_tokens: float | np.ndarray = 0
    ) -> float | np.ndarray:
        """Seconds of one decode iteration over ``batch_size`` sequences (vectorised).

        Linear between table points, flat below the first, extended along the last
        segment's slope beyond the last; plus ``per_context_token_s`` per token of
        total context in the batch. A batch of 0 takes 0 s. A single whole batch size
        up to twice ``max_batch`` is read from a table of these same values (what a
        scheduler asks at every decision, without numpy's per-call cost).
        """
        if (
            type(batch_size) is int
            and 0 < batch_size < len(self._by_batch)
            and isinstance(context_tokens, int | float)
        ):
            return self._by_batch[batch_size] + self.per_context_token_s * context_tokens
        b = np.asarray(batch_size, dtype=float)
        if np.any(b < 0):
            raise ValueError(f"batch_size: must be >= 0, got {batch_size}")
        lat = self._batch_latency(b) + self.per_context_token_s * np.asarray(
            context_tokens, dtype=float
        )
        lat = np.where(b > 0, lat, 0.0)
        return float(lat) if lat.ndim == 0 else lat

    def _batch_latency(self, b: np.ndarray) -> np.ndarray:
        """The table's latency at batch sizes ``b`` (no context term): linear between
        points, flat below the first, along the last segment's slope beyond the last."""
        lat = np.interp(b, self._xs, self._ys)
        extended: np.ndarray = np.where(
            b > self._xs[-1], self._ys[-1] + self._tail_slope * (b - self._xs[-1]), lat
        )
        return extended

    def prefill_s(self, prompt_tokens: int) -> float:
        """Seconds that prefilling ``prompt_tokens`` tokens adds to an iteration (0 for none)."""
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens: must be >= 0, got {prompt_tokens}")
        if prompt_tokens == 0:
            return 0.0
        return self.prefill_base_s + self.prefill_per_token_s * prompt_tokens

    def iteration_s(
        self, *, decode_batch: int, decode_context_tokens: int = 0, prefill_tokens: int = 0
    ) -> float:
        """Seconds of one engine iteration: decode ``decode_batch`` sequences, prefill tokens."""
        return float(self.decode_s(decode_batch, decode_context_tokens)) + self.prefill_s(
            prefill_tokens
        )

    def preempt_s(self, tokens: int, mode: PreemptMode = "recompute") -> float:
        """Seconds one preemption of a ``tokens``-long context costs now (swap-out or swap-in).

        Recomputation costs nothing now: it is paid as prefill when the request resumes.
        """
        if tokens < 0:
            raise ValueError(f"tokens: must be >= 0, got {tokens}")
        if mode == "recompute":
            return 0.0
        if mode != "swap":
            raise ValueError(f"mode: must be 'recompute' or 'swap', got {mode!r}")
        if self.swap_per_token_s is None:
            raise ValueError(f"mode: profile {self.name!r} does not support swap")
        return self.swap_per_token_s * tokens

    @overload
    def tokens_per_s(self, batch_size: float) -> float: ...
    @overload
    def tokens_per_s(self, batch_size: np.ndarray) -> np.ndarray: ...
    def tokens_per_s(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        """Per-request decode speed at ``batch_size`` (>= 1): ``1 / decode_s(batch_size)``."""
        if np.any(np.asarray(batch_size) < 1):
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        return 1.0 / self.decode_s(batch_size)

    def max_batch_for_speed(self, tds: float) -> int:
        """Largest batch in 1..max_batch with per-request speed >= ``tds`` tokens/s; 1 if none."""
        if not tds > 0:
            raise ValueError(f"tds: must be positive, got {tds}")
        fast = self.tokens_per_s(np.arange(1, self.max_batch + 1)) >= tds
        return int(np.flatnonzero(fast)[-1]) + 1 if fast.any() else 1


def _isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of ``y`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [weighted mean, weight, length]
    for yi, wi in zip(y, w, strict=True):
        blocks.append([float(yi), float(wi), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([np.full(int(n), m) for m, _, n in blocks])


def _as_1d(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: need a non-empty 1-D sequence")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: values must be finite")
    return arr


def fit_profile(
    name: str,
    batch_sizes: Sequence[int] | np.ndarray,
    iteration_s: Sequence[float] | np.ndarray,
    *,
    context_tokens: Sequence[int] | np.ndarray | None = None,
    kv_capacity_tokens: int,
    max_batch: int,
    prefill_per_token_s: float,
    source: str = "fit to measured iteration times",
) -> LatencyProfile:
    """Calibrate a profile from measured decode iterations (Appendix B's measurement).

    Samples are grouped by batch size: one group per distinct size, or, past 16 sizes,
    16 groups split at quantiles of the distinct sizes (so they span the range). Each
    group's median batch size and median latency give one table point, made
    non-decreasing by isotonic regression; below the first point the table is flat.
    With ``context_tokens``, ``per_context_token_s`` is the least-squares slope of
    latency on context *within* groups (both demeaned per group, batch size too),
    clamped at 0, and the table holds latency at zero context.
    """
    b = _as_1d("batch_sizes", batch_sizes)
    d = _as_1d("iteration_s", iteration_s)
    if d.size != b.size:
        raise ValueError(f"iteration_s: {d.size} durations for {b.size} batch sizes")
    if np.any(b <= 0) or np.any(b != np.round(b)):
        raise ValueError("batch_sizes: must be positive integers")
    if np.any(d <= 0):
        raise ValueError("iteration_s: durations must be positive")
    ctx = np.zeros_like(d)
    if context_tokens is not None:
        ctx = _as_1d("context_tokens", context_tokens)
        if ctx.size != b.size:
            raise ValueError(f"context_tokens: {ctx.size} values for {b.size} batch sizes")
        if np.any(ctx < 0):
            raise ValueError("context_tokens: must be >= 0")

    distinct = np.unique(b)
    if distinct.size <= _MAX_FIT_POINTS:
        group = np.searchsorted(distinct, b)
    else:
        edges = np.quantile(distinct, np.linspace(0, 1, _MAX_FIT_POINTS + 1)[1:-1])
        group = np.searchsorted(edges, b, side="right")
    group = np.unique(group, return_inverse=True)[1]
    n_groups = int(group.max()) + 1

    per_ctx = 0.0
    if context_tokens is not None:
        x = np.column_stack([b, ctx])
        means = np.zeros((n_groups, 2))
        np.add.at(means, group, x)
        means /= np.bincount(group, minlength=n_groups)[:, None]
        d_mean = np.bincount(group, weights=d, minlength=n_groups) / np.bincount(group)
        coef = np.linalg.lstsq(x - means[group], d - d_mean[group], rcond=None)[0]
        per_ctx = max(float(coef[1]), 0.0)
    adjusted = d - per_ctx * ctx

    reps = np.array([np.median(b[group == g]) for g in range(n_groups)])
    lat = np.array([np.median(adjusted[group == g]) for g in range(n_groups)])
    counts = np.bincount(group).astype(float)
    # Rounding the median batch sizes can merge neighbouring groups.
    xs, inverse = np.unique(np.round(reps).astype(int), return_inverse=True)
    ys = np.bincount(inverse, weights=lat * counts) / np.bincount(inverse, weights=counts)
    ys = _isotonic(ys, np.bincount(inverse, weights=counts))
    if np.any(ys <= 0):
        raise ValueError(
            "context_tokens: the fitted context term leaves a non-positive zero-context latency"
        )
    return LatencyProfile(
        name=name,
        source=source,
        batch_sizes=tuple(int(x) for x in xs),
        decode_s_at=tuple(float(y) for y in ys),
        kv_capacity_tokens=kv_capacity_tokens,
        max_batch=max_batch,
        prefill_per_token_s=prefill_per_token_s,
        per_context_token_s=per_ctx,
    )


PROFILES: dict[str, LatencyProfile] = {
    p.name: p
    for p in (
        LatencyProfile(
            name="opt-66b-4xa100",
            source=(
                "Shaped on Andes (§2.3, §6.1, Table 4, App. B/D): OPT-66B FP16, TP4 on "
                "4xA100-80GB, vLLM 0.2.7; KV size and prefill from memory/FLOP arithmetic."
            ),
            batch_sizes=(1, 100, 250),
            decode_s_at=(0.040, 0.128, 0.155),
            kv_capacity_tokens=66_000,  # (4*80e9*0.9 - 132e9) / (2*64*9216*2) = 66,121
            max_batch=256,  # vLLM max_num_seqs default
            prefill_per_token_s=2.6e-4,  # 2*66e9 / (4 * 0.4 * 312e12)
            prefill_base_s=0.01,
            swap_per_token_s=3e-4,  # ~one loaded iteration (0.15 s) per 500-token context
        ),
        LatencyProfile(
            name="llama-3.1-8b-h100",
            source=(
                "Llama-3.1-8B on one H100-80GB: NVIDIA NIM published inter-token latency "
                "vs concurrency; KV size and prefill from memory/FLOP arithmetic."
            ),
            batch_sizes=(1, 25, 50, 100, 150, 200, 250),
            decode_s_at=(0.00463, 0.00519, 0.00591, 0.00757, 0.00981, 0.01265, 0.01614),
            kv_capacity_tokens=427_000,  # (80e9*0.9 - 16e9) / (2*32*8*128*2) = 427,246
            max_batch=256,
            prefill_per_token_s=4e-5,  # 2*8e9 / (0.4 * 989e12)
            prefill_base_s=0.002,
            swap_per_token_s=3.7e-6,  # measured: 131,072 bytes a token at 35 GB/s
        ),
    )
}


def get_profile(name: str) -> LatencyProfile:
    """The shipped profile called ``name``; ValueError listing the valid names otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"unknown latency profile {name!r}; valid: {', '.join(sorted(PROFILES))}"
        ) from None
