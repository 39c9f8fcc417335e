"""Plain text out of a chat-templated string: what a judge behind ``/get_reward`` must see.

OpenRLHF sends ``/get_reward`` the policy's whole sequence, rendered by the *policy's* chat
template (``<|im_start|>user\\n3+4=<|im_end|>\\n<|im_start|>assistant\\n7<|im_end|>``, BOS and
EOS included) and, in ``prompts``, the templated prompt it starts with. A generative judge
must be asked about the question and the answer as text: special tokens, role headers and
the trailing EOS/padding would otherwise land inside the judge's own prompt (and change
its answer with the policy's template). The gateway has no tokenizer of the policy, so the
known template families are recognised by their markers:

- ChatML (Qwen, many others): ``<|im_start|>ROLE\\n...<|im_end|>``;
- Llama 3: ``<|start_header_id|>ROLE<|end_header_id|>\\n\\n...<|eot_id|>``;
- anything else: special-token-shaped markers (``<|...|>``, ``<s>``, ``</s>``,
  ``<eos>``, ``<bos>``, ``<pad>``) are removed and the text is kept.

The prompt becomes its last user turn; the response loses its end-of-turn/EOS/pad
markers; whitespace is kept as sent. Pure and deterministic: the same strings give the
same judge prompt.
"""

from __future__ import annotations

import re

_CHATML_TURN = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.DOTALL)
_LLAMA3_TURN = re.compile(
    r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)(?:<\|eot_id\|>|$)", re.DOTALL
)
#: Markers removed wherever they stand: ``<|...|>`` tokens and the classic BOS/EOS/pad.
_SPECIAL = re.compile(r"<\|[^<>|\s]{1,64}\|>|</?s>|<(?:eos|bos|pad|unk)>")


def strip_special_tokens(text: str) -> str:
    """``text`` without special-token-shaped markers."""
    return _SPECIAL.sub("", text)


def _turns(text: str) -> list[tuple[str, str]] | None:
    """(role, content) of each turn, when ``text`` is in a recognised chat template."""
    for pattern in (_CHATML_TURN, _LLAMA3_TURN):
        turns = pattern.findall(text)
        if turns:
            return [(role, content) for role, content in turns]
    return None


def prompt_text(prompt: str) -> str:
    """The question a templated ``prompt`` asks: its last user turn, as plain text."""
    turns = _turns(prompt)
    if turns is not None:
        users = [content for role, content in turns if role == "user"]
        if users:
            return strip_special_tokens(users[-1])
    return strip_special_tokens(prompt)


def response_text(query: str, prompt: str) -> str:
    """The policy's answer in ``query`` (= templated prompt + answer + EOS/padding), as
    plain text: ``query`` minus its ``prompt`` prefix (when it starts with it), up to the
    end-of-turn marker, without special tokens."""
    rest = query[len(prompt) :] if prompt and query.startswith(prompt) else query
    if rest is query and prompt:
        # the prompt was sent without the query's special tokens: the answer is the last
        # assistant turn, if the query is templated
        turns = _turns(query)
        if turns is not None and turns[-1][0] == "assistant":
            rest = turns[-1][1]
    for end in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>", "<eos>"):
        cut = rest.find(end)
        if cut >= 0:
            rest = rest[:cut]
    return strip_special_tokens(rest)
