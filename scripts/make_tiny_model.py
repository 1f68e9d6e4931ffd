"""Build a tiny Llama model directory offline, for the vLLM tests and benchmark.

No model hub is reachable, so the tests serve a model vLLM can load with
``--load-format dummy`` (random weights): only the configuration and a tokenizer are on
disk. The text it generates is noise, but the engine is real: continuous batching, a
paged KV cache, preemption and the scheduler under test.

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a fixed
corpus written below, so the directory is byte-for-byte the same on every run.
Usage: ``python scripts/make_tiny_model.py [DIR] [--size tiny|small]`` (default
``.models/tiny-llama``, size ``tiny``); needs ``tokenizers`` (installed with vLLM by
``scripts/setup-vllm.sh``). ``tiny`` (hidden 128, 2 layers) is for the unit tests, which
never run it; ``small`` (hidden 512, 4 layers, ~13M parameters) is what the end-to-end
test and the benchmark serve: its decode step takes milliseconds on a CPU, not
microseconds, so the HTTP relay keeps up with it and scheduling overhead is measured
against a step of realistic proportions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<unk>", "<s>", "</s>"]
VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


WORDS = (
    "the quick brown fox jumps over a lazy dog while users read streamed tokens at "
    "their own pace and the scheduler decides which request runs in the next "
    "iteration of the engine so that every stream keeps up with its reader"
)


def corpus() -> list[str]:
    """A fixed English-like corpus (the tokenizer only needs plausible merges)."""
    words = WORDS.split()
    lines = []
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + j) % len(words)] for j in range(12 + i % 9)))
    return lines


def build_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


SIZES = {
    # name: (hidden, intermediate, layers, attention heads, KV heads)
    "tiny": (128, 256, 2, 4, 2),  # the unit tests: no forward pass runs
    "small": (512, 1408, 4, 8, 4),  # end-to-end test and benchmark: ~13M parameters
}


def write_model(out: Path, size: str = "tiny") -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    hidden, intermediate, layers, heads, kv_heads = SIZES[size]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "max_position_embeddings": 2048,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 2048,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    generation = {"bos_token_id": bos, "eos_token_id": eos}
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    for name, body in (
        ("config.json", config),
        ("tokenizer_config.json", tokenizer_config),
        ("generation_config.json", generation),
        ("special_tokens_map.json", special),
    ):
        (out / name).write_text(json.dumps(body, indent=2, sort_keys=True) + "\n")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=".models/tiny-llama", help="model directory")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = parser.parse_args(argv[1:])
    write_model(Path(args.out), args.size)
    print(f"{args.size} model written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
