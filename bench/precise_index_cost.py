"""What the precise prefix index would cost the gateway per request: the prompt named
as vLLM names its KV blocks.

To match vLLM's KV-cache events (``BlockStored`` / ``BlockRemoved``, published over
ZMQ), a router must turn each prompt into vLLM's block hashes: render the model's chat
template, tokenize, and hash each block of ``--block-size`` tokens chained to its parent
(vLLM's default: SHA-256 over CBOR). This times exactly that, in CPU seconds, for one
chat of a system prompt and five earlier turns (2.4 KB), with the tokenizer of
``--model``. Run it with the vLLM environment (it has ``transformers`` and ``cbor2``);
it imports nothing of the gateway.

    .venv-vllm/bin/python bench/precise_index_cost.py --model .models/small-llama

The approximate chain of the same chat (``gateway.backends.prefix.prompt_chain``) is
timed by ``bench/routing_cost.py --chain-only``.
"""

from __future__ import annotations

import argparse
import hashlib
import time


def chat() -> list[dict[str, str]]:
    """The chat ``bench/routing_cost.py --chain-only`` times too (2,399 characters)."""
    messages = [{"role": "system", "content": "s" * 900}]
    for t in range(5):
        messages += [
            {"role": "user", "content": f"{t} " + "u" * 148},
            {"role": "assistant", "content": f"{t} " + "a" * 118},
        ]
    return [*messages, {"role": "user", "content": "last " + "u" * 145}]


def main() -> None:
    import cbor2
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model directory with its tokenizer")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    messages = chat()

    def name_blocks() -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text)["input_ids"]
        parent = b"vllm-none-hash"
        size = args.block_size
        for start in range(0, len(ids) // size * size, size):
            parent = hashlib.sha256(
                cbor2.dumps((parent, tuple(ids[start : start + size]), None))
            ).digest()
        return len(ids)

    tokens = name_blocks()
    started = time.process_time()
    for _ in range(args.repeats):
        name_blocks()
    per = (time.process_time() - started) / args.repeats
    chars = sum(len(m["content"]) for m in messages)
    print(f"{chars} characters, {tokens} tokens: {per * 1e3:.2f} ms of CPU per prompt")


if __name__ == "__main__":
    main()
