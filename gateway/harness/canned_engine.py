"""A transport that answers every engine request with canned bytes, at no cost of its own:
what is left of a request's CPU is the ingress's own work (``benchmarks/ingress_cpu.py``).

Answers are what vLLM returns for the demo models (a ``/classify`` list item, a one-choice
chat completion), so the gateway parses, checks and renders them as it would a real one.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.core.api.results import EngineReply
from gateway.core.routing.engine_access import SlotInfo, SlotView
from gateway.core.routing.numerics import ModelClasses

CLASSIFY = json.dumps(
    {
        "id": "classify-0",
        "object": "list",
        "created": 0,
        "model": "rm",
        "data": [{"index": 0, "label": "LABEL_0", "probs": [0.4140625], "num_classes": 1}],
        "usage": {"prompt_tokens": 7, "total_tokens": 7, "completion_tokens": 0},
    }
).encode()
CHAT = json.dumps(
    {
        "id": "chatcmpl-0",
        "object": "chat.completion",
        "created": 0,
        "model": "judge",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Score: 1"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "total_tokens": 13, "completion_tokens": 4},
    }
).encode()


def chat_with_logprobs(tokens: int = 64) -> bytes:
    """A judge answer the size of the GPU benchmark's (``max_tokens`` 64, ``logprobs``,
    ``top_logprobs`` 1), in vLLM's layout: what a real judge request makes the gateway
    read and forward (about 10 kB against ``CHAT``'s 0.3 kB)."""
    entries = []
    for i in range(tokens):
        token = f" w{i % 97}"
        logprob = -((i * 7919) % 1000) / 997.0
        one = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
        entries.append({**one, "top_logprobs": [one]})
    return json.dumps(
        {
            "id": "chatcmpl-0",
            "object": "chat.completion",
            "created": 0,
            "model": "judge",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "".join(str(e["token"]) for e in entries),
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning": None,
                    },
                    "logprobs": {"content": entries},
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": {
                "prompt_tokens": 40,
                "total_tokens": 40 + tokens,
                "completion_tokens": tokens,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }
    ).encode()


class CannedTransport:
    """Every slot healthy, in one numerics class, answering at once."""

    def __init__(self, numerics_class: str | None = "c0") -> None:
        self.numerics_class = numerics_class
        self.calls = 0

    async def post(
        self, model: str, placement: Any, path: str, body: bytes, deadline: Any
    ) -> EngineReply:
        self.calls += 1
        return EngineReply(
            200,
            CHAT if path.endswith("completions") else CLASSIFY,
            "fp-canned",
            placement.home,
            numerics_class=self.numerics_class,
        )

    async def describe(self, model: str, slot: int, timeout_s: float) -> SlotInfo | None:
        return SlotInfo(
            model=model,
            slot=slot,
            url="http://canned",
            fingerprint="fp-canned",
            mode="serialize",
            max_inflight=1,
            numerics_class=self.numerics_class,
        )

    async def health(self, model: str, slot: int, timeout_s: float) -> str:
        return "healthy"

    def slot_view(self, model: str, slots: int) -> SlotView:
        return SlotView(ModelClasses((self.numerics_class,) * slots))

    async def aclose(self) -> None:
        return None
