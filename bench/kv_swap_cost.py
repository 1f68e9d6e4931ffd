"""What moving a paused reply's KV to host memory and back costs on a GPU, against
recomputing it.

The latency profiles' ``swap_per_token_s`` and ``prefill_per_token_s`` (``qos.latency``)
price the two ways a policy can lend a paused reply's KV cache (Andes §4.1 "Preemption
Overhead", Appendix D). This script measures both on the GPU it runs on, with random
weights and random KV (the costs depend on shapes, not values):

* **host link**: a contiguous copy between GPU memory and pinned host memory, each way;
* **swap**: one or several contexts of a paged KV cache (vLLM's layout per layer:
  ``[2, blocks, block_size, kv_heads, head_dim]``, blocks scattered at random) copied out
  and back, two ways: a copy per block and layer, issued from C++ in one call
  (``torch._foreach_copy_``, as vLLM's ``swap_blocks`` issues a ``cudaMemcpyAsync`` per
  block), or the blocks gathered into one staging buffer per layer and copied in bulk;
* **overlap**: how much a swap running on its own stream slows a decode-sized matrix
  product stream (weights read from HBM, as in a decode step), i.e. whether the copy
  hides under decoding;
* **recompute**: the prefill of the same contexts through a model of the profile's shape
  (``transformers``' Llama with random weights, SDPA attention).

Shapes: Llama-3.1-8B on one GPU (``llama-3.1-8b-h100``), and OPT-66B's per-GPU shard
at tensor parallel 4 (``opt-66b-4xa100``: the KV copy only; each GPU swaps its own
shard over its own link, so the per-GPU time is the swap's time).

Needs PyTorch with CUDA and ``transformers`` (a GPU machine's Python, not the project's
virtualenvs)::

    python3 bench/kv_swap_cost.py --out results/kv_swap_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

BLOCK_SIZE = 16  # tokens per KV block (vLLM's default on GPUs)


@dataclass(frozen=True)
class KvShape:
    """One GPU's KV cache geometry for one model."""

    profile: str
    layers: int
    kv_heads: int
    head_dim: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


SHAPES = (
    KvShape("llama-3.1-8b-h100", layers=32, kv_heads=8, head_dim=128),
    KvShape("opt-66b-4xa100 (one of 4 shards)", layers=64, kv_heads=72 // 4, head_dim=128),
)


def blocks_for(tokens: int) -> int:
    """KV blocks that hold ``tokens`` tokens."""
    return -(-tokens // BLOCK_SIZE)


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds per call of ``fn`` over ``repeats`` calls after one warm-up, by CUDA
    events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def host_link(mib: int, repeats: int) -> dict[str, Any]:
    """GB/s of one contiguous copy each way between GPU and pinned host memory."""
    gpu = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
    host = torch.empty(mib << 20, dtype=torch.uint8, pin_memory=True)
    out = timed(lambda: host.copy_(gpu, non_blocking=True), repeats)
    back = timed(lambda: gpu.copy_(host, non_blocking=True), repeats)
    size = float(mib << 20)
    return {
        "bytes": size,
        "gpu_to_host_GBps": size / out / 1e9,
        "host_to_gpu_GBps": size / back / 1e9,
    }


class PagedCache:
    """A paged KV cache on the GPU and a pinned host area for swapped-out blocks."""

    def __init__(self, shape: KvShape, cache_bytes: float, host_blocks: int) -> None:
        blocks = max(2 * host_blocks, int(cache_bytes // (shape.bytes_per_token * BLOCK_SIZE)))
        self.blocks = blocks
        per_layer = (2, blocks, BLOCK_SIZE, shape.kv_heads, shape.head_dim)
        self.gpu = [
            torch.randn(per_layer, dtype=torch.bfloat16, device="cuda") for _ in range(shape.layers)
        ]
        self.block_shape = (BLOCK_SIZE, shape.kv_heads, shape.head_dim)
        size = 2 * host_blocks * BLOCK_SIZE * shape.kv_heads * shape.head_dim
        # flat, so that the first n blocks' K and V are one contiguous range for any n
        self.host = [
            torch.empty(size, dtype=torch.bfloat16, pin_memory=True) for _ in range(shape.layers)
        ]
        self.staging = torch.empty(size, dtype=torch.bfloat16, device="cuda")

    def first(self, flat: torch.Tensor, n: int) -> torch.Tensor:
        """The contiguous ``[2, n, block]`` view at the start of a flat buffer."""
        return flat[: 2 * n * self.block_shape[0] * self.block_shape[1] * self.block_shape[2]].view(
            2, n, *self.block_shape
        )

    def block_views(self, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The GPU blocks ``ids`` and their host slots, one view per block, K and V, layer."""
        gpu_views, host_views = [], []
        for gpu, flat in zip(self.gpu, self.host, strict=True):
            host = self.first(flat, len(ids))
            for slot, block in enumerate(ids):
                for kv in (0, 1):
                    gpu_views.append(gpu[kv, block])
                    host_views.append(host[kv, slot])
        return gpu_views, host_views

    def out_gathered(self, ids: torch.Tensor) -> None:
        staging = self.first(self.staging, ids.numel())
        for gpu, host in zip(self.gpu, self.host, strict=True):
            torch.index_select(gpu, 1, ids, out=staging)
            self.first(host, ids.numel()).copy_(staging, non_blocking=True)

    def in_gathered(self, ids: torch.Tensor) -> None:
        staging = self.first(self.staging, ids.numel())
        for gpu, host in zip(self.gpu, self.host, strict=True):
            staging.copy_(self.first(host, ids.numel()), non_blocking=True)
            gpu.index_copy_(1, ids, staging)


def swap_costs(
    shape: KvShape, contexts: list[tuple[int, int]], cache_bytes: float, repeats: int
) -> list[dict[str, Any]]:
    """Seconds to swap ``n`` contexts of ``tokens`` tokens out and in, per method."""
    most = max(n * blocks_for(tokens) for n, tokens in contexts)
    cache = PagedCache(shape, cache_bytes, most)
    rows = []
    for n, tokens in contexts:
        ids = torch.randperm(cache.blocks, device="cuda")[: n * blocks_for(tokens)]
        gpu_views, host_views = cache.block_views(ids.tolist())
        moved = n * tokens
        row: dict[str, Any] = {"profile": shape.profile, "contexts": n, "tokens_each": tokens}
        methods = {
            "per_block": (
                partial(torch._foreach_copy_, host_views, gpu_views, non_blocking=True),
                partial(torch._foreach_copy_, gpu_views, host_views, non_blocking=True),
            ),
            "gathered": (partial(cache.out_gathered, ids), partial(cache.in_gathered, ids)),
        }
        for method, (out, back) in methods.items():
            out_s, in_s = timed(out, repeats), timed(back, repeats)
            row[method] = {
                "out_s": out_s,
                "in_s": in_s,
                "per_token_each_way_s": (out_s + in_s) / 2 / moved,
                "GBps": 2 * moved * shape.bytes_per_token / (out_s + in_s) / 1e9,
            }
        rows.append(row)
    return rows


def overlap(shape: KvShape, tokens: int, passes: int, repeats: int) -> dict[str, Any]:
    """Slowdown of a decode-like stream of matrix products while a swap runs beside it.

    The stream multiplies a 128-row activation by 32 rotating 4096 × 14336 bf16 weight
    matrices (3.8 GB, far beyond L2: read from HBM each time, as a decode step does),
    ``passes`` times, enough to outlast the swap. ``decode_slowdown`` is how much longer
    the stream takes beside the swap; ``swap_hidden_share`` how much of the swap's own
    time disappears under it.
    """
    weights = [torch.randn(4096, 14336, dtype=torch.bfloat16, device="cuda") for _ in range(32)]
    x = torch.randn(128, 4096, dtype=torch.bfloat16, device="cuda")
    blocks = blocks_for(tokens)
    cache = PagedCache(shape, 0.0, blocks)
    ids = torch.arange(blocks, device="cuda")
    side = torch.cuda.Stream()

    def decode() -> None:
        for _ in range(passes):
            for w in weights:
                x @ w

    def decode_with_swap() -> None:
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            cache.out_gathered(ids)
            cache.in_gathered(ids)
        decode()
        torch.cuda.current_stream().wait_stream(side)

    alone = timed(decode, repeats)
    swap_alone = timed(lambda: (cache.out_gathered(ids), cache.in_gathered(ids)), repeats)
    both = timed(decode_with_swap, repeats)
    return {
        "profile": shape.profile,
        "swap_tokens": tokens,
        "decode_alone_s": alone,
        "swap_alone_s": swap_alone,
        "together_s": both,
        "decode_slowdown": both / alone - 1,
        "swap_hidden_share": 1 - (both - alone) / swap_alone,
    }


def recompute(contexts: list[tuple[int, int]], repeats: int) -> list[dict[str, Any]]:
    """Seconds to prefill ``n`` contexts of ``tokens`` tokens on a Llama-3.1-8B shape."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        attn_implementation="sdpa",
    )
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    rows = []
    with torch.inference_mode():
        for n, tokens in contexts:
            ids = torch.randint(0, config.vocab_size, (n, tokens), device="cuda")
            # the decoder stack alone: serving runs the head on the last token only
            prefill = partial(model.model, input_ids=ids, use_cache=False)
            seconds = timed(prefill, repeats)
            rows.append(
                {
                    "profile": "llama-3.1-8b-h100",
                    "contexts": n,
                    "tokens_each": tokens,
                    "prefill_s": seconds,
                    "per_token_s": seconds / (n * tokens),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--cache-gib", type=float, default=30.0, help="GPU KV cache per shape")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kv_swap_cost: needs a CUDA GPU")
    contexts = [(1, 512), (16, 512), (1, 2048)]
    start = time.perf_counter()
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "block_size": BLOCK_SIZE,
        "bytes_per_token": {s.profile: s.bytes_per_token for s in SHAPES},
        "host_link": host_link(1024, args.repeats),
    }
    print(json.dumps(result, indent=1), flush=True)
    result["swap"] = [
        row for s in SHAPES for row in swap_costs(s, contexts, args.cache_gib * 2**30, args.repeats)
    ]
    print(json.dumps(result["swap"], indent=1), flush=True)
    result["overlap"] = [overlap(s, 8192, 256, args.repeats) for s in SHAPES]
    print(json.dumps(result["overlap"], indent=1), flush=True)
    result["recompute"] = recompute(contexts, args.repeats)
    print(json.dumps(result["recompute"], indent=1), flush=True)
    result["seconds"] = time.perf_counter() - start
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
