"""The prompt-token estimate (qos/prompt_tokens.py): chars / 4, one rule for the gateway,
the embedded engine and the simulator's trace."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qos.prompt_tokens import (
    CHARS_PER_TOKEN,
    MESSAGE_OVERHEAD_TOKENS,
    estimate_prompt_tokens,
    estimate_text_tokens,
)


def test_text_is_four_characters_a_token_rounded_at_least_one() -> None:
    assert estimate_text_tokens("") == 1
    assert estimate_text_tokens("a") == 1
    assert estimate_text_tokens("a" * 7) == 2  # 1.75
    assert estimate_text_tokens("a" * 9) == 2  # 2.25
    assert estimate_text_tokens("a" * 10) == 2  # 2.5, to even (as the shipped trace counted)
    assert estimate_text_tokens("a" * 400) == 100


def test_chat_messages_count_their_text_and_framing() -> None:
    parts = [{"type": "text", "text": "x" * 40}, {"type": "image_url", "image_url": {}}]
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": parts}]}) == 14
    two = [{"role": "system", "content": "s" * 8}, {"role": "user", "content": "u" * 8}]
    assert estimate_prompt_tokens({"messages": two}) == 2 * MESSAGE_OVERHEAD_TOKENS + 4
    assert estimate_prompt_tokens({"messages": []}) == 1


def test_completion_prompts_count_every_string() -> None:
    assert estimate_prompt_tokens({"prompt": "y" * 400}) == 100
    assert estimate_prompt_tokens({"prompt": ["y" * 200, "z" * 200]}) == 100
    assert estimate_prompt_tokens({"model": "m"}) == 1


@given(st.text(max_size=2000))
def test_a_body_and_its_text_agree(text: str) -> None:
    assert estimate_prompt_tokens({"prompt": text}) == estimate_text_tokens(text)
    framing = "f" * (MESSAGE_OVERHEAD_TOKENS * CHARS_PER_TOKEN)
    chat = {"messages": [{"role": "user", "content": text}]}
    assert estimate_prompt_tokens(chat) == estimate_text_tokens(text + framing)
