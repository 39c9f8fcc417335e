"""Plain text out of chat-templated OpenRLHF queries (the judge behind /get_reward)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.core.scoring.chat_text import prompt_text, response_text, strip_special_tokens

CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n"
    "<|im_start|>assistant\n"
)
LLAMA3 = (
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n3+4=<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)


def test_chatml_prompt_and_response():
    query = CHATML + "7<|im_end|>\n<|endoftext|><|endoftext|>"
    assert prompt_text(CHATML) == "3+4="
    assert response_text(query, CHATML) == "7"


def test_llama3_prompt_and_response():
    assert prompt_text(LLAMA3) == "3+4="
    assert response_text(LLAMA3 + "7<|eot_id|>", LLAMA3) == "7"


def test_plain_text_is_kept_as_sent():
    assert prompt_text("a") == "a"
    assert response_text("a b", "a") == " b"
    assert response_text("<s>What is 2+2? 4</s>", "<s>What is 2+2?") == " 4"


def test_prompt_sent_without_the_querys_special_tokens():
    """The answer is then the query's last assistant turn."""
    query = CHATML + "7<|im_end|>"
    assert response_text(query, "3+4=") == "7"


@given(st.text(alphabet=st.characters(blacklist_characters="<>|"), max_size=40))
def test_text_without_markers_is_untouched(text):
    assert strip_special_tokens(text) == text
    assert prompt_text(text) == text
